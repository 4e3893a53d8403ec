//! Training: batch assembly, the step over the Backend trait, and the trainer loop with its
//! learning-rate schedule, statistics, lcurve.out and checkpoints.

pub mod batch;
pub mod budget;
pub mod checkpoint;
pub mod dataset;
pub mod finetune;
pub mod interrupt;
pub mod lcurve;
mod linear;
pub mod loss;
pub mod lr;
pub mod multitask;
pub mod outputs;
pub mod predict;
mod prefetch;
pub mod resident;
pub mod run;
pub mod setup;
pub mod stats;
pub mod step;
pub mod steplog;
pub mod task_draw;
pub mod trainer;
pub mod validation;
pub mod workspaces;

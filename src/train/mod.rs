//! Training: batch assembly, the step over the Backend trait, and (later) the trainer loop.

pub mod batch;
pub mod predict;
pub mod step;

//! Training data: deepmd/npy systems on disk and the batch sampler over them.

mod sampler;
mod system;

pub use sampler::{batch_sizes, nbatches, system_probs, BatchSize, Sampler};
pub use system::{load_system, DataError, System};

//! Training data: deepmd/npy systems (on disk or in memory) and the batch sampler over them.

mod files;
mod sampler;
mod system;
mod validate;

pub use files::{Disk, Files, MemFiles};
pub use sampler::{batch_sizes, nbatches, system_probs, BatchSize, Sampler};
pub use system::{load_system, load_system_in, DataError, System};
pub use validate::{check_images, MIN_DIST};

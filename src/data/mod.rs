//! Training data: deepmd/npy systems on disk and the batch sampler over them.

mod system;

pub use system::{load_system, DataError, System};

//! Training data: deepmd/npy (mixed-type too) and deepmd/hdf5 systems (on disk or in memory),
//! DeePMD-kit's LMDB data, the system search,
//! the store that reads frames on demand, and the batch sampler over them.

mod error;
mod files;
mod hdf5;
#[cfg(feature = "lmdb")]
mod lmdb;
mod load;
mod mixed;
mod npy;
mod open;
mod sampler;
mod search;
mod source;
mod store;
mod system;
mod types;
mod validate;

pub use error::DataError;
pub use files::{Disk, Files, MemFiles};
pub use hdf5::{is_hdf5_file, keep_open, Hdf5Writer, KeepOpen};
pub use load::{load_system, load_system_in, load_system_with};
pub use sampler::{batch_sizes, nbatches, nbatches_whole, system_probs, BatchSize, Draw, Sampler};
pub use search::{find_systems, search_systems};
pub use store::{cache_budget, SystemStore};
pub use system::{
    in_hdf5_file, read_system_in, Composition, Labels, Missing, Params, System, SystemInfo,
};
pub use types::{systems_type_map, unnamed_types};
pub use validate::{check_frames, check_images, MIN_DIST};

/// What a build without the `lmdb` feature (the page's) says of LMDB data.
#[cfg(not(feature = "lmdb"))]
fn lmdb_missing(file: &std::path::Path) -> DataError {
    DataError::Invalid {
        path: file.to_path_buf(),
        reason: "is LMDB data, which this dpw was built without (the `lmdb` feature)".into(),
    }
}

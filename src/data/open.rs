//! Opening the source of the system at a path: a folder, a group of an HDF5 file, or one of an
//! LMDB environment's systems ([`Location`]).

use std::path::Path;

use super::error::DataError;
use super::files::Files;
use super::source::{Location, NpyDir, Source};

/// Runs `f` on the source of the system at `path`.
pub(crate) fn with_source<R>(
    fs: &dyn Files,
    path: &Path,
    f: impl FnOnce(&dyn Source) -> Result<R, DataError>,
) -> Result<R, DataError> {
    match Location::parse(path) {
        Location::Dir(dir) => f(&NpyDir { fs, dir }),
        Location::Hdf5 { file, group } => super::hdf5::with_group(&file, &group, f),
        #[cfg(feature = "lmdb")]
        Location::Lmdb { file, group } => super::lmdb::with_group(&file, group, f),
        #[cfg(not(feature = "lmdb"))]
        Location::Lmdb { file, .. } => Err(super::lmdb_missing(&file)),
    }
}

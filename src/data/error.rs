//! What can be wrong with a system's data: one error type for every reader (npy, hdf5, the
//! frame checks), so a message names the file the same way whichever found the fault.

use std::io;
use std::path::{Path, PathBuf};

use ndarray_npy::ReadNpyError;

/// Anything wrong with a system on disk. Every message names the offending file.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("required file {} is missing", path.display())]
    Missing { path: PathBuf },
    // The causes are part of the message, not a source chain, which `{:#}` would print again.
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error(
        "cannot read {} as an npy array of float16, float32, float64, or signed or unsigned \
         integers (1, 2, 4 or 8 bytes): {error}",
        path.display()
    )]
    Npy { path: PathBuf, error: ReadNpyError },
    #[error("{}: expected shape {expected}, found {found:?}", path.display())]
    Shape {
        path: PathBuf,
        expected: String,
        found: Vec<usize>,
    },
    #[error("{}: has {found} frames but {} has {expected}", path.display(), reference.display())]
    FrameCount {
        path: PathBuf,
        reference: PathBuf,
        expected: usize,
        found: usize,
    },
    #[error("{}: non-finite value {value} in frame {frame}", path.display())]
    NotFinite {
        path: PathBuf,
        frame: usize,
        value: f64,
    },
    #[error("{}: element {element:?} is used by atoms but absent from the type_map {type_map:?}", path.display())]
    UnknownElement {
        path: PathBuf,
        element: String,
        type_map: Vec<String>,
    },
    #[error("{}: {at} has type {index}, out of range for the type_map {type_map:?} (and there is no type_map.raw)", path.display())]
    TypeOutOfRange {
        path: PathBuf,
        /// The atom, or a mixed-type frame's atom.
        at: String,
        index: usize,
        type_map: Vec<String>,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// A read error as a [`DataError`]: a missing file is said so, not as an OS error.
pub(super) fn io_error(path: &Path, source: io::Error) -> DataError {
    let path = path.to_path_buf();
    if source.kind() == io::ErrorKind::NotFound {
        DataError::Missing { path }
    } else {
        DataError::Io {
            path,
            error: source,
        }
    }
}

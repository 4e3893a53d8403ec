//! deepmd/hdf5 systems: groups of an HDF5 file holding what a deepmd/npy folder holds, the file
//! names becoming dataset names (`type.raw`, `set.000/coord.npy`, an optional `nopbc`), as
//! DeePMD-kit and dpdata write them. A system is named `file.hdf5#/group`.

use std::path::Path;

use super::error::DataError;
use super::source::Source;

/// Whether `path` is an HDF5 file: its signature (at offset 0, the only place dpw looks).
pub fn is_hdf5_file(path: &Path) -> bool {
    use std::io::Read;
    let mut sig = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut sig))
        .is_ok()
        && sig == *b"\x89HDF\r\n\x1a\n"
}

#[cfg(feature = "hdf5")]
pub use with_lib::{system_groups, with_group};

/// While one of these lives, the HDF5 files [`with_group`] opens stay open (the last few), so a
/// pass over thousands of systems in one file opens it once instead of once per system (each
/// open is about a tenth of reading a small system, all of it under the library's global
/// lock). Dropping the last one closes them, so a file rewritten between passes is read anew.
/// The guard is process-wide: while any lives, every file any thread opens through
/// [`with_group`] stays open, and the HDF5 library refuses to open a file for writing while it
/// is open for reading (dpw writes no HDF5 file; a program that does must not overlap a pass).
#[must_use = "files stay open only while the guard lives"]
pub struct KeepOpen(());

/// A [`KeepOpen`] guard for the current pass over the data.
pub fn keep_open() -> KeepOpen {
    #[cfg(feature = "hdf5")]
    with_lib::hold();
    KeepOpen(())
}

impl Drop for KeepOpen {
    fn drop(&mut self) {
        #[cfg(feature = "hdf5")]
        with_lib::release();
    }
}

#[cfg(not(feature = "hdf5"))]
fn no_support(file: &Path) -> DataError {
    DataError::Invalid {
        path: file.to_path_buf(),
        reason: "a deepmd/hdf5 file, but this dpw was built without HDF5 support; rebuild \
                 with `cargo build --release --features hdf5` (needs libhdf5-dev)"
            .into(),
    }
}

/// Runs `f` on the system in `group` of `file`.
#[cfg(not(feature = "hdf5"))]
pub fn with_group<R>(
    file: &Path,
    _group: &str,
    _f: impl FnOnce(&dyn Source) -> Result<R, DataError>,
) -> Result<R, DataError> {
    Err(no_support(file))
}

/// The groups of `file` at or below `group` that hold a `type.raw`, sorted.
#[cfg(not(feature = "hdf5"))]
pub fn system_groups(file: &Path, _group: &str) -> Result<Vec<String>, DataError> {
    Err(no_support(file))
}

#[cfg(feature = "hdf5")]
mod with_lib {
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, MutexGuard};

    use h5::types::{FixedAscii, FloatSize, TypeDescriptor, VarLenAscii, VarLenUnicode};
    use hdf5_metno as h5;

    use super::{DataError, Source};

    fn h5_error(path: PathBuf, what: &str, e: h5::Error) -> DataError {
        DataError::Invalid {
            path,
            reason: format!("{what}: {e}"),
        }
    }

    /// Files most recently opened first, kept while `guards` > 0.
    struct Kept {
        guards: usize,
        files: Vec<(PathBuf, h5::File)>,
    }

    /// Enough for a data set spread over a few files; each holds the file's metadata cache.
    const MAX_KEPT: usize = 8;

    static KEPT: Mutex<Kept> = Mutex::new(Kept {
        guards: 0,
        files: Vec::new(),
    });

    // Lock order: KEPT, then the library's lock (taken inside every h5 call), never the reverse.
    fn kept() -> MutexGuard<'static, Kept> {
        KEPT.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn hold() {
        kept().guards += 1;
    }

    pub(super) fn release() {
        let mut k = kept();
        k.guards -= 1;
        if k.guards == 0 {
            k.files.clear();
        }
    }

    /// `file` opened, or a handle to it if a [`super::KeepOpen`] keeps it open.
    fn open_kept(file: &Path) -> Result<h5::File, DataError> {
        let mut k = kept();
        if k.guards == 0 {
            drop(k);
            return open(file);
        }
        if let Some(i) = k.files.iter().position(|(p, _)| p == file) {
            let entry = k.files.remove(i);
            let h = entry.1.clone();
            k.files.insert(0, entry);
            return Ok(h);
        }
        let h = open(file)?;
        k.files.insert(0, (file.to_path_buf(), h.clone()));
        k.files.truncate(MAX_KEPT);
        Ok(h)
    }

    fn open(file: &Path) -> Result<h5::File, DataError> {
        if !file.is_file() {
            return Err(DataError::Missing {
                path: file.to_path_buf(),
            });
        }
        if !super::is_hdf5_file(file) {
            return Err(DataError::Invalid {
                path: file.to_path_buf(),
                reason: "not an HDF5 file (no HDF5 signature at its start)".into(),
            });
        }
        h5::File::open(file).map_err(|e| h5_error(file.to_path_buf(), "cannot open", e))
    }

    struct Group {
        file: PathBuf,
        name: String,
        group: h5::Group,
    }

    impl Group {
        fn dataset(&self, rel: &str) -> Result<h5::Dataset, DataError> {
            // Opened first, and only a failure looked into: one library call per dataset.
            self.group.dataset(rel).map_err(|e| {
                if self.has_file(rel) {
                    h5_error(self.path(rel), "not a dataset", e)
                } else {
                    DataError::Missing {
                        path: self.path(rel),
                    }
                }
            })
        }
    }

    impl Source for Group {
        fn path(&self, rel: &str) -> PathBuf {
            let sep = if self.name.ends_with('/') { "" } else { "/" };
            PathBuf::from(format!("{}#{}{sep}{rel}", self.file.display(), self.name))
        }

        fn has_file(&self, rel: &str) -> bool {
            // link_exists on "a/b" needs "a" to exist first.
            let mut prefix = String::new();
            for part in rel.split('/') {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(part);
                if !self.group.link_exists(&prefix) {
                    return false;
                }
            }
            self.group.dataset(rel).is_ok()
        }

        fn sets(&self) -> Result<Vec<String>, DataError> {
            let names = self
                .group
                .member_names()
                .map_err(|e| h5_error(self.path(""), "cannot list", e))?;
            let mut sets: Vec<String> = names
                .into_iter()
                .filter(|n| n.starts_with("set.") && self.group.group(n).is_ok())
                .collect();
            sets.sort();
            Ok(sets)
        }

        fn tokens(&self, rel: &str) -> Result<Vec<String>, DataError> {
            let ds = self.dataset(rel)?;
            let bad = |e| h5_error(self.path(rel), "cannot read", e);
            let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(bad)?;
            // dpdata writes type.raw as integers and type_map.raw as fixed-length strings.
            let strings: Vec<String> = match desc {
                TypeDescriptor::Integer(_) | TypeDescriptor::Unsigned(_) => {
                    let v = ds.read_raw::<i64>().map_err(bad)?;
                    return Ok(v.iter().map(i64::to_string).collect());
                }
                TypeDescriptor::VarLenUnicode => ds
                    .read_raw::<VarLenUnicode>()
                    .map_err(bad)?
                    .iter()
                    .map(|s| s.as_str().to_string())
                    .collect(),
                TypeDescriptor::VarLenAscii => ds
                    .read_raw::<VarLenAscii>()
                    .map_err(bad)?
                    .iter()
                    .map(|s| s.as_str().to_string())
                    .collect(),
                TypeDescriptor::FixedAscii(_) | TypeDescriptor::FixedUnicode(_) => ds
                    .read_raw::<FixedAscii<256>>()
                    .map_err(bad)?
                    .iter()
                    .map(|s| s.as_str().to_string())
                    .collect(),
                other => {
                    return Err(DataError::Invalid {
                        path: self.path(rel),
                        reason: format!("expected integers or strings, found {other}"),
                    })
                }
            };
            Ok(strings
                .iter()
                .flat_map(|s| s.split_whitespace().map(String::from))
                .collect())
        }

        fn array(&self, rel: &str) -> Result<(Vec<usize>, Vec<f64>), DataError> {
            let ds = self.dataset(rel)?;
            let bad = |e| h5_error(self.path(rel), "cannot read", e);
            let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(bad)?;
            // A float32 dataset read as float64 goes through the library's conversion, which
            // allocates and zeroes a 1 MiB buffer per read (half the instructions of reading a
            // system); f32 → f64 here gives the same numbers (every f32 is an f64). Integers
            // are widened, as the npy reader does: DeePMD-kit casts whatever it loads.
            let values = match desc {
                TypeDescriptor::Float(FloatSize::U4) => {
                    let v = ds.read_raw::<f32>().map_err(bad)?;
                    v.into_iter().map(f64::from).collect()
                }
                TypeDescriptor::Float(_) => ds.read_raw::<f64>().map_err(bad)?,
                TypeDescriptor::Integer(_) => {
                    let v = ds.read_raw::<i64>().map_err(bad)?;
                    v.into_iter().map(|x| x as f64).collect()
                }
                TypeDescriptor::Unsigned(_) => {
                    let v = ds.read_raw::<u64>().map_err(bad)?;
                    v.into_iter().map(|x| x as f64).collect()
                }
                other => {
                    return Err(DataError::Invalid {
                        path: self.path(rel),
                        reason: format!("expected a dataset of floats or integers, found {other}"),
                    })
                }
            };
            Ok((ds.shape(), values))
        }
    }

    /// Runs `f` on the system in `group` of `file`.
    pub fn with_group<R>(
        file: &Path,
        group: &str,
        f: impl FnOnce(&dyn Source) -> Result<R, DataError>,
    ) -> Result<R, DataError> {
        let h = open_kept(file)?;
        let g = h.group(group).map_err(|_| DataError::Invalid {
            path: file.to_path_buf(),
            reason: format!("has no group {group:?}"),
        })?;
        f(&Group {
            file: file.to_path_buf(),
            name: group.to_string(),
            group: g,
        })
    }

    /// The groups of `file` at or below `group` that hold a `type.raw`, sorted (DeePMD-kit's
    /// `rglob` over an HDF5 path).
    pub fn system_groups(file: &Path, group: &str) -> Result<Vec<String>, DataError> {
        let h = open(file)?;
        let root = h.group(group).map_err(|_| DataError::Invalid {
            path: file.to_path_buf(),
            reason: format!("has no group {group:?}"),
        })?;
        let mut out = Vec::new();
        let mut stack = vec![(group.trim_end_matches('/').to_string(), root)];
        while let Some((name, g)) = stack.pop() {
            if g.link_exists("type.raw") {
                out.push(if name.is_empty() {
                    "/".into()
                } else {
                    name.clone()
                });
            }
            let members = g
                .member_names()
                .map_err(|e| h5_error(file.to_path_buf(), "cannot list", e))?;
            for m in members {
                if let Ok(sub) = g.group(&m) {
                    stack.push((format!("{name}/{m}"), sub));
                }
            }
        }
        out.sort();
        Ok(out)
    }
}

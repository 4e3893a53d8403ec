//! deepmd/hdf5 systems: groups of an HDF5 file holding what a deepmd/npy folder holds, the file
//! names becoming dataset names (`type.raw`, `set.000/coord.npy`, an optional `nopbc`), as
//! DeePMD-kit and dpdata write them. A system is named `file.hdf5#/group`.

mod lib;
mod write;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use lib::{Element, Owned, Scoped, H5};
pub use write::Hdf5Writer;

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

/// While one of these lives, the HDF5 files `with_group` opens stay open (the last few), so a
/// pass over thousands of systems in one file opens it once instead of once per system (each
/// open is about a tenth of reading a small system, all of it under the library's global
/// lock). Dropping the last one closes them, so a file rewritten between passes is read anew.
/// The guard is process-wide: while any lives, every file any thread opens through
/// `with_group` stays open, and the HDF5 library refuses to open a file for writing while it
/// is open for reading (dpw writes no HDF5 file in a pass; a program that does must not
/// overlap one).
#[must_use = "files stay open only while the guard lives"]
pub struct KeepOpen(());

/// A [`KeepOpen`] guard for the current pass over the data.
pub fn keep_open() -> KeepOpen {
    kept().guards += 1;
    KeepOpen(())
}

impl Drop for KeepOpen {
    fn drop(&mut self) {
        let mut k = kept();
        k.guards -= 1;
        if k.guards == 0 {
            k.files.clear();
        }
    }
}

/// The library's lock, or an error naming `path` when the library cannot be loaded.
fn lock_for(path: &Path) -> Result<H5, DataError> {
    lib::lock().map_err(|e| DataError::Invalid {
        path: path.to_path_buf(),
        reason: format!("a deepmd/hdf5 file, but {e}"),
    })
}

/// Files most recently opened first, kept while `guards` > 0.
struct Kept {
    guards: usize,
    files: Vec<(PathBuf, Owned)>,
}

/// Enough for a data set spread over a few files; each holds the file's metadata cache.
const MAX_KEPT: usize = 8;

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    guards: 0,
    files: Vec::new(),
});

// Lock order: KEPT, then the library's lock, never the reverse.
fn kept() -> MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Checks `file` before the library sees it, for errors that name what is wrong.
fn check_file(file: &Path) -> Result<(), DataError> {
    if !file.is_file() {
        return Err(DataError::Missing {
            path: file.to_path_buf(),
        });
    }
    if !is_hdf5_file(file) {
        return Err(DataError::Invalid {
            path: file.to_path_buf(),
            reason: "not an HDF5 file (no HDF5 signature at its start)".into(),
        });
    }
    Ok(())
}

fn open<'g>(h5: &'g H5, file: &Path) -> Result<Scoped<'g>, DataError> {
    check_file(file)?;
    h5.open_file(file, false).ok_or_else(|| DataError::Invalid {
        path: file.to_path_buf(),
        reason: "cannot open (a damaged HDF5 file?)".into(),
    })
}

fn no_group(file: &Path, group: &str) -> DataError {
    DataError::Invalid {
        path: file.to_path_buf(),
        reason: format!("has no group {group:?}"),
    }
}

/// Group `group` of `file`, through a file kept open if a [`KeepOpen`] guard lives. The group
/// keeps its file open after the file's own handle closes (HDF5's default "weak" close).
fn open_group(file: &Path, group: &str) -> Result<Owned, DataError> {
    let mut k = kept();
    let h5 = lock_for(file)?;
    let (g, evicted) = if k.guards == 0 {
        let f = open(&h5, file)?;
        (h5.open_group(f.id, group).map(Scoped::keep), Vec::new())
    } else {
        if let Some(i) = k.files.iter().position(|(p, _)| p == file) {
            let entry = k.files.remove(i);
            k.files.insert(0, entry);
        } else {
            let f = open(&h5, file)?.keep();
            k.files.insert(0, (file.to_path_buf(), f));
        }
        let g = h5.open_group(k.files[0].1.id, group).map(Scoped::keep);
        let keep = k.files.len().min(MAX_KEPT);
        (g, k.files.split_off(keep))
    };
    // Evicted files close under the library's lock, which Owned's drop takes: released first.
    drop(h5);
    drop(evicted);
    g.ok_or_else(|| no_group(file, group))
}

struct Group {
    file: PathBuf,
    name: String,
    group: Owned,
}

impl Group {
    fn lock(&self) -> Result<H5, DataError> {
        lock_for(&self.file)
    }

    fn cannot_read(&self, rel: &str) -> DataError {
        DataError::Invalid {
            path: self.path(rel),
            reason: "cannot read (a damaged HDF5 file?)".into(),
        }
    }

    /// Dataset `rel`, opened first and only a failure looked into: one library call a dataset.
    fn dataset<'g>(&self, h5: &'g H5, rel: &str) -> Result<Scoped<'g>, DataError> {
        h5.open_dataset(self.group.id, rel).ok_or_else(|| {
            if exists(h5, self.group.id, rel) {
                DataError::Invalid {
                    path: self.path(rel),
                    reason: "not a dataset".into(),
                }
            } else {
                DataError::Missing {
                    path: self.path(rel),
                }
            }
        })
    }
}

/// Whether path `rel` names anything below `loc` (a link test needs the parents first).
fn exists(h5: &H5, loc: lib::Hid, rel: &str) -> bool {
    let mut prefix = String::new();
    rel.split('/').all(|part| {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        h5.link_exists(loc, &prefix)
    })
}

impl Source for Group {
    fn path(&self, rel: &str) -> PathBuf {
        let sep = if self.name.ends_with('/') { "" } else { "/" };
        PathBuf::from(format!("{}#{}{sep}{rel}", self.file.display(), self.name))
    }

    fn has_file(&self, rel: &str) -> bool {
        let Ok(h5) = self.lock() else { return false };
        exists(&h5, self.group.id, rel) && h5.open_dataset(self.group.id, rel).is_some()
    }

    fn sets(&self) -> Result<Vec<String>, DataError> {
        let h5 = self.lock()?;
        let names = h5
            .member_names(self.group.id)
            .ok_or_else(|| DataError::Invalid {
                path: self.path(""),
                reason: "cannot list".into(),
            })?;
        let mut sets: Vec<String> = names
            .into_iter()
            .filter(|n| n.starts_with("set.") && h5.open_group(self.group.id, n).is_some())
            .collect();
        sets.sort();
        Ok(sets)
    }

    fn tokens(&self, rel: &str) -> Result<Vec<String>, DataError> {
        let h5 = self.lock()?;
        let ds = self.dataset(&h5, rel)?;
        let t = h5.types();
        // dpdata writes type.raw as integers and type_map.raw as fixed-length strings.
        let strings = match h5.element(ds.id) {
            Some(Element::Integer { .. }) => {
                let (_, v): (_, Vec<i64>) =
                    h5.read(ds.id, t.i64).ok_or_else(|| self.cannot_read(rel))?;
                return Ok(v.iter().map(i64::to_string).collect());
            }
            Some(Element::String) => h5
                .read_strings(ds.id)
                .ok_or_else(|| self.cannot_read(rel))?,
            Some(other) => {
                return Err(DataError::Invalid {
                    path: self.path(rel),
                    reason: format!("expected integers or strings, found {}", other.name()),
                })
            }
            None => return Err(self.cannot_read(rel)),
        };
        Ok(strings
            .iter()
            .flat_map(|s| s.split_whitespace().map(String::from))
            .collect())
    }

    fn array(&self, rel: &str) -> Result<(Vec<usize>, Vec<f64>), DataError> {
        let h5 = self.lock()?;
        let ds = self.dataset(&h5, rel)?;
        let t = h5.types();
        let bad = || self.cannot_read(rel);
        // A float32 dataset is read as stored and widened here (every f32 is an f64), not
        // converted by the library. Integers are widened, as the npy reader does: DeePMD-kit
        // casts whatever it loads.
        let (shape, values) = match h5.element(ds.id) {
            Some(Element::Float { bytes: 4 }) => {
                let (shape, v): (_, Vec<f32>) = h5.read(ds.id, t.f32).ok_or_else(bad)?;
                (shape, v.into_iter().map(f64::from).collect())
            }
            Some(Element::Float { .. }) => h5.read(ds.id, t.f64).ok_or_else(bad)?,
            Some(Element::Integer { signed: true }) => {
                let (shape, v): (_, Vec<i64>) = h5.read(ds.id, t.i64).ok_or_else(bad)?;
                (shape, v.into_iter().map(|x| x as f64).collect())
            }
            Some(Element::Integer { signed: false }) => {
                let (shape, v): (_, Vec<u64>) = h5.read(ds.id, t.u64).ok_or_else(bad)?;
                (shape, v.into_iter().map(|x| x as f64).collect())
            }
            Some(other) => {
                return Err(DataError::Invalid {
                    path: self.path(rel),
                    reason: format!(
                        "expected a dataset of floats or integers, found {}",
                        other.name()
                    ),
                })
            }
            None => return Err(bad()),
        };
        Ok((shape, values))
    }
}

/// Runs `f` on the system in `group` of `file`.
pub fn with_group<R>(
    file: &Path,
    group: &str,
    f: impl FnOnce(&dyn Source) -> Result<R, DataError>,
) -> Result<R, DataError> {
    let group = Group {
        group: open_group(file, group)?,
        file: file.to_path_buf(),
        name: group.to_string(),
    };
    f(&group)
}

/// The groups of `file` at or below `group` that hold a `type.raw`, sorted (DeePMD-kit's
/// `rglob` over an HDF5 path).
pub fn system_groups(file: &Path, group: &str) -> Result<Vec<String>, DataError> {
    let h5 = lock_for(file)?;
    let f = open(&h5, file)?;
    let root = h5
        .open_group(f.id, group)
        .ok_or_else(|| no_group(file, group))?;
    let mut out = Vec::new();
    let mut stack = vec![(group.trim_end_matches('/').to_string(), root)];
    while let Some((name, g)) = stack.pop() {
        if h5.link_exists(g.id, "type.raw") {
            out.push(if name.is_empty() {
                "/".into()
            } else {
                name.clone()
            });
        }
        let members = h5.member_names(g.id).ok_or_else(|| DataError::Invalid {
            path: file.to_path_buf(),
            reason: format!("cannot list group {name:?}"),
        })?;
        for m in members {
            if let Some(sub) = h5.open_group(g.id, &m) {
                stack.push((format!("{name}/{m}"), sub));
            }
        }
    }
    out.sort();
    Ok(out)
}

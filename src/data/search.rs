//! DeePMD-kit's system search (`expand_sys_str`): every folder at or below a `systems` entry
//! that holds a `type.raw` is a system, and so is every such group of a deepmd/hdf5 file.
//! Symbolic links are followed, but a folder reached a second time below one entry (a link
//! loop, or two links to one folder) is skipped and named, so a loop neither repeats systems
//! nor hangs. Entries are searched each on its own: a system listed twice is used twice, as
//! DeePMD-kit uses it (its probability counted twice). An entry that is an LMDB environment
//! gives the systems its frames make (lmdb.rs); one is not searched for below a folder, as
//! DeePMD-kit does not.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::files::{Disk, Files};
use super::hdf5::{is_hdf5_file, system_groups};
use super::source::{is_lmdb, Location};

/// The systems at or below `root` on disk, for commands that take one path (`dpw test -s`):
/// a system folder, a folder searched for systems, an HDF5 file (its every system group) or
/// `file.hdf5#/group`.
pub fn search_systems(root: &Path) -> Result<Vec<PathBuf>> {
    find_systems(&Disk, &[root.to_path_buf()], "test")
}

/// The systems of a `systems` list: each entry a system, a folder searched for systems, an
/// HDF5 file or a group of one, an LMDB environment or one of its systems. `what` (training, validation) names the list in errors.
pub fn find_systems(fs: &dyn Files, paths: &[PathBuf], what: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let before = out.len();
        if let Some(found) = hdf5_systems(fs, p)? {
            out.extend(found);
        } else if is_lmdb(p) {
            out.extend(lmdb_systems(p)?);
        } else if let Location::Lmdb { .. } = Location::parse(p) {
            out.push(p.clone());
        } else {
            if !fs.is_dir(p) {
                if fs.is_file(p) {
                    bail!(
                        "{what} system {} is neither a folder nor an HDF5 file",
                        p.display()
                    );
                }
                bail!("{what} system folder {} does not exist", p.display());
            }
            check_not_lmdb(p)?;
            walk(fs, p, &mut HashSet::new(), &mut out)?;
        }
        if out.len() == before {
            bail!(
                "{what} system {} holds no deepmd/npy or deepmd/hdf5 system (no type.raw in it or below it) and is no LMDB environment (no data.mdb in it)",
                p.display()
            );
        }
    }
    Ok(out)
}

#[cfg(feature = "lmdb")]
fn lmdb_systems(p: &Path) -> Result<Vec<PathBuf>> {
    Ok(super::lmdb::system_groups(p)?)
}

#[cfg(not(feature = "lmdb"))]
fn lmdb_systems(p: &Path) -> Result<Vec<PathBuf>> {
    Err(super::lmdb_missing(p).into())
}

/// A `systems` entry named `*.lmdb` that is not an LMDB environment, said so rather than
/// searched for deepmd/npy systems it was surely not meant to hold.
fn check_not_lmdb(p: &Path) -> Result<()> {
    if p.extension().is_some_and(|e| e == "lmdb") {
        bail!(
            "{} is not an LMDB environment: expected a folder holding data.mdb",
            p.display()
        );
    }
    Ok(())
}

/// The system groups of `p` when it names an HDF5 file or a group in one; `None` otherwise.
fn hdf5_systems(fs: &dyn Files, p: &Path) -> Result<Option<Vec<PathBuf>>> {
    let (file, group) = match Location::parse(p) {
        Location::Hdf5 { file, group } => (file, group),
        Location::Dir(d) if fs.is_file(&d) && is_hdf5_file(&d) => (d, "/".to_string()),
        Location::Dir(_) | Location::Lmdb { .. } => return Ok(None),
    };
    let groups = system_groups(&file, &group)?;
    Ok(Some(
        groups
            .into_iter()
            .map(|group| Location::Hdf5 {
                file: file.clone(),
                group,
            })
            .map(|l| l.to_path())
            .collect(),
    ))
}

fn walk(
    fs: &dyn Files,
    dir: &Path,
    visited: &mut HashSet<(u64, u64)>,
    out: &mut Vec<PathBuf>,
) -> Result<()> {
    if let Some(id) = fs.dir_id(dir) {
        if !visited.insert(id) {
            tracing::warn!(
                "{} is a folder already searched (reached again through a symbolic link); skipped",
                dir.display()
            );
            return Ok(());
        }
    }
    // Like DeePMD-kit's rglob, a system's own subfolders are searched too.
    if fs.is_file(&dir.join("type.raw")) {
        out.push(dir.to_path_buf());
    }
    let entries = fs
        .list(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?;
    for d in entries.iter().filter(|p| fs.is_dir(p)) {
        walk(fs, d, visited, out)?;
    }
    Ok(())
}

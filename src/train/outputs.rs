//! A run's output files (out.json, lcurve.out, checkpoints): their paths checked before any
//! statistics are computed, their folders claimed by one run at a time (two runs writing the
//! same lcurve.out and checkpoints would corrupt both), and cleared of the temporary files that
//! killed runs left behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::TrainingConfig;

/// Name of the lock file in each output folder.
pub const LOCK_FILE: &str = ".dpw-train.lock";

/// Holds the output folders of a run until dropped, and then removes their lock files, so that
/// a finished run leaves only its outputs. The locks themselves go with the process however it
/// ends; a lock file a killed run left behind is taken over by the next run.
#[derive(Debug)]
pub struct RunLock {
    held: Vec<(PathBuf, File)>,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked: a run that opened the file before the removal finds it
        // replaced once it gets the lock, and opens it again (see `lock`).
        for (path, _) in &self.held {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove {}: {e}", path.display());
                }
            }
        }
    }
}

fn dir_of(p: &Path) -> &Path {
    p.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks the output paths of a run in `out_dir`, locks their folders and removes stale
/// temporary files from them.
pub fn claim(out_dir: &Path, tc: &TrainingConfig) -> Result<RunLock> {
    let mut dirs = vec![out_dir.to_path_buf()];
    for (key, name) in [
        ("training.save_ckpt", &tc.save_ckpt),
        ("training.disp_file", &tc.disp_file),
    ] {
        let path = out_dir.join(name);
        let is_name = path.file_name().is_some_and(|n| n != "." && n != "..");
        if name.ends_with('/') || name.ends_with(std::path::MAIN_SEPARATOR) || !is_name {
            bail!(
                "{key}: {name:?} names a folder; give a file name in it, such as \"{}/{}\"",
                name.trim_end_matches(['/', std::path::MAIN_SEPARATOR]),
                if key.ends_with("save_ckpt") {
                    "model.ckpt"
                } else {
                    "lcurve.out"
                }
            );
        }
        if path.is_dir() {
            bail!("{key}: {} is a folder; give a file name", path.display());
        }
        let dir = dir_of(&path);
        if !dir.is_dir() {
            bail!(
                "{key}: the folder {} of {name:?} does not exist; create it first",
                dir.display()
            );
        }
        dirs.push(dir.to_path_buf());
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    // A failure drops (and so removes) the locks taken so far.
    let mut run_lock = RunLock { held: Vec::new() };
    for d in dirs {
        let canon = d
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", d.display()))?;
        if seen.contains(&canon) {
            continue;
        }
        seen.push(canon);
        let path = d.join(LOCK_FILE);
        let file = lock(&path, &d)?;
        run_lock.held.push((path, file));
        remove_stale_temps(&d, tc);
    }
    Ok(run_lock)
}

/// How often a lock file is opened again when the run holding it removed it in the meantime.
const LOCK_TRIES: usize = 10;

fn lock(path: &Path, dir: &Path) -> Result<File> {
    for _ in 0..LOCK_TRIES {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| {
                format!("cannot create {} (is the folder writable?)", path.display())
            })?;
        let mut pid = String::new();
        match f.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let _ = f.read_to_string(&mut pid);
                let pid = pid.trim();
                bail!(
                    "another dpw train (pid {}) is writing its outputs in {}: it holds {}; wait \
                     for it to finish, or train in another folder",
                    if pid.is_empty() { "unknown" } else { pid },
                    dir.display(),
                    path.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                // Some network file systems have no locks: run unprotected rather than not at
                // all.
                tracing::warn!(
                    "cannot lock {} ({e}); make sure no other run writes to this folder",
                    path.display()
                );
                return Ok(f);
            }
        }
        if !names_file(path, &f) {
            continue;
        }
        let _ = f.read_to_string(&mut pid);
        if let Ok(old) = pid.trim().parse::<u32>() {
            tracing::info!(
                "took over {}, left behind by dpw train pid {old}, which {}",
                path.display(),
                if alive(old) {
                    "no longer holds it"
                } else {
                    "no longer runs"
                }
            );
        }
        f.set_len(0)
            .and_then(|_| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))?;
        return Ok(f);
    }
    bail!(
        "cannot take {}: other runs keep replacing it; try again",
        path.display()
    )
}

/// Whether `path` still names the open file `f` (the run that held the lock may have removed
/// the file between our open and our lock).
#[cfg(unix)]
fn names_file(path: &Path, f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), f.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(not(unix))]
fn names_file(path: &Path, _: &File) -> bool {
    path.exists()
}

/// Whether process `pid` still runs. Where that cannot be known, it is taken to run.
fn alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// The file a temporary file is for and the pid that wrote it, if `name` is one the writers
/// leave while saving (`.<base>.tmp<pid>`, `.<base>.link<pid>`).
fn temp_of(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix('.')?;
    let digits = rest.len() - rest.bytes().rev().take_while(u8::is_ascii_digit).count();
    let pid = rest[digits..].parse().ok()?;
    let base = rest[..digits]
        .strip_suffix(".tmp")
        .or_else(|| rest[..digits].strip_suffix(".link"))?;
    Some((base, pid))
}

/// Removes `dir`'s temporary files of this run's outputs left by processes that no longer run
/// (a kill or a full disk during a save).
fn remove_stale_temps(dir: &Path, tc: &TrainingConfig) {
    let name_of = |p: &str| {
        Path::new(p)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    };
    let ckpt = name_of(&tc.save_ckpt).unwrap_or_default();
    let disp = name_of(&tc.disp_file).unwrap_or_default();
    let ours = |base: &str| {
        base == "out.json"
            || base == disp
            || base == ckpt
            || base
                .strip_prefix(&ckpt)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|step| !step.is_empty() && step.bytes().all(|b| b.is_ascii_digit()))
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((base, pid)) = temp_of(&name) else {
            continue;
        };
        if !ours(base) || alive(pid) {
            continue;
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => tracing::info!(
                "removed {}, a temporary file left by process {pid}, which no longer runs",
                e.path().display()
            ),
            Err(err) => tracing::warn!("cannot remove {}: {err}", e.path().display()),
        }
    }
}

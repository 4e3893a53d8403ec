//! A run's output files (out.json, lcurve.out, checkpoints): their paths checked before any
//! statistics are computed, their folders claimed by one run at a time (two runs writing the
//! same lcurve.out and checkpoints would corrupt both), and cleared of the temporary files that
//! killed runs left behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// The lock files held, for a stop by a signal, which ends the process without dropping the
/// [`RunLock`] ([`remove_lock_files`]).
static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

impl RunLock {
    fn hold(&mut self, path: PathBuf, file: File) {
        if let Ok(mut held) = HELD.lock() {
            held.push(path.clone());
        }
        self.held.push((path, file));
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        for (path, _) in &self.held {
            if let Ok(mut held) = HELD.lock() {
                held.retain(|p| p != path);
            }
            remove_lock_file(path);
        }
    }
}

/// Removes the lock files of the run, for a process about to end by a signal.
pub fn remove_lock_files() {
    if let Ok(mut held) = HELD.lock() {
        for path in held.drain(..) {
            remove_lock_file(&path);
        }
    }
}

/// Removed while still locked: a run that opened the file before the removal finds it replaced
/// once it gets the lock, and opens it again (see `lock`).
fn remove_lock_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("cannot remove {}: {e}", path.display());
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
    for (key, name) in config_outputs(tc) {
        let path = out_dir.join(name);
        check_output(key, name, &path)?;
        dirs.push(dir_of(&path).to_path_buf());
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
        run_lock.hold(path, file);
        remove_stale_temps(&d, tc);
    }
    Ok(run_lock)
}

/// The outputs the training section names: (key, name as given).
fn config_outputs(tc: &TrainingConfig) -> [(&'static str, &str); 2] {
    [
        ("training.save_ckpt", &tc.save_ckpt),
        ("training.disp_file", &tc.disp_file),
    ]
}

/// Checks that `path`, an output that `what` names as `name`, is a file name in a folder that
/// exists.
fn check_output(what: &str, name: &str, path: &Path) -> Result<()> {
    let is_name = path.file_name().is_some_and(|n| n != "." && n != "..");
    if name.ends_with('/') || name.ends_with(std::path::MAIN_SEPARATOR) || !is_name {
        let example = match what {
            "training.save_ckpt" => "model.ckpt",
            "training.disp_file" => "lcurve.out",
            _ => "out.json",
        };
        bail!(
            "{what}: {name:?} names a folder; give a file name in it, such as \"{}/{example}\"",
            name.trim_end_matches(['/', std::path::MAIN_SEPARATOR]),
        );
    }
    if path.is_dir() {
        bail!("{what}: {} is a folder; give a file name", path.display());
    }
    let dir = dir_of(path);
    if !dir.is_dir() {
        bail!(
            "{what}: the folder {} of {name:?} does not exist; create it first",
            dir.display()
        );
    }
    Ok(())
}

/// A file of a run and the key or flag that names it, for the messages.
#[derive(Clone, Debug)]
pub struct RunFile {
    pub what: String,
    pub path: PathBuf,
}

impl RunFile {
    pub fn new(what: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        RunFile {
            what: what.into(),
            path: path.into(),
        }
    }

    /// The files a write of this path replaces: the name in its (resolved) folder, and what
    /// the name links to, if anything (a log is opened through a link; a checkpoint replaces
    /// the link).
    fn ids(&self) -> Vec<PathBuf> {
        let mut ids = Vec::new();
        if let (Some(name), Ok(dir)) = (self.path.file_name(), dir_of(&self.path).canonicalize()) {
            ids.push(dir.join(name));
        }
        if let Ok(p) = self.path.canonicalize() {
            if !ids.contains(&p) {
                ids.push(p);
            }
        }
        ids
    }

    fn is(&self, other: &RunFile) -> bool {
        let theirs = other.ids();
        self.ids().iter().any(|p| theirs.contains(p))
    }
}

/// What a `dpw train` reads and writes besides what its training section names.
pub struct RunFiles {
    /// input.json.
    pub input: RunFile,
    /// The checkpoint or model the run starts from.
    pub model: Option<RunFile>,
    /// out.json (`-o`) and the log (`-l`).
    pub outputs: Vec<RunFile>,
}

/// Checks, before anything is written, that every output of a run in `out_dir` (those of
/// `files`, the lock files, and `tc`'s disp_file and save_ckpt with its step files) goes to an
/// existing folder, and is neither one of the run's inputs (those of `files`, `tc`'s data
/// systems) nor another output.
pub fn check_files(out_dir: &Path, files: &RunFiles, tc: &TrainingConfig) -> Result<()> {
    let mut outputs = files.outputs.clone();
    for o in &outputs {
        check_output(&o.what, &o.path.to_string_lossy(), &o.path)?;
    }
    let mut lock_dirs = vec![out_dir.to_path_buf()];
    let mut ckpt = None;
    for (key, name) in config_outputs(tc) {
        let path = out_dir.join(name);
        check_output(key, name, &path)?;
        lock_dirs.push(dir_of(&path).to_path_buf());
        let file = RunFile::new(key, path);
        if key == "training.save_ckpt" {
            ckpt = Some(file.clone());
        }
        outputs.push(file);
    }
    let mut locks: Vec<RunFile> = Vec::new();
    for d in lock_dirs {
        let lock = RunFile::new("the run's lock file", d.join(LOCK_FILE));
        if !locks.iter().any(|l| l.is(&lock)) {
            locks.push(lock);
        }
    }
    outputs.extend(locks);

    for (i, a) in outputs.iter().enumerate() {
        for b in &outputs[i + 1..] {
            if a.is(b) {
                bail!(
                    "{} {} and {} {} are the same file; give them different names",
                    a.what,
                    a.path.display(),
                    b.what,
                    b.path.display()
                );
            }
        }
    }
    if let Some(c) = &ckpt {
        // The name in its resolved folder, as `ids` gives it first.
        let first = c.ids().into_iter().next();
        let dir = first
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf);
        let prefix = first
            .as_deref()
            .and_then(Path::file_name)
            .map(|n| format!("{}-", n.to_string_lossy()));
        let is_step = |p: &PathBuf| {
            let (Some(dir), Some(prefix)) = (&dir, &prefix) else {
                return false;
            };
            let step = p
                .file_name()
                .and_then(|n| n.to_str()?.strip_prefix(prefix.as_str()));
            p.parent() == Some(dir.as_path())
                && step.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        };
        let others = outputs.iter().filter(|o| o.what != c.what);
        for f in others.chain([&files.input]) {
            if f.ids().iter().any(is_step) {
                bail!(
                    "{} {} is a checkpoint file of {} {} (the run writes {}-STEP every \
                     save_freq steps); give another name",
                    f.what,
                    f.path.display(),
                    c.what,
                    c.path.display(),
                    c.path.display()
                );
            }
        }
    }
    let inputs = [(&files.input, false)]
        .into_iter()
        .chain(files.model.iter().map(|m| (m, true)));
    for o in &outputs {
        for (i, is_model) in inputs.clone() {
            // A checkpoint written over the model the run starts from is how `--restart
            // model.ckpt` goes on: that model is read in full at start-up.
            if is_model && o.what == "training.save_ckpt" {
                continue;
            }
            if o.is(i) {
                bail!(
                    "{} {} is {} {}: the run would overwrite it; give another name",
                    o.what,
                    o.path.display(),
                    i.what,
                    i.path.display()
                );
            }
        }
    }
    let validation = tc.validation_data.iter().map(|v| &v.data);
    let data = [("training.training_data.systems", &tc.training_data)]
        .into_iter()
        .chain(validation.map(|d| ("training.validation_data.systems", d)));
    for (key, d) in data {
        for sys in &d.system_paths {
            // An HDF5 system is `file#group`: the file is what an output must not replace.
            let text = sys.to_string_lossy();
            let root = Path::new(text.split_once('#').map_or(&*text, |(f, _)| f));
            let Ok(root) = root.canonicalize() else {
                continue;
            };
            for o in &outputs {
                let inside = o
                    .ids()
                    .iter()
                    .any(|p| p == &root || p.strip_prefix(&root).is_ok_and(is_data_file));
                if inside {
                    bail!(
                        "{} {} would write into the data system {} of {key}; give a path \
                         outside it",
                        o.what,
                        o.path.display(),
                        sys.display()
                    );
                }
            }
        }
    }
    Ok(())
}

/// Whether `rel`, a path in a system folder (or a folder searched for systems), is one of the
/// files systems are read from.
fn is_data_file(rel: &Path) -> bool {
    let in_set = rel
        .components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with("set."));
    let name = rel.file_name().map(|n| n.to_string_lossy());
    in_set || matches!(name.as_deref(), Some("type.raw" | "type_map.raw" | "nopbc"))
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

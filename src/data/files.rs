//! Where data files come from: the file system, or files already in memory (a web page fetches
//! them, having no file system). The readers go through [`Files`] so one reader serves both.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub trait Files: Sync {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn is_file(&self, path: &Path) -> bool;
    fn is_dir(&self, path: &Path) -> bool;
    /// The entries directly inside `dir`, sorted by name.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// (device, inode) of a folder, where the file system has them: the system search uses
    /// it to see a folder reached twice through symbolic links.
    fn dir_id(&self, _dir: &Path) -> Option<(u64, u64)> {
        None
    }
    /// Whether these are the real file system's files, which a system can be read again from.
    fn on_disk(&self) -> bool {
        false
    }
}

/// The real file system.
pub struct Disk;

impl Files for Disk {
    /// The file's bytes, the room for them asked for fallibly: a data set is the biggest thing
    /// dpw reads.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut f = std::fs::File::open(path)?;
        let len = usize::try_from(f.metadata()?.len()).unwrap_or(usize::MAX);
        let mut bytes =
            crate::mem::try_with_capacity(len, || "its contents".into()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    e.lowered_by(
                        "a smaller DPW_DATA_CACHE_MB lowers the data kept in memory (MiB; the \
                         rest is read again when drawn)",
                    ),
                )
            })?;
        f.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn is_file(&self, path: &Path) -> bool {
        path.is_file()
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<Vec<_>>>()?;
        out.sort();
        Ok(out)
    }

    fn on_disk(&self) -> bool {
        true
    }

    #[cfg(unix)]
    fn dir_id(&self, dir: &Path) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
    }
}

/// Files held in memory by relative path ("data/train/set.000/coord.npy"); a folder exists
/// when some file lies below it.
#[derive(Default)]
pub struct MemFiles {
    files: BTreeMap<PathBuf, Vec<u8>>,
}

impl MemFiles {
    pub fn insert(&mut self, path: impl Into<PathBuf>, bytes: Vec<u8>) {
        self.files.insert(path.into(), bytes);
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} was not among the files given", path.display()),
    )
}

impl Files for MemFiles {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.files.get(path).cloned().ok_or_else(|| not_found(path))
    }

    fn is_file(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.files
            .keys()
            .any(|p| p.starts_with(path) && p.as_path() != path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out: Vec<PathBuf> = self
            .files
            .keys()
            .filter_map(|p| p.strip_prefix(dir).ok()?.components().next())
            .map(|c| dir.join(c))
            .collect();
        out.dedup();
        if out.is_empty() && !self.is_dir(dir) {
            return Err(not_found(dir));
        }
        Ok(out)
    }
}

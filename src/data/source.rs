//! Where one system's arrays come from: a deepmd/npy folder, or a group of a deepmd/hdf5 file
//! holding the same names as datasets (`type.raw`, `set.000/coord.npy`, ...). One reader
//! (system.rs) serves both, so both give the same frames.

use std::path::{Path, PathBuf};

use ndarray::ArrayD;
use ndarray_npy::{ReadNpyError, ReadNpyExt};

use super::error::{io_error, DataError};
use super::files::Files;

/// A system's entries by their relative names ("type.raw", "set.000/coord.npy").
pub trait Source {
    /// The entry as messages name it: a file path, or `file.hdf5#/group/name`.
    fn path(&self, rel: &str) -> PathBuf;
    fn has_file(&self, rel: &str) -> bool;
    /// The names of the `set.*` folders / groups, sorted.
    fn sets(&self) -> Result<Vec<String>, DataError>;
    /// Whitespace-separated tokens of a `.raw` entry.
    fn tokens(&self, rel: &str) -> Result<Vec<String>, DataError>;
    /// A numeric array (floats or integers) as f64 with its shape.
    fn array(&self, rel: &str) -> Result<(Vec<usize>, Vec<f64>), DataError>;
}

/// Where a system lives: a folder, a group of a deepmd/hdf5 file (`file#/group`, as
/// DeePMD-kit writes it), or one of the systems an LMDB environment's frames make
/// (`file.lmdb#N`, lmdb.rs).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Location {
    Dir(PathBuf),
    Hdf5 { file: PathBuf, group: String },
    Lmdb { file: PathBuf, group: usize },
}

/// Whether `path` is an LMDB environment: a folder holding `data.mdb`, as DeePMD-kit tells one.
pub fn is_lmdb(path: &Path) -> bool {
    path.join("data.mdb").is_file()
}

impl Location {
    /// `env.lmdb#N` is system N of an LMDB environment, `file.hdf5#/group` a group of an HDF5
    /// file; anything else is a folder.
    pub fn parse(path: &Path) -> Location {
        let s = path.to_string_lossy();
        if let Some((file, group)) = s.split_once('#') {
            if let Some(group) = group.parse().ok().filter(|_| is_lmdb(Path::new(file))) {
                return Location::Lmdb {
                    file: PathBuf::from(file),
                    group,
                };
            }
            let group = if group.starts_with('/') {
                group.to_string()
            } else {
                format!("/{group}")
            };
            return Location::Hdf5 {
                file: PathBuf::from(file),
                group,
            };
        }
        Location::Dir(path.to_path_buf())
    }

    /// The path form [`Location::parse`] reads back.
    pub fn to_path(&self) -> PathBuf {
        match self {
            Location::Dir(d) => d.clone(),
            Location::Hdf5 { file, group } => PathBuf::from(format!("{}#{group}", file.display())),
            Location::Lmdb { file, group } => PathBuf::from(format!("{}#{group}", file.display())),
        }
    }
}

/// A deepmd/npy system folder.
pub struct NpyDir<'a> {
    pub fs: &'a dyn Files,
    pub dir: PathBuf,
}

impl Source for NpyDir<'_> {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn has_file(&self, rel: &str) -> bool {
        self.fs.is_file(&self.dir.join(rel))
    }

    fn sets(&self) -> Result<Vec<String>, DataError> {
        let mut sets = Vec::new();
        for entry in self
            .fs
            .list(&self.dir)
            .map_err(|e| io_error(&self.dir, e))?
        {
            let Some(name) = entry.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            if name.starts_with("set.") && self.fs.is_dir(&entry) {
                sets.push(name);
            }
        }
        sets.sort();
        Ok(sets)
    }

    fn tokens(&self, rel: &str) -> Result<Vec<String>, DataError> {
        let path = self.dir.join(rel);
        let bytes = self.fs.read(&path).map_err(|e| io_error(&path, e))?;
        let text = String::from_utf8(bytes).map_err(|_| DataError::Invalid {
            path: path.clone(),
            reason: "not a UTF-8 text file".into(),
        })?;
        Ok(text.split_whitespace().map(String::from).collect())
    }

    fn array(&self, rel: &str) -> Result<(Vec<usize>, Vec<f64>), DataError> {
        let path = self.dir.join(rel);
        let bytes = self.fs.read(&path).map_err(|e| io_error(&path, e))?;
        super::npy::check_npy_size(&path, &bytes)?;
        if let Some(read) = super::npy::read_numbers(&bytes) {
            return Ok(read);
        }
        let npy_error = |error| DataError::Npy {
            path: path.clone(),
            error,
        };
        // npy files are float32 or float64 depending on who wrote them; both become f64.
        let a = match ArrayD::<f64>::read_npy(&bytes[..]) {
            Err(ReadNpyError::WrongDescriptor(_)) => ArrayD::<f32>::read_npy(&bytes[..])
                .map(|a| a.mapv(f64::from))
                .map_err(npy_error),
            other => other.map_err(npy_error),
        }?;
        let shape = a.shape().to_vec();
        Ok((shape, a.iter().copied().collect()))
    }
}

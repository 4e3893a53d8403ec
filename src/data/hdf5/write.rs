//! Writing deepmd/hdf5 files as dpdata lays them out: for `gen-data` and the tests (dpw itself
//! only reads them).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

use super::lib::{self, Hid, Owned, Scoped, Types, H5};

/// Numbers a dataset can hold, with their HDF5 memory type.
pub trait Number: bytemuck::Pod {
    fn mem_type(t: &Types) -> Hid;
}

macro_rules! number {
    ($($t:ty => $field:ident),*) => {
        $(impl Number for $t {
            fn mem_type(t: &Types) -> Hid {
                t.$field
            }
        })*
    };
}
number!(f32 => f32, f64 => f64, i8 => i8, i32 => i32, i64 => i64);

/// An HDF5 file open for writing; datasets and groups are named by paths from its root.
pub struct Hdf5Writer {
    path: PathBuf,
    file: Owned,
}

impl Hdf5Writer {
    /// Creates `path`, replacing any file there.
    pub fn create(path: &Path) -> Result<Self> {
        Self::with(path, "create", |h5| h5.create_file(path))
    }

    /// Opens the HDF5 file `path` to change it.
    pub fn open(path: &Path) -> Result<Self> {
        Self::with(path, "open to write", |h5| h5.open_file(path, true))
    }

    fn with(path: &Path, what: &str, f: impl FnOnce(&H5) -> Option<Scoped<'_>>) -> Result<Self> {
        let h5 = lock()?;
        let file = f(&h5)
            .ok_or_else(|| anyhow!("cannot {what} {}", path.display()))?
            .keep();
        drop(h5);
        Ok(Hdf5Writer {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Creates the missing groups of `name`'s parents.
    fn parents(&self, h5: &H5, name: &str) -> Result<()> {
        let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty()).collect();
        let mut at = String::new();
        for part in &parts[..parts.len().saturating_sub(1)] {
            at.push('/');
            at.push_str(part);
            if !h5.link_exists(self.file.id, &at) {
                h5.create_group(self.file.id, &at)
                    .ok_or_else(|| anyhow!("{}: cannot create group {at}", self.path.display()))?;
            }
        }
        Ok(())
    }

    /// A new dataset `name` of `shape` (empty for a scalar) holding `data`, creating its
    /// parent groups.
    pub fn write<T: Number>(&self, name: &str, shape: &[usize], data: &[T]) -> Result<()> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(anyhow!("{name}: {} values for shape {shape:?}", data.len()));
        }
        let h5 = lock()?;
        self.parents(&h5, name)?;
        let t = T::mem_type(&h5.types());
        if !h5.write_dataset(self.file.id, name, t, t, shape, bytemuck::cast_slice(data)) {
            return Err(anyhow!("{}: cannot write {name}", self.path.display()));
        }
        Ok(())
    }

    /// A new one-dimensional dataset `name` of fixed-length ASCII strings, as dpdata writes
    /// `type_map.raw`.
    pub fn write_strings(&self, name: &str, strings: &[&str]) -> Result<()> {
        let len = strings.iter().map(|s| s.len()).max().unwrap_or(1);
        let mut bytes = vec![0u8; len.max(1) * strings.len()];
        for (chunk, s) in bytes.chunks_mut(len.max(1)).zip(strings) {
            chunk[..s.len()].copy_from_slice(s.as_bytes());
        }
        let h5 = lock()?;
        self.parents(&h5, name)?;
        let t = h5
            .fixed_string(len)
            .ok_or_else(|| anyhow!("{}: no string type", self.path.display()))?;
        if !h5.write_dataset(self.file.id, name, t.id, t.id, &[strings.len()], &bytes) {
            return Err(anyhow!("{}: cannot write {name}", self.path.display()));
        }
        Ok(())
    }

    /// Removes the dataset or group `name`.
    pub fn unlink(&self, name: &str) -> Result<()> {
        let h5 = lock()?;
        if !h5.unlink(self.file.id, name) {
            return Err(anyhow!("{}: cannot remove {name}", self.path.display()));
        }
        Ok(())
    }
}

fn lock() -> Result<H5> {
    lib::lock().map_err(|e| anyhow!(e))
}

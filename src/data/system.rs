//! Reading one deepmd/npy system (spec §1).

use std::io;
use std::path::{Path, PathBuf};

use ndarray::ArrayD;
use ndarray_npy::{ReadNpyError, ReadNpyExt};

use super::files::{Disk, Files};

/// Anything wrong with a system on disk. Every message names the offending file.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("required file {} is missing", path.display())]
    Missing { path: PathBuf },
    // The causes are part of the message, not a source chain, which `{:#}` would print again.
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("cannot read {} as a float32/float64 npy array: {error}", path.display())]
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
    #[error("{}: element {element:?} is used by atoms but absent from the model type_map {type_map:?}", path.display())]
    UnknownElement {
        path: PathBuf,
        element: String,
        type_map: Vec<String>,
    },
    #[error("{}: atom {atom} has type {index}, out of range for the model type_map {type_map:?} (and there is no type_map.raw)", path.display())]
    TypeOutOfRange {
        path: PathBuf,
        atom: usize,
        index: usize,
        type_map: Vec<String>,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// One system: all frames of all its `set.*` directories, atoms sorted by model type.
#[derive(Debug, Clone)]
pub struct System {
    pub path: PathBuf,
    pub natoms: usize,
    /// Model type index per atom, in sorted order.
    pub atype: Vec<usize>,
    /// `orig_index[i]` is the row of `type.raw` that sorted atom `i` came from.
    pub orig_index: Vec<usize>,
    pub nframes: usize,
    /// `[nframes][natoms][3]`, sorted atom order.
    pub coord: Vec<f64>,
    /// `[nframes][9]`, rows are the lattice vectors a, b, c; `None` for `nopbc` systems.
    pub cell: Option<Vec<f64>>,
    /// `[nframes]`.
    pub energy: Vec<f64>,
    /// `[nframes][natoms][3]`, sorted atom order.
    pub force: Vec<f64>,
    /// `[nframes][9]`; `Some` only if every set has `virial.npy`.
    pub virial: Option<Vec<f64>>,
}

impl System {
    /// Number of atoms of each model type, for `ntypes` types.
    pub fn type_counts(&self, ntypes: usize) -> Vec<usize> {
        let mut counts = vec![0; ntypes];
        for &t in &self.atype {
            counts[t] += 1;
        }
        counts
    }

    pub fn frame_coord(&self, frame: usize) -> &[f64] {
        let n = self.natoms * 3;
        &self.coord[frame * n..(frame + 1) * n]
    }

    pub fn frame_force(&self, frame: usize) -> &[f64] {
        let n = self.natoms * 3;
        &self.force[frame * n..(frame + 1) * n]
    }

    pub fn frame_cell(&self, frame: usize) -> Option<&[f64]> {
        self.cell.as_ref().map(|c| &c[frame * 9..(frame + 1) * 9])
    }

    pub fn frame_virial(&self, frame: usize) -> Option<&[f64]> {
        self.virial.as_ref().map(|v| &v[frame * 9..(frame + 1) * 9])
    }
}

/// Load the system in directory `path`, mapping its atom types onto the model's `type_map`.
pub fn load_system(path: &Path, type_map: &[String]) -> Result<System, DataError> {
    load_system_in(&Disk, path, type_map)
}

/// [`load_system`] from the files of `fs`.
pub fn load_system_in(
    fs: &dyn Files,
    path: &Path,
    type_map: &[String],
) -> Result<System, DataError> {
    let model_types = read_types(fs, path, type_map)?;
    let natoms = model_types.len();
    // Stable sort by type, as DeePMD's `np.lexsort((arange(natoms), atom_type))`.
    let mut orig_index: Vec<usize> = (0..natoms).collect();
    orig_index.sort_by_key(|&i| model_types[i]);
    let atype = orig_index.iter().map(|&i| model_types[i]).collect();

    let sets = set_dirs(fs, path)?;
    let pbc = !fs.is_file(&path.join("nopbc"));
    let mut coord = Vec::new();
    let mut cell = Vec::new();
    let mut energy = Vec::new();
    let mut force = Vec::new();
    let mut virial = Vec::new();
    let mut all_have_virial = true;
    for set in &sets {
        let coord_path = set.join("coord.npy");
        let (nf, c) = read_frames(fs, &coord_path, &[&[natoms * 3], &[natoms, 3]])?;
        let frames = |name: &str, tails: &[&[usize]]| {
            let p = set.join(name);
            let (found, data) = read_frames(fs, &p, tails)?;
            if found != nf {
                return Err(DataError::FrameCount {
                    path: p,
                    reference: coord_path.clone(),
                    expected: nf,
                    found,
                });
            }
            Ok(data)
        };
        energy.extend(frames("energy.npy", &[&[], &[1]])?);
        let f = frames("force.npy", &[&[natoms * 3], &[natoms, 3]])?;
        coord.extend(permute_atoms(&c, &orig_index));
        force.extend(permute_atoms(&f, &orig_index));
        if pbc {
            let box_path = set.join("box.npy");
            if !fs.is_file(&box_path) {
                return Err(DataError::Invalid {
                    path: box_path,
                    reason: "missing (a non-periodic system needs an empty `nopbc` file instead)"
                        .into(),
                });
            }
            cell.extend(frames("box.npy", &[&[9], &[3, 3]])?);
        }
        if fs.is_file(&set.join("virial.npy")) {
            virial.extend(frames("virial.npy", &[&[9], &[3, 3]])?);
        } else {
            all_have_virial = false;
        }
    }
    if !all_have_virial && !virial.is_empty() {
        tracing::warn!(
            "{}: only some sets have virial.npy; ignoring the virial of the whole system",
            path.display()
        );
    }
    let nframes = energy.len();
    if nframes == 0 {
        return Err(DataError::Invalid {
            path: path.to_path_buf(),
            reason: "the system has no frames".into(),
        });
    }
    let sys = System {
        path: path.to_path_buf(),
        natoms,
        atype,
        orig_index,
        nframes,
        coord,
        cell: pbc.then_some(cell),
        energy,
        force,
        virial: all_have_virial.then_some(virial),
    };
    super::validate::check_frames(&sys)?;
    Ok(sys)
}

/// Model type index of each atom, in `type.raw` order.
fn read_types(fs: &dyn Files, dir: &Path, type_map: &[String]) -> Result<Vec<usize>, DataError> {
    let type_path = dir.join("type.raw");
    let text = read_text(fs, &type_path)?;
    let types = text
        .split_whitespace()
        .map(|tok| {
            tok.parse::<usize>().map_err(|_| DataError::Invalid {
                path: type_path.clone(),
                reason: format!("{tok:?} is not a non-negative integer atom type"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if types.is_empty() {
        return Err(DataError::Invalid {
            path: type_path,
            reason: "no atoms".into(),
        });
    }

    let map_path = dir.join("type_map.raw");
    if !fs.is_file(&map_path) {
        return match types.iter().position(|&t| t >= type_map.len()) {
            Some(atom) => Err(DataError::TypeOutOfRange {
                path: type_path,
                atom,
                index: types[atom],
                type_map: type_map.to_vec(),
            }),
            None => Ok(types),
        };
    }
    let data_names: Vec<String> = read_text(fs, &map_path)?
        .split_whitespace()
        .map(String::from)
        .collect();
    types
        .iter()
        .enumerate()
        .map(|(atom, &t)| {
            let name = data_names.get(t).ok_or_else(|| DataError::Invalid {
                path: type_path.clone(),
                reason: format!(
                    "atom {atom} has type {t}, but {} lists only {} elements",
                    map_path.display(),
                    data_names.len()
                ),
            })?;
            type_map
                .iter()
                .position(|m| m == name)
                .ok_or_else(|| DataError::UnknownElement {
                    path: map_path.clone(),
                    element: name.clone(),
                    type_map: type_map.to_vec(),
                })
        })
        .collect()
}

fn read_text(fs: &dyn Files, path: &Path) -> Result<String, DataError> {
    let bytes = fs.read(path).map_err(|e| io_error(path, e))?;
    String::from_utf8(bytes).map_err(|_| DataError::Invalid {
        path: path.to_path_buf(),
        reason: "not a UTF-8 text file".into(),
    })
}

fn io_error(path: &Path, source: io::Error) -> DataError {
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

/// The `set.*` subdirectories of a system, sorted by name.
fn set_dirs(fs: &dyn Files, dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut sets = Vec::new();
    for entry in fs.list(dir).map_err(|e| io_error(dir, e))? {
        let is_set = entry
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("set."));
        if is_set && fs.is_dir(&entry) {
            sets.push(entry);
        }
    }
    if sets.is_empty() {
        return Err(DataError::Invalid {
            path: dir.to_path_buf(),
            reason: "no set.* directory".into(),
        });
    }
    sets.sort();
    Ok(sets)
}

/// Read a per-frame npy array whose shape is `[nframes]` followed by one of `tails`;
/// returns the frame count and the values (as f64, C order), all checked finite.
fn read_frames(
    fs: &dyn Files,
    path: &Path,
    tails: &[&[usize]],
) -> Result<(usize, Vec<f64>), DataError> {
    let array = read_npy_f64(fs, path)?;
    let shape = array.shape();
    if shape.is_empty() || !tails.contains(&&shape[1..]) {
        let expected = tails
            .iter()
            .map(|tail| {
                let dims: String = tail.iter().map(|d| format!(", {d}")).collect();
                format!("[nframes{dims}]")
            })
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(DataError::Shape {
            path: path.to_path_buf(),
            expected,
            found: shape.to_vec(),
        });
    }
    let nframes = shape[0];
    let values: Vec<f64> = array.iter().copied().collect();
    let width = values.len() / nframes.max(1);
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(DataError::NotFinite {
            path: path.to_path_buf(),
            frame: i / width,
            value: values[i],
        });
    }
    Ok((nframes, values))
}

/// npy files are float32 or float64 depending on who wrote them; both become f64.
fn read_npy_f64(fs: &dyn Files, path: &Path) -> Result<ArrayD<f64>, DataError> {
    let bytes = fs.read(path).map_err(|e| io_error(path, e))?;
    super::validate::check_npy_size(path, &bytes)?;
    let npy_error = |error| DataError::Npy {
        path: path.to_path_buf(),
        error,
    };
    match ArrayD::<f64>::read_npy(&bytes[..]) {
        Err(ReadNpyError::WrongDescriptor(_)) => ArrayD::<f32>::read_npy(&bytes[..])
            .map(|a| a.mapv(f64::from))
            .map_err(npy_error),
        other => other.map_err(npy_error),
    }
}

/// Reorder the atoms of every frame of a `[nframes][natoms][3]` array.
fn permute_atoms(values: &[f64], orig_index: &[usize]) -> Vec<f64> {
    let stride = orig_index.len() * 3;
    values
        .chunks_exact(stride)
        .flat_map(|frame| {
            orig_index
                .iter()
                .flat_map(move |&i| frame[3 * i..3 * i + 3].iter().copied())
        })
        .collect()
}

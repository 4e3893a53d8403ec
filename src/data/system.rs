//! Reading one deepmd/npy or deepmd/hdf5 system (docs/deepmd-spec.md §1).

use std::path::{Path, PathBuf};

use super::error::DataError;
use super::files::{Disk, Files};
use super::source::{Location, NpyDir, Source};

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

/// Load the system at `path` (a folder, or `file.hdf5#/group`), mapping its atom types onto the
/// model's `type_map`.
pub fn load_system(path: &Path, type_map: &[String]) -> Result<System, DataError> {
    load_system_in(&Disk, path, type_map)
}

/// [`load_system`] from the files of `fs`.
pub fn load_system_in(
    fs: &dyn Files,
    path: &Path,
    type_map: &[String],
) -> Result<System, DataError> {
    let sys = read_system_in(fs, path, type_map)?;
    super::validate::check_frames(&sys)?;
    Ok(sys)
}

/// [`load_system_in`] without [`check_frames`](super::check_frames): the reading alone, for a
/// caller that checks the frames elsewhere (in parallel, while HDF5 reads take turns).
pub fn read_system_in(
    fs: &dyn Files,
    path: &Path,
    type_map: &[String],
) -> Result<System, DataError> {
    with_source(fs, path, |src| load_from(src, path, type_map))
}

/// Whether the system at `path` is a group of an HDF5 file.
pub fn in_hdf5_file(path: &Path) -> bool {
    matches!(Location::parse(path), Location::Hdf5 { .. })
}

/// Runs `f` on the source of the system at `path`.
pub(crate) fn with_source<R>(
    fs: &dyn Files,
    path: &Path,
    f: impl FnOnce(&dyn Source) -> Result<R, DataError>,
) -> Result<R, DataError> {
    match Location::parse(path) {
        Location::Dir(dir) => f(&NpyDir { fs, dir }),
        Location::Hdf5 { file, group } => super::hdf5::with_group(&file, &group, f),
    }
}

/// What a system is without its frames: enough to size batches, draw from it and print it.
#[derive(Debug, Clone)]
pub struct SystemInfo {
    pub path: PathBuf,
    pub natoms: usize,
    /// Model type index per atom, in sorted order.
    pub atype: Vec<usize>,
    pub nframes: usize,
    pub pbc: bool,
    /// Every frame has a virial label.
    pub has_virial: bool,
}

impl SystemInfo {
    /// Bytes the system's frames take in memory, for the cache budget.
    pub fn bytes(&self) -> usize {
        let per_frame = 6 * self.natoms + 1 + 18;
        8 * per_frame * self.nframes
    }
}

impl System {
    pub fn info(&self) -> SystemInfo {
        SystemInfo {
            path: self.path.clone(),
            natoms: self.natoms,
            atype: self.atype.clone(),
            nframes: self.nframes,
            pbc: self.cell.is_some(),
            has_virial: self.virial.is_some(),
        }
    }
}

fn load_from(src: &dyn Source, path: &Path, type_map: &[String]) -> Result<System, DataError> {
    let model_types = read_types(src, type_map)?;
    let natoms = model_types.len();
    // Stable sort by type, as DeePMD's `np.lexsort((arange(natoms), atom_type))`.
    let mut orig_index: Vec<usize> = (0..natoms).collect();
    orig_index.sort_by_key(|&i| model_types[i]);
    let atype = orig_index.iter().map(|&i| model_types[i]).collect();

    let sets = set_names(src)?;
    let pbc = !src.has_file("nopbc");
    let mut coord = Vec::new();
    let mut cell = Vec::new();
    let mut energy = Vec::new();
    let mut force = Vec::new();
    let mut virial = Vec::new();
    let mut all_have_virial = true;
    for set in &sets {
        let coord_rel = format!("{set}/coord.npy");
        let (nf, c) = read_frames(src, &coord_rel, &[&[natoms * 3], &[natoms, 3]])?;
        let frames = |name: &str, tails: &[&[usize]]| {
            let rel = format!("{set}/{name}");
            let (found, data) = read_frames(src, &rel, tails)?;
            if found != nf {
                return Err(DataError::FrameCount {
                    path: src.path(&rel),
                    reference: src.path(&coord_rel),
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
            let box_rel = format!("{set}/box.npy");
            if !src.has_file(&box_rel) {
                return Err(DataError::Invalid {
                    path: src.path(&box_rel),
                    reason: "missing (a non-periodic system needs an empty `nopbc` file instead)"
                        .into(),
                });
            }
            cell.extend(frames("box.npy", &[&[9], &[3, 3]])?);
        }
        if src.has_file(&format!("{set}/virial.npy")) {
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
    Ok(System {
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
    })
}

/// Model type index of each atom, in `type.raw` order.
fn read_types(src: &dyn Source, type_map: &[String]) -> Result<Vec<usize>, DataError> {
    let type_path = src.path("type.raw");
    let types = src
        .tokens("type.raw")?
        .iter()
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

    let map_path = src.path("type_map.raw");
    if !src.has_file("type_map.raw") {
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
    let data_names = src.tokens("type_map.raw")?;
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

/// The `set.*` entries of a system, sorted by name; at least one.
fn set_names(src: &dyn Source) -> Result<Vec<String>, DataError> {
    let sets = src.sets()?;
    if sets.is_empty() {
        return Err(DataError::Invalid {
            path: src.path(""),
            reason: "no set.* directory".into(),
        });
    }
    Ok(sets)
}

/// Read a per-frame array whose shape is `[nframes]` followed by one of `tails`;
/// returns the frame count and the values (as f64, C order), all checked finite.
fn read_frames(
    src: &dyn Source,
    rel: &str,
    tails: &[&[usize]],
) -> Result<(usize, Vec<f64>), DataError> {
    let (shape, values) = src.array(rel)?;
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
            path: src.path(rel),
            expected,
            found: shape,
        });
    }
    let nframes = shape[0];
    let width = values.len() / nframes.max(1);
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(DataError::NotFinite {
            path: src.path(rel),
            frame: i / width,
            value: values[i],
        });
    }
    Ok((nframes, values))
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

//! Reading one deepmd/npy or deepmd/hdf5 system (docs/deepmd-spec.md §1), of one composition or
//! mixed-type (mixed.rs).

use std::path::{Path, PathBuf};

use super::error::DataError;
use super::files::Files;
use super::open::with_source;
use super::source::{Location, Source};
use super::types::{read_raw_types, TypeIndex};

/// One system: all frames of all its `set.*` directories, the atoms of each frame sorted by
/// model type (stable). A mixed-type system (`set.*/real_atom_types.npy`, see mixed.rs) gives
/// every frame its own types, so its per-atom fields hold one row per frame; read them through
/// [`System::frame_atype`] and [`System::frame_orig_index`].
#[derive(Debug, Clone)]
pub struct System {
    pub path: PathBuf,
    pub natoms: usize,
    /// Whether each frame has its own atom types (the mixed-type format).
    pub mixed: bool,
    /// Model type index per atom, in sorted order: `[natoms]`, or `[nframes][natoms]` when
    /// `mixed`.
    pub atype: Vec<usize>,
    /// `orig_index[i]` is the row of `type.raw` (of the frame, when `mixed`) that sorted atom
    /// `i` came from; shaped as `atype`.
    pub orig_index: Vec<usize>,
    pub nframes: usize,
    /// `[nframes][natoms][3]`, sorted atom order.
    pub coord: Vec<f64>,
    /// `[nframes][9]`, rows are the lattice vectors a, b, c; `None` for `nopbc` systems.
    pub cell: Option<Vec<f64>>,
    /// `[nframes]`; zeros where the system has no energy labels.
    pub energy: Vec<f64>,
    /// `[nframes][natoms][3]`, sorted atom order; zeros where the system has no force labels.
    pub force: Vec<f64>,
    /// Whether the sets hold `energy.npy` and `force.npy`: DeePMD-kit's `find_energy` and
    /// `find_force`, which fill a missing label with zeros as well. Training needs both
    /// ([`System::check_labels`]); `dpw test` reports what the labels there allow, and
    /// neighbour statistics need neither.
    pub has_energy: bool,
    pub has_force: bool,
    /// `[nframes][9]`; `Some` only if every set has `virial.npy`.
    pub virial: Option<Vec<f64>>,
    /// DeePMD-kit's frame parameters, `fparam.npy`: `[nframes][width]`.
    pub fparam: Option<Params>,
    /// Its atomic parameters, `aparam.npy`: `[nframes][natoms][width]`, sorted atom order.
    pub aparam: Option<Params>,
    /// The frame label the model asked for ([`Labels::Frame`], e.g. a property's
    /// `band_prop.npy`): `[nframes][width]`; `None` where no set has it or none was asked for.
    pub label: Option<Params>,
    /// Its atomic label where the model asks for one too (`atom_{name}.npy`, e.g. a DOS's
    /// `atom_dos.npy`): `[nframes][natoms][width]`, sorted atom order.
    pub atom_label: Option<Params>,
}

/// The labels a model learns from: what training reads of a system and requires of it
/// (DeePMD-kit's data requirements of the loss).
#[derive(Clone, Debug, PartialEq)]
pub enum Labels {
    /// None required (neighbour statistics; dpw test of an energy model): energy and force are
    /// read where present.
    Optional,
    /// Energy and force, required (the ener loss).
    EnergyForce,
    /// With `frame`, `{name}.npy` with `width` values per frame (a property, a DOS), with
    /// `atomic`, `atom_{name}.npy` with `width` per atom (a DOS). (A label the loss does not read
    /// is not read, as DeePMD-kit's loader reads the loss's requirements: the statistics then
    /// come from the others.) A system with neither is refused, warned of or read as it is
    /// (`missing`). Where types are `excluded` (a tensor's), the atomic label may hold the
    /// other atoms' rows alone, in file order (DeePMD-kit's `sel_type` layout); the excluded
    /// atoms' rows are then zero.
    Frame {
        name: String,
        width: usize,
        frame: bool,
        atomic: bool,
        missing: Missing,
        excluded: Vec<usize>,
    },
}

/// What a system without the labels [`Labels::Frame`] asks for gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// An error (DeePMD-kit's `must` labels: a property's).
    Refuse,
    /// A warning: its batches add nothing to the loss (DeePMD-kit's optional labels: a DOS's,
    /// which it fills with zeros and `find_*` 0).
    Warn,
    /// Nothing (dpw test reports what the labels allow).
    Quiet,
}

impl Labels {
    /// The frame label to read, `(file, width)`.
    fn frame(&self) -> Option<(String, usize)> {
        match self {
            Labels::Frame {
                name,
                width,
                frame: true,
                ..
            } => Some((format!("{name}.npy"), *width)),
            _ => None,
        }
    }

    /// The atomic label to read, `(file, width)`.
    fn atomic(&self) -> Option<(String, usize)> {
        match self {
            Labels::Frame {
                name,
                width,
                atomic: true,
                ..
            } => Some((format!("atom_{name}.npy"), *width)),
            _ => None,
        }
    }
}

/// A system's frame or atomic parameters: `width` values per frame (or per atom).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub width: usize,
    pub values: Vec<f64>,
}

impl Params {
    /// Frame `frame`'s values, `rows` (1, or the atoms) of `width` each.
    fn frame(&self, frame: usize, rows: usize) -> &[f64] {
        let n = rows * self.width;
        &self.values[frame * n..(frame + 1) * n]
    }
}

impl System {
    /// The row of the per-atom fields that holds frame `frame`.
    fn atom_row(&self, frame: usize) -> std::ops::Range<usize> {
        let row = if self.mixed { frame } else { 0 };
        row * self.natoms..(row + 1) * self.natoms
    }

    /// Model type of each atom of frame `frame`, sorted.
    pub fn frame_atype(&self, frame: usize) -> &[usize] {
        &self.atype[self.atom_row(frame)]
    }

    /// The file row of each sorted atom of frame `frame`.
    pub fn frame_orig_index(&self, frame: usize) -> &[usize] {
        &self.orig_index[self.atom_row(frame)]
    }

    /// The type of DeePMD-kit's first atom of frame `frame`, which its padding slots take
    /// (docs/design.md §11.1 item 3): DeePMD-kit sorts a frame by type, so the lowest type
    /// present, but leaves a mixed-type frame in file order, so its row 0's type there.
    pub fn pad_type(&self, frame: usize) -> usize {
        let atype = self.frame_atype(frame);
        match self.mixed {
            false => atype[0],
            true => {
                let order = self.frame_orig_index(frame);
                atype[order
                    .iter()
                    .position(|&o| o == 0)
                    .expect("row 0 is an atom")]
            }
        }
    }

    /// Number of atoms of each model type in frame `frame`, for `ntypes` types.
    pub fn type_counts(&self, frame: usize, ntypes: usize) -> Vec<usize> {
        let mut counts = vec![0; ntypes];
        for &t in self.frame_atype(frame) {
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

    pub fn frame_fparam(&self, frame: usize) -> Option<&[f64]> {
        Some(self.fparam.as_ref()?.frame(frame, 1))
    }

    /// `[natoms][width]` of frame `frame`, sorted atom order.
    pub fn frame_aparam(&self, frame: usize) -> Option<&[f64]> {
        Some(self.aparam.as_ref()?.frame(frame, self.natoms))
    }

    /// The labels training learns from ([`Labels`]), present.
    pub fn check_labels(&self, labels: &Labels) -> Result<(), DataError> {
        let missing: Vec<String> = match labels {
            Labels::Optional => vec![],
            Labels::EnergyForce => [
                (self.has_energy, "energy.npy"),
                (self.has_force, "force.npy"),
            ]
            .into_iter()
            .filter(|(has, _)| !has)
            .map(|(_, name)| name.to_string())
            .collect(),
            Labels::Frame {
                name,
                frame,
                atomic,
                missing,
                ..
            } => match (&self.label, &self.atom_label, missing) {
                (_, _, Missing::Quiet) | (Some(_), _, _) | (_, Some(_), _) => vec![],
                (None, None, how) => {
                    let files: Vec<String> = [(*frame, ""), (*atomic, "atom_")]
                        .iter()
                        .filter(|(on, _)| *on)
                        .map(|(_, pre)| format!("{pre}{name}.npy"))
                        .collect();
                    if *how == Missing::Warn {
                        tracing::warn!(
                            "{}: no set has {}, which the loss reads: its batches add nothing \
                             to the loss (as in DeePMD-kit, which fills the label with zeros)",
                            self.path.display(),
                            files.join(" or ")
                        );
                        return Ok(());
                    }
                    files
                }
            },
        };
        if missing.is_empty() {
            return Ok(());
        }
        let what = match labels {
            Labels::Frame { name, .. } => format!("the model's label {name:?}"),
            _ => "energy and force labels".to_string(),
        };
        Err(DataError::Invalid {
            path: self.path.clone(),
            reason: format!(
                "no set has {}: training needs {what} (dpw test and dpw neighbor-stat read \
                 such data)",
                missing.join(" or ")
            ),
        })
    }

    /// Frame `frame`'s label ([`System::label`]).
    pub fn frame_label(&self, frame: usize) -> Option<&[f64]> {
        Some(self.label.as_ref()?.frame(frame, 1))
    }

    /// Frame `frame`'s atomic label ([`System::atom_label`]), `[natoms][width]`.
    pub fn frame_atom_label(&self, frame: usize) -> Option<&[f64]> {
        Some(self.atom_label.as_ref()?.frame(frame, self.natoms))
    }
}

/// The reading of [`load_system_in`](super::load_system_in) without its frame checks, for a
/// caller that checks the frames elsewhere (in parallel, while HDF5 reads take turns).
pub fn read_system_in(
    fs: &dyn Files,
    path: &Path,
    type_map: &[String],
    labels: &Labels,
) -> Result<System, DataError> {
    with_source(fs, path, |src| load_from(src, path, type_map, labels))
}

/// Whether the system at `path` is a group of an HDF5 file.
pub fn in_hdf5_file(path: &Path) -> bool {
    matches!(Location::parse(path), Location::Hdf5 { .. })
}

/// What a system is without its frames: enough to size batches, draw from it and print it.
#[derive(Debug, Clone)]
pub struct SystemInfo {
    pub path: PathBuf,
    pub natoms: usize,
    /// Whether each frame has its own atom types (the mixed-type format).
    pub mixed: bool,
    /// The frames' compositions: one, or a mixed-type system's each once, in order of first
    /// appearance.
    pub compositions: Vec<Composition>,
    pub nframes: usize,
    pub pbc: bool,
    /// Every frame has a virial label.
    pub has_virial: bool,
    /// The values per frame of its `fparam.npy` and per atom of its `aparam.npy`, if it has them.
    pub fparam: Option<usize>,
    pub aparam: Option<usize>,
}

/// The model types of a frame's atoms, sorted, and how many frames of the system have them.
#[derive(Debug, Clone, PartialEq)]
pub struct Composition {
    pub atype: Vec<usize>,
    pub nframes: usize,
}

impl SystemInfo {
    /// Bytes the system's frames take in memory, for the cache budget.
    pub fn bytes(&self) -> usize {
        // coord and force, energy, cell and virial; a mixed frame's types and file rows; the
        // frame and atomic parameters
        let params = self.fparam.unwrap_or(0) + self.natoms * self.aparam.unwrap_or(0);
        let per_frame =
            6 * self.natoms + 1 + 18 + if self.mixed { 2 * self.natoms } else { 0 } + params;
        8 * per_frame * self.nframes
    }
}

impl System {
    pub fn info(&self) -> SystemInfo {
        let mut compositions: Vec<Composition> = Vec::new();
        for f in 0..if self.mixed { self.nframes } else { 1 } {
            let atype = self.frame_atype(f);
            match compositions.iter_mut().find(|c| c.atype == atype) {
                Some(c) => c.nframes += 1,
                None => compositions.push(Composition {
                    atype: atype.to_vec(),
                    nframes: 1,
                }),
            }
        }
        if !self.mixed {
            compositions[0].nframes = self.nframes;
        }
        SystemInfo {
            path: self.path.clone(),
            natoms: self.natoms,
            mixed: self.mixed,
            compositions,
            nframes: self.nframes,
            pbc: self.cell.is_some(),
            has_virial: self.virial.is_some(),
            fparam: self.fparam.as_ref().map(|p| p.width),
            aparam: self.aparam.as_ref().map(|p| p.width),
        }
    }
}

fn load_from(
    src: &dyn Source,
    path: &Path,
    type_map: &[String],
    labels: &Labels,
) -> Result<System, DataError> {
    let index = TypeIndex::read(src, type_map)?;
    let raw = read_raw_types(src)?;
    let natoms = raw.len();
    let sets = set_names(src)?;
    let mixed = super::mixed::is_mixed(src, &sets)?;
    let (mut atype, mut orig_index) = (Vec::new(), Vec::new());
    // Which atoms (file order) an atomic label of the selected types alone has rows for.
    let mut selected = None;
    if mixed {
        super::mixed::check_placeholder(src, &raw)?;
    } else {
        let type_path = src.path("type.raw");
        let model_types = (raw.iter().enumerate())
            .map(|(atom, &t)| index.model_type(t, &type_path, || format!("atom {atom}")))
            .collect::<Result<Vec<_>, _>>()?;
        push_sorted(&model_types, &mut atype, &mut orig_index);
        if let Labels::Frame { excluded, .. } = labels {
            let sel: Vec<bool> = model_types.iter().map(|t| !excluded.contains(t)).collect();
            selected = sel.contains(&false).then_some(sel);
        }
    }

    let pbc = !src.has_file("nopbc");
    // A label is read where any set has it, and then required of every set.
    let labelled = |name: &str| sets.iter().any(|s| src.has_file(&format!("{s}/{name}")));
    let (has_energy, has_force) = (labelled("energy.npy"), labelled("force.npy"));
    let mut coord = Vec::new();
    let mut cell = Vec::new();
    let mut energy = Vec::new();
    let mut force = Vec::new();
    let mut virial = Vec::new();
    let mut all_have_virial = true;
    let (mut fparam, mut aparam) = (None, None);
    let wanted = labels.frame().filter(|(name, _)| labelled(name));
    let mut label = wanted.as_ref().map(|_| Vec::new());
    // DeePMD-kit reads atomic_{name}.npy where there is no atom_{name}.npy.
    let wanted_atomic = labels.atomic().and_then(|(name, width)| {
        let alt = name.replacen("atom_", "atomic_", 1);
        [name, alt]
            .into_iter()
            .find(|n| labelled(n))
            .map(|n| (n, width))
    });
    let mut atom_label = wanted_atomic.as_ref().map(|_| Vec::new());
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
        let order_start = if mixed { orig_index.len() } else { 0 };
        if mixed {
            let types = super::mixed::set_types(src, set, natoms, nf, &index)?;
            for frame in types.chunks_exact(natoms) {
                push_sorted(frame, &mut atype, &mut orig_index);
            }
        }
        let order = &orig_index[order_start..];
        match has_energy {
            true => energy.extend(frames("energy.npy", &[&[], &[1]])?),
            false => energy.resize(energy.len() + nf, 0.0),
        }
        coord.extend(permute_atoms(&c, order, natoms, 3));
        match has_force {
            true => {
                let f = frames("force.npy", &[&[natoms * 3], &[natoms, 3]])?;
                force.extend(permute_atoms(&f, order, natoms, 3));
            }
            false => force.resize(force.len() + nf * natoms * 3, 0.0),
        }
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
        // Read where any set has them, then required of every set, at one width.
        for (name, per, acc) in [
            ("fparam.npy", 1, &mut fparam),
            ("aparam.npy", natoms, &mut aparam),
        ] {
            if !labelled(name) {
                continue;
            }
            let rel = format!("{set}/{name}");
            let (width, v) = read_params(src, &rel, nf, per)?;
            let acc = acc.get_or_insert(Params {
                width,
                values: Vec::new(),
            });
            if acc.width != width {
                return Err(DataError::Invalid {
                    path: src.path(&rel),
                    reason: format!(
                        "{width} values per {}, where the first set has {}",
                        if per == 1 { "frame" } else { "atom" },
                        acc.width
                    ),
                });
            }
            match per {
                1 => acc.values.extend(v),
                _ => acc.values.extend(permute_atoms(&v, order, natoms, width)),
            }
        }
        if let (Some((name, width)), Some(acc)) = (&wanted, &mut label) {
            // A one-value label may be stored as one number per frame.
            let tails: &[&[usize]] = if *width == 1 {
                &[&[1], &[]]
            } else {
                &[&[*width]]
            };
            acc.extend(frames(name, tails)?);
        }
        if let (Some((name, width)), Some(acc)) = (&wanted_atomic, &mut atom_label) {
            let w = *width;
            let nsel = selected
                .as_ref()
                .map_or(natoms, |s| s.iter().filter(|x| **x).count());
            let v = frames(
                name,
                &[&[natoms * w], &[natoms, w], &[nsel * w], &[nsel, w]],
            )?;
            let v = match &selected {
                Some(sel) if v.len() == nf * nsel * w && nsel != natoms => {
                    let mut rows = v.chunks_exact(w);
                    (0..nf)
                        .flat_map(|_| sel.iter())
                        .flat_map(|&s| match s {
                            true => rows.next().expect("nsel rows a frame").to_vec(),
                            false => vec![0.0; w],
                        })
                        .collect()
                }
                _ => v,
            };
            acc.extend(permute_atoms(&v, order, natoms, w));
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
        mixed,
        atype,
        orig_index,
        nframes,
        coord,
        cell: pbc.then_some(cell),
        energy,
        force,
        has_energy,
        has_force,
        virial: all_have_virial.then_some(virial),
        fparam,
        aparam,
        label: label
            .zip(wanted)
            .map(|(values, (_, width))| Params { width, values }),
        atom_label: (atom_label.zip(wanted_atomic))
            .map(|(values, (_, width))| Params { width, values }),
    })
}

/// Appends one frame's atoms sorted by model type (`types`, file order): their types and the
/// file rows they came from. Stable, as DeePMD's `np.lexsort((arange(natoms), atom_type))`.
fn push_sorted(types: &[usize], atype: &mut Vec<usize>, orig_index: &mut Vec<usize>) {
    let mut order: Vec<usize> = (0..types.len()).collect();
    order.sort_by_key(|&i| types[i]);
    atype.extend(order.iter().map(|&i| types[i]));
    orig_index.extend(order);
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
    check_finite(src, rel, &values, values.len() / nframes.max(1))?;
    Ok((nframes, values))
}

/// Refuses the first value of `rel` that is not finite, naming its frame (`per_frame` values
/// each).
fn check_finite(
    src: &dyn Source,
    rel: &str,
    values: &[f64],
    per_frame: usize,
) -> Result<(), DataError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(DataError::NotFinite {
            path: src.path(rel),
            frame: i / per_frame,
            value: values[i],
        }),
        None => Ok(()),
    }
}

/// Reorder the atoms of every frame of a `[nframes][natoms][w]` array by `order`: the file rows
/// of the sorted atoms, one row of `natoms` for every frame or one per frame.
fn permute_atoms(values: &[f64], order: &[usize], natoms: usize, w: usize) -> Vec<f64> {
    (values.chunks_exact(w * natoms).enumerate())
        .flat_map(|(f, frame)| {
            let rows = match order.len() == natoms {
                true => order,
                false => &order[f * natoms..(f + 1) * natoms],
            };
            (rows.iter()).flat_map(move |&i| frame[w * i..w * i + w].iter().copied())
        })
        .collect()
}

/// A set's `fparam.npy` (`per` 1) or `aparam.npy` (`per` natoms) of `nf` frames: any shape of
/// `nf` × a positive multiple of `per` values, as DeePMD-kit reshapes it to `[nframes][-1]`
/// (its own fparam example stores aparam.npy as one row of every frame's values). Returns the
/// values per frame (or atom) and the values, checked finite.
fn read_params(
    src: &dyn Source,
    rel: &str,
    nf: usize,
    per: usize,
) -> Result<(usize, Vec<f64>), DataError> {
    let (shape, values) = src.array(rel)?;
    let per_frame = values.len() / nf.max(1);
    if per_frame == 0 || per_frame * nf != values.len() || !per_frame.is_multiple_of(per) {
        return Err(DataError::Shape {
            path: src.path(rel),
            expected: match per {
                1 => format!("[{nf} frames, numb_fparam]"),
                n => format!("[{nf} frames, {n} atoms × numb_aparam]"),
            },
            found: shape,
        });
    }
    check_finite(src, rel, &values, per_frame)?;
    Ok((per_frame / per, values))
}

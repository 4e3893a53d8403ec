//! Host-side assembly of one batch: neighbour lists of every frame rearranged into the slot
//! layout of [`Dims`], plus the labels in batch-atom order (`frame·natoms + atom`).

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::backend::Dims;
use crate::data::Draw;
use crate::fitting::head::HeadLabels;
use crate::geometry::{build_nlist, build_nlist_mixed, Cell};
use crate::model::{DescriptorType, FittingSpec, ModelSpec};
use crate::stage::pairtab::{ShortRangeBatch, TableInput};

/// One frame as the model sees it; atoms sorted by type.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub coord: &'a [f64],
    pub cell: Option<&'a [f64]>,
    pub energy: f64,
    pub force: &'a [f64],
    pub virial: Option<&'a [f64]>,
    /// Frame parameters `[numb_fparam]` and atomic parameters `[natoms][numb_aparam]` (sorted
    /// atom order), for a model that takes them.
    pub fparam: Option<&'a [f64]>,
    pub aparam: Option<&'a [f64]>,
    /// The frame label a property or DOS model learns (`[dim]`), and the atomic one of a DOS
    /// model (`[natoms][dim]`, sorted atom order).
    pub label: Option<&'a [f64]>,
    pub atom_label: Option<&'a [f64]>,
}

impl<'a> Frame<'a> {
    pub fn of(sys: &'a crate::data::System, f: usize) -> Self {
        Frame {
            coord: sys.frame_coord(f),
            cell: sys.frame_cell(f),
            energy: sys.energy[f],
            force: sys.frame_force(f),
            virial: sys.frame_virial(f),
            fparam: sys.frame_fparam(f),
            aparam: sys.frame_aparam(f),
            label: sys.frame_label(f),
            atom_label: sys.frame_atom_label(f),
        }
    }
}

/// The atoms of one frame of a batch: their types, sorted, and the type its padding slots take
/// (a mixed-type descriptor's; [`crate::data::System::pad_type`]).
#[derive(Clone, Copy, Debug)]
pub struct FrameTypes<'a> {
    pub atype: &'a [usize],
    pub pad: usize,
}

impl<'a> FrameTypes<'a> {
    /// Atoms sorted by type whose padding takes the lowest type present, as in DeePMD-kit's
    /// type-sorted frames.
    pub fn sorted(atype: &'a [usize]) -> Self {
        FrameTypes {
            atype,
            pad: atype.first().copied().unwrap_or(0),
        }
    }

    pub fn of(sys: &'a crate::data::System, f: usize) -> Self {
        FrameTypes {
            atype: sys.frame_atype(f),
            pad: sys.pad_type(f),
        }
    }
}

#[derive(Clone, Debug)]
pub struct HostBatch {
    pub dims: Dims,
    pub rij: Vec<f64>,
    pub owner: Vec<i32>,
    /// A mixed-type descriptor's (DPA-1's) neighbour type of every slot, `[nslots]` in the slot
    /// order of [`Dims`]: the type of the slot's neighbour, and for a padding slot the type of
    /// DeePMD-kit's first atom of the frame ([`FrameTypes::pad`]; DeePMD-kit gathers atom 0 for
    /// padding). Empty for every other descriptor.
    pub nei_type: Vec<i32>,
    pub centre_atom: Vec<i32>,
    pub energy: Vec<f64>,
    pub force: Vec<f64>,
    pub virial: Vec<f64>,
    /// Every frame has a virial label.
    pub has_virial: bool,
    /// The fitting net's inputs beside the descriptor, `[ncentres][numb_fparam + numb_aparam]`:
    /// each centre's frame parameters, then its atomic parameters, as the data has them (the
    /// fitting stage normalises them). Empty for a model without such parameters.
    pub fit_input: Vec<f64>,
    /// A property or DOS model's labels; none for an energy model.
    pub head_labels: HeadLabels,
    /// The pair table's terms, for a model with one (`use_srtab`, `linear_ener`).
    pub short_range: Option<ShortRangeBatch>,
    /// A linear model's other DP models' batches of the same frames, each on its own list
    /// (DeePMD-kit's linear model cuts each model's from one list of the largest rcut and
    /// sel: the same neighbours).
    pub more: Vec<HostBatch>,
}

/// The batch atom (`frame·natoms + atom`) of every centre: a function of the shape alone, since
/// each frame's atoms are sorted by type and centres are ordered by type, then frame.
pub fn centre_atoms(d: &Dims) -> Vec<i32> {
    let mut out = vec![0i32; d.ncentres()];
    for f in 0..d.nframes {
        let mut atom = f * d.natoms;
        for t in 0..d.ntypes {
            for c in d.frame_centres(t, f) {
                out[c] = atom as i32;
                atom += 1;
            }
        }
    }
    out
}

/// The neighbour type of every slot of a mixed-type list ([`HostBatch::nei_type`]): the type of
/// its owner (`atype[frame·natoms + atom]`), or for padding (owner < 0) its frame's `pad`.
pub fn neighbour_types(d: &Dims, owner: &[i32], atype: &[usize], pad: &[usize]) -> Vec<i32> {
    let mut out = vec![0; owner.len()];
    for c in 0..d.ncentres() {
        let f = d.centre_frame(c);
        for s in d.mixed_slots(c) {
            out[s] = match usize::try_from(owner[s]) {
                Ok(o) => atype[o],
                Err(_) => pad[f],
            } as i32;
        }
    }
    out
}

/// The batch of frames `frames` of `sys`; an error names the (`what`: training, validation)
/// system and the frames.
pub fn assemble_frames(
    spec: &ModelSpec,
    sys: &crate::data::System,
    frames: &[usize],
    what: &str,
) -> Result<HostBatch> {
    let fr: Vec<Frame> = frames.iter().map(|&f| Frame::of(sys, f)).collect();
    let types: Vec<FrameTypes> = frames.iter().map(|&f| FrameTypes::of(sys, f)).collect();
    assemble_numbered(spec, &types, &fr, frames)
        .with_context(|| format!("{what} system {}", sys.path.display()))
}

/// The host batch of `draw` (`what`: training, validation); `None` for no frames, or for
/// frames of a system kept on the device (`resident[s]`), which are gathered there.
pub fn assemble_draw(
    spec: &ModelSpec,
    store: &crate::data::SystemStore,
    draw: &Draw,
    resident: &[bool],
    what: &str,
) -> Result<Option<HostBatch>> {
    match draw {
        _ if draw.is_empty() => Ok(None),
        Draw::System(s, _) if resident.get(*s).copied().unwrap_or(false) => Ok(None),
        Draw::System(s, frames) => assemble_frames(spec, &*store.get(*s)?, frames, what).map(Some),
        Draw::Mixed(picks) => {
            let systems = (picks.iter())
                .map(|&(s, _)| store.get(s))
                .collect::<Result<Vec<_>, _>>()?;
            let picks: Vec<_> = (systems.iter().zip(picks))
                .map(|(sys, &(_, f))| (&**sys, f))
                .collect();
            assemble_mixed(spec, &picks, what).map(Some)
        }
    }
}

/// A `"mixed:N"` batch: frame `f` of system `sys` for each `(sys, f)` of `picks`, in that
/// order, each padded with virtual atoms to the largest frame's atoms (DeePMD-kit's
/// `_merge_batch_data`); an error names each frame by its system and index.
pub fn assemble_mixed(
    spec: &ModelSpec,
    picks: &[(&crate::data::System, usize)],
    what: &str,
) -> Result<HostBatch> {
    let fr: Vec<Frame> = picks.iter().map(|&(s, f)| Frame::of(s, f)).collect();
    let types: Vec<FrameTypes> = picks.iter().map(|&(s, f)| FrameTypes::of(s, f)).collect();
    let index: Vec<usize> = picks.iter().map(|&(_, f)| f).collect();
    assemble_numbered(spec, &types, &fr, &index).with_context(|| {
        let frames: Vec<String> = (picks.iter())
            .map(|(s, f)| format!("{} frame {f}", s.path.display()))
            .collect();
        format!("{what} batch of {}", frames.join(", "))
    })
}

/// Refuses `batch_size: "mixed:N"` (at `key`) for a model whose batches cannot mix frames of
/// several systems: as in DeePMD-kit's TensorFlow backend, that needs a mixed-type descriptor
/// and the `ener` fitting.
pub fn check_mixed_batches(spec: &ModelSpec, key: &str) -> Result<()> {
    if !spec.descriptor.is_mixed() {
        bail!(
            "{key}: \"mixed:N\" batches need a mixed-type descriptor ({}), not {}",
            crate::model::registry::mixed_type_names(),
            spec.descriptor.kind.as_str()
        );
    }
    if !spec.fitting.output.is_ener() {
        bail!("{key}: \"mixed:N\" batches need the ener fitting, as in DeePMD-kit");
    }
    if spec.short_range.is_some() {
        bail!("{key}: \"mixed:N\" batches with a pair table are not implemented");
    }
    Ok(())
}

/// Refuses a mixed-type system (`mixed`: `set.*/real_atom_types.npy`) for a descriptor that is
/// not mixed-type: DeePMD-kit reads such data for se_atten and se_atten_v2, whose one neighbour
/// list serves frames of any composition in one batch.
pub fn check_mixed_data(spec: &ModelSpec, path: &Path, mixed: bool) -> Result<()> {
    if mixed && !spec.descriptor.is_mixed() {
        bail!(
            "{}: mixed-type data (set.*/real_atom_types.npy) needs a mixed-type descriptor \
             (se_atten, se_atten_v2), not {}",
            path.display(),
            spec.descriptor.kind.as_str()
        );
    }
    Ok(())
}

/// Refuses a system without the frame or atomic parameters the model takes, or with another
/// number of them, naming the file and the model's key.
pub fn check_params(spec: &ModelSpec, sys: &crate::data::SystemInfo) -> Result<()> {
    let f = &spec.fitting;
    let path = sys.path.display();
    for (name, key, want, has, per) in [
        ("fparam", "numb_fparam", f.numb_fparam, sys.fparam, "frame"),
        ("aparam", "numb_aparam", f.numb_aparam, sys.aparam, "atom"),
    ] {
        match has {
            _ if want == 0 => {}
            None if name == "fparam" && f.default_fparam.is_some() => {}
            None => bail!(
                "{path}: no set has {name}.npy, which the model takes (model.fitting_net.{key} \
                 {want}{})",
                if name == "fparam" {
                    "; or give model.fitting_net.default_fparam"
                } else {
                    ""
                }
            ),
            Some(n) if n != want => bail!(
                "{path}: {name}.npy has {n} values per {per}, model.fitting_net.{key} is {want}"
            ),
            Some(_) => {}
        }
    }
    Ok(())
}

/// The batch of `frames`, every one of atoms `atype`; an error names a frame by its position in
/// `frames`.
pub fn assemble(spec: &ModelSpec, atype: &[usize], frames: &[Frame]) -> Result<HostBatch> {
    let index: Vec<usize> = (0..frames.len()).collect();
    let types = vec![FrameTypes::sorted(atype); frames.len()];
    assemble_numbered(spec, &types, frames, &index)
}

/// [`assemble`] of frames of their own atoms, `types[f]`; an error names frame `f` as `index[f]`
/// (its index in its system).
fn assemble_numbered(
    spec: &ModelSpec,
    types: &[FrameTypes],
    frames: &[Frame],
    index: &[usize],
) -> Result<HostBatch> {
    let d = &spec.descriptor;
    let nt = spec.ntypes();
    let mut counts = Vec::with_capacity(types.len());
    for (ft, &frame) in types.iter().zip(index) {
        let atype = ft.atype;
        if atype.windows(2).any(|w| w[0] > w[1]) {
            bail!("frame {frame}: atoms of a batch must be sorted by type");
        }
        let count = |t| atype.iter().filter(|&&x| x == t).count();
        counts.push((0..nt).map(count).collect::<Vec<_>>());
    }
    let uniform = counts.windows(2).all(|w| w[0] == w[1]);
    let dims = match (uniform, counts.first()) {
        (true, Some(c)) => Dims::of_descriptor(d, frames.len(), c),
        (true, None) => Dims::of_descriptor(d, 0, &vec![0; nt]),
        (false, _) => Dims::of_descriptor_frames(d, &counts),
    };
    // A frame of fewer atoms than the batch's largest ends in virtual atoms (`"mixed:N"`).
    let n = dims.natoms;
    let sections = d.sections();
    let ns = dims.nslots();
    let mut rij = vec![0.0; 3 * ns];
    let mut owner = vec![-1i32; ns];
    let centre_atom = centre_atoms(&dims);
    // The longest cut-off a frame is read at: the descriptor's, or a pair table's of its own.
    let rcut = (spec.short_range.iter())
        .map(|sr| sr.table.rcut)
        .fold(d.rcut, f64::max);
    let cells = (frames.iter().zip(index))
        .map(|(fr, frame)| match fr.cell {
            Some(c) => {
                let cell = Cell::new(c)
                    .ok_or_else(|| anyhow::anyhow!("frame {frame}: the cell is singular"))?;
                cell.images(rcut)
                    .map_err(|e| anyhow::anyhow!("frame {frame}: {e}"))?;
                Ok(Some(cell))
            }
            None => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    let nlists: Vec<_> = (frames.iter().zip(&cells).zip(types))
        .map(|((fr, cell), ft)| match d.is_mixed() {
            true => build_nlist_mixed(fr.coord, cell.as_ref(), ft.atype, d.rcut, d.nnei()),
            false => build_nlist(fr.coord, cell.as_ref(), ft.atype, d.rcut, &d.sel),
        })
        .collect();
    // A hybrid's sub-descriptor takes the first sel_k[t] slots of each type section of the one
    // list (DeePMD-kit's `nlist_cut_idx`) into its own part of the section, the neighbours
    // beyond its own rcut left as padding: there DeePMD-kit's switch is exactly 0, so its row
    // is a padding slot's and its force nothing. The parts follow each other within a section.
    let hybrid = d.kind == DescriptorType::Hybrid;
    let mut part_start = vec![0; nt];
    for part in d.parts() {
        let rc2 = part.rcut * part.rcut;
        for (f, nl) in nlists.iter().enumerate() {
            // Frame f's atoms in sorted order, i.e. its centres type by type.
            let mut i = 0;
            for ti in 0..nt {
                for c in dims.frame_centres(ti, f) {
                    for (tj, (&sel, &sec)) in part.sel.iter().zip(&sections).enumerate() {
                        for j in 0..sel {
                            let src = i * d.nnei() + sec + j;
                            let s = dims.slot(ti, c, tj, part_start[tj] + j);
                            let r = &nl.rij[3 * src..3 * src + 3];
                            let inside = !hybrid || r.iter().map(|x| x * x).sum::<f64>() < rc2;
                            if nl.owner[src] >= 0 && inside {
                                owner[s] = (f * n) as i32 + nl.owner[src];
                                rij[3 * s..3 * s + 3].copy_from_slice(r);
                            }
                        }
                    }
                    i += 1;
                }
            }
        }
        part_start
            .iter_mut()
            .zip(&part.sel)
            .for_each(|(o, s)| *o += s);
    }
    let nei_type = match d.is_mixed() {
        true => {
            let atype = padded(types.iter().map(|t| t.atype), n, 0);
            let pad: Vec<usize> = types.iter().map(|t| t.pad).collect();
            neighbour_types(&dims, &owner, &atype, &pad)
        }
        false => vec![],
    };
    let has_virial = frames.iter().all(|f| f.virial.is_some());
    let fit_input = fit_input(&spec.fitting, &dims, &centre_atom, frames, index)?;
    let head_labels = head_labels(spec, n, &centre_atom, frames);
    let short_range = match &spec.short_range {
        Some(sr) => Some(ShortRangeBatch::new(
            sr,
            &TableInput {
                dims: &dims,
                rij: &rij,
                owner: &owner,
                nei_type: &nei_type,
                centre_atom: &centre_atom,
                frames: (frames.iter().zip(&cells).zip(types))
                    .map(|((fr, cell), ft)| (fr.coord, cell.as_ref(), ft.atype))
                    .collect(),
                index,
            },
        )?),
        None => None,
    };
    let more = (1..spec.nmembers())
        .map(|k| assemble_numbered(&spec.member(k), types, frames, index))
        .collect::<Result<_>>()?;
    Ok(HostBatch {
        dims,
        rij,
        owner,
        nei_type,
        centre_atom,
        energy: frames.iter().map(|f| f.energy).collect(),
        force: padded(frames.iter().map(|f| f.force), 3 * n, 0.0),
        virial: frames
            .iter()
            .flat_map(|f| f.virial.map_or([0.0; 9].to_vec(), |v| v.to_vec()))
            .collect(),
        has_virial,
        fit_input,
        head_labels,
        short_range,
        more,
    })
}

/// [`HostBatch::head_labels`]: each where every frame has it (a system has a label for all its
/// frames or none), the atomic ones put in centre order.
fn head_labels(spec: &ModelSpec, n: usize, centre_atom: &[i32], frames: &[Frame]) -> HeadLabels {
    if spec.fitting.output.is_ener() {
        return HeadLabels::default();
    }
    let k = spec.fitting.output.fitting().label_width();
    let frame = (frames.iter())
        .map(|f| f.label)
        .collect::<Option<Vec<&[f64]>>>()
        .map(|rows| rows.concat());
    let atoms = (frames.iter())
        .map(|f| f.atom_label)
        .collect::<Option<Vec<&[f64]>>>()
        .map(|rows| padded(rows.into_iter(), n * k, 0.0));
    let atomic = atoms.map(|a| {
        (centre_atom.iter())
            .flat_map(|&i| a[i as usize * k..(i as usize + 1) * k].iter().copied())
            .collect()
    });
    HeadLabels { frame, atomic }
}

/// [`HostBatch::fit_input`]: per centre, its frame's parameters (or the model's
/// `default_fparam`) and its atom's.
fn fit_input<'a>(
    fit: &'a FittingSpec,
    dims: &Dims,
    centre_atom: &[i32],
    frames: &[Frame<'a>],
    index: &[usize],
) -> Result<Vec<f64>> {
    let (nfp, nap) = (fit.numb_fparam, fit.numb_aparam);
    if nfp + nap == 0 {
        return Ok(Vec::new());
    }
    let n = dims.natoms;
    let fparam = |fr: &Frame<'a>| match nfp {
        0 => None,
        _ => fr.fparam.or(fit.default_fparam.as_deref()),
    };
    let aparam = |fr: &Frame<'a>| fr.aparam.filter(|_| nap > 0);
    for (fr, &frame) in frames.iter().zip(index) {
        match fparam(fr) {
            Some(p) if p.len() != nfp => bail!(
                "frame {frame}: {} frame parameters, the model takes numb_fparam {nfp}",
                p.len()
            ),
            None if nfp > 0 => bail!(
                "frame {frame}: no frame parameters (fparam.npy), which the model takes \
                 (numb_fparam {nfp}, no default_fparam)"
            ),
            _ => {}
        }
        let atoms = fr.coord.len() / 3;
        match aparam(fr) {
            Some(p) if p.len() != atoms * nap => bail!(
                "frame {frame}: {} atomic parameters for {atoms} atoms, the model takes \
                 numb_aparam {nap} per atom",
                p.len()
            ),
            None if nap > 0 => bail!(
                "frame {frame}: no atomic parameters (aparam.npy), which the model takes \
                 (numb_aparam {nap})"
            ),
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(centre_atom.len() * (nfp + nap));
    for (c, &a) in centre_atom.iter().enumerate() {
        let f = dims.centre_frame(c);
        let fr = &frames[f];
        if let Some(p) = fparam(fr) {
            out.extend_from_slice(p);
        }
        if let Some(p) = aparam(fr) {
            let atom = a as usize - f * n;
            out.extend_from_slice(&p[atom * nap..(atom + 1) * nap]);
        }
    }
    Ok(out)
}

/// Each frame's rows, `width` values a frame, padded with `fill` up to it (a frame's virtual
/// atoms, [`Dims::of_frames`]).
fn padded<'a, X: Copy + 'a>(rows: impl Iterator<Item = &'a [X]>, width: usize, fill: X) -> Vec<X> {
    let mut out = Vec::new();
    for r in rows {
        out.extend_from_slice(r);
        out.resize(out.len() + width - r.len(), fill);
    }
    out
}

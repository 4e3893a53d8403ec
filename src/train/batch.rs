//! Host-side assembly of one batch: neighbour lists of every frame rearranged into the slot
//! layout of [`Dims`], plus the labels in batch-atom order (`frame·natoms + atom`).

use anyhow::{bail, Context, Result};

use crate::backend::Dims;
use crate::geometry::{build_nlist, build_nlist_mixed, Cell};
use crate::model::{DescriptorType, ModelSpec};

/// One frame as the model sees it; atoms sorted by type.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub coord: &'a [f64],
    pub cell: Option<&'a [f64]>,
    pub energy: f64,
    pub force: &'a [f64],
    pub virial: Option<&'a [f64]>,
}

impl<'a> Frame<'a> {
    pub fn of(sys: &'a crate::data::System, f: usize) -> Self {
        Frame {
            coord: sys.frame_coord(f),
            cell: sys.frame_cell(f),
            energy: sys.energy[f],
            force: sys.frame_force(f),
            virial: sys.frame_virial(f),
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
    /// the frame's first atom in type-sorted order, i.e. the lowest type present (DeePMD-kit
    /// gathers atom 0 for padding, and its data loader sorts atoms by type). Empty for every
    /// other descriptor.
    pub nei_type: Vec<i32>,
    pub centre_atom: Vec<i32>,
    pub energy: Vec<f64>,
    pub force: Vec<f64>,
    pub virial: Vec<f64>,
    /// Every frame has a virial label.
    pub has_virial: bool,
}

/// The batch atom (`frame·natoms + atom`) of every centre: a function of the shape alone, since
/// atoms are sorted by type and centres are ordered by type, then frame.
pub fn centre_atoms(d: &Dims) -> Vec<i32> {
    let mut out = vec![0i32; d.ncentres()];
    let mut type_start = 0;
    for t in 0..d.ntypes {
        let count = d.centres(t).len() / d.nframes.max(1);
        for f in 0..d.nframes {
            for k in 0..count {
                out[d.centre_start[t] + f * count + k] = (f * d.natoms + type_start + k) as i32;
            }
        }
        type_start += count;
    }
    out
}

/// The neighbour type of every slot of a mixed-type list ([`HostBatch::nei_type`]): the type of
/// its owner (`frame·natoms + atom`), or for padding (owner < 0) `atype[0]`, the lowest type
/// present, since the atoms of a batch are sorted by type.
pub fn neighbour_types(owner: &[i32], atype: &[usize]) -> Vec<i32> {
    let n = atype.len();
    let pad = atype.first().map_or(0, |&t| t as i32);
    (owner.iter())
        .map(|&o| match usize::try_from(o) {
            Ok(o) => atype[o % n] as i32,
            Err(_) => pad,
        })
        .collect()
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
    assemble_numbered(spec, &sys.atype, &fr, frames)
        .with_context(|| format!("{what} system {}", sys.path.display()))
}

/// The batch of `frames`; an error names a frame by its position in `frames`.
pub fn assemble(spec: &ModelSpec, atype: &[usize], frames: &[Frame]) -> Result<HostBatch> {
    let index: Vec<usize> = (0..frames.len()).collect();
    assemble_numbered(spec, atype, frames, &index)
}

/// [`assemble`], an error naming frame `f` as `index[f]` (its index in its system).
fn assemble_numbered(
    spec: &ModelSpec,
    atype: &[usize],
    frames: &[Frame],
    index: &[usize],
) -> Result<HostBatch> {
    let d = &spec.descriptor;
    let nt = spec.ntypes();
    let n = atype.len();
    if atype.windows(2).any(|w| w[0] > w[1]) {
        bail!("atoms of a batch must be sorted by type");
    }
    let counts: Vec<usize> = (0..nt)
        .map(|t| atype.iter().filter(|&&x| x == t).count())
        .collect();
    let type_start: Vec<usize> = (0..nt)
        .map(|t| atype.iter().take_while(|&&x| x < t).count())
        .collect();
    let dims = d.dims(frames.len(), &counts);
    let sections = d.sections();
    let ns = dims.nslots();
    let mut rij = vec![0.0; 3 * ns];
    let mut owner = vec![-1i32; ns];
    let centre_atom = centre_atoms(&dims);
    let nlists = frames
        .iter()
        .enumerate()
        .map(|(f, fr)| {
            let cell = match fr.cell {
                Some(c) => {
                    let frame = index[f];
                    let cell = Cell::new(c)
                        .ok_or_else(|| anyhow::anyhow!("frame {frame}: the cell is singular"))?;
                    cell.images(d.rcut)
                        .map_err(|e| anyhow::anyhow!("frame {frame}: {e}"))?;
                    Some(cell)
                }
                None => None,
            };
            Ok(match d.is_mixed() {
                true => build_nlist_mixed(fr.coord, cell.as_ref(), atype, d.rcut, d.nnei()),
                false => build_nlist(fr.coord, cell.as_ref(), atype, d.rcut, &d.sel),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // A hybrid's sub-descriptor takes the first sel_k[t] slots of each type section of the one
    // list (DeePMD-kit's `nlist_cut_idx`) into its own part of the section, the neighbours
    // beyond its own rcut left as padding: there DeePMD-kit's switch is exactly 0, so its row
    // is a padding slot's and its force nothing. The parts follow each other within a section.
    let hybrid = d.kind == DescriptorType::Hybrid;
    let mut part_start = vec![0; nt];
    for part in d.parts() {
        let rc2 = part.rcut * part.rcut;
        for (ti, &count) in counts.iter().enumerate() {
            for (f, nl) in nlists.iter().enumerate() {
                for k in 0..count {
                    let i = type_start[ti] + k;
                    let c = dims.centre_start[ti] + f * count + k;
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
                }
            }
        }
        part_start
            .iter_mut()
            .zip(&part.sel)
            .for_each(|(o, s)| *o += s);
    }
    let nei_type = match d.is_mixed() {
        true => neighbour_types(&owner, atype),
        false => vec![],
    };
    let has_virial = frames.iter().all(|f| f.virial.is_some());
    Ok(HostBatch {
        dims,
        rij,
        owner,
        nei_type,
        centre_atom,
        energy: frames.iter().map(|f| f.energy).collect(),
        force: frames
            .iter()
            .flat_map(|f| f.force.iter().copied())
            .collect(),
        virial: frames
            .iter()
            .flat_map(|f| f.virial.map_or([0.0; 9].to_vec(), |v| v.to_vec()))
            .collect(),
        has_virial,
    })
}

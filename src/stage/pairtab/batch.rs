//! What a batch's pair table gives the step, computed once per batch on the host (the table has
//! no parameters, so none of it changes while the model trains).

use anyhow::{bail, Result};

use crate::backend::Dims;
use crate::geometry::{build_nlist_mixed, Cell};
use crate::model::pairtab::{Mix, ShortRange};

/// Per centre, slot, atom and frame, in the batch's order ([`Dims`]); with e_DP the DP model's
/// atomic energy, the model's is e_i = weight_i·e_DP,i + pair_e_i + bias. Everything of the
/// table that does not multiply e_DP is here as forces and virials already; only the weight's
/// change (`dweight`, ZBL's) meets e_DP in the step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShortRangeBatch {
    /// The DP model's weight of every centre, `[ncentres]`.
    pub weight: Vec<f64>,
    /// ∂weight_i/∂r_ij of every slot, `[nslots][3]` (zero for a constant weight).
    pub dweight: Vec<f64>,
    /// The table's weighted atomic energy, `[ncentres]`.
    pub pair_e: Vec<f64>,
    /// The forces of `pair_e` (and of ZBL's weight times the table's energy), `[nframes ·
    /// natoms][3]` in the batch's atom order.
    pub pair_force: Vec<f64>,
    /// Their virial, `[nframes][9]`.
    pub pair_virial: Vec<f64>,
}

/// A batch as the table reads it: the DP model's slots (a ZBL mix reads its table on them) and
/// each frame's atoms (a linear model's table has a neighbour list of its own).
pub struct TableInput<'a> {
    pub dims: &'a Dims,
    /// r_ij, owners (< 0: padding) and neighbour types of the DP model's slots.
    pub rij: &'a [f64],
    pub owner: &'a [i32],
    pub nei_type: &'a [i32],
    pub centre_atom: &'a [i32],
    /// Per frame: coordinates `[natoms][3]`, cell, atom types.
    pub frames: Vec<(&'a [f64], Option<&'a Cell>, &'a [usize])>,
    /// A frame's number in its system, for errors.
    pub index: &'a [usize],
}

/// One neighbour the table reads: its slot in the DP model's list (ZBL's), its atom in the
/// batch, r_j − r_i, its distance, the unit vector along it, and its type.
struct Near {
    slot: Option<usize>,
    atom: usize,
    x: [f64; 3],
    r: f64,
    r_hat: [f64; 3],
    tj: usize,
}

impl ShortRangeBatch {
    /// The table's terms of a batch. A ZBL table reads each centre's first `sel` slots inside
    /// its rcut (its rcut and sel are the descriptor's); a linear model's table the `sel`
    /// nearest atoms inside its own rcut, as DeePMD-kit cuts each sub-model's list from the
    /// model's. An error names a pair closer than the table's first distance and its frame.
    pub fn new(sr: &ShortRange, input: &TableInput) -> Result<Self> {
        let d = input.dims;
        let (nc, ns) = (d.ncentres(), d.nslots());
        let t = &sr.table;
        let mut out = ShortRangeBatch {
            weight: vec![0.0; nc],
            dweight: vec![0.0; 3 * ns],
            pair_e: vec![0.0; nc],
            pair_force: vec![0.0; 3 * d.nbatch_atoms()],
            pair_virial: vec![0.0; 9 * d.nframes],
        };
        let lists = match sr.mix {
            Mix::Linear { .. } => (input.frames.iter())
                .map(|&(coord, cell, atype)| build_nlist_mixed(coord, cell, atype, t.rcut, t.sel))
                .collect(),
            Mix::Zbl { .. } => Vec::new(),
        };
        let mut near: Vec<Near> = Vec::new();
        for c in 0..nc {
            let (ti, f) = (d.centre_type(c), d.centre_frame(c));
            let atom = input.centre_atom[c] as usize;
            near.clear();
            let mut keep = |slot, atom, x: [f64; 3], tj| {
                let r = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
                if r <= t.rcut && r != 0.0 {
                    let r_hat = x.map(|v| v / r);
                    near.push(Near {
                        slot,
                        atom,
                        x,
                        r,
                        r_hat,
                        tj,
                    });
                }
            };
            match lists.get(f) {
                Some(nl) => {
                    let i = atom - f * d.natoms;
                    let atype = input.frames[f].2;
                    for k in i * nl.nnei..(i + 1) * nl.nnei {
                        if let Ok(j) = usize::try_from(nl.owner[k]) {
                            let x = [nl.rij[3 * k], nl.rij[3 * k + 1], nl.rij[3 * k + 2]];
                            keep(None, f * d.natoms + j, x, atype[j]);
                        }
                    }
                }
                None => {
                    for s in d.mixed_slots(c).take(t.sel) {
                        if let Ok(o) = usize::try_from(input.owner[s]) {
                            let x = [input.rij[3 * s], input.rij[3 * s + 1], input.rij[3 * s + 2]];
                            keep(Some(s), o, x, input.nei_type[s] as usize);
                        }
                    }
                }
            }
            // The table's atomic energy: half of each pair's, and its derivative per pair.
            let mut e = 0.0;
            let mut de = vec![0.0; near.len()];
            for (k, n) in near.iter().enumerate() {
                let (ep, dp) = t.pair(ti, n.tj, n.r).or_else(|r| {
                    bail!(
                        "frame {}: two atoms {r} apart, closer than the pair table's first \
                         distance {} ({}): the table cannot give their energy",
                        input.index[f],
                        t.rmin,
                        sr.tab_file
                    )
                })?;
                e += 0.5 * ep;
                de[k] = 0.5 * dp;
            }
            // ∂(table's share)/∂|r_ij| per pair.
            let dshare: Vec<f64> = match &sr.mix {
                Mix::Linear { weights } => {
                    let (wd, wp) = weights.pair();
                    out.weight[c] = wd;
                    out.pair_e[c] = wp * e;
                    de.iter().map(|x| wp * x).collect()
                }
                Mix::Zbl {
                    sw_rmin,
                    sw_rmax,
                    smin_alpha,
                } => {
                    let (w, dw) = zbl_weight(&near, *sw_rmin, *sw_rmax, *smin_alpha);
                    out.weight[c] = 1.0 - w;
                    out.pair_e[c] = w * e;
                    for (n, dw) in near.iter().zip(&dw) {
                        let s = n.slot.expect("a ZBL table reads the DP model's slots");
                        let dwk = n.r_hat.map(|x| -dw * x);
                        out.dweight[3 * s..3 * s + 3].copy_from_slice(&dwk);
                    }
                    (dw.iter().zip(&de))
                        .map(|(dw, de)| dw * e + w * de)
                        .collect()
                }
            };
            // Scattered as `force_virial` scatters q = ∂E/∂r_ij.
            for (n, g) in near.iter().zip(dshare) {
                for a in 0..3 {
                    let q = g * n.r_hat[a];
                    out.pair_force[3 * atom + a] += q;
                    out.pair_force[3 * n.atom + a] -= q;
                    for b in 0..3 {
                        out.pair_virial[9 * f + 3 * a + b] -= q * n.x[b];
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The table's weight w of one atom from its neighbours' distances (DeePMD-kit's
/// `DPZBLLinearEnergyAtomicModel._compute_weight`) and ∂w/∂r_k of each.
fn zbl_weight(near: &[Near], rmin: f64, rmax: f64, alpha: f64) -> (f64, Vec<f64>) {
    let mut dw = vec![0.0; near.len()];
    let e: Vec<f64> = near.iter().map(|n| (-n.r / alpha).exp()).collect();
    let (mut num, mut den) = (0.0, 0.0);
    for (n, &e) in near.iter().zip(&e) {
        num += n.r * e;
        den += e;
    }
    let sigma = num / den.max(1e-20);
    if sigma == 0.0 || sigma >= rmax {
        return (0.0, dw);
    }
    if sigma < rmin {
        return (1.0, dw);
    }
    let width = rmax - rmin;
    let u = (sigma - rmin) / width;
    let w = -6.0 * u.powi(5) + 15.0 * u.powi(4) - 10.0 * u.powi(3) + 1.0;
    let dw_dsigma = (-30.0 * u.powi(4) + 60.0 * u.powi(3) - 30.0 * u.powi(2)) / width;
    for (k, (n, &e)) in near.iter().zip(&e).enumerate() {
        dw[k] = dw_dsigma * e * ((1.0 - n.r / alpha) + sigma / alpha) / den;
    }
    (w, dw)
}

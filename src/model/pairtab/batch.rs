//! What a batch's pair table gives the step, computed once per batch on the host from the
//! slots (the table has no parameters, so none of it changes while the model trains).

use anyhow::{bail, Result};

use super::{Mix, ShortRange};
use crate::backend::Dims;

/// Per centre and slot, in the batch's order ([`Dims`]); with e_DP the DP model's atomic
/// energy, the model's is e_i = weight_i·e_DP,i + pair_e_i + bias.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShortRangeBatch {
    /// The DP model's weight of every centre, `[ncentres]`.
    pub weight: Vec<f64>,
    /// ∂weight_i/∂r_ij of every slot, `[nslots][3]` (zero for a constant weight).
    pub dweight: Vec<f64>,
    /// The table's weighted atomic energy, `[ncentres]`.
    pub pair_e: Vec<f64>,
    /// ∂pair_e_i/∂r_ij of every slot, `[nslots][3]`.
    pub pair_q: Vec<f64>,
}

impl ShortRangeBatch {
    /// From a mixed-type batch's slots: r_ij, owners (< 0: padding) and neighbour types. The
    /// table reads each centre's first `sel` slots inside its rcut (DeePMD-kit cuts its list
    /// so from the model's); an error names a pair closer than the table's first distance and
    /// its frame (`index[f]` for the batch's frame f).
    pub fn new(
        sr: &ShortRange,
        d: &Dims,
        rij: &[f64],
        owner: &[i32],
        nei_type: &[i32],
        index: &[usize],
    ) -> Result<Self> {
        let (nc, ns) = (d.ncentres(), d.nslots());
        let t = &sr.table;
        let mut out = ShortRangeBatch {
            weight: vec![0.0; nc],
            dweight: vec![0.0; 3 * ns],
            pair_e: vec![0.0; nc],
            pair_q: vec![0.0; 3 * ns],
        };
        // Per slot read by the table: (slot, r, r̂).
        let mut near: Vec<(usize, f64, [f64; 3])> = Vec::new();
        for c in 0..nc {
            let ti = d.centre_type(c);
            near.clear();
            for s in d.mixed_slots(c).take(t.sel) {
                if owner[s] < 0 {
                    continue;
                }
                let x = [rij[3 * s], rij[3 * s + 1], rij[3 * s + 2]];
                let r = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
                if r > t.rcut || r == 0.0 {
                    continue;
                }
                near.push((s, r, x.map(|v| v / r)));
            }
            // The table's atomic energy: half of each pair's, and its derivative per slot.
            let mut e = 0.0;
            let mut de = vec![0.0; near.len()];
            for (k, &(s, r, _)) in near.iter().enumerate() {
                let tj = nei_type[s] as usize;
                let (ep, dp) = t.pair(ti, tj, r).or_else(|r| {
                    bail!(
                        "frame {}: two atoms {r} apart, closer than the pair table's first \
                         distance {} ({}): the table cannot give their energy",
                        index[d.centre_frame(c)],
                        t.rmin,
                        sr.tab_file
                    )
                })?;
                e += 0.5 * ep;
                de[k] = 0.5 * dp;
            }
            let r_hat = |k: usize| near[k].2;
            match &sr.mix {
                Mix::Linear { weights } => {
                    let (wd, wp) = weights.pair();
                    out.weight[c] = wd;
                    out.pair_e[c] = wp * e;
                    for (k, &(s, ..)) in near.iter().enumerate() {
                        let q = r_hat(k).map(|x| wp * de[k] * x);
                        out.pair_q[3 * s..3 * s + 3].copy_from_slice(&q);
                    }
                }
                Mix::Zbl {
                    sw_rmin,
                    sw_rmax,
                    smin_alpha,
                } => {
                    let (w, dw) = zbl_weight(&near, *sw_rmin, *sw_rmax, *smin_alpha);
                    out.weight[c] = 1.0 - w;
                    out.pair_e[c] = w * e;
                    for (k, &(s, ..)) in near.iter().enumerate() {
                        let dwk = r_hat(k).map(|x| -dw[k] * x);
                        let q = r_hat(k).map(|x| (dw[k] * e + w * de[k]) * x);
                        out.dweight[3 * s..3 * s + 3].copy_from_slice(&dwk);
                        out.pair_q[3 * s..3 * s + 3].copy_from_slice(&q);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The table's weight w of one atom from its neighbours' distances (DeePMD-kit's
/// `DPZBLLinearEnergyAtomicModel._compute_weight`) and ∂w/∂r_k of each.
fn zbl_weight(
    near: &[(usize, f64, [f64; 3])],
    rmin: f64,
    rmax: f64,
    alpha: f64,
) -> (f64, Vec<f64>) {
    let mut dw = vec![0.0; near.len()];
    let e: Vec<f64> = near.iter().map(|&(_, r, _)| (-r / alpha).exp()).collect();
    let (mut num, mut den) = (0.0, 0.0);
    for (&(_, r, _), &e) in near.iter().zip(&e) {
        num += r * e;
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
    for (k, (&(_, r, _), &e)) in near.iter().zip(&e).enumerate() {
        dw[k] = dw_dsigma * e * ((1.0 - r / alpha) + sigma / alpha) / den;
    }
    (w, dw)
}

//! Environment matrix with its derivative (docs/deepmd-spec.md §3).

use rayon::prelude::*;

use crate::backend::{Dims, Real};
use crate::geometry::env_row;
use crate::geometry::EnvParams;

#[allow(clippy::too_many_arguments)]
pub fn env_mat<T: Real>(
    d: &Dims,
    env: EnvParams,
    rij: &[T],
    owner: &[i32],
    davg: &[T],
    dstd: &[T],
    rhat: &mut [T],
    jac: &mut [T],
    s: &mut [T],
) {
    for ti in 0..d.ntypes {
        let (lo, hi) = (d.type_slots(ti).start, d.type_slots(ti).end);
        let avg: [f64; 4] = std::array::from_fn(|k| davg[4 * ti + k].f64());
        let std: [f64; 4] = std::array::from_fn(|k| dstd[4 * ti + k].f64());
        rhat[4 * lo..4 * hi]
            .par_chunks_mut(4)
            .zip(jac[12 * lo..12 * hi].par_chunks_mut(12))
            .zip(s[lo..hi].par_iter_mut())
            .enumerate()
            .for_each(|(i, ((rh, jc), s))| {
                let slot = lo + i;
                let (row, j) = if owner[slot] >= 0 {
                    let x = [0, 1, 2].map(|a| rij[3 * slot + a].f64());
                    env_row(x, &env)
                } else {
                    ([0.0; 4], [[0.0; 3]; 4])
                };
                for k in 0..4 {
                    rh[k] = T::of((row[k] - avg[k]) / std[k]);
                    for a in 0..3 {
                        jc[3 * k + a] = T::of(j[k][a] / std[k]);
                    }
                }
                *s = rh[0];
            });
    }
}

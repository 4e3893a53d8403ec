//! Environment matrix with its derivative (docs/deepmd-spec.md §3).

use rayon::prelude::*;

use crate::backend::{Dims, EnvParams, Real};

/// Switch value and its derivative with respect to r (C2-smooth quintic, docs/deepmd-spec.md §3).
pub fn switch(r: f64, env: &EnvParams) -> (f64, f64) {
    if r <= env.rcut_smth {
        return (1.0, 0.0);
    }
    if r >= env.rcut {
        return (0.0, 0.0);
    }
    let w = env.rcut - env.rcut_smth;
    let u = (r - env.rcut_smth) / w;
    let sw = u * u * u * (-6.0 * u * u + 15.0 * u - 10.0) + 1.0;
    let dsw = (3.0 * u * u * (-6.0 * u * u + 15.0 * u - 10.0) + u * u * u * (-12.0 * u + 15.0)) / w;
    (sw, dsw)
}

/// Raw R = sw·[1/r, x/r², y/r², z/r²] and ∂R/∂r_ij (4×3), computed in f64.
pub fn env_row(x: [f64; 3], env: &EnvParams) -> ([f64; 4], [[f64; 3]; 4]) {
    let r = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
    let rr = r + env.protection;
    let (sw, dsw) = switch(r, env);
    let rhat = x.map(|v| v / r);
    let mut row = [sw / rr, 0.0, 0.0, 0.0];
    let mut jac = [[0.0; 3]; 4];
    let d0 = dsw / rr - sw / (rr * rr);
    let dv = dsw / (rr * rr) - 2.0 * sw / (rr * rr * rr);
    for a in 0..3 {
        jac[0][a] = d0 * rhat[a];
    }
    for k in 0..3 {
        row[k + 1] = sw * x[k] / (rr * rr);
        for a in 0..3 {
            jac[k + 1][a] = x[k] * dv * rhat[a] + if k == a { sw / (rr * rr) } else { 0.0 };
        }
    }
    (row, jac)
}

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
        let lo = d.block(ti, 0).start;
        let hi = d.block(ti, d.ntypes - 1).end;
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

//! The descriptor contraction A = (1/nnei) Σ G ⊗ R̂, D = A A<ᵀ, and its derivatives.
//! Work is split per centre; a centre's slots are one run of `sel[tj]` rows in each block.

use rayon::prelude::*;

use crate::backend::{Dims, Real};

/// Calls `f(tj, slots)` for every section of centre c (slots: the slot range in that section).
fn for_sections(d: &Dims, c: usize, mut f: impl FnMut(std::ops::Range<usize>)) {
    let ti = d.centre_type(c);
    for tj in 0..d.ntypes {
        let first = d.slot(ti, c, tj, 0);
        f(first..first + d.sel[tj]);
    }
}

fn inv_nnei<T: Real>(d: &Dims) -> T {
    T::of(1.0 / d.nnei as f64)
}

/// A_c accumulated from per-slot factors: A[a][k] += Σ_slots u[slot][a]·v[slot][k] / nnei.
fn accumulate_a<T: Real>(d: &Dims, c: usize, u: &[T], v: &[T], out: &mut [T]) {
    let m1 = d.m1;
    for_sections(d, c, |slots| {
        for s in slots {
            let (us, vs) = (&u[s * m1..(s + 1) * m1], &v[4 * s..4 * s + 4]);
            for a in 0..m1 {
                for k in 0..4 {
                    out[4 * a + k] += us[a] * vs[k];
                }
            }
        }
    });
    let f = inv_nnei::<T>(d);
    out.iter_mut().for_each(|x| *x *= f);
}

/// out[a][b] (+)= Σ_k x[a][k]·y[b][k] for b < M2: the D = X Y<ᵀ product.
fn outer_m2<T: Real>(d: &Dims, x: &[T], y: &[T], out: &mut [T]) {
    for a in 0..d.m1 {
        for b in 0..d.m2 {
            out[a * d.m2 + b] += (0..4).map(|k| x[4 * a + k] * y[4 * b + k]).sum::<T>();
        }
    }
}

/// Adjoint of D = A A<ᵀ: out[a][k] += Σ_b D̄[a][b] A[b][k] + [a < M2] Σ_a' D̄[a'][a] A[a'][k].
fn axis_backward<T: Real>(d: &Dims, dbar: &[T], a: &[T], out: &mut [T]) {
    let (m1, m2) = (d.m1, d.m2);
    for i in 0..m1 {
        for b in 0..m2 {
            let g = dbar[i * m2 + b];
            for k in 0..4 {
                out[4 * i + k] += g * a[4 * b + k];
                out[4 * b + k] += g * a[4 * i + k];
            }
        }
    }
}

pub fn forward<T: Real>(d: &Dims, g: &[T], rhat: &[T], a: &mut [T], desc: &mut [T]) {
    let (m1, m2) = (d.m1, d.m2);
    a.par_chunks_mut(4 * m1)
        .zip(desc.par_chunks_mut(m1 * m2))
        .enumerate()
        .for_each(|(c, (ac, dc))| {
            ac.fill(T::zero());
            accumulate_a(d, c, g, rhat, ac);
            dc.fill(T::zero());
            outer_m2(d, ac, ac, dc);
        });
}

pub fn backward<T: Real>(d: &Dims, a: &[T], dbar: &[T], abar: &mut [T]) {
    let (m1, m2) = (d.m1, d.m2);
    abar.par_chunks_mut(4 * m1).enumerate().for_each(|(c, ab)| {
        ab.fill(T::zero());
        axis_backward(
            d,
            &dbar[c * m1 * m2..(c + 1) * m1 * m2],
            &a[c * 4 * m1..(c + 1) * 4 * m1],
            ab,
        );
    });
}

/// Runs `f(c, slot, out_row)` over every slot, in parallel per centre, where `out` has
/// `width` values per slot.
fn per_slot<T: Real>(
    d: &Dims,
    out: &mut [T],
    width: usize,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    for ti in 0..d.ntypes {
        for tj in 0..d.ntypes {
            let blk = d.block(ti, tj);
            let sel = d.sel[tj];
            if sel == 0 {
                continue;
            }
            let c0 = d.centre_start[ti];
            out[blk.start * width..blk.end * width]
                .par_chunks_mut(sel * width)
                .enumerate()
                .for_each(|(i, rows)| {
                    for (j, row) in rows.chunks_mut(width).enumerate() {
                        f(c0 + i, blk.start + i * sel + j, row);
                    }
                });
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn slot_backward<T: Real>(
    d: &Dims,
    abar: &[T],
    g: &[T],
    gp: &[T],
    rhat: &[T],
    jac: &[T],
    q: &mut [T],
) {
    let m1 = d.m1;
    let f = inv_nnei::<T>(d);
    per_slot(d, q, 3, |c, s, qs| {
        let ab = &abar[c * 4 * m1..(c + 1) * 4 * m1];
        let (gs, gps, rh) = (
            &g[s * m1..(s + 1) * m1],
            &gp[s * m1..(s + 1) * m1],
            &rhat[4 * s..4 * s + 4],
        );
        let mut rbar = [T::zero(); 4];
        for a in 0..m1 {
            let arow = &ab[4 * a..4 * a + 4];
            for k in 0..4 {
                rbar[k] += arow[k] * gs[a];
            }
            rbar[0] += gps[a] * (0..4).map(|k| arow[k] * rh[k]).sum::<T>();
        }
        let js = &jac[12 * s..12 * s + 12];
        for x in 0..3 {
            qs[x] = f * (0..4).map(|k| js[3 * k + x] * rbar[k]).sum::<T>();
        }
    });
}

#[allow(clippy::too_many_arguments)]
pub fn tangent<T: Real>(
    d: &Dims,
    g: &[T],
    gp: &[T],
    rhat: &[T],
    rdot: &[T],
    a: &[T],
    adot: &mut [T],
    ddot: &mut [T],
) {
    let (m1, m2) = (d.m1, d.m2);
    let f = inv_nnei::<T>(d);
    adot.par_chunks_mut(4 * m1)
        .zip(ddot.par_chunks_mut(m1 * m2))
        .enumerate()
        .for_each(|(c, (ad, dd))| {
            ad.fill(T::zero());
            for_sections(d, c, |slots| {
                for s in slots {
                    let sdot = rdot[4 * s];
                    for i in 0..m1 {
                        let (gv, gd) = (g[s * m1 + i], gp[s * m1 + i] * sdot);
                        for k in 0..4 {
                            ad[4 * i + k] += gd * rhat[4 * s + k] + gv * rdot[4 * s + k];
                        }
                    }
                }
            });
            ad.iter_mut().for_each(|x| *x *= f);
            let ac = &a[c * 4 * m1..(c + 1) * 4 * m1];
            dd.fill(T::zero());
            outer_m2(d, ad, ac, dd);
            outer_m2(d, ac, ad, dd);
        });
}

#[allow(clippy::too_many_arguments)]
pub fn dual<T: Real>(
    d: &Dims,
    a: &[T],
    adot: &[T],
    dbar: &[T],
    ddotbar: &[T],
    rhat: &[T],
    rdot: &[T],
    gbar: &mut [T],
    gdotbar: &mut [T],
) {
    let (m1, m2) = (d.m1, d.m2);
    // Per centre: Ā = B(D̄, A) + B(Ḋ̄, Ȧ), Ǡ = B(Ḋ̄, A), with B the adjoint of D = A A<ᵀ.
    let per_centre: Vec<(Vec<T>, Vec<T>)> = (0..d.ncentres())
        .into_par_iter()
        .map(|c| {
            let (am, dm) = (c * 4 * m1..(c + 1) * 4 * m1, c * m1 * m2..(c + 1) * m1 * m2);
            let mut ab = vec![T::zero(); 4 * m1];
            let mut adb = vec![T::zero(); 4 * m1];
            axis_backward(d, &dbar[dm.clone()], &a[am.clone()], &mut ab);
            axis_backward(d, &ddotbar[dm.clone()], &adot[am.clone()], &mut ab);
            axis_backward(d, &ddotbar[dm], &a[am], &mut adb);
            (ab, adb)
        })
        .collect();
    let f = inv_nnei::<T>(d);
    per_slot(d, gbar, m1, |c, s, gb| {
        let (ab, adb) = &per_centre[c];
        let (rh, rd) = (&rhat[4 * s..4 * s + 4], &rdot[4 * s..4 * s + 4]);
        for i in 0..m1 {
            gb[i] = f
                * (0..4)
                    .map(|k| ab[4 * i + k] * rh[k] + adb[4 * i + k] * rd[k])
                    .sum::<T>();
        }
    });
    per_slot(d, gdotbar, m1, |c, s, gdb| {
        let adb = &per_centre[c].1;
        let rh = &rhat[4 * s..4 * s + 4];
        for i in 0..m1 {
            gdb[i] = f * (0..4).map(|k| adb[4 * i + k] * rh[k]).sum::<T>();
        }
    });
}

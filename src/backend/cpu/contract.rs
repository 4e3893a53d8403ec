//! The descriptor contraction A = (1/nnei) Σ G ⊗ R̂, D = A A<ᵀ, and its derivatives.
//!
//! Work is split per centre; a centre's slots are one run of `sel[tj]` rows in each block. The
//! CPU keeps A-shaped buffers (A, Ā, Ȧ) transposed, `[4][M1]` per centre, so that every
//! per-slot update is a contiguous length-M1 axpy or dot that vectorises.

use rayon::prelude::*;

use super::simd::wide;
use crate::backend::{Dims, Real};

#[inline(always)]
fn axpy<T: Real>(y: &mut [T], a: T, x: &[T]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * *x);
}

/// [`axpy`] that does nothing for a = 0, with the same bits when x is finite: a·x is then ±0,
/// and a sum that starts at +0 is never −0, so adding ±0 leaves it as it is. The padded slots'
/// coefficients are zero in most of the per-slot sums (their R̂ is −avg/std, zero in the three
/// directional columns, and their Ṙ and Jacobian are zero).
#[inline(always)]
fn axpy_nz<T: Real>(y: &mut [T], a: T, x: &[T]) {
    if a != T::zero() {
        axpy(y, a, x);
    }
}

/// `y = y + Σ_t a_t·x_t` (or from zero without `accumulate`), each element summed in the order
/// of the terms and the terms with a zero coefficient left out: the same bits as [`axpy_nz`]
/// term after term, in one pass that keeps each element in a register instead of loading and
/// storing y once per term.
#[inline(always)]
fn combine<T: Real, const K: usize>(y: &mut [T], terms: [(T, &[T]); K], accumulate: bool) {
    let mut live: [(T, &[T]); K] = [(T::zero(), &[]); K];
    let mut nt = 0;
    for (a, x) in terms {
        if a != T::zero() {
            live[nt] = (a, &x[..y.len()]);
            nt += 1;
        }
    }
    let live = &live[..nt];
    let j = combine_chunks::<T, 16>(y, live, accumulate, 0);
    let j = combine_chunks::<T, 4>(y, live, accumulate, j);
    combine_chunks::<T, 1>(y, live, accumulate, j);
}

/// [`combine`] on y's chunks of L elements from j on; returns where they end.
#[inline(always)]
fn combine_chunks<T: Real, const L: usize>(
    y: &mut [T],
    live: &[(T, &[T])],
    accumulate: bool,
    mut j: usize,
) -> usize {
    while j + L <= y.len() {
        let yc = &mut y[j..j + L];
        let mut acc = [T::zero(); L];
        if accumulate {
            acc.copy_from_slice(yc);
        }
        for &(a, x) in live {
            let x = &x[j..j + L];
            for q in 0..L {
                acc[q] += a * x[q];
            }
        }
        yc.copy_from_slice(&acc);
        j += L;
    }
    j
}

/// x·y with eight partial sums, so that it vectorises (a single running sum cannot be
/// reordered by the compiler).
#[inline(always)]
pub(super) fn dot<T: Real>(x: &[T], y: &[T]) -> T {
    let n = x.len().min(y.len());
    let (xc, yc) = (x[..n].chunks_exact(8), y[..n].chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    let mut acc = [T::zero(); 8];
    for (a, b) in xc.zip(yc) {
        for k in 0..8 {
            acc[k] += a[k] * b[k];
        }
    }
    let tail = xr.iter().zip(yr).fold(T::zero(), |s, (a, b)| s + *a * *b);
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// The slot ranges (one per neighbour-type section) of centre c.
pub(super) fn sections(d: &Dims, c: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let ti = d.centre_type(c);
    d.sections().map(move |tj| {
        let first = d.slot(ti, c, tj, 0);
        first..first + d.sel[tj]
    })
}

fn inv_nnei<T: Real>(d: &Dims) -> T {
    T::of(1.0 / d.nnei as f64)
}

/// out[a][b] += Σ_k x[k][a]·y[k][b] for b < M2 (x, y transposed `[4][M1]`; out `[M1][M2]`).
#[inline(always)]
fn outer_m2<T: Real>(d: &Dims, x: &[T], y: &[T], out: &mut [T]) {
    let m1 = d.m1;
    for k in 0..4 {
        let (xk, yk) = (&x[k * m1..(k + 1) * m1], &y[k * m1..(k + 1) * m1]);
        for (a, row) in out.chunks_mut(d.m2).enumerate() {
            axpy(row, xk[a], &yk[..d.m2]);
        }
    }
}

/// Adjoint of D = A A<ᵀ: out += B(D̄, A) with out[k][a] += Σ_b D̄[a][b] A[k][b] +
/// [a < M2] Σ_a' D̄[a'][a] A[k][a'] (all A-shaped buffers transposed).
#[inline(always)]
fn axis_backward<T: Real>(d: &Dims, dbar: &[T], a: &[T], out: &mut [T]) {
    let (m1, m2) = (d.m1, d.m2);
    for k in 0..4 {
        let (ak, ok) = (&a[k * m1..(k + 1) * m1], &mut out[k * m1..(k + 1) * m1]);
        for (i, row) in dbar.chunks(m2).enumerate() {
            ok[i] += dot(row, &ak[..m2]);
            let aik = ak[i];
            axpy(&mut ok[..m2], aik, row);
        }
    }
}

pub fn forward<T: Real>(d: &Dims, g: &[T], rhat: &[T], a: &mut [T], desc: &mut [T]) {
    let (m1, m2) = (d.m1, d.m2);
    let f = inv_nnei::<T>(d);
    a.par_chunks_mut(4 * m1)
        .zip(desc.par_chunks_mut(m1 * m2))
        .enumerate()
        .for_each(|(c, (ac, dc))| {
            wide(
                #[inline(always)]
                || {
                    ac.fill(T::zero());
                    for s in sections(d, c).flatten() {
                        let gs = &g[s * m1..(s + 1) * m1];
                        for k in 0..4 {
                            axpy_nz(&mut ac[k * m1..(k + 1) * m1], rhat[4 * s + k] * f, gs);
                        }
                    }
                    dc.fill(T::zero());
                    outer_m2(d, ac, ac, dc);
                },
            )
        });
}

pub fn backward<T: Real>(d: &Dims, a: &[T], dbar: &[T], abar: &mut [T]) {
    let (m1, m2) = (d.m1, d.m2);
    abar.par_chunks_mut(4 * m1).enumerate().for_each(|(c, ab)| {
        wide(
            #[inline(always)]
            || {
                ab.fill(T::zero());
                axis_backward(
                    d,
                    &dbar[c * m1 * m2..(c + 1) * m1 * m2],
                    &a[c * 4 * m1..(c + 1) * 4 * m1],
                    ab,
                );
            },
        )
    });
}

pub fn gbar<T: Real>(d: &Dims, abar: &[T], rhat: &[T], gbar: &mut [T]) {
    let m1 = d.m1;
    let f = inv_nnei::<T>(d);
    per_slot(
        d,
        gbar,
        m1,
        #[inline(always)]
        |c, s, gs| {
            let ab = &abar[c * 4 * m1..(c + 1) * 4 * m1];
            let terms: [(T, &[T]); 4] =
                std::array::from_fn(|k| (rhat[4 * s + k] * f, &ab[k * m1..(k + 1) * m1]));
            combine(gs, terms, true);
        },
    );
}

/// Runs `f(c, slot, out_row)` over every slot, in parallel per centre, where `out` has
/// `width` values per slot.
pub(super) fn per_slot<T: Real>(
    d: &Dims,
    out: &mut [T],
    width: usize,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    per_slot_at(
        d,
        out,
        width,
        #[inline(always)]
        |c, s, _, row| f(c, s, row),
    );
}

/// [`per_slot`] that also tells `f` the slot's place among its centre's `nnei` slots (sections
/// in type order), for per-centre scratch laid out that way.
pub(super) fn per_slot_at<T: Real>(
    d: &Dims,
    out: &mut [T],
    width: usize,
    f: impl Fn(usize, usize, usize, &mut [T]) + Sync,
) {
    for ti in 0..d.ntypes {
        let mut section = 0;
        for tj in d.sections() {
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
                    wide(
                        #[inline(always)]
                        || {
                            for (j, row) in rows.chunks_mut(width).enumerate() {
                                f(c0 + i, blk.start + i * sel + j, section + j, row);
                            }
                        },
                    )
                });
            section += sel;
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
    per_slot(
        d,
        q,
        3,
        #[inline(always)]
        |c, s, qs| {
            let js = &jac[12 * s..12 * s + 12];
            if js.iter().all(|j| *j == T::zero()) {
                // A padded slot: its sums below are +0 (for finite Ā, G, G').
                qs.fill(T::zero());
                return;
            }
            let ab = &abar[c * 4 * m1..(c + 1) * 4 * m1];
            let (gs, gps, rh) = (
                &g[s * m1..(s + 1) * m1],
                &gp[s * m1..(s + 1) * m1],
                &rhat[4 * s..4 * s + 4],
            );
            // R̄[k] = Ā[k]·G, plus on k = 0 the s-path: G'·(Σ_k Ā[k] R̂[k]).
            // Plain loops, not `array::from_fn` or iterator sums: their closures are not
            // inlined into the wide version (the dots ran as baseline code, 2 % of a step).
            let mut rbar = [T::zero(); 4];
            for (k, rb) in rbar.iter_mut().enumerate() {
                *rb = dot(&ab[k * m1..(k + 1) * m1], gs);
            }
            let mut sp = T::zero();
            for k in 0..4 {
                sp += rh[k] * dot(&ab[k * m1..(k + 1) * m1], gps);
            }
            rbar[0] += sp;
            for x in 0..3 {
                let mut q = T::zero();
                for k in 0..4 {
                    q += js[3 * k + x] * rbar[k];
                }
                qs[x] = f * q;
            }
        },
    );
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
            wide(
                #[inline(always)]
                || {
                    ad.fill(T::zero());
                    for s in sections(d, c).flatten() {
                        let (gs, gps) = (&g[s * m1..(s + 1) * m1], &gp[s * m1..(s + 1) * m1]);
                        let sdot = rdot[4 * s];
                        for k in 0..4 {
                            combine(
                                &mut ad[k * m1..(k + 1) * m1],
                                [(f * sdot * rhat[4 * s + k], gps), (f * rdot[4 * s + k], gs)],
                                true,
                            );
                        }
                    }
                    let ac = &a[c * 4 * m1..(c + 1) * 4 * m1];
                    dd.fill(T::zero());
                    outer_m2(d, ad, ac, dd);
                    outer_m2(d, ac, ad, dd);
                },
            )
        });
}

/// Ā = B(D̄, A) + B(Ḋ̄, Ȧ) and Ǡ = B(Ḋ̄, A) of every centre (B the adjoint of D = A A<ᵀ),
/// `(Ā, Ǡ)` per centre, transposed like A: the per-centre half of [`dual`].
pub(super) fn centre_adjoints<T: Real>(
    d: &Dims,
    a: &[T],
    adot: &[T],
    dbar: &[T],
    ddotbar: &[T],
) -> Vec<(Vec<T>, Vec<T>)> {
    let (m1, m2) = (d.m1, d.m2);
    (0..d.ncentres())
        .into_par_iter()
        .map(|c| {
            wide(
                #[inline(always)]
                || {
                    let (am, dm) = (c * 4 * m1..(c + 1) * 4 * m1, c * m1 * m2..(c + 1) * m1 * m2);
                    let mut ab = vec![T::zero(); 4 * m1];
                    let mut adb = vec![T::zero(); 4 * m1];
                    axis_backward(d, &dbar[dm.clone()], &a[am.clone()], &mut ab);
                    axis_backward(d, &ddotbar[dm.clone()], &adot[am.clone()], &mut ab);
                    axis_backward(d, &ddotbar[dm], &a[am], &mut adb);
                    (ab, adb)
                },
            )
        })
        .collect()
}

/// Ḡ = f Σ_k (R̂[k] Ā[k] + Ṙ[k] Ǡ[k]) and Ġ̄ = f Σ_k R̂[k] Ǡ[k] of slot `s` from its
/// centre's `(Ā, Ǡ)`, with f = 1/nnei: the per-slot half of [`dual`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn slot_seeds<T: Real>(
    m1: usize,
    f: T,
    s: usize,
    (ab, adb): &(Vec<T>, Vec<T>),
    rhat: &[T],
    rdot: &[T],
    gb: &mut [T],
    gdb: &mut [T],
) {
    let (r, rd) = (&rhat[4 * s..4 * s + 4], &rdot[4 * s..4 * s + 4]);
    let (a, ad) = (
        |k: usize| &ab[k * m1..(k + 1) * m1],
        |k: usize| &adb[k * m1..(k + 1) * m1],
    );
    combine(
        gb,
        [
            (f * r[0], a(0)),
            (f * rd[0], ad(0)),
            (f * r[1], a(1)),
            (f * rd[1], ad(1)),
            (f * r[2], a(2)),
            (f * rd[2], ad(2)),
            (f * r[3], a(3)),
            (f * rd[3], ad(3)),
        ],
        false,
    );
    combine(
        gdb,
        [
            (f * r[0], ad(0)),
            (f * r[1], ad(1)),
            (f * r[2], ad(2)),
            (f * r[3], ad(3)),
        ],
        false,
    );
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
    let m1 = d.m1;
    let per_centre = centre_adjoints(d, a, adot, dbar, ddotbar);
    let f = inv_nnei::<T>(d);
    for ti in 0..d.ntypes {
        for tj in d.sections() {
            let (blk, sel) = (d.block(ti, tj), d.sel[tj]);
            if sel == 0 {
                continue;
            }
            let span = blk.start * m1..blk.end * m1;
            gbar[span.clone()]
                .par_chunks_mut(sel * m1)
                .zip(gdotbar[span].par_chunks_mut(sel * m1))
                .enumerate()
                .for_each(|(i, (gb, gdb))| {
                    let c = d.centre_start[ti] + i;
                    wide(
                        #[inline(always)]
                        || {
                            for (j, (gb, gdb)) in
                                gb.chunks_mut(m1).zip(gdb.chunks_mut(m1)).enumerate()
                            {
                                let s = blk.start + i * sel + j;
                                slot_seeds(m1, f, s, &per_centre[c], rhat, rdot, gb, gdb);
                            }
                        },
                    )
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{axpy_nz, combine};
    use crate::backend::cpu::simd::wide;

    /// The same bits as the axpys term after term, zero coefficients (+0 and −0) and the
    /// chunk remainders included, from zero and accumulating.
    #[test]
    fn combine_is_axpys_in_order() {
        let val = |i: usize, s: f64| ((i as f64 * s).sin() * 1.7) + 0.01 * i as f64 % 0.3;
        for n in [1, 3, 4, 16, 25, 100, 101] {
            let xs: Vec<Vec<f64>> = (0..4)
                .map(|t| (0..n).map(|i| val(i + 7 * t, 0.31)).collect())
                .collect();
            let y0: Vec<f64> = (0..n).map(|i| val(i, 0.77)).collect();
            let coefs = [[0.3, -1.1, 0.0, 2.5], [-0.0, 0.0, 0.7, 1e-3]];
            for (a, accumulate) in coefs.iter().flat_map(|a| [(a, false), (a, true)]) {
                let mut want = if accumulate { y0.clone() } else { vec![0.0; n] };
                for (a, x) in a.iter().zip(&xs) {
                    axpy_nz(&mut want, *a, x);
                }
                let mut got = y0.clone();
                let terms = [0, 1, 2, 3].map(|t| (a[t], &xs[t][..]));
                wide(
                    #[inline(always)]
                    || combine(&mut got, terms, accumulate),
                );
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "n {n} a {a:?} accumulate {accumulate}"
                );
            }
        }
    }
}

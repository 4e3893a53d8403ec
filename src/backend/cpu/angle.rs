//! se_e3's pair values e_p = r̃_j·r̃_k, its descriptor D_c = Σ_p w_p e_p G_p and their
//! derivatives, over the pair rows of [`Dims::pairs`] (w_p = [`Dims::pair_weight`]).
//!
//! Per-pair outputs are split per (centre, pair type) run of rows, per-centre ones per centre;
//! the backward pass gathers each centre's r̃̄ in scratch before the per-slot Jacobian.

use rayon::prelude::*;

use super::contract::{dot, per_slot_at};
use super::simd::wide;
use crate::backend::{Dims, Pairs, Real};

/// One centre's rows of one pair type: `nj·nk` rows from `row`, j-major, pairing the slots
/// `sj..sj + nj` (section ti) with `sk..sk + nk` (section tj); `lj`, `lk` are those sections'
/// places among the centre's slots; `w` the pair type's weight.
#[derive(Clone, Copy)]
struct Run<T> {
    c: usize,
    row: usize,
    sj: usize,
    sk: usize,
    lj: usize,
    lk: usize,
    nj: usize,
    nk: usize,
    w: T,
}

impl<T: Real> Run<T> {
    fn new(d: &Dims, pairs: &Pairs, c: usize, p: usize) -> Self {
        let tc = d.centre_type(c);
        let (ti, tj) = pairs.types[p];
        let (nj, nk) = (d.sel[ti], d.sel[tj]);
        let section = |t: usize| d.sel[..t].iter().sum();
        Run {
            c,
            row: pairs.block(tc, p).start + (c - d.centre_start[tc]) * nj * nk,
            sj: d.slot(tc, c, ti, 0),
            sk: d.slot(tc, c, tj, 0),
            lj: section(ti),
            lk: section(tj),
            nj,
            nk,
            w: T::of(d.pair_weight((ti, tj))),
        }
    }

    /// (row, j, k) of every pair, j and k counted from the first slot of their sections.
    fn rows(self) -> impl Iterator<Item = (usize, usize, usize)> {
        (0..self.nj)
            .flat_map(move |j| (0..self.nk).map(move |k| (self.row + j * self.nk + k, j, k)))
    }
}

/// The runs of centre c, one per pair type with rows.
fn runs<'a, T: Real>(d: &'a Dims, pairs: &'a Pairs, c: usize) -> impl Iterator<Item = Run<T>> + 'a {
    (0..pairs.types.len())
        .map(move |p| Run::new(d, pairs, c, p))
        .filter(|r| r.nj * r.nk > 0)
}

/// Runs `f(run, out_rows)` over every run in parallel, where `out` has `width` values per pair
/// row and `out_rows` are the run's.
fn per_run<T: Real>(d: &Dims, out: &mut [T], width: usize, f: impl Fn(Run<T>, &mut [T]) + Sync) {
    let pairs = d.pairs();
    for tc in 0..d.ntypes {
        for (p, &(ti, tj)) in pairs.types.iter().enumerate() {
            let n = d.sel[ti] * d.sel[tj];
            if n == 0 {
                continue;
            }
            let blk = pairs.block(tc, p);
            let c0 = d.centre_start[tc];
            let pairs = &pairs;
            let f = &f;
            out[blk.start * width..blk.end * width]
                .par_chunks_mut(n * width)
                .enumerate()
                .for_each(|(i, rows)| {
                    wide(
                        #[inline(always)]
                        || f(Run::new(d, pairs, c0 + i, p), rows),
                    )
                });
        }
    }
}

/// Runs `f(c, out_c)` over every centre in parallel, `out` having `width` values per centre.
fn per_centre<T: Real>(out: &mut [T], width: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    out.par_chunks_mut(width).enumerate().for_each(|(c, oc)| {
        wide(
            #[inline(always)]
            || f(c, oc),
        )
    });
}

/// r̃_s = R̂_s[1..4].
#[inline(always)]
fn dir<T: Real>(x: &[T], s: usize) -> &[T] {
    &x[4 * s + 1..4 * s + 4]
}

#[inline(always)]
fn dot3<T: Real>(x: &[T], y: &[T]) -> T {
    x[0] * y[0] + x[1] * y[1] + x[2] * y[2]
}

pub fn values<T: Real>(d: &Dims, rhat: &[T], e: &mut [T]) {
    per_run(
        d,
        e,
        1,
        #[inline(always)]
        |r, out| {
            for (j, row) in out.chunks_mut(r.nk).enumerate() {
                let xj = dir(rhat, r.sj + j);
                for (k, o) in row.iter_mut().enumerate() {
                    *o = dot3(xj, dir(rhat, r.sk + k));
                }
            }
        },
    );
}

pub fn values_tangent<T: Real>(d: &Dims, rhat: &[T], rdot: &[T], edot: &mut [T]) {
    per_run(
        d,
        edot,
        1,
        #[inline(always)]
        |r, out| {
            for (j, row) in out.chunks_mut(r.nk).enumerate() {
                let (xj, vj) = (dir(rhat, r.sj + j), dir(rdot, r.sj + j));
                for (k, o) in row.iter_mut().enumerate() {
                    let (xk, vk) = (dir(rhat, r.sk + k), dir(rdot, r.sk + k));
                    *o = dot3(vj, xk) + dot3(xj, vk);
                }
            }
        },
    );
}

pub fn forward<T: Real>(d: &Dims, e: &[T], g: &[T], desc: &mut [T]) {
    let (m1, pairs) = (d.m1, d.pairs());
    per_centre(
        desc,
        m1,
        #[inline(always)]
        |c, oc| {
            oc.fill(T::zero());
            for r in runs::<T>(d, &pairs, c) {
                for (row, _, _) in r.rows() {
                    let a = r.w * e[row];
                    let gr = &g[row * m1..(row + 1) * m1];
                    oc.iter_mut().zip(gr).for_each(|(o, g)| *o += a * *g);
                }
            }
        },
    );
}

/// G + e G' of a pair row, the derivative of e G(e) along e, times `a`, added to `out`.
#[inline(always)]
fn slope_into<T: Real>(out: &mut [T], a: T, e: T, g: &[T], gp: &[T]) {
    for ((o, g), gp) in out.iter_mut().zip(g).zip(gp) {
        *o += a * (*g + e * *gp);
    }
}

pub fn tangent<T: Real>(d: &Dims, e: &[T], edot: &[T], g: &[T], gp: &[T], ddot: &mut [T]) {
    let (m1, pairs) = (d.m1, d.pairs());
    per_centre(
        ddot,
        m1,
        #[inline(always)]
        |c, oc| {
            oc.fill(T::zero());
            for r in runs::<T>(d, &pairs, c) {
                for (row, _, _) in r.rows() {
                    let rows = row * m1..(row + 1) * m1;
                    slope_into(oc, r.w * edot[row], e[row], &g[rows.clone()], &gp[rows]);
                }
            }
        },
    );
}

#[allow(clippy::too_many_arguments)]
pub fn backward<T: Real>(
    d: &Dims,
    rhat: &[T],
    jac: &[T],
    e: &[T],
    g: &[T],
    gp: &[T],
    dbar: &[T],
    q: &mut [T],
) {
    let (m1, nnei, pairs) = (d.m1, d.nnei, d.pairs());
    // r̃̄ of every slot, per centre: ē_jk = w D̄·(G + e G') flows to r̃_j along r̃_k and back.
    let mut xbar = vec![T::zero(); 3 * nnei * d.ncentres()];
    per_centre(
        &mut xbar,
        3 * nnei,
        #[inline(always)]
        |c, xb| {
            xb.fill(T::zero());
            let dc = &dbar[c * m1..(c + 1) * m1];
            for r in runs::<T>(d, &pairs, c) {
                for (row, j, k) in r.rows() {
                    let rows = row * m1..(row + 1) * m1;
                    let ebar = r.w * (dot(dc, &g[rows.clone()]) + e[row] * dot(dc, &gp[rows]));
                    let (xj, xk) = (dir(rhat, r.sj + j), dir(rhat, r.sk + k));
                    for x in 0..3 {
                        xb[3 * (r.lj + j) + x] += ebar * xk[x];
                        xb[3 * (r.lk + k) + x] += ebar * xj[x];
                    }
                }
            }
        },
    );
    // q = Jᵀ R̄ with R̄ = (0, r̃̄): rows 1..3 of the Jacobian.
    per_slot_at(
        d,
        q,
        3,
        #[inline(always)]
        |c, s, at, qs| {
            let xb = &xbar[3 * (c * nnei + at)..3 * (c * nnei + at + 1)];
            for (x, q) in qs.iter_mut().enumerate() {
                *q = (0..3).fold(T::zero(), |acc, a| {
                    acc + jac[12 * s + 3 * (a + 1) + x] * xb[a]
                });
            }
        },
    );
}

/// Ḡ = w (e D̄ + ė Ḋ̄) and Ġ̄ = w e Ḋ̄ per pair row (Ḋ = Σ w (ė G + e Ġ), Ġ = G' ė).
pub fn dual<T: Real>(
    d: &Dims,
    e: &[T],
    edot: &[T],
    dbar: &[T],
    ddotbar: &[T],
    gbar: &mut [T],
    gdotbar: &mut [T],
) {
    let m1 = d.m1;
    per_run(
        d,
        gbar,
        m1,
        #[inline(always)]
        |r, out| {
            let (dc, ddc) = (
                &dbar[r.c * m1..(r.c + 1) * m1],
                &ddotbar[r.c * m1..(r.c + 1) * m1],
            );
            for ((row, _, _), o) in r.rows().zip(out.chunks_mut(m1)) {
                let (a, b) = (r.w * e[row], r.w * edot[row]);
                for ((o, x), y) in o.iter_mut().zip(dc).zip(ddc) {
                    *o = a * *x + b * *y;
                }
            }
        },
    );
    per_run(
        d,
        gdotbar,
        m1,
        #[inline(always)]
        |r, out| {
            let ddc = &ddotbar[r.c * m1..(r.c + 1) * m1];
            for ((row, _, _), o) in r.rows().zip(out.chunks_mut(m1)) {
                let a = r.w * e[row];
                o.iter_mut().zip(ddc).for_each(|(o, y)| *o = a * *y);
            }
        },
    );
}

//! Dense layers over row ranges: forward, input backward, tangent, dual backward.
//!
//! Each op is one whole-range GEMM ([`par_gemm`], one task per thread) plus elementwise passes
//! over fixed chunks of rows on the rayon pool. Row sums (b̄, īdt) are per-chunk partials added
//! in chunk order, and each GEMM element's sum runs the same way whatever the split, so no
//! result depends on the thread count.

use std::ops::Range;

use rayon::prelude::*;

use super::act::of_kept;
use super::gemm::{par_gemm, Kernel, Mat, MatMut};
use super::simd::wide;
use super::tanh::tanh_bias;
use crate::backend::Real;
use crate::model::{Activation, Layer, Skip};

/// Rows per elementwise task and per reduction partial.
const CHUNK: usize = 512;

fn weights<'a, T>(l: &Layer, p: &'a [T]) -> (&'a [T], &'a [T], Option<&'a [T]>) {
    (
        &p[l.w..l.w + l.nin * l.nout],
        &p[l.b..l.b + l.nout],
        l.idt.map(|o| &p[o..o + l.nout]),
    )
}

/// `c = x·W` over n rows, on matrixmultiply: at one thread its packed kernel ran x·W 4–8% faster
/// than the unpacked one (water, per-op profile), though every thread packs all of W.
fn matmul_w<T: Real>(l: &Layer, w: &[T], n: usize, x: &[T], c: &mut [T]) {
    let x = Mat {
        v: x,
        rs: l.nin,
        cs: 1,
    };
    let c = MatMut {
        v: c,
        rs: l.nout,
        cs: 1,
    };
    par_gemm(Kernel::Packed, n, l.nin, l.nout, x, w, l.nout, false, c);
}

/// `c = z·Wᵀ` over n rows, made as cᵀ = W·zᵀ: W's rows are read in place, and only z (n rows
/// of nout) is transposed, not W (nin × nout, 1600 × 240 in the water fitting net).
fn matmul_wt<T: Real>(l: &Layer, w: &[T], n: usize, z: &[T], c: &mut [T]) {
    let mut zt = vec![T::zero(); l.nout * n];
    for (i, zr) in z[..n * l.nout].chunks(l.nout).enumerate() {
        for (p, v) in zr.iter().enumerate() {
            zt[p * n + i] = *v;
        }
    }
    let w = Mat {
        v: w,
        rs: l.nout,
        cs: 1,
    };
    let c = MatMut {
        v: c,
        rs: 1,
        cs: l.nin,
    };
    par_gemm(Kernel::InPlace, l.nin, l.nout, n, w, &zt, n, false, c);
}

/// `gw += xᵀ·z` summed over n rows.
fn matmul_grad<T: Real>(l: &Layer, n: usize, x: &[T], z: &[T], gw: &mut [T]) {
    let xt = Mat {
        v: x,
        rs: 1,
        cs: l.nin,
    };
    let gw = MatMut {
        v: gw,
        rs: l.nout,
        cs: 1,
    };
    par_gemm(Kernel::Packed, l.nin, n, l.nout, xt, z, l.nout, true, gw);
}

/// φ' from what the layer keeps of an output.
#[inline(always)]
fn dphi<T: Real>(l: &Layer, kept: T) -> T {
    of_kept(l.act, kept).1
}

/// `y += skip(x)` for one row.
#[inline(always)]
pub(super) fn add_skip<T: Real>(l: &Layer, x: &[T], y: &mut [T]) {
    match l.skip {
        Skip::None => {}
        Skip::Identity => y.iter_mut().zip(x).for_each(|(y, x)| *y += *x),
        Skip::Double => {
            let (a, b) = y.split_at_mut(l.nin);
            a.iter_mut().zip(x).for_each(|(y, x)| *y += *x);
            b.iter_mut().zip(x).for_each(|(y, x)| *y += *x);
        }
    }
}

/// `xbar += skipᵀ(ybar)` for one row.
#[inline(always)]
pub(super) fn add_skip_t<T: Real>(l: &Layer, ybar: &[T], xbar: &mut [T]) {
    match l.skip {
        Skip::None => {}
        Skip::Identity => xbar.iter_mut().zip(ybar).for_each(|(x, y)| *x += *y),
        Skip::Double => {
            let (a, b) = ybar.split_at(l.nin);
            xbar.iter_mut()
                .zip(a.iter().zip(b))
                .for_each(|(x, (y0, y1))| *x += *y0 + *y1);
        }
    }
}

/// `y = h·idt + skip(x)` row by row, in parallel chunks.
fn finish_rows<T: Real>(l: &Layer, idt: Option<&[T]>, h: &[T], x: &[T], y: &mut [T]) {
    y.par_chunks_mut(CHUNK * l.nout)
        .zip(
            h.par_chunks(CHUNK * l.nout)
                .zip(x.par_chunks(CHUNK * l.nin)),
        )
        .for_each(|(y, (h, x))| {
            wide(
                #[inline(always)]
                || {
                    for (yr, (hr, xr)) in y
                        .chunks_mut(l.nout)
                        .zip(h.chunks(l.nout).zip(x.chunks(l.nin)))
                    {
                        match idt {
                            Some(t) => yr
                                .iter_mut()
                                .zip(hr.iter().zip(t))
                                .for_each(|(y, (h, t))| *y = *h * *t),
                            None => yr.copy_from_slice(hr),
                        }
                        add_skip(l, xr, yr);
                    }
                },
            )
        });
}

pub fn forward<T: Real>(l: &Layer, p: &[T], rows: Range<usize>, x: &[T], h: &mut [T], y: &mut [T]) {
    let (w, b, idt) = weights(l, p);
    let (xr, hr) = (
        &x[rows.start * l.nin..rows.end * l.nin],
        &mut h[rows.start * l.nout..rows.end * l.nout],
    );
    matmul_w(l, w, rows.len(), xr, hr);
    hr.par_chunks_mut(CHUNK * l.nout).for_each(|c| {
        wide(
            #[inline(always)]
            || {
                if l.act.is_tanh() {
                    tanh_bias(c, b);
                } else {
                    c.chunks_mut(l.nout)
                        .for_each(|r| r.iter_mut().zip(b).for_each(|(v, b)| *v += *b));
                }
            },
        )
    });
    let yr = &mut y[rows.start * l.nout..rows.end * l.nout];
    if l.act.keeps_output() {
        finish_rows(l, idt, hr, xr, yr);
    } else {
        // hr keeps z; y takes φ(z).
        let mut phi = hr.to_vec();
        phi.par_iter_mut().for_each(|v| *v = of_kept(l.act, *v).0);
        finish_rows(l, idt, &phi, xr, yr);
    }
}

pub fn backward<T: Real>(
    l: &Layer,
    p: &[T],
    rows: Range<usize>,
    h: &[T],
    ybar: &[T],
    xbar: &mut [T],
) {
    let (w, _, idt) = weights(l, p);
    let span = rows.start * l.nout..rows.end * l.nout;
    let mut zbar = vec![T::zero(); span.len()];
    zbar.par_chunks_mut(CHUNK * l.nout)
        .zip(
            h[span.clone()]
                .par_chunks(CHUNK * l.nout)
                .zip(ybar[span.clone()].par_chunks(CHUNK * l.nout)),
        )
        .for_each(|(z, (h, yb))| {
            wide(
                #[inline(always)]
                || {
                    for (zr, (hr, yr)) in z
                        .chunks_mut(l.nout)
                        .zip(h.chunks(l.nout).zip(yb.chunks(l.nout)))
                    {
                        for k in 0..l.nout {
                            zr[k] = dphi(l, hr[k]) * idt.map_or(yr[k], |t| yr[k] * t[k]);
                        }
                    }
                },
            )
        });
    let xr = &mut xbar[rows.start * l.nin..rows.end * l.nin];
    matmul_wt(l, w, rows.len(), &zbar, xr);
    for (x, y) in xr.chunks_mut(l.nin).zip(ybar[span].chunks(l.nout)) {
        add_skip_t(l, y, x);
    }
}

#[allow(clippy::too_many_arguments)]
pub fn tangent<T: Real>(
    l: &Layer,
    p: &[T],
    rows: Range<usize>,
    h: &[T],
    xdot: &[T],
    zdot: &mut [T],
    ydot: &mut [T],
) {
    let (w, _, idt) = weights(l, p);
    let span = rows.start * l.nout..rows.end * l.nout;
    let xr = &xdot[rows.start * l.nin..rows.end * l.nin];
    let zr = &mut zdot[span.clone()];
    matmul_w(l, w, rows.len(), xr, zr);
    // ḣ = φ'(z)·ż, then ẏ = ḣ·idt + skip(ẋ) exactly as the value pass.
    let mut hdot = vec![T::zero(); span.len()];
    hdot.par_chunks_mut(CHUNK * l.nout)
        .zip(
            zr.par_chunks(CHUNK * l.nout)
                .zip(h[span.clone()].par_chunks(CHUNK * l.nout)),
        )
        .for_each(|(hd, (z, h))| {
            wide(
                #[inline(always)]
                || {
                    for ((hd, z), h) in hd.iter_mut().zip(z).zip(h) {
                        *hd = dphi(l, *h) * *z;
                    }
                },
            )
        });
    finish_rows(l, idt, &hdot, xr, &mut ydot[span]);
}

/// The dual step of one row through φ and the timestep (docs/design.md §3.2, "dual reverse"): from the
/// adjoints `yb` = ȳ, `ydb` = ẏ̄ of the layer's output, what it keeps `h` (tanh(z), else z) and
/// tangent ż = `zd`·`zd_scale`, writes z̄ and ż̄ and adds the row's b̄ into `gb` and, with a
/// timestep, its īdt into `gidt`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dual_row<T: Real>(
    act: Activation,
    idt: Option<&[T]>,
    h: &[T],
    zd: &[T],
    zd_scale: T,
    yb: &[T],
    ydb: &[T],
    zb: &mut [T],
    zdb: &mut [T],
    gb: &mut [T],
    gidt: Option<&mut [T]>,
) {
    let n = h.len();
    let (zd, yb, ydb, zb, zdb, gb) = (
        &zd[..n],
        &yb[..n],
        &ydb[..n],
        &mut zb[..n],
        &mut zdb[..n],
        &mut gb[..n],
    );
    match idt {
        Some(t) => {
            let gi = gidt.expect("a layer with a timestep accumulates its gradient");
            let (t, gi) = (&t[..n], &mut gi[..n]);
            for k in 0..n {
                let zdv = zd[k] * zd_scale;
                let (hv, d1, d2) = of_kept(act, h[k]);
                gi[k] += yb[k] * hv + ydb[k] * d1 * zdv;
                let (hb, hdb) = (yb[k] * t[k], ydb[k] * t[k]);
                zdb[k] = d1 * hdb;
                zb[k] = d1 * hb + d2 * zdv * hdb;
                gb[k] += zb[k];
            }
        }
        None => {
            for k in 0..n {
                let zdv = zd[k] * zd_scale;
                let (_, d1, d2) = of_kept(act, h[k]);
                let (hb, hdb) = (yb[k], ydb[k]);
                zdb[k] = d1 * hdb;
                zb[k] = d1 * hb + d2 * zdv * hdb;
                gb[k] += zb[k];
            }
        }
    }
}

/// Per-chunk sums of b̄ and īdt.
struct Partial<T> {
    b: Vec<T>,
    idt: Vec<T>,
}

#[allow(clippy::too_many_arguments)]
pub fn dual_backward<T: Real>(
    l: &Layer,
    p: &[T],
    rows: Range<usize>,
    x: &[T],
    h: &[T],
    xdot: &[T],
    zdot: &[T],
    scale: Option<&[T]>,
    ybar: &[T],
    ydotbar: &[T],
    grad: &mut [T],
    xbar: Option<(&mut [T], &mut [T])>,
) {
    let (w, _, idt) = weights(l, p);
    let (nin, nout, n) = (l.nin, l.nout, rows.len());
    let span = rows.start * nout..rows.end * nout;
    let xr = &x[rows.start * nin..rows.end * nin];
    let xd_stored = &xdot[rows.start * nin..rows.end * nin];
    let scale = scale.map(|s| &s[rows.clone()]);
    // The embedding net stores tangents for a unit input tangent: scale them by ṡ per row.
    let xd_scaled: Option<Vec<T>> = scale.map(|s| {
        let mut v = xd_stored.to_vec();
        v.par_chunks_mut(CHUNK * nin)
            .zip(s.par_chunks(CHUNK))
            .for_each(|(v, s)| {
                v.chunks_mut(nin)
                    .zip(s)
                    .for_each(|(r, s)| r.iter_mut().for_each(|x| *x *= *s))
            });
        v
    });
    let xd = xd_scaled.as_deref().unwrap_or(xd_stored);
    let mut zbar = vec![T::zero(); n * nout];
    let mut zdbar = vec![T::zero(); n * nout];
    let c = CHUNK * nout;
    let partials: Vec<Partial<T>> = zbar
        .par_chunks_mut(c)
        .zip(zdbar.par_chunks_mut(c))
        .enumerate()
        .map(|(ci, (zb, zdb))| {
            wide(
                #[inline(always)]
                || {
                    let o = span.start + ci * c;
                    let (hh, zd, yb, ydb) = (
                        &h[o..o + zb.len()],
                        &zdot[o..o + zb.len()],
                        &ybar[o..o + zb.len()],
                        &ydotbar[o..o + zb.len()],
                    );
                    let mut part = Partial {
                        b: vec![T::zero(); nout],
                        idt: vec![T::zero(); if idt.is_some() { nout } else { 0 }],
                    };
                    for (r, (zbr, zdbr)) in
                        zb.chunks_mut(nout).zip(zdb.chunks_mut(nout)).enumerate()
                    {
                        let s = scale.map_or(T::one(), |s| s[ci * CHUNK + r]);
                        let q = r * nout..(r + 1) * nout;
                        dual_row(
                            l.act,
                            idt,
                            &hh[q.clone()],
                            &zd[q.clone()],
                            s,
                            &yb[q.clone()],
                            &ydb[q],
                            zbr,
                            zdbr,
                            &mut part.b,
                            idt.is_some().then_some(part.idt.as_mut_slice()),
                        );
                    }
                    part
                },
            )
        })
        .collect();
    {
        let gw = &mut grad[l.w..l.w + nin * nout];
        matmul_grad(l, n, xr, &zbar, gw);
        matmul_grad(l, n, xd, &zdbar, gw);
    }
    for part in &partials {
        add(&mut grad[l.b..l.b + nout], &part.b);
        if let Some(o) = l.idt {
            add(&mut grad[o..o + nout], &part.idt);
        }
    }
    if let Some((xb, xdb)) = xbar {
        let (xb, xdb) = (
            &mut xb[rows.start * nin..rows.end * nin],
            &mut xdb[rows.start * nin..rows.end * nin],
        );
        matmul_wt(l, w, n, &zbar, xb);
        matmul_wt(l, w, n, &zdbar, xdb);
        for (r, (xrow, xdrow)) in xb.chunks_mut(nin).zip(xdb.chunks_mut(nin)).enumerate() {
            let o = span.start + r * nout;
            add_skip_t(l, &ybar[o..o + nout], xrow);
            add_skip_t(l, &ydotbar[o..o + nout], xdrow);
        }
    }
}

fn add<T: Real>(acc: &mut [T], x: &[T]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += *b);
}

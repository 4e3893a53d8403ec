//! The embedding nets fused per group of centres: the layers run on a few hundred rows that stay
//! in cache, and only G and G' go to the step's buffers. Padded slots all have the same input
//! s = −davg₀/dstd₀ and ṡ = 0, so each block evaluates them once.
//!
//! Each group's value and s-derivative rows are stacked, `[x; x']` (2n rows), so one GEMM per
//! layer serves both, and likewise `[z̄; ż̄]` in the dual reverse.
//!
//! The forward pass keeps every layer's tanh values h and z' = x'W of the real slots (its
//! "traces"; the first layer's z' is W: 325 values per real slot for the water model, 45 MB
//! in float64) so that the
//! dual reverse recomputes no tanh and no GEMM of the forward; the layer inputs follow from
//! them elementwise. The traces live in a cache of the calling thread, tagged with the s,
//! owner and parameters they were made from: the dual reverse uses them only when those are
//! unchanged, and otherwise recomputes them, so the ops stay correct whatever is called
//! in between.

use std::any::Any;
use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::contract;
use super::dense::{add_skip, add_skip_t, dual_row};
use super::gemm::{small_gemm, Mat};
use super::simd::{fma, rows_apart, wide};
use super::tanh::{tanh_bias, tanh_row};
use super::tile::{self, row_tiles, Epilogue};
use crate::backend::{Dims, Real};
use crate::model::{Activation, Layer, Net, Skip};

/// Centres per task: enough rows for efficient small GEMMs, few enough to stay in cache.
const CENTRES_PER_TASK: usize = 2;

/// The forward values of one group of n rows: per layer `[2n][nout]`, rows `0..n` the tanh
/// values h, rows `n..2n` z' = x'W; the first layer keeps only h, its z' being W itself (the
/// input's tangent x' is 1), so the traces hold 325 values per real slot instead of 350.
#[derive(Default)]
struct Trace<T> {
    n: usize,
    hz: Vec<Vec<T>>,
}

/// Per-worker buffers, reused from task to task.
#[derive(Default)]
struct Scratch<T> {
    /// Stacked layer inputs `[x; x']` of every layer (the dual reverse needs them all).
    xs: Vec<Vec<T>>,
    /// Stacked output `[y; y']` of the last layer.
    out: Vec<T>,
    /// Stacked adjoints `[z̄; ż̄]`, `[ȳ; ẏ̄]` and `[x̄; ẋ̄]`.
    zb: Vec<T>,
    yb: Vec<T>,
    xb: Vec<T>,
    /// The layer below's `[z̄; ż̄]` while the fused reverse makes it.
    zb_below: Vec<T>,
    /// Input and input tangent of the gathered real slots.
    s: Vec<T>,
    sdot: Vec<T>,
}

/// Makes `v` n long for a caller that overwrites every element: old values stay, only growth
/// is zeroed, and capacity grows to n exactly (the traces are kept from step to step, and their
/// row counts vary a little with the frame).
fn resize<T: Real>(v: &mut Vec<T>, n: usize) {
    if v.len() > n {
        v.truncate(n);
    } else {
        v.reserve_exact(n - v.len());
        v.resize(n, T::zero());
    }
}

/// Row r of z' = x'W from layer li's trace `hz` (n rows of h first); the first layer's is W.
#[inline(always)]
fn zp_row<'a, T>(li: usize, l: &Layer, p: &'a [T], n: usize, hz: &'a [T], r: usize) -> &'a [T] {
    let no = l.nout;
    if li == 0 {
        &p[l.w..l.w + no]
    } else {
        &hz[(n + r) * no..(n + r + 1) * no]
    }
}

/// `y = h·idt + skip(x)` and `y' = φ'(z)·z'·idt + skip(x')` on the stacked rows of layer li.
#[inline(always)]
fn finish<T: Real>(li: usize, l: &Layer, p: &[T], n: usize, hz: &[T], x: &[T], y: &mut [T]) {
    let (ni, no) = (l.nin, l.nout);
    let idt = l.idt.map(|o| &p[o..o + no]);
    let (yv, yp) = y.split_at_mut(n * no);
    let (xv, xp) = x.split_at(n * ni);
    for r in 0..n {
        let (o, oi) = (r * no, r * ni);
        let (hr, zr) = (&hz[o..o + no], zp_row(li, l, p, n, hz, r));
        let (yr, ypr) = (&mut yv[o..o + no], &mut yp[o..o + no]);
        match idt {
            Some(t) => {
                for k in 0..no {
                    yr[k] = hr[k] * t[k];
                    ypr[k] = (T::one() - hr[k] * hr[k]) * zr[k] * t[k];
                }
            }
            None => {
                for k in 0..no {
                    yr[k] = hr[k];
                    ypr[k] = (T::one() - hr[k] * hr[k]) * zr[k];
                }
            }
        }
        add_skip(l, &xv[oi..oi + ni], yr);
        add_skip(l, &xp[oi..oi + ni], ypr);
    }
}

/// A GEMM layer's forward epilogue: the tiles of z = `[x; x']`W come with value rows first and
/// the matching tangent rows (n + r) after; it keeps h = tanh(z + b) and z' in the trace and
/// writes y and y' as [`finish`] does, element for element.
struct Forward<'a, T> {
    l: &'a Layer,
    b: &'a [T],
    idt: Option<&'a [T]>,
    x: &'a [T],
    hz: &'a mut [T],
    y: &'a mut [T],
}

impl<T: Real> Epilogue<T> for Forward<'_, T> {
    // Its tanh on one-vector rows (32 + 16 + 1 + 1 for a row of 50 in f32) took more time
    // than on the two half-vector tiles (32 + 8 + 8 + 1 + 1) it replaces.
    const HALF: bool = false;
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    fn tile<const N: usize, const W: usize>(
        &mut self,
        rows: [usize; N],
        j0: usize,
        acc: &[[T; W]; N],
    ) {
        let (ni, no) = (self.l.nin, self.l.nout);
        let half = N / 2;
        let b = &self.b[j0..j0 + W];
        // The tanh of the value rows (a pair tile has at most R / 2).
        let mut hs = [[T::zero(); W]; tile::R / 2];
        for (h, acc) in hs.iter_mut().zip(acc).take(half) {
            rows_apart();
            // A plain loop: `array::from_fn`'s closure is not inlined into the wide versions.
            for q in 0..W {
                h[q] = acc[q] + b[q];
            }
            tanh_row(h);
        }
        for i in 0..half {
            let (r, rt, zp, h) = (rows[i], rows[half + i], &acc[half + i], hs[i]);
            self.hz[r * no + j0..r * no + j0 + W].copy_from_slice(&h);
            self.hz[rt * no + j0..rt * no + j0 + W].copy_from_slice(zp);
            let (mut y, mut yp) = ([T::zero(); W], [T::zero(); W]);
            match self.idt {
                Some(t) => {
                    let t = &t[j0..j0 + W];
                    for q in 0..W {
                        y[q] = h[q] * t[q];
                        yp[q] = (T::one() - h[q] * h[q]) * zp[q] * t[q];
                    }
                }
                None => {
                    for q in 0..W {
                        y[q] = h[q];
                        yp[q] = (T::one() - h[q] * h[q]) * zp[q];
                    }
                }
            }
            let (x, xp) = (
                &self.x[r * ni..(r + 1) * ni],
                &self.x[rt * ni..(rt + 1) * ni],
            );
            // skip(x)'s columns j0.. are x's from `from` on, contiguous unless the tile
            // straddles the two copies of a doubling skip.
            let from = match self.l.skip {
                Skip::None => None,
                Skip::Identity => Some(j0),
                Skip::Double => Some(if j0 >= ni { j0 - ni } else { j0 }),
            };
            match from {
                None => {}
                Some(f) if f + W <= ni => {
                    let (x, xp) = (&x[f..f + W], &xp[f..f + W]);
                    for q in 0..W {
                        y[q] += x[q];
                        yp[q] += xp[q];
                    }
                }
                Some(f) => {
                    for q in 0..W {
                        let s = if f + q >= ni { f + q - ni } else { f + q };
                        y[q] += x[s];
                        yp[q] += xp[s];
                    }
                }
            }
            self.y[r * no + j0..r * no + j0 + W].copy_from_slice(&y);
            self.y[rt * no + j0..rt * no + j0 + W].copy_from_slice(&yp);
        }
    }
}

/// Runs the net forward on the n inputs `scr.s`, filling `tr` and leaving every layer's
/// stacked input in `scr.xs` and the stacked output (G; G') in `scr.out`.
#[inline(always)]
fn run<T: Real>(net: &Net, p: &[T], tr: &mut Trace<T>, scr: &mut Scratch<T>) {
    let n = scr.s.len();
    let nl = net.layers.len();
    tr.n = n;
    tr.hz.resize_with(nl, Vec::new);
    scr.xs.resize_with(nl, Vec::new);
    {
        let x0 = &mut scr.xs[0];
        x0.clear();
        x0.extend_from_slice(&scr.s);
        x0.resize(2 * n, T::one());
    }
    for (li, l) in net.layers.iter().enumerate() {
        let (ni, no) = (l.nin, l.nout);
        let hz = &mut tr.hz[li];
        resize(hz, if li == 0 { n * no } else { 2 * n * no });
        let (head, tail) = scr.xs.split_at_mut(li + 1);
        let y = if li + 1 < nl {
            &mut tail[0]
        } else {
            &mut scr.out
        };
        resize(y, 2 * n * no);
        let (x, w) = (&head[li], &p[l.w..l.w + ni * no]);
        if li > 0 && fma() && ni <= tile::KC {
            // The fused layer: z's tiles go through tanh and into y while in registers.
            let mut e = Forward {
                l,
                b: &p[l.b..l.b + no],
                idt: l.idt.map(|o| &p[o..o + no]),
                x,
                hz,
                y,
            };
            pair_tiles(
                n,
                Mat {
                    v: x,
                    rs: ni,
                    cs: 1,
                },
                w,
                no,
                0..ni,
                &mut e,
            );
            continue;
        }
        if li == 0 {
            // The first layer (one input): an outer product, each value the one rounded
            // product the GEMM would give, without its packing and tiling for k = 1; its
            // tangent half, 1·W, is not kept.
            for (hr, &xv) in hz.chunks_exact_mut(no).zip(&x[..n]) {
                hr.iter_mut().zip(w).for_each(|(h, &wv)| *h = xv * wv);
            }
        } else {
            let x = Mat {
                v: x,
                rs: ni,
                cs: 1,
            };
            small_gemm(2 * n, ni, no, x, w, no, false, hz);
        }
        tanh_bias(&mut hz[..n * no], &p[l.b..l.b + no]);
        finish(li, l, p, n, hz, x, y);
    }
}

/// The layer inputs `scr.xs` of a traced group, from its traces alone (elementwise).
#[inline(always)]
fn inputs<T: Real>(net: &Net, p: &[T], tr: &Trace<T>, scr: &mut Scratch<T>) {
    let n = tr.n;
    let nl = net.layers.len();
    scr.xs.resize_with(nl, Vec::new);
    {
        let x0 = &mut scr.xs[0];
        x0.clear();
        x0.extend_from_slice(&scr.s);
        x0.resize(2 * n, T::one());
    }
    for (li, l) in net.layers.iter().enumerate().take(nl - 1) {
        let (head, tail) = scr.xs.split_at_mut(li + 1);
        resize(&mut tail[0], 2 * n * l.nout);
        finish(li, l, p, n, &tr.hz[li], &head[li], &mut tail[0]);
    }
}

/// A layer's b̄ and, with a timestep, īdt: slices of `g` (the net's span from `base`).
fn bias_grads<'a, T>(l: &Layer, g: &'a mut [T], base: usize) -> (&'a mut [T], Option<&'a mut [T]>) {
    let no = l.nout;
    match l.idt {
        // b and idt of a layer are separate tensors; borrow both.
        Some(oi) => {
            let (lo, hi) = (l.b.min(oi) - base, l.b.max(oi) - base);
            let (a, b) = g.split_at_mut(hi);
            let (first, second) = (&mut a[lo..lo + no], &mut b[..no]);
            if l.b < oi {
                (first, Some(second))
            } else {
                (second, Some(first))
            }
        }
        None => (&mut g[l.b - base..l.b - base + no], None),
    }
}

/// The dual rows of layer li: `scr.zb` = `[z̄; ż̄]` (rows [`tile::padded`] long) from
/// `scr.yb` = `[ȳ; ẏ̄]`, b̄ and īdt added.
#[inline(always)]
fn dual_rows<T: Real>(
    li: usize,
    l: &Layer,
    p: &[T],
    tr: &Trace<T>,
    scr: &mut Scratch<T>,
    g: &mut [T],
    base: usize,
) {
    let (n, no, zs) = (tr.n, l.nout, tile::padded::<T>(l.nout));
    let idt = l.idt.map(|o| &p[o..o + no]);
    let hz = &tr.hz[li];
    resize(&mut scr.zb, 2 * n * zs);
    let (zb, zdb) = scr.zb.split_at_mut(n * zs);
    let (yb, ydb) = scr.yb.split_at(n * no);
    let (gb, mut gi) = bias_grads(l, g, base);
    for (r, &sd) in scr.sdot.iter().enumerate() {
        let (q, qz) = (r * no..(r + 1) * no, r * zs..r * zs + no);
        dual_row(
            Activation::Tanh,
            idt,
            &hz[q.clone()],
            zp_row(li, l, p, n, hz, r),
            sd,
            &yb[q.clone()],
            &ydb[q],
            &mut zb[qz.clone()],
            &mut zdb[qz],
            gb,
            gi.as_deref_mut(),
        );
    }
}

/// The epilogue of x̄ = z̄ Wᵀ through layer `l`, fused with the dual rows of the layer below
/// (`below`, index li − 1): the tiles come with value rows first and the matching tangent rows
/// (n + r) after. It adds skipᵀ(ȳ) as [`add_skip_t`] does, keeps the result (the layer
/// below's `[ȳ; ẏ̄]`) in `xb` and makes that layer's `[z̄; ż̄]` in `zb` (rows `zs` long) as
/// [`dual_rows`] does, element for element and summing b̄ and īdt in the same order of rows.
struct Reverse<'a, T> {
    zs: usize,
    l: &'a Layer,
    below: &'a Layer,
    li: usize,
    p: &'a [T],
    n: usize,
    yb: &'a [T],
    hz: &'a [T],
    sdot: &'a [T],
    xb: &'a mut [T],
    zb: &'a mut [T],
    gb: &'a mut [T],
    gi: Option<&'a mut [T]>,
}

impl<T: Real> Epilogue<T> for Reverse<'_, T> {
    #[inline(always)]
    fn tile<const N: usize, const W: usize>(
        &mut self,
        rows: [usize; N],
        j0: usize,
        acc: &[[T; W]; N],
    ) {
        // Only the last tile reaches into Wᵀ's zero columns past nin; for the others, W stays
        // a constant in `columns`' loops.
        let ni = self.l.nin;
        if j0 + W <= ni {
            self.columns(rows, j0, W, acc);
        } else {
            self.columns(rows, j0, ni - j0, acc);
        }
    }
}

impl<T: Real> Reverse<'_, T> {
    /// The epilogue of the tile's first w columns.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    fn columns<const N: usize, const W: usize>(
        &mut self,
        rows: [usize; N],
        j0: usize,
        w: usize,
        acc: &[[T; W]; N],
    ) {
        let (ni, no) = (self.l.nin, self.l.nout);
        let cols = j0..j0 + w;
        let idt = self.below.idt.map(|o| &self.p[o + j0..o + j0 + w]);
        let half = N / 2;
        for i in 0..half {
            let (r, rt) = (rows[i], rows[half + i]);
            let (mut v, mut vt) = (acc[i], acc[half + i]);
            for (v, row) in [(&mut v, r), (&mut vt, rt)] {
                let y = &self.yb[row * no..(row + 1) * no];
                // Plain loops: a `for_each` closure here was left out of line, as baseline code.
                match self.l.skip {
                    Skip::None => {}
                    Skip::Identity => {
                        for q in 0..w {
                            v[q] += y[j0 + q];
                        }
                    }
                    Skip::Double => {
                        for q in 0..w {
                            v[q] += y[j0 + q] + y[ni + j0 + q];
                        }
                    }
                }
            }
            let (v, vt) = (&v[..w], &vt[..w]);
            self.xb[r * ni + j0..r * ni + j0 + w].copy_from_slice(v);
            self.xb[rt * ni + j0..rt * ni + j0 + w].copy_from_slice(vt);
            let zs = self.zs;
            let (lo, hi) = self.zb.split_at_mut(rt * zs);
            dual_row(
                Activation::Tanh,
                idt,
                &self.hz[r * ni + j0..r * ni + j0 + w],
                &zp_row(self.li - 1, self.below, self.p, self.n, self.hz, r)[cols.clone()],
                self.sdot[r],
                v,
                vt,
                &mut lo[r * zs + j0..r * zs + j0 + w],
                &mut hi[j0..j0 + w],
                &mut self.gb[cols.clone()],
                self.gi.as_deref_mut().map(|g| &mut g[cols.clone()]),
            );
        }
    }
}

/// The dual reverse through a traced group with input tangents `scr.sdot` and stacked seeds
/// `scr.yb` = `[Ḡ; Ġ̄]`; adds W̄, b̄, īdt into `g`, laid out like the parameter vector over
/// this net's span starting at `base`. Needs `scr.xs` from [`run`] or [`inputs`], and every
/// layer's Wᵀ in `wt`.
#[inline(always)]
fn dual<T: Real>(
    net: &Net,
    p: &[T],
    wt: &[Vec<T>],
    tr: &Trace<T>,
    scr: &mut Scratch<T>,
    g: &mut [T],
    base: usize,
) {
    let n = tr.n;
    let top = net.layers.len() - 1;
    dual_rows(top, &net.layers[top], p, tr, scr, g, base);
    for (li, l) in net.layers.iter().enumerate().rev() {
        let (ni, no) = (l.nin, l.nout);
        // The rows of `[z̄; ż̄]` and of Wᵀ are padded for the tiles.
        let (zs, zs_below) = (tile::padded::<T>(no), tile::padded::<T>(ni));
        // The stacked input's tangent half holds x' for a unit ṡ: scale it to ẋ = x'·ṡ.
        let x = &mut scr.xs[li];
        for (r, &sd) in scr.sdot.iter().enumerate() {
            x[(n + r) * ni..(n + r + 1) * ni]
                .iter_mut()
                .for_each(|v| *v *= sd);
        }
        let gw = &mut g[l.w - base..l.w - base + ni * no];
        let xt = Mat {
            v: &x[..],
            rs: 1,
            cs: ni,
        };
        tile::gemm(ni, 2 * n, no, xt, &scr.zb, zs, true, gw);
        if li == 0 {
            break;
        }
        // x̄ = z̄ Wᵀ, then the layer below's dual rows.
        resize(&mut scr.xb, 2 * n * ni);
        let below = &net.layers[li - 1];
        let zb = Mat {
            v: &scr.zb[..],
            rs: zs,
            cs: 1,
        };
        if fma() && no <= tile::KC {
            resize(&mut scr.zb_below, 2 * n * zs_below);
            let (gb, gi) = bias_grads(below, g, base);
            let mut e = Reverse {
                zs: zs_below,
                l,
                below,
                li,
                p,
                n,
                yb: &scr.yb,
                hz: &tr.hz[li - 1],
                sdot: &scr.sdot,
                xb: &mut scr.xb,
                zb: &mut scr.zb_below,
                gb,
                gi,
            };
            pair_tiles(n, zb, &wt[li], zs_below, 0..no, &mut e);
            std::mem::swap(&mut scr.yb, &mut scr.xb);
            std::mem::swap(&mut scr.zb, &mut scr.zb_below);
        } else {
            tile::gemm(2 * n, no, ni, zb, &wt[li], zs_below, false, &mut scr.xb);
            for r in 0..2 * n {
                add_skip_t(
                    l,
                    &scr.yb[r * no..(r + 1) * no],
                    &mut scr.xb[r * ni..(r + 1) * ni],
                );
            }
            std::mem::swap(&mut scr.yb, &mut scr.xb);
            dual_rows(li - 1, below, p, tr, scr, g, base);
        }
    }
}

/// The tiles of the stacked product `[a; a']`·B (2n rows, n value rows then their tangents),
/// each with value rows r.. and their tangent rows n + r.. together, rows in ascending order.
#[inline(always)]
fn pair_tiles<T: Real, E: Epilogue<T>>(
    n: usize,
    a: Mat<T>,
    b: &[T],
    cols: usize,
    ps: Range<usize>,
    e: &mut E,
) {
    const P: usize = tile::R / 2;
    let mut r = 0;
    while r + P <= n {
        let rows = std::array::from_fn::<usize, { tile::R }, _>(|i| r + i % P + (i / P) * n);
        row_tiles(rows, a, b, cols, cols, ps.clone(), e);
        r += P;
    }
    while r < n {
        row_tiles([r, n + r], a, b, cols, cols, ps.clone(), e);
        r += 1;
    }
}

/// Every layer's Wᵀ (`[nout][padded(nin)]`, zero past nin), so that x̄ = z̄ Wᵀ reads
/// contiguous rows and its tiles end in a vector tile (nin = 25 and 50 would otherwise end in
/// narrower tiles, down to one-column ones bound by the FMA's latency); made once per block and
/// step, not per task.
fn transposed_weights<T: Real>(net: &Net, p: &[T]) -> Vec<Vec<T>> {
    net.layers
        .iter()
        .map(|l| {
            let (ni, no, st) = (l.nin, l.nout, tile::padded::<T>(l.nin));
            let mut wt = vec![T::zero(); st * no];
            for (j, wr) in p[l.w..l.w + ni * no].chunks_exact(no).enumerate() {
                for (o, &v) in wr.iter().enumerate() {
                    wt[o * st + j] = v;
                }
            }
            wt
        })
        .collect()
}

/// `g += Σ_t partials[t]` over the consecutive g-long partials, each element summed in the
/// order of t as a serial loop would, chunks of elements in parallel.
fn sum_partials<T: Real>(g: &mut [T], partials: &[T]) {
    const CHUNK: usize = 512;
    let len = g.len();
    g.par_chunks_mut(CHUNK).enumerate().for_each(|(c, gc)| {
        let cols = c * CHUNK..c * CHUNK + gc.len();
        wide(
            #[inline(always)]
            || {
                for part in partials.chunks_exact(len) {
                    for (a, b) in gc.iter_mut().zip(&part[cols.clone()]) {
                        *a += *b;
                    }
                }
            },
        )
    });
}

/// Parameter span of a net: all its tensors are allocated contiguously.
fn span(net: &Net) -> Range<usize> {
    let first = net.layers[0].w;
    let last = net.layers.last().unwrap();
    let end = [
        last.w + last.nin * last.nout,
        last.b + last.nout,
        last.idt.map_or(0, |o| o + last.nout),
    ]
    .into_iter()
    .max()
    .unwrap();
    first..end
}

/// Real slots of a centre's section come first (the neighbour list fills nearest-first), so
/// each task gathers the real prefix of each of its centres' sections.
fn real_rows(owner: &[i32], rows: Range<usize>, sel: usize) -> Vec<Range<usize>> {
    rows.step_by(sel.max(1))
        .map(|start| start..start + (start..start + sel).take_while(|&s| owner[s] >= 0).count())
        .collect()
}

/// The padded input of block rows, if the block has padded slots.
fn pad_input<T: Real>(owner: &[i32], s: &[T], rows: Range<usize>) -> Option<T> {
    rows.clone().find(|&r| owner[r] < 0).map(|r| s[r])
}

/// Task row ranges of a block: `CENTRES_PER_TASK` centres each.
fn tasks(rows: Range<usize>, sel: usize) -> Vec<Range<usize>> {
    let task = CENTRES_PER_TASK * sel;
    (rows.start..rows.end)
        .step_by(task.max(1))
        .map(|r0| r0..(r0 + task).min(rows.end))
        .collect()
}

/// The traces of the last forward pass of this thread and what they were computed from.
#[derive(Default)]
struct Cache<T> {
    dims: Option<Dims>,
    s: Vec<T>,
    owner: Vec<i32>,
    /// The parameters of every block's net, concatenated.
    params: Vec<T>,
    /// Per block `ti·nsec + tj`, per task.
    traces: Vec<Vec<Trace<T>>>,
    /// The dual reverse's per-task partial gradients of one block, kept from call to call.
    partials: Vec<T>,
}

impl<T: Real> Cache<T> {
    fn block_params<'a>(nets: &'a [&Net], p: &'a [T]) -> impl Iterator<Item = &'a T> + 'a {
        nets.iter().flat_map(move |n| p[span(n)].iter())
    }

    fn matches(&self, d: &Dims, nets: &[&Net], p: &[T], s: &[T], owner: &[i32]) -> bool {
        self.dims.as_ref() == Some(d)
            && self.s == s
            && self.owner == owner
            && self.params.iter().eq(Self::block_params(nets, p))
    }

    fn tag(&mut self, d: &Dims, nets: &[&Net], p: &[T], s: &[T], owner: &[i32]) {
        self.dims = Some(d.clone());
        self.s.clear();
        self.s.extend_from_slice(s);
        self.owner.clear();
        self.owner.extend_from_slice(owner);
        self.params.clear();
        self.params.extend(Self::block_params(nets, p).copied());
    }
}

thread_local! {
    static CACHE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
    static SCRATCH: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Runs `f` on the value of type `S` in this thread's `slot` (made anew if it held another
/// type), or on a fresh one if the slot is in use further up this thread's stack.
fn with_local<S: Default + 'static, R>(
    slot: &'static std::thread::LocalKey<RefCell<Option<Box<dyn Any>>>>,
    f: impl FnOnce(&mut S) -> R,
) -> R {
    slot.with(|c| {
        let Ok(mut slot) = c.try_borrow_mut() else {
            return f(&mut S::default());
        };
        if !slot.as_ref().is_some_and(|b| b.is::<S>()) {
            *slot = Some(Box::<S>::default());
        }
        f(slot.as_mut().unwrap().downcast_mut::<S>().unwrap())
    })
}

/// Runs `f` on this thread's cache of traces for T.
fn with_cache<T: Real, R>(f: impl FnOnce(&mut Cache<T>) -> R) -> R {
    with_local(&CACHE, f)
}

/// Runs `f` on this thread's task buffers for T, kept from task to task and call to call:
/// rayon's `for_each_init` made fresh ones for every split of every call, each grown (and
/// zeroed) anew to about a megabyte.
fn with_scratch<T: Real, R>(f: impl FnOnce(&mut Scratch<T>) -> R) -> R {
    with_local(&SCRATCH, f)
}

/// Gathers the real slots' inputs of a task into the scratch buffers.
fn gather_inputs<T: Real>(
    reals: &[Range<usize>],
    s: &[T],
    sdot: Option<&[T]>,
    scr: &mut Scratch<T>,
) {
    scr.s.clear();
    scr.sdot.clear();
    for r in reals {
        scr.s.extend_from_slice(&s[r.clone()]);
        if let Some(sd) = sdot {
            scr.sdot.extend_from_slice(&sd[r.clone()]);
        }
    }
}

/// Writes a task's G and G' into its slots: the real slots' rows of `(y, yp)` in order, each
/// padded slot the padded input's row `pad` (left as it is without padding).
fn scatter_slots<T: Real>(
    reals: &[Range<usize>],
    sel: usize,
    m1: usize,
    (y, yp): (&[T], &[T]),
    pad: Option<(&[T], &[T])>,
    g: &mut [T],
    gp: &mut [T],
) {
    let mut k = 0;
    for (ci, rr) in reals.iter().enumerate() {
        for j in 0..sel {
            let dst = (ci * sel + j) * m1..(ci * sel + j + 1) * m1;
            let src = if j < rr.len() {
                k += 1;
                Some((&y[(k - 1) * m1..k * m1], &yp[(k - 1) * m1..k * m1]))
            } else {
                pad
            };
            if let Some((a, b)) = src {
                g[dst.clone()].copy_from_slice(a);
                gp[dst].copy_from_slice(b);
            }
        }
    }
}

/// The forward pass over every block, traces kept in `cache`; writes G and G' when given.
#[allow(clippy::too_many_arguments)]
fn forward_into<T: Real>(
    d: &Dims,
    nets: &[&Net],
    p: &[T],
    s: &[T],
    owner: &[i32],
    cache: &mut Cache<T>,
    mut out: Option<(&mut [T], &mut [T])>,
) {
    let m1 = d.m1;
    cache.traces.resize_with(d.ntypes * d.nsec, Vec::new);
    for ti in 0..d.ntypes {
        for tj in d.sections() {
            let k = ti * d.nsec + tj;
            let (rows, sel) = (d.block(ti, tj), d.sel[tj]);
            let traces = &mut cache.traces[k];
            if rows.is_empty() {
                traces.clear();
                continue;
            }
            let net = nets[k];
            let ts = tasks(rows.clone(), sel);
            traces.resize_with(ts.len(), Trace::default);
            let work = |scr: &mut Scratch<T>, r: &Range<usize>, tr: &mut Trace<T>| {
                let reals = real_rows(owner, r.clone(), sel);
                gather_inputs(&reals, s, None, scr);
                wide(
                    #[inline(always)]
                    || run(net, p, tr, scr),
                );
                reals
            };
            match out.as_mut() {
                None => ts
                    .par_iter()
                    .zip(traces.par_iter_mut())
                    .for_each(|(r, tr)| {
                        with_scratch(|scr| work(scr, r, tr));
                    }),
                Some((g, gp)) => {
                    // Inside `wide` like the tasks: outside it, the tiles' fused multiply-adds
                    // would be calls to the software `fma` (same bits, far slower).
                    let pad = pad_input(owner, s, rows.clone()).map(|sp| {
                        let mut scr = Scratch::default();
                        scr.s.push(sp);
                        wide(
                            #[inline(always)]
                            || run(net, p, &mut Trace::default(), &mut scr),
                        );
                        scr.out
                    });
                    let pad = pad.as_ref().map(|o| o.split_at(m1));
                    let task = CENTRES_PER_TASK * sel * m1;
                    g[rows.start * m1..rows.end * m1]
                        .par_chunks_mut(task)
                        .zip(gp[rows.start * m1..rows.end * m1].par_chunks_mut(task))
                        .zip(ts.par_iter().zip(traces.par_iter_mut()))
                        .for_each(|((gc, gpc), (r, tr))| {
                            with_scratch(|scr| {
                                let reals = work(scr, r, tr);
                                let (y, yp) = scr.out.split_at(tr.n * m1);
                                scatter_slots(&reals, sel, m1, (y, yp), pad, gc, gpc);
                            })
                        });
                }
            }
        }
    }
    cache.tag(d, nets, p, s, owner);
}

pub fn forward<T: Real>(
    d: &Dims,
    nets: &[&Net],
    p: &[T],
    s: &[T],
    owner: &[i32],
    g: &mut [T],
    gp: &mut [T],
) {
    with_cache::<T, _>(|cache| forward_into(d, nets, p, s, owner, cache, Some((g, gp))));
}

/// Where the dual reverse's seeds (Ḡ, Ġ̄ of each slot) come from.
pub enum Seeds<'a, T> {
    /// The step's buffers, written by the contraction's dual.
    Slots { gbar: &'a [T], gdotbar: &'a [T] },
    /// Made per slot from the contraction's per-centre adjoints while the task gathers its
    /// rows ([`contract::slot_seeds`]), so that Ḡ and Ġ̄ are never written to memory.
    Contract {
        adjoints: &'a [(Vec<T>, Vec<T>)],
        rhat: &'a [T],
        rdot: &'a [T],
    },
}

impl<T: Real> Seeds<'_, T> {
    /// Appends the `[Ḡ; Ġ̄]` rows of the given slot ranges (all of block `(ti, sel)`) to the
    /// value and tangent halves of `yb` (n = total rows).
    #[inline(always)]
    fn gather(
        &self,
        d: &Dims,
        ti: usize,
        blk: usize,
        sel: usize,
        reals: &[Range<usize>],
        yb: &mut Vec<T>,
    ) {
        let m1 = d.m1;
        match *self {
            Seeds::Slots { gbar, gdotbar } => {
                yb.clear();
                for src in [gbar, gdotbar] {
                    for r in reals {
                        yb.extend_from_slice(&src[r.start * m1..r.end * m1]);
                    }
                }
            }
            Seeds::Contract {
                adjoints,
                rhat,
                rdot,
            } => {
                let n: usize = reals.iter().map(|r| r.len()).sum();
                resize(yb, 2 * n * m1);
                let f = T::of(1.0 / d.nnei as f64);
                let (gb, gdb) = yb.split_at_mut(n * m1);
                let mut k = 0;
                for r in reals {
                    let c = d.centre_start[ti] + (r.start - blk) / sel;
                    for slot in r.clone() {
                        let q = k * m1..(k + 1) * m1;
                        contract::slot_seeds(
                            m1,
                            f,
                            slot,
                            &adjoints[c],
                            rhat,
                            rdot,
                            &mut gb[q.clone()],
                            &mut gdb[q],
                        );
                        k += 1;
                    }
                }
            }
        }
    }

    /// Adds Ḡ of the padded slots of block rows `rows` into `acc`.
    #[inline(always)]
    fn add_padded(
        &self,
        d: &Dims,
        ti: usize,
        sel: usize,
        owner: &[i32],
        rows: Range<usize>,
        acc: &mut [T],
    ) {
        let m1 = d.m1;
        let padded = rows.clone().filter(|&r| owner[r] < 0);
        match *self {
            Seeds::Slots { gbar, .. } => {
                for r in padded {
                    acc.iter_mut()
                        .zip(&gbar[r * m1..(r + 1) * m1])
                        .for_each(|(a, b)| *a += *b);
                }
            }
            Seeds::Contract {
                adjoints,
                rhat,
                rdot,
            } => {
                // A padded slot's Ṙ is 0 and its R̂ is −avg/std, nonzero in the radial column
                // in training: its seeds take one axpy (`slot_seeds` skips zero coefficients,
                // so seeds that vanish cost none and add zeros, which change nothing).
                let f = T::of(1.0 / d.nnei as f64);
                let (mut gb, mut gdb) = (vec![T::zero(); m1], vec![T::zero(); m1]);
                for r in padded {
                    let c = d.centre_start[ti] + (r - rows.start) / sel;
                    contract::slot_seeds(m1, f, r, &adjoints[c], rhat, rdot, &mut gb, &mut gdb);
                    acc.iter_mut().zip(&gb).for_each(|(a, b)| *a += *b);
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn dual_backward<T: Real>(
    d: &Dims,
    nets: &[&Net],
    p: &[T],
    s: &[T],
    owner: &[i32],
    sdot: &[T],
    seeds: Seeds<T>,
    grad: &mut [T],
) {
    with_cache::<T, _>(|cache| {
        if !cache.matches(d, nets, p, s, owner) {
            forward_into(d, nets, p, s, owner, cache, None);
        }
        let m1 = d.m1;
        for ti in 0..d.ntypes {
            for tj in d.sections() {
                let k = ti * d.nsec + tj;
                let (rows, sel) = (d.block(ti, tj), d.sel[tj]);
                if rows.is_empty() {
                    continue;
                }
                let net = nets[k];
                let sp = span(net);
                let wt = transposed_weights(net, p);
                let ts = tasks(rows.clone(), sel);
                // Per-task partial gradients, summed in task order: the result does not depend on
                // the number of threads.
                let partials = &mut cache.partials;
                resize(partials, ts.len() * sp.len());
                partials
                    .par_chunks_mut(sp.len())
                    .zip(ts.par_iter().zip(cache.traces[k].par_iter()))
                    .for_each(|(part, (r, tr))| {
                        with_scratch(|scr| {
                            part.fill(T::zero());
                            let reals = real_rows(owner, r.clone(), sel);
                            gather_inputs(&reals, s, Some(sdot), scr);
                            wide(
                                #[inline(always)]
                                || {
                                    seeds.gather(d, ti, rows.start, sel, &reals, &mut scr.yb);
                                    inputs(net, p, tr, scr);
                                    dual(net, p, &wt, tr, scr, part, sp.start);
                                },
                            );
                        })
                    });
                let g = &mut grad[sp.clone()];
                sum_partials(g, partials);
                // Padded slots: ṡ = 0, so only the sum of their Ḡ flows back, through one evaluation.
                if let Some(spad) = pad_input(owner, s, rows.clone()) {
                    let mut scr = Scratch {
                        yb: vec![T::zero(); 2 * m1],
                        ..Scratch::default()
                    };
                    scr.s.push(spad);
                    scr.sdot.push(T::zero());
                    let mut tr = Trace::default();
                    let mut part = vec![T::zero(); sp.len()];
                    // Inside `wide`: outside it, the tiles' fused multiply-adds would be calls
                    // to the software `fma` (same bits, far slower).
                    wide(
                        #[inline(always)]
                        || {
                            let yb = &mut scr.yb[..m1];
                            seeds.add_padded(d, ti, sel, owner, rows.clone(), yb);
                            run(net, p, &mut tr, &mut scr);
                            dual(net, p, &wt, &tr, &mut scr, &mut part, sp.start);
                        },
                    );
                    g.iter_mut().zip(part).for_each(|(a, b)| *a += b);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Skip;

    /// A net 1 → 4 → 8 → 16 (the last two with [x, x] skips and a timestep) and its parameters.
    fn net() -> (Net, Vec<f64>) {
        let mut off = 0;
        let mut layers = Vec::new();
        for (nin, nout, skip) in [
            (1, 4, Skip::None),
            (4, 8, Skip::Double),
            (8, 16, Skip::Double),
        ] {
            let (w, b) = (off, off + nin * nout);
            let idt = (skip != Skip::None).then_some(b + nout);
            off = b + nout + if idt.is_some() { nout } else { 0 };
            layers.push(Layer {
                nin,
                nout,
                act: Activation::Tanh,
                skip,
                w,
                b,
                idt,
            });
        }
        let p = (0..off)
            .map(|i| ((i * 37 % 101) as f64 / 101.0 - 0.5) * 0.8)
            .collect();
        (
            Net {
                name: "e".into(),
                layers,
            },
            p,
        )
    }

    fn grad_of(
        d: &Dims,
        nets: &[&Net],
        p: &[f64],
        s: &[f64],
        owner: &[i32],
        sdot: &[f64],
    ) -> Vec<f64> {
        let n = d.nslots() * d.m1;
        let gbar: Vec<f64> = (0..n)
            .map(|i| ((i * 13 % 29) as f64 - 14.0) / 29.0)
            .collect();
        let gdotbar: Vec<f64> = (0..n)
            .map(|i| ((i * 7 % 31) as f64 - 15.0) / 31.0)
            .collect();
        let mut grad = vec![0.0; p.len()];
        let seeds = Seeds::Slots {
            gbar: &gbar,
            gdotbar: &gdotbar,
        };
        dual_backward(d, nets, p, s, owner, sdot, seeds, &mut grad);
        grad
    }

    /// A batch of two types whose sections have padded slots among the real ones (owner −1),
    /// with inputs s (−0.3 where padded, as env_mat makes them) and tangents ṡ (0 where padded).
    fn padded_slots() -> (Dims, Vec<i32>, Vec<f64>, Vec<f64>) {
        let d = Dims::new(1, &[3, 2], &[4, 3], 16, 4);
        let ns = d.nslots();
        let owner: Vec<i32> = (0..ns)
            .map(|i| if i % 4 == 3 || i % 7 == 6 { -1 } else { 0 })
            .collect();
        let s: Vec<f64> = (0..ns)
            .map(|i| {
                if owner[i] < 0 {
                    -0.3
                } else {
                    (i as f64 * 0.37).sin()
                }
            })
            .collect();
        let sdot: Vec<f64> = (0..ns)
            .map(|i| {
                if owner[i] < 0 {
                    0.0
                } else {
                    (i as f64 * 0.11).cos()
                }
            })
            .collect();
        (d, owner, s, sdot)
    }

    /// The dual reverse gives the same bits from the forward pass's traces and from traces it
    /// recomputes because the parameters changed in between.
    #[test]
    fn cached_traces_match_recomputed_ones() {
        let (net, p) = net();
        let (d, owner, s, sdot) = padded_slots();
        let ns = d.nslots();
        let nets = vec![&net; 4];
        let (mut g, mut gp) = (vec![0.0; ns * 16], vec![0.0; ns * 16]);
        forward(&d, &nets, &p, &s, &owner, &mut g, &mut gp);
        let cached = grad_of(&d, &nets, &p, &s, &owner, &sdot);
        let p2: Vec<f64> = p.iter().map(|x| x * 1.1).collect();
        forward(&d, &nets, &p2, &s, &owner, &mut g, &mut gp);
        let recomputed = grad_of(&d, &nets, &p, &s, &owner, &sdot);
        assert_eq!(cached, recomputed);
        assert!(cached.iter().any(|x| *x != 0.0));
    }

    /// The fused stage (seeds made per slot from the contraction's per-centre adjoints) gives
    /// the same bits as the contraction's dual writing Ḡ, Ġ̄ and the embedding dual reading
    /// them.
    #[test]
    fn seeds_from_the_contraction_match_written_ones() {
        let (net, p) = net();
        let (d, owner, s, sdot) = padded_slots();
        let (ns, nc) = (d.nslots(), d.ncentres());
        let wave = |n: usize, a: f64, zero_padded: bool| -> Vec<f64> {
            (0..n)
                .map(|i| {
                    if zero_padded && owner[i / 4] < 0 {
                        0.0
                    } else {
                        (i as f64 * a).sin()
                    }
                })
                .collect()
        };
        // R̂ and Ṙ are 0 on padded slots, as env_mat and virtual_tangent make them.
        let (rhat, rdot) = (wave(4 * ns, 0.23, true), wave(4 * ns, 0.71, true));
        let (a, adot) = (
            wave(4 * d.m1 * nc, 0.13, false),
            wave(4 * d.m1 * nc, 0.31, false),
        );
        let (dbar, ddotbar) = (
            wave(d.m1 * d.m2 * nc, 0.17, false),
            wave(d.m1 * d.m2 * nc, 0.29, false),
        );
        let nets = vec![&net; 4];
        let (mut g, mut gp) = (vec![0.0; ns * 16], vec![0.0; ns * 16]);
        forward(&d, &nets, &p, &s, &owner, &mut g, &mut gp);
        let (mut gbar, mut gdotbar) = (vec![0.0; ns * d.m1], vec![0.0; ns * d.m1]);
        contract::dual(
            &d,
            &a,
            &adot,
            &dbar,
            &ddotbar,
            &rhat,
            &rdot,
            &mut gbar,
            &mut gdotbar,
        );
        let mut layered = vec![0.0; p.len()];
        let seeds = Seeds::Slots {
            gbar: &gbar,
            gdotbar: &gdotbar,
        };
        dual_backward(&d, &nets, &p, &s, &owner, &sdot, seeds, &mut layered);
        let adjoints = contract::centre_adjoints(&d, &a, &adot, &dbar, &ddotbar);
        let mut fused = vec![0.0; p.len()];
        let seeds = Seeds::Contract {
            adjoints: &adjoints,
            rhat: &rhat,
            rdot: &rdot,
        };
        dual_backward(&d, &nets, &p, &s, &owner, &sdot, seeds, &mut fused);
        assert_eq!(layered, fused);
        assert!(fused.iter().all(|x| x.is_finite()) && fused.iter().any(|x| *x != 0.0));
    }
}

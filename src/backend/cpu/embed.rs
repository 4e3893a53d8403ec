//! The embedding nets fused per group of centres: the layers run on a few hundred rows that stay
//! in cache, nothing but G and G' is stored, and the dual reverse recomputes its forward values
//! instead of reading them back from memory. Padded slots all have the same input
//! s = −davg₀/dstd₀ and ṡ = 0, so each block evaluates them once.

use std::ops::Range;

use rayon::prelude::*;

use super::dense::{add_skip, add_skip_t};
use super::tanh::tanh_bias;
use crate::backend::{Dims, Real};
use crate::model::Net;

/// Centres per task: enough rows for efficient small GEMMs, few enough to stay in cache.
const CENTRES_PER_TASK: usize = 2;

/// Forward values of one layer for a group of rows: input x and its s-derivative x', tanh
/// output h and z' = x'W.
struct LayerTrace<T> {
    x: Vec<T>,
    xp: Vec<T>,
    h: Vec<T>,
    zp: Vec<T>,
}

/// Runs the net on inputs `s`, returning every layer's trace and the output (G, G').
fn trace<T: Real>(net: &Net, p: &[T], s: &[T]) -> (Vec<LayerTrace<T>>, Vec<T>, Vec<T>) {
    let n = s.len();
    let (mut x, mut xp) = (s.to_vec(), vec![T::one(); n]);
    let mut layers = Vec::with_capacity(net.layers.len());
    for l in &net.layers {
        let w = &p[l.w..l.w + l.nin * l.nout];
        let mut h = vec![T::zero(); n * l.nout];
        let mut zp = vec![T::zero(); n * l.nout];
        let (ni, no) = (l.nin as isize, l.nout as isize);
        T::gemm(
            n,
            l.nin,
            l.nout,
            T::one(),
            &x,
            ni,
            1,
            w,
            no,
            1,
            T::zero(),
            &mut h,
            no,
        );
        T::gemm(
            n,
            l.nin,
            l.nout,
            T::one(),
            &xp,
            ni,
            1,
            w,
            no,
            1,
            T::zero(),
            &mut zp,
            no,
        );
        tanh_bias(&mut h, &p[l.b..l.b + l.nout]);
        let idt = l.idt.map(|o| &p[o..o + l.nout]);
        let mut y = vec![T::zero(); n * l.nout];
        let mut yp = vec![T::zero(); n * l.nout];
        for r in 0..n {
            let (o, oi) = (r * l.nout, r * l.nin);
            for k in 0..l.nout {
                let (hv, t) = (h[o + k], idt.map_or(T::one(), |t| t[k]));
                y[o + k] = hv * t;
                yp[o + k] = (T::one() - hv * hv) * zp[o + k] * t;
            }
            add_skip(l, &x[oi..oi + l.nin], &mut y[o..o + l.nout]);
            add_skip(l, &xp[oi..oi + l.nin], &mut yp[o..o + l.nout]);
        }
        layers.push(LayerTrace { x, xp, h, zp });
        x = y;
        xp = yp;
    }
    (layers, x, xp)
}

/// The dual reverse through a traced net for n rows with input tangents `sdot`, seeds `ybar`
/// and `ydotbar` (`[n][M1]`); adds W̄, b̄, īdt into `g`, a gradient laid out like the
/// parameter vector but only over this net's span starting at `base`.
#[allow(clippy::too_many_arguments)]
fn dual<T: Real>(
    net: &Net,
    p: &[T],
    tr: &[LayerTrace<T>],
    sdot: &[T],
    ybar: Vec<T>,
    ydotbar: Vec<T>,
    g: &mut [T],
    base: usize,
) {
    let n = sdot.len();
    let (mut yb, mut ydb) = (ybar, ydotbar);
    for (li, (l, t)) in net.layers.iter().zip(tr).enumerate().rev() {
        let idt = l.idt.map(|o| &p[o..o + l.nout]);
        let mut zbar = vec![T::zero(); n * l.nout];
        let mut zdbar = vec![T::zero(); n * l.nout];
        for (r, &sd) in sdot.iter().enumerate() {
            for k in 0..l.nout {
                let i = r * l.nout + k;
                let (hv, zd) = (t.h[i], t.zp[i] * sd);
                let d1 = T::one() - hv * hv;
                let (hb, hdb) = match idt {
                    Some(tt) => {
                        g[l.idt.unwrap() - base + k] += yb[i] * hv + ydb[i] * d1 * zd;
                        (yb[i] * tt[k], ydb[i] * tt[k])
                    }
                    None => (yb[i], ydb[i]),
                };
                zdbar[i] = d1 * hdb;
                zbar[i] = d1 * hb - (hv + hv) * d1 * zd * hdb;
                g[l.b - base + k] += zbar[i];
            }
        }
        // ẋ of the row is x'·ṡ.
        let xd: Vec<T> =
            t.xp.iter()
                .enumerate()
                .map(|(i, v)| *v * sdot[i / l.nin])
                .collect();
        let (ni, no) = (l.nin as isize, l.nout as isize);
        let gw = &mut g[l.w - base..l.w - base + l.nin * l.nout];
        T::gemm(
            l.nin,
            n,
            l.nout,
            T::one(),
            &t.x,
            1,
            ni,
            &zbar,
            no,
            1,
            T::one(),
            gw,
            no,
        );
        T::gemm(
            l.nin,
            n,
            l.nout,
            T::one(),
            &xd,
            1,
            ni,
            &zdbar,
            no,
            1,
            T::one(),
            gw,
            no,
        );
        if li == 0 {
            break;
        }
        let w = &p[l.w..l.w + l.nin * l.nout];
        let mut xb = vec![T::zero(); n * l.nin];
        let mut xdb = vec![T::zero(); n * l.nin];
        T::gemm(
            n,
            l.nout,
            l.nin,
            T::one(),
            &zbar,
            no,
            1,
            w,
            1,
            no,
            T::zero(),
            &mut xb,
            ni,
        );
        T::gemm(
            n,
            l.nout,
            l.nin,
            T::one(),
            &zdbar,
            no,
            1,
            w,
            1,
            no,
            T::zero(),
            &mut xdb,
            ni,
        );
        for r in 0..n {
            let (o, oi) = (r * l.nout, r * l.nin);
            add_skip_t(l, &yb[o..o + l.nout], &mut xb[oi..oi + l.nin]);
            add_skip_t(l, &ydb[o..o + l.nout], &mut xdb[oi..oi + l.nin]);
        }
        yb = xb;
        ydb = xdb;
    }
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

pub fn forward<T: Real>(
    d: &Dims,
    nets: &[&Net],
    p: &[T],
    s: &[T],
    owner: &[i32],
    g: &mut [T],
    gp: &mut [T],
) {
    let m1 = d.m1;
    for ti in 0..d.ntypes {
        for tj in 0..d.ntypes {
            let (rows, sel) = (d.block(ti, tj), d.sel[tj]);
            if rows.is_empty() {
                continue;
            }
            let net = nets[ti * d.ntypes + tj];
            let pad = pad_input(owner, s, rows.clone()).map(|sp| {
                let (_, y, yp) = trace(net, p, &[sp]);
                (y, yp)
            });
            let task = CENTRES_PER_TASK * sel;
            g[rows.start * m1..rows.end * m1]
                .par_chunks_mut(task * m1)
                .zip(gp[rows.start * m1..rows.end * m1].par_chunks_mut(task * m1))
                .enumerate()
                .for_each(|(i, (gc, gpc))| {
                    let r0 = rows.start + i * task;
                    let reals = real_rows(owner, r0..r0 + gc.len() / m1, sel);
                    let sv: Vec<T> = reals
                        .iter()
                        .flat_map(|r| s[r.clone()].iter().copied())
                        .collect();
                    let (_, y, yp) = trace(net, p, &sv);
                    let mut k = 0;
                    for (ci, r) in reals.iter().enumerate() {
                        for j in 0..sel {
                            let dst = (ci * sel + j) * m1..(ci * sel + j + 1) * m1;
                            let src = if j < r.len() {
                                k += 1;
                                Some((&y[(k - 1) * m1..k * m1], &yp[(k - 1) * m1..k * m1]))
                            } else {
                                pad.as_ref().map(|(a, b)| (a.as_slice(), b.as_slice()))
                            };
                            if let Some((a, b)) = src {
                                gc[dst.clone()].copy_from_slice(a);
                                gpc[dst].copy_from_slice(b);
                            }
                        }
                    }
                });
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
    gbar: &[T],
    gdotbar: &[T],
    grad: &mut [T],
) {
    let m1 = d.m1;
    for ti in 0..d.ntypes {
        for tj in 0..d.ntypes {
            let (rows, sel) = (d.block(ti, tj), d.sel[tj]);
            if rows.is_empty() {
                continue;
            }
            let net = nets[ti * d.ntypes + tj];
            let sp = span(net);
            let task = CENTRES_PER_TASK * sel;
            let starts: Vec<usize> = (rows.start..rows.end).step_by(task).collect();
            let mut partials: Vec<Vec<T>> = starts
                .par_iter()
                .map(|&r0| {
                    let reals = real_rows(owner, r0..(r0 + task).min(rows.end), sel);
                    let idx: Vec<usize> = reals.iter().flat_map(|r| r.clone()).collect();
                    let sv: Vec<T> = idx.iter().map(|&r| s[r]).collect();
                    let sd: Vec<T> = idx.iter().map(|&r| sdot[r]).collect();
                    let gather = |src: &[T]| -> Vec<T> {
                        idx.iter()
                            .flat_map(|&r| src[r * m1..(r + 1) * m1].iter().copied())
                            .collect()
                    };
                    let (tr, _, _) = trace(net, p, &sv);
                    let mut part = vec![T::zero(); sp.len()];
                    dual(
                        net,
                        p,
                        &tr,
                        &sd,
                        gather(gbar),
                        gather(gdotbar),
                        &mut part,
                        sp.start,
                    );
                    part
                })
                .collect();
            // Padded slots: ṡ = 0, so only the sum of their Ḡ flows back, through one evaluation.
            if let Some(spad) = pad_input(owner, s, rows.clone()) {
                let mut sum = vec![T::zero(); m1];
                for r in rows.clone().filter(|&r| owner[r] < 0) {
                    sum.iter_mut()
                        .zip(&gbar[r * m1..(r + 1) * m1])
                        .for_each(|(a, b)| *a += *b);
                }
                let (tr, _, _) = trace(net, p, &[spad]);
                let mut part = vec![T::zero(); sp.len()];
                dual(
                    net,
                    p,
                    &tr,
                    &[T::zero()],
                    sum,
                    vec![T::zero(); m1],
                    &mut part,
                    sp.start,
                );
                partials.push(part);
            }
            let g = &mut grad[sp.clone()];
            for part in partials {
                g.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
        }
    }
}

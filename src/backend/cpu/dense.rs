//! Dense layers as GEMMs over row ranges: forward, input backward, tangent, dual backward.
//! Rows are processed in fixed chunks on the rayon pool; per-chunk weight-gradient partials
//! are summed in chunk order, so results never depend on the number of threads.

use std::ops::Range;

use rayon::prelude::*;

use crate::backend::Real;
use crate::model::{Layer, Skip};

const CHUNK: usize = 256;

fn chunks(rows: &Range<usize>) -> Vec<Range<usize>> {
    (rows.start..rows.end)
        .step_by(CHUNK)
        .map(|s| s..(s + CHUNK).min(rows.end))
        .collect()
}

/// Splits `buf` (row-major, `width` per row) into the chunks' disjoint mutable pieces.
fn split_rows<'a, T>(buf: &'a mut [T], width: usize, parts: &[Range<usize>]) -> Vec<&'a mut [T]> {
    let mut rest = &mut buf[parts.first().map_or(0, |p| p.start * width)..];
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let (head, tail) = rest.split_at_mut(p.len() * width);
        out.push(head);
        rest = tail;
    }
    out
}

/// `c = x·W` (+ `beta`·c) for the rows of one chunk.
fn matmul_w<T: Real>(l: &Layer, w: &[T], n: usize, x: &[T], beta: T, c: &mut [T]) {
    T::gemm(
        n,
        l.nin,
        l.nout,
        T::one(),
        x,
        l.nin as isize,
        1,
        w,
        l.nout as isize,
        1,
        beta,
        c,
        l.nout as isize,
    );
}

/// `c = z·Wᵀ` for the rows of one chunk.
fn matmul_wt<T: Real>(l: &Layer, w: &[T], n: usize, z: &[T], c: &mut [T]) {
    T::gemm(
        n,
        l.nout,
        l.nin,
        T::one(),
        z,
        l.nout as isize,
        1,
        w,
        1,
        l.nout as isize,
        T::zero(),
        c,
        l.nin as isize,
    );
}

fn dphi<T: Real>(l: &Layer, h: T) -> T {
    if l.tanh {
        T::one() - h * h
    } else {
        T::one()
    }
}

fn add_skip<T: Real>(l: &Layer, x: &[T], y: &mut [T]) {
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

/// The adjoint of the skip connection, added to x̄.
fn add_skip_t<T: Real>(l: &Layer, ybar: &[T], xbar: &mut [T]) {
    match l.skip {
        Skip::None => {}
        Skip::Identity => xbar.iter_mut().zip(ybar).for_each(|(x, y)| *x += *y),
        Skip::Double => xbar
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x += ybar[i] + ybar[i + l.nin]),
    }
}

fn idt<'a, T: Real>(l: &Layer, p: &'a [T]) -> Option<&'a [T]> {
    l.idt.map(|o| &p[o..o + l.nout])
}

pub fn forward<T: Real>(l: &Layer, p: &[T], rows: Range<usize>, x: &[T], h: &mut [T], y: &mut [T]) {
    let (w, b, idt) = (
        &p[l.w..l.w + l.nin * l.nout],
        &p[l.b..l.b + l.nout],
        idt(l, p),
    );
    let parts = chunks(&rows);
    let hs = split_rows(h, l.nout, &parts);
    let ys = split_rows(y, l.nout, &parts);
    parts.par_iter().zip(hs).zip(ys).for_each(|((r, h), y)| {
        let xr = &x[r.start * l.nin..r.end * l.nin];
        matmul_w(l, w, r.len(), xr, T::zero(), h);
        for (hrow, (yrow, xrow)) in h
            .chunks_mut(l.nout)
            .zip(y.chunks_mut(l.nout).zip(xr.chunks(l.nin)))
        {
            for k in 0..l.nout {
                let z = hrow[k] + b[k];
                hrow[k] = if l.tanh { z.tanh() } else { z };
                yrow[k] = idt.map_or(hrow[k], |t| hrow[k] * t[k]);
            }
            add_skip(l, xrow, yrow);
        }
    });
}

pub fn backward<T: Real>(
    l: &Layer,
    p: &[T],
    rows: Range<usize>,
    h: &[T],
    ybar: &[T],
    xbar: &mut [T],
) {
    let (w, idt) = (&p[l.w..l.w + l.nin * l.nout], idt(l, p));
    let parts = chunks(&rows);
    let xs = split_rows(xbar, l.nin, &parts);
    parts.par_iter().zip(xs).for_each(|(r, xb)| {
        let span = r.start * l.nout..r.end * l.nout;
        let zbar: Vec<T> = h[span.clone()]
            .iter()
            .zip(&ybar[span.clone()])
            .enumerate()
            .map(|(i, (&h, &yb))| dphi(l, h) * idt.map_or(yb, |t| yb * t[i % l.nout]))
            .collect();
        matmul_wt(l, w, r.len(), &zbar, xb);
        for (xrow, yrow) in xb.chunks_mut(l.nin).zip(ybar[span].chunks(l.nout)) {
            add_skip_t(l, yrow, xrow);
        }
    });
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
    let (w, idt) = (&p[l.w..l.w + l.nin * l.nout], idt(l, p));
    let parts = chunks(&rows);
    let zs = split_rows(zdot, l.nout, &parts);
    let ys = split_rows(ydot, l.nout, &parts);
    parts.par_iter().zip(zs).zip(ys).for_each(|((r, zd), yd)| {
        let xr = &xdot[r.start * l.nin..r.end * l.nin];
        matmul_w(l, w, r.len(), xr, T::zero(), zd);
        let hr = &h[r.start * l.nout..r.end * l.nout];
        for ((zrow, yrow), (hrow, xrow)) in zd
            .chunks(l.nout)
            .zip(yd.chunks_mut(l.nout))
            .zip(hr.chunks(l.nout).zip(xr.chunks(l.nin)))
        {
            for k in 0..l.nout {
                let v = dphi(l, hrow[k]) * zrow[k];
                yrow[k] = idt.map_or(v, |t| v * t[k]);
            }
            add_skip(l, xrow, yrow);
        }
    });
}

/// Gradient partials of one chunk: W̄, b̄, īdt.
struct Partial<T> {
    w: Vec<T>,
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
    let (w, idt) = (&p[l.w..l.w + l.nin * l.nout], idt(l, p));
    let (nin, nout) = (l.nin, l.nout);
    let parts = chunks(&rows);
    type Pieces<'a, T> = Vec<Option<&'a mut [T]>>;
    let (xbs, xdbs): (Pieces<T>, Pieces<T>) = match xbar {
        Some((xb, xdb)) => (
            split_rows(xb, nin, &parts).into_iter().map(Some).collect(),
            split_rows(xdb, nin, &parts).into_iter().map(Some).collect(),
        ),
        None => (
            parts.iter().map(|_| None).collect(),
            parts.iter().map(|_| None).collect(),
        ),
    };
    let partials: Vec<Partial<T>> = parts
        .par_iter()
        .zip(xbs)
        .zip(xdbs)
        .map(|((r, xb), xdb)| {
            let n = r.len();
            let so = |row: usize| scale.map_or(T::one(), |s| s[row]);
            let xr = &x[r.start * nin..r.end * nin];
            let xd: Vec<T> = (0..n * nin)
                .map(|i| xdot[r.start * nin + i] * so(r.start + i / nin))
                .collect();
            let mut zbar = vec![T::zero(); n * nout];
            let mut zdbar = vec![T::zero(); n * nout];
            let mut gidt = vec![T::zero(); if idt.is_some() { nout } else { 0 }];
            for i in 0..n * nout {
                let row = r.start + i / nout;
                let k = i % nout;
                let g = r.start * nout + i;
                let (hv, zd) = (h[g], zdot[g] * so(row));
                let d1 = dphi(l, hv);
                let (hb, hdb) = match idt {
                    Some(t) => {
                        gidt[k] += ybar[g] * hv + ydotbar[g] * d1 * zd;
                        (ybar[g] * t[k], ydotbar[g] * t[k])
                    }
                    None => (ybar[g], ydotbar[g]),
                };
                zdbar[i] = d1 * hdb;
                // tanh'' = −2 h (1 − h²); the linear layer has no second-order term.
                let d2 = if l.tanh { -(hv + hv) * d1 } else { T::zero() };
                zbar[i] = d1 * hb + d2 * zd * hdb;
            }
            let mut gw = vec![T::zero(); nin * nout];
            // W̄ = xᵀ z̄ + ẋᵀ ż̄
            T::gemm(
                nin,
                n,
                nout,
                T::one(),
                xr,
                1,
                nin as isize,
                &zbar,
                nout as isize,
                1,
                T::zero(),
                &mut gw,
                nout as isize,
            );
            T::gemm(
                nin,
                n,
                nout,
                T::one(),
                &xd,
                1,
                nin as isize,
                &zdbar,
                nout as isize,
                1,
                T::one(),
                &mut gw,
                nout as isize,
            );
            let mut gb = vec![T::zero(); nout];
            for (i, z) in zbar.iter().enumerate() {
                gb[i % nout] += *z;
            }
            if let (Some(xb), Some(xdb)) = (xb, xdb) {
                matmul_wt(l, w, n, &zbar, xb);
                matmul_wt(l, w, n, &zdbar, xdb);
                let span = r.start * nout..r.end * nout;
                for (row, (xrow, xdrow)) in xb.chunks_mut(nin).zip(xdb.chunks_mut(nin)).enumerate()
                {
                    let o = span.start + row * nout;
                    add_skip_t(l, &ybar[o..o + nout], xrow);
                    add_skip_t(l, &ydotbar[o..o + nout], xdrow);
                }
            }
            Partial {
                w: gw,
                b: gb,
                idt: gidt,
            }
        })
        .collect();
    for part in partials {
        add(&mut grad[l.w..l.w + nin * nout], &part.w);
        add(&mut grad[l.b..l.b + nout], &part.b);
        if let Some(o) = l.idt {
            add(&mut grad[o..o + nout], &part.idt);
        }
    }
}

fn add<T: Real>(acc: &mut [T], x: &[T]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += *b);
}

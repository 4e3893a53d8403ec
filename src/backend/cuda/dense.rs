//! Dense layers on the GPU: the matrix products in cuBLAS, the element-wise parts and the bias /
//! timestep reductions in kernels/dense.cu.
//!
//! cuBLAS is column-major and our matrices are row-major. A row-major `[r][c]` matrix read as
//! column-major is its transpose (`c × r`, leading dimension c), so a row-major product
//! `C = A·B` is computed as the column-major `Cᵀ = Bᵀ·Aᵀ` with the same buffers.

use std::ops::Range;

use cudarc::driver::LaunchConfig;

use super::{grid, launch, name, Cuda, CudaBuf, CudaReal, BLOCK};
use crate::backend::gpu_layout::DenseParams;
use crate::model::{Layer, Skip};

/// Address of the layer's timestep, or 0 (a null pointer: the kernels test it).
fn idt_addr<T>(c: &Cuda, l: &Layer, p: &CudaBuf<T>) -> u64 {
    l.idt.map_or(0, |o| c.at(p, o))
}

/// `out[rows] = a[rows]·W` (+ `beta`·out), `a` `[rows][nin]` at address `a`, `out`
/// `[rows][nout]` at address `out`: column-major `outᵀ (nout × n) = Wᵀ (nout × nin) · aᵀ`.
fn times_w<T: CudaReal>(c: &Cuda, l: &Layer, p: &CudaBuf<T>, n: usize, a: u64, out: u64) {
    c.gemm::<T>(
        false,
        false,
        (l.nout, n, l.nin),
        (c.at(p, l.w), l.nout),
        (a, l.nin),
        T::zero(),
        (out, l.nout),
    );
}

/// `xbar[rows] = zbar·Wᵀ + skipᵀ(ybar)`, zbar local `[n][nout]`: the skip adjoint is written
/// first, then cuBLAS adds the product to it (beta = 1). Column-major:
/// `x̄ᵀ (nin × n) = W (nin × nout) · z̄ᵀ`, where W is the transposed read of its buffer.
#[allow(clippy::too_many_arguments)]
fn input_adjoint<T: CudaReal>(
    c: &Cuda,
    l: &Layer,
    p: &CudaBuf<T>,
    rows: &Range<usize>,
    zbar: u64,
    ybar: &CudaBuf<T>,
    xbar: &mut CudaBuf<T>,
) {
    let n = rows.len();
    let beta = if l.skip == Skip::None {
        T::zero()
    } else {
        launch!(
            c,
            &name::<T>("dense_skip_adjoint"),
            grid(n * l.nin, BLOCK),
            [DenseParams::new(l, rows, false), c.ptr(ybar), c.ptr(xbar)]
        );
        T::one()
    };
    c.gemm::<T>(
        true,
        false,
        (l.nin, n, l.nout),
        (c.at(p, l.w), l.nout),
        (zbar, l.nout),
        beta,
        (c.at(xbar, rows.start * l.nin), l.nin),
    );
}

pub(super) fn forward<T: CudaReal>(
    c: &Cuda,
    l: &Layer,
    p: &CudaBuf<T>,
    rows: Range<usize>,
    x: &CudaBuf<T>,
    h: &mut CudaBuf<T>,
    y: &mut CudaBuf<T>,
) {
    let n = rows.len();
    if n == 0 {
        return;
    }
    times_w(
        c,
        l,
        p,
        n,
        c.at(x, rows.start * l.nin),
        c.at(h, rows.start * l.nout),
    );
    launch!(
        c,
        &name::<T>("dense_forward"),
        grid(n * l.nout, BLOCK),
        [
            DenseParams::new(l, &rows, false),
            c.at(p, l.b),
            idt_addr(c, l, p),
            c.ptr(x),
            c.ptr(h),
            c.ptr(y)
        ]
    );
}

pub(super) fn backward<T: CudaReal>(
    c: &Cuda,
    l: &Layer,
    p: &CudaBuf<T>,
    rows: Range<usize>,
    h: &CudaBuf<T>,
    ybar: &CudaBuf<T>,
    xbar: &mut CudaBuf<T>,
) {
    let n = rows.len();
    if n == 0 {
        return;
    }
    let zbar = c.scratch::<T>(n * l.nout);
    launch!(
        c,
        &name::<T>("dense_zbar"),
        grid(n * l.nout, BLOCK),
        [
            DenseParams::new(l, &rows, false),
            idt_addr(c, l, p),
            c.ptr(h),
            c.ptr(ybar),
            c.addr(&zbar)
        ]
    );
    input_adjoint(c, l, p, &rows, c.addr(&zbar), ybar, xbar);
}

#[allow(clippy::too_many_arguments)]
pub(super) fn tangent<T: CudaReal>(
    c: &Cuda,
    l: &Layer,
    p: &CudaBuf<T>,
    rows: Range<usize>,
    h: &CudaBuf<T>,
    xdot: &CudaBuf<T>,
    zdot: &mut CudaBuf<T>,
    ydot: &mut CudaBuf<T>,
) {
    let n = rows.len();
    if n == 0 {
        return;
    }
    times_w(
        c,
        l,
        p,
        n,
        c.at(xdot, rows.start * l.nin),
        c.at(zdot, rows.start * l.nout),
    );
    launch!(
        c,
        &name::<T>("dense_tangent"),
        grid(n * l.nout, BLOCK),
        [
            DenseParams::new(l, &rows, false),
            idt_addr(c, l, p),
            c.ptr(h),
            c.ptr(xdot),
            c.ptr(zdot),
            c.ptr(ydot)
        ]
    );
}

/// The inputs of the dual reverse pass (see `DenseOps::dense_dual_backward`).
pub(super) struct DualIn<'a, T> {
    pub x: &'a CudaBuf<T>,
    pub h: &'a CudaBuf<T>,
    pub xdot: &'a CudaBuf<T>,
    pub zdot: &'a CudaBuf<T>,
    pub scale: Option<&'a CudaBuf<T>>,
    pub ybar: &'a CudaBuf<T>,
    pub ydotbar: &'a CudaBuf<T>,
}

pub(super) fn dual_backward<T: CudaReal>(
    c: &Cuda,
    l: &Layer,
    p: &CudaBuf<T>,
    rows: Range<usize>,
    i: DualIn<T>,
    grad: &mut CudaBuf<T>,
    xbar: Option<(&mut CudaBuf<T>, &mut CudaBuf<T>)>,
) {
    let n = rows.len();
    if n == 0 {
        return;
    }
    let (nin, nout) = (l.nin, l.nout);
    let u = DenseParams::new(l, &rows, i.scale.is_some());
    let chunks = u.nchunks as usize;
    let zbar = c.scratch::<T>(n * nout);
    let zdbar = c.scratch::<T>(n * nout);
    let part_b = c.scratch::<T>(chunks * nout);
    let part_idt = l.idt.map(|_| c.scratch::<T>(chunks * nout));
    let part_idt_addr = part_idt.as_ref().map_or(0, |s| c.addr(s));
    let scale_addr = i.scale.map_or(0, |s| c.ptr(s));
    // The per-chunk partials: blocks over (chunk, column group).
    let block = (nout.div_ceil(32) * 32).min(128);
    let per_chunk = LaunchConfig {
        grid_dim: (chunks as u32, nout.div_ceil(block) as u32, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // z̄, ż̄ and each row's īdt term over (row, column), then the per-chunk partials.
    let tidt = l.idt.map(|_| c.scratch::<T>(n * nout));
    let tidt_addr = tidt.as_ref().map_or(0, |s| c.addr(s));
    launch!(
        c,
        &name::<T>("dense_dual_elems"),
        grid(n * nout, BLOCK),
        [
            u,
            idt_addr(c, l, p),
            c.ptr(i.h),
            c.ptr(i.zdot),
            scale_addr,
            c.ptr(i.ybar),
            c.ptr(i.ydotbar),
            c.addr(&zbar),
            c.addr(&zdbar),
            tidt_addr
        ]
    );
    launch!(
        c,
        &name::<T>("dense_dual_sums"),
        per_chunk,
        [u, c.addr(&zbar), tidt_addr, c.addr(&part_b), part_idt_addr]
    );

    // ẋ scaled per row (embedding nets), or ẋ itself.
    let xd_scaled = i.scale.map(|s| {
        let out = c.scratch::<T>(n * nin);
        launch!(
            c,
            &name::<T>("dense_scale_rows"),
            grid(n * nin, BLOCK),
            [u, c.ptr(i.xdot), c.ptr(s), c.addr(&out)]
        );
        out
    });
    let xd = xd_scaled
        .as_ref()
        .map_or_else(|| c.at(i.xdot, rows.start * nin), |s| c.addr(s));
    // W̄ += xᵀ z̄ + ẋᵀ ż̄. Column-major: W̄ᵀ (nout × nin) += z̄ᵀ (nout × n) · x (n × nin), where
    // x is the transposed read of its row-major buffer.
    let gw = (c.at(grad, l.w), nout);
    c.gemm::<T>(
        false,
        true,
        (nout, nin, n),
        (c.addr(&zbar), nout),
        (c.at(i.x, rows.start * nin), nin),
        T::one(),
        gw,
    );
    c.gemm::<T>(
        false,
        true,
        (nout, nin, n),
        (c.addr(&zdbar), nout),
        (xd, nin),
        T::one(),
        gw,
    );
    // b̄ and īdt: the chunk partials in chunk order.
    launch!(
        c,
        &name::<T>("dense_dual_finish"),
        grid(nout, 64),
        [
            u,
            c.addr(&part_b),
            part_idt_addr,
            c.at(grad, l.b),
            l.idt.map_or(0, |o| c.at(grad, o))
        ]
    );
    if let Some((xb, xdb)) = xbar {
        input_adjoint(c, l, p, &rows, c.addr(&zbar), i.ybar, xb);
        input_adjoint(c, l, p, &rows, c.addr(&zdbar), i.ydotbar, xdb);
    }
}

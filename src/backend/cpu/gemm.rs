//! The CPU backend's GEMMs, without packing. The matrices are small: a few hundred rows by
//! 25–100 columns in the embedding nets, 64–512 rows by 240–1600 in the fitting nets.
//! `matrixmultiply` packs both operands on every call, which cost nearly half as much as its
//! multiply kernel in the embedding (a `perf` profile of the water example: 12.6% packing next
//! to 28.9% kernel), and split over threads by rows of C every thread packed all of B again.
//! This kernel reads B's rows in place (contiguous in every product the step makes: W itself,
//! the small transposed activations, or the output adjoints) and broadcasts A's elements, with
//! a block of C of [`MR`] rows by two SIMD vectors in registers; compiled inside
//! [`super::simd::wide`] it is AVX-512 (or AVX2) FMA code.
//!
//! It gives the same bits as `matrixmultiply`: each element is Σ_p a·b accumulated by fused
//! multiply-adds in order of p, from zero, in blocks of [`KC`] values of p (matrixmultiply's
//! depth blocking), each block's sum added to C. So a step is the same whichever does it, and
//! whatever the blocking or the number of threads.

use std::mem::size_of;
use std::ops::Range;

use rayon::prelude::*;

use super::simd;
use crate::backend::Real;

/// matrixmultiply's depth block (`D_KC` = `S_KC` = 256).
const KC: usize = 256;
/// Rows of C per register block (then blocks of 2 and 1 row for the rest). With six rows,
/// LLVM kept a 6 × 16 block of f32 in memory, not in registers (20× slower).
const MR: usize = 4;
/// Above this many bytes, a depth block of B no longer stays in L2 (1 MiB a core here; a
/// quarter of it, so that A's rows and C fit beside) while the row blocks of A sweep it: then C is done in chunks of columns that fit. (Column
/// panels of two vectors, each under a sweep of all of A, made the fitting nets' z̄·Wᵀ at
/// batch 4 read W 24 times over: 8 GFLOP/s.)
const B_IN_L2: usize = 256 * 1024;
/// Fewest rows (or columns) of C per parallel task.
const MIN_PART: usize = 32;

/// `out[c][r] = x[r·rs + c]` for r < rows, c < cols.
pub(super) fn transpose<N: Copy>(x: &[N], rows: usize, cols: usize, rs: usize, out: &mut [N]) {
    for (r, xr) in x.chunks(rs).take(rows).enumerate() {
        for (c, &v) in xr[..cols].iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
}

/// The shape of a product C (+)= A·B: C `[m][n]` with rows `c_rs` apart, A `[m][k]` given by
/// strides, B `[k][n]` with rows `b_rs` apart; `acc` adds to C.
#[derive(Clone, Copy)]
pub struct Prod {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub b_rs: usize,
    pub c_rs: usize,
    pub acc: bool,
}

/// A matrix operand given by strides: element (i, p) is `v[i·rs + p·cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a, T> {
    pub v: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// The product's output: element (i, j) is `v[i·rs + j·cs]`, row-major (`cs` = 1) or
/// column-major (`rs` = 1).
pub(super) struct MatMut<'a, T> {
    pub v: &'a mut [T],
    pub rs: usize,
    pub cs: usize,
}

/// `c[i·n + j] = Σ_p a(i, p)·b[p·b_rs + j]` (or `+=` with `accumulate`) for i < m, j < n,
/// p < k: B's rows are contiguous with stride `b_rs`, C's with stride n. Serial, for callers
/// already inside a parallel task. Where the CPU has no FMA (wasm,
/// old x86) a multiply-add would be a slow library call, so matrixmultiply does it.
#[allow(clippy::too_many_arguments)]
pub(super) fn small_gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    accumulate: bool,
    c: &mut [T],
) {
    let p = Prod {
        m,
        k,
        n,
        b_rs,
        c_rs: n,
        acc: accumulate,
    };
    small_gemm_into(p, a, b, c);
}

/// [`small_gemm`] of shape `p`, into rows of C `p.c_rs` apart: a block of columns of a wider
/// matrix (DPA-1's q̂, k̂, v̂ side by side in one row per slot).
pub(super) fn small_gemm_into<T: Real>(p: Prod, a: Mat<T>, b: &[T], c: &mut [T]) {
    let c = MatMut {
        v: c,
        rs: p.c_rs,
        cs: 1,
    };
    small_gemm_to(p, a, b, c);
}

/// [`small_gemm`] of shape `p` into C given by strides (`p.c_rs` unread): the values or the
/// tangents of a matrix of duals in place.
pub(super) fn small_gemm_to<T: Real>(p: Prod, a: Mat<T>, b: &[T], c: MatMut<T>) {
    if let Some(p) = Problem::new(p.m, p.k, p.n, a, b, p.b_rs, p.acc, c) {
        p.run();
    }
}

/// How [`par_gemm`] multiplies each part.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kernel {
    /// This module's kernel, B read in place.
    InPlace,
    /// matrixmultiply, which packs both operands: faster where A is read down its columns
    /// with a long stride (xᵀ·z̄ of the fitting nets' weight gradients: 25 against 35 GFLOP/s
    /// for 1600 × 64 × 240 at one thread), and for the fitting nets' x·W (4–8% at one thread).
    Packed,
}

/// [`small_gemm`] with C given by strides, split over the rayon pool into one task per thread
/// (whole blocks of C's rows, or of its columns where there are more of them).
#[allow(clippy::too_many_arguments)]
pub(super) fn par_gemm<T: Real>(
    kernel: Kernel,
    m: usize,
    k: usize,
    n: usize,
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    accumulate: bool,
    c: MatMut<T>,
) {
    let Some(mut p) = Problem::new(m, k, n, a, b, b_rs, accumulate, c) else {
        return;
    };
    p.packed = kernel == Kernel::Packed;
    let by_rows = m >= n;
    let len = if by_rows { m } else { n };
    let parts = rayon::current_num_threads()
        .min(len.div_ceil(MIN_PART))
        .max(1);
    if parts == 1 {
        return p.run();
    }
    // Even parts, rounded to whole 4-row blocks or 16-column blocks (two vectors).
    let step = len
        .div_ceil(parts)
        .next_multiple_of(if by_rows { 4 } else { 16 });
    (0..len.div_ceil(step)).into_par_iter().for_each(|t| {
        let span = t * step..((t + 1) * step).min(len);
        let part = if by_rows { p.rows(span) } else { p.cols(span) };
        part.run()
    });
}

/// A checked product in raw form, so that parallel tasks can each write their own part of C.
#[derive(Clone, Copy)]
struct Problem<T> {
    m: usize,
    k: usize,
    n: usize,
    a: *const T,
    a_rs: usize,
    a_cs: usize,
    b: *const T,
    b_rs: usize,
    c: *mut T,
    c_rs: usize,
    c_cs: usize,
    accumulate: bool,
    packed: bool,
}

// SAFETY: the pointers come from the slices `Problem::new` checked, which outlive the call
// that made it; parallel tasks read A and B and write disjoint elements of C.
unsafe impl<T: Send> Send for Problem<T> {}
unsafe impl<T: Sync> Sync for Problem<T> {}

impl<T: Real> Problem<T> {
    /// Checks every index the product touches; `None` when there is nothing left to do (an
    /// empty C, or an empty sum, k = 0, which sets C to zero, or leaves it with `accumulate`,
    /// as BLAS does with β 0 or 1).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn new(
        m: usize,
        k: usize,
        n: usize,
        a: Mat<T>,
        b: &[T],
        b_rs: usize,
        accumulate: bool,
        c: MatMut<T>,
    ) -> Option<Self> {
        if m == 0 || n == 0 {
            return None;
        }
        // Distinct (i, j) must be distinct elements of C: parallel tasks write them.
        assert!((c.cs >= 1 && c.rs >= n * c.cs) || (c.rs == 1 && c.cs >= m));
        assert!((m - 1) * c.rs + (n - 1) * c.cs < c.v.len());
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        c.v[i * c.rs + j * c.cs] = T::zero();
                    }
                }
            }
            return None;
        }
        assert!((m - 1) * a.rs + (k - 1) * a.cs < a.v.len());
        assert!((k - 1) * b_rs + n <= b.len());
        Some(Problem {
            m,
            k,
            n,
            a: a.v.as_ptr(),
            a_rs: a.rs,
            a_cs: a.cs,
            b: b.as_ptr(),
            b_rs,
            c: c.v.as_mut_ptr(),
            c_rs: c.rs,
            c_cs: c.cs,
            accumulate,
            packed: false,
        })
    }

    /// The rows `span` of C.
    fn rows(self, span: Range<usize>) -> Self {
        debug_assert!(span.end <= self.m);
        Problem {
            m: span.len(),
            // SAFETY: within the checked A and C (span ⊂ 0..m).
            a: unsafe { self.a.add(span.start * self.a_rs) },
            c: unsafe { self.c.add(span.start * self.c_rs) },
            ..self
        }
    }

    /// The columns `span` of C.
    fn cols(self, span: Range<usize>) -> Self {
        debug_assert!(span.end <= self.n);
        Problem {
            n: span.len(),
            // SAFETY: within the checked B and C (span ⊂ 0..n).
            b: unsafe { self.b.add(span.start) },
            c: unsafe { self.c.add(span.start * self.c_cs) },
            ..self
        }
    }

    /// The whole product on this thread: the register-blocked kernel where the CPU has FMA
    /// (two vectors wide: 8 f64 or 16 f32 with AVX2, 16 f64 with AVX-512; 16 f32 there too, as
    /// a block of 4 × 32 is past what LLVM keeps in registers), matrixmultiply otherwise. One compiled kernel per type and instruction set, whatever calls it.
    fn run(self) {
        if !simd::fma() || self.packed {
            return self.fallback();
        }
        #[cfg(target_arch = "x86_64")]
        let vector = if simd::avx512() { 64 } else { 32 };
        #[cfg(not(target_arch = "x86_64"))]
        let vector = 32;
        simd::wide(
            #[inline(always)]
            || {
                // SAFETY: the bounds were checked in `new`, for this part in `rows`/`cols`.
                unsafe {
                    match 2 * vector / size_of::<T>() {
                        8 => self.depth_blocks::<8>(),
                        _ => self.depth_blocks::<16>(),
                    }
                }
            },
        )
    }

    /// matrixmultiply on the whole product; a column-major C is gathered into a row-major copy
    /// and back, so the arithmetic (β = 1 included) is the same.
    fn fallback(self) {
        let (m, k, n) = (self.m, self.k, self.n);
        let beta = if self.accumulate { T::one() } else { T::zero() };
        // SAFETY: the extents checked in `new` (for this part in `rows`/`cols`).
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(self.a, (m - 1) * self.a_rs + (k - 1) * self.a_cs + 1),
                std::slice::from_raw_parts(self.b, (k - 1) * self.b_rs + n),
            )
        };
        if self.c_cs == 1 {
            // SAFETY: C's extent, checked in `new` (for this part in `rows`/`cols`).
            let c = unsafe { std::slice::from_raw_parts_mut(self.c, (m - 1) * self.c_rs + n) };
            let (a_rs, a_cs, c_rs) = (self.a_rs as isize, self.a_cs as isize, self.c_rs as isize);
            let b_rs = self.b_rs as isize;
            return T::gemm(m, k, n, T::one(), a, a_rs, a_cs, b, b_rs, 1, beta, c, c_rs);
        }
        let at = |i: usize, j: usize| i * self.c_rs + j * self.c_cs;
        let mut c: Vec<T> = (0..m * n)
            .map(|e| unsafe { *self.c.add(at(e / n, e % n)) })
            .collect();
        T::gemm(
            m,
            k,
            n,
            T::one(),
            a,
            self.a_rs as isize,
            self.a_cs as isize,
            b,
            self.b_rs as isize,
            1,
            beta,
            &mut c,
            n as isize,
        );
        for (e, v) in c.into_iter().enumerate() {
            unsafe { *self.c.add(at(e / n, e % n)) = v };
        }
    }

    /// Depth blocks of KC, each over C in chunks of columns whose part of the depth block of B
    /// stays in L2 while the row blocks of A sweep it.
    #[inline(always)]
    unsafe fn depth_blocks<const W: usize>(self) {
        for p0 in (0..self.k).step_by(KC) {
            let kc = KC.min(self.k - p0);
            let add = self.accumulate || p0 > 0;
            let nc = (B_IN_L2 / (kc * size_of::<T>()) / W).max(1) * W;
            for j0 in (0..self.n).step_by(nc) {
                let part = self.cols(j0..(j0 + nc).min(self.n));
                part.row_blocks(
                    #[inline(always)]
                    |i, r| match r {
                        1 => part.col_blocks::<1, W>(i, p0, kc, add),
                        2 => part.col_blocks::<2, W>(i, p0, kc, add),
                        _ => part.col_blocks::<MR, W>(i, p0, kc, add),
                    },
                );
            }
        }
    }

    /// Calls `f(i, r)` for the row blocks of C: MR rows each, then 2 and 1. (Each caller's
    /// closure must be `#[inline(always)]`, or the kernel in it is compiled without FMA.)
    #[inline(always)]
    fn row_blocks(&self, mut f: impl FnMut(usize, usize)) {
        let mut i = 0;
        for r in [MR, 2, 1] {
            while i + r <= self.m {
                f(i, r);
                i += r;
                if r < MR {
                    break;
                }
            }
        }
    }

    /// The R rows at i over all columns: W at a time, then 16 (one AVX-512 vector of f32,
    /// where W is two: DPA-1's rows of H = 16), 4 and 1. Each element is the same chain of
    /// FMAs whatever its tile's width.
    #[inline(always)]
    unsafe fn col_blocks<const R: usize, const W: usize>(
        &self,
        i: usize,
        p0: usize,
        kc: usize,
        add: bool,
    ) {
        let mut j = 0;
        while j + W <= self.n {
            self.tile::<R, W>(i, j, p0, kc, add);
            j += W;
        }
        while W > 16 && j + 16 <= self.n {
            self.tile::<R, 16>(i, j, p0, kc, add);
            j += 16;
        }
        while j + 4 <= self.n {
            self.tile::<R, 4>(i, j, p0, kc, add);
            j += 4;
        }
        while j < self.n {
            self.tile::<R, 1>(i, j, p0, kc, add);
            j += 1;
        }
    }

    /// The R × W block of C at (i0, j0): its sums stay in registers over the depth block.
    /// (Indexed loops over the fixed R and W: each unrolls to its registers.)
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn tile<const R: usize, const W: usize>(
        &self,
        i0: usize,
        j0: usize,
        p0: usize,
        kc: usize,
        add: bool,
    ) {
        let a = self.a.add(i0 * self.a_rs + p0 * self.a_cs);
        let b = self.b.add(p0 * self.b_rs + j0);
        let mut acc = [[T::zero(); W]; R];
        for p in 0..kc {
            let br = &*(b.add(p * self.b_rs) as *const [T; W]);
            for r in 0..R {
                let av = *a.add(r * self.a_rs + p * self.a_cs);
                for q in 0..W {
                    acc[r][q] = av.mul_add(br[q], acc[r][q]);
                }
            }
        }
        let c = self.c.add(i0 * self.c_rs + j0 * self.c_cs);
        for (r, acc) in acc.iter().enumerate() {
            if self.c_cs == 1 {
                let cr = std::slice::from_raw_parts_mut(c.add(r * self.c_rs), W);
                if add {
                    cr.iter_mut().zip(acc).for_each(|(c, v)| *c += *v);
                } else {
                    cr.copy_from_slice(acc);
                }
            } else {
                for (q, v) in acc.iter().enumerate() {
                    let e = c.add(r * self.c_rs + q * self.c_cs);
                    *e = if add { *e + *v } else { *v };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{par_gemm, small_gemm, Kernel, Mat, MatMut};
    use crate::backend::Real;

    fn val<T: Real>(i: usize, s: f64) -> T {
        T::of(((i as f64 * s).sin() * 1.3) + 0.01 * i as f64 % 0.7)
    }

    /// Bit for bit what matrixmultiply gives, on the step's shapes (k across the depth block, m
    /// and n with remainders, B's depth block past L2), overwriting and accumulating, with A
    /// transposed and C row- or column-major, serial and split over threads.
    fn matches_matrixmultiply<T: Real>() {
        for &(m, k, n) in &[
            (7, 25, 50),
            (368, 50, 100),
            (50, 300, 100),
            (1, 600, 25),
            (5, 3, 9),
            (64, 1600, 240),
            (1600, 64, 240),
            (240, 240, 65),
            (3, 240, 1),
            (30, 4, 900),
            (240, 240, 700),
        ] {
            for &(transposed, acc) in &[(false, false), (true, true), (false, true)] {
                let a: Vec<T> = (0..m * k).map(|i| val(i, 0.37)).collect();
                let b: Vec<T> = (0..k * n).map(|i| val(i, 0.11)).collect();
                let c0: Vec<T> = (0..m * n).map(|i| val(i, 0.53)).collect();
                let (rs, cs) = if transposed { (1, m) } else { (k, 1) };
                let a = Mat { v: &a, rs, cs };
                let mut want = c0.clone();
                let beta = if acc { T::one() } else { T::zero() };
                T::gemm(
                    m,
                    k,
                    n,
                    T::one(),
                    a.v,
                    rs as isize,
                    cs as isize,
                    &b,
                    n as isize,
                    1,
                    beta,
                    &mut want,
                    n as isize,
                );
                let what = format!("m {m} k {k} n {n} transposed {transposed} acc {acc}");
                let mut got = c0.clone();
                small_gemm(m, k, n, a, &b, n, acc, &mut got);
                assert_eq!(got, want, "{what}");
                let mut par = c0.clone();
                let c = MatMut {
                    v: &mut par,
                    rs: n,
                    cs: 1,
                };
                par_gemm(Kernel::InPlace, m, k, n, a, &b, n, acc, c);
                assert_eq!(par, want, "{what}");
                let mut packed = c0.clone();
                let c = MatMut {
                    v: &mut packed,
                    rs: n,
                    cs: 1,
                };
                par_gemm(Kernel::Packed, m, k, n, a, &b, n, acc, c);
                assert_eq!(packed, want, "{what}, packed");
                // Column-major C: the same product written transposed.
                let mut ct: Vec<T> = (0..m * n).map(|e| c0[(e % m) * n + e / m]).collect();
                let c = MatMut {
                    v: &mut ct,
                    rs: 1,
                    cs: m,
                };
                par_gemm(Kernel::InPlace, m, k, n, a, &b, n, acc, c);
                let back: Vec<T> = (0..m * n).map(|e| ct[(e % n) * m + e / n]).collect();
                assert_eq!(back, want, "{what}, C column-major");
            }
        }
    }

    #[test]
    fn matches_matrixmultiply_bitwise_f64() {
        matches_matrixmultiply::<f64>();
    }

    #[test]
    fn matches_matrixmultiply_bitwise_f32() {
        matches_matrixmultiply::<f32>();
    }

    /// An empty sum zeroes C, or leaves it with `accumulate`.
    #[test]
    fn empty_depth() {
        for acc in [false, true] {
            let mut c = vec![2.0f64; 6];
            let c_ = MatMut {
                v: &mut c,
                rs: 1,
                cs: 2,
            };
            let a = Mat {
                v: &[],
                rs: 0,
                cs: 1,
            };
            par_gemm(Kernel::InPlace, 2, 0, 3, a, &[], 3, acc, c_);
            assert_eq!(c, vec![if acc { 2.0 } else { 0.0 }; 6]);
        }
    }
}

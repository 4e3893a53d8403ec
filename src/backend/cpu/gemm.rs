//! The small GEMMs of the fused embedding nets, without packing. A task's matrices are a few
//! hundred rows by 25–100 columns; `matrixmultiply` packs both operands on every call, which
//! cost nearly half as much as its multiply kernel here (a `perf` profile of the water
//! example: 12.6% packing next to 28.9% kernel). This kernel reads B's rows in place (they are
//! contiguous in every product the embedding makes, W itself or its transpose made once per
//! task) and broadcasts A's elements, with an MR × NR block of C in registers; compiled
//! inside [`super::simd::wide`] it is AVX-512 (or AVX2) FMA code.
//!
//! It gives the same bits as `matrixmultiply`: each element is Σ_p a·b accumulated by fused
//! multiply-adds in order of p, from zero, in blocks of [`KC`] values of p (matrixmultiply's
//! depth blocking), each block's sum added to C. So a step is the same whichever does it.

use crate::backend::Real;

/// matrixmultiply's depth block (`D_KC` = `S_KC` = 256).
const KC: usize = 256;
/// Rows of C per register block.
const MR: usize = 4;
/// Columns of C per register block: two AVX-512 vectors of f64, one of f32.
const NR: usize = 16;

/// A matrix operand given by strides: element (i, p) is `v[i·rs + p·cs]`.
#[derive(Clone, Copy)]
pub(super) struct Mat<'a, T> {
    pub v: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// `c[i·n + j] = Σ_p a(i, p)·b[p·b_rs + j]` (or `+=` with `accumulate`) for i < m, j < n,
/// p < k: B's rows are contiguous with stride `b_rs`, C's with stride n. Where the CPU has no
/// FMA (wasm, old x86) a multiply-add would be a slow library call, so matrixmultiply does it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
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
    if super::simd::fma() {
        gemm(m, k, n, a, b, b_rs, accumulate, c);
    } else {
        let beta = if accumulate { T::one() } else { T::zero() };
        let (rs, cs) = (a.rs as isize, a.cs as isize);
        T::gemm(
            m,
            k,
            n,
            T::one(),
            a.v,
            rs,
            cs,
            b,
            b_rs as isize,
            1,
            beta,
            c,
            n as isize,
        );
    }
}

/// [`small_gemm`]'s own kernel, any CPU.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    accumulate: bool,
    c: &mut [T],
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= m * n);
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(T::zero());
        }
        return;
    }
    assert!((m - 1) * a.rs + (k - 1) * a.cs < a.v.len());
    assert!((k - 1) * b_rs + n <= b.len());
    for k0 in (0..k).step_by(KC) {
        let depth = k0..(k0 + KC).min(k);
        let add = accumulate || k0 > 0;
        let mut i = 0;
        while i + MR <= m {
            rows::<T, MR>(i, depth.clone(), n, a, b, b_rs, add, c);
            i += MR;
        }
        while i < m {
            rows::<T, 1>(i, depth.clone(), n, a, b, b_rs, add, c);
            i += 1;
        }
    }
}

/// Rows `i0..i0 + R` of C over the depth range `ps`, NR columns at a time.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rows<T: Real, const R: usize>(
    i0: usize,
    ps: std::ops::Range<usize>,
    n: usize,
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    add: bool,
    c: &mut [T],
) {
    let mut j = 0;
    while j + NR <= n {
        block::<T, R, NR>(i0, j, ps.clone(), n, a, b, b_rs, add, c);
        j += NR;
    }
    // The remaining columns in blocks of 4, then one by one (n is 25, 50 or 100 here).
    while j + 4 <= n {
        block::<T, R, 4>(i0, j, ps.clone(), n, a, b, b_rs, add, c);
        j += 4;
    }
    while j < n {
        block::<T, R, 1>(i0, j, ps.clone(), n, a, b, b_rs, add, c);
        j += 1;
    }
}

/// The R × W block of C at (i0, j0): its sums stay in registers over the whole depth range.
/// (Indexed loops over the fixed R and W: each unrolls to its registers.)
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
fn block<T: Real, const R: usize, const W: usize>(
    i0: usize,
    j0: usize,
    ps: std::ops::Range<usize>,
    n: usize,
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    add: bool,
    c: &mut [T],
) {
    let mut acc = [[T::zero(); W]; R];
    for p in ps {
        // SAFETY: p < k, j0 + W ≤ n and i0 + r < m: within the bounds `gemm` checked.
        let br: &[T; W] = unsafe { &*(b.as_ptr().add(p * b_rs + j0) as *const [T; W]) };
        for r in 0..R {
            let av = unsafe { *a.v.get_unchecked((i0 + r) * a.rs + p * a.cs) };
            for q in 0..W {
                acc[r][q] = av.mul_add(br[q], acc[r][q]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let cr = &mut c[(i0 + r) * n + j0..(i0 + r) * n + j0 + W];
        if add {
            cr.iter_mut().zip(acc).for_each(|(c, v)| *c += *v);
        } else {
            cr.copy_from_slice(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{gemm, Mat};
    use crate::backend::Real;

    /// Bit for bit what matrixmultiply gives, on the embedding's shapes (k across the depth
    /// block, m and n with remainders), overwriting and accumulating, with A transposed.
    #[test]
    fn matches_matrixmultiply_bitwise() {
        let val = |i: usize, s: f64| ((i as f64 * s).sin() * 1.3) + 0.01 * i as f64 % 0.7;
        for &(m, k, n) in &[
            (7, 25, 50),
            (368, 50, 100),
            (50, 300, 100),
            (1, 600, 25),
            (5, 3, 9),
        ] {
            for &(transposed, acc) in &[(false, false), (true, true), (false, true)] {
                let a: Vec<f64> = (0..m * k).map(|i| val(i, 0.37)).collect();
                let b: Vec<f64> = (0..k * n).map(|i| val(i, 0.11)).collect();
                let c0: Vec<f64> = (0..m * n).map(|i| val(i, 0.53)).collect();
                let (rs, cs) = if transposed { (1, m) } else { (k, 1) };
                let mut want = c0.clone();
                let beta = if acc { 1.0 } else { 0.0 };
                f64::gemm(
                    m,
                    k,
                    n,
                    1.0,
                    &a,
                    rs as isize,
                    cs as isize,
                    &b,
                    n as isize,
                    1,
                    beta,
                    &mut want,
                    n as isize,
                );
                let mut got = c0.clone();
                super::super::simd::wide(
                    #[inline(always)]
                    || gemm(m, k, n, Mat { v: &a, rs, cs }, &b, n, acc, &mut got),
                );
                assert_eq!(
                    got, want,
                    "m {m} k {k} n {n} transposed {transposed} acc {acc}"
                );
                let mut scalar = c0.clone();
                gemm(m, k, n, Mat { v: &a, rs, cs }, &b, n, acc, &mut scalar);
                assert_eq!(scalar, want);
            }
        }
    }
}

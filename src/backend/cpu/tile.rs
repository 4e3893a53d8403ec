//! Register tiles for the embedding nets' products: C = A·B computed in blocks of R rows of C
//! by W columns whose sums stay in registers over the whole depth, each block handed to an
//! [`Epilogue`] while it is still in registers. The forward layer's epilogue applies tanh and
//! builds the next layer's input there, so a layer's rows are written once instead of being
//! written by the GEMM and read back by the elementwise passes.
//!
//! The tile's width is two vectors of the widest unit the CPU has (AVX-512 or AVX2) and R = 6
//! rows, so the 12 accumulators fit the register file (16 vector registers on AVX2, where
//! [`super::gemm`]'s 4 × 16 f64 block spills to the stack). Each element is the same sum as
//! [`super::gemm`] makes, fused multiply-adds in order of p from zero, so the blocking changes
//! no bit. Only for CPUs with FMA: the callers keep the layered path for the others.

use std::ops::Range;

use super::gemm::Mat;
use crate::backend::Real;

/// matrixmultiply's depth block, as in [`super::gemm`]: the sums of longer products are made
/// per block of this many terms and added to C.
pub(super) const KC: usize = 256;

/// Rows of C per tile.
pub(super) const R: usize = 6;

/// What to do with a tile's sums: `acc[i][q]` is C's element (rows\[i\], j0 + q).
pub(super) trait Epilogue<T> {
    /// Whether the tiles one vector wide (H) run after the two-vector ones.
    const HALF: bool = true;
    fn tile<const N: usize, const W: usize>(
        &mut self,
        rows: [usize; N],
        j0: usize,
        acc: &[[T; W]; N],
    );
}

/// The sums Σ_{p ∈ ps} a(rows\[i\], p)·b\[p·b_rs + j0 + q\] of one tile.
///
/// # Safety
/// Every a(rows\[i\], p) and b\[p·b_rs + j0 .. p·b_rs + j0 + W\] for p in ps is in bounds.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<T: Real, const N: usize, const W: usize>(
    a: Mat<T>,
    rows: [usize; N],
    b: &[T],
    b_rs: usize,
    j0: usize,
    ps: Range<usize>,
) -> [[T; W]; N] {
    let mut acc = [[T::zero(); W]; N];
    for p in ps {
        // SAFETY: in bounds by the caller's promise.
        let br: &[T; W] = unsafe { &*(b.as_ptr().add(p * b_rs + j0) as *const [T; W]) };
        for i in 0..N {
            let av = unsafe { *a.v.get_unchecked(rows[i] * a.rs + p * a.cs) };
            for q in 0..W {
                acc[i][q] = av.mul_add(br[q], acc[i][q]);
            }
        }
    }
    acc
}

/// All of C's columns `0..n` for the rows `rows`: tiles W wide, then H (half of W, one vector),
/// 8, 4 and 1 wide.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn columns<T: Real, E: Epilogue<T>, const N: usize, const W: usize, const H: usize>(
    rows: [usize; N],
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    n: usize,
    ps: Range<usize>,
    e: &mut E,
) {
    if ps.is_empty() || n == 0 {
        return;
    }
    let last = rows.iter().max().copied().unwrap_or(0) * a.rs + (ps.end - 1) * a.cs;
    assert!(last < a.v.len() && (ps.end - 1) * b_rs + n <= b.len());
    let mut j = 0;
    // SAFETY (each tile): rows and ps within A (checked above), j + width ≤ n within B's rows.
    while j + W <= n {
        e.tile(rows, j, &unsafe {
            tile::<T, N, W>(a, rows, b, b_rs, j, ps.clone())
        });
        j += W;
    }
    // Where H is 8 or less, the next loop does its work.
    while H > 8 && E::HALF && j + H <= n {
        e.tile(rows, j, &unsafe {
            tile::<T, N, H>(a, rows, b, b_rs, j, ps.clone())
        });
        j += H;
    }
    while j + 8 <= n {
        e.tile(rows, j, &unsafe {
            tile::<T, N, 8>(a, rows, b, b_rs, j, ps.clone())
        });
        j += 8;
    }
    while j + 4 <= n {
        e.tile(rows, j, &unsafe {
            tile::<T, N, 4>(a, rows, b, b_rs, j, ps.clone())
        });
        j += 4;
    }
    while j < n {
        e.tile(rows, j, &unsafe {
            tile::<T, N, 1>(a, rows, b, b_rs, j, ps.clone())
        });
        j += 1;
    }
}

/// Whether the tiles are AVX-512 wide.
fn wide512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// n rounded up to whole vectors of T (16 f32 or 8 f64 with AVX-512, half that without). A B
/// whose rows are that long (zero or anything past n) lets a row of C end in a vector tile whose
/// extra columns the epilogue drops: a row of 50 would otherwise end in one-column tiles, each
/// six scalar chains of FMAs bound by the FMA's latency, as slow as a whole vector tile.
pub(super) fn padded<T>(n: usize) -> usize {
    let bytes = if wide512() { 64 } else { 32 };
    n.next_multiple_of(bytes / std::mem::size_of::<T>())
}

/// The tiles of rows `rows` of C = A·B over the depth range `ps` (B's rows contiguous, stride
/// `b_rs`, n columns), each handed to `e`; the tile width is picked for the CPU and T.
#[inline(always)]
pub(super) fn row_tiles<T: Real, E: Epilogue<T>, const N: usize>(
    rows: [usize; N],
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    n: usize,
    ps: Range<usize>,
    e: &mut E,
) {
    match (wide512(), std::mem::size_of::<T>() == 8) {
        (true, true) => columns::<T, E, N, 16, 8>(rows, a, b, b_rs, n, ps, e),
        (true, false) => columns::<T, E, N, 32, 16>(rows, a, b, b_rs, n, ps, e),
        (false, true) => columns::<T, E, N, 8, 4>(rows, a, b, b_rs, n, ps, e),
        (false, false) => columns::<T, E, N, 16, 8>(rows, a, b, b_rs, n, ps, e),
    }
}

/// Writes (or adds) each tile into a row-major C of n columns; a tile reaching past n (into B's
/// row padding) leaves its extra columns out.
struct Store<'a, T> {
    c: &'a mut [T],
    n: usize,
    add: bool,
}

impl<T: Real> Store<'_, T> {
    #[inline(always)]
    fn rows<const N: usize, const W: usize>(
        &mut self,
        rows: [usize; N],
        j0: usize,
        w: usize,
        acc: &[[T; W]; N],
    ) {
        for (&r, acc) in rows.iter().zip(acc) {
            let (cr, acc) = (&mut self.c[r * self.n + j0..r * self.n + j0 + w], &acc[..w]);
            if self.add {
                cr.iter_mut().zip(acc).for_each(|(c, v)| *c += *v);
            } else {
                cr.copy_from_slice(acc);
            }
        }
    }
}

impl<T: Real> Epilogue<T> for Store<'_, T> {
    #[inline(always)]
    fn tile<const N: usize, const W: usize>(
        &mut self,
        rows: [usize; N],
        j0: usize,
        acc: &[[T; W]; N],
    ) {
        // Only the last tile of a padded B is partial; for the others W stays a constant.
        if j0 + W <= self.n {
            self.rows(rows, j0, W, acc);
        } else {
            self.rows(rows, j0, self.n - j0, acc);
        }
    }
}

/// `c[i·n + j] = Σ_p a(i, p)·b[p·b_rs + j]` (or `+=` with `accumulate`), as
/// [`super::gemm::small_gemm`] and with its bits, in this module's tiles where the CPU has FMA.
/// Where B's rows are [`padded`] (b_rs ≥ padded(n), whatever the padding holds), the tiles run
/// on to the padded width and drop the columns past n.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<T>,
    b: &[T],
    b_rs: usize,
    accumulate: bool,
    c: &mut [T],
) {
    if !super::simd::fma() || k == 0 {
        super::gemm::small_gemm(m, k, n, a, b, b_rs, accumulate, c);
        return;
    }
    assert!(c.len() >= m * n);
    let np = padded::<T>(n);
    let nt = if b_rs >= np && (k - 1) * b_rs + np <= b.len() {
        np
    } else {
        n
    };
    for k0 in (0..k).step_by(KC) {
        let ps = k0..(k0 + KC).min(k);
        let mut e = Store {
            c: &mut *c,
            n,
            add: accumulate || k0 > 0,
        };
        let mut i = 0;
        while i + R <= m {
            row_tiles(
                std::array::from_fn::<usize, R, _>(|q| i + q),
                a,
                b,
                b_rs,
                nt,
                ps.clone(),
                &mut e,
            );
            i += R;
        }
        // The rows left over in one tile: single-row tiles would each run two or three
        // chains of FMAs, bound by the FMA's latency rather than its throughput.
        match m - i {
            0 => {}
            1 => row_tiles([i], a, b, b_rs, nt, ps, &mut e),
            2 => row_tiles([i, i + 1], a, b, b_rs, nt, ps, &mut e),
            3 => row_tiles([i, i + 1, i + 2], a, b, b_rs, nt, ps, &mut e),
            4 => row_tiles([i, i + 1, i + 2, i + 3], a, b, b_rs, nt, ps, &mut e),
            5 => row_tiles([i, i + 1, i + 2, i + 3, i + 4], a, b, b_rs, nt, ps, &mut e),
            _ => unreachable!("fewer than R = 6 rows are left"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{gemm, padded, Mat};
    use crate::backend::cpu::simd::wide;

    /// With B's rows padded (NaN in the padding), the tiles run into the padding and drop it:
    /// the same bits as the layered GEMM on the real columns, and C past n untouched.
    #[test]
    fn padded_rows_give_the_same_bits() {
        for &(m, k, n) in &[(25, 40, 50), (1, 30, 25), (50, 12, 100), (7, 5, 9)] {
            let st = padded::<f32>(n);
            assert!(st >= n && st.is_multiple_of(4));
            let b: Vec<f32> = (0..k * st)
                .map(|i| {
                    if i % st < n {
                        (i as f32 * 0.37).sin()
                    } else {
                        f32::NAN
                    }
                })
                .collect();
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.11).cos()).collect();
            let a = Mat {
                v: &a,
                rs: k,
                cs: 1,
            };
            let (mut want, mut got) = (vec![0.5f32; m * n + 3], vec![0.5f32; m * n + 3]);
            wide(
                #[inline(always)]
                || {
                    super::super::gemm::small_gemm(m, k, n, a, &b, st, true, &mut want);
                    gemm(m, k, n, a, &b, st, true, &mut got);
                },
            );
            assert_eq!(got, want, "m {m} k {k} n {n}");
        }
    }

    /// The same bits as the layered GEMM, on the embedding's shapes, overwriting and
    /// accumulating, with A transposed.
    #[test]
    fn matches_small_gemm_bitwise() {
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
                let a = Mat { v: &a, rs, cs };
                let mut want = c0.clone();
                wide(
                    #[inline(always)]
                    || super::super::gemm::small_gemm(m, k, n, a, &b, n, acc, &mut want),
                );
                let mut got = c0.clone();
                wide(
                    #[inline(always)]
                    || gemm(m, k, n, a, &b, n, acc, &mut got),
                );
                assert_eq!(
                    got, want,
                    "m {m} k {k} n {n} transposed {transposed} acc {acc}"
                );
                let f32s = |v: &[f64]| v.iter().map(|x| *x as f32).collect::<Vec<f32>>();
                let (a32, b32) = (f32s(a.v), f32s(&b));
                let a32 = Mat { v: &a32, rs, cs };
                let (mut want32, mut got32) = (f32s(&c0), f32s(&c0));
                wide(
                    #[inline(always)]
                    || super::super::gemm::small_gemm(m, k, n, a32, &b32, n, acc, &mut want32),
                );
                wide(
                    #[inline(always)]
                    || gemm(m, k, n, a32, &b32, n, acc, &mut got32),
                );
                assert_eq!(got32, want32);
            }
        }
    }
}

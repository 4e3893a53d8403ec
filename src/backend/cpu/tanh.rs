//! tanh over slices and rows, written so the compiler vectorises it: libm's scalar tanh was the largest
//! single cost of the embedding nets. Accurate to a few ulp in f64.
//!
//! The functions work on one row of W values at a time (two or more vectors), each value
//! exactly as the scalar formula would compute it. They once took blocks of three rows, one
//! formula step for the whole block at a time; LLVM then vectorised across the rows (three
//! lanes of four, through gathers and scatters), which made the embedding's tanh 2.3× slower
//! than calling them row after row, whose independent chains the out-of-order core overlaps
//! as well.

use super::exp::{expm1_pos, expm1_pos32};
use super::simd::{map, rows_apart, Row};
use crate::backend::Real;

/// tanh of each value as t/(t + 2) with t = e^{2|x|} − 1, sign restored: one formula over the
/// whole range, within 3 ulp (libm's tanh as the reference). It replaced Cephes' rational
/// approximation below 0.625 with 1 − 2/(e^{2|x|} + 1) above, which evaluated both branches
/// for every value: half the operations, the embedding's tanh 1.9× faster.
#[inline(always)]
pub fn tanh64_row<const W: usize>(x: &Row<f64, W>) -> Row<f64, W> {
    // tanh(20) rounds to 1, and e^40 is far from overflow; a NaN stays NaN (`f64::min` would
    // take the 20).
    let t = expm1_pos::<W>(&map(|q| {
        let a = x[q].abs();
        2.0 * if a > 20.0 { 20.0 } else { a }
    }));
    map(|q| (t[q] / (t[q] + 2.0)).copysign(x[q]))
}

/// tanh of each value in f32 as [`tanh64_row`] does in f64, t/(t + 2) with t = e^{2|x|} − 1:
/// within 2 ulp (1.75 at worst), at twice the lanes of going through f64 (float32 training's
/// embedding tanh). It replaced Cephes' tanhf, whose two branches (a polynomial below 0.625)
/// were both evaluated for every value: a third fewer operations.
#[inline(always)]
pub fn tanh32_row<const W: usize>(x: &Row<f32, W>) -> Row<f32, W> {
    // tanh(10) rounds to 1 in f32; a NaN stays NaN.
    let t = expm1_pos32::<W>(&map(|q| {
        let a = x[q].abs();
        2.0 * if a > 10.0 { 10.0 } else { a }
    }));
    map(|q| (t[q] / (t[q] + 2.0)).copysign(x[q]))
}

/// tanh of each value in T's own arithmetic: [`tanh32_row`] for f32, else
/// [`tanh64_row`].
#[inline(always)]
pub fn tanh_row<T: Real, const W: usize>(x: &mut Row<T, W>) {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32, so the row is one of f32.
        let x = unsafe { &mut *(x as *mut Row<T, W> as *mut Row<f32, W>) };
        *x = tanh32_row(x);
    } else {
        let y = tanh64_row::<W>(&map(|q| x[q].f64()));
        *x = map(|q| T::of(y[q]));
    }
}

/// `x[i] = tanh(x[i])`, in the widest instruction set the CPU has (a block's activations on
/// the tape).
pub fn tanh_in_place<T: Real>(x: &mut [T]) {
    super::simd::wide(
        #[inline(always)]
        || {
            // One row of the whole slice: [`tanh_bias_in`] of a zero bias would turn −0 to +0.
            const W: usize = 16;
            let mut xs = x.chunks_exact_mut(W);
            for xc in &mut xs {
                rows_apart();
                let mut v: Row<T, W> = map(|q| xc[q]);
                tanh_row(&mut v);
                xc.copy_from_slice(&v);
            }
            let xr = xs.into_remainder();
            let mut v: Row<T, W> = map(|q| xr.get(q).copied().unwrap_or(T::zero()));
            tanh_row(&mut v);
            let n = xr.len();
            xr.copy_from_slice(&v[..n]);
        },
    )
}

/// `x[i] = tanh(x[i] + b[i % b.len()])` for a row-major block whose rows have `b.len()` values.
#[inline(always)]
pub fn tanh_bias<T: Real>(x: &mut [T], b: &[T]) {
    // Two AVX-512 vectors (four of AVX2) at a time.
    if std::mem::size_of::<T>() == 4 {
        tanh_bias_in::<T, 32>(x, b);
    } else {
        tanh_bias_in::<T, 16>(x, b);
    }
}

/// [`tanh_bias`] in rows of W values.
#[inline(always)]
fn tanh_bias_in<T: Real, const W: usize>(x: &mut [T], b: &[T]) {
    for row in x.chunks_mut(b.len()) {
        let mut xs = row.chunks_exact_mut(W);
        let mut bs = b.chunks_exact(W);
        for (xc, bc) in (&mut xs).zip(&mut bs) {
            rows_apart();
            let mut v: Row<T, W> = map(|q| xc[q] + bc[q]);
            tanh_row(&mut v);
            xc.copy_from_slice(&v);
        }
        // The rest of the row (9 of the first embedding layer's 25 values) as one zero-padded
        // row, not value by value: each value is its own lane, so the bits are the same.
        let (xr, br) = (xs.into_remainder(), bs.remainder());
        if !xr.is_empty() {
            let mut v: Row<T, W> = map(|q| {
                if q < xr.len() {
                    xr[q] + br[q]
                } else {
                    T::zero()
                }
            });
            tanh_row(&mut v);
            xr.copy_from_slice(&v[..xr.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{tanh32_row, tanh64_row, tanh_bias, tanh_row};

    fn tanh64(x: f64) -> f64 {
        tanh64_row(&[x])[0]
    }

    fn tanh32(x: f32) -> f32 {
        tanh32_row(&[x])[0]
    }

    /// `tanh_bias` on rows whose length is not a multiple of the vector (the first embedding
    /// layer's 25): every value is the scalar function's, the padded rest of a row included.
    #[test]
    fn bias_rows_match_single_values() {
        let b: Vec<f64> = (0..25).map(|q| q as f64 * 0.11 - 1.2).collect();
        let x: Vec<f64> = (0..75).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        let (mut r, mut r32) = (x.clone(), x.iter().map(|v| *v as f32).collect::<Vec<_>>());
        let b32: Vec<f32> = b.iter().map(|v| *v as f32).collect();
        super::super::simd::wide(
            #[inline(always)]
            || {
                tanh_bias(&mut r, &b);
                tanh_bias(&mut r32, &b32);
            },
        );
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(r[i].to_bits(), tanh64(v + b[i % 25]).to_bits());
            assert_eq!(r32[i].to_bits(), tanh32(v as f32 + b32[i % 25]).to_bits());
        }
    }

    /// A row's values are each the scalar function's, in the wide versions too.
    #[test]
    fn rows_match_single_values() {
        let x: [f64; 24] = std::array::from_fn(|q| q as f64 * 0.37 - 4.3);
        let (mut r, mut r32) = (x, x.map(|v| v as f32));
        super::super::simd::wide(
            #[inline(always)]
            || {
                tanh_row(&mut r);
                tanh_row(&mut r32);
            },
        );
        for (q, &v) in x.iter().enumerate() {
            assert_eq!(r[q].to_bits(), tanh64(v).to_bits());
            assert_eq!(r32[q].to_bits(), tanh32(v as f32).to_bits());
        }
    }

    #[test]
    fn f32_within_two_ulp() {
        let mut worst = 0.0f64;
        let small = (1..100_000).map(|i| i as f32 * 1.3e-6);
        for x in (-400_000..=400_000)
            .map(|i| i as f32 * 4.1e-5 + 1e-7)
            .chain(small)
        {
            let exact = (x as f64).tanh();
            let ulp = f64::from(f32::EPSILON) * exact.abs().max(f64::from(f32::MIN_POSITIVE));
            worst = worst.max((f64::from(tanh32(x)) - exact).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(tanh32(0.0), 0.0);
        assert_eq!(tanh32(30.0), 1.0);
        assert_eq!(tanh32(-1e30), -1.0);
        assert_eq!(tanh32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh32(1e-30), 1e-30);
        assert!(tanh32(f32::NAN).is_nan());
        assert_eq!(tanh32(f32::INFINITY), 1.0);
    }

    #[test]
    fn agrees_with_libm_to_a_few_ulp() {
        let mut worst = 0.0f64;
        for i in -200_000..=200_000 {
            let x = i as f64 * 1.7e-4 + 1e-9;
            let (a, b) = (tanh64(x), x.tanh());
            worst = worst.max((a - b).abs() / b.abs().max(f64::MIN_POSITIVE));
        }
        assert!(worst < 3.0 * f64::EPSILON, "worst relative error {worst}");
        assert_eq!(tanh64(0.0), 0.0);
        assert_eq!(tanh64(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(tanh64(1e-300), 1e-300);
        assert!(tanh64(f64::NAN).is_nan());
        assert_eq!(tanh64(f64::INFINITY), 1.0);
        assert_eq!(tanh64(50.0), 1.0);
        assert_eq!(tanh64(-1e3), -1.0);
    }
}

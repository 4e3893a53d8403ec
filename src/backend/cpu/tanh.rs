//! tanh over slices and blocks, written so the compiler vectorises it: libm's scalar tanh was the largest
//! single cost of the embedding nets. Accurate to a few ulp in f64.

use crate::backend::Real;

/// An H × W block of values: the functions below compute each value exactly as the scalar
/// formula would, one step at a time for the whole block, so that the block's independent
/// chains of the long polynomials run side by side instead of each waiting on its latency.
type Block<F, const H: usize, const W: usize> = [[F; W]; H];

/// The block whose values are `f(i, q)`.
#[inline(always)]
fn map<F: Copy + Default, const H: usize, const W: usize>(
    f: impl Fn(usize, usize) -> F,
) -> Block<F, H, W> {
    let mut o = [[F::default(); W]; H];
    for (i, row) in o.iter_mut().enumerate() {
        for (q, v) in row.iter_mut().enumerate() {
            *v = f(i, q);
        }
    }
    o
}

/// e^y for 0 ≤ y ≤ 90: y = k ln2 + r with |r| ≤ ln2/2, e^r by its Taylor series to degree 13
/// (remainder < 4e-18), then scaled by 2^k through the exponent bits.
#[inline(always)]
fn exp_pos<const H: usize, const W: usize>(y: &Block<f64, H, W>) -> Block<f64, H, W> {
    // ln 2 split in two (fdlibm's constants): k·LN2_HI is exact for the k that occur here.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    // Round to nearest through the 1.5·2⁵² shift: unlike f64::round it needs no SSE4.1, so the
    // loop vectorises on the x86-64 baseline.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    let shifted: Block<f64, H, W> = map(|i, q| y[i][q] * std::f64::consts::LOG2_E + SHIFT);
    let k: Block<f64, H, W> = map(|i, q| shifted[i][q] - SHIFT);
    let r: Block<f64, H, W> = map(|i, q| (y[i][q] - k[i][q] * LN2_HI) - k[i][q] * LN2_LO);
    let mut p = [[1.0 / 6_227_020_800.0; W]; H];
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = map(|i, q| p[i][q] * r[i][q] + c);
    }
    // 2^k from the bits of k + 1.5·2⁵², whose last bits are k: an integer subtraction where
    // `k as i64` would need AVX-512's f64 → i64 conversion (AVX2 does it lane by lane).
    map(|i, q| {
        let two_k = shifted[i][q]
            .to_bits()
            .wrapping_sub(SHIFT.to_bits())
            .wrapping_add(1023)
            << 52;
        p[i][q] * f64::from_bits(two_k)
    })
}

/// Cephes' tanh of each value: a rational approximation below 0.625, 1 − 2/(e^{2|x|} + 1)
/// above.
#[inline(always)]
pub fn tanh64_block<const H: usize, const W: usize>(x: &Block<f64, H, W>) -> Block<f64, H, W> {
    let a: Block<f64, H, W> = map(|i, q| x[i][q].abs());
    let z: Block<f64, H, W> = map(|i, q| x[i][q] * x[i][q]);
    let p: Block<f64, H, W> = map(|i, q| {
        let z = z[i][q];
        (-9.643_991_794_250_523e-1 * z - 9.928_772_310_019_186e1) * z - 1.614_687_684_417_084_5e3
    });
    let den: Block<f64, H, W> = map(|i, q| {
        let z = z[i][q];
        ((z + 1.128_116_784_916_329_3e2) * z + 2.235_488_390_601_004_6e3) * z
            + 4.844_063_053_251_255e3
    });
    let e1 = exp_pos::<H, W>(&map(|i, q| 2.0 * a[i][q].min(40.0)));
    // small = x + (x·z·p)/q, large = ±(1 − 2/(e^{2|x|} + 1)): the two quotients are picked
    // before the one division (divisions are the slowest instructions here), which gives the
    // same bits as dividing in both branches.
    map(|i, q| {
        let (x, is_small) = (x[i][q], a[i][q] < 0.625);
        let e1 = e1[i][q] + 1.0;
        let t = if is_small { x * z[i][q] * p[i][q] } else { 2.0 }
            / if is_small { den[i][q] } else { e1 };
        if is_small {
            x + t
        } else {
            (1.0 - t).copysign(x)
        }
    })
}

/// e^y for 0 ≤ y ≤ 20 in f32: as [`exp_pos`], Taylor to degree 7 (remainder < 1e-8).
#[inline(always)]
fn exp_pos32<const H: usize, const W: usize>(y: &Block<f32, H, W>) -> Block<f32, H, W> {
    // Cephes' split of ln 2 for f32.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const SHIFT: f32 = 12_582_912.0;
    let shifted: Block<f32, H, W> = map(|i, q| y[i][q] * std::f32::consts::LOG2_E + SHIFT);
    let k: Block<f32, H, W> = map(|i, q| shifted[i][q] - SHIFT);
    let r: Block<f32, H, W> = map(|i, q| (y[i][q] - k[i][q] * LN2_HI) - k[i][q] * LN2_LO);
    let mut p = [[1.0 / 5_040.0; W]; H];
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = map(|i, q| p[i][q] * r[i][q] + c);
    }
    // 2^k from the bits of k + 1.5·2²³, as in [`exp_pos`]: `k as i32` saturates, which the
    // compiler does not vectorise.
    map(|i, q| {
        let two_k = shifted[i][q]
            .to_bits()
            .wrapping_sub(SHIFT.to_bits())
            .wrapping_add(127)
            << 23;
        p[i][q] * f32::from_bits(two_k)
    })
}

/// Cephes' tanhf of each value: a polynomial below 0.625, 1 − 2/(e^{2|x|} + 1) above; within
/// 2 ulp of f32, at twice the lanes of going through f64 (float32 training's embedding tanh).
#[inline(always)]
pub fn tanh32_block<const H: usize, const W: usize>(x: &Block<f32, H, W>) -> Block<f32, H, W> {
    let a: Block<f32, H, W> = map(|i, q| x[i][q].abs());
    let z: Block<f32, H, W> = map(|i, q| x[i][q] * x[i][q]);
    let p: Block<f32, H, W> = map(|i, q| {
        let z = z[i][q];
        (((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
            - 3.333_328e-1
    });
    // tanh(10) rounds to 1 in f32.
    let e = exp_pos32::<H, W>(&map(|i, q| 2.0 * a[i][q].min(10.0)));
    map(|i, q| {
        let x = x[i][q];
        if a[i][q] < 0.625 {
            p[i][q] * z[i][q] * x + x
        } else {
            (1.0 - 2.0 / (e[i][q] + 1.0)).copysign(x)
        }
    })
}

/// tanh of each value in T's own arithmetic: [`tanh32_block`] for f32 (within 2 ulp), else
/// [`tanh64_block`].
#[inline(always)]
pub fn tanh_block<T: Real, const H: usize, const W: usize>(x: &mut Block<T, H, W>) {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32, so the block is one of f32.
        let x = unsafe { &mut *(x as *mut Block<T, H, W> as *mut Block<f32, H, W>) };
        *x = tanh32_block(x);
    } else {
        let y = tanh64_block::<H, W>(&map(|i, q| x[i][q].f64()));
        *x = map(|i, q| T::of(y[i][q]));
    }
}

/// tanh of one value in T's own arithmetic, as [`tanh_block`].
#[inline(always)]
fn tanh_of<T: Real>(x: T) -> T {
    let mut b = [[x]];
    tanh_block(&mut b);
    b[0][0]
}

/// `x[i] = tanh(x[i] + b[i % b.len()])` for a row-major block whose rows have `b.len()` values.
#[inline(always)]
pub fn tanh_bias<T: Real>(x: &mut [T], b: &[T]) {
    // Blocks of six AVX2 vectors (three of AVX-512) side by side.
    if std::mem::size_of::<T>() == 4 {
        tanh_bias_in::<T, 16>(x, b);
    } else {
        tanh_bias_in::<T, 8>(x, b);
    }
}

/// [`tanh_bias`] in blocks of 3 × W values.
#[inline(always)]
fn tanh_bias_in<T: Real, const W: usize>(x: &mut [T], b: &[T]) {
    const H: usize = 3;
    for row in x.chunks_mut(b.len()) {
        let mut xs = row.chunks_exact_mut(H * W);
        let mut bs = b.chunks_exact(H * W);
        for (xc, bc) in (&mut xs).zip(&mut bs) {
            let mut v: Block<T, H, W> = map(|i, q| xc[i * W + q] + bc[i * W + q]);
            tanh_block(&mut v);
            for (xr, vr) in xc.chunks_exact_mut(W).zip(&v) {
                xr.copy_from_slice(vr);
            }
        }
        for (v, &bb) in xs.into_remainder().iter_mut().zip(bs.remainder()) {
            *v = tanh_of(*v + bb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{tanh32_block, tanh64_block, tanh_block};

    fn tanh64(x: f64) -> f64 {
        tanh64_block(&[[x]])[0][0]
    }

    fn tanh32(x: f32) -> f32 {
        tanh32_block(&[[x]])[0][0]
    }

    /// A block's values are each the scalar function's, in the wide versions too.
    #[test]
    fn blocks_match_single_values() {
        let x: [[f64; 8]; 3] =
            std::array::from_fn(|i| std::array::from_fn(|q| (i * 8 + q) as f64 * 0.37 - 4.3));
        let (mut b, mut b32) = (x, x.map(|r| r.map(|v| v as f32)));
        super::super::simd::wide(
            #[inline(always)]
            || {
                tanh_block(&mut b);
                tanh_block(&mut b32);
            },
        );
        for (i, row) in x.iter().enumerate() {
            for (q, &v) in row.iter().enumerate() {
                assert_eq!(b[i][q].to_bits(), tanh64(v).to_bits());
                assert_eq!(b32[i][q].to_bits(), tanh32(v as f32).to_bits());
            }
        }
    }

    #[test]
    fn f32_within_two_ulp() {
        let mut worst = 0.0f64;
        for i in -400_000..=400_000 {
            let x = i as f32 * 4.1e-5 + 1e-7;
            let exact = (x as f64).tanh();
            let ulp = f64::from(f32::EPSILON) * exact.abs().max(f64::from(f32::MIN_POSITIVE));
            worst = worst.max((f64::from(tanh32(x)) - exact).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(tanh32(0.0), 0.0);
        assert_eq!(tanh32(30.0), 1.0);
        assert_eq!(tanh32(-1e30), -1.0);
    }

    #[test]
    fn agrees_with_libm_to_a_few_ulp() {
        let mut worst = 0.0f64;
        for i in -200_000..=200_000 {
            let x = i as f64 * 1.7e-4 + 1e-9;
            let (a, b) = (tanh64(x), x.tanh());
            worst = worst.max((a - b).abs() / b.abs().max(f64::MIN_POSITIVE));
        }
        assert!(worst < 1e-15, "worst relative error {worst}");
        assert_eq!(tanh64(0.0), 0.0);
        assert_eq!(tanh64(50.0), 1.0);
        assert_eq!(tanh64(-1e3), -1.0);
    }
}

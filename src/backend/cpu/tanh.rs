//! tanh over slices, written so the compiler vectorises it: libm's scalar tanh was the largest
//! single cost of the embedding nets. Accurate to a few ulp in f64.

use crate::backend::Real;

/// e^y for 0 ≤ y ≤ 90: y = k ln2 + r with |r| ≤ ln2/2, e^r by its Taylor series to degree 13
/// (remainder < 4e-18), then scaled by 2^k through the exponent bits.
#[inline(always)]
fn exp_pos(y: f64) -> f64 {
    // ln 2 split in two (fdlibm's constants): k·LN2_HI is exact for the k that occur here.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    // Round to nearest through the 1.5·2⁵² shift: unlike f64::round it needs no SSE4.1, so the
    // loop vectorises on the x86-64 baseline.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    let k = (y * std::f64::consts::LOG2_E + SHIFT) - SHIFT;
    let r = (y - k * LN2_HI) - k * LN2_LO;
    let mut p = 1.0 / 6_227_020_800.0;
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
        p = p * r + c;
    }
    p * f64::from_bits(((k as i64 + 1023) as u64) << 52)
}

/// Cephes' tanh: a rational approximation below 0.625, 1 − 2/(e^{2|x|} + 1) above.
#[inline(always)]
pub fn tanh64(x: f64) -> f64 {
    let a = x.abs();
    let z = x * x;
    let p =
        (-9.643_991_794_250_523e-1 * z - 9.928_772_310_019_186e1) * z - 1.614_687_684_417_084_5e3;
    let q = ((z + 1.128_116_784_916_329_3e2) * z + 2.235_488_390_601_004_6e3) * z
        + 4.844_063_053_251_255e3;
    // small = x + (x·z·p)/q, large = ±(1 − 2/(e^{2|x|} + 1)): the two quotients are picked
    // before the one division (divisions are the slowest instructions here), which gives the
    // same bits as dividing in both branches.
    let is_small = a < 0.625;
    let e1 = exp_pos(2.0 * a.min(40.0)) + 1.0;
    let t = if is_small { x * z * p } else { 2.0 } / if is_small { q } else { e1 };
    if is_small {
        x + t
    } else {
        (1.0 - t).copysign(x)
    }
}

/// e^y for 0 ≤ y ≤ 20 in f32: as [`exp_pos`], Taylor to degree 7 (remainder < 1e-8).
#[inline(always)]
fn exp_pos32(y: f32) -> f32 {
    // Cephes' split of ln 2 for f32.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const SHIFT: f32 = 12_582_912.0;
    let k = (y * std::f32::consts::LOG2_E + SHIFT) - SHIFT;
    let r = (y - k * LN2_HI) - k * LN2_LO;
    let mut p = 1.0 / 5_040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// Cephes' tanhf: a polynomial below 0.625, 1 − 2/(e^{2|x|} + 1) above; within 2 ulp of f32,
/// at twice the lanes of going through f64 (float32 training's embedding tanh).
#[inline(always)]
pub fn tanh32(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let p = (((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
        - 3.333_328e-1;
    let is_small = a < 0.625;
    // tanh(10) rounds to 1 in f32.
    let large = (1.0 - 2.0 / (exp_pos32(2.0 * a.min(10.0)) + 1.0)).copysign(x);
    if is_small {
        p * z * x + x
    } else {
        large
    }
}

/// The slice as f32 when T is f32.
#[inline(always)]
fn as_f32<T: Real>(x: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| bytemuck::cast_slice_mut(x))
}

/// `x[i] = tanh(x[i] + b[i % b.len()])` for a row-major block whose rows have `b.len()` values;
/// in f32 arithmetic for f32 (within 2 ulp), else through [`tanh64`].
#[inline(always)]
pub fn tanh_bias<T: Real>(x: &mut [T], b: &[T]) {
    let n = b.len();
    if let Some(x32) = as_f32(x) {
        let b32: &[f32] = bytemuck::cast_slice(b);
        for row in x32.chunks_mut(n) {
            for (v, &bb) in row.iter_mut().zip(b32) {
                *v = tanh32(*v + bb);
            }
        }
        return;
    }
    for row in x.chunks_mut(n) {
        for (v, &bb) in row.iter_mut().zip(b) {
            *v = T::of(tanh64((*v + bb).f64()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{tanh32, tanh64};

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

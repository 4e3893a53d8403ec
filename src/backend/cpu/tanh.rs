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

/// `x[i] = tanh(x[i] + b[i % b.len()])` for a row-major block whose rows have `b.len()` values.
#[inline(always)]
pub fn tanh_bias<T: Real>(x: &mut [T], b: &[T]) {
    for row in x.chunks_mut(b.len()) {
        for (v, &bb) in row.iter_mut().zip(b) {
            *v = T::of(tanh64((*v + bb).f64()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tanh64;

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

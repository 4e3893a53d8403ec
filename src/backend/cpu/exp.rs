//! e^y and e^y − 1 over rows and slices, written so the compiler vectorises them: tanh.rs's
//! tanh is made of them, and DPA-1's softmax takes nnei² exponentials per centre and layer in
//! every pass, which through libm's scalar exp were the largest single cost of the attention
//! once its products were GEMMs.

use super::simd::{self, map, Row};
use crate::backend::Real;

// ln 2 split in two (fdlibm's constants): k·LN2_HI is exact for the k that occur here.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
// Round to nearest through the 1.5·2⁵² shift: unlike f64::round it needs no SSE4.1, so the loop
// vectorises on the x86-64 baseline.
const SHIFT: f64 = 6_755_399_441_055_744.0;

/// y = k ln2 + r with |r| ≤ ln2/2: k + 1.5·2⁵² (whose last bits are k) and r.
#[inline(always)]
fn reduce64<const W: usize>(y: &Row<f64, W>) -> (Row<f64, W>, Row<f64, W>) {
    let shifted: Row<f64, W> = map(|q| y[q] * std::f64::consts::LOG2_E + SHIFT);
    let k: Row<f64, W> = map(|q| shifted[q] - SHIFT);
    (shifted, map(|q| (y[q] - k[q] * LN2_HI) - k[q] * LN2_LO))
}

/// Σ c[i]·r^(N−1−i) of each value, by Horner from the highest power: plain multiplies and adds,
/// not fused, so the same bits on every target, wasm included.
#[inline(always)]
fn horner<F, const W: usize, const N: usize>(r: &Row<F, W>, c: [F; N]) -> Row<F, W>
where
    F: Copy + Default + std::ops::Mul<Output = F> + std::ops::Add<Output = F>,
{
    let mut p = [c[0]; W];
    for &c in &c[1..] {
        p = map(|q| p[q] * r[q] + c);
    }
    p
}

/// (e^r − 1)/r = 1 + r/2! + … + r¹²/13! (Taylor to degree 13 of e^r − 1, remainder < 4e-18
/// relative for |r| ≤ ln2/2).
#[inline(always)]
fn expm1_over_r64<const W: usize>(r: &Row<f64, W>) -> Row<f64, W> {
    horner(
        r,
        [
            1.0 / 6_227_020_800.0,
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
        ],
    )
}

/// 2^k from the bits of k + 1.5·2⁵²: an integer subtraction where `k as i64` would need
/// AVX-512's f64 → i64 conversion (AVX2 does it lane by lane).
#[inline(always)]
fn two_pow64(shifted: f64) -> f64 {
    f64::from_bits(
        shifted
            .to_bits()
            .wrapping_sub(SHIFT.to_bits())
            .wrapping_add(1023)
            << 52,
    )
}

/// e^y − 1 for 0 ≤ y ≤ 90 as 2^k(e^r − 1) + (2^k − 1): accurate near 0 too, where e^y − 1
/// would cancel (tanh's t = e^{2|x|} − 1).
#[inline(always)]
pub(super) fn expm1_pos<const W: usize>(y: &Row<f64, W>) -> Row<f64, W> {
    let (shifted, r) = reduce64::<W>(y);
    let p = expm1_over_r64::<W>(&r);
    map(|q| {
        let two_k = two_pow64(shifted[q]);
        (p[q] * r[q]) * two_k + (two_k - 1.0)
    })
}

/// e^y for y ≤ 0 in f64, within 2 ulp of libm (y below −700 gives e^−700 ≈ 1e−304, nothing
/// beside a softmax's largest term, 1).
#[inline(always)]
fn exp64<const W: usize>(y: &Row<f64, W>) -> Row<f64, W> {
    let (shifted, r) = reduce64::<W>(&map(|q| y[q].max(-700.0)));
    let p = expm1_over_r64::<W>(&r);
    map(|q| (p[q] * r[q] + 1.0) * two_pow64(shifted[q]))
}

/// y = k ln2 + r in f32, as [`reduce64`] with Cephes' split of ln 2.
#[inline(always)]
fn reduce32<const W: usize>(y: &Row<f32, W>) -> (Row<f32, W>, Row<f32, W>) {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let shifted: Row<f32, W> = map(|q| y[q] * std::f32::consts::LOG2_E + SHIFT32);
    let k: Row<f32, W> = map(|q| shifted[q] - SHIFT32);
    (shifted, map(|q| (y[q] - k[q] * LN2_HI) - k[q] * LN2_LO))
}

const SHIFT32: f32 = 12_582_912.0;

/// 2^k from the bits of k + 1.5·2²³, as [`two_pow64`]: `k as i32` saturates, which the
/// compiler does not vectorise.
#[inline(always)]
fn two_pow32(shifted: f32) -> f32 {
    f32::from_bits(
        shifted
            .to_bits()
            .wrapping_sub(SHIFT32.to_bits())
            .wrapping_add(127)
            << 23,
    )
}

/// e^y in f32 for −87 ≤ y ≤ 88 (normal results), e^r by its Taylor series to degree 7
/// (remainder < 1e-8).
#[inline(always)]
pub(super) fn exp32<const W: usize>(y: &Row<f32, W>) -> Row<f32, W> {
    let (shifted, r) = reduce32::<W>(y);
    let p = horner(
        &r,
        [
            1.0 / 5_040.0,
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ],
    );
    map(|q| p[q] * two_pow32(shifted[q]))
}

/// e^y − 1 in f32 for 0 ≤ y ≤ 20, as [`expm1_pos`]: (e^r − 1)/r by its Taylor series to degree
/// 6 (remainder < 2e-8 relative for |r| ≤ ln2/2).
#[inline(always)]
pub(super) fn expm1_pos32<const W: usize>(y: &Row<f32, W>) -> Row<f32, W> {
    let (shifted, r) = reduce32::<W>(y);
    let p = horner(
        &r,
        [
            1.0 / 5_040.0,
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
        ],
    );
    map(|q| {
        let two_k = two_pow32(shifted[q]);
        (p[q] * r[q]) * two_k + (two_k - 1.0)
    })
}

/// e^y of a row of T values, y ≤ 0.
#[inline(always)]
fn exp_row<T: Real, const W: usize>(y: &Row<T, W>) -> Row<T, W> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        let e = exp32::<W>(&map(|q| y[q].to_f32().unwrap_or(f32::NAN).max(-87.0)));
        map(|q| T::of(e[q] as f64))
    } else {
        let e = exp64::<W>(&map(|q| y[q].f64()));
        map(|q| T::of(e[q]))
    }
}

/// Lanes per row: two AVX-512 vectors.
const LANES: usize = 16;

/// `set(x, e^y)` for each number x of the slice with y = `get(x)` ≤ 0, `LANES` at a time in
/// the widest instruction set the CPU has: the numbers need not be reals (a dual's values).
#[inline(always)]
pub(super) fn exp_in_place<T: Real, N>(
    x: &mut [N],
    get: impl Fn(&N) -> T,
    set: impl Fn(&mut N, T),
) {
    simd::wide(
        #[inline(always)]
        || {
            let mut rows = x.chunks_exact_mut(LANES);
            for row in &mut rows {
                let e = exp_row::<T, LANES>(&map(|q| get(&row[q])));
                for (v, &e) in row.iter_mut().zip(&e) {
                    set(v, e);
                }
            }
            // The rest as one zero-padded row: each value is its own lane.
            let rest = rows.into_remainder();
            let y = map(|q| rest.get(q).map_or(T::zero(), &get));
            let e = exp_row::<T, LANES>(&y);
            for (v, &e) in rest.iter_mut().zip(&e) {
                set(v, e);
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_libm() {
        let ys: Vec<f64> = (0..2001).map(|i| -(i as f64) * 0.0137).collect();
        let mut got = ys.clone();
        exp_in_place(&mut got, |v| *v, |v, e| *v = e);
        for (&y, &e) in ys.iter().zip(&got) {
            let want = y.exp();
            assert!(
                (e - want).abs() <= 4.0 * f64::EPSILON * want,
                "{y}: {e} vs {want}"
            );
        }
        let mut got32: Vec<f32> = ys.iter().map(|&y| y as f32).collect();
        exp_in_place(&mut got32, |v| *v, |v, e| *v = e);
        for (&y, &e) in ys.iter().zip(&got32) {
            let want = (y as f32).exp();
            assert!(
                (e - want).abs() <= 4.0 * f32::EPSILON * want,
                "{y}: {e} vs {want}"
            );
        }
        let mut tiny = [-1e4];
        exp_in_place(&mut tiny, |v| *v, |v, e| *v = e);
        assert!((0.0..1e-300).contains(&tiny[0]));
    }
}

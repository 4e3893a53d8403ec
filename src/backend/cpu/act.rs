//! The activations on the host: the blocks' tapes take φ, φ' and φ'' of z
//! ([`Activation::eval3`]), the dense layers take them of what they keep ([`of_kept`]).

use super::exp::exp_in_place;
use super::simd;
use crate::backend::Real;
use crate::model::Activation;

pub(super) fn cst<T: Real>(x: f64) -> T {
    T::from(x).expect("a representable constant")
}

/// φ, φ' and φ'' from what a dense layer keeps of an output ([`Activation::keeps_output`]):
/// h = tanh(z), whose derivatives are 1 − h² and −2h(1 − h²), or z itself.
#[inline(always)]
pub(super) fn of_kept<T: Real>(a: Activation, s: T) -> (T, T, T) {
    match a {
        Activation::Tanh => {
            let d1 = T::one() - s * s;
            (s, d1, -(s + s) * d1)
        }
        Activation::Linear => (s, T::one(), T::zero()),
        _ => a.eval3(s),
    }
}

/// φ, φ' and φ'' of every x into `y`, `dy`, `d2y`: [`Activation::eval3`]'s values, in loops
/// the compiler vectorises (a DPA-3 step takes φ of millions of pre-activations; element by
/// element, the call, the division and the branch cost twice the exp). silu's sigmoid takes
/// exp.rs's e^{−|x|} rather than libm's e^{−x} (libm's exp and its wrapper were a sixth of a
/// DPA-3 step): within a few ulp of eval3's, not its bits.
pub(super) fn eval3_slice<T: Real>(
    a: Activation,
    x: &[T],
    y: &mut [T],
    dy: &mut [T],
    d2y: &mut [T],
) {
    let th = match a {
        Activation::Silu => None,
        Activation::Silut(th) => Some(cst::<T>(th)),
        _ => {
            for (((&x, y), dy), d2y) in x.iter().zip(y).zip(dy.iter_mut()).zip(d2y.iter_mut()) {
                (*y, *dy, *d2y) = a.eval3(x);
            }
            return;
        }
    };
    let (one, two) = (T::one(), cst::<T>(2.0));
    simd::wide(
        #[inline(always)]
        || {
            for (e, &x) in d2y.iter_mut().zip(x) {
                *e = -x.abs();
            }
        },
    );
    exp_in_place(d2y, |v| *v, |v, e| *v = e);
    simd::wide(
        #[inline(always)]
        || {
            for (((&x, y), dy), d2y) in x
                .iter()
                .zip(y.iter_mut())
                .zip(dy.iter_mut())
                .zip(d2y.iter_mut())
            {
                // σ(x) = 1/(1 + e^{−x}), as e^{x}/(1 + e^{x}) below 0.
                let e = *d2y;
                let s = if x >= T::zero() { one } else { e } / (one + e);
                *y = x * s;
                *dy = s * (one + x * (one - s));
                *d2y = s * (one - s) * (two + x * (one - s - s));
            }
        },
    );
    // silut's tanh branch at and above its threshold.
    if let Some(th) = th {
        for (((&x, y), dy), d2y) in x.iter().zip(y).zip(dy).zip(d2y) {
            if x >= th {
                (*y, *dy, *d2y) = a.eval3(x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval3_slice_is_eval3() {
        let xs: Vec<f64> = (0..4001).map(|i| -60.0 + 0.03 * i as f64).collect();
        for a in [
            Activation::Silu,
            Activation::Silut(10.0),
            Activation::Silut(0.3),
            Activation::Tanh,
        ] {
            let n = xs.len();
            let (mut y, mut dy, mut d2y) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            eval3_slice(a, &xs, &mut y, &mut dy, &mut d2y);
            for (i, &x) in xs.iter().enumerate() {
                let want = a.eval3(x);
                let got = (y[i], dy[i], d2y[i]);
                // φ' and φ'' take 1 − σ, which cancels for large x: absolute beside 1.
                assert!(
                    [(got.0, want.0), (got.1, want.1), (got.2, want.2)]
                        .iter()
                        .all(|(g, w)| (g - w).abs() <= 1e-13 * w.abs().max(1.0)),
                    "{a:?} at {x}: {got:?} vs {want:?}"
                );
            }
        }
    }
}

//! The activations on the host: the blocks' tapes take φ, φ' and φ'' of z
//! ([`Activation::eval3`]), the dense layers take them of what they keep ([`of_kept`]).

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

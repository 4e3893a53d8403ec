//! The activations of DeePMD-kit's `get_activation_fn` that dpw's nets take: the fitting nets'
//! `activation_function` and the message-passing blocks' (DPA-3, DPA-2).

use num_traits::Float;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Tanh,
    Silu,
    /// `silut:c` (`custom_silu:c`): silu below c, tanh(s(x − c)) + silu(c) from c on, C¹ at c.
    Silut(f64),
    /// `linear` / `none`.
    Linear,
}

impl Activation {
    /// DeePMD-kit's name (`silut:10.0`, ...) → the activation; `None` where dpw lacks it.
    pub fn parse(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let (head, arg) = match lower.split_once(':') {
            Some((h, a)) => (h.to_string(), Some(a.to_string())),
            None => (lower, None),
        };
        match (head.as_str(), arg) {
            ("tanh", None) => Some(Activation::Tanh),
            ("silu", None) => Some(Activation::Silu),
            ("linear" | "none", None) => Some(Activation::Linear),
            ("silut" | "custom_silu", None) => Some(Activation::Silut(3.0)),
            ("silut" | "custom_silu", Some(c)) => c.parse().ok().map(Activation::Silut),
            _ => None,
        }
    }

    /// DeePMD-kit's spelling, as its files write it.
    pub fn name(&self) -> String {
        match self {
            Activation::Tanh => "tanh".into(),
            Activation::Silu => "silu".into(),
            Activation::Silut(c) => format!("silut:{c:?}"),
            Activation::Linear => "linear".into(),
        }
    }

    /// Whether a dense layer keeps h = φ(z) for its passes (tanh's derivatives are functions
    /// of h, and a linear layer's h is z); the others keep z, from which φ, φ' and φ'' follow.
    pub fn keeps_output(self) -> bool {
        matches!(self, Activation::Tanh | Activation::Linear)
    }

    pub fn is_tanh(&self) -> bool {
        *self == Activation::Tanh
    }

    /// φ, φ' and φ'' at x.
    pub fn eval3<T: Float>(self, x: T) -> (T, T, T) {
        let one = T::one();
        let silu = |x: T| {
            let s = one / (one + (-x).exp());
            (
                x * s,
                s * (one + x * (one - s)),
                s * (one - s) * (cst::<T>(2.0) + x * (one - s - s)),
            )
        };
        match self {
            Activation::Linear => (x, one, T::zero()),
            Activation::Tanh => {
                let t = x.tanh();
                (t, one - t * t, -cst::<T>(2.0) * t * (one - t * t))
            }
            Activation::Silu => silu(x),
            Activation::Silut(th) => {
                let th_t = cst::<T>(th);
                if x < th_t {
                    silu(x)
                } else {
                    // Computed once in f64 as DeePMD-kit does (spec §18.1).
                    let sig = 1.0 / (1.0 + (-th).exp());
                    let slope = sig + th * sig * (1.0 - sig);
                    let (sl, at_th) = (cst::<T>(slope), cst::<T>(th * sig));
                    let t = (sl * (x - th_t)).tanh();
                    (
                        t + at_th,
                        sl * (one - t * t),
                        -cst::<T>(2.0) * sl * sl * t * (one - t * t),
                    )
                }
            }
        }
    }
}

fn cst<T: Float>(x: f64) -> T {
    T::from(x).expect("a representable constant")
}

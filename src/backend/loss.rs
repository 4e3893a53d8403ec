//! What the ener loss op takes (the prefactors of a step, the ener fitting's) and gives (the
//! sums the loss and the displayed RMSEs follow from).

pub use crate::fitting::ener::Prefactors;

use super::real::Real;

/// Per-batch sums from which the loss and the displayed RMSEs follow.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSums {
    /// Σ_frames ΔE², Σ ΔF² (all components), Σ ΔW² (all components).
    pub e2: f64,
    pub f2: f64,
    pub v2: f64,
}

impl LossSums {
    /// How many values the [`super::TrainOps::loss`] op writes.
    pub const LEN: usize = 3;

    /// The 3 values, as [`crate::train::loss::Loss::metrics`] reads them.
    pub fn values(&self) -> [f64; Self::LEN] {
        [self.e2, self.f2, self.v2]
    }

    /// From the 3-value buffer the [`super::TrainOps::loss`] op writes.
    pub fn from_values<T: Real>(v: &[T]) -> Self {
        LossSums {
            e2: v[0].f64(),
            f2: v[1].f64(),
            v2: v[2].f64(),
        }
    }
}

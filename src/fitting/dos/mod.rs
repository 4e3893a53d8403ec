//! DeePMD-kit's `dos` fitting (`DOSFittingNet`, `DPDOSAtomicModel`, `DOSLoss`): `numb_dos`
//! values per atom from the descriptor, shifted by the output bias of the atom's type (no std),
//! summed per frame; the loss on the frame DOS and the atomic DOS and on their cumulative sums
//! over the energy grid. No forces (docs/deepmd-spec.md §16).
//!
//! As a property's, the nets run on the backend and the head (bias, sum, loss and its seed
//! ∂L/∂y_i) on the host.

pub mod config;
pub mod head;
pub mod kind;

use serde::{Deserialize, Serialize};

/// The keys of a DOS fitting that shape the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DosSpec {
    /// Points of the energy grid: the values per atom (`numb_dos`, 300).
    pub numb_dos: usize,
}

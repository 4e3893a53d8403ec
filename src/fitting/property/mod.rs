//! DeePMD-kit's `property` fitting (`PropertyFittingNet`, `DPPropertyAtomicModel`,
//! `PropertyLoss`): `task_dim` values per atom from the descriptor, scaled by the output std and
//! shifted by the output bias of the atom's type, summed per frame (averaged when `intensive`).
//! No forces: the loss reads the frame values alone (docs/deepmd-spec.md §15).
//!
//! The nets run on the backend like `ener`'s; the head (scale, bias, reduction, loss and its
//! seed ∂L/∂y_i) is `task_dim` numbers per atom and runs on the host.

pub mod config;
pub mod head;
pub mod kind;
pub mod stats;

use serde::{Deserialize, Serialize};

/// The keys of a property fitting that shape the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PropertySpec {
    /// The label's name: the data's `{property_name}.npy` (`[nframes][task_dim]`).
    pub property_name: String,
    pub task_dim: usize,
    /// The frame's value is the mean of its atoms' (true) or their sum (false).
    pub intensive: bool,
    /// The output statistics per type (true: least squares over type counts) or one for all
    /// (false: the mean and std of the frame values, per atom where extensive).
    pub distinguish_types: bool,
}

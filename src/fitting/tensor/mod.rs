//! DeePMD-kit's tensor fittings, `dipole` and `polar` (`DipoleFittingNet`, `PolarFittingNet`,
//! `DPDipoleAtomicModel`, `DPPolarAtomicModel`, `TensorLoss`): per atom, the nets' outputs
//! contracted with the descriptor's rotation matrix gr (`[M1][3]`, rows 1..3 of se_e2_a's A) into
//! a vector or a symmetric 3×3 matrix, summed per frame (docs/deepmd-spec.md §17).
//!
//! The nets run on the backend like `ener`'s; the head (the contraction with gr, the shift of
//! the polarizability's diagonal, the mask of excluded types, the loss, and its seeds ∂L/∂y_i and
//! ∂L/∂gr_i) runs on the host, and ∂L/∂gr joins the descriptor's dual pass
//! ([`crate::backend::ContractOps::contract_gbar`]).

pub mod config;
pub mod head;
pub mod kind;

use std::fmt::Debug;
use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

/// The keys of a dipole or polar fitting that shape the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// The rotation matrix's rows M1: the descriptor's last embedding width.
    pub embedding_width: usize,
    /// Polar: the nets put out the diagonal of the M1×M1 matrix alone (`fit_diag`).
    #[serde(default)]
    pub fit_diag: bool,
    /// Polar: the nets' outputs scaled per type (`scale`, `[ntypes]`).
    #[serde(default)]
    pub scale: Vec<f64>,
    /// Polar: the output bias's mean diagonal added to the diagonal (`shift_diag`).
    #[serde(default)]
    pub shift_diag: bool,
    /// The types whose atomic tensor is zero (DeePMD-kit's `atom_exclude_types`).
    #[serde(default)]
    pub exclude_types: Vec<usize>,
}

/// A dipole or a polar fitting: its keys, and which it is in its type (so that a checkpoint,
/// which stores the keys alone under the fitting's `type`, reads back as the one it was).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent, bound = "")]
pub struct TensorFitting<K: TensorKind> {
    pub spec: TensorSpec,
    #[serde(skip)]
    kind: PhantomData<K>,
}

impl<K: TensorKind> TensorFitting<K> {
    pub fn new(spec: TensorSpec) -> Self {
        TensorFitting {
            spec,
            kind: PhantomData,
        }
    }
}

/// Which tensor a [`TensorFitting`] is.
pub trait TensorKind: Clone + Debug + PartialEq + Default + Send + Sync + 'static {
    const TENSOR: Tensor;
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DipoleTensor;
impl TensorKind for DipoleTensor {
    const TENSOR: Tensor = Tensor::Dipole;
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolarTensor;
impl TensorKind for PolarTensor {
    const TENSOR: Tensor = Tensor::Polar;
}

/// Why a tensor fitting cannot sit on descriptor `kind`: the input's refusal, and the stage's
/// for a model read from a file.
pub fn needs_rot(kind: &str) -> String {
    let gives: Vec<&str> = (crate::model::registry::DESCRIPTORS.iter())
        .filter(|r| r.gives_rot)
        .map(|r| r.names[0])
        .collect();
    format!(
        "the dipole and polar fittings read the descriptor's rotation matrix, which dpw gives \
         for {} only, not for {kind}",
        gives.join(", ")
    )
}

/// Which tensor: a dipole (3 per atom) or a polarizability (3×3 per atom).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    Dipole,
    Polar,
}

impl Tensor {
    /// The values per atom and per frame: 3 or 9.
    pub fn size(self) -> usize {
        match self {
            Tensor::Dipole => 3,
            Tensor::Polar => 9,
        }
    }

    /// The data's label (`{name}.npy`, `atom_{name}.npy` or `atomic_{name}.npy`).
    pub fn label_name(self) -> &'static str {
        match self {
            Tensor::Dipole => "dipole",
            Tensor::Polar => "polarizability",
        }
    }

    /// DeePMD-kit's name of it in the loss's metrics (`rmse_local_{name}`).
    pub fn metric_name(self) -> &'static str {
        match self {
            Tensor::Dipole => "dipole",
            Tensor::Polar => "polar",
        }
    }
}

impl TensorSpec {
    /// The values per atom the nets put out: M1 for a dipole and a diagonal polar, M1² else.
    pub fn dim(&self, t: Tensor) -> usize {
        match t {
            Tensor::Polar if !self.fit_diag => self.embedding_width * self.embedding_width,
            _ => self.embedding_width,
        }
    }

    pub fn excluded(&self, t: usize) -> bool {
        self.exclude_types.contains(&t)
    }
}

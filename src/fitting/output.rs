//! What a model's fitting is ([`FitOutput`], DeePMD-kit's `fitting_net.type` with the keys
//! that shape the model), asked in one place for the [`FittingType`] it is; and what the
//! [`super::registry`] knows of each type.

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;
use crate::config::keys::{Schema, Section};
use crate::yaml_tree::At;

use super::dos::DosSpec;
use super::property::PropertySpec;
use super::tensor::{DipoleTensor, PolarTensor, Tensor, TensorFitting, TensorSpec};
use super::traits::FittingType;

/// The `ener` fitting: it has no keys of its own ([`super::ener`]).
pub struct EnerFitting;

/// What the fitting net predicts: DeePMD-kit's `fitting_net.type`, with the keys that shape the
/// model. Written in checkpoints (`ener` left out, so that energy models' files stay as they
/// were).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FitOutput {
    /// `ener`: one energy per atom; forces and virial are its derivatives (docs/deepmd-spec.md §7).
    #[default]
    Ener,
    /// `property`: `task_dim` values per atom, reduced per frame ([`super::property`]).
    Property(PropertySpec),
    /// `dos`: `numb_dos` values per atom, summed per frame ([`super::dos`]).
    Dos(DosSpec),
    /// `dipole`: a vector per atom from the rotation matrix, summed per frame ([`super::tensor`]).
    Dipole(TensorFitting<DipoleTensor>),
    /// `polar`: a symmetric 3×3 matrix per atom from the rotation matrix, summed per frame.
    Polar(TensorFitting<PolarTensor>),
}

impl FitOutput {
    /// The fitting: the one place that asks which it is.
    pub fn fitting(&self) -> &dyn FittingType {
        match self {
            FitOutput::Ener => &EnerFitting,
            FitOutput::Property(p) => p,
            FitOutput::Dos(d) => d,
            FitOutput::Dipole(t) => t,
            FitOutput::Polar(t) => t,
        }
    }

    pub fn is_ener(&self) -> bool {
        *self == FitOutput::Ener
    }

    /// A tensor fitting's tensor and keys (what the descriptor's rotation matrix serves);
    /// `None` for the others.
    pub fn tensor(&self) -> Option<(Tensor, &TensorSpec)> {
        match self {
            FitOutput::Dipole(t) => Some((Tensor::Dipole, &t.spec)),
            FitOutput::Polar(t) => Some((Tensor::Polar, &t.spec)),
            _ => None,
        }
    }

    /// The property fitting's keys; `None` for the others.
    pub fn property(&self) -> Option<&PropertySpec> {
        match self {
            FitOutput::Property(p) => Some(p),
            _ => None,
        }
    }

    /// Whether the head reads the descriptor's rotation matrix.
    pub fn reads_rot(&self) -> bool {
        self.tensor().is_some()
    }
}

/// What completes a fitting's keys in input.json beside its own section.
pub struct FitContext<'a> {
    pub ntypes: usize,
    /// The descriptor's `type`.
    pub descriptor: &'a str,
    /// The width M1 of the descriptor's rotation matrix; `None` where it gives none.
    pub rot_width: Option<usize>,
    /// The model's `atom_exclude_types`.
    pub atom_exclude_types: &'a [usize],
    /// The path of the fitting's section.
    pub path: &'a str,
}

/// A fitting `type` dpw builds: its names, input keys, and how it is read from input.json and
/// from DeePMD-kit's serialisation.
pub struct Registered {
    pub names: &'static [&'static str],
    /// Its keys in input.json.
    pub(crate) schema: &'static Schema,
    /// Its keys in input.json (its section `sec`, the model's `ctx`).
    pub(crate) parse: fn(sec: &Section, ctx: &FitContext) -> Result<FitOutput, ConfigError>,
    /// Its fitting node `f` of DeePMD-kit's serialisation, of the model node `m`, `ntypes` types.
    pub(crate) read_yaml: fn(f: &At, m: &At, ntypes: usize) -> anyhow::Result<FitOutput>,
}

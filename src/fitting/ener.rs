//! DeePMD-kit's `ener` fitting (`EnergyFittingNet`): one energy per atom, shifted by the energy
//! bias of its type and summed per frame; forces and virial are its derivatives, so its whole
//! step, loss included, runs on the backend (docs/deepmd-spec.md §7).

use serde_json::{Map, Value as Json};
use serde_yaml_ng::Value as Yaml;

use crate::config::error::ConfigError;
use crate::config::keys::{Schema, Section};
use crate::config::loss::LossConfig;
use crate::data::Labels;
use crate::yaml_tree::{ndarray, At};

use super::keys::{schema, YAML_KEYS};
use super::output::{EnerFitting, FitContext, FitOutput, Registered};
use super::traits::{FittingType, OutputStat, YamlOut};

/// The ener loss's prefactors in effect at a step, already multiplied by the label's presence
/// (docs/deepmd-spec.md §9): what the backend's loss op takes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prefactors {
    pub e: f64,
    pub f: f64,
    pub v: f64,
}

/// The ener loss's metrics, in lcurve.out's order: the loss's root, then each active term's
/// RMSE.
pub const METRICS: &[&str] = &["rmse", "rmse_e", "rmse_f", "rmse_v"];

static SCHEMA: Schema = schema!(
    &["type", "rcond", "atom_ener"],
    "model[standard].fitting_net"
);

pub static REGISTERED: Registered = Registered {
    names: &["ener"],
    schema: &SCHEMA,
    parse,
    read_yaml,
};

fn parse(_: &Section, _: &FitContext) -> Result<FitOutput, ConfigError> {
    Ok(FitOutput::Ener)
}

fn read_yaml(f: &At, _: &At, _: usize) -> anyhow::Result<FitOutput> {
    f.version(1..=4, Some(1))?;
    f.known(&[YAML_KEYS])?;
    Ok(FitOutput::Ener)
}

impl FittingType for EnerFitting {
    fn type_name(&self) -> &'static str {
        "ener"
    }

    fn dim(&self) -> usize {
        1
    }

    fn labels(&self, _: Option<&LossConfig>, required: bool) -> Labels {
        match required {
            true => Labels::EnergyForce,
            false => Labels::Optional,
        }
    }

    fn metrics(&self) -> &'static [&'static str] {
        METRICS
    }

    fn input_json(&self, _: &mut Map<String, Json>) {}

    // dpmodel and PT add out_bias alone and keep the residual std here unused, but DeePMD-kit
    // 3.2.0's TF model computes `output·out_std + out_bias`: with any value but 1,
    // `dp convert-backend model.yaml model.pb` would scale every force by it.
    fn write_yaml(&self, out: YamlOut) -> Yaml {
        ndarray(&[1, out.ntypes, 1], &vec![1.0; out.ntypes])
    }

    fn output_stat(&self) -> OutputStat<'_> {
        OutputStat::EnergyBias
    }
}

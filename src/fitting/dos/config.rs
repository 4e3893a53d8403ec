//! The DOS fitting's and loss's keys in input.json (DeePMD-kit 3.2.0's `fitting_dos` and
//! `loss_dos` arguments), with DeePMD-kit's defaults.

use serde_json::{json, Value};

use crate::config::error::ConfigError;
use crate::config::keys::{at_least_one, non_negative, Schema, Section};

use super::head::metric_values;
use super::DosSpec;
use crate::fitting::traits::LossType;

type Result<T> = std::result::Result<T, ConfigError>;

/// The keys of `fitting_net` with `"type": "dos"` that `parse_output` reads; the fitting's
/// shared keys are read with `ener`'s.
pub const OUTPUT_KEYS: &[&str] = &["type", "numb_dos", "rcond"];

pub(crate) fn parse_output(sec: &Section) -> Result<DosSpec> {
    let numb_dos = sec.usize_or("numb_dos", 300)?;
    at_least_one(numb_dos, &sec.path_of("numb_dos"))?;
    Ok(DosSpec { numb_dos })
}

pub fn output_json(p: &DosSpec) -> Value {
    json!({"type": "dos", "numb_dos": p.numb_dos})
}

/// The four terms of the loss, in DeePMD-kit's order of `DOSLoss.forward`'s sums: the atomic
/// DOS, its cumulative sum, the frame DOS, its cumulative sum.
pub const TERMS: [&str; 4] = ["ados", "acdf", "dos", "cdf"];

/// The `loss` section with `"type": "dos"`: each term's start and limit prefactors, in
/// [`TERMS`] order; a term is active where both are non-zero.
#[derive(Clone, Debug, PartialEq)]
pub struct DosLossConfig {
    pub start: [f64; 4],
    pub limit: [f64; 4],
}

impl DosLossConfig {
    pub fn active(&self, term: usize) -> bool {
        self.start[term] != 0.0 && self.limit[term] != 0.0
    }

    /// The prefactors at learning-rate ratio `coef` = lr/start_lr (0 for an inactive term).
    pub fn prefactors(&self, coef: f64) -> [f64; 4] {
        std::array::from_fn(|t| match self.active(t) {
            true => self.limit[t] + (self.start[t] - self.limit[t]) * coef,
            false => 0.0,
        })
    }
}

impl LossType for DosLossConfig {
    fn type_name(&self) -> &'static str {
        "dos"
    }

    fn to_json(&self) -> Value {
        let mut v = json!({"type": "dos"});
        for (t, name) in TERMS.iter().enumerate() {
            v[format!("start_pref_{name}")] = json!(self.start[t]);
            v[format!("limit_pref_{name}")] = json!(self.limit[t]);
        }
        v
    }

    fn metric_values(&self, sums: &[f64], _: usize, natoms: usize) -> Vec<Option<f64>> {
        metric_values(std::array::from_fn(|t| self.active(t)), sums, natoms).to_vec()
    }
}

/// DeePMD-kit's defaults, in [`TERMS`] order: the atomic DOS alone.
const DEFAULT: [f64; 4] = [1.0, 0.0, 0.0, 0.0];

static LOSS: Schema = Schema {
    keys: &[&[
        "type",
        "start_pref_dos",
        "limit_pref_dos",
        "start_pref_cdf",
        "limit_pref_cdf",
        "start_pref_ados",
        "limit_pref_ados",
        "start_pref_acdf",
        "limit_pref_acdf",
    ]],
    unsupported: &[],
    ignored: &[],
    deepmd: "loss[dos]",
};

pub fn parse_loss(v: &Value, path: &str) -> Result<DosLossConfig> {
    let sec = Section::new(v, path, &LOSS)?;
    let mut c = DosLossConfig {
        start: DEFAULT,
        limit: DEFAULT,
    };
    for (t, name) in TERMS.iter().enumerate() {
        for (which, slot) in [("start", &mut c.start[t]), ("limit", &mut c.limit[t])] {
            let key = format!("{which}_pref_{name}");
            *slot = non_negative(sec.f64_or(&key, *slot)?, &sec.path_of(&key))?;
        }
    }
    if !(0..4).any(|t| c.active(t)) {
        return Err(ConfigError::invalid(
            sec.path().to_string(),
            "no loss term is active: each of dos, cdf, ados and acdf needs both its start_pref \
             and limit_pref non-zero to be trained",
        ));
    }
    Ok(c)
}

//! The top-level `optimizer` section: Adam only.

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{Schema, Section};

type Result<T> = std::result::Result<T, ConfigError>;

/// `torch.optim.Adam` as DeePMD-kit's PT backend uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerConfig {
    pub adam_beta1: f64,
    pub adam_beta2: f64,
}

impl OptimizerConfig {
    /// torch's default, which DeePMD-kit does not expose as a key.
    pub const EPS: f64 = 1e-8;
}

static OPTIMIZER: Schema = Schema {
    keys: &[&["adam_beta1", "adam_beta2"]],
    unsupported: &[&[
        ("type", "the only optimizer dpw implements"),
        ("weight_decay", "weight decay is not implemented"),
    ]],
    ignored: &[],
    deepmd: "optimizer",
};

fn beta(sec: &Section, key: &str, default: f64) -> Result<f64> {
    let b = sec.f64_or(key, default)?;
    if (0.0..1.0).contains(&b) {
        Ok(b)
    } else {
        Err(ConfigError::invalid(
            sec.path_of(key),
            format!("must be in [0, 1), found {b}"),
        ))
    }
}

pub(super) fn parse(v: Option<&Value>, path: &str) -> Result<OptimizerConfig> {
    let empty = json!({});
    let sec = Section::new(v.unwrap_or(&empty), path, &OPTIMIZER)?;
    Ok(OptimizerConfig {
        adam_beta1: beta(&sec, "adam_beta1", 0.9)?,
        adam_beta2: beta(&sec, "adam_beta2", 0.999)?,
    })
}

impl OptimizerConfig {
    pub(super) fn to_json(&self) -> Value {
        json!({
            "adam_beta1": self.adam_beta1,
            "adam_beta2": self.adam_beta2,
        })
    }
}

//! The top-level `optimizer` section: Adam and AdamW (DeePMD-kit's PT backend's torch.optim
//! classes), with their weight decay.

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{Schema, Section};
type Result<T> = std::result::Result<T, ConfigError>;

/// torch's weight decay of a parameter p with gradient g at learning rate lr.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum WeightDecay {
    #[default]
    None,
    /// torch.optim.Adam's `weight_decay` λ: an L2 term, g + λp, before the moments.
    L2(f64),
    /// torch.optim.AdamW's: p·(1 − lr·λ) before the update.
    Decoupled(f64),
}

/// `torch.optim.Adam` or `torch.optim.AdamW` as DeePMD-kit's PT backend uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerConfig {
    /// `type`: AdamW when true.
    pub adamw: bool,
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    /// λ: Adam's L2 term, AdamW's decoupled decay.
    pub weight_decay: f64,
}

/// DeePMD-kit's default: Adam, β = (0.9, 0.999), no decay.
impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            adamw: false,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            weight_decay: 0.0,
        }
    }
}

impl OptimizerConfig {
    /// torch's default, which DeePMD-kit does not expose as a key.
    pub const EPS: f64 = 1e-8;

    /// The decay each step applies.
    pub fn decay(&self) -> WeightDecay {
        let l = self.weight_decay;
        if l == 0.0 {
            WeightDecay::None
        } else if self.adamw {
            WeightDecay::Decoupled(l)
        } else {
            WeightDecay::L2(l)
        }
    }
}

static OPTIMIZER: Schema = Schema {
    keys: &[&["type", "adam_beta1", "adam_beta2", "weight_decay"]],
    unsupported: &[],
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
    let kind = sec.string_or("type", "Adam")?;
    let adamw = match kind.as_str() {
        "Adam" => false,
        "AdamW" => true,
        "LKF" | "AdaMuon" | "HybridMuon" => {
            return Err(ConfigError::unsupported(
                sec.path_of("type"),
                format!("dpw trains with \"Adam\" or \"AdamW\"; {kind:?} is not implemented"),
            ))
        }
        _ => {
            return Err(ConfigError::invalid(
                sec.path_of("type"),
                format!(
                    "expected one of \"Adam\", \"AdamW\" (DeePMD-kit also has \"LKF\", \
                     \"AdaMuon\", \"HybridMuon\"); found {kind:?}"
                ),
            ))
        }
    };
    // DeePMD-kit's defaults: none for Adam, 0.001 for AdamW.
    let weight_decay = sec.f64_or("weight_decay", if adamw { 1e-3 } else { 0.0 })?;
    if !(weight_decay >= 0.0 && weight_decay.is_finite()) {
        return Err(ConfigError::invalid(
            sec.path_of("weight_decay"),
            format!("must be a finite number ≥ 0, found {weight_decay}"),
        ));
    }
    Ok(OptimizerConfig {
        adamw,
        adam_beta1: beta(&sec, "adam_beta1", 0.9)?,
        adam_beta2: beta(&sec, "adam_beta2", 0.999)?,
        weight_decay,
    })
}

impl OptimizerConfig {
    pub(super) fn to_json(&self) -> Value {
        json!({
            "type": if self.adamw { "AdamW" } else { "Adam" },
            "adam_beta1": self.adam_beta1,
            "adam_beta2": self.adam_beta2,
            "weight_decay": self.weight_decay,
        })
    }
}

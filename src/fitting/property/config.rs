//! The property fitting's keys in input.json (DeePMD-kit 3.2.0's `fitting_property` and
//! `loss_property` arguments), with DeePMD-kit's defaults.

use serde_json::{json, Value};

use crate::config::error::ConfigError;
use crate::config::keys::{at_least_one, positive, to_list, to_str, Schema, Section};

use super::head::metric_values;
use super::PropertySpec;
use crate::fitting::traits::LossType;

type Result<T> = std::result::Result<T, ConfigError>;

/// The keys of `fitting_net` with `"type": "property"` that `parse_output` reads; the
/// fitting's shared keys (neuron, resnet_dt, fparam, ...) are read with `ener`'s.
pub const OUTPUT_KEYS: &[&str] = &[
    "type",
    "property_name",
    "task_dim",
    "intensive",
    "distinguish_types",
];

/// What the property fitting puts out.
pub(crate) fn parse_output(sec: &Section) -> Result<PropertySpec> {
    let name = sec.required("property_name", "the label's name, e.g. \"band_prop\"")?;
    let p = sec.path_of("property_name");
    let property_name = to_str(name, &p)?.to_string();
    if property_name.is_empty() || property_name.contains(['/', '\\']) {
        return Err(ConfigError::invalid(
            p,
            "must name a data file {property_name}.npy (no path separators)",
        ));
    }
    let task_dim = sec.usize_or("task_dim", 1)?;
    at_least_one(task_dim, &sec.path_of("task_dim"))?;
    Ok(PropertySpec {
        property_name,
        task_dim,
        intensive: sec.bool_or("intensive", false)?,
        distinguish_types: sec.bool_or("distinguish_types", true)?,
    })
}

/// The property keys as out.json writes them.
pub fn output_json(p: &PropertySpec) -> Value {
    json!({
        "type": "property",
        "property_name": p.property_name,
        "task_dim": p.task_dim,
        "intensive": p.intensive,
        "distinguish_types": p.distinguish_types,
    })
}

/// `loss.loss_func`: what the loss sums over frames and components.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossFunc {
    SmoothMae,
    Mae,
    Mse,
    Rmse,
    Mape,
}

impl LossFunc {
    pub(crate) const ALL: [(LossFunc, &'static str); 5] = [
        (LossFunc::SmoothMae, "smooth_mae"),
        (LossFunc::Mae, "mae"),
        (LossFunc::Mse, "mse"),
        (LossFunc::Rmse, "rmse"),
        (LossFunc::Mape, "mape"),
    ];

    pub fn as_str(self) -> &'static str {
        (Self::ALL.iter())
            .find(|(f, _)| *f == self)
            .expect("every function is listed")
            .1
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(f, _)| *f)
    }
}

/// The `loss` section with `"type": "property"`.
#[derive(Clone, Debug, PartialEq)]
pub struct PropertyLossConfig {
    pub loss_func: LossFunc,
    /// The metrics lcurve.out shows (DeePMD-kit's `metric`, `["mae"]`), as [`LossFunc`]s.
    pub metric: Vec<LossFunc>,
    /// smooth_mae's switch from quadratic to linear (`beta`, 1.0).
    pub beta: f64,
}

static LOSS: Schema = Schema {
    keys: &[&["type", "loss_func", "metric", "beta"]],
    unsupported: &[],
    ignored: &[],
    deepmd: "loss[property]",
};

fn func(v: &Value, path: &str) -> Result<LossFunc> {
    let name = to_str(v, path)?;
    LossFunc::parse(name).ok_or_else(|| {
        ConfigError::invalid(
            path,
            format!("{name:?} is not one of \"smooth_mae\", \"mae\", \"mse\", \"rmse\", \"mape\""),
        )
    })
}

pub fn parse_loss(v: &Value, path: &str) -> Result<PropertyLossConfig> {
    let sec = Section::new(v, path, &LOSS)?;
    let loss_func = match sec.get("loss_func") {
        Some(v) => func(v, &sec.path_of("loss_func"))?,
        None => LossFunc::SmoothMae,
    };
    let metric = match sec.get("metric") {
        Some(v) => {
            let p = sec.path_of("metric");
            let items = to_list(v, &p, "a list of metric names")?;
            (items.iter().enumerate())
                .map(|(i, x)| func(x, &format!("{p}[{i}]")))
                .collect::<Result<Vec<_>>>()?
        }
        None => vec![LossFunc::Mae],
    };
    let beta = sec.f64_or("beta", 1.0)?;
    if loss_func == LossFunc::SmoothMae {
        positive(beta, &sec.path_of("beta"))?;
    }
    Ok(PropertyLossConfig {
        loss_func,
        metric,
        beta,
    })
}

impl LossType for PropertyLossConfig {
    fn type_name(&self) -> &'static str {
        "property"
    }

    fn metric_values(&self, sums: &[f64], nvalues: usize, _: usize) -> Vec<Option<f64>> {
        metric_values(self, sums, nvalues).to_vec()
    }

    fn to_json(&self) -> Value {
        json!({
            "type": "property",
            "loss_func": self.loss_func.as_str(),
            "metric": self.metric.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            "beta": self.beta,
        })
    }
}

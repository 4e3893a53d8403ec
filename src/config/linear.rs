//! The input's `"type": "linear_ener"` models (docs/deepmd-spec.md §19.9): several DP models
//! whose atomic energies are summed with weights, or one DP model and a pair table (pairtab.rs).

use std::path::Path;

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{join, to_f64, to_list, wrong_type, Schema, Section};
use super::model::{check_type, parse, DescriptorConfig, ModelConfig};
use crate::model::linear::Weights;

type Result<T> = std::result::Result<T, ConfigError>;

/// A linear model's DP models after the first (which is the [`ModelConfig`] itself), and the
/// weights of all.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearConfig {
    pub weights: Weights,
    pub more: Vec<ModelConfig>,
}

pub(super) static LINEAR: Schema = Schema {
    keys: &[&[
        "type",
        "type_map",
        "models",
        "weights",
        "data_stat_nbatch",
        "data_stat_protect",
    ]],
    unsupported: &[&[(
        "shared_dict",
        "parts shared between a linear model's models are not implemented",
    )]],
    ignored: &[],
    deepmd: "model",
};

/// A `linear_ener` model at `path`.
pub(super) fn parse_linear(v: &Value, path: &str, base_dir: &Path) -> Result<ModelConfig> {
    let sec = Section::new(v, path, &LINEAR)?;
    let models_path = sec.path_of("models");
    let models = to_list(
        sec.required(
            "models",
            "a list of DP models, or of a DP model and a pairtab model",
        )?,
        &models_path,
        "a list of models",
    )?;
    let is_table = |m: &Value| m.get("type").and_then(Value::as_str) == Some("pairtab");
    if models.iter().any(is_table) {
        return super::pairtab::linear(&sec, models, base_dir);
    }
    if models.is_empty() {
        return Err(ConfigError::invalid(
            models_path,
            "is empty: give the DP models to sum",
        ));
    }
    let mut members = (0..models.len())
        .map(|k| {
            let m = member(&sec, models, k, base_dir)?;
            linear_ener_only(&m, &format!("{models_path}[{k}]"))?;
            Ok(m)
        })
        .collect::<Result<Vec<_>>>()?;
    let weights = weights(&sec, models.len())?;
    let mut first = members.remove(0);
    first.linear = Some(LinearConfig {
        weights,
        more: members,
    });
    Ok(first)
}

/// DP model `k` of a linear model's `models` (the section `sec`), with the linear model's
/// type_map and statistics settings.
pub(super) fn member(
    sec: &Section,
    models: &[Value],
    k: usize,
    base_dir: &Path,
) -> Result<ModelConfig> {
    let dp_path = format!("{}[{k}]", sec.path_of("models"));
    let mut dp = models[k].clone();
    check_type(&dp, &dp_path)?;
    if dp.get("use_srtab").is_some_and(|t| !t.is_null()) {
        return Err(ConfigError::unsupported(
            join(&dp_path, "use_srtab"),
            "a pair table inside a linear model's DP model is not implemented",
        ));
    }
    // The sub-model takes the linear model's type_map unless it gives its own (TensorFlow's
    // inputs give it there alone), which must be the same: dpw maps no types between models.
    match (sec.get("type_map"), dp.get("type_map")) {
        (Some(type_map), None) => {
            if let Some(o) = dp.as_object_mut() {
                o.insert("type_map".into(), type_map.clone());
            }
        }
        (Some(type_map), Some(t)) if t != type_map => {
            return Err(ConfigError::unsupported(
                join(&dp_path, "type_map"),
                "differs from the linear model's type_map; dpw's models share one type_map",
            ))
        }
        _ => {}
    }
    // The linear model's statistics settings are the model's.
    for key in ["data_stat_nbatch", "data_stat_protect"] {
        if let (Some(x), Some(o)) = (sec.get(key), dp.as_object_mut()) {
            o.insert(key.into(), x.clone());
        }
    }
    let model = parse(&dp, &dp_path, base_dir)?;
    mixed_only(&model.descriptor, &join(&dp_path, "descriptor.type"))?;
    Ok(model)
}

/// DeePMD-kit's `LinearEnergyAtomicModel` (and so use_srtab) takes mixed-type models only.
pub(super) fn mixed_only(d: &DescriptorConfig, path: &str) -> Result<()> {
    if d.kind.is_mixed() {
        return Ok(());
    }
    Err(ConfigError::unsupported(
        path,
        format!(
            "a linear model (or a pair table) takes only mixed-type descriptors ({}), as \
             DeePMD-kit does (\"only supports AtomicModel of mixed type\"); not {}",
            crate::model::registry::mixed_type_names(),
            d.r#type
        ),
    ))
}

/// What dpw sums: energy models without frame or atomic parameters.
fn linear_ener_only(m: &ModelConfig, path: &str) -> Result<()> {
    let f = &m.fitting_net;
    if !f.output.is_ener() {
        return Err(ConfigError::unsupported(
            join(path, "fitting_net.type"),
            "a linear_ener model sums energy models; this is another fitting",
        ));
    }
    if f.numb_fparam + f.numb_aparam > 0 {
        return Err(ConfigError::unsupported(
            join(path, "fitting_net"),
            "frame or atomic parameters in a linear model of several DP models are not \
             implemented",
        ));
    }
    Ok(())
}

/// `weights`: "sum", "mean" or one number per model (DeePMD-kit's default: "mean").
pub(super) fn weights(sec: &Section, n: usize) -> Result<Weights> {
    let path = sec.path_of("weights");
    let expected = format!("\"sum\", \"mean\" or a list of {n} numbers (one per model)");
    match sec.get("weights") {
        None => Ok(Weights::Mean),
        Some(Value::String(s)) if s == "sum" => Ok(Weights::Sum),
        Some(Value::String(s)) if s == "mean" => Ok(Weights::Mean),
        Some(Value::Array(a)) if a.len() == n => Ok(Weights::List(
            (a.iter().enumerate())
                .map(|(i, x)| to_f64(x, &format!("{path}[{i}]")))
                .collect::<Result<_>>()?,
        )),
        Some(x) => Err(wrong_type(&path, &expected, x)),
    }
}

pub(super) fn weights_json(w: &Weights) -> Value {
    match w {
        Weights::Sum => json!("sum"),
        Weights::Mean => json!("mean"),
        Weights::List(l) => json!(l),
    }
}

/// out.json's linear model around the standard sections of its models (each with the
/// type_map; the statistics settings are the linear model's).
pub(super) fn linear_json(weights: &Weights, mut models: Vec<Value>) -> Value {
    let mut take = |key: &str| {
        let v = models[0].get(key).cloned();
        for m in &mut models {
            if let Some(o) = m.as_object_mut() {
                o.remove(key);
            }
        }
        v
    };
    let (nbatch, protect) = (take("data_stat_nbatch"), take("data_stat_protect"));
    json!({
        "type": "linear_ener",
        "type_map": models[0].get("type_map"),
        "weights": weights_json(weights),
        "data_stat_nbatch": nbatch,
        "data_stat_protect": protect,
        "models": models,
    })
}

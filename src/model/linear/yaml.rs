//! The serialization of a linear model of DP models (docs/deepmd-spec.md §19.9): DeePMD-kit's
//! `linear` model node, a list of `standard` models with the weights and the linear model's
//! out_bias at the top. Each member's own out_bias (DeePMD-kit adds it, weighted, before the
//! linear model's) is folded into the one bias dpw keeps.

use anyhow::{ensure, Result};
use serde_yaml_ng::Value;

use super::{Model, Weights};
use crate::model::yaml::{standard_model, Nodes, YamlModel};
use crate::yaml_tree::{ndarray, obj, At};

#[rustfmt::skip]
const LINEAR_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "models", "type_map", "weights",
    "atom_exclude_types", "pair_exclude_types", "rcond", "preset_out_bias",
];

/// Whether the model node `m` is a linear model of DP models alone (no pair table).
pub fn is_linear_of_models(m: &At) -> Result<bool> {
    if m.opt("type").map(|t| t.str()).transpose()? != Some("linear") {
        return Ok(false);
    }
    let models = m.key("models")?.seq()?;
    for x in &models {
        if x.opt("type")
            .map(|t| t.str())
            .transpose()?
            .is_some_and(|t| t != "standard")
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The linear model at `m`.
pub fn read(m: &At) -> Result<YamlModel> {
    m.known(&[LINEAR_KEYS])?;
    m.version(2..=3, Some(2))?;
    m.expect_off("pair_exclude_types")?;
    m.expect_off("atom_exclude_types")?;
    m.expect_off("preset_out_bias")?;
    let nt = m.key("type_map")?.seq()?.len();
    let nodes = m.key("models")?.seq()?;
    let weights = read_weights(&m.key("weights")?, nodes.len())?;
    let mut bias = m.key("@variables")?.key("out_bias")?.array(&[1, nt, 1])?;
    let mut members = Vec::with_capacity(nodes.len());
    for (node, w) in nodes.iter().zip(weights.of(nodes.len())) {
        let ym = standard_model(node)?;
        ensure!(
            ym.atom_ener.is_none(),
            "{}.fitting.atom_ener: not supported in a linear model",
            node.path
        );
        for (b, own) in bias.iter_mut().zip(&ym.model.bias) {
            *b += w * own;
        }
        members.push(ym.model);
    }
    let model = Model::linear(&members, weights, bias);
    model.check()?;
    Ok(YamlModel {
        model,
        atom_ener: None,
    })
}

/// The model node and the input's model section of the linear model of `members` (each its
/// standard model's nodes) with `weights` and the linear model's bias node `out_bias`.
pub fn write(
    members: Vec<Nodes>,
    weights: &Weights,
    out_bias: Value,
    type_map: &[String],
) -> Nodes {
    let nt = type_map.len();
    let one = ndarray(&[1, nt, 1], &vec![1.0; nt]);
    let none: &[usize] = &[];
    let (nodes, defs): (Vec<Value>, Vec<Value>) = members.into_iter().unzip();
    let node = obj! {
        "@class" => "Model", "@version" => 3,
        "@variables" => obj! { "out_bias" => out_bias, "out_std" => one },
        "atom_exclude_types" => none, "models" => nodes, "pair_exclude_types" => none,
        "preset_out_bias" => Value::Null, "rcond" => Value::Null, "type" => "linear",
        "type_map" => type_map, "weights" => weights_value(weights),
    };
    let def = obj! {
        "type" => "linear_ener", "type_map" => type_map, "weights" => weights_value(weights),
        "models" => defs,
    };
    (node, def)
}

/// A linear model's `weights`: "sum", "mean" or one number per model.
pub fn read_weights(w: &At, nmodels: usize) -> Result<Weights> {
    Ok(match w.v {
        Value::String(s) if s == "sum" => Weights::Sum,
        Value::String(s) if s == "mean" => Weights::Mean,
        Value::Sequence(_) => {
            let list = w.seq()?.iter().map(At::f64).collect::<Result<Vec<_>>>()?;
            ensure!(
                list.len() == nmodels,
                "{}: {} weights for {nmodels} models",
                w.path,
                list.len()
            );
            Weights::List(list)
        }
        _ => return w.fail("\"sum\", \"mean\" or a list of numbers, one per model"),
    })
}

/// `weights` as the input and the serialization write it.
pub fn weights_value(w: &Weights) -> Value {
    match w {
        Weights::Sum => "sum".into(),
        Weights::Mean => "mean".into(),
        Weights::List(l) => l[..].into(),
    }
}

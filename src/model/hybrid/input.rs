//! hybrid's keys in input.json (DeePMD-kit 3.2.0's `descrpt_hybrid_args`: its list of
//! sub-descriptors, each read by its own type), and their out.json form.

use anyhow::bail;
use serde_json::{json, Map, Value};

use crate::config::error::ConfigError;
use crate::config::keys::{join, to_list, Schema, Section};
use crate::config::model::{descriptor_json, parse_descriptor, DescriptorConfig, Precision, Sel};
use crate::model::{DescriptorSpec, DescriptorType, OwnKeys};

type Result<T> = std::result::Result<T, ConfigError>;

/// hybrid's keys (DeePMD-kit 3.2.0's `descrpt_hybrid_args`): its list of sub-descriptors.
static DESCRIPTOR_HYBRID: Schema = Schema {
    keys: &[&["type", "list"]],
    unsupported: &[],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// `hybrid`: `list`, a non-empty list of descriptors, each parsed by its own type's schema.
pub(crate) fn parse(
    _: DescriptorType,
    v: &Value,
    path: &str,
    ntypes: usize,
) -> Result<DescriptorConfig> {
    let sec = Section::new(v, path, &DESCRIPTOR_HYBRID)?;
    let lpath = sec.path_of("list");
    let expected = "a non-empty list of descriptors, e.g. [{\"type\": \"se_e2_a\", ...}, \
                    {\"type\": \"se_e2_r\", ...}]";
    let items = to_list(sec.required("list", expected)?, &lpath, expected)?;
    if items.is_empty() {
        return Err(ConfigError::invalid(
            &lpath,
            format!("is empty; expected {expected}"),
        ));
    }
    let list = (items.iter().enumerate())
        .map(|(i, item)| {
            let ipath = format!("{lpath}[{i}]");
            let d = parse_descriptor(item, &ipath, ntypes, true)?;
            if matches!(d.sel, Sel::Auto(_)) {
                return Err(ConfigError::unsupported(
                    join(&ipath, "sel"),
                    "sel \"auto\" (or no sel) inside hybrid is not supported; give each \
                     sub-descriptor's sel as numbers, one per type",
                ));
            }
            Ok(d)
        })
        .collect::<Result<Vec<_>>>()?;
    // dpw trains a model in one precision: float64 where any part asks for it
    // (train::setup::model_precision warns of the others).
    let precision = match list.iter().any(|d| d.precision == Precision::F64) {
        true => Precision::F64,
        false => Precision::F32,
    };
    let fixed = |d: &DescriptorConfig| match &d.sel {
        Sel::Fixed(s) => s.clone(),
        Sel::Auto(_) => unreachable!("refused inside hybrid"),
    };
    let sel = (0..ntypes)
        .map(|t| list.iter().map(|d| fixed(d)[t]).max().unwrap_or(0))
        .collect();
    Ok(DescriptorConfig {
        kind: DescriptorType::Hybrid,
        r#type: "hybrid".into(),
        sel: Sel::Fixed(sel),
        rcut: list.iter().map(|d| d.rcut).fold(0.0, f64::max),
        rcut_smth: (list.iter().map(|d| d.rcut_smth)).fold(f64::INFINITY, f64::min),
        neuron: vec![],
        axis_neuron: 0,
        resnet_dt: false,
        type_one_side: false,
        precision,
        trainable: list.iter().all(|d| d.trainable),
        seed: None,
        env_protection: 0.0,
        set_davg_zero: false,
        auto_lists: vec![],
        own: OwnKeys::Hybrid(list),
    })
}

/// A hybrid as out.json writes it: its type and its list.
pub(crate) fn to_json(d: &DescriptorConfig) -> Value {
    json!({
        "type": d.r#type,
        "list": d.own.list().iter().map(descriptor_json).collect::<Vec<_>>(),
    })
}

/// None of its own: its keys are its list's, which `ModelSpec::differences` compares part by
/// part.
pub(crate) fn spec_keys(_: &DescriptorSpec) -> Map<String, Value> {
    Map::new()
}

/// A hybrid's parts are checked one by one (`ModelSpec::check`); this is asked of a part alone,
/// where a hybrid is refused.
pub(crate) fn check(_: &DescriptorSpec, _: usize, key: &str) -> anyhow::Result<()> {
    bail!("{key}.type: a hybrid descriptor inside hybrid is not supported")
}

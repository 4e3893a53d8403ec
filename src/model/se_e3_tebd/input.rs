//! se_e3_tebd's keys in input.json (`"type": "se_e3_tebd"`: DeePMD-kit 3.2.0's
//! `descrpt_se_e3_tebd_args`, docs/deepmd-spec.md §20.1), and their out.json form.

use serde_json::{Map, Value};

use crate::config::block_keys::{activation, tebd_input_mode};
use crate::config::error::ConfigError;
use crate::config::keys::{at_least_one, non_negative, Schema, Section};
use crate::config::model::{cutoffs, mixed_sel, precision, type_pairs, widths, DescriptorConfig};
use crate::model::check::own_widths;
use crate::model::se_e3_tebd::{SeE3TebdConfig, Shared};
use crate::model::OwnKeys;
use crate::model::{DescriptorSpec, DescriptorType};

type Result<T> = std::result::Result<T, ConfigError>;

static DESCRIPTOR: Schema = Schema {
    keys: &[&[
        "type",
        "sel",
        "rcut",
        "rcut_smth",
        "neuron",
        "tebd_dim",
        "tebd_input_mode",
        "resnet_dt",
        "set_davg_zero",
        "activation_function",
        "env_protection",
        "smooth",
        "exclude_types",
        "precision",
        "trainable",
        "seed",
        "concat_output_tebd",
        "use_tebd_bias",
    ]],
    unsupported: &[&[(
        "use_econf_tebd",
        "the electronic-configuration type embedding is not implemented",
    )]],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// The `se_e3_tebd` descriptor of input.json (not in a hybrid), at argcheck's defaults (which
/// differ from the class's in neuron and use_tebd_bias, spec §20.1).
pub(crate) fn parse(
    _: DescriptorType,
    v: &Value,
    path: &str,
    ntypes: usize,
) -> Result<DescriptorConfig> {
    let sec = Section::new(v, path, &DESCRIPTOR)?;
    let (rcut, rcut_smth) = cutoffs(&sec)?;
    let trainable = sec.bool_or("trainable", true)?;
    let c = SeE3TebdConfig {
        tebd_dim: at_least_one(sec.usize_or("tebd_dim", 8)?, &sec.path_of("tebd_dim"))?,
        tebd_input_mode: tebd_input_mode(&sec)?,
        activation: activation(&sec, "tanh", "se_e3_tebd")?,
        smooth: sec.bool_or("smooth", true)?,
        exclude_types: type_pairs(&sec, ntypes)?,
        concat_output_tebd: sec.bool_or("concat_output_tebd", true)?,
        use_tebd_bias: sec.bool_or("use_tebd_bias", true)?,
        trainable,
    };
    Ok(DescriptorConfig {
        kind: DescriptorType::SeE3Tebd,
        r#type: "se_e3_tebd".into(),
        sel: mixed_sel(&sec)?,
        rcut,
        rcut_smth,
        neuron: widths(&sec, "neuron", &[10, 20, 40])?,
        axis_neuron: 1,
        resnet_dt: sec.bool_or("resnet_dt", false)?,
        type_one_side: false,
        precision: precision(&sec)?,
        trainable,
        seed: sec.opt_u64("seed")?,
        env_protection: non_negative(
            sec.f64_or("env_protection", 0.0)?,
            &sec.path_of("env_protection"),
        )?,
        set_davg_zero: sec.bool_or("set_davg_zero", true)?,
        auto_lists: vec![],
        own: OwnKeys::SeE3Tebd(c),
    })
}

/// The descriptor as out.json writes it: every key at its value, as `dp train` fills them.
pub(crate) fn to_json(d: &DescriptorConfig) -> Value {
    let c = d.own.se_e3_tebd().expect("an se_e3_tebd config");
    let shared = Shared {
        sel: d.sel.to_value(),
        rcut: d.rcut,
        rcut_smth: d.rcut_smth,
        neuron: &d.neuron,
        resnet_dt: d.resnet_dt,
        set_davg_zero: d.set_davg_zero,
        env_protection: d.env_protection,
    };
    let mut v = c.input_json(&shared, d.precision.as_str());
    v["seed"] = d.seed.into();
    v
}

/// Its keys as input.json gives them, read back from a spec (`ModelSpec::differences` compares
/// them).
pub(crate) fn spec_keys(d: &DescriptorSpec) -> Map<String, Value> {
    let c = d
        .own
        .se_e3_tebd()
        .expect("a se_e3_tebd spec holds its keys");
    let Value::Object(mut m) = c.input_json(&d.into(), "float64") else {
        unreachable!("built from an object literal")
    };
    m.remove("type");
    m.remove("precision");
    m
}

/// Its own keys' ranges, after the ones every descriptor shares (`ModelSpec::check`).
pub(crate) fn check(d: &DescriptorSpec, _: usize, key: &str) -> anyhow::Result<()> {
    let c = d
        .own
        .se_e3_tebd()
        .expect("a se_e3_tebd spec holds its keys");
    own_widths(key, &[("tebd_dim", c.tebd_dim)])
}

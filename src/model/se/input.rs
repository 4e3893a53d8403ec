//! The se family's keys in input.json (`se_e2_a`, `se_e2_r`, `se_e3`: DeePMD-kit 3.2.0's
//! `descrpt_se_a_args`, `descrpt_se_r_args`, `descrpt_se_t_args`), and their out.json form; DPA-1
//! (`se_atten/input.rs`) reads and writes these keys too.

use anyhow::ensure;
use serde_json::{json, Map, Value};

use crate::config::error::ConfigError;
use crate::config::keys::{Schema, Section};
use crate::config::model::{cutoffs, object, precision, widths, DescriptorConfig, Sel};
use crate::model::check::shared_keys;
use crate::model::{DescriptorSpec, DescriptorType, OwnKeys};

type Result<T> = std::result::Result<T, ConfigError>;

const TANH_ONLY: &str = "the only activation dpw implements";

/// The keys every se_* and DPA-1 descriptor has (DeePMD-kit 3.2.0's `descrpt_se_a_args` and
/// its siblings share them).
pub(crate) const SE_KEYS: &[&str] = &[
    "type",
    "sel",
    "rcut",
    "rcut_smth",
    "neuron",
    "resnet_dt",
    "precision",
    "trainable",
    "seed",
    "env_protection",
    "set_davg_zero",
];

/// What dpw does not implement for any se_* descriptor.
pub(crate) const SE_UNSUPPORTED: &[(&str, &str)] = &[
    ("activation_function", TANH_ONLY),
    ("exclude_types", "type exclusion is not implemented"),
];

/// se_e2_a's keys (`descrpt_se_a_args`).
static DESCRIPTOR: Schema = Schema {
    keys: &[SE_KEYS, &["axis_neuron", "type_one_side"]],
    unsupported: &[SE_UNSUPPORTED],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// se_e2_r's keys: se_e2_a's without `axis_neuron` (DeePMD-kit 3.2.0's `descrpt_se_r_args`).
static DESCRIPTOR_R: Schema = Schema {
    keys: &[SE_KEYS, &["type_one_side"]],
    unsupported: &[SE_UNSUPPORTED],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// se_e3's keys (DeePMD-kit 3.2.0's `descrpt_se_t_args`): no axis_neuron, no type_one_side.
static DESCRIPTOR_T: Schema = Schema {
    keys: &[SE_KEYS],
    unsupported: &[SE_UNSUPPORTED],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// An se_e2_a, se_e2_r or se_e3 descriptor of input.json at `path`.
pub(crate) fn parse(
    descriptor: DescriptorType,
    v: &Value,
    path: &str,
    ntypes: usize,
) -> Result<DescriptorConfig> {
    let schema = match descriptor {
        DescriptorType::SeE2R => &DESCRIPTOR_R,
        DescriptorType::SeE3 => &DESCRIPTOR_T,
        _ => &DESCRIPTOR,
    };
    let sec = Section::new(v, path, schema)?;
    let sel = match sec.get("sel") {
        Some(v) => Sel::parse(v, &sec.path_of("sel"), ntypes)?,
        None => Sel::Auto(1.1),
    };
    shared(descriptor, &sec, sel)
}

/// The keys the se family and DPA-1 share, read from `sec` (`own` left `Se`); `sel` as read.
pub(crate) fn shared(
    descriptor: DescriptorType,
    sec: &Section,
    sel: Sel,
) -> Result<DescriptorConfig> {
    let (rcut, rcut_smth) = cutoffs(sec)?;
    let neuron = widths(sec, "neuron", &[10, 20, 40])?;
    // se_e2_r and se_e3 have no second factor (M2 = 1). DeePMD-kit 3.2.0's se_e2_r has one
    // embedding net per neighbour type only: its dpmodel refuses `type_one_side: false`, its
    // PyTorch backend ignores it; se_e3's nets are per pair of neighbour types and its schema
    // has no type_one_side key.
    let (axis_neuron, type_one_side) = match descriptor {
        DescriptorType::SeE2R => {
            if !sec.bool_or("type_one_side", true)? {
                return Err(ConfigError::unsupported(
                    sec.path_of("type_one_side"),
                    "se_e2_r has one embedding net per neighbour type only (DeePMD-kit 3.2.0 \
                     has no type_one_side false for it); remove the key or set it to true",
                ));
            }
            (1, true)
        }
        DescriptorType::SeE3 => (1, false),
        _ => (
            sec.usize_or("axis_neuron", 4)?,
            sec.bool_or("type_one_side", false)?,
        ),
    };
    let m1 = *neuron.last().expect("widths() is non-empty");
    if axis_neuron == 0 || axis_neuron > m1 {
        return Err(ConfigError::invalid(
            sec.path_of("axis_neuron"),
            format!("must be between 1 and the last embedding width ({m1}), found {axis_neuron}"),
        ));
    }
    Ok(DescriptorConfig {
        kind: descriptor,
        r#type: descriptor.as_str().into(),
        sel,
        rcut,
        rcut_smth,
        neuron,
        axis_neuron,
        resnet_dt: sec.bool_or("resnet_dt", false)?,
        type_one_side,
        precision: precision(sec)?,
        trainable: sec.bool_or("trainable", true)?,
        seed: sec.opt_u64("seed")?,
        env_protection: sec.f64_or("env_protection", 0.0)?,
        // DeePMD-kit 3.2.0: true for se_atten, false for se_atten_v2 and the others.
        set_davg_zero: sec.bool_or("set_davg_zero", descriptor == DescriptorType::SeAtten)?,
        own: OwnKeys::Se,
        auto_lists: vec![],
    })
}

/// The keys of the se family as out.json writes them (DPA-1 adds its own).
pub(crate) fn to_json(d: &DescriptorConfig) -> Value {
    let mut descriptor = json!({
        "type": d.r#type,
        "sel": d.sel.to_value(),
        "rcut": d.rcut,
        "rcut_smth": d.rcut_smth,
        "neuron": d.neuron,
        "axis_neuron": d.axis_neuron,
        "resnet_dt": d.resnet_dt,
        "type_one_side": d.type_one_side,
        "precision": d.precision.as_str(),
        "trainable": d.trainable,
        "seed": d.seed,
        "env_protection": d.env_protection,
        "set_davg_zero": d.set_davg_zero,
    });
    let o = object(&mut descriptor);
    match d.kind {
        DescriptorType::SeE2R => {
            o.remove("axis_neuron");
        }
        DescriptorType::SeE3 => {
            o.remove("axis_neuron");
            o.remove("type_one_side");
        }
        _ => {}
    }
    descriptor
}

/// Its keys as input.json gives them, read back from a spec (`ModelSpec::differences` compares
/// them): se_e2_r and se_e3 have no axis_neuron, se_e3 no type_one_side.
pub(crate) fn spec_keys(d: &DescriptorSpec) -> Map<String, Value> {
    let kind = d.kind;
    shared_keys(
        d,
        kind == DescriptorType::SeE2A,
        kind != DescriptorType::SeE3,
    )
}

/// Its own keys' ranges, after the ones every descriptor shares (`ModelSpec::check`).
pub(crate) fn check(d: &DescriptorSpec, nt: usize, key: &str) -> anyhow::Result<()> {
    ensure!(
        d.sel.len() == nt,
        "{key}.sel: {} entries for {nt} types in type_map",
        d.sel.len()
    );
    Ok(())
}

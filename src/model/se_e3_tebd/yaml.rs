//! se_e3_tebd in DeePMD-kit's `.yaml` (`DescrptSeTTebd.serialize`, docs/deepmd-spec.md §20.9):
//! its keys into a [`DescriptorSpec`], its tensors into the parameter vector, and back.

use anyhow::{ensure, Result};
use serde_yaml_ng::Value;

use super::{SeE3TebdConfig, Shared};
use crate::model::yaml::{one_net_tree, read_embeddings, read_tebd, stats_tree};
use crate::model::yaml::{tebd_tree, DescriptorYaml};
use crate::model::yaml_block::{
    activation, count, env_mat, flag, merge, number, one_hot_tebd, read_type_pairs,
    tebd_input_mode, widths, yaml,
};
use crate::model::OwnKeys;
use crate::model::{DescriptorLayout, DescriptorSpec, DescriptorType};
use crate::yaml_tree::{obj, At};

// The keys DeePMD-kit 3.2.0's constructor takes and the nodes its `deserialize` takes out
// first: it passes the rest to the constructor, which refuses any other key, as this reader
// does.
#[rustfmt::skip]
const KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "embeddings", "embeddings_strip",
    "type_embedding", "env_mat", "compress", "rcut", "rcut_smth", "sel", "ntypes", "neuron",
    "tebd_dim", "tebd_input_mode", "resnet_dt", "set_davg_zero", "activation_function",
    "env_protection", "exclude_types", "precision", "trainable", "seed", "type_map",
    "concat_output_tebd", "use_econf_tebd", "use_tebd_bias", "smooth",
];

/// se_e3_tebd's entry in the registry.
pub(in crate::model) static YAML: DescriptorYaml = DescriptorYaml {
    read_spec,
    read_params,
    write,
    stat_nodes: crate::model::yaml::own_stats,
};

/// The descriptor's keys, at the class's defaults where absent. use_tebd_bias is the type
/// embedding's own (the serialization leaves it out and `deserialize` replaces the class's
/// type embedding by the file's).
pub(in crate::model) fn read_spec(d: &At, _: DescriptorType, nt: usize) -> Result<DescriptorSpec> {
    d.version(1..=2, None)?;
    d.known(&[KEYS])?;
    d.expect_off("compress")?;
    one_hot_tebd(d, nt)?;
    let sel = d.key("sel")?;
    let nnei = match sel.v {
        Value::Sequence(_) => sel.usizes()?.iter().sum(),
        _ => sel.usize()?,
    };
    let te = d.key("type_embedding")?;
    let c = SeE3TebdConfig {
        tebd_dim: count(d, "tebd_dim", 8)?,
        tebd_input_mode: tebd_input_mode(d)?,
        activation: activation(d)?,
        smooth: flag(d, "smooth", true)?,
        exclude_types: read_type_pairs(d, nt)?,
        concat_output_tebd: flag(d, "concat_output_tebd", true)?,
        // TypeEmbedNet's version-1 files lack it and mean true.
        use_tebd_bias: flag(&te, "use_tebd_bias", true)?,
        trainable: flag(d, "trainable", true)?,
    };
    let spec = DescriptorSpec {
        kind: DescriptorType::SeE3Tebd,
        rcut: d.key("rcut")?.f64()?,
        rcut_smth: d.key("rcut_smth")?.f64()?,
        sel: vec![nnei],
        neuron: widths(d, "neuron", &[2, 4, 8])?,
        axis_neuron: 1,
        resnet_dt: flag(d, "resnet_dt", false)?,
        type_one_side: false,
        env_protection: number(d, "env_protection", 0.0)?,
        set_davg_zero: flag(d, "set_davg_zero", true)?,
        own: OwnKeys::SeE3Tebd(c),
    };
    ensure!(spec.nnei() > 0, "{}.sel: keeps no neighbour", sel.path);
    Ok(spec)
}

/// The tensors of an se_e3_tebd node into `params`, checked against the layout.
pub(in crate::model) fn read_params(
    d: &At,
    _: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    params: &mut [f64],
) -> Result<()> {
    let l = dl.own.se_e3_tebd().expect("an se_e3_tebd layout");
    read_tebd(&d.key("type_embedding")?, &l.tebd, params)?;
    read_embeddings(d, &l.embed, l.embed_strip.as_ref(), params)
}

/// The descriptor as DeePMD-kit serialises it, and the `model_def_script` descriptor
/// (input.json's form) that builds it; davg/dstd dpw's rows `[nt][4]`, written per slot.
pub(in crate::model) fn write(
    d: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    p: &[f64],
    stats: [&[f64]; 2],
    type_map: &[String],
) -> (Value, Value) {
    let l = dl.own.se_e3_tebd().expect("an se_e3_tebd layout");
    let c = d.own.se_e3_tebd().expect("an se_e3_tebd spec");
    let type_embedding = tebd_tree(&l.tebd, c.use_tebd_bias, p, type_map);
    let nt = type_map.len();
    let act = c.activation.name();
    let net = |n| one_net_tree(n, &d.neuron, d.resnet_dt, &act, p, nt);
    let excluded: Vec<Vec<usize>> = c.exclude_types.iter().map(|p| p.to_vec()).collect();
    let descriptor = obj! {
        "@class" => "Descriptor", "type" => "se_e3_tebd", "@version" => 1,
        "rcut" => d.rcut, "rcut_smth" => d.rcut_smth, "sel" => d.sel.as_slice(), "ntypes" => nt,
        "neuron" => d.neuron.as_slice(), "tebd_dim" => c.tebd_dim,
        "tebd_input_mode" => c.tebd_input_mode.as_str(), "set_davg_zero" => d.set_davg_zero,
        "activation_function" => act.as_str(), "resnet_dt" => d.resnet_dt,
        "concat_output_tebd" => c.concat_output_tebd, "use_econf_tebd" => false,
        "type_map" => type_map, "precision" => "float64", "embeddings" => net(&l.embed),
        "env_mat" => env_mat(d.rcut, d.rcut_smth), "type_embedding" => type_embedding,
        "exclude_types" => excluded, "env_protection" => d.env_protection,
        "smooth" => c.smooth, "@variables" => stats_tree(stats, nt, d.nnei(), 4),
        "trainable" => c.trainable,
    };
    let descriptor = match &l.embed_strip {
        Some(s) => merge(descriptor, obj! { "embeddings_strip" => net(s) }),
        None => descriptor,
    };
    let def = yaml(c.input_json(&Shared::from(d), "float64"));
    (descriptor, def)
}

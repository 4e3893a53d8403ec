//! The se family in DeePMD-kit's `.yaml` (`DescrptSeA`, `DescrptSeR`, `DescrptSeT`
//! `.serialize`, docs/deepmd-spec.md §14): its keys into a [`DescriptorSpec`], its embedding nets
//! into the parameter vector, and back.

use anyhow::{ensure, Result};
use serde_yaml_ng::Value;

use crate::model::yaml::{
    env_columns, nets_tree, read_nets, some, stats_tree, DescriptorYaml, Nets, DESCRIPTOR_KEYS,
};
use crate::model::OwnKeys;
use crate::model::{pair_types, DescriptorLayout, DescriptorSpec, DescriptorType, Net};
use crate::yaml_tree::{obj, At};

/// The keys of each beside those every descriptor file has ([`DESCRIPTOR_KEYS`]).
const SE_E2_A_KEYS: &[&str] = &["axis_neuron", "type_one_side", "spin"];
const SE_R_KEYS: &[&str] = &["type_one_side", "spin"];

/// The registry's entry of se_e2_a, se_e2_r and se_e3.
pub(in crate::model) static YAML: DescriptorYaml = DescriptorYaml {
    read_spec,
    read_params,
    write,
    stat_nodes: crate::model::yaml::own_stats,
};

/// The descriptor's keys: DeePMD-kit's dpmodel writes them all.
pub(in crate::model) fn read_spec(
    d: &At,
    kind: DescriptorType,
    nt: usize,
) -> Result<DescriptorSpec> {
    d.version(1..=3, Some(1))?;
    d.known(&[
        DESCRIPTOR_KEYS,
        match kind {
            DescriptorType::SeE2A => SE_E2_A_KEYS,
            DescriptorType::SeE2R => SE_R_KEYS,
            _ => &[],
        },
    ])?;
    d.expect("activation_function", &["tanh"])?;
    d.expect_off("exclude_types")?;
    d.expect_off("spin")?;
    if let Some(env) = d.opt("env_mat") {
        env.expect_off("use_exp_switch")?;
    }
    let descriptor = DescriptorSpec {
        kind,
        rcut: d.key("rcut")?.f64()?,
        rcut_smth: d.key("rcut_smth")?.f64()?,
        sel: d.key("sel")?.usizes()?,
        neuron: d.key("neuron")?.usizes()?,
        axis_neuron: match kind {
            DescriptorType::SeE2A => d.key("axis_neuron")?.usize()?,
            _ => 1,
        },
        resnet_dt: d.key("resnet_dt")?.bool()?,
        type_one_side: match kind {
            DescriptorType::SeE3 => false,
            _ => d.key("type_one_side")?.bool()?,
        },
        // Older files may lack these two; DeePMD's defaults apply.
        env_protection: d.opt("env_protection").map_or(Ok(0.0), |a| a.f64())?,
        set_davg_zero: d.opt("set_davg_zero").map_or(Ok(false), |a| a.bool())?,
        own: OwnKeys::Se,
    };
    ensure!(
        descriptor.sel.len() == nt,
        "{}.sel: {} entries for {nt} types",
        d.path,
        descriptor.sel.len()
    );
    ensure!(!descriptor.neuron.is_empty(), "{}.neuron: empty", d.path);
    Ok(descriptor)
}

/// Its embedding nets (part `part` of a hybrid, or alone) into `params`, checked against the
/// layout: one per type with type_one_side, else one per type pair.
pub(in crate::model) fn read_params(
    d: &At,
    spec: &DescriptorSpec,
    dl: &DescriptorLayout,
    part: usize,
    params: &mut [f64],
) -> Result<()> {
    let nets = &dl.embed[dl.parts[part].clone()];
    let ndim = if spec.type_one_side { 1 } else { 2 };
    let nt = spec.sel.len();
    read_nets(
        &d.key("embeddings")?,
        &file_nets(spec, nt, nets),
        ndim,
        params,
    )
}

/// The nets of a `NetworkCollection` in its order, `None` where DeePMD-kit keeps a net dpw has
/// no use for: se_e3's collection has one per pair (ti, tj) at flat index ti + tj·nt, those with
/// ti > tj all zeros and never used.
fn file_nets<'a>(d: &DescriptorSpec, nt: usize, embed: &'a [Net]) -> Vec<Option<&'a Net>> {
    if d.kind != DescriptorType::SeE3 {
        return some(embed);
    }
    let types = pair_types(nt);
    (0..nt * nt)
        .map(|k| {
            let pair = (k % nt, k / nt);
            types.iter().position(|&p| p == pair).map(|p| &embed[p])
        })
        .collect()
}

/// The descriptor (part `part` of a hybrid, or alone) as DeePMD-kit serialises it, and as the
/// `model_def_script` that builds it; its davg/dstd rows `[nt][4]`.
pub(in crate::model) fn write(
    d: &DescriptorSpec,
    dl: &DescriptorLayout,
    part: usize,
    p: &[f64],
    stats: [&[f64]; 2],
    type_map: &[String],
) -> (Value, Value) {
    let embed = &dl.embed[dl.parts[part].clone()];
    let (nt, nnei) = (type_map.len(), d.nnei());
    let none: &[usize] = &[];
    let embeddings = Nets {
        nets: file_nets(d, nt, embed),
        ndim: if d.type_one_side { 1 } else { 2 },
        fitting: false,
        neuron: &d.neuron,
        resnet_dt: d.resnet_dt,
        activation: "tanh",
    };
    let mut descriptor = obj! {
        "@class" => "Descriptor", "@version" => 2,
        "@variables" => stats_tree(stats, nt, nnei, env_columns(d.kind)),
        "activation_function" => "tanh", "axis_neuron" => d.axis_neuron,
        "embeddings" => nets_tree(embeddings, p, nt),
        "env_mat" => obj! {
            "protection" => d.env_protection, "rcut" => d.rcut, "rcut_smth" => d.rcut_smth,
            "use_exp_switch" => false,
        },
        "env_protection" => d.env_protection, "exclude_types" => none, "neuron" => &d.neuron[..],
        "precision" => "float64", "rcut" => d.rcut, "rcut_smth" => d.rcut_smth,
        "resnet_dt" => d.resnet_dt, "sel" => &d.sel[..], "set_davg_zero" => d.set_davg_zero,
        "spin" => Value::Null, "trainable" => true, "type" => "se_e2_a", "type_map" => type_map,
        "type_one_side" => d.type_one_side,
    };

    let mut def = obj! {
        "type" => "se_e2_a", "sel" => &d.sel[..], "rcut" => d.rcut, "rcut_smth" => d.rcut_smth,
        "neuron" => &d.neuron[..], "axis_neuron" => d.axis_neuron, "resnet_dt" => d.resnet_dt,
        "type_one_side" => d.type_one_side, "env_protection" => d.env_protection,
        "set_davg_zero" => d.set_davg_zero, "exclude_types" => none,
        "activation_function" => "tanh", "precision" => "float64",
    };
    if d.kind == DescriptorType::SeE2R {
        // DeePMD-kit serialises se_e2_r as "se_r", without axis_neuron.
        let retype = |v: &mut Value, name: &str| {
            let m = v.as_mapping_mut().expect("built by obj!");
            m.remove("axis_neuron");
            m.insert("type".into(), name.into());
        };
        retype(&mut descriptor, "se_r");
        retype(&mut def, "se_e2_r");
    }
    if d.kind == DescriptorType::SeE3 {
        // DeePMD-kit serialises se_e3 as "se_e3", without axis_neuron, type_one_side and spin.
        for v in [&mut descriptor, &mut def] {
            let m = v.as_mapping_mut().expect("built by obj!");
            for key in ["axis_neuron", "type_one_side", "spin"] {
                m.remove(key);
            }
            m.insert("type".into(), "se_e3".into());
        }
    }

    (descriptor, def)
}

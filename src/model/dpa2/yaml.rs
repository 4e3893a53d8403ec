//! DPA-2 in DeePMD-kit's `.yaml` (`DescrptDPA2.serialize`, docs/deepmd-spec.md §20.9): its keys
//! into a [`DescriptorSpec`], its tensors into the parameter vector, its three blocks'
//! statistics, and back.

use anyhow::{anyhow, ensure, Result};
use serde_yaml_ng::Value;

use super::args::RepinitShared;
use super::{Dpa2Config, RepformerConfig, RepformerLayerLayout, RepinitConfig};
use crate::model::dpa3::UpdateStyle;
use crate::model::layout::Net;
use crate::model::yaml::{one_net_tree, read_embeddings, read_tebd, stats_tree};
use crate::model::yaml::{tebd_tree, DescriptorYaml};
use crate::model::yaml_block::{
    activation, count, env_mat, flag, layer_tree, linear_tree, merge, number, one_hot_tebd,
    read_layer, read_linear, read_rows, read_type_pairs, rows_tree, tebd_input_mode, widths, yaml,
};
use crate::model::OwnKeys;
use crate::model::{DescriptorLayout, DescriptorSpec, DescriptorType};
use crate::yaml_tree::{ndarray, obj, At};

// The keys DeePMD-kit 3.2.0's constructors take (`DescrptDPA2`, `RepinitArgs`,
// `RepformerArgs`, `RepformerLayer`) and the nodes its `deserialize` takes out first: it passes
// the rest to the constructor, which refuses any other key, as this reader does.
#[rustfmt::skip]
const KEYS: &[&str] = &[
    "@class", "@version", "type", "ntypes", "repinit_args", "repformer_args",
    "concat_output_tebd", "precision", "smooth", "exclude_types", "env_protection", "trainable",
    "seed", "add_tebd_to_repinit_out", "use_econf_tebd", "use_tebd_bias", "type_map",
    "type_embedding", "g1_shape_tranform", "tebd_transform", "repinit_variable",
    "repformers_variable", "repinit_three_body_variable",
];
#[rustfmt::skip]
const REPINIT_KEYS: &[&str] = &[
    "rcut", "rcut_smth", "nsel", "neuron", "axis_neuron", "tebd_dim", "tebd_input_mode",
    "set_davg_zero", "activation_function", "resnet_dt", "type_one_side", "use_three_body",
    "three_body_neuron", "three_body_sel", "three_body_rcut", "three_body_rcut_smth",
];
#[rustfmt::skip]
const REPFORMER_KEYS: &[&str] = &[
    "rcut", "rcut_smth", "nsel", "nlayers", "g1_dim", "g2_dim", "axis_neuron", "direct_dist",
    "update_g1_has_conv", "update_g1_has_drrd", "update_g1_has_grrg", "update_g1_has_attn",
    "update_g2_has_g1g1", "update_g2_has_attn", "update_h2", "attn1_hidden", "attn1_nhead",
    "attn2_hidden", "attn2_nhead", "attn2_has_gate", "activation_function", "update_style",
    "update_residual", "update_residual_init", "set_davg_zero", "trainable_ln", "use_sqrt_nnei",
    "g1_out_conv", "g1_out_mlp", "ln_eps",
];
#[rustfmt::skip]
const LAYER_NODE_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "rcut", "rcut_smth", "sel", "ntypes", "g1_dim", "g2_dim",
    "axis_neuron", "update_chnnl_2", "update_g1_has_conv", "update_g1_has_drrd",
    "update_g1_has_grrg", "update_g1_has_attn", "update_g2_has_g1g1", "update_g2_has_attn",
    "update_h2", "attn1_hidden", "attn1_nhead", "attn2_hidden", "attn2_nhead", "attn2_has_gate",
    "activation_function", "update_style", "update_residual", "update_residual_init", "smooth",
    "precision", "trainable_ln", "use_sqrt_nnei", "g1_out_conv", "g1_out_mlp", "ln_eps", "seed",
    "trainable", "linear1", "linear2", "proj_g1g2", "proj_g1g1g2", "attn2g_map",
    "attn2_mh_apply", "attn2_lm", "attn2_ev_apply", "loc_attn", "g1_self_mlp", "g1_residual",
    "g2_residual", "h2_residual",
];
/// The logit shift of DeePMD-kit's smooth attention (`attnw_shift`), the one dpw computes with.
const ATTNW_SHIFT: f64 = 20.0;

fn read_repinit(i: &At) -> Result<RepinitConfig> {
    i.known(&[REPINIT_KEYS])?;
    Ok(RepinitConfig {
        tebd_dim: count(i, "tebd_dim", 8)?,
        tebd_input_mode: tebd_input_mode(i)?,
        activation: activation(i)?,
        use_three_body: flag(i, "use_three_body", false)?,
        three_body_neuron: widths(i, "three_body_neuron", &[2, 4, 8])?,
        three_body_rcut: number(i, "three_body_rcut", 4.0)?,
        three_body_rcut_smth: number(i, "three_body_rcut_smth", 0.5)?,
        three_body_sel: count(i, "three_body_sel", 40)?,
    })
}

/// `old`: a file of version < 3, which DeePMD-kit reads with use_sqrt_nnei, g1_out_conv and
/// g1_out_mlp false (the layout before they existed) whatever it says.
fn read_repformer(r: &At, old: bool) -> Result<RepformerConfig> {
    r.known(&[REPFORMER_KEYS])?;
    let update_style = match r.opt("update_style") {
        None => UpdateStyle::ResAvg,
        Some(s) => UpdateStyle::parse(s.str()?)
            .map_or_else(|| s.fail("res_avg, res_incr or res_residual"), Ok)?,
    };
    let residual_norm = match r.opt("update_residual_init") {
        None => true,
        Some(s) => match s.str()? {
            "norm" => true,
            "const" => false,
            _ => return s.fail("\"norm\" or \"const\""),
        },
    };
    Ok(RepformerConfig {
        rcut: r.key("rcut")?.f64()?,
        rcut_smth: r.key("rcut_smth")?.f64()?,
        nsel: r.key("nsel")?.usize()?,
        nlayers: count(r, "nlayers", 3)?,
        g1_dim: count(r, "g1_dim", 128)?,
        g2_dim: count(r, "g2_dim", 16)?,
        axis_neuron: count(r, "axis_neuron", 4)?,
        direct_dist: flag(r, "direct_dist", false)?,
        update_g1_has_conv: flag(r, "update_g1_has_conv", true)?,
        update_g1_has_drrd: flag(r, "update_g1_has_drrd", true)?,
        update_g1_has_grrg: flag(r, "update_g1_has_grrg", true)?,
        update_g1_has_attn: flag(r, "update_g1_has_attn", true)?,
        update_g2_has_g1g1: flag(r, "update_g2_has_g1g1", true)?,
        update_g2_has_attn: flag(r, "update_g2_has_attn", true)?,
        use_sqrt_nnei: !old && flag(r, "use_sqrt_nnei", true)?,
        g1_out_conv: !old && flag(r, "g1_out_conv", true)?,
        g1_out_mlp: !old && flag(r, "g1_out_mlp", true)?,
        update_h2: flag(r, "update_h2", false)?,
        attn1_hidden: count(r, "attn1_hidden", 64)?,
        attn1_nhead: count(r, "attn1_nhead", 4)?,
        attn2_hidden: count(r, "attn2_hidden", 16)?,
        attn2_nhead: count(r, "attn2_nhead", 4)?,
        attn2_has_gate: flag(r, "attn2_has_gate", false)?,
        activation: activation(r)?,
        update_style,
        update_residual: number(r, "update_residual", 0.001)?,
        residual_norm,
        set_davg_zero: flag(r, "set_davg_zero", true)?,
        trainable_ln: flag(r, "trainable_ln", true)?,
        // null: DeePMD-kit's 1e-5.
        ln_eps: number(r, "ln_eps", 1e-5)?,
    })
}

/// dpa2's entry in the registry.
pub(in crate::model) static YAML: DescriptorYaml = DescriptorYaml {
    read_spec,
    read_params,
    write,
    stat_nodes,
};

/// The descriptor's keys; the shared ones of the spec hold the repinit's list and net.
pub(in crate::model) fn read_spec(d: &At, _: DescriptorType, nt: usize) -> Result<DescriptorSpec> {
    d.version(1..=4, None)?;
    d.known(&[KEYS])?;
    one_hot_tebd(d, nt)?;
    let old = d.key("@version")?.u64()? < 3;
    let i = d.key("repinit_args")?;
    let c = Dpa2Config {
        repinit: read_repinit(&i)?,
        repformer: read_repformer(&d.key("repformer_args")?, old)?,
        concat_output_tebd: flag(d, "concat_output_tebd", true)?,
        smooth: flag(d, "smooth", true)?,
        exclude_types: read_type_pairs(d, nt)?,
        add_tebd_to_repinit_out: flag(d, "add_tebd_to_repinit_out", false)?,
        // Version 1 files lack it and mean true.
        use_tebd_bias: flag(d, "use_tebd_bias", true)?,
        trainable: flag(d, "trainable", true)?,
    };
    let spec = DescriptorSpec {
        kind: DescriptorType::Dpa2,
        rcut: i.key("rcut")?.f64()?,
        rcut_smth: i.key("rcut_smth")?.f64()?,
        sel: vec![i.key("nsel")?.usize()?],
        neuron: widths(&i, "neuron", &[25, 50, 100])?,
        axis_neuron: count(&i, "axis_neuron", 16)?,
        resnet_dt: flag(&i, "resnet_dt", false)?,
        type_one_side: flag(&i, "type_one_side", false)?,
        env_protection: number(d, "env_protection", 0.0)?,
        set_davg_zero: flag(&i, "set_davg_zero", true)?,
        own: OwnKeys::Dpa2(c),
    };
    let c = spec.own.dpa2().expect("just made");
    (c.check(spec.rcut, spec.sel[0], spec.m1(), spec.axis_neuron))
        .map_err(|e| anyhow!("{}: {e}", d.path))?;
    Ok(spec)
}

/// The nodes holding DPA-2's statistics, in dpw's order of rows (repinit, repformer,
/// three-body), each with its nsel.
fn stat_nodes<'a>(d: &At<'a>, spec: &DescriptorSpec) -> Result<Vec<(At<'a>, usize)>> {
    let c = spec.own.dpa2().expect("a DPA-2 spec");
    let mut nodes = vec![
        (d.key("repinit_variable")?, spec.sel[0]),
        (d.key("repformers_variable")?, c.repformer.nsel),
    ];
    if c.repinit.use_three_body {
        let node = d.key("repinit_three_body_variable")?;
        nodes.push((node, c.repinit.three_body_sel));
    }
    Ok(nodes)
}

/// One of a layer's parts, `key`: a node of `class` (version 1) where the layout has it, else
/// absent.
fn part<'a>(layer: &At<'a>, key: &str, class: &str, present: bool) -> Result<Option<At<'a>>> {
    if !present {
        layer.expect_off(key)?;
        return Ok(None);
    }
    let at = layer.key(key)?;
    at.expect("@class", &[class])?;
    at.version(1..=1, Some(1))?;
    Ok(Some(at))
}

/// The attention nodes' `attnw_shift`, which dpw's attention has fixed.
fn check_shift(at: &At) -> Result<()> {
    let shift = number(at, "attnw_shift", ATTNW_SHIFT)?;
    ensure!(
        shift == ATTNW_SHIFT,
        "{}.attnw_shift: {shift} is not supported (dpw shifts the logits by DeePMD-kit's \
         {ATTNW_SHIFT})",
        at.path
    );
    Ok(())
}

/// A bias-free linear node `key` at offset `w` where the layout has one, else absent.
fn read_weight(
    at: &At,
    key: &str,
    w: Option<usize>,
    [nin, nout]: [usize; 2],
    params: &mut [f64],
) -> Result<()> {
    match w {
        Some(w) => read_linear(&at.key(key)?, nin, nout, w, None, params),
        None => at.expect_off(key),
    }
}

fn read_repformer_layer(
    at: &At,
    ll: &RepformerLayerLayout,
    c: &Dpa2Config,
    params: &mut [f64],
) -> Result<()> {
    let r = &c.repformer;
    let (g1, g2) = (r.g1_dim, r.g2_dim);
    let (h1, n1, h2, n2) = (r.attn1_hidden, r.attn1_nhead, r.attn2_hidden, r.attn2_nhead);
    at.expect("@class", &["RepformerLayer"])?;
    at.version(1..=2, None)?;
    at.known(&[LAYER_NODE_KEYS])?;
    read_layer(&at.key("linear1")?, &ll.linear1, params)?;
    for (key, layer) in [("linear2", &ll.linear2), ("g1_self_mlp", &ll.g1_self_mlp)] {
        match layer {
            Some(l) => read_layer(&at.key(key)?, l, params)?,
            None => at.expect_off(key)?,
        }
    }
    let conv = if ll.terms.conv_term {
        [g2, g1]
    } else {
        [g1, g2]
    };
    read_weight(at, "proj_g1g2", ll.proj_g1g2, conv, params)?;
    read_weight(at, "proj_g1g1g2", ll.proj_g1g1g2, [g1, g2], params)?;
    if let Some(m) = part(at, "attn2g_map", "Atten2Map", ll.mapqk.is_some())? {
        check_shift(&m)?;
        read_weight(&m, "mapqk", ll.mapqk, [g2, 2 * h2 * n2], params)?;
    }
    let mh = part(
        at,
        "attn2_mh_apply",
        "Atten2MultiHeadApply",
        ll.mapv.is_some(),
    )?;
    if let (Some(m), Some(head)) = (mh, &ll.attn2_head_map) {
        read_weight(&m, "mapv", ll.mapv, [g2, g2 * n2], params)?;
        read_layer(&m.key("head_map")?, head, params)?;
    }
    if let Some(ln) = part(at, "attn2_lm", "LayerNorm", ll.attn2_lm.is_some())? {
        let (w, b) = ll.attn2_lm.expect("present");
        let vars = ln.key("@variables")?;
        params[w..w + g2].copy_from_slice(&vars.key("w")?.array(&[g2])?);
        params[b..b + g2].copy_from_slice(&vars.key("b")?.array(&[g2])?);
        let eps = number(&ln, "eps", r.ln_eps)?;
        ensure!(
            eps == r.ln_eps,
            "{}.eps: {eps} differs from the repformer's ln_eps {}",
            ln.path,
            r.ln_eps
        );
    }
    let ev = part(
        at,
        "attn2_ev_apply",
        "Atten2EquiVarApply",
        ll.ev_head_map.is_some(),
    )?;
    if let Some(m) = ev {
        read_weight(&m, "head_map", ll.ev_head_map, [n2, 1], params)?;
    }
    if let Some(m) = part(at, "loc_attn", "LocalAtten", ll.loc_mapq.is_some())? {
        check_shift(&m)?;
        read_weight(&m, "mapq", ll.loc_mapq, [g1, h1 * n1], params)?;
        read_weight(&m, "mapkv", ll.loc_mapkv, [g1, (h1 + g1) * n1], params)?;
        let head = ll.loc_head_map.as_ref().expect("with mapq");
        read_layer(&m.key("head_map")?, head, params)?;
    }
    read_rows(at, "g1_residual", &ll.g1_residual, g1, params)?;
    read_rows(at, "g2_residual", &ll.g2_residual, g2, params)?;
    read_rows(at, "h2_residual", &ll.h2_residual, 1, params)
}

/// The tensors of a DPA-2 node into `params`, checked against the layout.
pub(in crate::model) fn read_params(
    d: &At,
    spec: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    params: &mut [f64],
) -> Result<()> {
    let l = dl.own.dpa2().expect("a DPA-2 layout");
    let c = spec.own.dpa2().expect("a DPA-2 spec");
    let (t, g1) = (c.repinit.tebd_dim, c.repformer.g1_dim);
    read_tebd(&d.key("type_embedding")?, &l.tebd, params)?;
    let strip = l.repinit_strip.as_ref();
    read_embeddings(&d.key("repinit_variable")?, &l.repinit, strip, params)?;
    if let Some(net) = &l.three_body {
        let node = d.key("repinit_three_body_variable")?;
        read_embeddings(&node, net, l.three_body_strip.as_ref(), params)?;
    }
    let shape = d.key("g1_shape_tranform")?;
    match l.shape_transform {
        // DeePMD-kit 3.2.0 reads it back only where M1·A1 ≠ G1, though the three-body block's
        // M3 also makes it exist (spec §20.11): the file has the weights the model used.
        Some(w) => {
            let nin = c.repinit_out(spec.m1(), spec.axis_neuron);
            read_linear(&shape, nin, g1, w, None, params)?;
        }
        None => shape.expect("@class", &["Identity"])?,
    }
    read_weight(d, "tebd_transform", l.tebd_transform, [t, g1], params)?;
    let rv = d.key("repformers_variable")?;
    read_layer(&rv.key("g2_embd")?, &l.g2_embd, params)?;
    let items = rv.seq_of("repformer_layers", l.layers.len(), "layers (nlayers)")?;
    for (ll, at) in l.layers.iter().zip(&items) {
        read_repformer_layer(at, ll, c, params)?;
    }
    Ok(())
}

fn repformer_layer_tree(ll: &RepformerLayerLayout, c: &Dpa2Config, nt: usize, p: &[f64]) -> Value {
    let (r, k) = (&c.repformer, &ll.terms);
    let (g1, g2) = (r.g1_dim, r.g2_dim);
    let (h1, n1, h2, n2) = (r.attn1_hidden, r.attn1_nhead, r.attn2_hidden, r.attn2_nhead);
    let weight = |nin: usize, nout: usize, w: usize| layer_tree(nin, nout, w, None, p);
    let mut node = obj! {
        "@class" => "RepformerLayer", "@version" => 2,
        "rcut" => r.rcut, "rcut_smth" => r.rcut_smth, "sel" => [r.nsel].as_slice(),
        "ntypes" => nt, "g1_dim" => g1, "g2_dim" => g2, "axis_neuron" => r.axis_neuron,
        "update_chnnl_2" => k.chnnl_2, "update_g1_has_conv" => r.update_g1_has_conv,
        "update_g1_has_drrd" => k.drrd, "update_g1_has_grrg" => k.grrg,
        "update_g1_has_attn" => k.g1_attn, "update_g2_has_g1g1" => k.g1g1,
        "update_g2_has_attn" => k.g2_attn, "update_h2" => k.h2,
        "attn1_hidden" => h1, "attn1_nhead" => n1, "attn2_hidden" => h2, "attn2_nhead" => n2,
        "attn2_has_gate" => r.attn2_has_gate, "activation_function" => r.activation.name(),
        "update_style" => r.update_style.as_str(), "smooth" => c.smooth,
        "precision" => "float64", "trainable_ln" => r.trainable_ln,
        "use_sqrt_nnei" => r.use_sqrt_nnei, "g1_out_conv" => r.g1_out_conv,
        "g1_out_mlp" => r.g1_out_mlp, "ln_eps" => r.ln_eps,
        "linear1" => linear_tree(&ll.linear1, p),
    };
    let conv = if k.conv_term { (g2, g1) } else { (g1, g2) };
    let parts = [
        ("linear2", ll.linear2.as_ref().map(|l| linear_tree(l, p))),
        (
            "g1_self_mlp",
            ll.g1_self_mlp.as_ref().map(|l| linear_tree(l, p)),
        ),
        ("proj_g1g2", ll.proj_g1g2.map(|w| weight(conv.0, conv.1, w))),
        ("proj_g1g1g2", ll.proj_g1g1g2.map(|w| weight(g1, g2, w))),
        (
            "attn2g_map",
            ll.mapqk.map(|w| {
                obj! {
                    "@class" => "Atten2Map", "@version" => 1, "input_dim" => g2,
                    "hidden_dim" => h2, "head_num" => n2, "has_gate" => r.attn2_has_gate,
                    "smooth" => c.smooth, "attnw_shift" => ATTNW_SHIFT, "precision" => "float64",
                    "mapqk" => weight(g2, 2 * h2 * n2, w),
                }
            }),
        ),
        (
            "attn2_mh_apply",
            ll.mapv.zip(ll.attn2_head_map.as_ref()).map(|(v, head)| {
                obj! {
                    "@class" => "Atten2MultiHeadApply", "@version" => 1, "input_dim" => g2,
                    "head_num" => n2, "precision" => "float64",
                    "mapv" => weight(g2, g2 * n2, v), "head_map" => linear_tree(head, p),
                }
            }),
        ),
        (
            "attn2_lm",
            ll.attn2_lm.map(|(w, b)| {
                obj! {
                    "@class" => "LayerNorm", "@version" => 1,
                    "@variables" => obj! {
                        "w" => ndarray(&[g2], &p[w..]), "b" => ndarray(&[g2], &p[b..]),
                    },
                    "eps" => r.ln_eps, "precision" => "float64", "trainable" => r.trainable_ln,
                }
            }),
        ),
        (
            "attn2_ev_apply",
            ll.ev_head_map.map(|w| {
                obj! {
                    "@class" => "Atten2EquiVarApply", "@version" => 1, "input_dim" => g2,
                    "head_num" => n2, "precision" => "float64", "head_map" => weight(n2, 1, w),
                }
            }),
        ),
        (
            "loc_attn",
            (ll.loc_mapq.zip(ll.loc_mapkv).zip(ll.loc_head_map.as_ref())).map(|((q, kv), head)| {
                obj! {
                    "@class" => "LocalAtten", "@version" => 1, "input_dim" => g1,
                    "hidden_dim" => h1, "head_num" => n1, "smooth" => c.smooth,
                    "attnw_shift" => ATTNW_SHIFT, "precision" => "float64",
                    "mapq" => weight(g1, h1 * n1, q), "mapkv" => weight(g1, (h1 + g1) * n1, kv),
                    "head_map" => linear_tree(head, p),
                }
            }),
        ),
    ];
    let m = node.as_mapping_mut().expect("built by obj!");
    for (key, v) in parts {
        if let Some(v) = v {
            m.insert(key.into(), v);
        }
    }
    if r.update_style == UpdateStyle::ResResidual {
        node = merge(
            node,
            obj! {
                "@variables" => obj! {
                    "g1_residual" => rows_tree(&ll.g1_residual, g1, p),
                    "g2_residual" => rows_tree(&ll.g2_residual, g2, p),
                    "h2_residual" => rows_tree(&ll.h2_residual, 1, p),
                },
            },
        );
    }
    node
}

/// A DPA-2 descriptor as DeePMD-kit serialises it (spec §20.9), and the `model_def_script`
/// descriptor (input.json's form) that builds it; davg/dstd dpw's rows `[block][nt][4]`
/// (repinit, repformer, three-body), written per slot of each block's own list as DeePMD-kit
/// keeps them.
pub(in crate::model) fn write(
    d: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    p: &[f64],
    stats: [&[f64]; 2],
    type_map: &[String],
) -> (Value, Value) {
    let l = dl.own.dpa2().expect("a DPA-2 layout");
    let c = d.own.dpa2().expect("a DPA-2 spec");
    let type_embedding = tebd_tree(&l.tebd, c.use_tebd_bias, p, type_map);
    let (i, r) = (&c.repinit, &c.repformer);
    let nt = type_map.len();
    let act = i.activation.name();
    let net = |n: &Net, neuron: &[usize]| one_net_tree(n, neuron, d.resnet_dt, &act, p, nt);
    let block = |b: usize, nnei: usize| {
        let rows = b * 4 * nt..(b + 1) * 4 * nt;
        stats_tree([&stats[0][rows.clone()], &stats[1][rows]], nt, nnei, 4)
    };
    // One block's `embeddings` (and strip's), env_mat and statistics.
    let variable =
        |main: &Net, strip: Option<&Net>, neuron: &[usize], env: Value, b: usize, nnei: usize| {
            let node = obj! {
                "embeddings" => net(main, neuron), "env_mat" => env, "@variables" => block(b, nnei),
            };
            match strip {
                Some(s) => merge(node, obj! { "embeddings_strip" => net(s, neuron) }),
                None => node,
            }
        };
    let shared = RepinitShared::from(d);
    let excluded: Vec<Vec<usize>> = c.exclude_types.iter().map(|p| p.to_vec()).collect();
    let shape = match l.shape_transform {
        Some(w) => layer_tree(c.repinit_out(d.m1(), d.axis_neuron), r.g1_dim, w, None, p),
        None => obj! { "@class" => "Identity", "@version" => 1 },
    };
    let layers: Vec<Value> = (l.layers.iter())
        .map(|ll| repformer_layer_tree(ll, c, nt, p))
        .collect();
    let mut descriptor = obj! {
        "@class" => "Descriptor", "@version" => 3, "type" => "dpa2", "ntypes" => nt,
        "repinit_args" => yaml(c.repinit_json(&shared)),
        "repformer_args" => yaml(c.repformer_json()),
        "concat_output_tebd" => c.concat_output_tebd, "precision" => "float64",
        "smooth" => c.smooth, "exclude_types" => excluded, "env_protection" => d.env_protection,
        "trainable" => c.trainable, "add_tebd_to_repinit_out" => c.add_tebd_to_repinit_out,
        "use_econf_tebd" => false, "use_tebd_bias" => c.use_tebd_bias, "type_map" => type_map,
        "type_embedding" => type_embedding, "g1_shape_tranform" => shape,
        "repinit_variable" => variable(
            &l.repinit,
            l.repinit_strip.as_ref(),
            &d.neuron,
            env_mat(d.rcut, d.rcut_smth),
            0,
            d.sel[0],
        ),
        "repformers_variable" => obj! {
            "g2_embd" => linear_tree(&l.g2_embd, p), "repformer_layers" => layers,
            "env_mat" => env_mat(r.rcut, r.rcut_smth), "@variables" => block(1, r.nsel),
        },
    };
    if let Some(w) = l.tebd_transform {
        let node = layer_tree(i.tebd_dim, r.g1_dim, w, None, p);
        descriptor = merge(descriptor, obj! { "tebd_transform" => node });
    }
    if let Some(three) = &l.three_body {
        let node = variable(
            three,
            l.three_body_strip.as_ref(),
            &i.three_body_neuron,
            env_mat(i.three_body_rcut, i.three_body_rcut_smth),
            2,
            i.three_body_sel,
        );
        descriptor = merge(descriptor, obj! { "repinit_three_body_variable" => node });
    }
    let def = yaml(c.input_json(&shared, "float64", d.env_protection));
    (descriptor, def)
}

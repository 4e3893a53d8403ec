//! DPA-1 (se_atten, se_atten_v2) in DeePMD-kit's `.yaml` (`DescrptDPA1.serialize`,
//! `DescrptSeAttenV2.serialize`, docs/deepmd-spec.md §14): its keys into a [`DescriptorSpec`],
//! its tensors into the parameter vector, and back.

use anyhow::{bail, ensure, Result};
use serde_yaml_ng::Value;

use crate::model::yaml::{
    one_net_tree, read_embeddings, read_tebd, stats_tree, tebd_tree, DescriptorYaml,
    DESCRIPTOR_KEYS, LAYER_KEYS,
};
use crate::model::OwnKeys;
use crate::model::{
    AttentionConfig, DescriptorLayout, DescriptorSpec, DescriptorType, Layer, Net, TebdInputMode,
};
use crate::yaml_tree::{brief, ndarray, obj, At};

/// DPA-1's entry in the registry (se_atten and se_atten_v2).
pub(in crate::model) static YAML: DescriptorYaml = DescriptorYaml {
    read_spec,
    read_params,
    write,
    stat_nodes: crate::model::yaml::own_stats,
};

#[rustfmt::skip]
const SE_ATTEN_V2_KEYS: &[&str] = &[
    "type_embedding", "attention_layers", "embeddings_strip", "axis_neuron", "tebd_dim",
    "type_one_side", "attn", "attn_layer", "attn_dotr", "attn_mask", "scaling_factor",
    "normalize", "temperature", "trainable_ln", "ln_eps", "concat_output_tebd", "spin",
    "stripped_type_embedding", "use_econf_tebd", "use_tebd_bias",
];
/// se_atten (`dpa1`) adds these to se_atten_v2's.
const DPA1_KEYS: &[&str] = &["tebd_input_mode", "smooth_type_embedding"];

/// DPA-1's keys: DeePMD-kit serialises se_atten as `type: dpa1`, se_atten_v2 as itself
/// (without tebd_input_mode and smooth_type_embedding: always strip and smooth). Its sel is
/// one mixed list: a list's sum (DeePMD-kit's nnei), kept as one number.
pub(crate) fn read_spec(d: &At, kind: DescriptorType, _: usize) -> Result<DescriptorSpec> {
    let v2 = kind == DescriptorType::SeAttenV2;
    d.version(1..=3, None)?;
    d.known(&[
        DESCRIPTOR_KEYS,
        SE_ATTEN_V2_KEYS,
        if v2 { &[] } else { DPA1_KEYS },
    ])?;
    d.expect("activation_function", &["tanh"])?;
    for key in [
        "exclude_types",
        "spin",
        "attn_mask",
        "use_econf_tebd",
        "compress",
    ] {
        d.expect_off(key)?;
    }
    if let Some(l) = d.opt("lmax") {
        ensure!(
            l.usize()? == 1,
            "{}: unsupported value {} (dpw supports lmax 1)",
            l.path,
            brief(l.v)
        );
    }
    if let Some(env) = d.opt("env_mat") {
        env.expect_off("use_exp_switch")?;
    }
    let sel = d.key("sel")?;
    let nnei = match sel.v {
        Value::Sequence(_) => sel.usizes()?.iter().sum(),
        _ => sel.usize()?,
    };
    let tebd_input_mode = match v2 {
        true => TebdInputMode::Strip,
        false => match d.key("tebd_input_mode")?.str()? {
            "concat" => TebdInputMode::Concat,
            "strip" => TebdInputMode::Strip,
            _ => return d.key("tebd_input_mode")?.fail("\"concat\" or \"strip\""),
        },
    };
    let attention = AttentionConfig {
        tebd_dim: d.key("tebd_dim")?.usize()?,
        tebd_input_mode,
        attn: d.key("attn")?.usize()?,
        attn_layer: d.key("attn_layer")?.usize()?,
        attn_dotr: d.key("attn_dotr")?.bool()?,
        scaling_factor: d.key("scaling_factor")?.f64()?,
        normalize: d.key("normalize")?.bool()?,
        temperature: d.opt("temperature").map(|t| t.f64()).transpose()?,
        trainable_ln: d.key("trainable_ln")?.bool()?,
        // DeePMD-kit: null means 1e-5.
        ln_eps: d.opt("ln_eps").map_or(Ok(1e-5), |e| e.f64())?,
        smooth_type_embedding: v2 || d.key("smooth_type_embedding")?.bool()?,
        concat_output_tebd: d.key("concat_output_tebd")?.bool()?,
        // DeePMD-kit's version-1 files lack it and mean true.
        use_tebd_bias: d.opt("use_tebd_bias").map_or(Ok(true), |b| b.bool())?,
    };
    let descriptor = DescriptorSpec {
        kind,
        rcut: d.key("rcut")?.f64()?,
        rcut_smth: d.key("rcut_smth")?.f64()?,
        sel: vec![nnei],
        neuron: d.key("neuron")?.usizes()?,
        axis_neuron: d.key("axis_neuron")?.usize()?,
        resnet_dt: d.key("resnet_dt")?.bool()?,
        type_one_side: d.key("type_one_side")?.bool()?,
        env_protection: d.opt("env_protection").map_or(Ok(0.0), |a| a.f64())?,
        set_davg_zero: d.opt("set_davg_zero").map_or(Ok(false), |a| a.bool())?,
        own: OwnKeys::Attention(attention),
    };
    ensure!(!descriptor.neuron.is_empty(), "{}.neuron: empty", d.path);
    Ok(descriptor)
}

/// DPA-1's nets into `params`: the type embedding, the embedding net (and strip's), the
/// attention layers, each checked against the layout.
pub(crate) fn read_params(
    d: &At,
    spec: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    params: &mut [f64],
) -> Result<()> {
    let (a, embed) = (dl.own.attn().expect("a DPA-1 layout"), &dl.embed[0]);
    let cfg = spec.attn().expect("a DPA-1 spec");
    read_embeddings(d, embed, a.strip.as_ref(), params)?;
    read_tebd(&d.key("type_embedding")?, &a.tebd, params)?;
    // The attention layers.
    let al = d.key("attention_layers")?;
    al.expect("@class", &["NeighborGatedAttention"])?;
    al.version(1..=1, None)?;
    let items = al.seq_of("attention_layers", a.layers.len(), "layers (attn_layer)")?;
    for (k, at) in a.layers.iter().zip(&items) {
        let att = at.key("attention_layer")?;
        if let Some(h) = att.opt("num_heads") {
            ensure!(
                h.usize()? == 1,
                "{}: unsupported value {} (dpw supports one head)",
                h.path,
                brief(h.v)
            );
        }
        for (name, layer) in [("in_proj", &k.proj_in), ("out_proj", &k.proj_out)] {
            let lat = att.key(name)?;
            lat.version(1..=2, Some(1))?;
            lat.known(&[LAYER_KEYS])?;
            lat.expect("activation_function", &["none", "linear", "Linear"])?;
            lat.expect_off("resnet")?;
            let vars = lat.key("@variables")?;
            let w = vars.key("w")?.array(&[layer.nin, layer.nout])?;
            params[layer.w..layer.w + w.len()].copy_from_slice(&w);
            let Some(b) = vars.opt("b") else {
                bail!("{}.b: missing (dpw needs a bias)", vars.path)
            };
            params[layer.b..layer.b + layer.nout].copy_from_slice(&b.array(&[layer.nout])?);
            vars.expect_off("idt")?;
        }
        let ln = at.key("attn_layer_norm")?;
        ln.expect("@class", &["LayerNorm"])?;
        ln.version(1..=1, Some(1))?;
        let m1 = k.proj_out.nout;
        let vars = ln.key("@variables")?;
        params[k.ln_w..k.ln_w + m1].copy_from_slice(&vars.key("w")?.array(&[m1])?);
        params[k.ln_b..k.ln_b + m1].copy_from_slice(&vars.key("b")?.array(&[m1])?);
        if let Some(eps) = ln.opt("eps") {
            ensure!(
                eps.f64()? == cfg.ln_eps,
                "{}: {} differs from the descriptor's ln_eps {}",
                eps.path,
                eps.f64()?,
                cfg.ln_eps
            );
        }
    }
    Ok(())
}

/// DPA-1 as DeePMD-kit 3.2.0 serialises it (`DescrptDPA1.serialize`, `type: dpa1`, or
/// `DescrptSeAttenV2.serialize`), and the `model_def_script` descriptor that builds it.
pub(crate) fn write(
    d: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    p: &[f64],
    stats: [&[f64]; 2],
    type_map: &[String],
) -> (Value, Value) {
    let (a, embed) = (dl.own.attn().expect("a DPA-1 layout"), &dl.embed[0]);
    let cfg = d.attn().expect("a DPA-1 spec");
    let (nt, nnei, m1) = (type_map.len(), d.nnei(), d.m1());
    let v2 = d.kind == DescriptorType::SeAttenV2;
    let none: &[usize] = &[];
    let collection = |net: &Net| one_net_tree(net, &d.neuron, d.resnet_dt, "tanh", p, nt);
    let temperature = cfg.temperature.map_or(Value::Null, Value::from);
    // One linear layer (in_proj, out_proj): DeePMD-kit's NativeLayer without activation.
    let linear = |l: &Layer| {
        obj! {
            "@class" => "Layer", "@version" => 2,
            "@variables" => obj! {
                "w" => ndarray(&[l.nin, l.nout], &p[l.w..]),
                "b" => ndarray(&[l.nout], &p[l.b..]),
                "idt" => Value::Null,
            },
            "activation_function" => "none", "bias" => true, "precision" => "float64",
            "resnet" => false, "trainable" => true, "use_timestep" => false,
        }
    };
    // The keys every level of the attention block repeats.
    let common = || {
        obj! {
            "do_mask" => false, "dotr" => cfg.attn_dotr, "embed_dim" => m1,
            "hidden_dim" => cfg.attn, "nnei" => nnei, "normalize" => cfg.normalize,
            "precision" => "float64", "scaling_factor" => cfg.scaling_factor,
            "temperature" => temperature.clone(),
        }
    };
    let merge = |mut v: Value, extra: Value| {
        if let (Value::Mapping(m), Value::Mapping(e)) = (&mut v, extra) {
            m.extend(e);
        }
        v
    };
    let layers: Vec<Value> = (a.layers.iter())
        .map(|k| {
            let attention_layer = merge(
                common(),
                obj! {
                    "bias" => true, "in_proj" => linear(&k.proj_in), "num_heads" => 1,
                    "out_proj" => linear(&k.proj_out), "smooth" => cfg.smooth_type_embedding,
                },
            );
            let norm = obj! {
                "@class" => "LayerNorm", "@version" => 1,
                "@variables" => obj! {
                    "w" => ndarray(&[m1], &p[k.ln_w..]), "b" => ndarray(&[m1], &p[k.ln_b..]),
                },
                "eps" => cfg.ln_eps, "precision" => "float64", "trainable" => cfg.trainable_ln,
            };
            merge(
                common(),
                obj! {
                    "attention_layer" => attention_layer, "attn_layer_norm" => norm,
                    "ln_eps" => cfg.ln_eps, "trainable_ln" => cfg.trainable_ln,
                },
            )
        })
        .collect();
    let attention_layers = merge(
        common(),
        obj! {
            "@class" => "NeighborGatedAttention", "@version" => 1,
            "attention_layers" => layers, "layer_num" => cfg.attn_layer, "ln_eps" => cfg.ln_eps,
            "trainable_ln" => cfg.trainable_ln,
        },
    );
    let type_embedding = tebd_tree(&a.tebd, cfg.use_tebd_bias, p, type_map);
    let sel = [nnei];
    let mut descriptor = obj! {
        "@class" => "Descriptor", "@version" => 2,
        "@variables" => stats_tree(stats, nt, nnei, 4),
        "activation_function" => "tanh", "attention_layers" => attention_layers,
        "attn" => cfg.attn, "attn_dotr" => cfg.attn_dotr, "attn_layer" => cfg.attn_layer,
        "attn_mask" => false, "axis_neuron" => d.axis_neuron,
        "concat_output_tebd" => cfg.concat_output_tebd, "embeddings" => collection(embed),
        "env_mat" => obj! {
            "protection" => d.env_protection, "rcut" => d.rcut, "rcut_smth" => d.rcut_smth,
            "use_exp_switch" => false,
        },
        "env_protection" => d.env_protection, "exclude_types" => none, "ln_eps" => cfg.ln_eps,
        "neuron" => &d.neuron[..], "normalize" => cfg.normalize, "ntypes" => nt,
        "precision" => "float64", "rcut" => d.rcut, "rcut_smth" => d.rcut_smth,
        "resnet_dt" => d.resnet_dt, "scaling_factor" => cfg.scaling_factor, "sel" => &sel[..],
        "set_davg_zero" => d.set_davg_zero, "spin" => Value::Null, "tebd_dim" => cfg.tebd_dim,
        "temperature" => temperature.clone(), "trainable" => true,
        "trainable_ln" => cfg.trainable_ln, "type" => if v2 { "se_atten_v2" } else { "dpa1" },
        "type_embedding" => type_embedding, "type_map" => type_map,
        "type_one_side" => d.type_one_side, "use_econf_tebd" => false,
        "use_tebd_bias" => cfg.use_tebd_bias,
    };
    let mut def = obj! {
        "type" => if v2 { "se_atten_v2" } else { "se_atten" }, "sel" => nnei, "rcut" => d.rcut,
        "rcut_smth" => d.rcut_smth, "neuron" => &d.neuron[..], "axis_neuron" => d.axis_neuron,
        "resnet_dt" => d.resnet_dt, "type_one_side" => d.type_one_side,
        "env_protection" => d.env_protection, "set_davg_zero" => d.set_davg_zero,
        "activation_function" => "tanh", "precision" => "float64", "tebd_dim" => cfg.tebd_dim,
        "attn" => cfg.attn, "attn_layer" => cfg.attn_layer, "attn_dotr" => cfg.attn_dotr,
        "attn_mask" => false, "scaling_factor" => cfg.scaling_factor,
        "normalize" => cfg.normalize, "trainable_ln" => cfg.trainable_ln, "ln_eps" => cfg.ln_eps,
        "concat_output_tebd" => cfg.concat_output_tebd, "use_econf_tebd" => false,
        "use_tebd_bias" => cfg.use_tebd_bias,
    };
    let (dm, fm) = (
        descriptor.as_mapping_mut().expect("built by obj!"),
        def.as_mapping_mut().expect("built by obj!"),
    );
    if let Some(t) = cfg.temperature {
        fm.insert("temperature".into(), t.into());
    }
    if let Some(strip) = &a.strip {
        dm.insert("embeddings_strip".into(), collection(strip));
    }
    if !v2 {
        // se_atten_v2 is always strip and smooth, and DeePMD-kit writes neither key for it.
        let mode = cfg.tebd_input_mode.as_str();
        let smooth = cfg.smooth_type_embedding;
        dm.insert("tebd_input_mode".into(), mode.into());
        dm.insert("smooth_type_embedding".into(), smooth.into());
        fm.insert("tebd_input_mode".into(), mode.into());
        fm.insert("smooth_type_embedding".into(), smooth.into());
    }
    (descriptor, def)
}

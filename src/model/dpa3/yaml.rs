//! DPA-3 in DeePMD-kit's `.yaml` (`DescrptDPA3.serialize`, docs/deepmd-spec.md §18.9): its keys
//! into a [`DescriptorSpec`], its tensors into the parameter vector, and back.

use anyhow::{ensure, Result};
use serde_yaml_ng::Value;

use super::{Dpa3Config, UpdateStyle};
use crate::model::yaml::stats_tree;
use crate::model::yaml::{tebd_tree, DescriptorYaml};
use crate::model::yaml_block::{
    layer_tree, linear_tree, merge, read_activation, read_layer, read_linear, read_rows,
    read_type_pairs, rows_tree,
};
use crate::model::OwnKeys;
use crate::model::{DescriptorLayout, DescriptorSpec, DescriptorType};
use crate::yaml_tree::{brief, obj, At};

#[rustfmt::skip]
const KEYS: &[&str] = &[
    "@class", "@version", "type", "ntypes", "repflow_args", "concat_output_tebd",
    "activation_function", "precision", "exclude_types", "env_protection", "trainable", "seed",
    "use_econf_tebd", "use_tebd_bias", "use_loc_mapping", "add_chg_spin_ebd", "default_chg_spin",
    "type_map", "type_embedding", "repflow_variable",
];
#[rustfmt::skip]
const REPFLOW_KEYS: &[&str] = &[
    "n_dim", "e_dim", "a_dim", "nlayers", "e_rcut", "e_rcut_smth", "e_sel", "a_rcut",
    "a_rcut_smth", "a_sel", "a_compress_rate", "a_compress_e_rate", "a_compress_use_split",
    "n_multi_edge_message", "axis_neuron", "fix_stat_std", "skip_stat", "update_angle",
    "update_style", "update_residual", "update_residual_init", "optim_update",
    "smooth_edge_update", "edge_init_use_dist", "use_exp_switch", "use_dynamic_sel",
    "sel_reduce_factor", "sequential_update",
];
#[rustfmt::skip]
const LAYER_NODE_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "e_rcut", "e_rcut_smth", "e_sel", "a_rcut",
    "a_rcut_smth", "a_sel", "ntypes", "n_dim", "e_dim", "a_dim", "a_compress_rate",
    "a_compress_e_rate", "a_compress_use_split", "n_multi_edge_message", "axis_neuron",
    "activation_function", "update_angle", "update_style", "update_residual",
    "update_residual_init", "precision", "optim_update", "smooth_edge_update",
    "use_dynamic_sel", "sel_reduce_factor", "sequential_update", "node_self_mlp",
    "node_sym_linear", "node_edge_linear", "edge_self_linear", "edge_angle_linear1",
    "edge_angle_linear2", "angle_self_linear", "a_compress_n_linear", "a_compress_e_linear",
    "n_residual", "e_residual", "a_residual", "seed", "trainable",
];

/// An integer that may be given as a one-element list (DeePMD-kit's layers write `e_sel: [S]`).
fn one_usize(at: &At) -> Result<usize> {
    match at.v {
        serde_yaml_ng::Value::Sequence(_) => {
            let v = at.usizes()?;
            ensure!(v.len() == 1, "{}: expected one number", at.path);
            Ok(v[0])
        }
        _ => at.usize(),
    }
}

/// dpa3's entry in the registry.
pub(in crate::model) static YAML: DescriptorYaml = DescriptorYaml {
    read_spec,
    read_params,
    write,
    stat_nodes,
};

/// Its davg/dstd: its block's.
fn stat_nodes<'a>(d: &At<'a>, spec: &DescriptorSpec) -> Result<Vec<(At<'a>, usize)>> {
    Ok(vec![(d.key("repflow_variable")?, spec.nnei())])
}

/// The descriptor's keys. DeePMD-kit's dpmodel refuses unknown keys (`cls(**data)`); so does
/// this.
pub(in crate::model) fn read_spec(d: &At, _: DescriptorType, nt: usize) -> Result<DescriptorSpec> {
    d.version(1..=2, None)?;
    d.known(&[KEYS])?;
    for key in ["use_econf_tebd", "add_chg_spin_ebd"] {
        d.expect_off(key)?;
    }
    let r = d.key("repflow_args")?;
    r.known(&[REPFLOW_KEYS])?;
    let activation = read_activation(&d.key("activation_function")?)?;
    let style = r.key("update_style")?;
    let update_style = UpdateStyle::parse(style.str()?)
        .map_or_else(|| style.fail("res_avg, res_incr or res_residual"), Ok)?;
    let init = r.key("update_residual_init")?;
    let residual_norm = match init.str()? {
        "norm" => true,
        "const" => false,
        _ => return init.fail("\"norm\" or \"const\""),
    };
    let exclude_types = read_type_pairs(d, nt)?;
    let c = Dpa3Config {
        e_dim: r.key("e_dim")?.usize()?,
        a_dim: r.key("a_dim")?.usize()?,
        nlayers: r.key("nlayers")?.usize()?,
        a_rcut: r.key("a_rcut")?.f64()?,
        a_rcut_smth: r.key("a_rcut_smth")?.f64()?,
        a_sel: one_usize(&r.key("a_sel")?)?,
        a_compress_rate: r.key("a_compress_rate")?.usize()?,
        a_compress_e_rate: r.key("a_compress_e_rate")?.usize()?,
        a_compress_use_split: r.key("a_compress_use_split")?.bool()?,
        n_multi_edge_message: r.key("n_multi_edge_message")?.usize()?,
        axis_neuron: r.key("axis_neuron")?.usize()?,
        fix_stat_std: r.key("fix_stat_std")?.f64()?,
        update_angle: r.key("update_angle")?.bool()?,
        update_style,
        update_residual: r.key("update_residual")?.f64()?,
        residual_norm,
        optim_update: r.key("optim_update")?.bool()?,
        smooth_edge_update: r.key("smooth_edge_update")?.bool()?,
        edge_init_use_dist: r.key("edge_init_use_dist")?.bool()?,
        use_exp_switch: r.key("use_exp_switch")?.bool()?,
        use_dynamic_sel: r.key("use_dynamic_sel")?.bool()?,
        sel_reduce_factor: r.key("sel_reduce_factor")?.f64()?,
        sequential_update: r.key("sequential_update")?.bool()?,
        concat_output_tebd: d.key("concat_output_tebd")?.bool()?,
        activation,
        use_tebd_bias: d.key("use_tebd_bias")?.bool()?,
        use_loc_mapping: d.opt("use_loc_mapping").map_or(Ok(true), |b| b.bool())?,
        exclude_types,
    };
    let spec = DescriptorSpec {
        kind: DescriptorType::Dpa3,
        rcut: r.key("e_rcut")?.f64()?,
        rcut_smth: r.key("e_rcut_smth")?.f64()?,
        sel: vec![one_usize(&r.key("e_sel")?)?],
        neuron: vec![r.key("n_dim")?.usize()?],
        axis_neuron: 1,
        resnet_dt: false,
        type_one_side: false,
        env_protection: d.opt("env_protection").map_or(Ok(0.0), |a| a.f64())?,
        set_davg_zero: true,
        own: OwnKeys::Dpa3(c),
    };
    let c = spec.own.dpa3().expect("just made");
    (c.check(spec.m1(), spec.rcut, spec.sel[0])).map_err(|e| anyhow::anyhow!("{}: {e}", r.path))?;
    Ok(spec)
}

/// The tensors of a DPA-3 node into `params`, checked against the layout.
pub(in crate::model) fn read_params(
    d: &At,
    spec: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    params: &mut [f64],
) -> Result<()> {
    let l = dl.own.dpa3().expect("a DPA-3 layout");
    let c = spec.own.dpa3().expect("a DPA-3 spec");
    let (n, e, ad) = (spec.m1(), c.e_dim, c.a_dim);
    crate::model::yaml::read_tebd(&d.key("type_embedding")?, &l.tebd, params)?;
    let rv = d.key("repflow_variable")?;
    read_layer(&rv.key("edge_embd")?, &l.edge_embd, params)?;
    read_linear(&rv.key("angle_embd")?, 1, ad, l.angle_embd, None, params)?;
    let items = rv.seq_of("repflow_layers", l.layers.len(), "layers (nlayers)")?;
    for (ll, at) in l.layers.iter().zip(&items) {
        at.expect("@class", &["RepFlowLayer"])?;
        at.version(1..=2, None)?;
        at.known(&[LAYER_NODE_KEYS])?;
        read_layer(&at.key("node_self_mlp")?, &ll.node_self, params)?;
        read_layer(&at.key("node_sym_linear")?, &ll.node_sym, params)?;
        read_layer(&at.key("node_edge_linear")?, &ll.node_edge, params)?;
        read_layer(&at.key("edge_self_linear")?, &ll.edge_self, params)?;
        match &ll.angle {
            Some(a) => {
                read_layer(&at.key("edge_angle_linear1")?, &a.edge_angle1, params)?;
                read_layer(&at.key("edge_angle_linear2")?, &a.edge_angle2, params)?;
                read_layer(&at.key("angle_self_linear")?, &a.angle_self, params)?;
                let (nc, ec) = c.compressed(n);
                for (key, off, nin, nout) in [
                    ("a_compress_n_linear", a.compress_n, n, nc),
                    ("a_compress_e_linear", a.compress_e, e, ec),
                ] {
                    match off {
                        Some(w) => read_linear(&at.key(key)?, nin, nout, w, None, params)?,
                        None => at.expect_off(key)?,
                    }
                }
            }
            None => {
                for key in [
                    "edge_angle_linear1",
                    "edge_angle_linear2",
                    "angle_self_linear",
                ] {
                    at.expect_off(key)?;
                }
            }
        }
        read_rows(at, "n_residual", &ll.n_residual, n, params)?;
        read_rows(at, "e_residual", &ll.e_residual, e, params)?;
        read_rows(at, "a_residual", &ll.a_residual, ad, params)?;
    }
    if let Some(env) = rv.opt("env_mat") {
        // DeePMD-kit writes the block's env_mat with protection 0 and the quintic switch
        // whatever the descriptor says, and ignores it on reading (spec §18.11).
        let rc = env.key("rcut")?.f64()?;
        ensure!(
            rc == spec.rcut,
            "{}.rcut: {} differs from e_rcut {}",
            env.path,
            brief(env.key("rcut")?.v),
            spec.rcut
        );
    }
    Ok(())
}

/// The keys every RepFlowLayer repeats from the block's (`repflow_args` less nlayers,
/// edge_init_use_dist, use_exp_switch, fix_stat_std; e_sel as a list).
fn layer_keys(d: &DescriptorSpec, c: &Dpa3Config, nt: usize) -> Value {
    obj! {
        "e_rcut" => d.rcut, "e_rcut_smth" => d.rcut_smth, "e_sel" => &d.sel[..],
        "a_rcut" => c.a_rcut, "a_rcut_smth" => c.a_rcut_smth, "a_sel" => c.a_sel,
        "ntypes" => nt, "n_dim" => d.m1(), "e_dim" => c.e_dim, "a_dim" => c.a_dim,
        "a_compress_rate" => c.a_compress_rate, "a_compress_e_rate" => c.a_compress_e_rate,
        "a_compress_use_split" => c.a_compress_use_split,
        "n_multi_edge_message" => c.n_multi_edge_message, "axis_neuron" => c.axis_neuron,
        "activation_function" => c.activation.name(), "update_angle" => c.update_angle,
        "update_style" => c.update_style.as_str(), "update_residual" => c.update_residual,
        "update_residual_init" => if c.residual_norm { "norm" } else { "const" },
        "precision" => "float64", "optim_update" => c.optim_update,
        "smooth_edge_update" => c.smooth_edge_update, "use_dynamic_sel" => c.use_dynamic_sel,
        "sel_reduce_factor" => c.sel_reduce_factor, "sequential_update" => c.sequential_update,
    }
}

/// `repflow_args` as DeePMD-kit serialises them (every key but skip_stat).
fn repflow_args(d: &DescriptorSpec, c: &Dpa3Config) -> Value {
    obj! {
        "n_dim" => d.m1(), "e_dim" => c.e_dim, "a_dim" => c.a_dim, "nlayers" => c.nlayers,
        "e_rcut" => d.rcut, "e_rcut_smth" => d.rcut_smth, "e_sel" => d.sel[0],
        "a_rcut" => c.a_rcut, "a_rcut_smth" => c.a_rcut_smth, "a_sel" => c.a_sel,
        "a_compress_rate" => c.a_compress_rate, "a_compress_e_rate" => c.a_compress_e_rate,
        "a_compress_use_split" => c.a_compress_use_split,
        "n_multi_edge_message" => c.n_multi_edge_message, "axis_neuron" => c.axis_neuron,
        "fix_stat_std" => c.fix_stat_std, "update_angle" => c.update_angle,
        "update_style" => c.update_style.as_str(), "update_residual" => c.update_residual,
        "update_residual_init" => if c.residual_norm { "norm" } else { "const" },
        "optim_update" => c.optim_update, "smooth_edge_update" => c.smooth_edge_update,
        "edge_init_use_dist" => c.edge_init_use_dist, "use_exp_switch" => c.use_exp_switch,
        "use_dynamic_sel" => c.use_dynamic_sel, "sel_reduce_factor" => c.sel_reduce_factor,
        "sequential_update" => c.sequential_update,
    }
}

/// A DPA-3 descriptor as DeePMD-kit serialises it (spec §18.9), and the `model_def_script`
/// descriptor (input.json's form) that builds it; davg/dstd dpw's rows `[nt][4]`, written per
/// slot as DeePMD-kit keeps them.
pub(in crate::model) fn write(
    d: &DescriptorSpec,
    dl: &DescriptorLayout,
    _: usize,
    p: &[f64],
    stats: [&[f64]; 2],
    type_map: &[String],
) -> (Value, Value) {
    let l = dl.own.dpa3().expect("a DPA-3 layout");
    let c = d.own.dpa3().expect("a DPA-3 spec");
    let type_embedding = tebd_tree(&l.tebd, c.use_tebd_bias, p, type_map);
    let (nt, s, n) = (type_map.len(), d.sel[0], d.m1());
    let (nc, ec) = c.compressed(n);
    let layers: Vec<Value> = (l.layers.iter())
        .map(|ll| {
            let mut node = obj! {
                "@class" => "RepFlowLayer", "@version" => 2,
                "node_self_mlp" => linear_tree(&ll.node_self, p),
                "node_sym_linear" => linear_tree(&ll.node_sym, p),
                "node_edge_linear" => linear_tree(&ll.node_edge, p),
                "edge_self_linear" => linear_tree(&ll.edge_self, p),
            };
            if let Some(a) = &ll.angle {
                node = merge(
                    node,
                    obj! {
                        "edge_angle_linear1" => linear_tree(&a.edge_angle1, p),
                        "edge_angle_linear2" => linear_tree(&a.edge_angle2, p),
                        "angle_self_linear" => linear_tree(&a.angle_self, p),
                    },
                );
                if let (Some(cn), Some(ce)) = (a.compress_n, a.compress_e) {
                    node = merge(
                        node,
                        obj! {
                            "a_compress_n_linear" => layer_tree(n, nc, cn, None, p),
                            "a_compress_e_linear" => layer_tree(c.e_dim, ec, ce, None, p),
                        },
                    );
                }
            }
            if c.update_style == UpdateStyle::ResResidual {
                node = merge(
                    node,
                    obj! {
                        "@variables" => obj! {
                            "n_residual" => rows_tree(&ll.n_residual, n, p),
                            "e_residual" => rows_tree(&ll.e_residual, c.e_dim, p),
                            "a_residual" => rows_tree(&ll.a_residual, c.a_dim, p),
                        },
                    },
                );
            }
            merge(node, layer_keys(d, c, nt))
        })
        .collect();
    let excluded: Vec<Vec<usize>> = c.exclude_types.iter().map(|p| p.to_vec()).collect();
    let descriptor = obj! {
        "@class" => "Descriptor", "@version" => 2, "type" => "dpa3", "ntypes" => nt,
        "repflow_args" => repflow_args(d, c),
        "concat_output_tebd" => c.concat_output_tebd,
        "activation_function" => c.activation.name(), "precision" => "float64",
        "exclude_types" => excluded.clone(), "env_protection" => d.env_protection,
        "trainable" => true, "use_econf_tebd" => false, "use_tebd_bias" => c.use_tebd_bias,
        "use_loc_mapping" => c.use_loc_mapping, "add_chg_spin_ebd" => false,
        "default_chg_spin" => Value::Null, "type_map" => type_map,
        "type_embedding" => type_embedding,
        "repflow_variable" => obj! {
            "edge_embd" => linear_tree(&l.edge_embd, p),
            "angle_embd" => layer_tree(1, c.a_dim, l.angle_embd, None, p),
            "repflow_layers" => layers,
            // DeePMD-kit writes the block's env_mat with protection 0 and the quintic switch,
            // whatever the descriptor's (spec §18.11).
            "env_mat" => obj! {
                "rcut" => d.rcut, "rcut_smth" => d.rcut_smth, "protection" => 0.0,
                "use_exp_switch" => false,
            },
            "@variables" => stats_tree(stats, nt, s, 4),
        },
    };
    let mut repflow = repflow_args(d, c);
    if let Value::Mapping(m) = &mut repflow {
        m.insert("skip_stat".into(), false.into());
    }
    let def = obj! {
        "type" => "dpa3", "repflow" => repflow, "concat_output_tebd" => c.concat_output_tebd,
        "activation_function" => c.activation.name(), "precision" => "float64",
        "exclude_types" => excluded, "env_protection" => d.env_protection,
        "trainable" => true, "use_econf_tebd" => false, "use_tebd_bias" => c.use_tebd_bias,
        "use_loc_mapping" => c.use_loc_mapping, "add_chg_spin_ebd" => false,
    };
    (descriptor, def)
}

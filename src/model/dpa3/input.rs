//! DPA-3's keys in input.json (`"type": "dpa3"`: DeePMD-kit 3.2.0's `descrpt_dpa3_args` with its
//! `repflow` block, `dpa3_repflow_args`; docs/deepmd-spec.md §18.1), and their out.json form.

use anyhow::anyhow;
use serde_json::{json, Map, Value};

use crate::config::block_keys::{activation, update_keys};
use crate::config::error::ConfigError;
use crate::config::keys::{non_negative, positive, Schema, Section};
use crate::config::model::{precision, type_pairs, AutoList, DescriptorConfig, Sel, SelList};
use crate::model::check::{layer_count, own_widths, shared_keys, with_own};
use crate::model::dpa3::Dpa3Config;
use crate::model::OwnKeys;
use crate::model::{DescriptorSpec, DescriptorType};

type Result<T> = std::result::Result<T, ConfigError>;

static DESCRIPTOR: Schema = Schema {
    keys: &[&[
        "type",
        "repflow",
        "concat_output_tebd",
        "activation_function",
        "precision",
        "exclude_types",
        "env_protection",
        "trainable",
        "seed",
        "use_tebd_bias",
        "use_loc_mapping",
    ]],
    unsupported: &[&[
        (
            "use_econf_tebd",
            "the electronic-configuration type embedding is not implemented",
        ),
        (
            "add_chg_spin_ebd",
            "charge/spin conditioning is not implemented",
        ),
    ]],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

static REPFLOW: Schema = Schema {
    keys: &[&[
        "n_dim",
        "e_dim",
        "a_dim",
        "nlayers",
        "e_rcut",
        "e_rcut_smth",
        "e_sel",
        "a_rcut",
        "a_rcut_smth",
        "a_sel",
        "a_compress_rate",
        "a_compress_e_rate",
        "a_compress_use_split",
        "n_multi_edge_message",
        "axis_neuron",
        "fix_stat_std",
        "skip_stat",
        "update_angle",
        "update_style",
        "update_residual",
        "update_residual_init",
        "optim_update",
        "smooth_edge_update",
        "edge_init_use_dist",
        "use_exp_switch",
        "use_dynamic_sel",
        "sel_reduce_factor",
        "sequential_update",
    ]],
    unsupported: &[],
    ignored: &[],
    deepmd: "model[standard].descriptor[dpa3].repflow",
};

/// The `dpa3` descriptor of input.json.
pub(crate) fn parse(
    _: DescriptorType,
    v: &Value,
    path: &str,
    ntypes: usize,
) -> Result<DescriptorConfig> {
    let sec = Section::new(v, path, &DESCRIPTOR)?;
    let rpath = sec.path_of("repflow");
    let r = Section::new(
        sec.required("repflow", "an object of DPA-3's repflow keys")?,
        &rpath,
        &REPFLOW,
    )?;
    let activation = activation(&sec, "silu", "DPA-3")?;
    let (update_style, residual_norm) = update_keys(&r, "res_residual", "const")?;
    let a_rcut = positive(r.f64_or("a_rcut", 4.0)?, &r.path_of("a_rcut"))?;
    let mut auto_lists = vec![];
    let a_sel = AutoList::size(
        Sel::of_list(&r, "a_sel", None)?,
        SelList::Dpa3Angle,
        a_rcut,
        &mut auto_lists,
    );
    let exclude_types = type_pairs(&sec, ntypes)?;
    // skip_stat (deprecated): true means a fixed std of 0.3 and no statistics.
    let fix_stat_std = match r.bool_or("skip_stat", false)? {
        true => 0.3,
        false => non_negative(r.f64_or("fix_stat_std", 0.3)?, &r.path_of("fix_stat_std"))?,
    };
    let c = Dpa3Config {
        e_dim: r.usize_or("e_dim", 64)?,
        a_dim: r.usize_or("a_dim", 64)?,
        nlayers: r.usize_or("nlayers", 6)?,
        a_rcut,
        a_rcut_smth: non_negative(r.f64_or("a_rcut_smth", 3.5)?, &r.path_of("a_rcut_smth"))?,
        a_sel,
        a_compress_rate: r.usize_or("a_compress_rate", 0)?,
        a_compress_e_rate: r.usize_or("a_compress_e_rate", 1)?,
        a_compress_use_split: r.bool_or("a_compress_use_split", false)?,
        n_multi_edge_message: r.usize_or("n_multi_edge_message", 1)?,
        axis_neuron: r.usize_or("axis_neuron", 4)?,
        fix_stat_std,
        update_angle: r.bool_or("update_angle", true)?,
        update_style,
        update_residual: r.f64_or("update_residual", 0.1)?,
        residual_norm,
        optim_update: r.bool_or("optim_update", true)?,
        smooth_edge_update: r.bool_or("smooth_edge_update", false)?,
        edge_init_use_dist: r.bool_or("edge_init_use_dist", false)?,
        use_exp_switch: r.bool_or("use_exp_switch", false)?,
        use_dynamic_sel: r.bool_or("use_dynamic_sel", false)?,
        sel_reduce_factor: r.f64_or("sel_reduce_factor", 10.0)?,
        sequential_update: r.bool_or("sequential_update", false)?,
        concat_output_tebd: sec.bool_or("concat_output_tebd", false)?,
        activation,
        use_tebd_bias: sec.bool_or("use_tebd_bias", false)?,
        use_loc_mapping: sec.bool_or("use_loc_mapping", true)?,
        exclude_types,
    };
    let n = r.usize_or("n_dim", 128)?;
    let e_rcut = positive(r.f64_or("e_rcut", 6.0)?, &r.path_of("e_rcut"))?;
    let e_rcut_smth = non_negative(r.f64_or("e_rcut_smth", 5.0)?, &r.path_of("e_rcut_smth"))?;
    let sel = Sel::of_list(&r, "e_sel", None)?;
    if let Sel::Fixed(s) = &sel {
        c.check(n, e_rcut, s[0])
            .map_err(|why| ConfigError::invalid(&rpath, why))?;
    } else {
        c.check(n, e_rcut, usize::MAX)
            .map_err(|why| ConfigError::invalid(&rpath, why))?;
    }
    Ok(DescriptorConfig {
        kind: DescriptorType::Dpa3,
        r#type: "dpa3".into(),
        sel,
        rcut: e_rcut,
        rcut_smth: e_rcut_smth,
        neuron: vec![n],
        axis_neuron: 1,
        resnet_dt: false,
        type_one_side: false,
        precision: precision(&sec)?,
        trainable: sec.bool_or("trainable", true)?,
        seed: sec.opt_u64("seed")?,
        env_protection: sec.f64_or("env_protection", 0.0)?,
        set_davg_zero: true,
        own: OwnKeys::Dpa3(c),
        auto_lists,
    })
}

/// The descriptor as out.json writes it: every key at its value, as `dp train` fills them.
pub(crate) fn to_json(d: &DescriptorConfig) -> Value {
    let c = d.own.dpa3().expect("a DPA-3 config");
    json!({
        "type": "dpa3",
        "repflow": {
            "n_dim": d.neuron[0],
            "e_dim": c.e_dim,
            "a_dim": c.a_dim,
            "nlayers": c.nlayers,
            "e_rcut": d.rcut,
            "e_rcut_smth": d.rcut_smth,
            "e_sel": match &d.sel {
                Sel::Fixed(s) => json!(s[0]),
                auto => auto.to_value(),
            },
            "a_rcut": c.a_rcut,
            "a_rcut_smth": c.a_rcut_smth,
            "a_sel": c.a_sel,
            "a_compress_rate": c.a_compress_rate,
            "a_compress_e_rate": c.a_compress_e_rate,
            "a_compress_use_split": c.a_compress_use_split,
            "n_multi_edge_message": c.n_multi_edge_message,
            "axis_neuron": c.axis_neuron,
            "fix_stat_std": c.fix_stat_std,
            "skip_stat": false,
            "update_angle": c.update_angle,
            "update_style": c.update_style.as_str(),
            "update_residual": c.update_residual,
            "update_residual_init": if c.residual_norm { "norm" } else { "const" },
            "optim_update": c.optim_update,
            "smooth_edge_update": c.smooth_edge_update,
            "edge_init_use_dist": c.edge_init_use_dist,
            "use_exp_switch": c.use_exp_switch,
            "use_dynamic_sel": c.use_dynamic_sel,
            "sel_reduce_factor": c.sel_reduce_factor,
            "sequential_update": c.sequential_update,
        },
        "concat_output_tebd": c.concat_output_tebd,
        "activation_function": c.activation.name(),
        "precision": d.precision.as_str(),
        "exclude_types": c.exclude_types,
        "env_protection": d.env_protection,
        "trainable": d.trainable,
        "seed": d.seed,
        "use_econf_tebd": false,
        "use_tebd_bias": c.use_tebd_bias,
        "use_loc_mapping": c.use_loc_mapping,
        "add_chg_spin_ebd": false,
        "default_chg_spin": null,
    })
}

/// Its keys as input.json gives them, read back from a spec (`ModelSpec::differences` compares
/// them): the shared ones (e_rcut, e_sel, n_dim as rcut, sel, neuron) and its repflow section.
pub(crate) fn spec_keys(d: &DescriptorSpec) -> Map<String, Value> {
    with_own(
        shared_keys(d, true, true),
        json!({ "repflow": d.own.dpa3() }),
    )
}

/// Its own keys' ranges, after the ones every descriptor shares (`ModelSpec::check`).
pub(crate) fn check(d: &DescriptorSpec, _: usize, key: &str) -> anyhow::Result<()> {
    let c = d.own.dpa3().expect("a DPA-3 spec holds its keys");
    c.check(d.m1(), d.rcut, d.sel[0])
        .map_err(|e| anyhow!("{key}.repflow: {e}"))?;
    own_widths(
        &format!("{key}.repflow"),
        &[
            ("e_dim", c.e_dim),
            ("a_dim", c.a_dim),
            ("n_dim", d.m1()),
            ("axis_neuron", c.axis_neuron),
            ("n_multi_edge_message", c.n_multi_edge_message),
        ],
    )?;
    layer_count(&format!("{key}.repflow.nlayers"), c.nlayers)
}

//! DPA-2's keys in input.json (`"type": "dpa2"`: DeePMD-kit 3.2.0's `descrpt_dpa2_args` with its
//! `repinit` and `repformer` blocks, `dpa2_repinit_args`, `dpa2_repformer_args`;
//! docs/deepmd-spec.md §20.1), and their out.json form.

use anyhow::{anyhow, ensure};
use serde_json::{Map, Value};

use crate::config::block_keys::{activation, tebd_input_mode, update_keys};
use crate::config::error::ConfigError;
use crate::config::keys::{at_least_one, non_negative, positive, to_f64, Schema, Section};
use crate::config::model::{
    precision, type_pairs, widths, AutoList, DescriptorConfig, Sel, SelList,
};
use crate::model::check::{self, shared_keys, with_own, MAX_NNEI};
use crate::model::dpa2::{Dpa2Config, RepformerConfig, RepinitConfig, RepinitShared};
use crate::model::OwnKeys;
use crate::model::{DescriptorSpec, DescriptorType};

type Result<T> = std::result::Result<T, ConfigError>;

static DESCRIPTOR: Schema = Schema {
    keys: &[&[
        "type",
        "repinit",
        "repformer",
        "concat_output_tebd",
        "precision",
        "smooth",
        "exclude_types",
        "env_protection",
        "trainable",
        "seed",
        "add_tebd_to_repinit_out",
        "use_tebd_bias",
    ]],
    unsupported: &[&[(
        "use_econf_tebd",
        "the electronic-configuration type embedding is not implemented",
    )]],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

static REPINIT: Schema = Schema {
    keys: &[&[
        "rcut",
        "rcut_smth",
        "nsel",
        "neuron",
        "axis_neuron",
        "tebd_dim",
        "tebd_input_mode",
        "set_davg_zero",
        "activation_function",
        "type_one_side",
        "resnet_dt",
        "use_three_body",
        "three_body_neuron",
        "three_body_rcut",
        "three_body_rcut_smth",
        "three_body_sel",
    ]],
    unsupported: &[],
    ignored: &[],
    deepmd: "model[standard].descriptor[dpa2].repinit",
};

static REPFORMER: Schema = Schema {
    keys: &[&[
        "rcut",
        "rcut_smth",
        "nsel",
        "nlayers",
        "g1_dim",
        "g2_dim",
        "axis_neuron",
        "direct_dist",
        "update_g1_has_conv",
        "update_g1_has_drrd",
        "update_g1_has_grrg",
        "update_g1_has_attn",
        "update_g2_has_g1g1",
        "update_g2_has_attn",
        "use_sqrt_nnei",
        "g1_out_conv",
        "g1_out_mlp",
        "update_h2",
        "attn1_hidden",
        "attn1_nhead",
        "attn2_hidden",
        "attn2_nhead",
        "attn2_has_gate",
        "activation_function",
        "update_style",
        "update_residual",
        "update_residual_init",
        "set_davg_zero",
        "trainable_ln",
        "ln_eps",
    ]],
    unsupported: &[],
    ignored: &[],
    deepmd: "model[standard].descriptor[dpa2].repformer",
};

fn required_f64(sec: &Section, key: &str) -> Result<f64> {
    to_f64(sec.required(key, "a number")?, &sec.path_of(key))
}

fn positive_count(sec: &Section, key: &str, default: usize) -> Result<usize> {
    at_least_one(sec.usize_or(key, default)?, &sec.path_of(key))
}

fn parse_repinit(i: &Section, auto: &mut Vec<AutoList>) -> Result<RepinitConfig> {
    let three_body_rcut = positive(
        i.f64_or("three_body_rcut", 4.0)?,
        &i.path_of("three_body_rcut"),
    )?;
    let three_body_sel = AutoList::size(
        Sel::of_list(i, "three_body_sel", Some(40))?,
        SelList::Dpa2ThreeBody,
        three_body_rcut,
        auto,
    );
    Ok(RepinitConfig {
        tebd_dim: positive_count(i, "tebd_dim", 8)?,
        tebd_input_mode: tebd_input_mode(i)?,
        activation: activation(i, "tanh", "DPA-2")?,
        use_three_body: i.bool_or("use_three_body", false)?,
        three_body_neuron: widths(i, "three_body_neuron", &[2, 4, 8])?,
        three_body_rcut,
        three_body_rcut_smth: non_negative(
            i.f64_or("three_body_rcut_smth", 0.5)?,
            &i.path_of("three_body_rcut_smth"),
        )?,
        three_body_sel,
    })
}

fn parse_repformer(r: &Section, auto: &mut Vec<AutoList>) -> Result<RepformerConfig> {
    let (update_style, residual_norm) = update_keys(r, "res_avg", "norm")?;
    let ln_eps = match r.opt_f64("ln_eps")? {
        Some(e) => positive(e, &r.path_of("ln_eps"))?,
        None => 1e-5,
    };
    let rcut = positive(required_f64(r, "rcut")?, &r.path_of("rcut"))?;
    let nsel = AutoList::size(
        Sel::of_list(r, "nsel", None)?,
        SelList::Dpa2Repformer,
        rcut,
        auto,
    );
    Ok(RepformerConfig {
        rcut,
        rcut_smth: non_negative(required_f64(r, "rcut_smth")?, &r.path_of("rcut_smth"))?,
        nsel,
        nlayers: positive_count(r, "nlayers", 3)?,
        g1_dim: positive_count(r, "g1_dim", 128)?,
        g2_dim: positive_count(r, "g2_dim", 16)?,
        axis_neuron: positive_count(r, "axis_neuron", 4)?,
        direct_dist: r.bool_or("direct_dist", false)?,
        update_g1_has_conv: r.bool_or("update_g1_has_conv", true)?,
        update_g1_has_drrd: r.bool_or("update_g1_has_drrd", true)?,
        update_g1_has_grrg: r.bool_or("update_g1_has_grrg", true)?,
        update_g1_has_attn: r.bool_or("update_g1_has_attn", true)?,
        update_g2_has_g1g1: r.bool_or("update_g2_has_g1g1", true)?,
        update_g2_has_attn: r.bool_or("update_g2_has_attn", true)?,
        use_sqrt_nnei: r.bool_or("use_sqrt_nnei", true)?,
        g1_out_conv: r.bool_or("g1_out_conv", true)?,
        g1_out_mlp: r.bool_or("g1_out_mlp", true)?,
        update_h2: r.bool_or("update_h2", false)?,
        attn1_hidden: positive_count(r, "attn1_hidden", 64)?,
        attn1_nhead: positive_count(r, "attn1_nhead", 4)?,
        attn2_hidden: positive_count(r, "attn2_hidden", 16)?,
        attn2_nhead: positive_count(r, "attn2_nhead", 4)?,
        attn2_has_gate: r.bool_or("attn2_has_gate", false)?,
        activation: activation(r, "tanh", "DPA-2")?,
        update_style,
        update_residual: r.f64_or("update_residual", 0.001)?,
        residual_norm,
        set_davg_zero: r.bool_or("set_davg_zero", true)?,
        trainable_ln: r.bool_or("trainable_ln", true)?,
        ln_eps,
    })
}

/// The `dpa2` descriptor of input.json.
pub(crate) fn parse(
    _: DescriptorType,
    v: &Value,
    path: &str,
    ntypes: usize,
) -> Result<DescriptorConfig> {
    let sec = Section::new(v, path, &DESCRIPTOR)?;
    let block = |key: &str, what: &str, schema: &'static Schema| {
        let value = sec.required(key, what)?;
        Section::new(value, &sec.path_of(key), schema)
    };
    let i = block("repinit", "an object of DPA-2's repinit keys", &REPINIT)?;
    let r = block(
        "repformer",
        "an object of DPA-2's repformer keys",
        &REPFORMER,
    )?;
    let trainable = sec.bool_or("trainable", true)?;
    let mut auto_lists = vec![];
    let c = Dpa2Config {
        repinit: parse_repinit(&i, &mut auto_lists)?,
        repformer: parse_repformer(&r, &mut auto_lists)?,
        concat_output_tebd: sec.bool_or("concat_output_tebd", true)?,
        smooth: sec.bool_or("smooth", true)?,
        exclude_types: type_pairs(&sec, ntypes)?,
        add_tebd_to_repinit_out: sec.bool_or("add_tebd_to_repinit_out", false)?,
        use_tebd_bias: sec.bool_or("use_tebd_bias", false)?,
        trainable,
    };
    let rcut = positive(required_f64(&i, "rcut")?, &i.path_of("rcut"))?;
    let sel = Sel::of_list(&i, "nsel", None)?;
    let neuron = widths(&i, "neuron", &[25, 50, 100])?;
    let axis_neuron = positive_count(&i, "axis_neuron", 16)?;
    let m1 = *neuron.last().expect("widths() is non-empty");
    let invalid = |why| ConfigError::invalid(path, why);
    c.check_widths(rcut, m1, axis_neuron).map_err(invalid)?;
    // The lists' sizes against their rcuts once every one is known (an auto one after the
    // trainer has counted it).
    if let (Sel::Fixed(n), true) = (&sel, auto_lists.is_empty()) {
        c.check_lists(rcut, n[0]).map_err(invalid)?;
    }
    Ok(DescriptorConfig {
        kind: DescriptorType::Dpa2,
        r#type: "dpa2".into(),
        sel,
        rcut,
        rcut_smth: non_negative(required_f64(&i, "rcut_smth")?, &i.path_of("rcut_smth"))?,
        neuron,
        axis_neuron,
        resnet_dt: i.bool_or("resnet_dt", false)?,
        type_one_side: i.bool_or("type_one_side", false)?,
        precision: precision(&sec)?,
        trainable,
        seed: sec.opt_u64("seed")?,
        env_protection: non_negative(
            sec.f64_or("env_protection", 0.0)?,
            &sec.path_of("env_protection"),
        )?,
        set_davg_zero: i.bool_or("set_davg_zero", true)?,
        own: OwnKeys::Dpa2(c),
        auto_lists,
    })
}

/// The descriptor as out.json writes it: every key at its value, as `dp train` fills them.
pub(crate) fn to_json(d: &DescriptorConfig) -> Value {
    let c = d.own.dpa2().expect("a DPA-2 config");
    // An "auto" nsel is written back as it was given (0 here, replaced below).
    let nsel = match &d.sel {
        Sel::Fixed(s) => s[0],
        Sel::Auto(_) => 0,
    };
    let shared = RepinitShared {
        rcut: d.rcut,
        rcut_smth: d.rcut_smth,
        nsel,
        neuron: &d.neuron,
        axis_neuron: d.axis_neuron,
        type_one_side: d.type_one_side,
        resnet_dt: d.resnet_dt,
        set_davg_zero: d.set_davg_zero,
    };
    let mut v = c.input_json(&shared, d.precision.as_str(), d.env_protection);
    v["seed"] = d.seed.into();
    if let Sel::Auto(_) = d.sel {
        v["repinit"]["nsel"] = d.sel.to_value();
    }
    v
}

/// Its keys as input.json gives them, read back from a spec (`ModelSpec::differences` compares
/// them): the repinit's the spec holds, then its repinit and repformer sections.
pub(crate) fn spec_keys(d: &DescriptorSpec) -> Map<String, Value> {
    with_own(shared_keys(d, true, true), serde_json::json!(d.own.dpa2()))
}

/// Its own keys' ranges, after the ones every descriptor shares (`ModelSpec::check`; the
/// repinit's list and net are the spec's, checked there).
pub(crate) fn check(d: &DescriptorSpec, _: usize, key: &str) -> anyhow::Result<()> {
    let c = d.own.dpa2().expect("a DPA-2 spec holds its keys");
    (c.check(d.rcut, d.sel[0], d.m1(), d.axis_neuron)).map_err(|e| anyhow!("{key}: {e}"))?;
    let (i, r) = (&c.repinit, &c.repformer);
    check::own_widths(
        key,
        &[
            ("repinit.tebd_dim", i.tebd_dim),
            ("repformer.g1_dim", r.g1_dim),
            ("repformer.g2_dim", r.g2_dim),
            ("repformer.axis_neuron", r.axis_neuron),
            ("repformer.attn1_hidden", r.attn1_hidden),
            ("repformer.attn1_nhead", r.attn1_nhead),
            ("repformer.attn2_hidden", r.attn2_hidden),
            ("repformer.attn2_nhead", r.attn2_nhead),
        ],
    )?;
    check::widths(
        &format!("{key}.repinit.three_body_neuron"),
        &i.three_body_neuron,
    )?;
    check::layer_count(&format!("{key}.repformer.nlayers"), r.nlayers)?;
    ensure!(
        i.three_body_sel <= MAX_NNEI,
        "{key}.repinit.three_body_sel: at most {MAX_NNEI} neighbours, found {}",
        i.three_body_sel
    );
    for (name, rc, rs) in [
        ("repformer", r.rcut, r.rcut_smth),
        (
            "repinit.three_body",
            i.three_body_rcut,
            i.three_body_rcut_smth,
        ),
    ] {
        ensure!(
            rc.is_finite() && rc > 0.0 && rs.is_finite() && rs >= 0.0,
            "{key}.{name}: rcut must be positive and rcut_smth >= 0, found {rc} and {rs}"
        );
    }
    check::positive_number(&format!("{key}.repformer.ln_eps"), r.ln_eps)
}

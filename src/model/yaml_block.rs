//! The nodes DeePMD-kit's message-passing blocks (DPA-2's repformer, DPA-3's repflow) are built
//! of in its `.yaml`: one-layer `Layer` nodes (`NativeLayer` without activation, skip or
//! timestep), the residual-vector lists of a layer, a block's `env_mat`, the descriptor's
//! `exclude_types` pairs, and an `activation_function` (the blocks' and the fitting nets'); and
//! the keys of DPA-2's and se_e3_tebd's descriptors that their constructors default.

use anyhow::{bail, ensure, Result};
use serde_yaml_ng::Value;

use crate::model::layout::Layer;
use crate::model::{Activation, TebdInputMode};
use crate::yaml_tree::{brief, ndarray, obj, At};

// A key DeePMD-kit's constructors give a default is read at that default when absent.
pub(super) fn flag(at: &At, key: &str, default: bool) -> Result<bool> {
    at.opt(key).map_or(Ok(default), |v| v.bool())
}
pub(super) fn count(at: &At, key: &str, default: usize) -> Result<usize> {
    at.opt(key).map_or(Ok(default), |v| v.usize())
}
pub(super) fn number(at: &At, key: &str, default: f64) -> Result<f64> {
    at.opt(key).map_or(Ok(default), |v| v.f64())
}
pub(super) fn widths(at: &At, key: &str, default: &[usize]) -> Result<Vec<usize>> {
    let w = at.opt(key).map_or(Ok(default.to_vec()), |v| v.usizes())?;
    ensure!(!w.is_empty(), "{}.{key}: empty", at.path);
    Ok(w)
}
pub(super) fn activation(at: &At) -> Result<Activation> {
    let Some(a) = at.opt("activation_function") else {
        return Ok(Activation::Tanh);
    };
    read_activation(&a)
}
pub(super) fn tebd_input_mode(at: &At) -> Result<TebdInputMode> {
    let Some(m) = at.opt("tebd_input_mode") else {
        return Ok(TebdInputMode::Concat);
    };
    match m.str()? {
        "concat" => Ok(TebdInputMode::Concat),
        "strip" => Ok(TebdInputMode::Strip),
        _ => m.fail("\"concat\" or \"strip\""),
    }
}

/// A descriptor with a type embedding of its own: dpw's starts from one-hot rows of the
/// model's `nt` types.
pub(super) fn one_hot_tebd(d: &At, nt: usize) -> Result<()> {
    if flag(d, "use_econf_tebd", false)? {
        bail!(
            "{}.use_econf_tebd: true is not supported (the electronic-configuration type \
             embedding is not implemented; dpw's type embedding starts from one-hot rows)",
            d.path
        );
    }
    if let Some(n) = d.opt("ntypes") {
        ensure!(
            n.usize()? == nt,
            "{}: {} differs from type_map's {nt} types",
            n.path,
            brief(n.v)
        );
    }
    Ok(())
}

/// DeePMD-kit's `env_mat` of a block: protection 0 and the quintic switch whatever the
/// descriptor's (spec §20.11).
pub(super) fn env_mat(rcut: f64, rcut_smth: f64) -> Value {
    obj! {
        "rcut" => rcut, "rcut_smth" => rcut_smth, "protection" => 0.0,
        "use_exp_switch" => false,
    }
}

/// A JSON value (input.json's form of some keys) as a YAML node.
pub(super) fn yaml(v: serde_json::Value) -> Value {
    serde_yaml_ng::to_value(v).expect("JSON is YAML")
}

/// A bias-free or biased linear `Layer` node into `params`: activation none, no resnet, no idt.
pub(super) fn read_linear(
    at: &At,
    nin: usize,
    nout: usize,
    w: usize,
    b: Option<usize>,
    params: &mut [f64],
) -> Result<()> {
    at.expect("@class", &["Layer"])?;
    at.version(1..=2, Some(1))?;
    at.known(&[super::yaml::LAYER_KEYS])?;
    at.expect("activation_function", &["none", "linear", "Linear"])?;
    at.expect_off("resnet")?;
    let vars = at.key("@variables")?;
    let wv = vars.key("w")?.array(&[nin, nout])?;
    params[w..w + wv.len()].copy_from_slice(&wv);
    match (b, vars.opt("b")) {
        (Some(off), Some(bv)) => params[off..off + nout].copy_from_slice(&bv.array(&[nout])?),
        (None, None) => {}
        (Some(_), None) => bail!("{}.b: missing", vars.path),
        (None, Some(_)) => bail!("{}.b: expected null (a layer without bias)", vars.path),
    }
    vars.expect_off("idt")?;
    Ok(())
}

/// An `activation_function` node: one that dpw's nets take.
pub(super) fn read_activation(a: &At) -> Result<Activation> {
    Activation::parse(a.str()?).map_or_else(|| a.fail("tanh, silu, silut[:c] or linear"), Ok)
}

pub(super) fn read_layer(at: &At, l: &Layer, params: &mut [f64]) -> Result<()> {
    read_linear(at, l.nin, l.nout, l.w, Some(l.b), params)
}

/// The residual vectors `name` of a layer: at the layer's top level (version 1) or under its
/// `@variables` (version 2).
pub(super) fn read_rows(
    layer: &At,
    name: &str,
    rows: &[usize],
    width: usize,
    params: &mut [f64],
) -> Result<()> {
    let node = match layer.key("@variables").ok().and_then(|v| v.opt(name)) {
        Some(n) => Some(n),
        None => layer.opt(name),
    };
    let items = match node {
        Some(n) => n.seq()?,
        None if rows.is_empty() => return Ok(()),
        None => bail!("{}.{name}: missing", layer.path),
    };
    ensure!(
        items.len() == rows.len(),
        "{}.{name}: expected {} vectors, found {}",
        layer.path,
        rows.len(),
        items.len()
    );
    for (&off, it) in rows.iter().zip(&items) {
        params[off..off + width].copy_from_slice(&it.array(&[width])?);
    }
    Ok(())
}

/// The descriptor's `exclude_types`: pairs of types below `nt` (absent or null: none).
pub(super) fn read_type_pairs(d: &At, nt: usize) -> Result<Vec<[usize; 2]>> {
    let Some(e) = d.opt("exclude_types") else {
        return Ok(vec![]);
    };
    (e.seq()?.iter())
        .map(|p| {
            let v = p.usizes()?;
            ensure!(v.len() == 2, "{}: expected a pair of types", p.path);
            ensure!(
                v.iter().all(|&t| t < nt),
                "{}: {v:?} names a type beyond the {nt} of type_map",
                p.path
            );
            Ok([v[0], v[1]])
        })
        .collect()
}

/// A `Layer` node: activation none, no resnet, no idt; `b` where the layer has a bias.
pub(super) fn layer_tree(nin: usize, nout: usize, w: usize, b: Option<usize>, p: &[f64]) -> Value {
    obj! {
        "@class" => "Layer", "@version" => 2,
        "@variables" => obj! {
            "w" => ndarray(&[nin, nout], &p[w..]),
            "b" => b.map_or(Value::Null, |o| ndarray(&[nout], &p[o..])),
            "idt" => Value::Null,
        },
        "activation_function" => "none", "bias" => b.is_some(), "precision" => "float64",
        "resnet" => false, "trainable" => true, "use_timestep" => false,
    }
}

pub(super) fn linear_tree(l: &Layer, p: &[f64]) -> Value {
    layer_tree(l.nin, l.nout, l.w, Some(l.b), p)
}

/// The residual vectors at `offs`, each `width` long, as a list of arrays.
pub(super) fn rows_tree(offs: &[usize], width: usize, p: &[f64]) -> Value {
    Value::Sequence(offs.iter().map(|&o| ndarray(&[width], &p[o..])).collect())
}

/// `v` with the keys of `extra` added (both mappings built by `obj!`).
pub(super) fn merge(mut v: Value, extra: Value) -> Value {
    if let (Value::Mapping(m), Value::Mapping(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v
}

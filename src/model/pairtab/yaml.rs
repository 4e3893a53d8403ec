//! The serialization of a model with a pair table (docs/deepmd-spec.md §19.7): DeePMD-kit's
//! `zbl` (`use_srtab`) and `linear` (`linear_ener`) models, each a list of a `standard` DP
//! model and a `pairtab` model, with the combined model's out_bias at the top.

use anyhow::{bail, ensure, Result};
use serde_yaml_ng::Value;

use super::{Mix, PairTable, ShortRange};
use crate::model::linear::yaml::{read_weights, weights_value};
use crate::yaml_tree::{ndarray, obj, At};

#[rustfmt::skip]
const MIXED_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "models", "type_map", "weights",
    "atom_exclude_types", "pair_exclude_types", "rcond", "preset_out_bias", "sw_rmin", "sw_rmax",
    "smin_alpha",
];
#[rustfmt::skip]
const PAIRTAB_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "tab", "rcut", "sel", "type_map",
    "atom_exclude_types", "pair_exclude_types", "rcond", "preset_out_bias",
];
#[rustfmt::skip]
const TAB_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "rmin", "rmax", "hh", "ntypes", "rcut", "nspline",
];

/// A mixed model's parts: its DP model's node (read as a standard model), the table and how
/// it mixes, and the combined model's out_bias `[ntypes]`.
pub struct Mixed<'a> {
    pub dp: At<'a>,
    pub short_range: ShortRange,
    pub out_bias: Vec<f64>,
}

/// `m` of type `zbl` or `linear`.
pub fn read<'a>(m: &At<'a>, tab_file: Option<&str>) -> Result<Mixed<'a>> {
    m.known(&[MIXED_KEYS])?;
    let kind = m.key("type")?.str()?;
    match kind {
        "zbl" => m.version(2..=2, Some(1))?,
        _ => m.version(2..=3, Some(2))?,
    }
    m.expect_off("pair_exclude_types")?;
    m.expect_off("atom_exclude_types")?;
    m.expect_off("preset_out_bias")?;
    let nt = m.key("type_map")?.seq()?.len();
    let models = m.key("models")?.seq()?;
    let kinds: Vec<&str> = (models.iter())
        .map(|x| x.opt("type").map_or(Ok("standard"), |t| t.str()))
        .collect::<Result<_>>()?;
    if kinds != ["standard", "pairtab"] {
        bail!(
            "{}.models: {kinds:?}: dpw reads a DP model (standard) followed by a pair table \
             (pairtab), one of each",
            m.path
        );
    }
    let table = read_table(&models[1], nt)?;
    let mix = match kind {
        "zbl" => Mix::Zbl {
            sw_rmin: m.key("sw_rmin")?.f64()?,
            sw_rmax: m.key("sw_rmax")?.f64()?,
            smin_alpha: m.key("smin_alpha")?.f64()?,
        },
        _ => Mix::Linear {
            weights: read_weights(&m.key("weights")?, 2)?,
        },
    };
    let out_bias = m.key("@variables")?.key("out_bias")?.array(&[1, nt, 1])?;
    Ok(Mixed {
        dp: models.into_iter().next().expect("two models"),
        short_range: ShortRange {
            table,
            mix,
            tab_file: tab_file.unwrap_or("").to_string(),
        },
        out_bias,
    })
}

fn read_table(p: &At, nt: usize) -> Result<PairTable> {
    p.known(&[PAIRTAB_KEYS])?;
    p.version(2..=2, Some(1))?;
    p.expect_off("pair_exclude_types")?;
    p.expect_off("atom_exclude_types")?;
    let bias = p.key("@variables")?.key("out_bias")?.array(&[1, nt, 1])?;
    ensure!(
        bias.iter().all(|&b| b == 0.0),
        "{}.@variables.out_bias: a pair table's own bias is not supported (DeePMD-kit's \
         training leaves it 0)",
        p.path
    );
    let sel = match p.key("sel")? {
        s if matches!(s.v, Value::Sequence(_)) => s.usizes()?.iter().sum(),
        s => s.usize()?,
    };
    let tab = p.key("tab")?;
    tab.known(&[TAB_KEYS])?;
    tab.expect("@class", &["PairTab"])?;
    tab.version(1..=1, Some(1))?;
    let ntypes = tab.key("ntypes")?.usize()?;
    let nspline = tab.key("nspline")?.usize()?;
    ensure!(
        ntypes == nt,
        "{}.ntypes: {ntypes}, the model's type_map has {nt}",
        tab.path
    );
    let vars = tab.key("@variables")?;
    let ncol = 1 + nt * (nt + 1) / 2;
    let vdata_at = vars.key("vdata")?;
    let nrows = vdata_at.key("value")?.seq()?.len();
    let info = vars.key("tab_info")?.array(&[4])?;
    ensure!(
        info[2] as usize == nspline && info[3] as usize == nt,
        "{}.tab_info: {info:?} disagrees with nspline {nspline} and ntypes {nt}",
        vars.path
    );
    Ok(PairTable {
        rmin: tab.key("rmin")?.f64()?,
        rmax: tab.key("rmax")?.f64()?,
        hh: tab.key("hh")?.f64()?,
        ntypes,
        rcut: p.key("rcut")?.f64()?,
        nspline,
        sel,
        vdata: vdata_at.array(&[nrows, ncol])?,
        tab_info: [info[0], info[1], info[2], info[3]],
        tab_data: vars.key("tab_data")?.array(&[nt * nt * nspline * 4])?,
    })
}

/// The model node of `dp` (a standard model's, its out_bias to be zeroed here) inside the
/// mixed model of `sr` with the combined `out_bias` node.
pub fn write(sr: &ShortRange, mut dp: Value, out_bias: Value, type_map: &[String]) -> Value {
    let nt = type_map.len();
    let zero = ndarray(&[1, nt, 1], &vec![0.0; nt]);
    let one = ndarray(&[1, nt, 1], &vec![1.0; nt]);
    let vars = obj! { "out_bias" => zero.clone(), "out_std" => one.clone() };
    dp["@variables"] = vars.clone();
    let t = &sr.table;
    let none: &[usize] = &[];
    let table = obj! {
        "@class" => "Model", "@version" => 2, "@variables" => vars,
        "atom_exclude_types" => none, "pair_exclude_types" => none, "preset_out_bias" => Value::Null,
        "rcond" => Value::Null, "rcut" => t.rcut, "sel" => t.sel,
        "tab" => obj! {
            "@class" => "PairTab", "@version" => 1,
            "@variables" => obj! {
                "tab_data" => ndarray(&[t.tab_data.len()], &t.tab_data),
                "tab_info" => ndarray(&[4], &t.tab_info),
                "vdata" => ndarray(&[t.vdata.len() / (1 + nt * (nt + 1) / 2), 1 + nt * (nt + 1) / 2], &t.vdata),
            },
            "hh" => t.hh, "nspline" => t.nspline, "ntypes" => nt, "rcut" => t.rcut,
            "rmax" => t.rmax, "rmin" => t.rmin,
        },
        "type" => "pairtab", "type_map" => type_map,
    };
    let mut out = obj! {
        "@class" => "Model",
        "@variables" => obj! { "out_bias" => out_bias, "out_std" => one },
        "atom_exclude_types" => none, "models" => vec![dp, table], "pair_exclude_types" => none,
        "preset_out_bias" => Value::Null, "rcond" => Value::Null, "type_map" => type_map,
    };
    match &sr.mix {
        Mix::Zbl {
            sw_rmin,
            sw_rmax,
            smin_alpha,
        } => {
            out["@version"] = 2.into();
            out["type"] = "zbl".into();
            out["weights"] = "mean".into();
            out["sw_rmin"] = (*sw_rmin).into();
            out["sw_rmax"] = (*sw_rmax).into();
            out["smin_alpha"] = (*smin_alpha).into();
        }
        Mix::Linear { weights } => {
            out["@version"] = 3.into();
            out["type"] = "linear".into();
            out["weights"] = weights_value(weights);
        }
    }
    out
}

/// The `model` section of an input that builds the mixed model around `dp_def` (the DP
/// model's section), for `model_def_script`.
pub fn def_script(sr: &ShortRange, mut dp_def: Value, type_map: &[String]) -> Value {
    match &sr.mix {
        Mix::Zbl {
            sw_rmin,
            sw_rmax,
            smin_alpha,
        } => {
            dp_def["use_srtab"] = sr.tab_file.as_str().into();
            dp_def["sw_rmin"] = (*sw_rmin).into();
            dp_def["sw_rmax"] = (*sw_rmax).into();
            dp_def["smin_alpha"] = (*smin_alpha).into();
            dp_def
        }
        Mix::Linear { weights } => {
            let t = &sr.table;
            obj! {
                "type" => "linear_ener", "type_map" => type_map, "weights" => weights_value(weights),
                "models" => vec![dp_def, obj! {
                    "type" => "pairtab", "tab_file" => sr.tab_file.as_str(), "rcut" => t.rcut,
                    "sel" => t.sel,
                }],
            }
        }
    }
}

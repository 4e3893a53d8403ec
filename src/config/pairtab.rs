//! The input's pair tables (docs/deepmd-spec.md §19.1): `use_srtab` with `smin_alpha`,
//! `sw_rmin`, `sw_rmax` on a standard model, and `"type": "linear_ener"` of one DP model and
//! one `pairtab` (config/linear.rs reads the linear model around them). The table is read from
//! its file here (relative paths against the input's folder, as the systems' are), so a missing
//! or malformed file is named before training.

use std::path::Path;

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{to_f64, to_str, to_usize, wrong_type, Schema, Section};
use super::linear::{member, mixed_only, weights, weights_json};
use super::model::{DescriptorConfig, ModelConfig};
use crate::model::pairtab::{Mix, PairTable, ShortRange};

type Result<T> = std::result::Result<T, ConfigError>;

/// A pair table of the input and how it mixes into the DP model's energy.
#[derive(Debug, Clone, PartialEq)]
pub struct PairConfig {
    /// The table, extended to its rcut (use_srtab: the descriptor's).
    pub table: PairTable,
    pub mix: Mix,
    /// The file as the input names it (for out.json).
    pub tab_file: String,
    /// linear_ener's `sel` of the pairtab; `None` for use_srtab, which reads the descriptor's.
    pub sel: Option<usize>,
    /// use_srtab's `srtab_add_bias` (TensorFlow's; DeePMD-kit's PyTorch and dpw add the bias
    /// to the mixed energy whatever it says), kept for out.json.
    pub srtab_add_bias: bool,
}

impl PairConfig {
    /// The model's pair table for a descriptor of `nnei` neighbours.
    pub fn short_range(&self, nnei: usize) -> ShortRange {
        let mut table = self.table.clone();
        table.sel = self.sel.unwrap_or(nnei);
        ShortRange {
            table,
            mix: self.mix.clone(),
            tab_file: self.tab_file.clone(),
        }
    }

    /// out.json's keys: use_srtab's added to the standard model's section `standard`, or the
    /// linear model around it.
    pub(super) fn to_json(&self, mut standard: Value) -> Value {
        match &self.mix {
            Mix::Zbl {
                sw_rmin,
                sw_rmax,
                smin_alpha,
            } => {
                let o = standard.as_object_mut().expect("an object");
                o.insert("use_srtab".into(), json!(self.tab_file));
                o.insert("smin_alpha".into(), json!(smin_alpha));
                o.insert("sw_rmin".into(), json!(sw_rmin));
                o.insert("sw_rmax".into(), json!(sw_rmax));
                o.insert("srtab_add_bias".into(), json!(self.srtab_add_bias));
                standard
            }
            Mix::Linear { weights } => {
                let o = standard.as_object_mut().expect("an object");
                let type_map = o.get("type_map").cloned();
                let nbatch = o.remove("data_stat_nbatch");
                let protect = o.remove("data_stat_protect");
                json!({
                    "type": "linear_ener",
                    "type_map": type_map,
                    "weights": weights_json(weights),
                    "data_stat_nbatch": nbatch,
                    "data_stat_protect": protect,
                    "models": [standard, {
                        "type": "pairtab",
                        "tab_file": self.tab_file,
                        "rcut": self.table.rcut,
                        "sel": self.sel,
                    }],
                })
            }
        }
    }
}

/// The table of file `name` (as the input gives it, at `path`), read for `rcut`.
fn table(name: &str, path: &str, base_dir: &Path, rcut: f64) -> Result<PairTable> {
    PairTable::from_file(&base_dir.join(name), rcut, 0)
        .map_err(|e| ConfigError::invalid(path, format!("{e:#}")))
}

/// use_srtab of a standard model's section `sec`, whose descriptor has cut-off `rcut`.
pub(super) fn srtab(
    sec: &Section,
    base_dir: &Path,
    descriptor: &DescriptorConfig,
) -> Result<Option<PairConfig>> {
    let Some(v) = sec.get_nonnull("use_srtab") else {
        for key in ["smin_alpha", "sw_rmin", "sw_rmax"] {
            if sec.get_nonnull(key).is_some() {
                return Err(ConfigError::invalid(
                    sec.path_of(key),
                    "is read with use_srtab (a pair table), which is not given",
                ));
            }
        }
        return Ok(None);
    };
    let path = sec.path_of("use_srtab");
    let name = to_str(v, &path)?;
    mixed_only(descriptor, &path)?;
    // DeePMD-kit's PyTorch reads model_params["sw_rmin"]: a KeyError without it.
    let need = |key: &str| -> Result<f64> {
        let v = sec.required(key, "a distance (Å) of the switch between DP and the table")?;
        to_f64(v, &sec.path_of(key))
    };
    let (sw_rmin, sw_rmax) = (need("sw_rmin")?, need("sw_rmax")?);
    if sw_rmax <= sw_rmin {
        return Err(ConfigError::invalid(
            sec.path_of("sw_rmax"),
            format!("{sw_rmax} must exceed sw_rmin {sw_rmin}"),
        ));
    }
    let smin_alpha = sec.f64_or("smin_alpha", 0.1)?;
    if smin_alpha <= 0.0 {
        return Err(ConfigError::invalid(
            sec.path_of("smin_alpha"),
            "must be positive",
        ));
    }
    if smin_alpha != 0.1 {
        tracing::warn!(
            "{}: {smin_alpha}: dpw uses it, as DeePMD-kit's TensorFlow and numpy backends do; \
             DeePMD-kit's PyTorch backend builds the model with 0.1 whatever the input says",
            sec.path_of("smin_alpha")
        );
    }
    Ok(Some(PairConfig {
        table: table(name, &path, base_dir, descriptor.rcut)?,
        mix: Mix::Zbl {
            sw_rmin,
            sw_rmax,
            smin_alpha,
        },
        tab_file: name.to_string(),
        sel: None,
        srtab_add_bias: sec.bool_or("srtab_add_bias", true)?,
    }))
}

static PAIRTAB: Schema = Schema {
    keys: &[&["type", "tab_file", "rcut", "sel"]],
    unsupported: &[],
    ignored: &[],
    deepmd: "model[linear_ener].models",
};

/// A `linear_ener` model (the section `sec`) of `models` that holds a pair table: one DP model
/// and the table, weighted.
pub(super) fn linear(sec: &Section, models: &[Value], base_dir: &Path) -> Result<ModelConfig> {
    let models_path = sec.path_of("models");
    let is_table = |m: &Value| m.get("type").and_then(Value::as_str) == Some("pairtab");
    let tables = models.iter().filter(|m| is_table(m)).count();
    if models.len() != 2 || tables != 1 || !is_table(&models[1]) {
        return Err(ConfigError::unsupported(
            models_path,
            format!(
                "{} models, {tables} of them pair tables: dpw mixes a pair table into one DP \
                 model (\"models\": [a DP model, {{\"type\": \"pairtab\", ...}}]), or sums \
                 DP models without one",
                models.len()
            ),
        ));
    }
    let mut model = member(sec, models, 0, base_dir)?;
    let tab_path = format!("{models_path}[1]");
    let t = Section::new(&models[1], &tab_path, &PAIRTAB)?;
    let name_path = t.path_of("tab_file");
    let name = to_str(t.required("tab_file", "the table's file")?, &name_path)?;
    let rcut = to_f64(
        t.required("rcut", "the table's cut-off (Å)")?,
        &t.path_of("rcut"),
    )?;
    let sel_path = t.path_of("sel");
    let sel = match t.required("sel", "the table's neighbour count")? {
        Value::Array(a) => (a.iter().enumerate())
            .map(|(i, x)| to_usize(x, &format!("{sel_path}[{i}]")))
            .sum::<Result<usize>>()?,
        x @ Value::Number(_) => to_usize(x, &sel_path)?,
        x => return Err(wrong_type(&sel_path, "an integer or a list of integers", x)),
    };
    let weights = weights(sec, 2)?;
    model.short_range = Some(PairConfig {
        table: table(name, &name_path, base_dir, rcut)?,
        mix: Mix::Linear { weights },
        tab_file: name.to_string(),
        sel: Some(sel),
        srtab_add_bias: true,
    });
    Ok(model)
}

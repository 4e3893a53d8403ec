//! The dipole and polar fittings' and the tensor loss's keys in input.json (DeePMD-kit 3.2.0's
//! `fitting_dipole`, `fitting_polar` and `loss_tensor` arguments), with DeePMD-kit's defaults.

use serde_json::{json, Value};

use crate::config::error::ConfigError;
use crate::config::keys::{non_negative, to_f64, to_list, Schema, Section};

use super::head::metric_values;
use super::{Tensor, TensorSpec};
use crate::fitting::traits::LossType;

type Result<T> = std::result::Result<T, ConfigError>;

/// The keys of `fitting_net` with `"type": "dipole"` that `parse_output` reads; the fitting's
/// shared keys are read with `ener`'s.
pub const DIPOLE_KEYS: &[&str] = &["type", "sel_type"];
/// Those of `"type": "polar"`.
pub const POLAR_KEYS: &[&str] = &["type", "sel_type", "fit_diag", "scale", "shift_diag"];

/// What the fitting puts out, before the model's section completes it ([`complete`]).
pub(crate) fn parse_output(sec: &Section, tensor: Tensor) -> Result<TensorSpec> {
    let polar = tensor == Tensor::Polar;
    Ok(TensorSpec {
        embedding_width: 0,
        fit_diag: polar && sec.bool_or("fit_diag", true)?,
        scale: vec![],
        shift_diag: polar && sec.bool_or("shift_diag", true)?,
        exclude_types: vec![],
    })
}

/// A list of type indices below `ntypes`.
pub(crate) fn types(v: &Value, path: &str, ntypes: usize) -> Result<Vec<usize>> {
    let items = to_list(v, path, "a list of type indices")?;
    (items.iter().enumerate())
        .map(|(i, x)| match x.as_u64() {
            Some(t) if (t as usize) < ntypes => Ok(t as usize),
            _ => Err(ConfigError::invalid(
                format!("{path}[{i}]"),
                format!("{x} is not a type index below {ntypes}"),
            )),
        })
        .collect()
}

/// The fitting completed by the model's section (`sec` is the fitting's): the polar's `scale`
/// per type, gr's width M1 (the descriptor's last embedding width), and the types without a
/// tensor: the model's `atom_exclude_types` and those TensorFlow's `sel_type` leaves out.
pub(crate) fn complete(
    spec: &mut TensorSpec,
    sec: &Section,
    ntypes: usize,
    embedding_width: usize,
    atom_exclude_types: &[usize],
) -> Result<()> {
    spec.embedding_width = embedding_width;
    spec.scale = match sec.get_nonnull("scale") {
        None => vec![1.0; ntypes],
        Some(Value::Array(items)) => {
            let p = sec.path_of("scale");
            if items.len() != ntypes {
                return Err(ConfigError::invalid(
                    p,
                    format!("{} values, but type_map has {ntypes} types", items.len()),
                ));
            }
            (items.iter().enumerate())
                .map(|(i, x)| to_f64(x, &format!("{p}[{i}]")))
                .collect::<Result<_>>()?
        }
        Some(v) => vec![to_f64(v, &sec.path_of("scale"))?; ntypes],
    };
    let mut exclude = atom_exclude_types.to_vec();
    if let Some(v) = sec.get_nonnull("sel_type") {
        let sel = types(v, &sec.path_of("sel_type"), ntypes)?;
        exclude.extend((0..ntypes).filter(|t| !sel.contains(t)));
    }
    exclude.sort_unstable();
    exclude.dedup();
    spec.exclude_types = exclude;
    Ok(())
}

/// The fitting's own keys as out.json writes them.
pub fn output_json(tensor: Tensor, s: &TensorSpec) -> Value {
    match tensor {
        Tensor::Dipole => json!({"type": "dipole"}),
        Tensor::Polar => json!({
            "type": "polar",
            "fit_diag": s.fit_diag,
            "scale": s.scale,
            "shift_diag": s.shift_diag,
        }),
    }
}

/// The `loss` section with `"type": "tensor"`: the prefactors of the atomic and the frame term,
/// constant through training.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorLossConfig {
    pub pref_atomic: f64,
    pub pref: f64,
}

static LOSS: Schema = Schema {
    keys: &[&["type", "pref", "pref_atomic"]],
    unsupported: &[&[(
        "enable_atomic_weight",
        "atomic weights (atom_weight.npy) are not implemented",
    )]],
    ignored: &[],
    deepmd: "loss[tensor]",
};

pub fn parse_loss(v: &Value, path: &str) -> Result<TensorLossConfig> {
    let sec = Section::new(v, path, &LOSS)?;
    let pref = |key: &str| -> Result<f64> {
        let v = sec.required(key, "a number ≥ 0 (both pref and pref_atomic are required)")?;
        non_negative(to_f64(v, &sec.path_of(key))?, &sec.path_of(key))
    };
    let (pref, pref_atomic) = (pref("pref")?, pref("pref_atomic")?);
    if pref == 0.0 && pref_atomic == 0.0 {
        return Err(ConfigError::invalid(
            path,
            "pref and pref_atomic are both 0: nothing to train (DeePMD-kit refuses this too)",
        ));
    }
    Ok(TensorLossConfig { pref_atomic, pref })
}

impl TensorLossConfig {
    /// (atomic, frame).
    pub fn prefactors(&self) -> (f64, f64) {
        (self.pref_atomic, self.pref)
    }
}

impl LossType for TensorLossConfig {
    fn type_name(&self) -> &'static str {
        "tensor"
    }

    fn to_json(&self) -> Value {
        json!({"type": "tensor", "pref": self.pref, "pref_atomic": self.pref_atomic})
    }

    fn metric_values(&self, sums: &[f64], _: usize, _: usize) -> Vec<Option<f64>> {
        metric_values(self.prefactors(), sums).to_vec()
    }
}

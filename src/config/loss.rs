//! The `loss` section: `ener`, the backend's, or a loss scored on the host, read by its
//! fitting's folder and found in [`crate::fitting::registry::LOSSES`].

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{join, non_negative, Schema, Section};
use crate::fitting::dos::config::DosLossConfig;
use crate::fitting::property::config::PropertyLossConfig;
use crate::fitting::registry;
use crate::fitting::tensor::config::TensorLossConfig;
use crate::fitting::traits::LossType;

type Result<T> = std::result::Result<T, ConfigError>;

/// Prefactors move from `start_pref_X` to `limit_pref_X` as the lr decays. A term is active only
/// when both are non-zero (DeePMD-kit's rule), see [`EnerLossConfig::has_e`] etc.
#[derive(Debug, Clone, PartialEq)]
pub struct EnerLossConfig {
    pub start_pref_e: f64,
    pub limit_pref_e: f64,
    pub start_pref_f: f64,
    pub limit_pref_f: f64,
    pub start_pref_v: f64,
    pub limit_pref_v: f64,
    /// `Some(c)`: force error divided by `|F| + c` (DeePMD-kit's relative force loss).
    pub relative_f: Option<f64>,
    /// true: energy and virial terms scaled by 1/N² instead of 1/N.
    pub intensive_ener_virial: bool,
}

/// The loss: DeePMD-kit's `loss.type`.
#[derive(Debug, Clone, PartialEq)]
pub enum LossConfig {
    Ener(EnerLossConfig),
    Property(PropertyLossConfig),
    Dos(DosLossConfig),
    /// `tensor`: a dipole's or polarizability's; its tensor is the model's.
    Tensor(TensorLossConfig),
}

/// Where a loss is scored: `ener` on the backend, the others by their fitting's head.
pub enum LossKind<'a> {
    Ener(&'a EnerLossConfig),
    Host(&'a dyn LossType),
}

impl LossConfig {
    /// Where it is scored: the one place that asks which loss it is.
    pub fn kind(&self) -> LossKind<'_> {
        match self {
            LossConfig::Ener(l) => LossKind::Ener(l),
            LossConfig::Property(l) => LossKind::Host(l),
            LossConfig::Dos(l) => LossKind::Host(l),
            LossConfig::Tensor(l) => LossKind::Host(l),
        }
    }

    /// DeePMD-kit's `loss.type`.
    pub fn type_name(&self) -> &'static str {
        match self.kind() {
            LossKind::Ener(_) => "ener",
            LossKind::Host(l) => l.type_name(),
        }
    }

    /// The `ener` loss's settings; `None` for another loss.
    pub fn ener(&self) -> Option<&EnerLossConfig> {
        match self {
            LossConfig::Ener(l) => Some(l),
            _ => None,
        }
    }

    pub(super) fn to_json(&self) -> Value {
        match self.kind() {
            LossKind::Ener(l) => l.to_json(),
            LossKind::Host(l) => l.to_json(),
        }
    }
}

impl EnerLossConfig {
    pub fn has_e(&self) -> bool {
        self.start_pref_e != 0.0 && self.limit_pref_e != 0.0
    }
    pub fn has_f(&self) -> bool {
        self.start_pref_f != 0.0 && self.limit_pref_f != 0.0
    }
    pub fn has_v(&self) -> bool {
        self.start_pref_v != 0.0 && self.limit_pref_v != 0.0
    }
}

const NO_AE: &str = "atomic-energy labels are not trained";
const NO_PF: &str = "atom-prefactor forces are not trained";
const NO_GF: &str = "generalized forces are not trained";

static LOSS: Schema = Schema {
    keys: &[&[
        "start_pref_e",
        "limit_pref_e",
        "start_pref_f",
        "limit_pref_f",
        "start_pref_v",
        "limit_pref_v",
        "relative_f",
        "intensive_ener_virial",
    ]],
    unsupported: &[&[
        ("start_pref_ae", NO_AE),
        ("limit_pref_ae", NO_AE),
        ("start_pref_pf", NO_PF),
        ("limit_pref_pf", NO_PF),
        ("start_pref_gf", NO_GF),
        ("limit_pref_gf", NO_GF),
        ("numb_generalized_coord", NO_GF),
        ("enable_atom_ener_coeff", NO_AE),
        ("loss_func", "the MAE loss is not implemented"),
        ("use_huber", "the Huber loss is not implemented"),
    ]],
    // Only meaningful with use_huber, which must be false.
    ignored: &["huber_delta"],
    deepmd: "loss",
};

pub(super) fn parse(v: Option<&Value>, path: &str) -> Result<LossConfig> {
    // The type first: the keys that follow it are those of the loss it names.
    match (v, v.and_then(|v| v.get("type"))) {
        (Some(v), Some(ty)) if ty.as_str() != Some("ener") => {
            match ty.as_str().and_then(registry::find_loss) {
                Some(parse) => parse(v, path),
                None => Err(ConfigError::unsupported(
                    join(path, "type"),
                    format!(
                        "loss type {ty} is not known; dpw trains the {} losses",
                        registry::loss_names()
                    ),
                )),
            }
        }
        _ => parse_ener(v, path).map(LossConfig::Ener),
    }
}

fn parse_ener(v: Option<&Value>, path: &str) -> Result<EnerLossConfig> {
    let empty = json!({});
    let sec = Section::new(v.unwrap_or(&empty), path, &LOSS)?;
    // Non-negative start and limit values are enough for every prefactor of the run to be
    // non-negative: the learning_rate section refuses any schedule whose lr leaves
    // [0, start_lr], and within it a prefactor stays between its start and limit values.
    let pref = |key: &str, default: f64| -> Result<f64> {
        non_negative(sec.f64_or(key, default)?, &sec.path_of(key))
    };
    let relative_f = sec.opt_f64("relative_f")?;
    if let Some(r) = relative_f {
        non_negative(r, &sec.path_of("relative_f"))?;
    }
    let loss = EnerLossConfig {
        start_pref_e: pref("start_pref_e", 0.02)?,
        limit_pref_e: pref("limit_pref_e", 1.0)?,
        start_pref_f: pref("start_pref_f", 1000.0)?,
        limit_pref_f: pref("limit_pref_f", 1.0)?,
        start_pref_v: pref("start_pref_v", 0.0)?,
        limit_pref_v: pref("limit_pref_v", 0.0)?,
        relative_f,
        intensive_ener_virial: sec.bool_or("intensive_ener_virial", false)?,
    };
    if !(loss.has_e() || loss.has_f() || loss.has_v()) {
        return Err(ConfigError::invalid(
            sec.path().to_string(),
            "no loss term is active: each of energy, force and virial needs both its \
             start_pref and limit_pref non-zero to be trained",
        ));
    }
    Ok(loss)
}

impl EnerLossConfig {
    fn to_json(&self) -> Value {
        json!({
            "start_pref_e": self.start_pref_e,
            "limit_pref_e": self.limit_pref_e,
            "start_pref_f": self.start_pref_f,
            "limit_pref_f": self.limit_pref_f,
            "start_pref_v": self.start_pref_v,
            "limit_pref_v": self.limit_pref_v,
            "relative_f": self.relative_f,
            "intensive_ener_virial": self.intensive_ener_virial,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_type_dpw_lacks_is_refused_naming_those_it_trains() {
        let e = parse(Some(&json!({"type": "ener_spin"})), "loss").unwrap_err();
        assert_eq!(
            e.to_string(),
            "loss.type: loss type \"ener_spin\" is not known; dpw trains the \"ener\", \
             \"property\", \"dos\" and \"tensor\" losses"
        );
        let e = parse(Some(&json!({"type": 1, "start_pref_ae": 1})), "loss").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("loss.type: loss type 1 is not known"),
            "{e}"
        );
    }

    /// Each registered loss is read under its name, and its out.json section reads back as
    /// itself.
    #[test]
    fn each_registered_loss_reads_back_its_own_section() {
        for (name, _) in registry::LOSSES {
            let v = match *name {
                "tensor" => json!({"type": name, "pref": 1.0, "pref_atomic": 0.5}),
                _ => json!({"type": name}),
            };
            let loss = parse(Some(&v), "loss").unwrap();
            assert_eq!(loss.type_name(), *name);
            assert_eq!(
                parse(Some(&loss.to_json()), "loss").unwrap(),
                loss,
                "{name}"
            );
        }
        let ener = parse(Some(&json!({"type": "ener"})), "loss").unwrap();
        assert_eq!(ener.type_name(), "ener");
        assert_eq!(parse(None, "loss").unwrap(), ener);
        assert_eq!(parse(Some(&ener.to_json()), "loss").unwrap(), ener);
    }
}

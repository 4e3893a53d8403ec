//! The fittings dpw builds, found by DeePMD-kit's `fitting_net.type` (its
//! `BaseFitting.register("dos")`): each is a folder whose types implement
//! [`super::traits::FittingType`]; adding one is its folder, a variant of
//! [`super::output::FitOutput`] and a line of [`FITTINGS`]; its loss, where it brings one, a
//! variant of [`LossConfig`] and a line of [`LOSSES`].

use serde_json::Value;

use super::output::Registered;
use super::{dos, ener, property, tensor};
use crate::config::error::ConfigError;
use crate::config::loss::LossConfig;

/// Reads a loss section `v` at `path`.
pub type LossParse = fn(v: &Value, path: &str) -> Result<LossConfig, ConfigError>;

/// Every loss scored on the host, by DeePMD-kit's `loss.type` (`ener`, the default, is the
/// backend's: [`LossConfig::Ener`]).
pub static LOSSES: &[(&str, LossParse)] = &[
    ("property", |v, p| {
        property::config::parse_loss(v, p).map(LossConfig::Property)
    }),
    ("dos", |v, p| {
        dos::config::parse_loss(v, p).map(LossConfig::Dos)
    }),
    ("tensor", |v, p| {
        tensor::config::parse_loss(v, p).map(LossConfig::Tensor)
    }),
];

/// The loss registered as `name`.
pub fn find_loss(name: &str) -> Option<LossParse> {
    LOSSES.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// Every fitting dpw builds, `ener` (the default where `type` is missing) first.
pub static FITTINGS: &[&Registered] = &[
    &ener::REGISTERED,
    &tensor::kind::DIPOLE,
    &tensor::kind::POLAR,
    &dos::kind::REGISTERED,
    &property::kind::REGISTERED,
];

/// The fitting registered as `name`; `ener`'s where `name` is `None`.
pub fn find(name: Option<&str>) -> Option<&'static Registered> {
    match name {
        None => Some(FITTINGS[0]),
        Some(name) => FITTINGS.iter().find(|r| r.names.contains(&name)).copied(),
    }
}

/// The fittings dpw builds, for messages: `"ener", "property", ...`.
pub fn names() -> String {
    listed(FITTINGS.iter().map(|r| r.names[0]))
}

/// The losses dpw trains, for messages: `"ener", "property", ...`.
pub fn loss_names() -> String {
    listed(std::iter::once("ener").chain(LOSSES.iter().map(|(n, _)| *n)))
}

fn listed<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<String> = names.map(|n| format!("{n:?}")).collect();
    match all.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

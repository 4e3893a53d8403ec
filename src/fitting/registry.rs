//! The fittings dpw builds, found by DeePMD-kit's `fitting_net.type` (its
//! `BaseFitting.register("dos")`): each is a folder whose types implement
//! [`super::traits::FittingType`]; adding one is its folder, a variant of
//! [`super::output::FitOutput`] and a line of [`FITTINGS`].

use super::output::Registered;
use super::{dos, ener, property, tensor};

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
    let all: Vec<String> = FITTINGS
        .iter()
        .map(|r| format!("{:?}", r.names[0]))
        .collect();
    match all.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

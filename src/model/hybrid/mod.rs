//! hybrid: a descriptor made of others side by side (DeePMD-kit's `DescrptHybrid`), a composition of
//! their stages. Its input keys are `config/model.rs`'s (`parse_hybrid`); this folder holds its
//! `.yaml`, a list of its parts' own.

pub(crate) mod input;
pub(super) mod yaml;

use super::layout::{Builder, DescriptorLayout};
use super::DescriptorSpec;

/// Its parts' embedding nets, part k's under `d{k}.`.
pub(super) fn layout(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout {
    super::se::embed_layout(d.parts(), nt, b, |k| format!("d{k}."))
}

/// Its list for the log: its parts' lines (its own head would repeat theirs).
pub(super) fn describe(d: &DescriptorSpec, _: String) -> String {
    let parts: Vec<String> = d.parts().iter().map(DescriptorSpec::describe).collect();
    format!("hybrid of [{}]", parts.join("; "))
}

/// Its parts' widths, summed.
pub(super) fn dim(d: &DescriptorSpec) -> usize {
    d.parts().iter().map(DescriptorSpec::dim).sum()
}

//! The se family: se_e2_a, se_e2_r and se_e3, DeePMD-kit's descriptors of one embedding net
//! per type (or type pair) over one env_mat whose neighbours come in one section per type
//! (docs/deepmd-spec.md §2–§4). Its input keys are `config/model.rs`'s shared ones; this folder
//! holds its `.yaml`.

pub(crate) mod input;
pub(super) mod yaml;

use super::{DescriptorSpec, DescriptorType};

/// Its keys for the log: se_e3 has neither axis_neuron nor type_one_side.
pub(super) fn describe(d: &DescriptorSpec, head: String) -> String {
    match d.kind {
        DescriptorType::SeE2A => format!(
            "{head} axis {} type_one_side {}",
            d.axis_neuron, d.type_one_side
        ),
        DescriptorType::SeE2R => format!("{head} type_one_side {}", d.type_one_side),
        _ => head,
    }
}

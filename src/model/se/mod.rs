//! The se family: se_e2_a, se_e2_r and se_e3, DeePMD-kit's descriptors of one embedding net
//! per type (or type pair) over one env_mat whose neighbours come in one section per type
//! (docs/deepmd-spec.md §2–§4). Its input keys are `config/model.rs`'s shared ones; this folder
//! holds its `.yaml`.

pub(crate) mod input;
pub(super) mod yaml;

use super::layout::{Builder, DescriptorLayout, OwnNets};
use super::{pair_types, Activation, DescriptorSpec, DescriptorType};

/// Its embedding nets: one per type pair (se_e3), per neighbour type (`type_one_side`), or per
/// (centre, neighbour) type.
pub(super) fn layout(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout {
    embed_layout(std::slice::from_ref(d), nt, b, |_| String::new())
}

/// The embedding nets of se descriptors `parts` one after the other, part k's names after
/// `prefix(k)`.
pub(super) fn embed_layout(
    parts: &[DescriptorSpec],
    nt: usize,
    b: &mut Builder,
    prefix: impl Fn(usize) -> String,
) -> DescriptorLayout {
    let mut embed = Vec::new();
    let mut ranges = Vec::new();
    for (k, d) in parts.iter().enumerate() {
        let prefix = prefix(k);
        let names: Vec<String> = if d.kind == DescriptorType::SeE3 {
            (pair_types(nt).iter())
                .map(|(ti, tj)| format!("embed.t{ti}_t{tj}"))
                .collect()
        } else if d.type_one_side {
            (0..nt).map(|k| format!("embed.t{k}")).collect()
        } else {
            (0..nt * nt)
                .map(|k| format!("embed.c{}_n{}", k % nt, k / nt))
                .collect()
        };
        let start = embed.len();
        embed.extend((names.into_iter()).map(|name| {
            b.net(
                format!("{prefix}{name}"),
                1,
                &d.neuron,
                (d.resnet_dt, Activation::Tanh),
                None,
            )
        }));
        ranges.push(start..embed.len());
    }
    DescriptorLayout {
        embed,
        parts: ranges,
        own: OwnNets::Embed,
        frozen: vec![],
    }
}

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

/// M1·axis_neuron.
pub(super) fn dim(d: &DescriptorSpec) -> usize {
    d.m1() * d.axis_neuron
}

//! A batch's workspace checked against the memory the backend has before any of it is
//! allocated: under overcommit the allocation would succeed and the process be killed when the
//! memory is touched. Step and training start-up both ask it; it takes nothing from them.

use anyhow::{Context, Result};

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;
use crate::model::ModelSpec;
use crate::stage::DeviceModel;

use super::dataset::DataSet;

/// The workspace of a batch of shape `dims`, as its messages name it.
pub fn batch_what(dims: &Dims) -> String {
    format!(
        "the workspace of a batch of {} frame{} of {} atoms ({} neighbour slots)",
        dims.nframes,
        if dims.nframes == 1 { "" } else { "s" },
        dims.natoms,
        dims.nslots()
    )
}

/// What lowers the workspace of a batch of shape `dims`.
pub fn batch_knob(dims: &Dims) -> String {
    if dims.nframes > 1 {
        "a smaller batch_size (training_data, validation_data) lowers it".into()
    } else {
        "one frame is the smallest batch: a smaller descriptor sel or neuron lowers it".into()
    }
}

/// The least the workspace of a batch of shape `dims` takes, in bytes, and its largest array:
/// the embedding nets' values over one row per neighbour slot, or for se_e3 per pair of a
/// centre's slots (Σ_{i≤j} sel_i·sel_j: they grow as sel²), and with them the se_e3 pair rows
/// per frame. Every layer's values, tangents and adjoints where the nets run layer by layer;
/// G and G' alone where the backend fuses them. The rest of the workspace is smaller.
struct Need {
    bytes: u128,
    largest: u128,
    pairs_per_frame: u128,
}

fn need<T: Real, B: Backend<T>>(b: &B, m: &DeviceModel<T, B>, dims: &Dims) -> Need {
    let parts: Vec<_> = match m.parts.is_empty() {
        true => vec![(m.desc.kind, &dims.sel[..], &m.desc.layout)],
        false => (m.parts.iter())
            .map(|p| (p.state.kind, &p.sel[..], &p.state.layout))
            .collect(),
    };
    let (natoms, nframes) = (dims.natoms as u128, dims.nframes as u128);
    let (mut values, mut largest, mut pairs_per_frame) = (0u128, 0u128, 0u128);
    for (kind, sel, layout) in parts {
        let Some(net) = layout.embed.first() else {
            continue;
        };
        let sel: Vec<u128> = sel.iter().map(|&s| s as u128).collect();
        // Per row: `NetCache`'s values, tangents and adjoints of every layer, and its widest.
        let layered = || {
            let per_row = (net.layers.iter())
                .map(|l| 4 * l.nout as u128 + 2 * l.nin as u128)
                .sum();
            let widest = (net.layers.iter()).map(|l| l.nout.max(l.nin) as u128).max();
            (per_row, widest.unwrap_or(0))
        };
        let slots = sel.iter().sum();
        let (rows_per_atom, (per_row, widest)) = match kind.registered().embeds_pairs {
            true => {
                let pairs: u128 = (0..sel.len())
                    .map(|i| sel[i] * sel[i..].iter().sum::<u128>())
                    .sum();
                pairs_per_frame += natoms * pairs;
                (pairs, layered())
            }
            _ if b.fused_embedding().is_some() => {
                let m1 = net.layers.last().map_or(0, |l| l.nout as u128);
                (slots, (2 * m1, m1))
            }
            _ => (slots, layered()),
        };
        let rows = nframes * natoms * rows_per_atom;
        values += rows * per_row;
        largest = largest.max(rows * widest);
    }
    let size = size_of::<T>() as u128;
    Need {
        bytes: values * size,
        largest: largest * size,
        pairs_per_frame,
    }
}

/// Refuses, before anything of it is allocated, a workspace of shape `dims` that cannot fit
/// the memory the backend has ([`crate::backend::Device::memory_limits`]): under overcommit
/// the allocation would succeed and the process be killed when the memory is touched.
pub fn check_workspace<T: Real, B: Backend<T>>(
    b: &B,
    m: &DeviceModel<T, B>,
    dims: &Dims,
) -> Result<(), OutOfMemory> {
    let need = need(b, m, dims);
    let limits = b.memory_limits();
    let refuse = |bytes: u128, what: String, limit: String| {
        let sel2 = match need.pairs_per_frame {
            0 => String::new(),
            p => format!(
                "; se_e3 embeds every pair of a centre's neighbour slots, {p} per frame here, \
                 which grow as sel²"
            ),
        };
        Err(OutOfMemory {
            what,
            bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
            limit: format!("{limit}{sel2}"),
            knob: batch_knob(dims),
        })
    };
    if let Some((max, name)) = limits.largest {
        if need.largest > u128::from(max) {
            let what = format!("{}, its largest array", batch_what(dims));
            return refuse(need.largest, what, format!("over {name}"));
        }
    }
    if let Some((avail, name)) = limits.available {
        if need.bytes > u128::from(avail) {
            let limit = format!(
                "more than the {:.1} MiB of {name}",
                avail as f64 / (1u64 << 20) as f64
            );
            return refuse(need.bytes, format!("{}, at least", batch_what(dims)), limit);
        }
    }
    Ok(())
}

/// Refuses at start-up a system whose batch (of its batch size) the device cannot hold
/// ([`check_workspace`]), instead of failing, or being killed, when it is first drawn.
pub fn check_batches<T: Real, B: Backend<T>>(
    b: &B,
    m: &DeviceModel<T, B>,
    spec: &ModelSpec,
    data: &DataSet,
    what: &str,
) -> Result<()> {
    for (sys, &bs) in data.systems.iter().zip(&data.batch_sizes) {
        let atype = &sys.compositions[0].atype;
        let counts: Vec<usize> = (0..spec.ntypes())
            .map(|t| atype.iter().filter(|&&x| x == t).count())
            .collect();
        check_workspace(b, m, &Dims::of_descriptor(&spec.descriptor, bs, &counts))
            .with_context(|| format!("{what} system {}", sys.path.display()))?;
    }
    Ok(())
}

//! Workspaces by batch shape, and the forward + gradient of one training batch on them: the
//! part of a training step shared by `dpw train` and the web page.

use anyhow::{Context, Result};

use crate::backend::{AdamStep, Backend, Dims, Prefactors, Real};
use crate::config::OptimizerConfig;
use crate::mem::OutOfMemory;
use crate::model::{DescriptorType, ModelSpec};

use super::batch::HostBatch;
use super::dataset::DataSet;
use super::resident::ResidentSystem;
use super::step::{forward, gradient, DeviceModel, Workspace};

/// Systems of the same composition and batch size share one workspace (it holds nothing of a
/// batch that [`Workspace::load`] does not overwrite), and so do training and validation.
/// Most recently used last.
pub type Cache<T, B> = Vec<Workspace<T, B>>;

/// Workspaces kept: more than the shapes of a few systems, and bounded, since a data set of
/// thousands of compositions would otherwise keep one per composition drawn (1.7 GB after 23
/// steps on 1,000 generated systems).
const MAX_CACHED: usize = 4;

pub fn workspace<'a, T: Real, B: Backend<T>>(
    cache: &'a mut Cache<T, B>,
    b: &B,
    dm: &DeviceModel<T, B>,
    batch: &HostBatch,
) -> Result<&'a mut Workspace<T, B>> {
    workspace_for(cache, b, dm, &batch.dims)
}

/// The workspace of batch shape `dims`, made on first use; the least recently used one is
/// dropped when [`MAX_CACHED`] are kept.
pub fn workspace_for<'a, T: Real, B: Backend<T>>(
    cache: &'a mut Cache<T, B>,
    b: &B,
    dm: &DeviceModel<T, B>,
    dims: &Dims,
) -> Result<&'a mut Workspace<T, B>> {
    let w = match cache.iter().position(|w| w.dims == *dims) {
        Some(i) => cache.remove(i),
        None => {
            if cache.len() >= MAX_CACHED {
                cache.remove(0);
            }
            Workspace::new(b, dm, dims)?
        }
    };
    cache.push(w);
    Ok(cache.last_mut().expect("just pushed"))
}

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
        let (rows_per_atom, (per_row, widest)) = match kind {
            DescriptorType::SeE3 => {
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

/// Loads `batch` and runs the forward pass: predictions are left in the returned workspace.
pub fn predict_batch<'a, T: Real, B: Backend<T>>(
    b: &B,
    dm: &DeviceModel<T, B>,
    cache: &'a mut Cache<T, B>,
    batch: &HostBatch,
) -> Result<&'a mut Workspace<T, B>> {
    let w = workspace(cache, b, dm, batch)?;
    w.load(b, batch);
    forward(b, dm, w);
    Ok(w)
}

/// Forward and gradient of one training batch: the gradient is left in `dm.grad`, the loss
/// sums on the device in the returned workspace ([`Workspace::sums`]).
pub fn batch_gradient<'a, T: Real, B: Backend<T>>(
    b: &B,
    dm: &mut DeviceModel<T, B>,
    cache: &'a mut Cache<T, B>,
    batch: &HostBatch,
    pref: Prefactors,
) -> Result<&'a mut Workspace<T, B>> {
    let w = workspace(cache, b, dm, batch)?;
    w.load(b, batch);
    forward_gradient(b, dm, w, pref);
    Ok(w)
}

/// [`batch_gradient`] of the batch of `frames` of a system whose frames are on the device: the
/// batch is gathered there, nothing of it is written from the host.
pub fn resident_gradient<'a, T: Real, B: Backend<T>>(
    b: &B,
    dm: &mut DeviceModel<T, B>,
    cache: &'a mut Cache<T, B>,
    rs: &ResidentSystem<T, B>,
    frames: &[usize],
    pref: Prefactors,
) -> Result<&'a mut Workspace<T, B>> {
    let w = workspace_for(cache, b, dm, &rs.dims(frames.len()))?;
    rs.load(b, w, frames);
    forward_gradient(b, dm, w, pref);
    Ok(w)
}

/// Forward and gradient of the batch loaded in `w`: the part of a step that repeats itself,
/// which the backend may replay ([`Device::replayable`]).
fn forward_gradient<T: Real, B: Backend<T>>(
    b: &B,
    dm: &mut DeviceModel<T, B>,
    w: &mut Workspace<T, B>,
    pref: Prefactors,
) {
    b.replayable(&mut || {
        forward(b, dm, w);
        gradient(b, dm, w, pref);
    });
}

/// The Adam update of (0-based) step `step` at learning rate `lr`.
pub fn adam_step(opt: &OptimizerConfig, lr: f64, step: usize) -> AdamStep {
    AdamStep {
        lr,
        beta1: opt.adam_beta1,
        beta2: opt.adam_beta2,
        eps: OptimizerConfig::EPS,
        t: step as u64 + 1,
    }
}

//! Workspaces by batch shape, and the forward + gradient of one training batch on them: the
//! part of a training step shared by `dpw train` and the web page.

use anyhow::Result;

use crate::backend::{AdamStep, Backend, Dims, Real};
use crate::config::OptimizerConfig;

use super::batch::HostBatch;
use super::resident::ResidentSystem;
use super::step::{forward, gradient, DeviceModel, StepLoss, Workspace};

/// Systems of the same composition and batch size share one workspace (it holds nothing of a
/// batch that [`Workspace::load`] does not overwrite), and so do training and validation.
/// Most recently used last.
pub type Cache<T, B> = Vec<Workspace<T, B>>;

/// Workspaces kept: more than the shapes of a few systems, and bounded, since a data set of
/// thousands of compositions would otherwise keep one per composition drawn (1.7 GB after 23
/// steps on 1,000 generated systems).
const MAX_CACHED: usize = 4;

/// The workspace of `batch`'s shape (a linear model's: its DP models' shapes).
pub fn workspace<'a, T: Real, B: Backend<T>>(
    cache: &'a mut Cache<T, B>,
    b: &B,
    dm: &DeviceModel<T, B>,
    batch: &HostBatch,
) -> Result<&'a mut Workspace<T, B>> {
    cached(
        cache,
        b,
        |w| w.fits(batch),
        || Workspace::for_batch(b, dm, batch),
    )
}

/// The workspace of batch shape `dims` (of a model of one DP model).
pub fn workspace_for<'a, T: Real, B: Backend<T>>(
    cache: &'a mut Cache<T, B>,
    b: &B,
    dm: &DeviceModel<T, B>,
    dims: &Dims,
) -> Result<&'a mut Workspace<T, B>> {
    cached(
        cache,
        b,
        |w| w.dims == *dims,
        || Workspace::new(b, dm, dims),
    )
}

/// The cached workspace that `fits`, or one made on first use; the least recently used one is
/// dropped when `MAX_CACHED` are kept.
fn cached<'a, T: Real, B: Backend<T>>(
    cache: &'a mut Cache<T, B>,
    b: &B,
    fits: impl Fn(&Workspace<T, B>) -> bool,
    make: impl FnOnce() -> Result<Workspace<T, B>>,
) -> Result<&'a mut Workspace<T, B>> {
    let w = match cache.iter().position(fits) {
        Some(i) => cache.remove(i),
        None => {
            if cache.len() >= MAX_CACHED {
                let old = cache.remove(0);
                b.forget_shape(&old.dims);
            }
            make()?
        }
    };
    cache.push(w);
    Ok(cache.last_mut().expect("just pushed"))
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
pub fn batch_gradient<'a, 'l, T: Real, B: Backend<T>>(
    b: &B,
    dm: &mut DeviceModel<T, B>,
    cache: &'a mut Cache<T, B>,
    batch: &HostBatch,
    loss: impl Into<StepLoss<'l>>,
) -> Result<&'a mut Workspace<T, B>> {
    let w = workspace(cache, b, dm, batch)?;
    w.load(b, batch);
    forward_gradient(b, dm, w, loss.into());
    Ok(w)
}

/// [`batch_gradient`] of the batch of `frames` of a system whose frames are on the device: the
/// batch is gathered there, nothing of it is written from the host.
pub fn resident_gradient<'a, 'l, T: Real, B: Backend<T>>(
    b: &B,
    dm: &mut DeviceModel<T, B>,
    cache: &'a mut Cache<T, B>,
    rs: &ResidentSystem<T, B>,
    frames: &[usize],
    loss: impl Into<StepLoss<'l>>,
) -> Result<&'a mut Workspace<T, B>> {
    let w = workspace_for(cache, b, dm, &rs.dims(frames))?;
    rs.load(b, w, frames);
    forward_gradient(b, dm, w, loss.into());
    Ok(w)
}

/// Forward and gradient of the batch loaded in `w`: the part of a step that repeats itself,
/// which the backend may replay ([`Device::replayable`]).
fn forward_gradient<T: Real, B: Backend<T>>(
    b: &B,
    dm: &mut DeviceModel<T, B>,
    w: &mut Workspace<T, B>,
    loss: StepLoss,
) {
    if dm.head.is_some() || !dm.more.is_empty() {
        // Its loss (or a linear model's sum) runs on the host between the passes: nothing to
        // replay.
        forward(b, dm, w);
        gradient(b, dm, w, loss);
        return;
    }
    b.replayable(&mut || {
        forward(b, dm, w);
        gradient(b, dm, w, loss);
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
        tail: None,
        decay: opt.decay(),
    }
}

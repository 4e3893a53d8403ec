//! Validation metrics as `dp train` prints them: the atom-weighted average over `numb_btch`
//! batches (docs/deepmd-spec.md §9).

use anyhow::Result;

use crate::data::Sampler;
use crate::model::ModelSpec;

use super::batch::{assemble_draw, HostBatch};
use super::dataset::DataSet;
use super::lcurve::Metrics;
use super::loss::{host_sums, Loss};
use crate::fitting::head::HeadInputs;
use crate::fitting::Centres;
use crate::stage::HostHead;

/// Offset of the validation sampler's seed from the training one.
pub const VALID_STREAM: u64 = 0x5641_4c49_4400;

/// The next validation batch.
pub fn next_batch(spec: &ModelSpec, data: &DataSet, sampler: &mut Sampler) -> Result<HostBatch> {
    let (draw, _) = sampler.draw((0, 1));
    let batch = assemble_draw(spec, &data.store, &draw, &[], "validation")?;
    Ok(batch.expect("a batch has frames"))
}

/// A validation batch's predictions (f64).
pub enum Predicted<'a> {
    /// Energy, force, virial.
    Ener(&'a [f64], &'a [f64], &'a [f64]),
    /// What a host head reads of the forward pass, with the head and where the centres are.
    Head(HeadInputs, &'a HostHead, Centres<'a>),
}

/// The running atom-weighted average.
pub struct Average {
    sum: Metrics,
    natoms: usize,
}

impl Average {
    pub fn new(loss: &Loss) -> Self {
        Average {
            sum: loss.zero_metrics(),
            natoms: 0,
        }
    }

    /// Adds one batch's predictions against its labels.
    pub fn add(&mut self, loss: &Loss, pref_lr: f64, batch: &HostBatch, pred: Predicted) {
        let natoms = batch.dims.natoms;
        let pf = loss.prefactors(pref_lr, natoms, batch.has_virial);
        let sums: Vec<f64> = match pred {
            Predicted::Ener(e, f, v) => host_sums(
                (e, f, v),
                (
                    &batch.energy,
                    &batch.force,
                    batch.has_virial.then_some(batch.virial.as_slice()),
                ),
            )
            .to_vec(),
            Predicted::Head(x, head, c) => {
                head.loss(loss.step_loss(&pf), &c, &x, &batch.head_labels)
                    .sums
            }
        };
        let m = loss.metrics(&sums, batch.dims.nframes, natoms, &pf);
        self.sum.add_scaled(&m, natoms as f64);
        self.natoms += natoms;
    }

    pub fn finish(&self) -> Metrics {
        self.sum.scaled(1.0 / self.natoms as f64)
    }
}

//! The training loop of the page: `dpw train`'s step (sampling, batch, forward, gradient, Adam)
//! and its lcurve.out metrics, run a display interval at a time and awaited, on one backend.

use anyhow::{bail, Result};
use dpw::backend::{LossSums, Real};
use dpw::config::{OptimizerConfig, Precision};
use dpw::data::Sampler;
use dpw::model::ModelSpec;
use dpw::train::batch::{assemble_frames, HostBatch};
use dpw::train::dataset::DataSet;
use dpw::train::lcurve::Metrics;
use dpw::train::loss::Loss;
use dpw::train::lr::LrSchedule;
use dpw::train::step::DeviceModel;
use dpw::train::trainer::TrainSetup;
use dpw::train::validation::{self, VALID_STREAM};
use dpw::train::workspaces::{adam_step, batch_gradient, predict_batch, workspace, Cache};
use serde_json::{json, Value};

use crate::fetch::Fetch;
use crate::platform::yield_to_page;

pub struct Session<B: Fetch> {
    b: B,
    dm: DeviceModel<f32, B>,
    spec: ModelSpec,
    train: DataSet,
    valid: Option<DataSet>,
    sampler: Sampler,
    valid_sampler: Option<Sampler>,
    valid_batches: usize,
    cache: Cache<f32, B>,
    loss: Loss,
    schedule: LrSchedule,
    opt: OptimizerConfig,
    numb_steps: usize,
    disp_freq: usize,
    step: usize,
    /// A device error reported out of band (WebGPU validation, device loss).
    device_error: Box<dyn Fn() -> Option<String>>,
}

/// A buffer's values, failing with the first error the device reported meanwhile.
async fn fetch<B: Fetch>(
    b: &B,
    device_error: &dyn Fn() -> Option<String>,
    buf: &B::Buf,
) -> Result<Vec<f32>> {
    let v = b.fetch(buf).await;
    if let Some(e) = device_error() {
        bail!("the GPU reported an error: {e}");
    }
    v
}

fn metrics_json(m: &Metrics) -> Value {
    m.entries()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

impl<B: Fetch> Session<B> {
    /// A fresh run from `setup` (see `dpw::train::trainer::prepare_in`), as `dpw train` would
    /// start it with the same input.
    pub fn new(
        b: B,
        setup: TrainSetup,
        device_error: Box<dyn Fn() -> Option<String>>,
    ) -> Result<Self> {
        if setup.precision != Precision::F32 {
            bail!(
                "the page trains in float32 (WebGPU has no 64-bit floats): set \"precision\": \"float32\" in the descriptor and fitting_net"
            );
        }
        let tc = &setup.config.training;
        if tc.gradient_max_norm > 0.0 || tc.disp_avg {
            bail!("training.gradient_max_norm and training.disp_avg are not supported in the page");
        }
        let dm = DeviceModel::new(&b, &setup.model);
        Ok(Session {
            dm,
            spec: setup.model.spec.clone(),
            sampler: setup.train.sampler(setup.seed),
            valid_sampler: setup
                .valid
                .as_ref()
                .map(|v| v.sampler(setup.seed ^ VALID_STREAM)),
            valid_batches: tc.validation_data.as_ref().map_or(1, |v| v.numb_btch),
            numb_steps: tc.numb_steps,
            disp_freq: tc.disp_freq,
            loss: Loss::new(&setup.config.loss, setup.schedule.start_lr),
            opt: setup.config.optimizer.clone(),
            schedule: setup.schedule,
            train: setup.train,
            valid: setup.valid,
            cache: Vec::new(),
            step: 0,
            b,
            device_error,
        })
    }

    pub fn step(&self) -> usize {
        self.step
    }

    pub fn natoms(&self) -> usize {
        self.train.systems[0].natoms
    }

    pub fn nparams(&self) -> usize {
        self.dm.layout.len
    }

    pub fn numb_steps(&self) -> usize {
        self.numb_steps
    }

    pub fn disp_freq(&self) -> usize {
        self.disp_freq
    }

    fn next_train_batch(&mut self) -> Result<(usize, HostBatch)> {
        let (s, frames) = self.sampler.next_batch();
        let batch = self.train.assemble(&self.spec, s, &frames, "training")?;
        Ok((s, batch))
    }

    /// Trains up to the next step that `dp train` would print (step 1, then every disp_freq
    /// steps, and the last) and returns that lcurve.out line as JSON: step, lr, trn and val
    /// metrics, and whether the run is done.
    pub async fn train_to_display(&mut self) -> Result<Value> {
        if self.step >= self.numb_steps {
            bail!("training is finished ({} steps)", self.numb_steps);
        }
        loop {
            let step = self.step;
            let lr = self.schedule.value(step);
            let pref_lr = self.schedule.pref_lr(step);
            let (s, batch) = self.next_train_batch()?;
            let sys = &self.train.systems[s];
            let pf = self.loss.prefactors(pref_lr, sys.natoms, sys.has_virial);
            batch_gradient(&self.b, &mut self.dm, &mut self.cache, &batch, pf.op);
            let dm = &mut self.dm;
            self.b.adam(
                adam_step(&self.opt, lr, step),
                &mut dm.params,
                &dm.grad,
                &mut dm.m,
                &mut dm.v,
            );
            self.step += 1;
            let done = self.step;
            if done == 1 || done % self.disp_freq == 0 || done == self.numb_steps {
                let w = workspace(&mut self.cache, &self.b, &self.dm, &batch);
                let sums = fetch(&self.b, &*self.device_error, w.sums()).await?;
                let sums = LossSums::from_values(&sums);
                let trn = self
                    .loss
                    .metrics(&sums, batch.dims.nframes, sys.natoms, &pf);
                if !trn.rmse.is_finite() {
                    bail!("the loss is {} at step {done}: training diverged", trn.rmse);
                }
                let val = self.validate(pref_lr).await?;
                return Ok(json!({
                    "step": done,
                    "lr": lr,
                    "trn": metrics_json(&trn),
                    "val": val.as_ref().map(metrics_json),
                    "done": done == self.numb_steps,
                }));
            }
            if B::ON_PAGE_THREAD {
                yield_to_page().await;
            }
        }
    }

    /// `dp train`'s validation line: the atom-weighted average over numb_btch batches.
    async fn validate(&mut self, pref_lr: f64) -> Result<Option<Metrics>> {
        let (Some(data), Some(sampler)) = (&self.valid, self.valid_sampler.as_mut()) else {
            return Ok(None);
        };
        let mut avg = validation::Average::new(&self.loss);
        for _ in 0..self.valid_batches {
            let (_, batch) = validation::next_batch(&self.spec, data, sampler)?;
            let w = predict_batch(&self.b, &self.dm, &mut self.cache, &batch);
            let mut pred = Vec::new();
            for buf in [&w.energy, &w.force, &w.virial] {
                let v = fetch(&self.b, &*self.device_error, buf).await?;
                pred.push(v.iter().map(|x| x.f64()).collect::<Vec<f64>>());
            }
            avg.add(&self.loss, pref_lr, &batch, (&pred[0], &pred[1], &pred[2]));
        }
        Ok(Some(avg.finish()))
    }

    /// The first validation frame (or training frame without validation data) with its
    /// reference forces and the model's, atoms sorted by type.
    pub async fn frame(&mut self) -> Result<Value> {
        let sys = match &self.valid {
            Some(v) => v.system(0)?,
            None => self.train.system(0)?,
        };
        let batch = assemble_frames(&self.spec, &sys, &[0], "display")?;
        let w = predict_batch(&self.b, &self.dm, &mut self.cache, &batch);
        let force = fetch(&self.b, &*self.device_error, &w.force).await?;
        Ok(json!({
            "type_map": self.spec.type_map,
            "types": sys.atype,
            "box": sys.frame_cell(0),
            "coord": sys.frame_coord(0),
            "force_ref": sys.frame_force(0),
            "force_pred": force,
        }))
    }
}

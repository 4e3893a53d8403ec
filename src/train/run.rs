//! The training loop's body, one step at a time: the step itself (batch, forward, gradient,
//! clipping, Adam), the read-backs of display steps (the [`StepLog`] drain, the NaN check, the
//! disp_avg average), validation and the lcurve.out line, and when to checkpoint. `dpw train`
//! and the web page both drive a [`Run`]; what only one of them does (files, signals, MPI, the
//! page's awaited read-backs) comes in through a [`Driver`] and through what the caller does with
//! a step's [`StepPlan`] and [`Shown`] line.
//!
//! A step is two calls: [`Run::step`] queues the device work and reads nothing back;
//! [`Run::finish`] reads what the step asks to be read (at display steps, checkpoints, or when
//! the log is full). `finish` is async so that the page awaits its read-backs; `dpw train`
//! reads blocking and drives it with [`block_on`].

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::backend::{AdamTail, Backend, Real};
use crate::config::{Config, OptimizerConfig};
use crate::data::{Draw, Sampler, SystemInfo, SystemStore};
use crate::fitting::head::HeadInputs;
use crate::model::{Model, ModelSpec};

use super::batch::{assemble_draw, HostBatch};
use super::dataset::DataSet;
use super::lcurve::{self, Metrics};
use super::loss::Loss;
use super::lr::LrSchedule;
use super::resident::{self, Resident};
use super::setup::TrainSetup;
use super::step::{DeviceModel, Workspace};
use super::steplog::{check_grad_norm, LoggedStep, StepInfo, StepLog};
use super::validation::{self, Average, Predicted, VALID_STREAM};
use super::workspaces::{adam_step, batch_gradient, predict_batch, resident_gradient, Cache};

/// A rank's part of one step: its frames (none at the end of an epoch when the global batch is
/// short), assembled unless their system is resident on the device, and the number of frames
/// in the global batch.
pub struct StepBatch {
    pub draw: Draw,
    pub batch: Option<HostBatch>,
    pub nglobal: usize,
}

/// Where a run's training batches come from.
pub trait Batches {
    fn next(&mut self) -> Result<StepBatch>;
    /// The sampler state from which the next batch handed out is drawn (for checkpoints).
    fn state(&self) -> Sampler;
}

/// Batches drawn and assembled on the calling thread, one process, no data parallelism (the
/// page, which has no threads).
pub struct InPlace {
    store: Arc<SystemStore>,
    spec: ModelSpec,
    sampler: Sampler,
    /// Per system: whether its frames are on the device (not assembled here).
    resident: Vec<bool>,
}

impl InPlace {
    pub fn new(data: &DataSet, spec: ModelSpec, sampler: Sampler, resident: Vec<bool>) -> Self {
        InPlace {
            store: Arc::clone(&data.store),
            spec,
            sampler,
            resident,
        }
    }
}

impl Batches for InPlace {
    fn next(&mut self) -> Result<StepBatch> {
        let (draw, nglobal) = self.sampler.draw((0, 1));
        let batch = assemble_draw(&self.spec, &self.store, &draw, &self.resident, "training")?;
        Ok(StepBatch {
            draw,
            batch,
            nglobal,
        })
    }

    fn state(&self) -> Sampler {
        self.sampler.clone()
    }
}

/// What differs between the places a run is driven from.
// The futures are driven on one thread (the page's, or blocked on by `dpw train`): no Send bound.
#[allow(async_fn_in_trait)]
pub trait Driver<T: Real, B: Backend<T>> {
    /// A buffer's values: read blocking by `dpw train`, awaited by the page.
    async fn read(&mut self, b: &B, buf: &B::Buf) -> Result<Vec<T>>;

    /// Between the gradient and the update: the data-parallel all-reduce of the gradient and
    /// the loss sums, this rank's mean weighted by `share` (its part of the global batch).
    fn all_reduce(&mut self, _b: &B, _grad: &mut B::Buf, _sums: &mut B::Buf, _share: f64) {}

    /// Whether to stop after the step just run (Ctrl-C): it is checkpointed.
    fn stop_requested(&mut self) -> bool {
        false
    }

    /// Every step, after its read-backs and before its display: checks across ranks (`done`:
    /// the steps done).
    fn check(&mut self, _b: &B, _dm: &DeviceModel<T, B>, _done: usize) -> Result<()> {
        Ok(())
    }
}

/// Runs a future whose awaits never wait (a [`Driver`] that reads blocking) to its end.
///
/// # Panics
/// If the future does wait: an async driver must be awaited instead.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("block_on: a blocking driver's future waited"),
    }
}

/// What a step asks of its caller.
#[derive(Clone, Copy, Debug)]
pub struct StepPlan {
    /// Steps done (1-based number of the step just run).
    pub done: usize,
    /// The learning rate it applied.
    pub lr: f64,
    /// Whether it prints an lcurve.out line.
    pub display: bool,
    /// Whether to save a checkpoint at it.
    pub checkpoint: bool,
    /// Whether the run stops after it (a stop was requested before the last step).
    pub stop: bool,
    /// Whether it is the last step of the run.
    pub last: bool,
    read: bool,
}

/// A displayed step: its lcurve.out line.
#[derive(Clone, Debug)]
pub struct Shown {
    pub step: usize,
    pub lr: f64,
    /// The training metrics shown (the disp_avg average when asked for).
    pub trn: Metrics,
    pub val: Option<Metrics>,
    /// The lcurve.out text: the header before the first line, then the line.
    pub lcurve: String,
}

/// Validation data with its batch stream.
pub struct Validation {
    pub data: DataSet,
    pub sampler: Sampler,
    /// Batches per validation (`numb_btch`).
    pub nbatches: usize,
}

/// Where a run starts: fresh (step 0), or a checkpoint's state.
pub struct Resume<T> {
    pub step: usize,
    /// Adam's first and second moments.
    pub adam: Option<(Vec<T>, Vec<T>)>,
    /// The disp_avg accumulator: [count, then the metrics' running sums ([`Metrics::slots`])].
    pub disp_acc: Vec<f64>,
}

impl<T> Resume<T> {
    pub fn fresh() -> Self {
        Resume {
            step: 0,
            adam: None,
            disp_acc: vec![0.0],
        }
    }
}

/// A training run, stepped by its caller.
pub struct Run<T: Real, B: Backend<T>> {
    dm: DeviceModel<T, B>,
    batches: Box<dyn Batches>,
    /// The training systems whose frames stay on the device.
    resident: Resident<T, B>,
    cache: Cache<T, B>,
    /// Loss sums and gradient norms stay on the device until a display step or a checkpoint.
    log: StepLog<T, B>,
    /// The loss sums of a rank without frames in a step (the end of an epoch).
    no_sums: B::Buf,
    loss: Loss,
    schedule: LrSchedule,
    lr_scale: f64,
    opt: OptimizerConfig,
    spec: ModelSpec,
    systems: Vec<SystemInfo>,
    valid: Option<Validation>,
    numb_steps: usize,
    disp_freq: usize,
    disp_training: bool,
    disp_avg: bool,
    save_freq: usize,
    clip: f64,
    start: usize,
    /// Steps done.
    step: usize,
    plan: Option<StepPlan>,
    acc_count: usize,
    acc_sum: Metrics,
    trn: Metrics,
    header_done: bool,
    last_ckpt: Option<PathBuf>,
    /// A multi-task run's head: Adam counts its fitting net's steps apart
    /// ([`Run::head_step`]).
    tail: Option<AdamTail>,
}

impl<T: Real, B: Backend<T>> Run<T, B> {
    /// A run of `cfg` (whose `sel` is resolved) from `model`, at learning rates `schedule` ×
    /// `lr_scale`, on the batches of `systems` drawn by `batches`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        b: &B,
        cfg: &Config,
        schedule: LrSchedule,
        lr_scale: f64,
        model: &Model,
        systems: Vec<SystemInfo>,
        batches: Box<dyn Batches>,
        resident: Resident<T, B>,
        valid: Option<Validation>,
        resume: Resume<T>,
    ) -> Self {
        let tc = &cfg.training;
        let loss = Loss::new(&cfg.loss, schedule.start_lr, &model.spec.fitting.output);
        let mut dm = DeviceModel::<T, B>::new(b, model);
        if let Some((m, v)) = &resume.adam {
            // A linear model's DP models' moments one after the other.
            let mut at = 0;
            dm.each_mut(|d| {
                let part = at..at + d.nparams;
                (d.m, d.v) = (b.upload(&m[part.clone()]), b.upload(&v[part]));
                at += d.nparams;
            });
        }
        let a = &resume.disp_acc;
        let z = loss.zero_metrics();
        let acc_sum = z.with_slots(&a[1..]);
        Run {
            log: StepLog::new(b, tc.disp_freq, loss.nsums()),
            no_sums: b.zeros(loss.nsums()),
            dm,
            batches,
            resident,
            cache: Vec::new(),
            trn: z,
            acc_count: a[0] as usize,
            acc_sum,
            loss,
            schedule,
            lr_scale,
            opt: cfg.optimizer.clone(),
            spec: model.spec.clone(),
            systems,
            valid,
            numb_steps: tc.numb_steps,
            disp_freq: tc.disp_freq,
            disp_training: tc.disp_training,
            disp_avg: tc.disp_avg,
            save_freq: tc.save_freq,
            clip: tc.gradient_max_norm,
            start: resume.step,
            step: resume.step,
            plan: None,
            header_done: false,
            last_ckpt: None,
            tail: None,
        }
    }

    /// A fresh single-process run of `setup` whose batches are assembled in place
    /// ([`InPlace`]): the page's run, with the numbers of `dpw train` on the same input.
    pub fn fresh(b: &B, setup: TrainSetup) -> Result<Self> {
        let tc = &setup.config.training;
        let spec = setup.model.spec.clone();
        let data = &setup.train;
        let budget = resident::budget(b, data)?;
        let resident = Resident::new(
            b,
            &spec,
            &data.systems,
            &data.batch_sizes,
            &data.store,
            budget,
        )?;
        let batches = InPlace::new(data, spec, data.sampler(setup.seed), resident.held());
        let validation = setup.valid.map(|v| Validation {
            sampler: v.sampler(setup.seed ^ VALID_STREAM),
            data: v,
            nbatches: tc.validation_data.as_ref().map_or(1, |v| v.numb_btch),
        });
        Ok(Run::new(
            b,
            &setup.config,
            setup.schedule,
            1.0,
            &setup.model,
            setup.train.systems,
            Box::new(batches),
            resident,
            validation,
            Resume::fresh(),
        ))
    }

    pub fn dm(&self) -> &DeviceModel<T, B> {
        &self.dm
    }

    /// The model on the device, for a multi-task run to hand the shared descriptor over.
    pub fn dm_mut(&mut self) -> &mut DeviceModel<T, B> {
        &mut self.dm
    }

    /// Steps done.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    pub fn numb_steps(&self) -> usize {
        self.numb_steps
    }

    pub fn is_done(&self) -> bool {
        self.step >= self.numb_steps
    }

    /// The metrics of the last step read back.
    pub fn last_trn(&self) -> &Metrics {
        &self.trn
    }

    /// The validation data, if the run validates.
    pub fn validation_data(&self) -> Option<&DataSet> {
        self.valid.as_ref().map(|v| &v.data)
    }

    /// The training systems.
    pub fn systems(&self) -> &[SystemInfo] {
        &self.systems
    }

    /// The checkpoint written last (named by the NaN error).
    pub fn set_last_checkpoint(&mut self, p: PathBuf) {
        self.last_ckpt = Some(p);
    }

    /// What a checkpoint after the last step holds besides the model: the training and
    /// validation batch streams and the disp_avg accumulator ([`Resume::disp_acc`]).
    pub fn checkpoint_state(&self) -> (Sampler, Option<Sampler>, Vec<f64>) {
        let mut acc = vec![self.acc_count as f64];
        acc.extend(self.acc_sum.slots());
        let valid = self.valid.as_ref().map(|v| v.sampler.clone());
        (self.batches.state(), valid, acc)
    }

    /// The model's predictions for `batch` (in the returned workspace).
    pub fn predict(&mut self, b: &B, batch: &HostBatch) -> Result<&mut Workspace<T, B>> {
        predict_batch(b, &self.dm, &mut self.cache, batch)
    }

    /// Makes the next [`Run::step`] step `step` of a multi-task run whose heads this run is
    /// one of: its learning rate, display and checkpoints those of the run's step, Adam's tail
    /// (this head's fitting net) counted with the head's own steps.
    pub fn head_step(&mut self, step: usize, tail: AdamTail) {
        self.step = step;
        self.tail = Some(tail);
    }

    /// The metrics of the next training batch with the model as it is (nothing updated): a
    /// multi-task run's line for the tasks not stepped, as DeePMD-kit draws a fresh batch of
    /// each at a display step.
    /// Under MPI each rank shows its own part of the batch; a rank with no frames in it (at the
    /// end of an epoch) shows NaN.
    pub async fn probe(
        &mut self,
        b: &B,
        d: &mut impl Driver<T, B>,
        pref_lr: f64,
    ) -> Result<Metrics> {
        let StepBatch { draw, batch, .. } = self.batches.next()?;
        let batch = match batch {
            Some(batch) => batch,
            None if draw.is_empty() => return Ok(self.loss.zero_metrics().scaled(f64::NAN)),
            None => {
                bail!("internal: a multi-task head's batches are assembled on the host ({draw:?})")
            }
        };
        let mut avg = Average::new(&self.loss);
        self.add_batch(b, d, &batch, pref_lr, &mut avg).await?;
        Ok(avg.finish())
    }

    /// Runs the next step on the device: batch, forward, gradient, all-reduce, clipping and
    /// Adam. Reads nothing back; [`Run::finish`] must follow before the next step.
    pub fn step(&mut self, b: &B, d: &mut impl Driver<T, B>) -> Result<StepPlan> {
        assert!(
            self.plan.is_none(),
            "Run::step: finish the previous step first"
        );
        if self.is_done() {
            bail!("training is finished ({} steps)", self.numb_steps);
        }
        let step = self.step;
        // scale_by_worker scales the applied (and printed) lr; the prefactors follow the schedule.
        let lr = self.schedule.value(step) * self.lr_scale;
        let pref_lr = self.schedule.pref_lr(step);
        let StepBatch {
            draw,
            batch,
            nglobal,
        } = self.batches.next()?;
        // A mixed batch's atoms per frame are its largest frame's (DeePMD-kit's natoms_vec).
        let (natoms, has_virial) = match (&batch, draw.system()) {
            (Some(hb), _) => (hb.dims.natoms, hb.has_virial),
            (None, Some(s)) => (self.systems[s].natoms, self.systems[s].has_virial),
            // No frames of a mixed batch (never: each rank takes N of its N·size): nothing weighed.
            (None, None) => (1, false),
        };
        let pf = self.loss.prefactors(pref_lr, natoms, has_virial);
        let resident = draw.system().and_then(|s| self.resident.system(s));
        let (sums, nf) = match (&batch, resident, &draw) {
            (_, Some(rs), Draw::System(_, frames)) if !frames.is_empty() => {
                let loss = self.loss.step_loss(&pf);
                let w = resident_gradient(b, &mut self.dm, &mut self.cache, rs, frames, loss)?;
                (w.sums_mut(), frames.len())
            }
            (Some(batch), ..) => {
                let loss = self.loss.step_loss(&pf);
                let w = batch_gradient(b, &mut self.dm, &mut self.cache, batch, loss)?;
                (w.sums_mut(), batch.dims.nframes)
            }
            _ => {
                self.dm.each_mut(|d| b.fill(&mut d.grad, T::zero()));
                b.fill(&mut self.no_sums, T::zero());
                (&mut self.no_sums, 0)
            }
        };
        // The mean over the global batch: each rank's mean weighted by its share of the frames,
        // summed, with the loss sums riding along in the same all-reduce.
        d.all_reduce(b, &mut self.dm.grad, sums, nf as f64 / nglobal as f64);
        let info = StepInfo {
            step: step + 1,
            sys: draw.system(),
            nframes: nglobal,
            natoms,
            pf,
        };
        let (rows, norm_at) = self.log.record(b, sums, info);
        if self.clip > 0.0 {
            b.clip_grad_norm(&mut self.dm.grad, self.clip, rows, norm_at);
        }
        let mut adam = adam_step(&self.opt, lr, step);
        adam.tail = self.tail;
        self.dm
            .each_mut(|d| b.adam(adam, &mut d.params, &d.grad, &mut d.m, &mut d.v));
        self.step += 1;
        let done = self.step;
        let last = done == self.numb_steps;
        let display = self.disp_training && (done.is_multiple_of(self.disp_freq) || done == 1);
        let stop = !last && d.stop_requested();
        let checkpoint =
            (done.is_multiple_of(self.save_freq) && step != self.start) || last || stop;
        let plan = StepPlan {
            done,
            lr,
            display,
            checkpoint,
            stop,
            last,
            // Every rank reads at the same steps, so that all stop at the same step on a NaN.
            read: display || checkpoint || self.log.is_full(),
        };
        self.plan = Some(plan);
        Ok(plan)
    }

    /// The rest of the step [`Run::step`] ran: reads the logged steps where the plan asks
    /// (failing on a loss or gradient norm that is not finite, naming its step), and at a
    /// display step validates and returns the lcurve.out line.
    pub async fn finish(&mut self, b: &B, d: &mut impl Driver<T, B>) -> Result<Option<Shown>> {
        let plan = self.plan.take().expect("Run::finish without a step");
        if plan.read {
            if let Some(rows) = self.log.rows() {
                let v = d.read(b, rows).await?;
                for l in self.log.take(&v) {
                    self.absorb(&l)?;
                }
            }
        }
        d.check(b, &self.dm, plan.done)?;
        if !plan.display {
            return Ok(None);
        }
        let trn = if self.disp_avg {
            let m = self.acc_sum.scaled(1.0 / self.acc_count.max(1) as f64);
            self.acc_count = 0;
            self.acc_sum = self.loss.zero_metrics();
            m
        } else {
            self.trn
        };
        let pref_lr = self.schedule.pref_lr(plan.done - 1);
        let val = self.validate(b, d, pref_lr).await?;
        let mut text = String::new();
        if !self.header_done {
            let keys: Vec<&str> = trn.entries().iter().map(|e| e.0).collect();
            text.push_str(&lcurve::header(&keys, val.is_some()));
            self.header_done = true;
        }
        text.push_str(&lcurve::line(plan.done, plan.lr, &trn, val.as_ref()));
        Ok(Some(Shown {
            step: plan.done,
            lr: plan.lr,
            trn,
            val,
            lcurve: text,
        }))
    }

    /// One logged step's metrics: checked, and added to the disp_avg average.
    fn absorb(&mut self, l: &LoggedStep) -> Result<()> {
        let LoggedStep { info, sums, .. } = l;
        self.trn = self.loss.metrics(sums, info.nframes, info.natoms, &info.pf);
        if !self.loss.is_finite(sums, &self.trn) {
            bail!(
                "the loss is {} at step {} ({}); stopping{}",
                sums[0],
                info.step,
                info.sys.map_or("a mixed batch".to_string(), |s| format!(
                    "system {}",
                    self.systems[s].path.display()
                )),
                self.last_ckpt.as_ref().map_or(String::new(), |p| format!(
                    "; the last checkpoint is {}",
                    p.display()
                ))
            );
        }
        if self.clip > 0.0 {
            check_grad_norm(l)?;
        }
        if self.disp_avg {
            self.acc_count += 1;
            self.acc_sum.add_scaled(&self.trn, 1.0);
        }
        Ok(())
    }

    /// `dp train`'s validation line: the atom-weighted average over numb_btch batches.
    pub async fn validate(
        &mut self,
        b: &B,
        d: &mut impl Driver<T, B>,
        pref_lr: f64,
    ) -> Result<Option<Metrics>> {
        let Some(nbatches) = self.valid.as_ref().map(|v| v.nbatches) else {
            return Ok(None);
        };
        let mut avg = Average::new(&self.loss);
        for _ in 0..nbatches {
            let v = self.valid.as_mut().expect("checked");
            let batch = validation::next_batch(&self.spec, &v.data, &mut v.sampler)?;
            self.add_batch(b, d, &batch, pref_lr, &mut avg).await?;
        }
        Ok(Some(avg.finish()))
    }

    /// Adds the metrics of the model's predictions for `batch` to `avg`.
    async fn add_batch(
        &mut self,
        b: &B,
        d: &mut impl Driver<T, B>,
        batch: &HostBatch,
        pref_lr: f64,
        avg: &mut Average,
    ) -> Result<()> {
        let w = predict_batch(b, &self.dm, &mut self.cache, batch)?;
        let bufs = match self.dm.head {
            Some(_) => w.head_bufs(),
            None => vec![&w.energy, &w.force, &w.virial],
        };
        let mut pred = Vec::new();
        for buf in bufs {
            let x = d.read(b, buf).await?;
            pred.push(x.iter().map(|x| x.f64()).collect::<Vec<f64>>());
        }
        let pred = match &self.dm.head {
            Some(h) => Predicted::Head(HeadInputs::from_reads(pred), h, w.centres()),
            None => Predicted::Ener(&pred[0], &pred[1], &pred[2]),
        };
        avg.add(&self.loss, pref_lr, batch, pred);
        Ok(())
    }
}

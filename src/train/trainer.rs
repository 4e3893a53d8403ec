//! `dpw train`'s loop, once `setup::prepare` has checked and read everything: on a backend in
//! the chosen precision, sampling, the step, Adam, lcurve.out, validation and checkpoints.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use web_time::Instant;

use crate::backend::{Backend, Real};
use crate::config::{Config, Precision, TrainingConfig};
use crate::data::Sampler;
use crate::dist;
use crate::fmt::sci;
use crate::model::file::write_atomic;
use crate::model::Model;

use super::budget::check_batches;
use super::checkpoint::{self, Checkpoint, DataShape, Rotation};
use super::dataset::DataSet;
use super::interrupt;
use super::lcurve::{self, Metrics};
use super::prefetch::Prefetcher;
use super::resident::{self, Resident};
use super::run::{block_on, Driver, Resume, Run, StepPlan, Validation};
use super::setup::TrainSetup;
use super::step::DeviceModel;
use super::validation::VALID_STREAM;

/// Target of the per-display progress lines (`RUST_LOG=info,dpw::progress=off` hides them).
pub const PROGRESS_TARGET: &str = "dpw::progress";

/// What a finished run reports.
#[derive(Clone, Debug, Default)]
pub struct TrainReport {
    pub steps: usize,
    /// Seconds from the command's start to the first training step.
    pub startup_s: f64,
    /// Wall time of each step's compute (batch, forward, gradient, update), without display,
    /// validation and checkpoints: what `dpw bench` reports.
    pub step_s: Vec<f64>,
    pub wall_s: f64,
    pub s_per_step: f64,
    pub last_trn: Option<Metrics>,
    pub last_val: Option<Metrics>,
    pub last_ckpt: Option<PathBuf>,
}

pub(super) fn shape(d: &DataSet) -> DataShape {
    DataShape {
        nframes: d.nframes(),
        batch_sizes: d.batch_sizes.clone(),
        probs: d.probs.clone(),
        mixed: d.mixed,
    }
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

/// A new lcurve.out for a run from step 0; else the existing one's lines up to `step` (dropping
/// what a killed run wrote after its last checkpoint), opened for appending.
pub(super) fn open_lcurve(path: &Path, step: usize) -> Result<File> {
    if step == 0 {
        return File::create(path).with_context(|| format!("cannot create {}", path.display()));
    }
    if path.exists() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let kept: String = text
            .split_inclusive('\n')
            .filter(|l| lcurve::line_step(l).is_none_or(|s| s <= step))
            .collect();
        if kept.len() != text.len() {
            tracing::info!(
                "{}: dropped the lines after step {step} (written after the checkpoint)",
                path.display()
            );
            write_atomic(path, kept.as_bytes())?;
        }
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

fn fmt_metrics(m: &Metrics) -> String {
    m.entries()
        .iter()
        .map(|(k, v)| format!("{k} = {}", sci(*v, 2, 8)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Trains on backend `b` in precision `T` (which must be the setup's precision).
pub fn train<T: Real, B: Backend<T>>(
    b: &B,
    link: dist::DeviceLink<T, B::Buf>,
    setup: TrainSetup,
) -> Result<TrainReport> {
    let TrainSetup {
        config: cfg,
        train: mut train_data,
        valid,
        model,
        precision,
        restart,
        seed,
        schedule,
        out_dir,
        out_json,
        progress,
        t0,
        lock: _lock,
        wait_each_step,
        stat_env: _,
        fit_input_sums: _,
        merged_refit: _,
    } = setup;
    if T::NAME != precision.as_str() {
        bail!(
            "internal: training in {} but the model asks for {}",
            T::NAME,
            precision.as_str()
        );
    }
    let tc = &cfg.training;
    let numb_steps = tc.numb_steps;
    if restart.as_ref().map_or(0, |c| c.step) < numb_steps {
        let dm = DeviceModel::<T, B>::new(b, &model);
        check_batches(b, &dm, &model.spec, &train_data, "training")?;
        if let Some(v) = &valid {
            check_batches(b, &dm, &model.spec, v, "validation")?;
        }
    }
    // Data-parallel over MPI (src/dist): rank 0 alone writes files and validates.
    let world = dist::world();
    let root = world.is_root();
    let lr_scale = announce_world(world, &b.name(), &cfg);

    // Outputs: out.json first, as dp train does, then lcurve.out; both once the first step has
    // run (or at once where there is none to run), so that what fails before it (memory for the
    // frames kept on the device or for the first batch's workspace) leaves the outputs of the
    // previous run in the folder as they were.
    let mut text = serde_json::to_string_pretty(&cfg.to_expanded_json())?;
    text.push('\n');
    let lcurve_path = out_dir.join(&tc.disp_file);

    let start = restart.as_ref().map_or(0, |c| c.step);
    let mut model = model;
    world.broadcast_model(&mut model);
    let streams = Streams::resume(
        restart.as_deref(),
        &train_data,
        valid.as_ref(),
        seed,
        tc.seed,
    );
    let save_ckpt = out_dir.join(&tc.save_ckpt);
    // Only rank 0 saves checkpoints.
    let rotation = if root {
        Some(Rotation::new(
            &save_ckpt,
            tc.max_ckpt_keep,
            restart.is_some(),
        )?)
    } else {
        None
    };
    let mut saver = Saver {
        model: &model,
        precision,
        train_shape: streams.train_shape.clone(),
        valid_shape: streams.valid_shape.clone(),
        path: save_ckpt,
        rotation,
    };
    drop(restart);
    let open_outputs = || -> Result<Option<File>> {
        if !root {
            return Ok(None);
        }
        write_atomic(&out_json, text.as_bytes())?;
        open_lcurve(&lcurve_path, start).map(Some)
    };

    let mut report = TrainReport::default();
    // Only rank 0 validates.
    let validation = match (valid, streams.valid) {
        (Some(data), Some(sampler)) if root => Some(Validation {
            data,
            sampler,
            nbatches: tc.validation_data.as_ref().map_or(1, |v| v.numb_btch),
        }),
        _ => None,
    };
    // The parameter-sized vectors of the run (the model on the device, its gradient, Adam's two
    // moments, and at each save a checkpoint's copies: 10 at the most, f64 or less) are made
    // one at a time, none of them fallibly.
    let nparams = model.params.len();
    crate::mem::check_room(10 * nparams * size_of::<f64>(), || {
        format!("the run's copies of the model's {nparams} parameters (the model, its gradient, Adam's moments, a checkpoint's)")
    })
    .map_err(|e| e.lowered_by("narrower descriptor or fitting_net neuron lower it"))?;
    let spec = &model.spec;
    let systems = std::mem::take(&mut train_data.systems);
    let resident = if start < numb_steps {
        Resident::new(
            b,
            spec,
            &systems,
            &train_data.batch_sizes,
            &train_data.store,
            resident::budget(b, &train_data)?,
        )?
    } else {
        Resident::none()
    };
    let batches = Prefetcher::new(
        Arc::clone(&train_data.store),
        spec.clone(),
        streams.train,
        1,
        (world.rank(), world.size()),
        resident.held(),
    );
    let mut run = Run::<T, B>::new(
        b,
        &cfg,
        schedule,
        lr_scale,
        &model,
        systems,
        Box::new(batches),
        resident,
        validation,
        streams.resume,
    );
    if start >= numb_steps {
        open_outputs()?;
        if start == 0 && root {
            // numb_steps 0: DeePMD-kit still saves the initial model.
            let p = saver.save(b, &run, 0, 0.0)?;
            tracing::info!(
                "numb_steps is 0: saved the initial model to {}",
                p.display()
            );
            report.last_ckpt = Some(p);
        } else if start > 0 {
            tracing::info!(
                "the checkpoint is at step {start} >= numb_steps {numb_steps}: nothing to train"
            );
        }
        return Ok(report);
    }

    let mut progress = Progress::start(progress, start, tc, t0, root);
    let mut driver = CliDriver {
        world,
        exchange: dist::GradExchange::new(link),
        disp_freq: tc.disp_freq,
        signal: None,
    };
    let mut fout: Option<File> = None;
    interrupt::training_started();

    while !run.is_done() {
        let t_step = Instant::now();
        let plan = run.step(b, &mut driver)?;
        if wait_each_step {
            b.wait();
        }
        let done = plan.done;
        if progress.stepped(t_step, done) {
            fout = open_outputs()?;
        }
        if let Some(shown) = block_on(run.finish(b, &mut driver))? {
            if let Some(fout) = fout.as_mut() {
                fout.write_all(shown.lcurve.as_bytes())
                    .and_then(|_| fout.flush())
                    .with_context(|| format!("cannot write {}", lcurve_path.display()))?;
            }
            progress.show(&[("", &shown.trn, shown.val.as_ref())], done, plan.lr);
            dist::log::flush(world);
        }

        if root && plan.checkpoint {
            let p = saver.save(b, &run, done, plan.lr)?;
            run.set_last_checkpoint(p.clone());
            progress.saved(p);
        }
        progress.stop_if_asked(&plan, driver.signal)?;
    }
    drop(run);
    let exchange = world.is_distributed().then_some(&driver.exchange);
    Ok(progress.finish(exchange, root.then_some(&saver.path)))
}

/// A training loop's bookkeeping, `dpw train`'s and a multi-task run's: the report, each
/// step's time, log lines and progress bar, the checkpoints saved, the stop on a signal.
pub(super) struct Progress {
    report: TrainReport,
    display: Display,
    bar: Option<ProgressBar>,
    t0: Instant,
    t_loop: Instant,
    start: usize,
    numb_steps: usize,
    root: bool,
}

impl Progress {
    /// A loop from step `start` to `tc.numb_steps` of a command started at `t0`.
    pub(super) fn start(
        bar: Option<ProgressBar>,
        start: usize,
        tc: &TrainingConfig,
        t0: Instant,
        root: bool,
    ) -> Self {
        let numb_steps = tc.numb_steps;
        if let Some(bar) = &bar {
            bar.set_length(numb_steps as u64);
            bar.set_position(start as u64);
            // A restart's steps so far are not this run's speed.
            bar.reset_eta();
        }
        tracing::info!(
            "start training: steps {}..{} ({} to go), setup took {:.2} s",
            start + 1,
            numb_steps,
            numb_steps - start,
            t0.elapsed().as_secs_f64()
        );
        Progress {
            report: TrainReport {
                startup_s: t0.elapsed().as_secs_f64(),
                ..TrainReport::default()
            },
            display: Display::new(start, numb_steps, tc.disp_freq, tc.time_training),
            bar,
            t0,
            t_loop: Instant::now(),
            start,
            numb_steps,
            root,
        }
    }

    /// Step `done` ran from `t_step` on; whether it is the loop's first.
    pub(super) fn stepped(&mut self, t_step: Instant, done: usize) -> bool {
        self.report.step_s.push(t_step.elapsed().as_secs_f64());
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        }
        let first = done == self.start + 1;
        if first {
            tracing::info!(
                "first step done {:.2} s after start",
                self.t0.elapsed().as_secs_f64()
            );
        }
        first
    }

    /// A display step's lines ([`Display::show_tasks`]); the report keeps the first task's
    /// metrics.
    pub(super) fn show(
        &mut self,
        tasks: &[(&str, &Metrics, Option<&Metrics>)],
        done: usize,
        lr: f64,
    ) {
        self.display.show(tasks, done, lr, self.bar.as_ref());
        if let Some((_, trn, val)) = tasks.first() {
            self.report.last_trn = Some(**trn);
            self.report.last_val = val.copied();
        }
    }

    pub(super) fn saved(&mut self, p: PathBuf) {
        tracing::info!("checkpoint saved to {}", p.display());
        interrupt::note_checkpoint(&p);
        self.report.last_ckpt = Some(p);
    }

    /// The run stops with an [`interrupt::Interrupted`] after a step whose plan stops on a
    /// signal (it has been saved).
    pub(super) fn stop_if_asked(&self, plan: &StepPlan, signal: Option<usize>) -> Result<()> {
        match (plan.stop, signal) {
            (true, Some(signal)) => Err(interrupt::Interrupted {
                signal,
                step: plan.done,
                checkpoint: self.report.last_ckpt.clone().filter(|_| self.root),
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// The report of the finished loop, its last lines logged.
    pub(super) fn finish<T: Real, Buf>(
        mut self,
        exchange: Option<&dist::GradExchange<T, Buf>>,
        saved: Option<&PathBuf>,
    ) -> TrainReport {
        let wall = self.t_loop.elapsed().as_secs_f64();
        let r = &mut self.report;
        r.steps = self.numb_steps - self.start;
        r.wall_s = wall;
        r.s_per_step = (self.display.s_per_step()).unwrap_or(wall / r.steps as f64);
        log_end(r, exchange, saved);
        self.report
    }
}

/// The run's last lines: its speed, the all-reduce's share, where the model is.
fn log_end<T: Real, Buf>(
    report: &TrainReport,
    exchange: Option<&dist::GradExchange<T, Buf>>,
    saved: Option<&PathBuf>,
) {
    let per_step = report.wall_s / report.steps as f64;
    tracing::info!(
        "trained {} steps in {:.2} s: {:.4} s/step on average ({:.4} s/step leaving out the first display interval)",
        report.steps,
        report.wall_s,
        per_step,
        report.s_per_step
    );
    let world = dist::world();
    if let Some(ex) = exchange {
        tracing::info!("{}", ex.summary(world, per_step));
    }
    if let Some(p) = saved {
        tracing::info!("trained model has been saved to: {}", p.display());
    }
    dist::log::flush(world);
}

/// Says how the run is spread over the ranks; returns the learning-rate factor for them.
pub(super) fn announce_world(world: &dist::World, backend: &str, cfg: &Config) -> f64 {
    for l in dist::summary(world, backend) {
        tracing::info!("{l}");
    }
    let lr_scale = world.lr_scale(cfg.learning_rate.scale_by_worker);
    if world.is_distributed() {
        tracing::info!(
            "data-parallel over {} ranks: batch_size is per rank, the global batch is {} × it; \
             learning rate × {lr_scale} (scale_by_worker {})",
            world.size(),
            world.size(),
            cfg.learning_rate.scale_by_worker.as_str()
        );
    }
    dist::log::flush(world);
    lr_scale
}

/// The batch streams a run starts from, and the data shapes its checkpoints record.
pub(super) struct Streams<T> {
    pub(super) train: Sampler,
    pub(super) valid: Option<Sampler>,
    pub(super) resume: Resume<T>,
    pub(super) train_shape: DataShape,
    pub(super) valid_shape: Option<DataShape>,
}

impl<T: Real> Streams<T> {
    /// A checkpoint's streams where its data are these; new ones otherwise. A restart on other
    /// data (or other batch sizes or probabilities) cannot continue the checkpoint's batch
    /// stream; it starts a new one, seeded from the seed and the step. `given_seed` is
    /// training.seed as input.json gives it, for the note that a restart does not use it.
    pub(super) fn resume(
        restart: Option<&Checkpoint>,
        train: &DataSet,
        valid: Option<&DataSet>,
        seed: u64,
        given_seed: Option<u64>,
    ) -> Self {
        let train_shape = shape(train);
        let valid_shape = valid.map(shape);
        let start = restart.map_or(0, |c| c.step);
        let stream_seed = seed.wrapping_add(start as u64);
        let new_train = || train.sampler(stream_seed);
        let new_valid = || valid.map(|v| v.sampler(stream_seed ^ VALID_STREAM));
        let (train, valid, resume) = match restart {
            Some(ck) => {
                let ts = if ck.train_shape == train_shape {
                    if let Some(s) = given_seed {
                        tracing::info!(
                            "training.seed {s} is not used: a restart continues the \
                             checkpoint's batch stream where it stopped, whatever seed its run \
                             began with"
                        );
                    }
                    ck.sampler.clone()
                } else {
                    tracing::warn!(
                        "the training data (frames per system, batch sizes or probabilities) \
                         differ from the checkpoint's: starting a new batch stream"
                    );
                    new_train()
                };
                let vs = match (&ck.valid_shape, &valid_shape) {
                    (was, now) if was == now => ck.valid_sampler.clone(),
                    (Some(_), None) => {
                        tracing::info!(
                            "input.json has no validation_data (the checkpoint's run had): the \
                             run goes on without validation"
                        );
                        None
                    }
                    (None, Some(_)) => {
                        tracing::info!(
                            "validation_data is new since the checkpoint: validating on a new \
                             batch stream"
                        );
                        new_valid()
                    }
                    _ => {
                        tracing::warn!(
                            "the validation data differ from the checkpoint's: starting a new \
                             batch stream"
                        );
                        new_valid()
                    }
                };
                let resume = Resume {
                    step: start,
                    adam: Some((to_t(&ck.adam_m), to_t(&ck.adam_v))),
                    disp_acc: ck.disp_acc.clone(),
                };
                (ts, vs, resume)
            }
            None => (new_train(), new_valid(), Resume::fresh()),
        };
        Streams {
            train,
            valid,
            resume,
            train_shape,
            valid_shape,
        }
    }
}

/// Writes the run's checkpoints: the model with the run's parameters, Adam's moments and the
/// batch streams' state.
struct Saver<'a> {
    model: &'a Model,
    precision: Precision,
    train_shape: DataShape,
    valid_shape: Option<DataShape>,
    path: PathBuf,
    rotation: Option<Rotation>,
}

impl Saver<'_> {
    fn save<T: Real, B: Backend<T>>(
        &mut self,
        b: &B,
        run: &Run<T, B>,
        step: usize,
        lr: f64,
    ) -> Result<PathBuf> {
        let dm = run.dm();
        let (sampler, valid_sampler, disp_acc) = run.checkpoint_state();
        let mut m = self.model.clone();
        m.params = dm.params_f64(b);
        let ck = Checkpoint {
            model: m,
            precision: self.precision,
            step,
            lr,
            adam_m: dm.concat(b, |m| &m.m),
            adam_v: dm.concat(b, |m| &m.v),
            sampler,
            valid_sampler,
            train_shape: self.train_shape.clone(),
            valid_shape: self.valid_shape.clone(),
            disp_acc,
        };
        let rotation = self
            .rotation
            .as_mut()
            .context("internal: only rank 0 saves checkpoints")?;
        checkpoint::save(&ck, &self.path, rotation)
    }
}

/// The log lines and progress-bar message of each display step, and the step time over the
/// display intervals.
struct Display {
    start: usize,
    numb_steps: usize,
    disp_freq: usize,
    time_training: bool,
    t_disp: Instant,
    last_disp_step: usize,
    /// Seconds and steps of the intervals that count towards the average step time.
    timed: (f64, usize),
}

impl Display {
    pub(super) fn new(
        start: usize,
        numb_steps: usize,
        disp_freq: usize,
        time_training: bool,
    ) -> Self {
        Display {
            start,
            numb_steps,
            disp_freq,
            time_training,
            t_disp: Instant::now(),
            last_disp_step: start,
            timed: (0.0, 0),
        }
    }

    /// A display step's lines: each task's, `<task>_trn` and `<task>_val` as DeePMD-kit labels
    /// them in a multi-task run (`trn` and `val` for the one task of a single-task run, `""`).
    fn show(
        &mut self,
        tasks: &[(&str, &Metrics, Option<&Metrics>)],
        done: usize,
        lr: f64,
        bar: Option<&ProgressBar>,
    ) {
        let dt = self.t_disp.elapsed().as_secs_f64();
        let nsteps = done - self.last_disp_step;
        self.t_disp = Instant::now();
        self.last_disp_step = done;
        // As DeePMD-kit, leave the first interval (start-up) out of the average.
        if done - self.start > self.disp_freq || self.numb_steps - self.start < 2 * self.disp_freq {
            self.timed.0 += dt;
            self.timed.1 += nsteps;
        }
        for (task, trn, val) in tasks {
            let sep = if task.is_empty() { "" } else { "_" };
            tracing::info!(
                target: PROGRESS_TARGET,
                "batch {done:7}: {task}{sep}trn: {}, lr = {}",
                fmt_metrics(trn),
                sci(lr, 2, 8)
            );
            if let Some(v) = val {
                tracing::info!(
                    target: PROGRESS_TARGET,
                    "batch {done:7}: {task}{sep}val: {}",
                    fmt_metrics(v)
                );
            }
        }
        if self.time_training {
            let rate = nsteps as f64 / dt.max(1e-9);
            tracing::info!(
                target: PROGRESS_TARGET,
                "batch {done:7}: wall time {:.2} s for {nsteps} steps, {rate:.2} steps/s, eta {}",
                dt,
                fmt_duration((self.numb_steps - done) as f64 / rate)
            );
        }
        if let (Some(bar), Some((_, trn, val))) = (bar, tasks.first()) {
            let m = val.unwrap_or(trn);
            let mut msg = format!("{}:", if val.is_some() { "val" } else { "trn" });
            for (k, v) in m.entries().iter().skip(1) {
                msg.push_str(&format!(" {k} {}", sci(*v, 2, 8).trim_start()));
            }
            bar.set_message(msg);
        }
    }

    /// The average step time over the intervals counted, if any was.
    fn s_per_step(&self) -> Option<f64> {
        (self.timed.1 > 0).then(|| self.timed.0 / self.timed.1 as f64)
    }
}

/// What `dpw train` plugs into the [`Run`]: blocking reads, the MPI all-reduce and the
/// cross-rank check of the parameters, and Ctrl-C / SIGTERM.
pub(super) struct CliDriver<'a, T, Buf> {
    pub(super) world: &'static dist::World,
    pub(super) exchange: dist::GradExchange<'a, T, Buf>,
    pub(super) disp_freq: usize,
    /// The signal that asked for a stop.
    pub(super) signal: Option<usize>,
}

impl<T: Real, B: Backend<T>> Driver<T, B> for CliDriver<'_, T, B::Buf> {
    async fn read(&mut self, b: &B, buf: &B::Buf) -> Result<Vec<T>> {
        Ok(b.download(buf))
    }

    fn all_reduce(&mut self, b: &B, grad: &mut B::Buf, sums: &mut B::Buf, share: f64) {
        if self.world.is_distributed() {
            self.exchange.all_reduce(self.world, b, grad, sums, share);
        }
    }

    fn stop_requested(&mut self) -> bool {
        // The step is finished; it is saved and the run stops.
        self.signal = interrupt::requested();
        self.signal.is_some()
    }

    fn check(&mut self, b: &B, dm: &DeviceModel<T, B>, done: usize) -> Result<()> {
        let world = self.world;
        if world.is_distributed() && done.is_multiple_of(self.disp_freq) {
            let (lo, hi) = world.min_max(dist::checksum(&dm.params_f64(b)));
            if lo != hi {
                if !world.is_root() {
                    return Err(dist::Reported.into());
                }
                bail!(
                    "after step {done} the parameters differ between the ranks (checksums \
                     {lo:#x} to {hi:#x}); the data-parallel update has diverged"
                );
            }
        }
        Ok(())
    }
}

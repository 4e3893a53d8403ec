//! The multi-task training loop. Each step draws a task as DeePMD-kit draws it ([`TaskDraw`])
//! and steps that task's [`Run`]. The shared parameters' values and Adam moments (the
//! descriptor's, and a fitting net's that tasks share) go, on the device, from the head that
//! stepped them last to the head stepping now; Adam counts the descriptor's steps over the whole
//! run and a fitting net's over the steps of the tasks that have it (torch counts steps per
//! tensor, and a head has no gradient at the other tasks' steps).
//!
//! At a display step the stepped task shows the loss of its step; every other task the loss of
//! a fresh batch of its training data, and each its validation, as DeePMD-kit's lcurve.out.
//! Under MPI every rank draws rank 0's task sequence, so that the ranks step the same task and
//! all-reduce its gradient as a single-task run does (DeePMD-kit draws a task per rank).

use std::fs::File;
use std::io::Write as _;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use web_time::Instant;

use crate::backend::{AdamTail, Backend, Real, Span};
use crate::config::multitask::MultiTaskConfig;
use crate::config::Precision;
use crate::dist;
use crate::model::file::write_atomic;
use crate::model::Model;
use crate::train::budget::check_batches;
use crate::train::checkpoint::{self, Checkpoint, DataShape, Rotation};
use crate::train::interrupt;
use crate::train::lcurve::{task_header, task_line, Metrics, TaskColumns};
use crate::train::prefetch::Prefetcher;
use crate::train::resident::Resident;
use crate::train::run::{block_on, Run, Validation};
use crate::train::step::DeviceModel;
use crate::train::task_draw::TaskDraw;
use crate::train::trainer::{
    announce_world, open_lcurve, CliDriver, Progress, Streams, TrainReport,
};

use super::checkpoint::{HeadCheckpoint, MultiCheckpoint};
use super::MultiTaskSetup;

/// One task's run, and what its checkpoints hold beside the run's state.
struct Head<T: Real, B: Backend<T>> {
    name: String,
    aliases: Vec<String>,
    run: Run<T, B>,
    /// Its spec, statistics and bias (the parameters are the run's).
    model: Model,
    train_shape: DataShape,
    valid_shape: Option<DataShape>,
    /// Steps of this task so far.
    updates: usize,
}

/// Trains every task of `setup` on backend `b` in precision `T`.
pub fn train<T: Real, B: Backend<T>>(
    b: &B,
    link: dist::DeviceLink<T, B::Buf>,
    setup: MultiTaskSetup,
) -> Result<TrainReport> {
    let MultiTaskSetup {
        config,
        tasks,
        updates,
        shared,
        seed,
        progress,
        lock: _lock,
        out_json,
    } = setup;
    let first = &tasks[0];
    let precision = first.precision;
    if T::NAME != precision.as_str() {
        bail!(
            "internal: training in {} but the model asks for {}",
            T::NAME,
            precision.as_str()
        );
    }
    let cfg = first.config.clone();
    let tc = cfg.training.clone();
    let numb_steps = tc.numb_steps;
    let (out_dir, t0, schedule) = (first.out_dir.clone(), first.t0, first.schedule.clone());
    let restarted = first.restart.is_some();
    let start = first.restart.as_ref().map_or(0, |c| c.step);
    if start < numb_steps {
        for s in &tasks {
            let dm = DeviceModel::<T, B>::new(b, &s.model);
            check_batches(b, &dm, &s.model.spec, &s.train, "training")?;
            if let Some(v) = &s.valid {
                check_batches(b, &dm, &s.model.spec, v, "validation")?;
            }
        }
    }
    let world = dist::world();
    let root = world.is_root();
    let lr_scale = announce_world(world, &b.name(), &cfg);
    let mut text = serde_json::to_string_pretty(&config.to_expanded_json())?;
    text.push('\n');
    let lcurve_path = out_dir.join(&tc.disp_file);
    let open_outputs = || -> Result<Option<File>> {
        if !root {
            return Ok(None);
        }
        write_atomic(&out_json, text.as_bytes())?;
        open_lcurve(&lcurve_path, start).map(Some)
    };
    let mut saver = Saver {
        path: out_dir.join(&tc.save_ckpt),
        rotation: match root {
            true => Some(Rotation::new(
                &out_dir.join(&tc.save_ckpt),
                tc.max_ckpt_keep,
                restarted,
            )?),
            false => None,
        },
        precision,
        seed,
    };

    let mut heads = Vec::with_capacity(tasks.len());
    for ((t, mut s), updates) in config.tasks.iter().zip(tasks).zip(updates) {
        world.broadcast_model(&mut s.model);
        let streams = Streams::<T>::resume(
            s.restart.as_deref(),
            &s.train,
            s.valid.as_ref(),
            s.seed,
            None,
        );
        let validation = match (s.valid.take(), streams.valid) {
            (Some(data), Some(sampler)) if root => Some(Validation {
                sampler,
                nbatches: (s.config.training.validation_data.as_ref()).map_or(1, |v| v.numb_btch),
                data,
            }),
            _ => None,
        };
        let systems = std::mem::take(&mut s.train.systems);
        let batches = Prefetcher::new(
            Arc::clone(&s.train.store),
            s.model.spec.clone(),
            streams.train,
            1,
            (world.rank(), world.size()),
            Vec::new(),
        );
        let run = Run::new(
            b,
            &s.config,
            s.schedule,
            lr_scale,
            &s.model,
            systems,
            Box::new(batches),
            Resident::none(),
            validation,
            streams.resume,
        );
        heads.push(Head {
            name: t.name.clone(),
            aliases: t.aliases.clone(),
            run,
            model: s.model,
            train_shape: streams.train_shape,
            valid_shape: streams.valid_shape,
            updates,
        });
    }

    if start >= numb_steps {
        open_outputs()?;
        if start > 0 {
            tracing::info!(
                "the checkpoint is at step {start} >= numb_steps {numb_steps}: nothing to train"
            );
        } else if root {
            // numb_steps 0: DeePMD-kit still saves the initial model.
            let p = saver.save(b, &heads, &Holders::new(&config, &heads, shared), 0, 0.0)?;
            tracing::info!(
                "numb_steps is 0: saved the initial model to {}",
                p.display()
            );
            return Ok(TrainReport {
                last_ckpt: Some(p),
                ..TrainReport::default()
            });
        }
        return Ok(TrainReport::default());
    }
    let mut progress = Progress::start(progress, start, &tc, t0, root);
    let mut driver = CliDriver {
        world,
        exchange: dist::GradExchange::new(link),
        disp_freq: tc.disp_freq,
        signal: None,
    };
    let mut draw = TaskDraw::new(0, seed, &config.model_prob);
    // A restart continues the sequence: one draw per step.
    draw.skip(start);
    let mut holders = Holders::new(&config, &heads, shared);
    let mut scratch = holders.scratch(b);
    let mut fout: Option<File> = None;
    let mut header_done = false;
    interrupt::training_started();

    for step in start..numb_steps {
        let k = draw.next();
        holders.bring(b, &mut heads, k, &mut scratch);
        holders.stepped(k);
        let t_step = Instant::now();
        // Adam's count of this head's fitting net: the steps of every task that has it.
        let fit_steps: usize = (holders.sharing(k)).map(|i| heads[i].updates).sum();
        let h = &mut heads[k];
        h.run.head_step(
            step,
            AdamTail {
                from: shared,
                t: h.updates as u64 + 1,
                fit_from: holders.fit,
                fit_t: fit_steps as u64 + 1,
            },
        );
        let plan = h.run.step(b, &mut driver)?;
        h.updates += 1;
        let done = plan.done;
        if progress.stepped(t_step, done) {
            fout = open_outputs()?;
        }
        if let Some(shown) = block_on(heads[k].run.finish(b, &mut driver))? {
            let pref_lr = schedule.pref_lr(done - 1);
            let mut cols: Vec<(Metrics, Option<Metrics>)> = Vec::with_capacity(heads.len());
            for i in 0..heads.len() {
                if i == k {
                    cols.push((shown.trn, shown.val));
                    continue;
                }
                holders.bring(b, &mut heads, i, &mut scratch);
                let run = &mut heads[i].run;
                let trn = block_on(run.probe(b, &mut driver, pref_lr))?;
                let val = block_on(run.validate(b, &mut driver, pref_lr))?;
                cols.push((trn, val));
            }
            let columns: Vec<TaskColumns> = (heads.iter().zip(&cols))
                .map(|(h, (trn, val))| TaskColumns {
                    task: &h.name,
                    trn,
                    val: val.as_ref(),
                })
                .collect();
            if let Some(fout) = fout.as_mut() {
                let mut text = String::new();
                if !header_done {
                    text.push_str(&task_header(&columns));
                    header_done = true;
                }
                text.push_str(&task_line(done, plan.lr, &columns));
                fout.write_all(text.as_bytes())
                    .and_then(|_| fout.flush())
                    .with_context(|| format!("cannot write {}", lcurve_path.display()))?;
            }
            let shown_tasks: Vec<(&str, &Metrics, Option<&Metrics>)> =
                (columns.iter()).map(|c| (c.task, c.trn, c.val)).collect();
            progress.show(&shown_tasks, done, plan.lr);
            dist::log::flush(world);
        }
        if root && plan.checkpoint {
            let p = saver.save(b, &heads, &holders, done, plan.lr)?;
            for h in heads.iter_mut() {
                h.run.set_last_checkpoint(p.clone());
            }
            progress.saved(p);
        }
        progress.stop_if_asked(&plan, driver.signal)?;
    }
    drop(heads);
    let exchange = world.is_distributed().then_some(&driver.exchange);
    Ok(progress.finish(exchange, root.then_some(&saver.path)))
}

/// Which head holds the newest values of each shared part: the descriptor's first `shared`
/// parameters (every head's), and each fitting net that tasks share (the parameters from
/// `fit`: the heads of one [`MultiTaskConfig::fitting_group`]).
struct Holders {
    /// Each head's fitting group.
    group: Vec<usize>,
    shared: usize,
    fit: usize,
    /// Each head's number of parameters (its fitting net's width is its own).
    nparams: Vec<usize>,
    descriptor: usize,
    /// By group.
    fitting: Vec<usize>,
}

impl Holders {
    fn new<T: Real, B: Backend<T>>(
        config: &MultiTaskConfig,
        heads: &[Head<T, B>],
        shared: usize,
    ) -> Self {
        let n = heads.len();
        let layout = heads[0].model.layout();
        Holders {
            group: (0..n).map(|k| config.fitting_group(k)).collect(),
            shared,
            fit: layout.descriptor_len(),
            nparams: heads.iter().map(|h| h.model.params.len()).collect(),
            descriptor: 0,
            fitting: (0..n).collect(),
        }
    }

    /// The heads that have head `k`'s fitting net (`k` alone where it is its own).
    fn sharing(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        let g = self.group[k];
        (0..self.group.len()).filter(move |&i| self.group[i] == g)
    }

    /// Head `k`'s shared parts, the descriptor's and its fitting net's: where in the
    /// parameters each is, the head that holds its newest values, and its slot in
    /// [`Holders::scratch`].
    fn parts(&self, k: usize) -> [(Range<usize>, usize, usize); 2] {
        let g = self.group[k];
        [
            (0..self.shared, self.descriptor, 0),
            (self.fit..self.nparams[k], self.fitting[g], 1 + g),
        ]
    }

    /// [`Holders::bring`]'s buffers: the descriptor's part, then one per fitting group, for
    /// the groups of several heads.
    fn scratch<T: Real, B: Backend<T>>(&self, b: &B) -> Vec<Option<B::Buf>> {
        let fitting = (0..self.group.len()).map(|g| {
            let shared = self.sharing(g).nth(1).is_some() && self.group[g] == g;
            shared.then(|| b.zeros(self.nparams[g] - self.fit))
        });
        std::iter::once(Some(b.zeros(self.shared)))
            .chain(fitting)
            .collect()
    }

    /// Gives head `k` the newest values and Adam moments of its shared parts, on the device,
    /// through `scratch` ([`Holders::scratch`]).
    fn bring<T: Real, B: Backend<T>>(
        &self,
        b: &B,
        heads: &mut [Head<T, B>],
        k: usize,
        scratch: &mut [Option<B::Buf>],
    ) {
        for (range, from, slot) in self.parts(k) {
            if from == k {
                continue;
            }
            let scratch = scratch[slot]
                .as_mut()
                .expect("a part another head holds is shared");
            let (src, dst) = match from < k {
                true => {
                    let (a, c) = heads.split_at_mut(k);
                    (&a[from], &mut c[0])
                }
                false => {
                    let (a, c) = heads.split_at_mut(from);
                    (&c[0], &mut a[k])
                }
            };
            let (s, d) = (src.run.dm(), dst.run.dm_mut());
            let span = Span {
                src: range.start,
                dst: 0,
                len: range.len(),
            };
            for (x, y) in [
                (&s.params, &mut d.params),
                (&s.m, &mut d.m),
                (&s.v, &mut d.v),
            ] {
                b.gather(x, scratch, &[span]);
                b.copy(scratch, y, range.start);
            }
        }
    }

    /// Head `k` has stepped: its shared parts are the newest.
    fn stepped(&mut self, k: usize) {
        self.descriptor = k;
        self.fitting[self.group[k]] = k;
    }
}

/// Writes the run's checkpoints: every head, with each shared part from the head that
/// stepped it last.
struct Saver {
    path: PathBuf,
    rotation: Option<Rotation>,
    precision: Precision,
    seed: u64,
}

impl Saver {
    fn save<T: Real, B: Backend<T>>(
        &mut self,
        b: &B,
        heads: &[Head<T, B>],
        holders: &Holders,
        step: usize,
        lr: f64,
    ) -> Result<PathBuf> {
        let read = |x: &B::Buf| -> Vec<f64> { b.download(x).iter().map(|v| v.f64()).collect() };
        let states: Vec<[Vec<f64>; 3]> = (heads.iter().map(|h| h.run.dm()))
            .map(|dm| [read(&dm.params), read(&dm.m), read(&dm.v)])
            .collect();
        let mut out = Vec::with_capacity(heads.len());
        for (k, h) in heads.iter().enumerate() {
            let [mut params, mut m, mut v] = states[k].clone();
            for (range, from, _) in holders.parts(k) {
                for (mine, theirs) in [&mut params, &mut m, &mut v].into_iter().zip(&states[from]) {
                    mine[range.clone()].copy_from_slice(&theirs[range.clone()]);
                }
            }
            let (sampler, valid_sampler, disp_acc) = h.run.checkpoint_state();
            let mut model = h.model.clone();
            model.params = params;
            out.push(HeadCheckpoint {
                name: h.name.clone(),
                aliases: h.aliases.clone(),
                updates: h.updates,
                ck: Checkpoint {
                    model,
                    precision: self.precision,
                    step,
                    lr,
                    adam_m: m,
                    adam_v: v,
                    sampler,
                    valid_sampler,
                    train_shape: h.train_shape.clone(),
                    valid_shape: h.valid_shape.clone(),
                    disp_acc,
                },
            });
        }
        let ck = MultiCheckpoint {
            step,
            lr,
            seed: self.seed,
            heads: out,
        };
        let rotation =
            (self.rotation.as_mut()).context("internal: only rank 0 saves checkpoints")?;
        checkpoint::save(&ck, &self.path, rotation)
    }
}

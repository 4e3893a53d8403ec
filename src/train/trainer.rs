//! `dpw train`: everything `dp train` does for an se_e2_a + ener model. [`prepare`] checks the
//! input, loads the data, resolves `sel`, computes (or loads) the statistics and reads any
//! checkpoint, all before a single output file is touched; [`train`] then runs the loop on a
//! backend in the chosen precision: sampling, the step, Adam, lcurve.out, validation and
//! checkpoints.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use serde_json::Value;
use web_time::Instant;

use crate::backend::{Backend, Real};
use crate::config::{Config, Precision, Sel};
use crate::data::{Disk, Files, Sampler, SystemStore};
use crate::dist;
use crate::fmt::sci;
use crate::model::file::write_atomic;
use crate::model::{read_model, DescriptorSpec, FittingSpec, Model, ModelSpec, MAX_NNEI};

use super::batch::{assemble_frames, HostBatch};
use super::checkpoint::{self, Checkpoint, DataShape, Rotation};
use super::dataset::{load_data_in, DataSet};
use super::interrupt;
use super::lcurve::{self, Metrics};
use super::lr::LrSchedule;
use super::outputs::{self, RunLock};
use super::resident::{self, Resident};
use super::run::{block_on, Batches, Driver, Resume, Run, StepBatch, Validation};
use super::stats::{
    auto_sel, data_stats, load_training_with_stats, neighbor_and_data_stats, neighbor_stats,
    stat_frames, NeighborStats, Pass, StatDraw,
};
use super::step::DeviceModel;
use super::validation::VALID_STREAM;

/// Target of the per-display progress lines (`RUST_LOG=info,dpw::progress=off` hides them).
pub const PROGRESS_TARGET: &str = "dpw::progress";

/// Mixed into the training seed for the draw of the statistics frames ("STAT").
const STAT_SEED: u64 = 0x5354_4154;

/// How a run starts.
pub enum Start {
    Fresh,
    /// `--restart`: continue a checkpoint's run.
    Restart(Box<Checkpoint>),
    /// `--init-model`: a new run from a model's parameters and statistics.
    InitModel(PathBuf),
    /// `--init-frz-model`: the same from a model already read (a frozen model file).
    InitFrozen(Box<Model>),
}

/// Everything checked and loaded before training; nothing has been written yet.
pub struct TrainSetup {
    /// The input with `sel` resolved to numbers (what out.json holds).
    pub config: Config,
    pub train: DataSet,
    pub valid: Option<DataSet>,
    pub model: Model,
    pub precision: Precision,
    pub restart: Option<Box<Checkpoint>>,
    /// Seed of the training sampler (and of the validation and statistics streams).
    pub seed: u64,
    pub schedule: LrSchedule,
    /// Directory for out.json, lcurve.out and checkpoints (the working directory).
    pub out_dir: PathBuf,
    /// The expanded input (`dp train -o`; out.json in `out_dir` by default).
    pub out_json: PathBuf,
    pub progress: Option<ProgressBar>,
    /// When the command started, for the time to the first step.
    pub t0: Instant,
    /// The output folders, held for the whole run (`None` where nothing is written to disk).
    pub lock: Option<RunLock>,
}

/// What a finished run reports.
#[derive(Clone, Debug)]
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

/// Settings DeePMD-kit accepts that dpw stores but does not implement.
fn check_supported(cfg: &Config) -> Result<()> {
    let m = &cfg.model;
    if m.descriptor.precision != m.fitting_net.precision {
        bail!(
            "model.descriptor.precision ({}) and model.fitting_net.precision ({}) differ; \
             dpw trains the whole model in one precision, so make them equal",
            m.descriptor.precision.as_str(),
            m.fitting_net.precision.as_str()
        );
    }
    if !m.descriptor.trainable {
        bail!("model.descriptor.trainable: false (a frozen descriptor) is not supported");
    }
    if !m.fitting_net.trainable {
        bail!("model.fitting_net.trainable: false (a frozen fitting net) is not supported");
    }
    if m.fitting_net.rcond.is_some() {
        bail!(
            "model.fitting_net.rcond: only the default (null, numpy's machine-precision cut-off) \
             is supported for the energy-bias fit"
        );
    }
    if m.fitting_net.atom_ener.iter().any(Option::is_some) {
        bail!("model.fitting_net.atom_ener: fixed atomic energies are not supported");
    }
    if cfg.loss.relative_f.is_some() {
        bail!("loss.relative_f: the relative force loss is not supported");
    }
    Ok(())
}

fn spec_of(cfg: &Config, sel: Vec<usize>) -> ModelSpec {
    let d = &cfg.model.descriptor;
    let f = &cfg.model.fitting_net;
    ModelSpec {
        type_map: cfg.model.type_map.clone(),
        descriptor: DescriptorSpec {
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            sel,
            neuron: d.neuron.clone(),
            axis_neuron: d.axis_neuron,
            resnet_dt: d.resnet_dt,
            type_one_side: d.type_one_side,
            env_protection: d.env_protection,
            set_davg_zero: d.set_davg_zero,
        },
        fitting: FittingSpec {
            neuron: f.neuron.clone(),
            resnet_dt: f.resnet_dt,
        },
    }
}

/// Paths where two JSON values differ, for a readable "model differs" error.
fn json_diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                json_diff(va, y.get(k).unwrap_or(&Value::Null), &p, out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} here, {b} in the checkpoint")),
        _ => {}
    }
}

fn check_same_spec(mine: &ModelSpec, theirs: &ModelSpec, what: &str) -> Result<()> {
    if mine == theirs {
        return Ok(());
    }
    let mut diffs = Vec::new();
    json_diff(
        &serde_json::to_value(mine)?,
        &serde_json::to_value(theirs)?,
        "",
        &mut diffs,
    );
    bail!(
        "the model of {what} does not match input.json's: {}",
        diffs.join("; ")
    )
}

fn random_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 32)) % (1 << 31)
}

fn shape(d: &DataSet) -> DataShape {
    DataShape {
        nframes: d.nframes(),
        batch_sizes: d.batch_sizes.clone(),
        probs: d.probs.clone(),
    }
}

/// Reads and checks everything a run of the parsed input `cfg` needs, and locks its output
/// folders. Writes nothing else.
/// `neighbor_stat` false skips the scan that checks a fixed `sel` against the data (`dp train
/// --skip-neighbor-stat`).
pub fn prepare(
    cfg: Config,
    start: Start,
    neighbor_stat: bool,
    out_dir: &Path,
    t0: Instant,
) -> Result<TrainSetup> {
    // Only rank 0 writes the outputs.
    let lock = if dist::world().is_root() {
        Some(outputs::claim(out_dir, &cfg.training)?)
    } else {
        None
    };
    let mut setup = prepare_in(&Disk, cfg, start, neighbor_stat, out_dir, t0)?;
    setup.lock = lock;
    Ok(setup)
}

/// [`prepare`] for a parsed input whose data are read from `fs`.
pub fn prepare_in(
    fs: &dyn Files,
    mut cfg: Config,
    start: Start,
    neighbor_stat: bool,
    out_dir: &Path,
    t0: Instant,
) -> Result<TrainSetup> {
    check_supported(&cfg)?;
    let type_map = cfg.model.type_map.clone();
    let ntypes = type_map.len();
    let rcut = cfg.model.descriptor.rcut;

    let (seed, seed_note) = match cfg.training.seed {
        Some(s) => (s, ""),
        None => (random_seed(), " (training.seed not set: drawn at random)"),
    };
    let d = cfg.model.descriptor.clone();
    let fresh = matches!(start, Start::Fresh);
    // As dp train, a fixed sel is checked against the data's neighbour counts (one smaller than
    // them drops neighbours); for a new model in the same pass as the data statistics.
    let check_sel = match &d.sel {
        Sel::Fixed(s) => neighbor_stat && s.iter().sum::<usize>() <= MAX_NNEI,
        Sel::Auto(_) => false,
    };
    // What can be computed on the training systems as they are read: the neighbour counts when
    // they will be needed, and a new model's data statistics when its sel is known already (a
    // model the statistics could not be computed for is refused below, after the reading).
    let early_spec = match &d.sel {
        Sel::Fixed(s) if fresh => Some(spec_of(&cfg, s.clone())).filter(|m| m.check().is_ok()),
        _ => None,
    };
    let pass = Pass {
        ntypes,
        count: (check_sel || (fresh && matches!(d.sel, Sel::Auto(_)))).then_some(rcut),
        stat: early_spec.as_ref().map(|m| &m.descriptor),
    };
    let draw = StatDraw {
        nbatch: cfg.model.data_stat_nbatch,
        batch_factor: dist::world().size(),
        seed: seed ^ STAT_SEED,
    };
    let t_read = Instant::now();
    let (train, mut early_ns, mut early_st) = load_training_with_stats(
        fs,
        &cfg.training.training_data,
        &type_map,
        rcut,
        pass,
        &draw,
    )?;
    for l in train.summary("training") {
        tracing::info!("{l}");
    }
    for l in train.element_counts(&type_map) {
        tracing::info!("{l}");
    }
    let valid = match &cfg.training.validation_data {
        Some(v) => {
            let d = load_data_in(fs, &v.data, &type_map, rcut, "validation")?;
            for l in d.summary("validation") {
                tracing::info!("{l}");
            }
            Some(d)
        }
        None => None,
    };
    let (restart, init) = match start {
        Start::Fresh => (None, None),
        Start::Restart(ck) => (Some(ck), None),
        Start::InitModel(p) => {
            if !p.exists() {
                bail!("--init-model: {} does not exist", p.display());
            }
            let m = read_model(&p).context("--init-model")?;
            tracing::info!("initial parameters and statistics from {}", p.display());
            (None, Some(m))
        }
        Start::InitFrozen(m) => (None, Some(*m)),
    };
    let given = restart.as_ref().map(|c| &c.model).or(init.as_ref());

    let log_neighbours = |ns: &NeighborStats, t: Instant| {
        tracing::info!(
            "neighbour statistics over {} training frames (rcut {}): max neighbours per type {:?} ({}), min pair distance {:.4} ({:.2} s)",
            ns.nframes,
            d.rcut,
            ns.max_count,
            type_map.join(", "),
            ns.min_dist,
            t.elapsed().as_secs_f64()
        );
    };
    let mut neighbours = || {
        if let Some(ns) = early_ns.take() {
            log_neighbours(&ns, t_read);
            return anyhow::Ok(ns);
        }
        let t = Instant::now();
        let ns = neighbor_stats(&train, ntypes, d.rcut)?;
        log_neighbours(&ns, t);
        anyhow::Ok(ns)
    };
    let sel = match (&d.sel, given) {
        (Sel::Auto(_), Some(m)) => {
            tracing::info!(
                "sel {:?} taken from the checkpoint (input.json asks for auto)",
                m.spec.descriptor.sel
            );
            m.spec.descriptor.sel.clone()
        }
        (Sel::Auto(factor), None) => {
            let sel = auto_sel(&neighbours()?.max_count, *factor);
            tracing::info!("sel = {sel:?} (auto, factor {factor})");
            sel
        }
        (Sel::Fixed(s), _) => s.clone(),
    };
    let warn_small_sel = |ns: &NeighborStats, sel: &[usize]| {
        for (t, (&want, &have)) in ns.max_count.iter().zip(sel).enumerate() {
            if have < want {
                tracing::warn!(
                    "sel of type {t} ({}) is not enough! The expected value is not less \
                     than {want}, but you set it to {have}. The accuracy of your model \
                     may get worse.",
                    type_map[t]
                );
            }
        }
    };
    let spec = spec_of(&cfg, sel.clone());
    spec.check().context("the model of input.json")?;
    cfg.model.descriptor.sel = Sel::Fixed(sel);
    if let Some(m) = given {
        let what = if restart.is_some() {
            "the restart checkpoint"
        } else {
            "the --init-model file"
        };
        check_same_spec(&spec, &m.spec, what)?;
    }

    let precision = cfg.model.descriptor.precision;
    if let Some(ck) = &restart {
        if ck.precision != precision {
            bail!(
                "the checkpoint was trained in {}, input.json asks for {}; a restart must keep the precision",
                ck.precision.as_str(),
                precision.as_str()
            );
        }
    } else {
        tracing::info!("seed {seed}{seed_note}");
    }

    if check_sel && given.is_some() {
        warn_small_sel(&neighbours()?, &spec.descriptor.sel);
    }
    let model = if let Some(ck) = &restart {
        tracing::info!("restarting from step {} (lr {:.3e})", ck.step, ck.lr);
        ck.model.clone()
    } else if let Some(m) = init {
        m
    } else {
        let init_seed = d.seed.or(cfg.model.fitting_net.seed).unwrap_or(seed);
        let mut m = Model::new(spec.clone(), init_seed);
        let mut t = Instant::now();
        // Over `data_stat_nbatch` global batches: with N data-parallel ranks N × batch_size.
        let global_bs: Vec<usize> = train
            .batch_sizes
            .iter()
            .map(|b| b * draw.batch_factor)
            .collect();
        let frames = || stat_frames(&train.systems, &global_bs, draw.nbatch, draw.seed);
        let st = if let Some(st) = early_st.take() {
            t = t_read;
            if let Some(ns) = early_ns.take() {
                log_neighbours(&ns, t);
                warn_small_sel(&ns, &spec.descriptor.sel);
            }
            st
        } else if check_sel {
            let frames = frames();
            let (ns, st) = neighbor_and_data_stats(&spec.descriptor, ntypes, &train, &frames)?;
            log_neighbours(&ns, t);
            warn_small_sel(&ns, &spec.descriptor.sel);
            st
        } else {
            data_stats(&spec.descriptor, ntypes, &train, &frames())?
        };
        tracing::info!(
            "statistics over {} frames ({} batches per system): davg {:?}, dstd {:?}, energy bias {:?} ({}), residual std {:.4} ({:.2} s)",
            st.nframes,
            cfg.model.data_stat_nbatch,
            st.davg.chunks(4).map(|r| r[0]).collect::<Vec<_>>(),
            st.dstd.chunks(4).map(|r| [r[0], r[1]]).collect::<Vec<_>>(),
            st.bias,
            type_map.join(", "),
            st.out_std[0],
            t.elapsed().as_secs_f64()
        );
        (m.davg, m.dstd, m.bias, m.out_std) = (st.davg, st.dstd, st.bias, st.out_std);
        m
    };
    let layout = model.layout();
    let nembed: usize = layout
        .embed
        .iter()
        .flat_map(|n| &n.layers)
        .map(|l| l.nin * l.nout + l.nout * (1 + usize::from(l.idt.is_some())))
        .sum();
    tracing::info!(
        "model: se_e2_a sel {:?} rcut {} neuron {:?} axis {} type_one_side {}, fitting {:?}; {} parameters ({} embedding, {} fitting), {}",
        spec.descriptor.sel,
        spec.descriptor.rcut,
        spec.descriptor.neuron,
        spec.descriptor.axis_neuron,
        spec.descriptor.type_one_side,
        spec.fitting.neuron,
        layout.len,
        nembed,
        layout.len - nembed,
        precision.as_str()
    );

    let schedule = LrSchedule::new(&cfg.learning_rate, cfg.training.numb_steps);
    let shrunk = if schedule.decay_steps != cfg.learning_rate.decay_steps {
        format!(
            " (shrunk from {} for this short run)",
            cfg.learning_rate.decay_steps
        )
    } else {
        String::new()
    };
    tracing::info!(
        "learning rate: exp from {:e} to {:.3e} at step {} (stop_lr {:e}), decay_steps {}{shrunk}, decay_rate {:.6}{}{}",
        schedule.start_lr,
        schedule.value(cfg.training.numb_steps.saturating_sub(1)),
        cfg.training.numb_steps,
        schedule.stop_lr,
        schedule.decay_steps,
        schedule.decay_rate,
        if schedule.smooth { ", smooth" } else { "" },
        if schedule.warmup_steps > 0 {
            format!(
                ", warmup {} steps from {:e}",
                schedule.warmup_steps,
                schedule.warmup_start_factor * schedule.start_lr
            )
        } else {
            String::new()
        }
    );
    Ok(TrainSetup {
        config: cfg,
        train,
        valid,
        model,
        precision,
        restart,
        seed,
        schedule,
        out_dir: out_dir.to_path_buf(),
        out_json: out_dir.join("out.json"),
        lock: None,
        progress: None,
        t0,
    })
}

/// Draws training batches and assembles them on a helper thread one step ahead, so the host
/// work of step t+1 overlaps the device work of step t. The sampler state it reports is the
/// one from which the next batch *handed out* is drawn, whatever has been prefetched.
///
/// With `size` data-parallel ranks every rank draws the global batch (`size` batches' worth of
/// frames) from the same sampler and assembles only its own slice of it ([`dist::rank_slice`]).
struct Prefetcher {
    sampler: Sampler,
    /// (sampler state before the draw, system, the rank's frames, frames in the global batch)
    /// of each batch requested and not yet handed out.
    pending: VecDeque<(Sampler, usize, Vec<usize>, usize)>,
    req: Option<mpsc::Sender<(usize, Vec<usize>)>>,
    res: mpsc::Receiver<Result<Option<HostBatch>>>,
    worker: Option<JoinHandle<()>>,
    /// (rank, size) of the data-parallel world.
    world: (usize, usize),
    batch_sizes: Vec<usize>,
}

impl Prefetcher {
    fn new(
        store: Arc<SystemStore>,
        spec: ModelSpec,
        sampler: Sampler,
        depth: usize,
        batch_sizes: Vec<usize>,
        world: (usize, usize),
        resident: Vec<bool>,
    ) -> Self {
        let (req_tx, req_rx) = mpsc::channel::<(usize, Vec<usize>)>();
        let (res_tx, res_rx) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("dpw-batches".into())
            .spawn(move || {
                for (s, frames) in req_rx {
                    let r = if frames.is_empty() || resident.get(s).copied().unwrap_or(false) {
                        Ok(None)
                    } else {
                        let sys = store.get(s).map_err(anyhow::Error::from);
                        sys.and_then(|sys| assemble_frames(&spec, &sys, &frames, "training"))
                            .map(Some)
                    };
                    if res_tx.send(r).is_err() {
                        break;
                    }
                }
            })
            .expect("cannot start the batch thread");
        let mut p = Prefetcher {
            sampler,
            pending: VecDeque::new(),
            req: Some(req_tx),
            res: res_rx,
            worker: Some(worker),
            world,
            batch_sizes,
        };
        for _ in 0..depth.max(1) {
            p.request();
        }
        p
    }

    fn request(&mut self) {
        let before = self.sampler.clone();
        let (rank, size) = self.world;
        let (s, frames) = self.sampler.next_batches(size);
        let mine = frames[dist::rank_slice(frames.len(), self.batch_sizes[s], rank)].to_vec();
        self.pending
            .push_back((before, s, mine.clone(), frames.len()));
        if let Some(tx) = &self.req {
            let _ = tx.send((s, mine));
        }
    }
}

impl Batches for Prefetcher {
    fn next(&mut self) -> Result<StepBatch> {
        let (_, sys, frames, nglobal) = self.pending.pop_front().expect("always one pending");
        let batch = self
            .res
            .recv()
            .map_err(|_| anyhow!("the batch thread stopped"))??;
        self.request();
        Ok(StepBatch {
            sys,
            frames,
            batch,
            nglobal,
        })
    }

    fn state(&self) -> Sampler {
        self.pending
            .front()
            .map_or_else(|| self.sampler.clone(), |(s, ..)| s.clone())
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.req = None;
        if let Some(w) = self.worker.take() {
            // Unblock the worker if it is waiting to send, then wait for it.
            while self.res.try_recv().is_ok() {}
            let _ = w.join();
        }
    }
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

fn to_f64<T: Real>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.f64()).collect()
}

/// Keeps the lines of an existing lcurve.out up to `step` (drops what a killed run wrote after
/// its last checkpoint), and opens it for appending.
fn reopen_lcurve(path: &Path, step: usize) -> Result<File> {
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
pub fn train<T: Real, B: Backend<T>>(b: &B, setup: TrainSetup) -> Result<TrainReport> {
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
    let spec = model.spec.clone();
    // Data-parallel over MPI (src/dist): rank 0 alone writes files and validates.
    let world = dist::world();
    let root = world.is_root();
    for l in dist::summary(world, &b.name()) {
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

    // Outputs: out.json first, as dp train does.
    let mut text = serde_json::to_string_pretty(&cfg.to_expanded_json())?;
    text.push('\n');
    if root {
        write_atomic(&out_json, text.as_bytes())?;
    }
    let save_ckpt = out_dir.join(&tc.save_ckpt);
    let lcurve_path = out_dir.join(&tc.disp_file);

    let start = restart.as_ref().map_or(0, |c| c.step);
    let mut model = model;
    world.broadcast_model(&mut model);
    let train_shape = shape(&train_data);
    let valid_shape = valid.as_ref().map(shape);
    // A restart on other data (or other batch sizes or probabilities) cannot continue the
    // checkpoint's batch stream; it starts a new one, seeded from the seed and the step.
    let stream_seed = seed.wrapping_add(start as u64);
    let new_train_sampler = || train_data.sampler(stream_seed);
    let new_valid_sampler = || {
        valid
            .as_ref()
            .map(|v| v.sampler(stream_seed ^ VALID_STREAM))
    };
    let (sampler, valid_sampler, resume) = match &restart {
        Some(ck) => {
            let ts = if ck.train_shape == train_shape {
                ck.sampler.clone()
            } else {
                tracing::warn!(
                    "the training data (frames per system, batch sizes or probabilities) differ \
                     from the checkpoint's: starting a new batch stream"
                );
                new_train_sampler()
            };
            let vs = if ck.valid_shape == valid_shape {
                ck.valid_sampler.clone()
            } else {
                tracing::warn!(
                    "the validation data differ from the checkpoint's: starting a new batch stream"
                );
                new_valid_sampler()
            };
            let resume = Resume {
                step: start,
                adam: Some((to_t(&ck.adam_m), to_t(&ck.adam_v))),
                disp_acc: ck.disp_acc,
            };
            (ts, vs, resume)
        }
        None => (new_train_sampler(), new_valid_sampler(), Resume::fresh()),
    };
    let mut rotation = if root {
        Some(Rotation::new(
            &save_ckpt,
            tc.max_ckpt_keep,
            restart.is_some(),
        )?)
    } else {
        None
    };
    drop(restart);

    let mut fout = if !root {
        None
    } else if start > 0 {
        Some(reopen_lcurve(&lcurve_path, start)?)
    } else {
        Some(
            File::create(&lcurve_path)
                .with_context(|| format!("cannot create {}", lcurve_path.display()))?,
        )
    };

    let mut save = |run: &Run<T, B>, step: usize, lr: f64| -> Result<PathBuf> {
        let dm = run.dm();
        let (sampler, valid_sampler, disp_acc) = run.checkpoint_state();
        let mut m = model.clone();
        m.params = dm.params_f64(b);
        let ck = Checkpoint {
            model: m,
            precision,
            step,
            lr,
            adam_m: to_f64(&b.download(&dm.m)),
            adam_v: to_f64(&b.download(&dm.v)),
            sampler,
            valid_sampler,
            train_shape: train_shape.clone(),
            valid_shape: valid_shape.clone(),
            disp_acc,
        };
        let rotation = rotation
            .as_mut()
            .context("internal: only rank 0 saves checkpoints")?;
        checkpoint::save(&ck, &save_ckpt, rotation)
    };

    let mut report = TrainReport {
        steps: 0,
        startup_s: 0.0,
        step_s: Vec::new(),
        wall_s: 0.0,
        s_per_step: 0.0,
        last_trn: None,
        last_val: None,
        last_ckpt: None,
    };
    // Only rank 0 validates.
    let validation = match (valid, valid_sampler) {
        (Some(data), Some(sampler)) if root => Some(Validation {
            data,
            sampler,
            nbatches: tc.validation_data.as_ref().map_or(1, |v| v.numb_btch),
        }),
        _ => None,
    };
    let systems = std::mem::take(&mut train_data.systems);
    let resident = if start < numb_steps {
        Resident::new(
            b,
            &spec,
            &systems,
            &train_data.batch_sizes,
            &train_data.store,
            resident::budget(b)?,
        )?
    } else {
        Resident::none()
    };
    let batches = Prefetcher::new(
        Arc::clone(&train_data.store),
        spec.clone(),
        sampler,
        1,
        train_data.batch_sizes.clone(),
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
        resume,
    );
    if start >= numb_steps {
        if start == 0 && root {
            // numb_steps 0: DeePMD-kit still saves the initial model.
            let p = save(&run, 0, 0.0)?;
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

    if let Some(bar) = &progress {
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
    report.startup_s = t0.elapsed().as_secs_f64();
    let t_loop = Instant::now();
    let mut t_disp = Instant::now();
    let mut last_disp_step = start;
    let mut timed = (0.0f64, 0usize);
    let mut driver = CliDriver {
        world,
        exchange: dist::GradExchange::default(),
        disp_freq: tc.disp_freq,
        signal: None,
    };

    while !run.is_done() {
        let t_step = Instant::now();
        let plan = run.step(b, &mut driver)?;
        report.step_s.push(t_step.elapsed().as_secs_f64());
        let done = plan.done;
        if done == start + 1 {
            tracing::info!(
                "first step done {:.2} s after start",
                t0.elapsed().as_secs_f64()
            );
        }
        if let Some(bar) = &progress {
            bar.set_position(done as u64);
        }
        let shown = block_on(run.finish(b, &mut driver))?;

        if let Some(shown) = shown {
            let lr = plan.lr;
            if let Some(fout) = fout.as_mut() {
                fout.write_all(shown.lcurve.as_bytes())
                    .and_then(|_| fout.flush())
                    .with_context(|| format!("cannot write {}", lcurve_path.display()))?;
            }

            let dt = t_disp.elapsed().as_secs_f64();
            let nsteps = done - last_disp_step;
            t_disp = Instant::now();
            last_disp_step = done;
            // As DeePMD-kit, leave the first interval (start-up) out of the average.
            if done - start > tc.disp_freq || numb_steps - start < 2 * tc.disp_freq {
                timed.0 += dt;
                timed.1 += nsteps;
            }
            tracing::info!(
                target: PROGRESS_TARGET,
                "batch {done:7}: trn: {}, lr = {}",
                fmt_metrics(&shown.trn),
                sci(lr, 2, 8)
            );
            if let Some(v) = &shown.val {
                tracing::info!(target: PROGRESS_TARGET, "batch {done:7}: val: {}", fmt_metrics(v));
            }
            if tc.time_training {
                let rate = nsteps as f64 / dt.max(1e-9);
                tracing::info!(
                    target: PROGRESS_TARGET,
                    "batch {done:7}: wall time {:.2} s for {nsteps} steps, {rate:.2} steps/s, eta {}",
                    dt,
                    fmt_duration((numb_steps - done) as f64 / rate)
                );
            }
            if let Some(bar) = &progress {
                let m = shown.val.as_ref().unwrap_or(&shown.trn);
                let mut msg = format!("{}:", if shown.val.is_some() { "val" } else { "trn" });
                for (k, v) in m.entries().iter().skip(1) {
                    msg.push_str(&format!(" {k} {}", sci(*v, 2, 8).trim_start()));
                }
                bar.set_message(msg);
            }
            report.last_trn = Some(shown.trn);
            report.last_val = shown.val;
            dist::log::flush(world);
        }

        if root && plan.checkpoint {
            let p = save(&run, done, plan.lr)?;
            tracing::info!("checkpoint saved to {}", p.display());
            run.set_last_checkpoint(p.clone());
            interrupt::note_checkpoint(&p);
            report.last_ckpt = Some(p);
        }
        if let (true, Some(signal)) = (plan.stop, driver.signal) {
            return Err(interrupt::Interrupted {
                signal,
                step: done,
                checkpoint: report.last_ckpt.filter(|_| root),
            }
            .into());
        }
    }
    drop(run);
    let wall = t_loop.elapsed().as_secs_f64();
    report.steps = numb_steps - start;
    report.wall_s = wall;
    report.s_per_step = if timed.1 > 0 {
        timed.0 / timed.1 as f64
    } else {
        wall / report.steps as f64
    };
    tracing::info!(
        "trained {} steps in {:.2} s: {:.4} s/step on average ({:.4} s/step leaving out the first display interval)",
        report.steps,
        wall,
        wall / report.steps as f64,
        report.s_per_step
    );
    if world.is_distributed() {
        let per_step = wall / report.steps as f64;
        tracing::info!("{}", driver.exchange.summary(world, per_step));
    }
    if root {
        tracing::info!("trained model has been saved to: {}", save_ckpt.display());
    }
    dist::log::flush(world);
    Ok(report)
}

/// What `dpw train` plugs into the [`Run`]: blocking reads, the MPI all-reduce and the
/// cross-rank check of the parameters, and Ctrl-C / SIGTERM.
struct CliDriver {
    world: &'static dist::World,
    exchange: dist::GradExchange,
    disp_freq: usize,
    /// The signal that asked for a stop.
    signal: Option<usize>,
}

impl<T: Real, B: Backend<T>> Driver<T, B> for CliDriver {
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

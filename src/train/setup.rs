//! What `dpw train` does before it trains: check the input, read the data, resolve `sel`,
//! compute (or load) the statistics and read any checkpoint, all before a single output file is
//! touched. [`prepare`] ends in a [`TrainSetup`] that `trainer::train` (or the web page) runs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use web_time::Instant;

use crate::config::{
    Config, DescriptorConfig, LossConfig, ModelConfig, Precision, Sel, SelList, TrainingConfig,
};
use crate::data::{Disk, Files};
use crate::dist;
use crate::fitting::traits::OutputStat;
use crate::geometry::EnvStats;
use crate::model::{
    read_model_to_train, DescriptorSpec, FittingSpec, Model, ModelSpec, OwnKeys, MAX_NNEI,
};

use super::batch::{check_mixed_batches, check_mixed_data, check_params};
use super::checkpoint::Checkpoint;
use super::dataset::{load_data_in, DataSet};
use super::lr::LrSchedule;
use super::outputs::{self, RunLock};
use super::stats::{
    auto_sel, data_stats, fit_input_norm, fit_input_sums, label_bias, load_training_with_stats,
    neighbor_and_data_stats, neighbor_stats, property_stats, stat_frames, DataStats, NeighborStats,
    Pass, StatDraw,
};

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
    /// `--finetune`: the same from a pretrained model (`what` names it), whose energy bias is
    /// then re-fitted on the training data (change-by-statistic); with `new_fitting`
    /// (`--model-branch RANDOM`) only its descriptor, with a new fitting net and the bias set by
    /// statistic. `new_types`: the elements of input.json's type_map the pretrained model
    /// lacks, whose davg/dstd come from the training data. `merged`: a task of a multi-task
    /// fine-tune to new elements, whose run puts in the new elements' davg/dstd merged over
    /// the tasks and then re-fits the bias as this says ([`TrainSetup::merged_refit`]).
    Finetune {
        model: Box<Model>,
        what: String,
        new_fitting: bool,
        new_types: Vec<usize>,
        merged: Option<Refit>,
    },
}

/// How a fine-tuned model's energy bias is re-fitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Refit {
    /// Kept (a multi-task head resumed as it is).
    None,
    /// Change-by-statistic (the pretrained fitting net).
    Change,
    /// Set-by-statistic (a new fitting net).
    Set,
}

impl Refit {
    /// The bias of `m` re-fitted on `frames` of `data`. A new fitting net of another type than
    /// `ener` starts from the output statistics its model drew from this data: that is the
    /// set-by-statistic. Changing another type's pretrained bias by statistic is not built.
    pub fn apply(self, m: &mut Model, data: &DataSet, frames: &[Vec<usize>]) -> Result<()> {
        let output = &m.spec.fitting.output;
        let fitting = output.fitting().type_name();
        match self {
            Refit::None => Ok(()),
            Refit::Set if !output.is_ener() => Ok(()),
            Refit::Change if !output.is_ener() => bail!(
                "fine-tuning the pretrained {fitting} fitting net changes its output bias by \
                 statistic, which dpw does for the ener fitting only; --model-branch RANDOM \
                 trains a new {fitting} fitting net on the pretrained descriptor"
            ),
            Refit::Change => super::finetune::change_by_statistic(m, data, frames),
            Refit::Set => super::finetune::set_by_statistic(m, data, frames),
        }
    }
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
    /// Wait for the device after every step, so that the step times in the report are the
    /// device's (`dpw bench`); training itself lets the host run ahead.
    pub wait_each_step: bool,
    /// The sums behind a new model's davg and dstd ([`DataStats::env`]; empty for a model
    /// given): what a multi-task run merges over its tasks.
    pub stat_env: Vec<EnvStats>,
    /// The sums behind a new model's fitting input statistics (empty for a model given or one
    /// without frame or atomic parameters): what a multi-task run merges for a shared fitting.
    pub fit_input_sums: Vec<[f64; 3]>,
    /// A task of a multi-task fine-tune to new elements (`Start::Finetune::merged`): what the
    /// run does once it has merged the new elements' statistics over the tasks (`stat_env`
    /// then holds this task's data's).
    pub merged_refit: Option<MergedRefit>,
}

/// What is left of a multi-task fine-tune to new elements for its run to do.
pub struct MergedRefit {
    pub refit: Refit,
    /// The bias frames.
    pub frames: Vec<Vec<usize>>,
    /// The elements new to the pretrained model.
    pub new_types: Vec<usize>,
}

/// Settings DeePMD-kit accepts that dpw stores but does not implement.
fn check_supported(cfg: &Config) -> Result<()> {
    let m = &cfg.model;
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
    if matches!(&cfg.loss, LossConfig::Ener(l) if l.relative_f.is_some()) {
        bail!("loss.relative_f: the relative force loss is not supported");
    }
    Ok(())
}

/// The precision dpw trains a model in: one for the whole model, float64 where the descriptor
/// (any part of a hybrid) or the fitting net asks for it (DeePMD-kit's `water_multi_task`
/// example gives its DPA-3 float32 and leaves the fitting net at float64), with a warning
/// where they differ.
fn model_precision(m: &ModelConfig) -> Precision {
    let d = &m.descriptor;
    let mut parts: Vec<(String, Precision)> = match d.own.list().is_empty() {
        true => vec![("model.descriptor.precision".into(), d.precision)],
        false => (d.own.list().iter().enumerate())
            .map(|(i, p)| (format!("model.descriptor.list[{i}].precision"), p.precision))
            .collect(),
    };
    parts.push((
        "model.fitting_net.precision".into(),
        m.fitting_net.precision,
    ));
    if parts.iter().all(|(_, p)| *p == parts[0].1) {
        return parts[0].1;
    }
    let given: Vec<String> = (parts.iter())
        .map(|(k, p)| format!("{k} ({})", p.as_str()))
        .collect();
    tracing::warn!(
        "{} differ: dpw trains the whole model in one precision, float64",
        given.join(", ")
    );
    Precision::F64
}

fn spec_of(cfg: &Config, sel: Vec<usize>) -> ModelSpec {
    let f = &cfg.model.fitting_net;
    let descriptor = descriptor_spec(&cfg.model.descriptor, sel);
    ModelSpec {
        short_range: (cfg.model.short_range.as_ref()).map(|p| p.short_range(descriptor.nnei())),
        linear: None,
        type_map: cfg.model.type_map.clone(),
        descriptor,
        fitting: FittingSpec {
            output: f.output.clone(),
            neuron: f.neuron.clone(),
            resnet_dt: f.resnet_dt,
            activation: f.activation,
            numb_fparam: f.numb_fparam,
            numb_aparam: f.numb_aparam,
            default_fparam: f.default_fparam.clone(),
            dim_case_embd: f.dim_case_embd,
        },
    }
}

/// The descriptor of input.json with `sel` (a hybrid's sub-descriptors have theirs as numbers).
/// DPA-1 (se_atten, se_atten_v2) keeps its attention keys and one mixed sel, the sum of the
/// list given (DeePMD-kit's nnei = Σ sel: one section).
pub fn descriptor_spec(d: &DescriptorConfig, sel: Vec<usize>) -> DescriptorSpec {
    if let OwnKeys::Hybrid(list) = &d.own {
        let list = (list.iter())
            .map(|p| {
                let Sel::Fixed(sel) = &p.sel else {
                    unreachable!("the config refuses sel \"auto\" inside hybrid")
                };
                descriptor_spec(p, sel.clone())
            })
            .collect();
        return DescriptorSpec::hybrid(list);
    }
    let sel = match d.kind.is_mixed() {
        true => vec![sel.iter().sum()],
        false => sel,
    };
    DescriptorSpec {
        kind: d.kind,
        rcut: d.rcut,
        rcut_smth: d.rcut_smth,
        sel,
        neuron: d.neuron.clone(),
        axis_neuron: d.axis_neuron,
        resnet_dt: d.resnet_dt,
        type_one_side: d.type_one_side,
        env_protection: d.env_protection,
        set_davg_zero: d.set_davg_zero,
        own: d.own.map_list(|_| unreachable!("a hybrid is made above")),
    }
}

fn check_same_spec(mine: &ModelSpec, theirs: &ModelSpec, what: &str) -> Result<()> {
    if mine == theirs {
        return Ok(());
    }
    bail!(
        "the model of {what} does not match input.json's: {}",
        mine.differences(theirs, "input.json", what).join("; ")
    )
}

pub(super) fn random_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 32)) % (1 << 31)
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
    let lock = claim_outputs(out_dir, &cfg.training)?;
    let mut setup = prepare_in(&Disk, cfg, start, neighbor_stat, out_dir, t0)?;
    setup.lock = lock;
    Ok(setup)
}

/// The output folders held for the run, by rank 0 alone (which alone writes the outputs).
pub(super) fn claim_outputs(out_dir: &Path, tc: &TrainingConfig) -> Result<Option<RunLock>> {
    match dist::world().is_root() {
        true => Ok(Some(outputs::claim(out_dir, tc)?)),
        false => Ok(None),
    }
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
    if cfg.model.linear.is_some() {
        return super::linear::prepare_in(fs, cfg, start, neighbor_stat, out_dir, t0);
    }
    check_supported(&cfg)?;
    let (seed, seed_note) = match cfg.training.seed {
        Some(s) => (s, ""),
        None => (random_seed(), " (training.seed not set: drawn at random)"),
    };
    let mut read = Reading::training(fs, &cfg, &start, neighbor_stat, seed)?;
    let t = &read.train;
    let ranks = dist::world().size();
    if let Some((steps, per_epoch)) =
        (cfg.training).steps_from_epochs(&t.nframes(), &t.batch_sizes, &t.probs, ranks)
    {
        tracing::info!(
            "numb_steps {steps}: numb_epoch {} of {per_epoch} batches{}",
            cfg.training.numb_epoch.expect("given"),
            if ranks > 1 { " per process" } else { "" }
        );
    }
    let valid = read_validation(fs, &cfg)?;
    let what = match &start {
        Start::Restart(_) => "the --restart checkpoint".to_string(),
        Start::InitModel(p) => format!("the --init-model file {}", p.display()),
        Start::InitFrozen(_) => "the -t/--init-frz-model model".to_string(),
        Start::Finetune { what, .. } => format!("the --finetune model {what}"),
        Start::Fresh => String::new(),
    };
    let finetune = matches!(start, Start::Finetune { .. });
    let new_fitting = matches!(
        start,
        Start::Finetune {
            new_fitting: true,
            ..
        }
    );
    let (new_types, merged) = match &start {
        Start::Finetune {
            new_types, merged, ..
        } => (new_types.clone(), *merged),
        _ => (Vec::new(), None),
    };
    let mut merged_refit = None;
    let (restart, init) = open_start(start)?;
    let given = restart.as_ref().map(|c| &c.model).or(init.as_ref());

    let spec = resolve_spec(&mut cfg, given, &mut read)?;
    for (data, key) in std::iter::once((&read.train, "training_data"))
        .chain(valid.iter().map(|v| (v, "validation_data")))
    {
        if data.mixed.is_some() {
            check_mixed_batches(&spec, &format!("training.{key}.batch_size"))?;
        }
        for sys in &data.systems {
            check_mixed_data(&spec, &sys.path, sys.mixed)?;
            check_params(&spec, sys)?;
        }
    }
    if let Some(m) = given {
        let mut theirs = m.spec.clone();
        if new_fitting {
            // Only the descriptor is the pretrained model's.
            theirs.fitting = spec.fitting.clone();
            theirs.short_range = spec.short_range.clone();
        }
        check_same_spec(&spec, &theirs, &what)?;
    }
    let precision = model_precision(&cfg.model);
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
    if read.check_sel && given.is_some() {
        let ns = read.neighbours()?;
        read.warn_small_sel(&ns, &spec.descriptor)?;
    }
    let model = if let Some(ck) = &restart {
        tracing::info!("restarting from step {} (lr {:.3e})", ck.step, ck.lr);
        ck.model.clone()
    } else {
        let init_seed = cfg
            .model
            .descriptor
            .seed
            .or(cfg.model.fitting_net.seed)
            .unwrap_or(seed);
        match init {
            Some(pre) if new_fitting => {
                let mut m = read.new_model(spec, init_seed, &cfg.model)?;
                // DeePMD-kit copies the tensors whose names hold `.descriptor.` (§21.4).
                let dlen = m.layout().descriptor_len();
                m.params[..dlen].copy_from_slice(&pre.params[..dlen]);
                let own = (std::mem::take(&mut m.davg), std::mem::take(&mut m.dstd));
                (m.davg, m.dstd) = (pre.davg, pre.dstd);
                let frames = read.finetune_frames();
                match merged {
                    Some(refit) => {
                        merged_refit = Some(MergedRefit {
                            refit,
                            frames,
                            new_types: new_types.clone(),
                        })
                    }
                    None => {
                        new_elements_of_data(&mut m, &own, &new_types);
                        Refit::Set.apply(&mut m, &read.train, &frames)?;
                    }
                }
                m
            }
            Some(mut m) => {
                if finetune {
                    let frames = read.finetune_frames();
                    if !new_types.is_empty() {
                        let ntypes = read.type_map.len();
                        let d = &m.spec.descriptor;
                        let mut st = data_stats(d, ntypes, &read.train, &frames)?;
                        fix_stat_std(d, &mut st.davg, &mut st.dstd);
                        match merged {
                            Some(_) => read.stat_env = st.env,
                            None => new_elements_of_data(&mut m, &(st.davg, st.dstd), &new_types),
                        }
                    }
                    match merged {
                        Some(refit) => {
                            merged_refit = Some(MergedRefit {
                                refit,
                                frames,
                                new_types: new_types.clone(),
                            })
                        }
                        None => Refit::Change.apply(&mut m, &read.train, &frames)?,
                    }
                }
                m
            }
            None => read.new_model(spec, init_seed, &cfg.model)?,
        }
    };
    log_model(&model, precision);
    let schedule = LrSchedule::new(&cfg.learning_rate, cfg.training.numb_steps);
    log_schedule(&schedule, &cfg);
    Ok(TrainSetup {
        config: cfg,
        train: read.train,
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
        wait_each_step: false,
        stat_env: read.stat_env,
        fit_input_sums: read.fit_input_sums,
        merged_refit,
    })
}

/// A fine-tuned model's davg/dstd rows of the elements the pretrained model lacks
/// (`new_types`): those of the model's own statistics on the training data (`own`), in every
/// statistics block, as DeePMD-kit appends them (spec §21.5).
pub(super) fn new_element_statistics(
    m: &mut Model,
    own: &(Vec<f64>, Vec<f64>),
    new_types: &[usize],
) {
    if new_types.is_empty() {
        return;
    }
    let nt = m.spec.ntypes();
    let k = m.davg.len() / (m.spec.descriptor.stat_blocks() * nt);
    for (mine, theirs) in [(&mut m.davg, &own.0), (&mut m.dstd, &own.1)] {
        for block in 0..m.spec.descriptor.stat_blocks() {
            for &t in new_types {
                let at = (block * nt + t) * k;
                mine[at..at + k].copy_from_slice(&theirs[at..at + k]);
            }
        }
    }
}

/// The names of `new_types` in `m`'s type map, for the log.
pub(super) fn element_names(m: &Model, new_types: &[usize]) -> String {
    let names: Vec<&str> = (new_types.iter())
        .map(|&t| m.spec.type_map[t].as_str())
        .collect();
    names.join(", ")
}

/// [`new_element_statistics`] of a single-task fine-tune, said in the log.
fn new_elements_of_data(m: &mut Model, own: &(Vec<f64>, Vec<f64>), new_types: &[usize]) {
    if new_types.is_empty() {
        return;
    }
    new_element_statistics(m, own, new_types);
    tracing::info!(
        "new elements {}: type-embedding rows drawn uniform in [0, 1), davg/dstd from the \
         training data, bias re-fitted",
        element_names(m, new_types)
    );
}

/// The training data as read, with what was computed on it while reading (the neighbour counts,
/// a new model's statistics), kept until the steps after the reading ask for them.
struct Reading {
    train: DataSet,
    type_map: Vec<String>,
    rcut: f64,
    /// Whether the descriptor's one neighbour list holds all types together (DPA-1), so that
    /// its sel is checked against, and "auto" made from, the count of all types together.
    mixed: bool,
    /// Whether a fixed sel is checked against the data's neighbour counts, as dp train does (one
    /// smaller than them drops neighbours).
    check_sel: bool,
    draw: StatDraw,
    t_read: Instant,
    early_neighbours: Option<NeighborStats>,
    early_stats: Option<DataStats>,
    /// The sums of a new model's environment statistics ([`DataStats::env`]).
    stat_env: Vec<EnvStats>,
    /// The sums of a new model's fitting input statistics ([`fit_input_sums`]).
    fit_input_sums: Vec<[f64; 3]>,
    /// The largest neighbour counts at cut-offs other than the descriptor's: (rcut, all types
    /// together, counts), each counted once ([`Reading::max_count_at`]).
    counted: Vec<(f64, bool, Vec<usize>)>,
}

impl Reading {
    /// Reads the training systems, computing on each as it is read the neighbour counts when
    /// they will be needed, and a new model's data statistics when its sel is known already (a
    /// model the statistics could not be computed for is refused after the reading).
    fn training(
        fs: &dyn Files,
        cfg: &Config,
        start: &Start,
        neighbor_stat: bool,
        seed: u64,
    ) -> Result<Self> {
        let d = &cfg.model.descriptor;
        let type_map = cfg.model.type_map.clone();
        let fresh = matches!(start, Start::Fresh);
        let check_sel = match &d.sel {
            Sel::Fixed(s) => neighbor_stat && s.iter().sum::<usize>() <= MAX_NNEI,
            Sel::Auto(_) => false,
        };
        let early_spec = match &d.sel {
            Sel::Fixed(s) if fresh => Some(spec_of(cfg, s.clone())).filter(|m| m.check().is_ok()),
            _ => None,
        };
        let pass = Pass {
            ntypes: type_map.len(),
            count: (check_sel || (fresh && matches!(d.sel, Sel::Auto(_)))).then_some(d.rcut),
            mixed: d.kind.is_mixed(),
            stat: early_spec.as_ref().map(|m| &m.descriptor),
        };
        let draw = StatDraw {
            nbatch: cfg.model.data_stat_nbatch,
            batch_factor: dist::world().size(),
            seed: seed ^ STAT_SEED,
        };
        let t_read = Instant::now();
        let (train, early_neighbours, early_stats) = load_training_with_stats(
            fs,
            &cfg.training.training_data,
            &type_map,
            d.rcut,
            pass,
            &draw,
            &(cfg.model.fitting_net.output.fitting()).labels(Some(&cfg.loss), true),
        )?;
        for l in train.summary("training") {
            tracing::info!("{l}");
        }
        for l in train.element_counts(&type_map) {
            tracing::info!("{l}");
        }
        Ok(Reading {
            train,
            type_map,
            rcut: d.rcut,
            mixed: d.kind.is_mixed(),
            check_sel,
            draw,
            t_read,
            early_neighbours,
            early_stats,
            stat_env: Vec::new(),
            fit_input_sums: Vec::new(),
            counted: Vec::new(),
        })
    }

    fn log_neighbours(&self, ns: &NeighborStats, since: Instant) {
        let counts = match self.mixed {
            true => format!("{} (all types together)", ns.max_count[0]),
            false => format!("per type {:?} ({})", ns.max_count, self.type_map.join(", ")),
        };
        tracing::info!(
            "neighbour statistics over {} training frames (rcut {}): max neighbours {counts}, min pair distance {:.4} ({:.2} s)",
            ns.nframes,
            self.rcut,
            ns.min_dist,
            since.elapsed().as_secs_f64()
        );
    }

    /// The neighbour counts: those computed while reading, else a scan now.
    fn neighbours(&mut self) -> Result<NeighborStats> {
        if let Some(ns) = self.early_neighbours.take() {
            self.log_neighbours(&ns, self.t_read);
            return Ok(ns);
        }
        let t = Instant::now();
        let ns = neighbor_stats(&self.train, self.type_map.len(), self.rcut, self.mixed)?;
        self.log_neighbours(&ns, t);
        Ok(ns)
    }

    /// Warns where `d`'s sel is below the data's neighbour counts `ns` (at `d.rcut`), as
    /// DeePMD-kit's `update_sel` does: a mixed-type descriptor's one sel (nnei) against the count
    /// of all types together (and DPA-2's and DPA-3's other lists against the count at their
    /// own rcut), a hybrid's sub-descriptors each against the counts at its own rcut, and a sel
    /// of 0 not at all (a type left out on purpose).
    fn warn_small_sel(&mut self, ns: &NeighborStats, d: &DescriptorSpec) -> Result<()> {
        if self.mixed {
            let mut lists = vec![(
                "sel (one list for all types)".to_string(),
                d.rcut,
                d.sel.iter().sum::<usize>(),
            )];
            for (list, rcut, n) in SelList::of_descriptor(d) {
                let what = format!("model.descriptor.{} (all types, rcut {rcut})", list.key());
                lists.push((what, rcut, n));
            }
            for (what, rcut, have) in lists {
                let want = match rcut == self.rcut {
                    true => ns.max_count[0],
                    false => self.max_count_at(rcut, true)?[0],
                };
                if have != 0 && have < want {
                    tracing::warn!(
                        "{what} is not enough! The expected value is not less than {want} (the \
                         most neighbours of all types together), but you set it to {have}. The \
                         accuracy of your model may get worse."
                    );
                }
            }
            return Ok(());
        }
        if d.own.list().is_empty() {
            self.warn_small_types(&ns.max_count, &d.sel, "");
            return Ok(());
        }
        for (i, sub) in d.own.list().iter().enumerate() {
            let counts = match sub.rcut == self.rcut {
                true => ns.max_count.clone(),
                false => self.max_count_at(sub.rcut, false)?,
            };
            let what = format!(
                " in model.descriptor.list[{i}] ({}, rcut {})",
                sub.kind.as_str(),
                sub.rcut
            );
            self.warn_small_types(&counts, &sub.sel, &what);
        }
        Ok(())
    }

    /// The largest neighbour counts of the training data within `rcut` (of all types together
    /// where `mixed`, else per type), counted once per cut-off: DPA-2's and DPA-3's lists are
    /// counted for "auto" and again checked against their sel.
    fn max_count_at(&mut self, rcut: f64, mixed: bool) -> Result<Vec<usize>> {
        if let Some((.., c)) = (self.counted.iter()).find(|(r, m, _)| *r == rcut && *m == mixed) {
            return Ok(c.clone());
        }
        let c = neighbor_stats(&self.train, self.type_map.len(), rcut, mixed)?.max_count;
        self.counted.push((rcut, mixed, c.clone()));
        Ok(c)
    }

    fn warn_small_types(&self, max_count: &[usize], sel: &[usize], what: &str) {
        for (t, (&want, &have)) in max_count.iter().zip(sel).enumerate() {
            if have != 0 && have < want {
                tracing::warn!(
                    "sel of type {t} ({}){what} is not enough! The expected value is not less \
                     than {want}, but you set it to {have}. The accuracy of your model \
                     may get worse.",
                    self.type_map[t]
                );
            }
        }
    }

    /// The training systems' batch sizes over all data-parallel ranks.
    fn global_batch_sizes(&self) -> Vec<usize> {
        (self.train.batch_sizes.iter())
            .map(|b| b * self.draw.batch_factor)
            .collect()
    }

    /// The statistics frames of each training system: `data_stat_nbatch` global batches.
    fn stat_frames(&self) -> Vec<Vec<usize>> {
        stat_frames(
            &self.train.systems,
            &self.global_batch_sizes(),
            self.draw.nbatch,
            self.draw.seed,
        )
    }

    /// Fine-tuning's bias frames: DeePMD-kit's PyTorch takes the first data_stat_nbatch batches
    /// of each system's loader, every frame at most once, so all of them where those batches
    /// cover the system; where they do not, its subset is random, and dpw's draw stands in.
    fn finetune_frames(&self) -> Vec<Vec<usize>> {
        let drawn = self.stat_frames();
        let bs = self.global_batch_sizes();
        (self.train.systems.iter().enumerate())
            .map(|(s, sys)| match self.draw.nbatch * bs[s] >= sys.nframes {
                true => (0..sys.nframes).collect(),
                false => drawn[s].clone(),
            })
            .collect()
    }

    /// A new model of `spec` with parameters from `init_seed` and the data statistics over
    /// `data_stat_nbatch` global batches (with N data-parallel ranks N × batch_size).
    fn new_model(&mut self, spec: ModelSpec, init_seed: u64, cfg: &ModelConfig) -> Result<Model> {
        let data_stat_nbatch = cfg.data_stat_nbatch;
        let mut m = Model::new(spec.clone(), init_seed);
        let mut t = Instant::now();
        let st = if let Some(st) = self.early_stats.take() {
            t = self.t_read;
            if let Some(ns) = self.early_neighbours.take() {
                self.log_neighbours(&ns, t);
                self.warn_small_sel(&ns, &spec.descriptor)?;
            }
            st
        } else {
            let frames = self.stat_frames();
            let ntypes = self.type_map.len();
            if self.check_sel {
                let (ns, st) =
                    neighbor_and_data_stats(&spec.descriptor, ntypes, &self.train, &frames)?;
                self.log_neighbours(&ns, t);
                self.warn_small_sel(&ns, &spec.descriptor)?;
                st
            } else {
                data_stats(&spec.descriptor, ntypes, &self.train, &frames)?
            }
        };
        let mut st = st;
        fix_stat_std(&spec.descriptor, &mut st.davg, &mut st.dstd);
        tracing::info!(
            "statistics over {} frames ({} batches per system): davg {:?}, dstd {:?}{} ({:.2} s)",
            st.nframes,
            data_stat_nbatch,
            st.davg.chunks(4).map(|r| r[0]).collect::<Vec<_>>(),
            st.dstd.chunks(4).map(|r| [r[0], r[1]]).collect::<Vec<_>>(),
            match spec.fitting.output.is_ener() {
                true => format!(
                    ", energy bias {:?} ({}), residual std {:.4}",
                    st.bias,
                    self.type_map.join(", "),
                    st.residual_std
                ),
                false => String::new(),
            },
            t.elapsed().as_secs_f64(),
        );
        (m.davg, m.dstd) = (st.davg, st.dstd);
        self.stat_env = st.env;
        let fitting = spec.fitting.output.fitting();
        match fitting.output_stat() {
            OutputStat::EnergyBias => m.bias = st.bias,
            OutputStat::LabelBias {
                name,
                what,
                exclude,
            } => {
                let t = Instant::now();
                let k = fitting.label_width();
                let frames = self.stat_frames();
                let ntypes = self.type_map.len();
                m.bias = label_bias(name, k, exclude, ntypes, &self.train, &frames)?;
                tracing::info!(
                    "output bias of the {what}: {:?} ({:.2} s)",
                    m.bias,
                    t.elapsed().as_secs_f64()
                );
            }
            OutputStat::Property(p) => {
                let t = Instant::now();
                let frames = self.stat_frames();
                let (bias, std) = property_stats(p, self.type_map.len(), &self.train, &frames)?;
                tracing::info!(
                    "output statistics of {:?} (task_dim {}, {}): bias {bias:?}, std {std:?} \
                     ({:.2} s)",
                    p.property_name,
                    p.task_dim,
                    if p.intensive {
                        "intensive"
                    } else {
                        "extensive"
                    },
                    t.elapsed().as_secs_f64()
                );
                (m.bias, m.out_std) = (bias, std);
            }
        }
        if spec.fitting.param_inputs() > 0 {
            let t = Instant::now();
            let frames = self.stat_frames();
            self.fit_input_sums = fit_input_sums(&spec.fitting, &self.train, &frames)?;
            let (avg, inv_std) = fit_input_norm(&self.fit_input_sums, cfg.data_stat_protect);
            tracing::info!(
                "fitting input statistics (numb_fparam {}, numb_aparam {}): avg {avg:?}, \
                 inv_std {inv_std:?} ({:.2} s)",
                spec.fitting.numb_fparam,
                spec.fitting.numb_aparam,
                t.elapsed().as_secs_f64()
            );
            (m.fit_input_avg, m.fit_input_inv_std) = (avg, inv_std);
        }
        Ok(m)
    }
}

/// DPA-3 with fix_stat_std ≠ 0: davg 0 and dstd that constant, whatever the data
/// (docs/deepmd-spec.md §18.8).
pub fn fix_stat_std(d: &DescriptorSpec, davg: &mut [f64], dstd: &mut [f64]) {
    if let Some(c) = d.own.dpa3().filter(|c| c.fix_stat_std != 0.0) {
        davg.fill(0.0);
        dstd.fill(c.fix_stat_std);
    }
}

fn read_validation(fs: &dyn Files, cfg: &Config) -> Result<Option<DataSet>> {
    let Some(v) = &cfg.training.validation_data else {
        return Ok(None);
    };
    let d = load_data_in(
        fs,
        &v.data,
        &cfg.model.type_map,
        cfg.model.descriptor.rcut,
        "validation",
        &(cfg.model.fitting_net.output.fitting()).labels(Some(&cfg.loss), true),
    )?;
    for l in d.summary("validation") {
        tracing::info!("{l}");
    }
    Ok(Some(d))
}

/// The checkpoint a restart continues, or the model a new run takes its parameters from.
pub(super) fn open_start(start: Start) -> Result<(Option<Box<Checkpoint>>, Option<Model>)> {
    Ok(match start {
        Start::Fresh => (None, None),
        Start::Restart(ck) => (Some(ck), None),
        Start::InitModel(p) => {
            if !p.exists() {
                bail!("--init-model: {} does not exist", p.display());
            }
            let m = read_model_to_train(&p).context("--init-model")?;
            tracing::info!("initial parameters and statistics from {}", p.display());
            (None, Some(m))
        }
        Start::InitFrozen(m) | Start::Finetune { model: m, .. } => (None, Some(*m)),
    })
}

/// The model input.json asks for, with `sel` resolved (from a `given` model, or `auto` from the
/// data's neighbour counts) and written back into `cfg` as numbers (what out.json holds).
fn resolve_spec(cfg: &mut Config, given: Option<&Model>, read: &mut Reading) -> Result<ModelSpec> {
    let sel = match (&cfg.model.descriptor.sel, given) {
        (Sel::Auto(_), Some(m)) => {
            tracing::info!(
                "sel {:?} taken from the checkpoint (input.json asks for auto)",
                m.spec.descriptor.sel
            );
            m.spec.descriptor.sel.clone()
        }
        (Sel::Auto(factor), None) => {
            let sel = auto_sel(&read.neighbours()?.max_count, *factor);
            tracing::info!("sel = {sel:?} (auto, factor {factor})");
            sel
        }
        (Sel::Fixed(s), _) => s.clone(),
    };
    // DPA-2's and DPA-3's other lists, each counted at its own rcut (all types together).
    for a in std::mem::take(&mut cfg.model.descriptor.auto_lists) {
        let key = a.list.key();
        let n = match given.and_then(|m| a.list.of_spec(&m.spec.descriptor)) {
            Some(n) => {
                tracing::info!("{key} {n} taken from the checkpoint (input.json asks for auto)");
                n
            }
            None => {
                let t = Instant::now();
                let counts = read.max_count_at(a.rcut, true)?;
                let n = auto_sel(&counts, a.factor)[0];
                tracing::info!(
                    "{key} = {n} (auto, factor {}: at most {} neighbours within {} Å; {:.2} s)",
                    a.factor,
                    counts[0],
                    a.rcut,
                    t.elapsed().as_secs_f64()
                );
                n
            }
        };
        a.list.set(&mut cfg.model.descriptor, n);
    }
    let spec = spec_of(cfg, sel.clone());
    spec.check().context("the model of input.json")?;
    cfg.model.descriptor.sel = Sel::Fixed(sel);
    Ok(spec)
}

fn log_model(model: &Model, precision: Precision) {
    let spec = &model.spec;
    let layout = model.layout();
    // The descriptor's tensors come first, the fitting's after them.
    let nfit: usize = (layout.fitting.nets.iter())
        .flat_map(|n| &n.layers)
        .map(|l| l.nin * l.nout + l.nout * (1 + usize::from(l.idt.is_some())))
        .sum();
    tracing::info!(
        "model: {}, fitting {:?}; {} parameters ({} descriptor, {} fitting), {}",
        spec.descriptor.describe(),
        spec.fitting.neuron,
        layout.len,
        layout.len - nfit,
        nfit,
        precision.as_str()
    );
}

fn log_schedule(schedule: &LrSchedule, cfg: &Config) {
    let numb_steps = cfg.training.numb_steps;
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
        schedule.value(numb_steps.saturating_sub(1)),
        numb_steps,
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
}

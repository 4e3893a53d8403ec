//! Multi-task training (DeePMD-kit's multi-task input, docs/deepmd-spec.md §21.3): one model
//! per task, each with its own energy bias, loss, data and validation, and its own fitting net
//! or one shared with other tasks (told apart by the case embedding), all sharing the first
//! task's descriptor: its parameters, its Adam moments, and statistics merged over the tasks as
//! DeePMD-kit's `share_params` merges them.
//!
//! Each task is set up as the single-task input it stands for ([`setup::prepare_in`]); then the
//! parts are shared (`share_parts`). `run.rs` trains them, `checkpoint.rs` saves them.

mod checkpoint;
mod run;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use web_time::Instant;

use crate::config::multitask::MultiTaskConfig;
use crate::config::multitask::TaskConfig;
use crate::data::{Disk, Files};
use crate::dist;
use crate::model::{new_elements, read_model_head, Model, ModelFile};

use super::lr::LrSchedule;
use super::outputs::RunLock;
use super::setup::{
    self, element_names, fix_stat_std, new_element_statistics, Refit, Start, TrainSetup,
};
use super::stats::{env_davg_dstd, fit_input_norm};

pub use checkpoint::{HeadCheckpoint, MultiCheckpoint};
pub use run::train;

/// Everything checked and loaded before a multi-task run; nothing has been written yet.
pub struct MultiTaskSetup {
    /// The input, each task's `sel` resolved (what out.json holds).
    pub config: MultiTaskConfig,
    /// Per task, in `model_dict` order: its data, and its model with the shared descriptor.
    pub tasks: Vec<TrainSetup>,
    /// Per task, its steps so far (Adam's count of its fitting net's steps).
    pub updates: Vec<usize>,
    /// The first parameters of every task's vector, which all the tasks share: the
    /// descriptor's (its type embedding's at shared level 1). The rest, the fitting net, is
    /// shared by the tasks of one [`MultiTaskConfig::fitting_group`].
    pub shared: usize,
    /// Seed of the task draw.
    pub seed: u64,
    pub progress: Option<ProgressBar>,
    /// The expanded input (`dp train -o`; out.json in the output folder by default).
    pub out_json: PathBuf,
    lock: Option<RunLock>,
}

/// How a multi-task run starts.
pub enum MultiStart {
    Fresh,
    /// `--init-model`: a multi-task checkpoint (DeePMD-kit's `.pt` or dpw's) whose heads named
    /// as the tasks give their parameters and statistics, as DeePMD-kit's `--init-model` of a
    /// multi-task input takes them.
    InitModel(PathBuf),
    /// `--restart`: continue a multi-task run's checkpoint.
    Restart(MultiCheckpoint),
    /// `--finetune`: each task from a pretrained model as DeePMD-kit's rules give it
    /// (`finetune_start`).
    Finetune(PathBuf),
}

/// [`prepare_in`] on disk, holding the output folders for the run (rank 0).
pub fn prepare(
    config: MultiTaskConfig,
    start: MultiStart,
    neighbor_stat: bool,
    out_dir: &Path,
    t0: Instant,
) -> Result<MultiTaskSetup> {
    let lock = setup::claim_outputs(out_dir, config.training())?;
    let mut setup = prepare_in(&Disk, config, start, neighbor_stat, out_dir, t0)?;
    setup.lock = lock;
    Ok(setup)
}

/// Sets up every task of `config` on the data of `fs` from `start`, then shares the
/// descriptor (a new run) or checks that it is shared.
pub fn prepare_in(
    fs: &dyn Files,
    mut config: MultiTaskConfig,
    start: MultiStart,
    neighbor_stat: bool,
    out_dir: &Path,
    t0: Instant,
) -> Result<MultiTaskSetup> {
    let seed = match (&start, config.training().seed) {
        (MultiStart::Restart(ck), _) => ck.seed,
        (_, Some(s)) => s,
        (_, None) => {
            let s = setup::random_seed();
            tracing::info!("seed {s} (training.seed not set: drawn at random)");
            s
        }
    };
    let n = config.tasks.len();
    let names: Vec<&str> = config.tasks.iter().map(|t| t.name.as_str()).collect();
    let draw = match &config.num_epoch {
        Some(_) => "with probabilities from num_epoch_dict".to_string(),
        None => format!("with probabilities {:?}", config.model_prob),
    };
    let part = match config.descriptor_level {
        0 => "the descriptor",
        _ => "the type embedding (shared level 1) of the descriptor",
    };
    tracing::info!(
        "multi-task training: {n} tasks ({}) sharing {part} '{}', drawn {draw}",
        names.join(", "),
        config.descriptor_key,
    );
    let (from, restart, pretrained) = match start {
        MultiStart::Fresh => (None, None, None),
        MultiStart::InitModel(p) => (Some(p), None, None),
        MultiStart::Finetune(p) => {
            // Read once: every task takes its head or the shared descriptor from it.
            let file =
                ModelFile::open(&p).with_context(|| format!("--finetune {}", p.display()))?;
            let heads = file.heads();
            (None, None, Some((file, heads)))
        }
        MultiStart::Restart(ck) => {
            let heads: Vec<&str> = ck.heads.iter().map(|h| h.name.as_str()).collect();
            if heads != names {
                bail!(
                    "the checkpoint's heads ({}) are not the input's tasks ({}): a restart \
                     continues the run of the same tasks",
                    heads.join(", "),
                    names.join(", ")
                );
            }
            (None, Some(ck), None)
        }
    };
    let init = from.as_deref();
    let updates =
        (restart.as_ref()).map_or(vec![0; n], |c| c.heads.iter().map(|h| h.updates).collect());
    let mut tasks = Vec::with_capacity(n);
    for (k, t) in config.tasks.iter_mut().enumerate() {
        tracing::info!("task '{}' ({} of {n}):", t.name, k + 1);
        // Task k's batches, statistics frames and new fitting net from seed + k: the first task
        // is set up as its input alone would be.
        t.config.training.seed = Some(seed.wrapping_add(k as u64));
        let start = match init {
            Some(p) => {
                let m = read_model_head(p, Some(&t.name)).with_context(|| {
                    format!(
                        "--init-model {}: the head of task '{}'",
                        p.display(),
                        t.name
                    )
                })?;
                tracing::info!(
                    "initial parameters and statistics from head '{}' of {}",
                    t.name,
                    p.display()
                );
                Start::InitFrozen(Box::new(m))
            }
            None => match (restart.as_ref(), &pretrained) {
                (Some(ck), _) => Start::Restart(Box::new(ck.heads[k].ck.clone())),
                (None, Some((f, heads))) => finetune_start(f, t, heads).with_context(|| {
                    format!("--finetune {}: task '{}'", f.path().display(), t.name)
                })?,
                (None, None) => Start::Fresh,
            },
        };
        let s = setup::prepare_in(fs, t.config.clone(), start, neighbor_stat, out_dir, t0)
            .with_context(|| format!("task '{}'", t.name))?;
        t.config = s.config.clone();
        tasks.push(s);
    }
    if let Some(epochs) = config.num_epoch.clone() {
        steps_from_epochs(&mut config, &mut tasks, &epochs);
    }
    merge_new_elements(&mut tasks)?;
    let shared = shared_len(&tasks, &config)?;
    match (init, &restart, &pretrained) {
        (None, None, None) => {
            share_parts(&mut tasks, &config, seed)?;
            // A new run's alone: DeePMD-kit sets them only "when from scratch".
            for (s, c) in tasks.iter_mut().zip(config.case_embeddings()) {
                s.model.case_embd = c;
            }
        }
        (Some(p), _, _) => check_shared(
            &tasks,
            &config,
            shared,
            &format!("--init-model {}", p.display()),
        )?,
        (None, Some(_), _) => check_shared(&tasks, &config, shared, "the --restart checkpoint")?,
        (None, None, Some((f, _))) => check_shared(
            &tasks,
            &config,
            shared,
            &format!("--finetune {}", f.path().display()),
        )?,
    }
    Ok(MultiTaskSetup {
        config,
        tasks,
        updates,
        shared,
        seed,
        progress: None,
        out_json: out_dir.join("out.json"),
        lock: None,
    })
}

/// Task `t`'s start from the pretrained model at `path` (with `heads`), by DeePMD-kit's rules
/// (docs/deepmd-spec.md §21.4): its `finetune_head` H → head H, its bias re-fitted by
/// change-by-statistic; no finetune_head and a head of its name → that head, resumed as it is;
/// otherwise the pretrained descriptor under a new fitting net, the bias set by statistic. The
/// model on the task's type_map in each case.
fn finetune_start(file: &ModelFile, t: &TaskConfig, heads: &[String]) -> Result<Start> {
    let (path, type_map) = (file.path(), &t.config.model.type_map);
    let resumed = t.finetune_head.is_none() && heads.contains(&t.name);
    let (model, what, new_fitting) = match (&t.finetune_head, resumed) {
        (Some(h), _) => (
            file.model(Some(h))?.model,
            format!("head {h} of {}", path.display()),
            false,
        ),
        (None, true) => (
            file.model(Some(&t.name))?.model,
            format!("head {} of {}", t.name, path.display()),
            false,
        ),
        (None, false) => (
            file.shared_descriptor(heads)?,
            format!("{} (its descriptor, a new fitting net)", path.display()),
            true,
        ),
    };
    let new_types = new_elements(&model.spec.type_map, type_map);
    // Every task draws the new elements' type-embedding rows from one seed: the same rows in
    // the descriptor they share.
    let model = Box::new(model.with_type_map(type_map, 0)?);
    let refit = match (resumed, new_fitting) {
        (true, _) => Refit::None,
        (false, true) => Refit::Set,
        (false, false) => Refit::Change,
    };
    match resumed {
        true => tracing::info!("task '{}' resumes {what} as it is", t.name),
        false => tracing::info!("task '{}' is fine-tuned from {what}", t.name),
    }
    Ok(match (resumed, new_types.is_empty()) {
        (true, true) => Start::InitFrozen(model),
        _ => Start::Finetune {
            model,
            what,
            new_fitting,
            merged: (!new_types.is_empty()).then_some(refit),
            new_types,
        },
    })
}

/// The shared descriptor's davg/dstd from every task's statistics, their sums added in task
/// order (DeePMD-kit's `share_params`).
fn summed_statistics(tasks: &[TrainSetup]) -> (Vec<f64>, Vec<f64>) {
    let d = &tasks[0].model.spec.descriptor;
    let mut env = tasks[0].stat_env.clone();
    for s in &tasks[1..] {
        for (mine, theirs) in env.iter_mut().zip(&s.stat_env) {
            mine.add(theirs);
        }
    }
    let (mut davg, mut dstd) = env_davg_dstd(d, &env);
    fix_stat_std(d, &mut davg, &mut dstd);
    (davg, dstd)
}

/// A fine-tune to elements the pretrained model lacks: their davg/dstd in every task from the
/// statistics of all the tasks' data, their sums added (the descriptor is one), then each
/// task's bias re-fitted as its start says (`TrainSetup::merged_refit`). The pretrained
/// elements keep their statistics: DeePMD-kit 3.2.0 recomputes those too from the new data
/// (its `share_params` after the fine-tune's load, even of elements no task's data has),
/// which throws away what the pretrained descriptor was normalised by (spec §21.4).
fn merge_new_elements(tasks: &mut [TrainSetup]) -> Result<()> {
    if tasks.iter().all(|s| s.merged_refit.is_none()) {
        return Ok(());
    }
    let (davg, dstd) = summed_statistics(tasks);
    let mut said = false;
    for s in tasks.iter_mut() {
        if let Some(r) = s.merged_refit.take() {
            if !std::mem::replace(&mut said, true) {
                tracing::info!(
                    "new elements {}: type-embedding rows drawn uniform in [0, 1) (one draw for \
                     every task), davg/dstd from the statistics of all the tasks' data",
                    element_names(&s.model, &r.new_types)
                );
            }
            new_element_statistics(&mut s.model, &(davg.clone(), dstd.clone()), &r.new_types);
            r.refit.apply(&mut s.model, &s.train, &r.frames)?;
        }
    }
    Ok(())
}

/// Each shared fitting net's frame and atomic parameter statistics, as DeePMD-kit's
/// `GeneralFitting.share_params` merges them: the sums of the first task that has it, every
/// other's added weighted by model_prob[it] / model_prob[first], made into one avg and inv_std
/// that the tasks sharing it take.
fn merge_fit_input_stats(tasks: &mut [TrainSetup], config: &MultiTaskConfig) {
    let p = &config.model_prob;
    for g in 0..tasks.len() {
        let group: Vec<usize> = (0..tasks.len())
            .filter(|&k| config.fitting_group(k) == g)
            .collect();
        if group.len() < 2 || tasks[g].fit_input_sums.is_empty() {
            continue;
        }
        let mut sums = tasks[g].fit_input_sums.clone();
        for &k in &group[1..] {
            let w = p[k] / p[g];
            for (mine, theirs) in sums.iter_mut().zip(&tasks[k].fit_input_sums) {
                for (m, t) in mine.iter_mut().zip(theirs) {
                    *m += t * w;
                }
            }
        }
        let protect = config.first().model.data_stat_protect;
        let (avg, inv_std) = fit_input_norm(&sums, protect);
        tracing::info!(
            "the shared fitting net '{}''s input statistics over its {} tasks: avg {avg:?}, \
             inv_std {inv_std:?}",
            config.fitting_keys[g].as_deref().unwrap_or_default(),
            group.len()
        );
        for &k in &group {
            tasks[k].model.fit_input_avg.clone_from(&avg);
            tasks[k].model.fit_input_inv_std.clone_from(&inv_std);
        }
    }
}

/// The run's steps and model_prob from each task's epochs (`num_epoch_dict`), as DeePMD-kit's
/// `resolve_model_prob_from_epochs`: task k's steps e_k × B_k (B_k its batches per epoch, on
/// each of the data-parallel ranks), numb_steps the ceiling of their sum, model_prob their
/// shares.
fn steps_from_epochs(config: &mut MultiTaskConfig, tasks: &mut [TrainSetup], epochs: &[f64]) {
    let ranks = dist::world().size();
    let per_task: Vec<f64> = (tasks.iter().zip(epochs))
        .map(|(s, e)| {
            let t = &s.train;
            let mut tc = s.config.training.clone();
            let (_, per_epoch) =
                (tc.steps_from_epochs(&t.nframes(), &t.batch_sizes, &t.probs, ranks))
                    .expect("a task of num_epoch_dict has its numb_epoch");
            e * per_epoch as f64
        })
        .collect();
    let sum: f64 = per_task.iter().sum();
    let numb_steps = sum.ceil() as usize;
    config.model_prob = per_task.iter().map(|s| s / sum).collect();
    tracing::info!(
        "num_epoch_dict: numb_steps {numb_steps} (steps per task {per_task:?}), model_prob {:?}",
        config.model_prob
    );
    for (t, s) in config.tasks.iter_mut().zip(tasks.iter_mut()) {
        s.config.training.numb_steps = numb_steps;
        s.schedule = LrSchedule::new(&s.config.learning_rate, numb_steps);
        t.config = s.config.clone();
    }
}

/// The length of the parameters all the tasks share ([`MultiTaskSetup::shared`]): the
/// descriptor's, its type embedding's at shared level 1 (the first of its tensors). Tasks that
/// share a fitting net share their whole model, whose shapes must then be one.
fn shared_len(tasks: &[TrainSetup], config: &MultiTaskConfig) -> Result<usize> {
    let m0 = &tasks[0].model;
    for (k, s) in tasks.iter().enumerate() {
        let g = config.fitting_group(k);
        if g == k || s.model.spec == tasks[g].model.spec {
            continue;
        }
        let key = config.fitting_keys[k].as_deref().unwrap_or_default();
        bail!(
            "tasks '{}' and '{}' share the fitting net '{key}' but not one model: {}",
            config.tasks[g].name,
            config.tasks[k].name,
            (tasks[g].model.spec)
                .differences(&s.model.spec, &config.tasks[g].name, &config.tasks[k].name)
                .join("; ")
        );
    }
    if config.descriptor_level == 1 {
        let l = m0.layout();
        let tebd =
            (l.descriptor.tebd()).expect("shared level 1 is checked to have a type embedding");
        debug_assert_eq!(
            tebd.w, 0,
            "the type embedding is the descriptor's first tensor"
        );
        return Ok(tebd.end());
    }
    Ok(m0.layout().descriptor_len())
}

/// The heads a run starts from (`what`) share the descriptor and the fitting nets already:
/// the same parameters and statistics in every head that shares them (one tensor in
/// DeePMD-kit's checkpoint).
fn check_shared(
    tasks: &[TrainSetup],
    config: &MultiTaskConfig,
    shared: usize,
    what: &str,
) -> Result<()> {
    let m0 = &tasks[0].model;
    let stats = |m: &Model| (m.davg == m0.davg && m.dstd == m0.dstd) || config.descriptor_level > 0;
    let differ = |a: usize, b: usize, part: &str| {
        anyhow!(
            "{what}: heads '{}' and '{}' do not share one {part} (their parameters or \
             statistics differ); the input's tasks share it",
            config.tasks[a].name,
            config.tasks[b].name
        )
    };
    for (k, s) in tasks.iter().enumerate().skip(1) {
        let m = &s.model;
        if m.params[..shared] != m0.params[..shared] || !stats(m) {
            return Err(differ(0, k, "descriptor"));
        }
        let g = config.fitting_group(k);
        let fit = m.layout().descriptor_len();
        if g != k && m.params[fit..] != tasks[g].model.params[fit..] {
            return Err(differ(g, k, "fitting net"));
        }
    }
    Ok(())
}

/// Gives every task the first task's descriptor: its parameters, and at shared level 0 davg/dstd
/// from the statistics of all tasks, their sums added (DeePMD-kit's `share_params`; at level 1
/// each task keeps its own data's, and shares the type embedding alone from here on;
/// model_prob weighs only a shared fitting net's fparam/aparam statistics,
/// `merge_fit_input_stats`). A task that shares a fitting net takes it from the first task
/// that has it; the first task of each other fitting net draws it anew from its own seed
/// (`fitting_net.seed`, else the run's seed + its index), so that the heads do not start alike.
fn share_parts(tasks: &mut [TrainSetup], config: &MultiTaskConfig, seed: u64) -> Result<()> {
    let d = tasks[0].model.spec.descriptor.clone();
    for (k, s) in tasks.iter().enumerate().skip(1) {
        if s.model.spec.descriptor != d {
            bail!(
                "task '{}''s descriptor is not task '{}''s once its sel is resolved on its data \
                 ({:?} against {:?}): give model.shared_dict.{}.sel as numbers",
                config.tasks[k].name,
                config.tasks[0].name,
                s.model.spec.descriptor.sel,
                d.sel,
                config.descriptor_key
            );
        }
    }
    let dlen = tasks[0].model.layout().descriptor_len();
    let first = tasks[0].model.params[..dlen].to_vec();
    for k in 1..tasks.len() {
        let g = config.fitting_group(k);
        let fit = match g == k {
            // The first task of its fitting net (its own, or the first to name a shared one):
            // drawn anew.
            true => {
                let fit_seed = (config.tasks[k].config.model.fitting_net.seed)
                    .unwrap_or(seed.wrapping_add(k as u64));
                Model::new(tasks[k].model.spec.clone(), fit_seed).params[dlen..].to_vec()
            }
            false => tasks[g].model.params[dlen..].to_vec(),
        };
        let s = &mut tasks[k];
        s.model.params[..dlen].copy_from_slice(&first);
        s.model.params[dlen..].copy_from_slice(&fit);
    }
    merge_fit_input_stats(tasks, config);
    if config.descriptor_level > 0 {
        return Ok(());
    }
    let (davg, dstd) = summed_statistics(tasks);
    tracing::info!(
        "the shared descriptor's statistics over the {} tasks: davg {:?}, dstd {:?}",
        tasks.len(),
        davg.chunks(4).map(|r| r[0]).collect::<Vec<_>>(),
        dstd.chunks(4).map(|r| [r[0], r[1]]).collect::<Vec<_>>(),
    );
    for s in tasks.iter_mut() {
        s.model.davg = davg.clone();
        s.model.dstd = dstd.clone();
    }
    Ok(())
}

//! `dpw train`, `dpw freeze` and their logging: stderr (with an indicatif progress bar when it is
//! a terminal) and, with `-l FILE`, every line in FILE too.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use web_time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use super::backend::{run_job, BackendChoice, Job};
use crate::backend::{Backend, Real};
use crate::config::multitask::is_multitask;
use crate::config::{
    parse_input, parse_multitask_input, parse_training_section, read_input, training_system_paths,
    Config, Precision, Sel,
};
use crate::data::{find_systems, systems_type_map, unnamed_types, Disk};
use crate::dist::DeviceLink;
use crate::model::file::{
    container_heads, head_container, is_container, model_from_container, pick_head, read_container,
    save_model,
};
use crate::model::{new_elements, read_deepmd_yaml, write_deepmd_yaml, Model, ModelFile};
use crate::train::checkpoint::Checkpoint;
use crate::train::interrupt::{self, Interrupted};
use crate::train::multitask::{self, MultiCheckpoint, MultiStart, MultiTaskSetup};
use crate::train::outputs::{self, RunFile, RunFiles};
use crate::train::setup::{prepare, Start, TrainSetup};
use crate::train::trainer::{train, TrainReport};

/// The bar log lines must step around while it is drawn.
static ACTIVE_BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// stderr that clears the progress bar around each log line.
struct BarAwareStderr;

impl Write for BarAwareStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let bar = ACTIVE_BAR.lock().ok().and_then(|b| b.clone());
        match bar {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf)),
            None => std::io::stderr().write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Whether `dpw train` draws a progress bar (stderr is a terminal).
pub fn wants_progress_bar() -> bool {
    std::io::stderr().is_terminal()
}

fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())
}

/// Logging for `dpw train`: like [`super::init_logging`], with the lines on stderr printed
/// above the progress bar while one is drawn.
pub fn init_logging(log_path: Option<&Path>) -> Result<()> {
    let stderr_layer = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(super::stderr_colour())
        .with_writer(|| BarAwareStderr)
        .with_filter(env_filter());
    let file_layer = match log_path {
        Some(p) => {
            let file = super::LogFile::create(p)?;
            Some(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .with_ansi(false)
                    .with_writer(move || file.clone())
                    .with_filter(env_filter()),
            )
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
        .try_init()
        .context("cannot set up logging")
}

/// Training on whatever backend and precision [`run_job`] picks: of a single-task input, or of
/// a multi-task one.
pub enum TrainJob {
    Single(Box<TrainSetup>),
    Multi(Box<MultiTaskSetup>),
}

impl Job for TrainJob {
    type Output = TrainReport;

    fn run<T: Real, B: Backend<T>>(
        self,
        backend: &B,
        link: DeviceLink<T, B::Buf>,
    ) -> Result<TrainReport> {
        match self {
            TrainJob::Single(setup) => train::<T, B>(backend, link, *setup),
            TrainJob::Multi(setup) => multitask::train::<T, B>(backend, link, *setup),
        }
    }
}

pub struct TrainArgs {
    pub input: PathBuf,
    pub restart: Option<PathBuf>,
    pub init_model: Option<PathBuf>,
    /// `-t/--init-frz-model`: a frozen model file (DeePMD-kit .yaml or dpw's).
    pub init_frz_model: Option<PathBuf>,
    /// `--finetune`: a pretrained model (a DeePMD-kit .pt or .yaml, or dpw's), with
    /// `--model-branch`: the head of a multi-task .pt.
    pub finetune: Option<PathBuf>,
    pub model_branch: Option<String>,
    /// `--use-pretrain-script`: the model section from the `--finetune` model's own input.
    pub use_pretrain_script: bool,
    /// `-o`: where the expanded input goes (out.json).
    pub output: PathBuf,
    /// `--skip-neighbor-stat`: no scan of the data's neighbour counts (a fixed `sel` is not
    /// checked against them; `sel: "auto"` is refused).
    pub skip_neighbor_stat: bool,
    pub backend: BackendChoice,
    pub progress_bar: bool,
}

/// The progress bar: fixed-width so that at 80 columns the bar keeps its room and the message
/// (the last validation errors) is cut instead; steps/s from indicatif's running estimate.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:20}] {pos}/{len} {rate} eta {eta} {wide_msg}",
        )
        .expect("valid template")
        .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1} steps/s", s.per_sec());
        })
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

/// The start of `--finetune MODEL [--model-branch B]`: DeePMD-kit's branch rules (spec §21.4)
/// for the head; the model on input.json's `type_map`, to be re-fitted. `RANDOM`, or no branch
/// of a multi-task model, takes the descriptor alone, under a new fitting net.
/// A new element's type-embedding row is drawn from `seed`.
fn finetune_start(
    file: &ModelFile,
    branch: Option<&str>,
    type_map: &[String],
    seed: u64,
) -> Result<Start> {
    let path = file.path();
    let ctx = || format!("--finetune {}", path.display());
    let heads = file.heads();
    let new_fitting = match branch {
        Some("RANDOM") => true,
        None => !heads.is_empty(),
        Some(_) => false,
    };
    let (model, what) = if new_fitting {
        if branch.is_none() {
            tracing::warn!(
                "{} is a multi-task model and no --model-branch is given: the fitting net is \
                 re-initialized instead of taken from a head, and the energy bias set by \
                 statistic (as DeePMD-kit does); give --model-branch HEAD (one of {}) to \
                 fine-tune a head",
                path.display(),
                heads.join(", ")
            );
        }
        let what = format!("{} (its descriptor, a new fitting net)", path.display());
        (file.shared_descriptor(&heads).with_context(ctx)?, what)
    } else {
        let head = match branch {
            Some("Default") | None if file.checkpoint().is_none() => None,
            b => b,
        };
        let model = file.model(head).with_context(ctx)?.model;
        let what = match head {
            Some(h) => format!("{} (head {h})", path.display()),
            None => path.display().to_string(),
        };
        (model, what)
    };
    // DeePMD-kit's change_type_map: input.json's elements, the head's in any order, some left
    // out, new ones added.
    let new_types = new_elements(&model.spec.type_map, type_map);
    let model = (model.with_type_map(type_map, seed))
        .with_context(|| format!("--finetune {what} to type_map {type_map:?}"))?;
    tracing::info!(
        "fine-tuning from {what}: its weights and statistics, the bias re-fitted{}",
        if new_fitting {
            " (set by statistic)"
        } else {
            ""
        }
    );
    Ok(Start::Finetune {
        model: Box::new(model),
        what,
        new_fitting,
        new_types,
        merged: None,
    })
}

/// `--use-pretrain-script`: the descriptor and (but with `RANDOM`) the fitting net of the
/// pretrained head's own input, which a DeePMD-kit `.pt` keeps (`model_params`).
fn pretrain_script(file: &ModelFile, branch: Option<&str>) -> Result<serde_json::Value> {
    let Some(ck) = file.checkpoint() else {
        anyhow::bail!(
            "--use-pretrain-script takes the model section a DeePMD-kit .pt keeps \
             (model_params); {} is not one: give the model section in input.json",
            file.path().display()
        );
    };
    let heads = ck.heads();
    let (head, new_fitting) = match branch {
        Some("RANDOM") => (heads[0], true),
        None if ck.is_multitask() => (heads[0], true),
        b => (ck.head(b)?, false),
    };
    let params = ck.head_params(Some(head).filter(|_| ck.is_multitask()))?;
    let mut parts = serde_json::Map::new();
    let keys: &[&str] = match new_fitting {
        true => &["descriptor"],
        false => &["descriptor", "fitting_net"],
    };
    for k in keys {
        let v = params.get(*k).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: model_params of head {head} has no {k}",
                file.path().display()
            )
        })?;
        parts.insert(k.to_string(), v.clone());
    }
    Ok(serde_json::Value::Object(parts))
}

/// `dpw train`: outputs go to the working directory, as with `dp train`.
pub fn run_train(args: TrainArgs, t0: Instant) -> Result<TrainReport> {
    tracing::info!(
        "dpw {} train {} (working directory {})",
        env!("CARGO_PKG_VERSION"),
        args.input.display(),
        std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "?".into())
    );
    // Under MPI a signal reaches the ranks at different steps, and stopping one alone would
    // leave the others waiting in a collective: there the default (an immediate stop) stays.
    // Elsewhere from the start, so that a signal during the start-up is said and leaves no lock
    // file.
    if !crate::dist::world().is_distributed() {
        interrupt::install()?;
    }
    let input = args.input.clone();
    let value = read_input(&input)?;
    if is_multitask(&value) {
        return run_multitask(args, &value, t0);
    }
    let setup = (|| {
        // The pretrained model's file, read once for its heads, the head's model and script.
        let finetune = match &args.finetune {
            Some(p) => {
                Some(ModelFile::open(p).with_context(|| format!("--finetune {}", p.display()))?)
            }
            None => None,
        };
        let script = match (&finetune, args.use_pretrain_script) {
            (Some(f), true) => Some(pretrain_script(f, args.model_branch.as_deref())?),
            (None, true) => anyhow::bail!("--use-pretrain-script goes with --finetune"),
            _ => None,
        };
        let cfg = load_training_input(&args.input, script)?;
        let start = match (args.restart, args.init_model, args.init_frz_model) {
            (None, None, None) if finetune.is_some() => {
                let file = finetune.as_ref().expect("given");
                finetune_start(
                    file,
                    args.model_branch.as_deref(),
                    &cfg.model.type_map,
                    cfg.training.seed.unwrap_or(0),
                )?
            }
            (None, None, None) => Start::Fresh,
            (Some(r), None, None) => {
                let ck = Checkpoint::read(&r)?;
                interrupt::note_checkpoint(&r);
                Start::Restart(Box::new(ck))
            }
            (None, Some(p), None) => Start::InitModel(p),
            (None, None, Some(t)) => {
                let m = crate::model::read_model_to_train(&t)?;
                tracing::info!(
                    "initial parameters and statistics from the frozen model {}",
                    t.display()
                );
                Start::InitFrozen(Box::new(m))
            }
            _ => anyhow::bail!("give at most one of --restart, --init-model and --init-frz-model"),
        };
        if args.skip_neighbor_stat && matches!(start, Start::Fresh) {
            let d = &cfg.model.descriptor;
            let auto = match (&d.sel, d.auto_lists.first()) {
                (Sel::Auto(_), _) => Some("sel"),
                (_, Some(a)) => Some(a.list.key()),
                _ => None,
            };
            if let Some(key) = auto {
                anyhow::bail!(
                    "{}: model.descriptor.{key} is \"auto\", which needs the neighbour \
                     statistics that --skip-neighbor-stat skips; give it as numbers (`dpw \
                     neighbor-stat` prints the largest neighbour counts)",
                    args.input.display()
                );
            }
        }
        let mut setup = prepare(cfg, start, !args.skip_neighbor_stat, Path::new("."), t0)?;
        setup.out_json = args.output;
        Ok(setup)
    })();
    // Under MPI the ranks agree on whether all of them could start (a collective).
    let mut setup = crate::dist::world().agree(setup)?;
    if args.progress_bar {
        let bar = progress_bar();
        *ACTIVE_BAR.lock().expect("bar lock") = Some(bar.clone());
        setup.progress = Some(bar);
    }
    let float64 = setup.precision == Precision::F64;
    let r = run_job(args.backend, float64, TrainJob::Single(Box::new(setup)));
    finish_run(r, &input)
}

/// The progress bar cleared, and an interrupted run's way to continue said.
fn finish_run(r: Result<TrainReport>, input: &Path) -> Result<TrainReport> {
    if let Some(bar) = ACTIVE_BAR.lock().expect("bar lock").take() {
        bar.finish_and_clear();
    }
    if let Err(e) = &r {
        if let Some(i) = e.downcast_ref::<Interrupted>() {
            let how = i.checkpoint.as_ref().map_or(String::new(), |p| {
                format!(
                    "; continue the run with `dpw train {} --restart {}`",
                    input.display(),
                    p.display()
                )
            });
            tracing::warn!("{i}{how}");
        }
    }
    r
}

/// `dpw train` of a multi-task input (`model.model_dict`): every task set up, then trained
/// together from scratch.
fn run_multitask(args: TrainArgs, value: &serde_json::Value, t0: Instant) -> Result<TrainReport> {
    if args.model_branch.is_some() {
        anyhow::bail!(
            "{}: a multi-task input takes no --model-branch (as DeePMD-kit): give each task \
             its head as model.model_dict.TASK.finetune_head",
            args.input.display()
        );
    }
    let given = [
        ("-t/--init-frz-model", args.init_frz_model.is_some()),
        ("--use-pretrain-script", args.use_pretrain_script),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
        anyhow::bail!(
            "{}: {flag} with a multi-task input is not implemented yet; a multi-task run starts \
             from scratch, from the heads of a multi-task checkpoint (--init-model) or from its \
             own checkpoint (--restart); `dpw freeze --head H` takes a head of one, which a \
             single-task input can start from",
            args.input.display()
        );
    }
    let setup = (|| {
        let cfg = parse_multitask_input(&args.input, value)?;
        let start = match (&args.restart, &args.init_model) {
            _ if args.finetune.is_some() => {
                MultiStart::Finetune(args.finetune.clone().expect("given"))
            }
            (Some(r), _) => {
                let ck = MultiCheckpoint::read(r)?;
                interrupt::note_checkpoint(r);
                MultiStart::Restart(ck)
            }
            (None, Some(p)) => MultiStart::InitModel(p.clone()),
            (None, None) => MultiStart::Fresh,
        };
        let mut setup =
            multitask::prepare(cfg, start, !args.skip_neighbor_stat, Path::new("."), t0)?;
        setup.out_json = args.output.clone();
        Ok(setup)
    })();
    let mut setup = crate::dist::world().agree(setup)?;
    if args.progress_bar {
        let bar = progress_bar();
        *ACTIVE_BAR.lock().expect("bar lock") = Some(bar.clone());
        setup.progress = Some(bar);
    }
    let float64 = setup.tasks[0].precision == Precision::F64;
    let r = run_job(args.backend, float64, TrainJob::Multi(Box::new(setup)));
    finish_run(r, &args.input)
}

/// Checks the files of `dpw train INPUT` before anything is written, the log file (`-l`)
/// included: the input must be read and valid (the outputs it names are known only then), and
/// no output may replace an input or another output ([`outputs::check_files`]). `model` is the
/// flag and path of the checkpoint or model the run starts from.
pub fn check_train_files(
    input: &Path,
    model: Option<(&str, &Path)>,
    output: &Path,
    log: Option<&Path>,
) -> Result<()> {
    let outputs = [("-o/--output", Some(output)), ("-l/--log-path", log)]
        .into_iter()
        .filter_map(|(flag, p)| Some(RunFile::new(flag, p?)))
        .collect();
    let files = RunFiles {
        input: RunFile::new("the input file", input),
        model: model.map(|(flag, p)| RunFile::new(flag, p)),
        outputs,
    };
    let value = read_input(input)?;
    if is_multitask(&value) {
        let cfg = parse_multitask_input(input, &value)?;
        return outputs::check_files(Path::new("."), &files, cfg.training());
    }
    let training = parse_training_section(input, &value)?;
    outputs::check_files(Path::new("."), &files, &training)
}

/// The input of `dpw train`: an input without `model.type_map` takes the element names from the
/// training systems' type_map.raw files, as DeePMD-kit's TensorFlow backend does (its PyTorch
/// backend needs them given), or where they have none, names its types by index.
///
/// `script`: the parts of the model section `--use-pretrain-script` takes from the pretrained
/// model, put in place of input.json's.
fn load_training_input(path: &Path, script: Option<serde_json::Value>) -> Result<Config> {
    let mut value = read_input(path)?;
    if let Some(serde_json::Value::Object(parts)) = script {
        let model = (value.get_mut("model").and_then(|m| m.as_object_mut()))
            .ok_or_else(|| anyhow::anyhow!("{}: model must be an object", path.display()))?;
        for (k, v) in parts {
            tracing::info!("--use-pretrain-script: model.{k} is the pretrained model's");
            model.insert(k, v);
        }
    }
    type_map_from_data(path, &mut value)?;
    Ok(parse_input(path, &value)?)
}

/// The input at `path` given as `value`, where it has no `model.type_map`, with the one its
/// training systems give (as `dpw train` reads it); left alone where the systems cannot be
/// found (the parse then names the missing key).
pub fn type_map_from_data(path: &Path, value: &mut serde_json::Value) -> Result<()> {
    let no_type_map = value.pointer("/model/type_map").is_none_or(|t| t.is_null());
    let listed = no_type_map
        .then(|| training_system_paths(path, value))
        .flatten();
    if let Some(listed) = listed {
        // Where the data cannot be read the parse below says what is missing.
        let found = find_systems(&Disk, &listed, "training").ok();
        let model = value.get_mut("model").and_then(|m| m.as_object_mut());
        if let (Some(found), Some(model)) = (found, model) {
            let names = match systems_type_map(&Disk, &found)? {
                Some(names) => {
                    tracing::info!(
                        "model.type_map not given: {names:?}, from the training systems' \
                         type_map.raw"
                    );
                    names
                }
                None => {
                    let names = unnamed_types(&Disk, &found)?;
                    tracing::info!(
                        "model.type_map not given and no training system has a type_map.raw: \
                         its {} types are {names:?}, by their index in type.raw",
                        names.len()
                    );
                    names
                }
            };
            model.insert("type_map".into(), names.into());
        }
    }
    Ok(())
}

/// The checkpoint a `-c` argument names: a file, or `model.ckpt` in a folder.
fn checkpoint_path(c: &Path) -> PathBuf {
    if c.is_dir() {
        c.join("model.ckpt")
    } else {
        c.to_path_buf()
    }
}

/// Refuses to write `output` over `input` (the same file, or a link to it): a checkpoint would
/// lose its optimizer state, and a model would be gone if the write failed.
fn refuse_same_file(input: &Path, output: &Path) -> Result<()> {
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize()) {
        if a == b {
            anyhow::bail!(
                "the output {} is the input {} itself; write to another file",
                output.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// Extensions of DeePMD-kit's model files that dpw cannot write, by backend: TensorFlow, PyTorch
/// (model, checkpoint, AOTInductor), JAX, Paddle, and the DP backend's HDF5 serialization.
const DEEPMD_ONLY: &[(&str, &str)] = &[
    ("pb", "TensorFlow"),
    ("pth", "PyTorch"),
    ("pt", "PyTorch"),
    ("pt2", "PyTorch"),
    ("savedmodel", "JAX"),
    ("hlo", "JAX"),
    ("jax", "JAX"),
    ("json", "Paddle"),
    ("pdmodel", "Paddle"),
    ("dp", "DP (HDF5)"),
];

/// Writes `model` as DeePMD-kit's `.yaml` when `out` ends in `.yaml`/`.yml`, else as a dpw
/// model file; a name DeePMD-kit would read as one of its other formats is refused, since
/// DeePMD-kit could not read what dpw would write there. `writing` is the dpw command line
/// that leads to `out`, less its output, for the message telling how to get there.
pub fn write_model(model: &Model, out: &Path, writing: &str) -> Result<&'static str> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ext == "yaml" || ext == "yml" {
        write_deepmd_yaml(model, out)?;
        return Ok("DeePMD-kit .yaml");
    }
    if let Some((_, backend)) = DEEPMD_ONLY.iter().find(|(e, _)| *e == ext) {
        let yaml = out.with_extension("yaml");
        anyhow::bail!(
            "{}: dpw cannot write DeePMD-kit's {backend} .{ext} models; write its .yaml and \
             convert that with DeePMD-kit: `{writing} {} && dp convert-backend {} {}` (or \
             name a dpw model file .dpw)",
            out.display(),
            yaml.display(),
            yaml.display(),
            out.display()
        );
    }
    save_model(out, model)?;
    Ok("dpw")
}

/// `dpw freeze`: a self-contained model file (parameters and statistics) from a checkpoint;
/// DeePMD-kit's `.yaml` when the output name ends in `.yaml`.
pub fn freeze(ckpt: &Path, out: &Path, head: Option<&str>) -> Result<()> {
    let path = checkpoint_path(ckpt);
    if !path.exists() {
        // A dangling link (`model.ckpt` whose step file is gone): the file missing is the target.
        if let Ok(target) = std::fs::read_link(&path) {
            let target = path.parent().map_or(target.clone(), |d| d.join(&target));
            anyhow::bail!(
                "checkpoint {} is a link to {}, which does not exist",
                path.display(),
                target.display()
            );
        }
        anyhow::bail!("checkpoint {} does not exist", path.display());
    }
    refuse_same_file(&path, out)?;
    if !is_container(&path) && read_deepmd_yaml(&path).is_ok() {
        anyhow::bail!(
            "{} is already a model (DeePMD-kit .yaml), not a checkpoint; use `dpw convert {} \
             OUTPUT` to convert a model",
            path.display(),
            path.display()
        );
    }
    let c = read_container(&path)?;
    let (model, what) = match container_heads(&c) {
        Some(heads) => {
            let k = pick_head(&heads, head, &path)?;
            let model = model_from_container(&head_container(&c, k)).with_context(|| {
                format!("reading head '{}' of {}", heads[k].name, path.display())
            })?;
            (model, format!(" head '{}'", heads[k].name))
        }
        None if head.is_some() => anyhow::bail!(
            "--head {}: {} is a checkpoint of one model (a single-task run)",
            head.unwrap_or_default(),
            path.display()
        ),
        None => {
            let m =
                model_from_container(&c).with_context(|| format!("reading {}", path.display()))?;
            (m, String::new())
        }
    };
    let writing = match head {
        Some(h) => format!("dpw freeze -c {} --head {h} -o", ckpt.display()),
        None => format!("dpw freeze -c {} -o", ckpt.display()),
    };
    let kind = write_model(&model, out, &writing)?;
    tracing::info!(
        "froze {}{what} (step {}) into the {kind} model {}",
        path.display(),
        c.header["step"],
        out.display()
    );
    Ok(())
}

/// `dpw convert`: a model (DeePMD-kit `.yaml`, a head of a DeePMD-kit `.pt`, dpw model or
/// checkpoint) to DeePMD-kit's `.yaml` (by the output's extension `.yaml`/`.yml`) or to a dpw
/// model file (any other name), like `dp convert-backend`.
pub fn convert(input: &Path, output: &Path, head: Option<&str>) -> Result<()> {
    refuse_same_file(input, output)?;
    let model = crate::model::read_model_head(input, head)?;
    let kind = write_model(&model, output, &format!("dpw convert {}", input.display()))?;
    tracing::info!("wrote the {kind} model {}", output.display());
    Ok(())
}

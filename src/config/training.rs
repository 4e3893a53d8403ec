//! The `training` section: data systems, batching, step counts, output files.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{
    at_least_one, non_negative, positive, to_f64, to_list, to_str, to_usize, to_usize_list,
    wrong_type, Schema, Section,
};
use super::model::object;

type Result<T> = std::result::Result<T, ConfigError>;

#[derive(Debug, Clone, PartialEq)]
pub struct TrainingConfig {
    pub training_data: DataConfig,
    pub validation_data: Option<ValidationDataConfig>,
    /// The steps to train: as given, or made from `numb_epoch` once the training data are read
    /// ([`TrainingConfig::steps_from_epochs`]).
    pub numb_steps: usize,
    /// Train for this many passes over the training data (fractional allowed), in place of
    /// `numb_steps`.
    pub numb_epoch: Option<f64>,
    pub seed: Option<u64>,
    pub disp_file: String,
    pub disp_freq: usize,
    pub save_freq: usize,
    pub save_ckpt: String,
    pub max_ckpt_keep: usize,
    pub disp_avg: bool,
    pub disp_training: bool,
    pub time_training: bool,
    /// Clip the global gradient norm to this; 0 = no clipping.
    pub gradient_max_norm: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    /// The systems as written in input.json (what out.json repeats). A single string in the
    /// input is stored as a one-element list; DeePMD-kit treats such a string as a directory to
    /// search for systems, so a loader should search any listed directory that is not itself a
    /// system (has no `type.raw`).
    pub systems: Vec<String>,
    /// Whether `systems` was that single string, which out.json then repeats: DeePMD-kit reads
    /// LMDB data only from a string.
    pub systems_string: bool,
    /// `systems` resolved against the directory of input.json, same order.
    pub system_paths: Vec<PathBuf>,
    pub batch_size: BatchSizeSpec,
    pub auto_prob: AutoProb,
    /// One weight per system; takes precedence over `auto_prob` (DeePMD-kit's rule).
    pub sys_probs: Option<Vec<f64>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ValidationDataConfig {
    pub data: DataConfig,
    /// Validation batches evaluated per display.
    pub numb_btch: usize,
}

/// Frames per batch, per system.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchSizeSpec {
    /// The same batch size for every system.
    Fixed(usize),
    /// One batch size per system.
    PerSystem(Vec<usize>),
    /// `"auto"` (= `"auto:32"`) / `"auto:N"`: the smallest bs with `bs * natoms >= N`.
    Auto(usize),
    /// `"max:N"`: the largest bs with `bs * natoms <= N`, at least 1.
    Max(usize),
    /// `"filter:N"`: drop systems with more than N atoms, then like `max:N`.
    Filter(usize),
    /// `"mixed:N"` (DeePMD-kit's TensorFlow backend): each batch is N frames, each drawn from a
    /// system of its own, padded to the largest frame's atoms with virtual atoms
    /// (docs/deepmd-spec.md §12).
    Mixed(usize),
}

impl BatchSizeSpec {
    /// The batch size of system `index` with `natoms` atoms per frame. `None` only for a
    /// per-system list without an entry at `index`: parsing checks one entry per listed system,
    /// but a `systems` directory can expand to more systems than the list has.
    pub fn for_system(&self, index: usize, natoms: usize) -> Option<usize> {
        let natoms = natoms.max(1);
        match self {
            BatchSizeSpec::Fixed(bs) | BatchSizeSpec::Mixed(bs) => Some(*bs),
            BatchSizeSpec::PerSystem(v) => v.get(index).copied(),
            BatchSizeSpec::Auto(n) => Some(n.div_ceil(natoms).max(1)),
            BatchSizeSpec::Max(n) | BatchSizeSpec::Filter(n) => Some((n / natoms).max(1)),
        }
    }

    /// The frames of a `"mixed:N"` batch.
    pub fn mixed(&self) -> Option<usize> {
        match self {
            BatchSizeSpec::Mixed(n) => Some(*n),
            _ => None,
        }
    }

    /// Whether a system with `natoms` atoms is used at all (only `filter:N` drops any).
    pub fn keeps_system(&self, natoms: usize) -> bool {
        match self {
            BatchSizeSpec::Filter(n) => natoms <= *n,
            _ => true,
        }
    }

    fn parse(v: &Value, path: &str, nsys: usize) -> Result<Self> {
        const EXPECTED: &str =
            "a positive integer, a list of them (one per system), \"auto\", \"auto:N\", \"max:N\", \"filter:N\" or \"mixed:N\"";
        match v {
            Value::Number(_) => {
                let bs = to_usize(v, path).map_err(|_| wrong_type(path, EXPECTED, v))?;
                Ok(BatchSizeSpec::Fixed(at_least_one(bs, path)?))
            }
            Value::Array(_) => {
                let list = to_usize_list(v, path)?;
                if list.len() != nsys {
                    return Err(ConfigError::invalid(
                        path,
                        format!(
                            "has {} entries for {nsys} systems; give one per system",
                            list.len()
                        ),
                    ));
                }
                for (i, &bs) in list.iter().enumerate() {
                    at_least_one(bs, &format!("{path}[{i}]"))?;
                }
                Ok(BatchSizeSpec::PerSystem(list))
            }
            Value::String(s) if s == "auto" => Ok(BatchSizeSpec::Auto(32)),
            Value::String(s) if s == "mixed" => Err(ConfigError::invalid(
                path,
                "\"mixed\" needs its batch size: \"mixed:N\" (N frames a batch)",
            )),
            Value::String(s) => {
                let (kind, n) = s
                    .split_once(':')
                    .ok_or_else(|| wrong_type(path, EXPECTED, v))?;
                let n: usize = n
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| wrong_type(path, EXPECTED, v))?;
                match kind {
                    "auto" => Ok(BatchSizeSpec::Auto(n)),
                    "max" => Ok(BatchSizeSpec::Max(n)),
                    "filter" => Ok(BatchSizeSpec::Filter(n)),
                    "mixed" => Ok(BatchSizeSpec::Mixed(n)),
                    _ => Err(wrong_type(path, EXPECTED, v)),
                }
            }
            _ => Err(wrong_type(path, EXPECTED, v)),
        }
    }

    fn to_value(&self) -> Value {
        match self {
            BatchSizeSpec::Fixed(bs) => json!(bs),
            BatchSizeSpec::PerSystem(v) => json!(v),
            BatchSizeSpec::Auto(n) => json!(format!("auto:{n}")),
            BatchSizeSpec::Max(n) => json!(format!("max:{n}")),
            BatchSizeSpec::Filter(n) => json!(format!("filter:{n}")),
            BatchSizeSpec::Mixed(n) => json!(format!("mixed:{n}")),
        }
    }
}

/// How a system is picked for each step when `sys_probs` is not given.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoProb {
    /// `"prob_uniform"`: every system equally likely.
    Uniform,
    /// `"prob_sys_size"`: proportional to the system's number of batches.
    SysSize,
    /// `"prob_sys_size;a:b:w;..."`: systems `a..b` share weight `w`, split inside the block in
    /// proportion to their number of batches.
    SysSizeBlocks(Vec<ProbBlock>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProbBlock {
    pub start: usize,
    pub end: usize,
    pub weight: f64,
}

impl fmt::Display for AutoProb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AutoProb::Uniform => f.write_str("prob_uniform"),
            AutoProb::SysSize => f.write_str("prob_sys_size"),
            AutoProb::SysSizeBlocks(blocks) => {
                f.write_str("prob_sys_size")?;
                for b in blocks {
                    write!(f, ";{}:{}:{}", b.start, b.end, b.weight)?;
                }
                Ok(())
            }
        }
    }
}

impl AutoProb {
    fn parse(v: &Value, path: &str) -> Result<Self> {
        let s = to_str(v, path)?;
        let bad = |why: &str| {
            ConfigError::invalid(
                path,
                format!(
                    "{why}; expected \"prob_uniform\", \"prob_sys_size\" or \
                     \"prob_sys_size;start:end:weight;...\", found {s:?}"
                ),
            )
        };
        match s {
            "prob_uniform" => return Ok(AutoProb::Uniform),
            "prob_sys_size" => return Ok(AutoProb::SysSize),
            _ => {}
        }
        let rest = s
            .strip_prefix("prob_sys_size;")
            .ok_or_else(|| bad("unknown form"))?;
        let mut blocks = Vec::new();
        for block in rest.split(';') {
            let parts: Vec<&str> = block.split(':').collect();
            let parsed = match parts.as_slice() {
                [a, b, w] => match (a.parse(), b.parse(), w.parse::<f64>()) {
                    (Ok(start), Ok(end), Ok(weight)) => Some(ProbBlock { start, end, weight }),
                    _ => None,
                },
                _ => None,
            };
            let b =
                parsed.ok_or_else(|| bad(&format!("block {block:?} is not start:end:weight")))?;
            if b.start >= b.end || !b.weight.is_finite() || b.weight < 0.0 {
                return Err(bad(&format!(
                    "block {block:?} needs start < end and weight >= 0"
                )));
            }
            blocks.push(b);
        }
        Ok(AutoProb::SysSizeBlocks(blocks))
    }
}

const DATA_KEYS: &[&str] = &["systems", "batch_size", "auto_prob", "sys_probs"];

static TRAINING_DATA: Schema = Schema {
    keys: &[DATA_KEYS],
    unsupported: &[],
    ignored: &[],
    deepmd: "training.training_data",
};

static VALIDATION_DATA: Schema = Schema {
    keys: &[DATA_KEYS, &["numb_btch"]],
    unsupported: &[],
    ignored: &[],
    deepmd: "training.validation_data",
};

static TRAINING: Schema = Schema {
    keys: &[&[
        "training_data",
        "validation_data",
        "numb_steps",
        "numb_epoch",
        "seed",
        "disp_file",
        "disp_freq",
        "save_freq",
        "save_ckpt",
        "max_ckpt_keep",
        "disp_avg",
        "disp_training",
        "time_training",
        "gradient_max_norm",
    ]],
    unsupported: &[&[
        ("tensorboard", "TensorBoard output is not implemented"),
        ("profiling", "profiling is not implemented"),
        ("enable_profiler", "profiling is not implemented"),
        ("mixed_precision", "mixed precision is not implemented"),
        (
            "change_bias_after_training",
            "changing the bias after training is not implemented",
        ),
        ("enable_ema", "EMA of the parameters is not implemented"),
        ("zero_stage", "ZeRO sharding is not implemented"),
    ]],
    // stat_file: dpw recomputes the statistics each run (warned about); enable_compile:
    // DeePMD-kit's switch to torch.compile its step, which changes its speed alone (dpw's step
    // is compiled code); the others only configure features that are off.
    ignored: &[
        "stat_file",
        "enable_compile",
        "tensorboard_log_dir",
        "tensorboard_freq",
        "profiling_file",
    ],
    deepmd: "training",
};

fn parse_systems(sec: &Section) -> Result<(Vec<String>, bool)> {
    const EXPECTED: &str = "a list of system directories (or one directory as a string)";
    let path = sec.path_of("systems");
    let v = sec.required("systems", EXPECTED)?;
    let systems: Vec<String> = match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| to_str(x, &format!("{path}[{i}]")).map(str::to_string))
            .collect::<Result<_>>()?,
        _ => return Err(wrong_type(&path, EXPECTED, v)),
    };
    if systems.is_empty() {
        return Err(ConfigError::invalid(
            path,
            format!("is empty; expected {EXPECTED}"),
        ));
    }
    if let Some(i) = systems.iter().position(String::is_empty) {
        return Err(ConfigError::invalid(
            format!("{path}[{i}]"),
            "a system path must not be empty",
        ));
    }
    Ok((systems, v.is_string()))
}

fn parse_data(sec: &Section, base_dir: &Path) -> Result<DataConfig> {
    let (systems, systems_string) = parse_systems(sec)?;
    let system_paths = systems.iter().map(|s| base_dir.join(s)).collect();
    let batch_size = match sec.get("batch_size") {
        Some(v) => BatchSizeSpec::parse(v, &sec.path_of("batch_size"), systems.len())?,
        None => BatchSizeSpec::Auto(32),
    };
    let auto_prob = match sec.get("auto_prob") {
        Some(v) => AutoProb::parse(v, &sec.path_of("auto_prob"))?,
        None => AutoProb::SysSize,
    };
    let sys_probs = match sec.get_nonnull("sys_probs") {
        None => None,
        Some(v) => {
            let path = sec.path_of("sys_probs");
            let items = to_list(v, &path, "a list of numbers, one per system")?;
            if items.len() != systems.len() {
                return Err(ConfigError::invalid(
                    path,
                    format!("has {} entries for {} systems", items.len(), systems.len()),
                ));
            }
            let probs = items
                .iter()
                .enumerate()
                .map(|(i, x)| to_f64(x, &format!("{path}[{i}]")))
                .collect::<Result<_>>()?;
            Some(probs)
        }
    };
    Ok(DataConfig {
        systems,
        systems_string,
        system_paths,
        batch_size,
        auto_prob,
        sys_probs,
    })
}

fn positive_count(sec: &Section, key: &str, default: usize) -> Result<usize> {
    at_least_one(sec.usize_or(key, default)?, &sec.path_of(key))
}

fn file_name(sec: &Section, key: &str, default: &str) -> Result<String> {
    let name = sec.string_or(key, default)?;
    if name.is_empty() {
        return Err(ConfigError::invalid(sec.path_of(key), "must not be empty"));
    }
    Ok(name)
}

pub(super) fn parse(v: &Value, path: &str, base_dir: &Path) -> Result<TrainingConfig> {
    let sec = Section::new(v, path, &TRAINING)?;

    let td = sec.required(
        "training_data",
        "an object with \"systems\" and \"batch_size\"",
    )?;
    let training_data = parse_data(
        &Section::new(td, &sec.path_of("training_data"), &TRAINING_DATA)?,
        base_dir,
    )?;
    let validation_data = match sec.get_nonnull("validation_data") {
        None => None,
        Some(vd) => {
            let vsec = Section::new(vd, &sec.path_of("validation_data"), &VALIDATION_DATA)?;
            Some(ValidationDataConfig {
                data: parse_data(&vsec, base_dir)?,
                numb_btch: positive_count(&vsec, "numb_btch", 1)?,
            })
        }
    };

    // DeePMD-kit's rule: one of the two, never both.
    let numb_epoch = match sec.opt_f64("numb_epoch")? {
        Some(e) => Some(positive(e, &sec.path_of("numb_epoch"))?),
        None => None,
    };
    let numb_steps = match (sec.get_nonnull("numb_steps"), numb_epoch) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::invalid(
                sec.path_of("numb_epoch"),
                "give numb_steps or numb_epoch, not both",
            ))
        }
        (Some(v), None) => to_usize(v, &sec.path_of("numb_steps"))?,
        (None, Some(_)) => 0,
        (None, None) => {
            return Err(ConfigError::Missing {
                path: sec.path_of("numb_steps"),
                expected: "a non-negative integer (or numb_epoch, a number of passes over \
                           the training data)"
                    .into(),
            })
        }
    };

    if sec.has("stat_file") {
        tracing::warn!(
            "{}: ignored; dpw computes the data statistics at the start of every run",
            sec.path_of("stat_file")
        );
    }

    let gradient_max_norm = sec.f64_or("gradient_max_norm", 0.0)?;
    non_negative(gradient_max_norm, &sec.path_of("gradient_max_norm"))?;

    Ok(TrainingConfig {
        training_data,
        validation_data,
        numb_steps,
        numb_epoch,
        seed: sec.opt_u64("seed")?,
        disp_file: file_name(&sec, "disp_file", "lcurve.out")?,
        disp_freq: positive_count(&sec, "disp_freq", 1000)?,
        save_freq: positive_count(&sec, "save_freq", 1000)?,
        save_ckpt: file_name(&sec, "save_ckpt", "model.ckpt")?,
        max_ckpt_keep: sec.usize_or("max_ckpt_keep", 5)?,
        disp_avg: sec.bool_or("disp_avg", false)?,
        disp_training: sec.bool_or("disp_training", true)?,
        time_training: sec.bool_or("time_training", true)?,
        gradient_max_norm,
    })
}

impl DataConfig {
    fn to_json(&self) -> Value {
        let systems = match &self.systems[..] {
            [one] if self.systems_string => json!(one),
            all => json!(all),
        };
        json!({
            "systems": systems,
            "batch_size": self.batch_size.to_value(),
            "auto_prob": self.auto_prob.to_string(),
            "sys_probs": self.sys_probs,
        })
    }
}

impl TrainingConfig {
    /// `numb_steps` made from `numb_epoch` as DeePMD-kit makes it: `ceil(numb_epoch × B)`, B the
    /// batches of one epoch, `ceil(max(nbatches_i / p_i))` over the systems drawn (`p_i`
    /// normalised); each of `ranks` data-parallel processes draws from its share of a
    /// system's frames, as PyTorch's DistributedSampler gives it.
    pub fn steps_from_epochs(
        &mut self,
        nframes: &[usize],
        batch_sizes: &[usize],
        probs: &[f64],
        ranks: usize,
    ) -> Option<(usize, usize)> {
        let epochs = self.numb_epoch?;
        let total: f64 = probs.iter().sum();
        let per_epoch = (nframes.iter().zip(batch_sizes).zip(probs))
            .filter(|(_, &p)| p > 0.0)
            .map(|((&nf, &bs), &p)| nf.div_ceil(ranks).div_ceil(bs) as f64 / (p / total))
            .fold(0.0, f64::max)
            .ceil() as usize;
        self.numb_steps = (epochs * per_epoch as f64).ceil() as usize;
        Some((self.numb_steps, per_epoch))
    }

    pub(super) fn to_json(&self) -> Value {
        let validation = self.validation_data.as_ref().map(|v| {
            let mut d = v.data.to_json();
            object(&mut d).insert("numb_btch".into(), json!(v.numb_btch));
            d
        });
        json!({
            "training_data": self.training_data.to_json(),
            "validation_data": validation,
            // The one that was given (DeePMD-kit refuses both).
            "numb_steps": self.numb_epoch.is_none().then_some(self.numb_steps),
            "numb_epoch": self.numb_epoch,
            "seed": self.seed,
            "disp_file": self.disp_file,
            "disp_freq": self.disp_freq,
            "save_freq": self.save_freq,
            "save_ckpt": self.save_ckpt,
            "max_ckpt_keep": self.max_ckpt_keep,
            "disp_avg": self.disp_avg,
            "disp_training": self.disp_training,
            "time_training": self.time_training,
            // 0 (no clipping) as DeePMD-kit writes it: no key.
            "gradient_max_norm": (self.gradient_max_norm > 0.0).then_some(self.gradient_max_norm),
        })
    }
}

//! DeePMD-kit's input.json → a typed [`Config`] with DeePMD-kit 3.2's defaults.
//!
//! dpw reads the same input file as `dp train` for the models it trains. Anything dpw
//! cannot honour is an error, never silently dropped: an unknown key (a typo, usually) names
//! its path and the keys valid there, and a valid DeePMD-kit setting that dpw does not
//! implement says so. [`Config::to_expanded_json`] gives back the input with every default
//! filled in, which the trainer writes to `out.json` as `dp train` does.

pub(crate) mod block_keys;
mod deepmd_args;
pub use deepmd_args::deepmd_input_errors;
pub(crate) mod error;
pub(crate) mod keys;
mod learning_rate;
pub mod linear;
pub(crate) mod loss;
pub(crate) mod model;
pub mod multitask;
mod optimizer;
mod pairtab;
mod training;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

pub use error::ConfigError;
pub use learning_rate::{LearningRateConfig, ScaleByWorker, DEFAULT_STOP_LR};
pub use loss::{EnerLossConfig, LossConfig, LossKind};
pub use model::{
    AttentionConfig, DescriptorConfig, FittingConfig, ModelConfig, Precision, Sel, SelList,
    TebdInputMode,
};
pub use optimizer::{OptimizerConfig, WeightDecay};
pub use pairtab::PairConfig;
pub use training::{
    AutoProb, BatchSizeSpec, DataConfig, ProbBlock, TrainingConfig, ValidationDataConfig,
};

use keys::{Schema, Section};

/// The whole input.json.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub model: ModelConfig,
    pub learning_rate: LearningRateConfig,
    pub loss: LossConfig,
    pub optimizer: OptimizerConfig,
    pub training: TrainingConfig,
}

static ROOT: Schema = Schema {
    keys: &[&["model", "learning_rate", "loss", "optimizer", "training"]],
    unsupported: &[&[(
        "nvnmd",
        "training for the NVNMD (non-von Neumann MD) hardware is not implemented",
    )]],
    ignored: &[],
    deepmd: "",
};

/// Reads and checks an input.json, or the same input in YAML when the file name ends in `.yaml`
/// or `.yml` (as `dp train` picks the format).
///
/// Relative system paths are resolved against the directory holding the file. DeePMD-kit
/// resolves them against the working directory, but users run `dp train input.json` from that
/// directory, so both agree there, and dpw also works when started from elsewhere.
pub fn load_config(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
    let path = path.as_ref();
    parse_input(path, &read_input(path)?)
}

/// The folder an input's relative paths are read from: the input file's.
fn input_dir(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

/// The training systems of the input read from `path`, as [`parse_input`] resolves them;
/// `None` where its training section does not parse (the whole parse then says why).
pub fn training_system_paths(path: &Path, value: &Value) -> Option<Vec<PathBuf>> {
    let training = training::parse(value.get("training")?, "training", input_dir(path)).ok()?;
    Some(training.training_data.system_paths)
}

/// The training section of the input read from `path` alone (what the outputs' checks need
/// before the model section is complete: `--use-pretrain-script` fills it in).
pub fn parse_training_section(path: &Path, value: &Value) -> Result<TrainingConfig, ConfigError> {
    let in_file = |e| ConfigError::InFile {
        file: path.to_path_buf(),
        error: Box::new(e),
    };
    let t = value.get("training").ok_or_else(|| {
        in_file(ConfigError::Missing {
            path: "training".into(),
            expected: "an object with training_data and numb_steps".into(),
        })
    })?;
    training::parse(t, "training", input_dir(path)).map_err(in_file)
}

/// [`Config::from_value`] of the input read from `path`, an error naming the file.
pub fn parse_input(path: &Path, value: &Value) -> Result<Config, ConfigError> {
    Config::from_value(value, input_dir(path)).map_err(|e| ConfigError::InFile {
        file: path.to_path_buf(),
        error: Box::new(e),
    })
}

/// [`multitask::MultiTaskConfig::from_value`] of the multi-task input read from `path` (its
/// `model_dict` order from the file's text), an error naming the file.
pub fn parse_multitask_input(
    path: &Path,
    value: &Value,
) -> Result<multitask::MultiTaskConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let order = multitask::model_dict_order(&text, is_yaml(path));
    multitask::MultiTaskConfig::from_value(value, &order, input_dir(path)).map_err(|e| {
        ConfigError::InFile {
            file: path.to_path_buf(),
            error: Box::new(e),
        }
    })
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// The input file at `path` (JSON, or YAML by its extension) as a JSON value, unparsed.
pub fn read_input(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    // Editors on Windows start UTF-8 files with a byte-order mark, which serde_json refuses.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let value: Value = if is_yaml(path) {
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Yaml {
            file: path.to_path_buf(),
            message: e.to_string(),
        })?
    } else {
        serde_json::from_str(text).map_err(|e| ConfigError::json(path, &e))?
    };
    Ok(value)
}

impl Config {
    /// Builds a config from parsed JSON; relative system paths are resolved against `base_dir`.
    pub fn from_value(value: &Value, base_dir: &Path) -> Result<Config, ConfigError> {
        // The model's type first: an input for a model dpw lacks is refused for that, not for
        // the first of the keys that came with it.
        if let Some(m) = value.get("model") {
            model::check_type(m, "model")?;
        }
        let root = Section::new(value, "", &ROOT)?;
        let model = model::parse(
            root.required(
                "model",
                "an object with type_map, descriptor and fitting_net",
            )?,
            "model",
            base_dir,
        )?;
        let training = training::parse(
            root.required("training", "an object with training_data and numb_steps")?,
            "training",
            base_dir,
        )?;
        let loss = loss::parse(root.get("loss"), "loss")?;
        let output = &model.fitting_net.output;
        if loss.type_name() != output.fitting().loss_type() {
            return Err(ConfigError::invalid(
                "loss.type",
                format!(
                    "the {:?} loss does not train a {:?} fitting \
                     (model.fitting_net.type); set \"type\": {:?}",
                    loss.type_name(),
                    output.fitting().type_name(),
                    output.fitting().loss_type()
                ),
            ));
        }
        Ok(Config {
            model,
            learning_rate: learning_rate::parse(root.get("learning_rate"), "learning_rate")?,
            loss,
            optimizer: optimizer::parse(root.get("optimizer"), "optimizer")?,
            training,
        })
    }

    /// The input with every default filled in, DeePMD-kit's included, and aliases under their
    /// canonical names (the descriptor's `type` stays as given): what `dp train` writes to
    /// out.json. Loading it again gives an equal `Config`.
    pub fn to_expanded_json(&self) -> Value {
        let mut v = json!({
            "model": self.model.to_json(),
            "learning_rate": self.learning_rate.to_json(),
            "loss": self.loss.to_json(),
            "optimizer": self.optimizer.to_json(),
            "training": self.training.to_json(),
        });
        if let Value::Object(map) = &mut v {
            deepmd_args::fill_defaults(ROOT.deepmd_node(), map);
        }
        v
    }
}

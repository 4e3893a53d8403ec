//! DeePMD-kit's multi-task input (docs/deepmd-spec.md §21.3): `model.shared_dict` with the parts
//! several tasks share, `model.model_dict` with one model per task, `loss_dict`,
//! `training.data_dict` and `training.model_prob`. Each task is read as the single-task input
//! it stands for, so that every key is checked as it is there; an error names the key where the
//! multi-task input has it (`model.shared_dict.dpa1.sel`, `loss_dict.water.start_pref_e`).
//!
//! dpw shares one descriptor among all the tasks, whole (shared level 0) as DeePMD-kit's
//! examples and pretrained models do, or its type embedding alone (level 1); a fitting net is
//! a task's own or shared by the tasks that name its `shared_dict` key (all of them in
//! DeePMD-kit's `input_torch_sharefit.json`, with a case embedding); each task has its own
//! energy bias, loss and data.

use std::path::Path;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{json, Map, Value};

use super::keys::{describe, join, to_f64};
use super::{Config, ConfigError, TrainingConfig};

type Result<T> = std::result::Result<T, ConfigError>;

/// A multi-task input, one single-task [`Config`] per task.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiTaskConfig {
    /// In `model_dict` order (the order of the task draw's probabilities).
    pub tasks: Vec<TaskConfig>,
    /// `training.model_prob` normalized to sum 1, in task order: by default each task's number
    /// of training systems, as DeePMD-kit's `resolve_model_prob`; made from the epochs where
    /// those are given.
    pub model_prob: Vec<f64>,
    /// `training.num_epoch_dict` in task order: the run's steps and model_prob come from each
    /// task's epochs and batches per epoch (`resolve_model_prob_from_epochs`).
    pub num_epoch: Option<Vec<f64>>,
    /// The `shared_dict` key of the descriptor all tasks share.
    pub descriptor_key: String,
    /// How much of it they share (`"key:level"`): 0 all of it, 1 its type embedding alone
    /// (each task then trains the rest, with statistics of its own data).
    pub descriptor_level: u32,
    /// Per task, in task order, the `shared_dict` key of its fitting net where it takes one
    /// (`None`: a fitting net of its own). Tasks naming one key share that fitting net
    /// ([`MultiTaskConfig::fitting_group`]).
    pub fitting_keys: Vec<Option<String>>,
    /// `model.shared_dict` as given, written back to out.json.
    shared_dict: Value,
    /// `training.model_prob` as given (`None`: not given).
    model_prob_given: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskConfig {
    /// The `model_dict` key.
    pub name: String,
    pub config: Config,
    /// `model_branch_alias`: other names the head answers to (`--model-branch`, `--head`).
    pub aliases: Vec<String>,
    /// `finetune_head`: the head of the `--finetune` model this task is fine-tuned from.
    pub finetune_head: Option<String>,
}

/// Whether an input is multi-task (has `model.model_dict`).
pub fn is_multitask(value: &Value) -> bool {
    value.pointer("/model/model_dict").is_some()
}

impl MultiTaskConfig {
    /// Reads a multi-task input whose `model_dict` keys come in `order` (the file's order:
    /// [`model_dict_order`]; a JSON value does not keep it). Relative paths are resolved
    /// against `base_dir`.
    pub fn from_value(value: &Value, order: &[String], base_dir: &Path) -> Result<Self> {
        let root = value
            .as_object()
            .ok_or_else(|| ConfigError::invalid("<root>", "must be an object"))?;
        for key in root.keys().filter(|k| !k.starts_with('_')) {
            if !matches!(
                key.as_str(),
                "model" | "learning_rate" | "loss_dict" | "optimizer" | "training" | "nvnmd"
            ) {
                let why = match key.as_str() {
                    "loss" => "a multi-task input gives each task's loss in loss_dict",
                    _ => "not a key of a multi-task input",
                };
                return Err(ConfigError::invalid(
                    key.as_str(),
                    format!(
                        "{why}; its keys are model, learning_rate, loss_dict, optimizer and \
                         training"
                    ),
                ));
            }
        }
        let model = object(&value["model"], "model")?;
        let shared = match model.get("shared_dict") {
            Some(v) => object(v, "model.shared_dict")?.clone(),
            None => Map::new(),
        };
        let model_dict = object(&model["model_dict"], "model.model_dict")?;
        if model_dict.is_empty() {
            return Err(ConfigError::invalid(
                "model.model_dict",
                "is empty; give one model per task",
            ));
        }
        let names: Vec<String> = order
            .iter()
            .filter(|k| model_dict.contains_key(*k) && !k.starts_with('_'))
            .cloned()
            .collect();
        // Each task's model type first, as a single-task input's: a model dpw lacks (DPA-4) is
        // refused for that, not for the keys that come with it.
        for name in &names {
            let path = join("model.model_dict", name);
            let (m, refs) = resolve_model(&path, &model_dict[name], &shared)?;
            if m.get("type").and_then(Value::as_str) == Some("linear_ener") {
                return Err(ConfigError::unsupported(
                    join(&path, "type"),
                    "a linear model as a task of a multi-task input is not implemented",
                ));
            }
            super::model::check_type(&Value::Object(m), "model")
                .map_err(|e| relocate(e, name, &refs))?;
        }
        for key in model.keys().filter(|k| !k.starts_with('_')) {
            if key != "shared_dict" && key != "model_dict" {
                return Err(ConfigError::invalid(
                    join("model", key),
                    "a multi-task model has only shared_dict and model_dict; give this key in \
                     each model_dict entry",
                ));
            }
        }
        let training = object(value.get("training").unwrap_or(&Value::Null), "training")?;
        let data_dict = object(
            training.get("data_dict").unwrap_or(&Value::Null),
            "training.data_dict",
        )?;
        if training.contains_key("numb_epoch") {
            return Err(ConfigError::invalid(
                "training.numb_epoch",
                "is for a single-task input; a multi-task one gives training.numb_steps or \
                 training.num_epoch_dict (epochs per task)",
            ));
        }
        let num_epoch = num_epoch_dict(training, &names)?;
        let loss_dict = match value.get("loss_dict") {
            Some(v) => object(v, "loss_dict")?.clone(),
            None => Map::new(),
        };

        let mut tasks = Vec::new();
        let mut descriptor_key: Option<(String, u32)> = None;
        let mut fittings = Vec::new();
        for name in &names {
            let (mut task_value, refs) = task_input(
                value,
                name,
                &model_dict[name],
                &shared,
                &loss_dict,
                data_dict,
            )?;
            if let Some(e) = &num_epoch {
                // Each task's epochs make its steps; the run's come from all of them
                // (train::multitask).
                let k = tasks.len();
                task_value["training"]["numb_epoch"] = e[k].into();
            }
            match (&descriptor_key, &refs.descriptor) {
                (None, Some(k)) => descriptor_key = Some(k.clone()),
                (Some(a), Some(b)) if a.0 == b.0 && a.1 != b.1 => {
                    return Err(ConfigError::unsupported(
                        join(&join("model.model_dict", name), "descriptor"),
                        format!(
                            "shared level {} differs from the first task's {}: dpw shares the \
                             descriptor among all the tasks at one level",
                            b.1, a.1
                        ),
                    ))
                }
                (Some(a), Some(b)) if a == b => {}
                _ => {
                    return Err(ConfigError::unsupported(
                        join(&join("model.model_dict", name), "descriptor"),
                        format!(
                            "dpw's multi-task training shares one descriptor among all the \
                             tasks: give every task's descriptor as the same shared_dict key \
                             (e.g. \"descriptor\": {:?}); found {}",
                            descriptor_key.as_ref().map_or("my_descriptor", |k| &k.0),
                            describe(&model_dict[name]["descriptor"])
                        ),
                    ))
                }
            }
            fittings.push(refs.fitting.clone());
            let config =
                Config::from_value(&task_value, base_dir).map_err(|e| relocate(e, name, &refs))?;
            tasks.push(TaskConfig {
                name: name.clone(),
                config,
                aliases: refs.aliases,
                finetune_head: refs.finetune_head,
            });
        }
        let first = &tasks[0];
        for t in &tasks[1..] {
            let protect = |t: &TaskConfig| t.config.model.data_stat_protect;
            if protect(t) != protect(first) {
                return Err(ConfigError::invalid(
                    join(&join("model.model_dict", &t.name), "data_stat_protect"),
                    format!(
                        "{} differs from task '{}''s {}: DeePMD-kit takes one for every task \
                         (\"must be the same in each branch when multitask\")",
                        protect(t),
                        first.name,
                        protect(first)
                    ),
                ));
            }
            if t.config.model.type_map != first.config.model.type_map {
                return Err(ConfigError::invalid(
                    join(&join("model.model_dict", &t.name), "type_map"),
                    format!(
                        "{:?} differs from task '{}''s {:?}: tasks sharing a descriptor share \
                         its type_map (give both the same shared_dict key, e.g. type_map_all)",
                        t.config.model.type_map, first.name, first.config.model.type_map
                    ),
                ));
            }
        }
        let (descriptor_key, descriptor_level) = descriptor_key.expect("checked for every task");
        if descriptor_level == 1 {
            type_embedding_shared(&tasks[0], &descriptor_key)?;
        }
        case_embedding(&tasks)?;
        let model_prob_given = training.get("model_prob").cloned();
        let model_prob = match &num_epoch {
            // Made with the steps, once the data are read.
            Some(e) => e.iter().map(|_| 1.0 / e.len() as f64).collect(),
            None => model_prob(model_prob_given.as_ref(), &tasks)?,
        };
        Ok(MultiTaskConfig {
            tasks,
            model_prob,
            num_epoch,
            descriptor_key,
            descriptor_level,
            fitting_keys: fittings,
            shared_dict: Value::Object(shared),
            model_prob_given,
        })
    }

    /// The settings all tasks share: steps, display, checkpoints, seed (the first task's
    /// training section, which holds them as every task's does).
    pub fn training(&self) -> &TrainingConfig {
        &self.tasks[0].config.training
    }

    /// The first task's input: the learning rate, optimizer and training settings they share.
    pub fn first(&self) -> &Config {
        &self.tasks[0].config
    }

    /// out.json: the input with every default filled in, each task's model whole in its
    /// `model_dict` entry (the shared parts in place), as `dp train` writes a multi-task input.
    pub fn to_expanded_json(&self) -> Value {
        let mut model_dict = Map::new();
        let mut loss_dict = Map::new();
        let mut data_dict = Map::new();
        let mut training = Value::Null;
        let mut rest = Map::new();
        for t in &self.tasks {
            let mut v = t.config.to_expanded_json();
            let mut model = v["model"].take();
            if !t.aliases.is_empty() {
                model["model_branch_alias"] = json!(t.aliases);
            }
            if let Some(h) = &t.finetune_head {
                model["finetune_head"] = json!(h);
            }
            model_dict.insert(t.name.clone(), model);
            loss_dict.insert(t.name.clone(), v["loss"].take());
            let tr = v["training"].as_object_mut().expect("an object");
            let mut data = Map::new();
            for key in DATA_KEYS {
                if let Some(x) = tr.remove(*key) {
                    data.insert(key.to_string(), x);
                }
            }
            data_dict.insert(t.name.clone(), Value::Object(data));
            if training.is_null() {
                training = v["training"].take();
                for key in ["learning_rate", "optimizer"] {
                    rest.insert(key.into(), v[key].take());
                }
            }
        }
        training["data_dict"] = Value::Object(data_dict);
        if let Some(p) = &self.model_prob_given {
            training["model_prob"] = p.clone();
        }
        if let Some(e) = &self.num_epoch {
            let t = training.as_object_mut().expect("an object");
            t.remove("numb_epoch");
            t.remove("numb_steps");
            let dict: Map<String, Value> = (self.tasks.iter().zip(e))
                .map(|(t, e)| (t.name.clone(), (*e).into()))
                .collect();
            t.insert("num_epoch_dict".into(), Value::Object(dict));
        }
        rest.insert(
            "model".into(),
            json!({"shared_dict": self.shared_dict, "model_dict": model_dict}),
        );
        rest.insert("loss_dict".into(), Value::Object(loss_dict));
        rest.insert("training".into(), training);
        Value::Object(rest)
    }
}

/// Shared level 1 shares the type embedding alone, as DeePMD-kit's DPA-1, DPA-2, DPA-3 and
/// se_e3_tebd do (its other descriptors raise NotImplementedError).
fn type_embedding_shared(first: &TaskConfig, key: &str) -> Result<()> {
    let kind = first.config.model.descriptor.kind;
    if kind.is_mixed() {
        return Ok(());
    }
    Err(ConfigError::unsupported(
        join(&join("model.model_dict", &first.name), "descriptor"),
        format!(
            "\"{key}:1\" shares a descriptor's type embedding, which a {} descriptor does not \
             have (DeePMD-kit shares at level 1 only {})",
            first.config.model.descriptor.r#type,
            crate::model::registry::mixed_type_names()
        ),
    ))
}

/// DeePMD-kit's case embedding (`get_case_embd_config`): one `dim_case_embd` for every task,
/// wide enough for a one-hot row per task.
fn case_embedding(tasks: &[TaskConfig]) -> Result<()> {
    let dim = |t: &TaskConfig| t.config.model.fitting_net.dim_case_embd;
    let path = |t: &TaskConfig| {
        join(
            &join("model.model_dict", &t.name),
            "fitting_net.dim_case_embd",
        )
    };
    let d0 = dim(&tasks[0]);
    if d0 > 0 && d0 < tasks.len() {
        return Err(ConfigError::invalid(
            path(&tasks[0]),
            format!(
                "{d0} is fewer than the {} tasks: the case embedding is a one-hot row per task",
                tasks.len()
            ),
        ));
    }
    match tasks.iter().find(|t| dim(t) != d0) {
        Some(t) => Err(ConfigError::invalid(
            path(t),
            format!(
                "{} differs from task '{}''s {d0}: every task's case embedding has the same \
                 width",
                dim(t),
                tasks[0].name
            ),
        )),
        None => Ok(()),
    }
}

impl MultiTaskConfig {
    /// The fitting net of task `k`, as the first task that has it: tasks that name one
    /// `shared_dict` key share it; a task with a fitting net of its own is its own group.
    pub fn fitting_group(&self, k: usize) -> usize {
        match &self.fitting_keys[k] {
            Some(key) => (self.fitting_keys.iter())
                .position(|x| x.as_ref() == Some(key))
                .expect("task k names it"),
            None => k,
        }
    }

    /// Each task's case embedding in a new run, in task order: the one-hot row of its place
    /// among the tasks sorted by name (DeePMD-kit's `get_case_embd_config`); empty rows where
    /// dim_case_embd is 0.
    pub fn case_embeddings(&self) -> Vec<Vec<f64>> {
        let mut sorted: Vec<&str> = self.tasks.iter().map(|t| t.name.as_str()).collect();
        sorted.sort_unstable();
        (self.tasks.iter())
            .map(|t| {
                let dim = t.config.model.fitting_net.dim_case_embd;
                let at = sorted.iter().position(|n| *n == t.name).expect("a task");
                (0..dim).map(|i| f64::from(u8::from(i == at))).collect()
            })
            .collect()
    }
}

/// The keys of a `data_dict` entry: they go to the task's training section.
const DATA_KEYS: &[&str] = &[
    "training_data",
    "validation_data",
    "stat_file",
    "stat_file_mode",
];

/// Where a task's input took its parts from, for error paths.
struct TaskRefs {
    /// The shared_dict key of its descriptor (with the shared level), type_map and fitting
    /// net, where they are references.
    descriptor: Option<(String, u32)>,
    type_map: Option<String>,
    fitting: Option<String>,
    aliases: Vec<String>,
    finetune_head: Option<String>,
}

/// Task model `model` (at `path`) with its shared parts in place: the `shared_dict` entries its
/// `type_map`, `descriptor` and `fitting_net` name (`"key"`, or `"key:level"`: level 0 shares
/// the part whole, level 1 a descriptor's type embedding alone).
fn resolve_model(
    path: &str,
    model: &Value,
    shared: &Map<String, Value>,
) -> Result<(Map<String, Value>, TaskRefs)> {
    let mut model = object(model, path)?.clone();
    let mut refs = TaskRefs {
        descriptor: None,
        type_map: None,
        fitting: None,
        aliases: Vec::new(),
        finetune_head: None,
    };
    if let Some(a) = model.remove("model_branch_alias") {
        let apath = join(path, "model_branch_alias");
        refs.aliases = (a.as_array())
            .and_then(|l| l.iter().map(|x| x.as_str().map(str::to_string)).collect())
            .ok_or_else(|| super::keys::wrong_type(&apath, "a list of names", &a))?;
    }
    if let Some(h) = model.remove("finetune_head") {
        let hpath = join(path, "finetune_head");
        let h = h
            .as_str()
            .ok_or_else(|| super::keys::wrong_type(&hpath, "a head's name", &h))?;
        if h == "RANDOM" {
            return Err(ConfigError::invalid(
                hpath,
                "RANDOM is not a head: leave finetune_head out (and name the task as no head \
                 of the --finetune model) for a new fitting net",
            ));
        }
        refs.finetune_head = Some(h.to_string());
    }
    for key in ["type_map", "descriptor", "fitting_net"] {
        let Some(Value::String(r)) = model.get(key).cloned() else {
            continue;
        };
        let kpath = join(path, key);
        let (k, level) = match r.split_once(':') {
            Some((k, l)) => (
                k,
                l.parse::<i64>().map_err(|_| {
                    ConfigError::invalid(
                        &kpath,
                        format!("{r:?}: the shared level after ':' must be an integer"),
                    )
                })?,
            ),
            None => (r.as_str(), 0),
        };
        if level != 0 && !(key == "descriptor" && level == 1) {
            return Err(ConfigError::unsupported(
                kpath,
                format!(
                    "{r:?}: sharing a {key} at shared level {level} is not implemented; dpw \
                     shares a part whole (level 0: \"{k}\") or a descriptor's type embedding \
                     alone (level 1)"
                ),
            ));
        }
        let part = shared.get(k).ok_or_else(|| {
            ConfigError::invalid(
                &kpath,
                format!(
                    "{r:?} is not a key of model.shared_dict (its keys: {})",
                    shared.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        model.insert(key.into(), part.clone());
        match key {
            "type_map" => refs.type_map = Some(k.to_string()),
            "descriptor" => refs.descriptor = Some((k.to_string(), level as u32)),
            _ => refs.fitting = Some(k.to_string()),
        }
    }
    Ok((model, refs))
}

/// The single-task input of task `name`.
fn task_input(
    value: &Value,
    name: &str,
    model: &Value,
    shared: &Map<String, Value>,
    loss_dict: &Map<String, Value>,
    data_dict: &Map<String, Value>,
) -> Result<(Value, TaskRefs)> {
    let path = join("model.model_dict", name);
    let (model, refs) = resolve_model(&path, model, shared)?;
    let loss = loss_dict.get(name).cloned();
    let mut training = object(value.get("training").unwrap_or(&Value::Null), "training")?.clone();
    training.remove("data_dict");
    training.remove("model_prob");
    training.remove("num_epoch_dict");
    let dpath = join("training.data_dict", name);
    let data = object(
        data_dict.get(name).ok_or_else(|| ConfigError::Missing {
            path: dpath.clone(),
            expected: "the task's training_data (and validation_data)".into(),
        })?,
        &dpath,
    )?;
    for (k, v) in data {
        if k.starts_with('_') {
            continue;
        }
        if !DATA_KEYS.contains(&k.as_str()) {
            return Err(ConfigError::invalid(
                join(&dpath, k),
                format!("not a key of a data_dict entry ({})", DATA_KEYS.join(", ")),
            ));
        }
        training.insert(k.clone(), v.clone());
    }
    let mut v = Map::new();
    v.insert("model".into(), Value::Object(model));
    for key in ["learning_rate", "optimizer", "nvnmd"] {
        if let Some(x) = value.get(key) {
            v.insert(key.into(), x.clone());
        }
    }
    if let Some(l) = loss {
        v.insert("loss".into(), l);
    }
    v.insert("training".into(), Value::Object(training));
    Ok((Value::Object(v), refs))
}

/// A task's error with its path where the multi-task input has the key.
fn relocate(e: ConfigError, task: &str, refs: &TaskRefs) -> ConfigError {
    let place = |p: String| -> String {
        let under = |p: &str, prefix: &str| -> Option<String> {
            (p == prefix
                || p.starts_with(&format!("{prefix}."))
                || p.starts_with(&format!("{prefix}[")))
            .then(|| p[prefix.len()..].to_string())
        };
        if let (Some(rest), Some((k, _))) = (under(&p, "model.descriptor"), &refs.descriptor) {
            return format!("model.shared_dict.{k}{rest}");
        }
        if let (Some(rest), Some(k)) = (under(&p, "model.type_map"), &refs.type_map) {
            return format!("model.shared_dict.{k}{rest}");
        }
        if let (Some(rest), Some(k)) = (under(&p, "model.fitting_net"), &refs.fitting) {
            return format!("model.shared_dict.{k}{rest}");
        }
        if let Some(rest) = under(&p, "model") {
            return format!("model.model_dict.{task}{rest}");
        }
        if let Some(rest) = under(&p, "loss") {
            return format!("loss_dict.{task}{rest}");
        }
        for key in DATA_KEYS {
            if let Some(rest) = under(&p, &format!("training.{key}")) {
                return format!("training.data_dict.{task}.{key}{rest}");
            }
        }
        p
    };
    match e {
        ConfigError::UnknownKey {
            key,
            path,
            parent,
            valid,
        } => ConfigError::UnknownKey {
            key,
            path: place(path),
            parent: place(parent),
            valid,
        },
        ConfigError::WrongType {
            path,
            expected,
            found,
        } => ConfigError::WrongType {
            path: place(path),
            expected,
            found,
        },
        ConfigError::Missing { path, expected } => ConfigError::Missing {
            path: place(path),
            expected,
        },
        ConfigError::Invalid { path, message } => ConfigError::Invalid {
            path: place(path),
            message,
        },
        ConfigError::Unsupported { path, message } => ConfigError::Unsupported {
            path: place(path),
            message,
        },
        other => other,
    }
}

/// `training.num_epoch_dict` in the order of `names`, checked as DeePMD-kit checks it: every
/// task, each positive and finite, and neither `numb_steps` nor `model_prob` beside it.
fn num_epoch_dict(training: &Map<String, Value>, names: &[String]) -> Result<Option<Vec<f64>>> {
    let path = "training.num_epoch_dict";
    let Some(v) = training.get("num_epoch_dict").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let m = object(v, path)?;
    for key in ["numb_steps", "model_prob"] {
        if training.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ConfigError::invalid(
                path,
                format!("is mutually exclusive with training.{key}; give one of them"),
            ));
        }
    }
    let missing: Vec<&str> = (names.iter())
        .filter(|n| !m.contains_key(*n))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(ConfigError::invalid(
            path,
            format!("must give every task's epochs; missing: {missing:?}"),
        ));
    }
    if let Some(k) = m.keys().find(|k| !names.contains(k)) {
        return Err(ConfigError::invalid(
            join(path, k),
            "is not a task of model.model_dict",
        ));
    }
    (names.iter())
        .map(|n| {
            let p = join(path, n);
            let e = to_f64(&m[n], &p)?;
            match e.is_finite() && e > 0.0 {
                true => Ok(e),
                false => Err(ConfigError::invalid(
                    p,
                    format!("must be positive; found {e}"),
                )),
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// `training.model_prob` normalized, as DeePMD-kit's `resolve_model_prob`: every task listed,
/// finite, non-negative, with a positive sum; not given (or empty), each task's number of
/// training systems.
fn model_prob(given: Option<&Value>, tasks: &[TaskConfig]) -> Result<Vec<f64>> {
    let path = "training.model_prob";
    let raw: Vec<f64> = match given.filter(|v| v.as_object().is_none_or(|m| !m.is_empty())) {
        Some(v) => {
            let m = object(v, path)?;
            if let Some(k) = m.keys().find(|k| !tasks.iter().any(|t| &t.name == *k)) {
                return Err(ConfigError::invalid(
                    join(path, k),
                    "is not a task of model.model_dict",
                ));
            }
            let missing: Vec<&str> = (tasks.iter())
                .filter(|t| !m.contains_key(&t.name))
                .map(|t| t.name.as_str())
                .collect();
            if !missing.is_empty() {
                return Err(ConfigError::invalid(
                    path,
                    format!("must give every task's probability; missing: {missing:?}"),
                ));
            }
            (tasks.iter())
                .map(|t| {
                    let p = join(path, &t.name);
                    let x = to_f64(&m[&t.name], &p)?;
                    if !x.is_finite() || x < 0.0 {
                        return Err(ConfigError::invalid(
                            p,
                            format!("must be finite and non-negative; found {x}"),
                        ));
                    }
                    Ok(x)
                })
                .collect::<Result<_>>()?
        }
        None => (tasks.iter())
            .map(|t| t.config.training.training_data.system_paths.len() as f64)
            .collect(),
    };
    let sum: f64 = raw.iter().sum();
    if sum <= 0.0 {
        return Err(ConfigError::invalid(
            path,
            "the probabilities sum to 0; give at least one task a positive one",
        ));
    }
    Ok(raw.iter().map(|p| p / sum).collect())
}

fn object<'v>(v: &'v Value, path: &str) -> Result<&'v Map<String, Value>> {
    v.as_object().ok_or_else(|| match v {
        Value::Null => ConfigError::Missing {
            path: path.to_string(),
            expected: "an object".into(),
        },
        _ => super::keys::wrong_type(path, "an object", v),
    })
}

/// The `model.model_dict` keys of an input's text in the order written (JSON or YAML, as
/// `yaml` says): the order of `training.model_prob`'s probabilities in the task draw, which a
/// parsed [`Value`] does not keep. Empty where the text has no model_dict.
pub fn model_dict_order(text: &str, yaml: bool) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Root {
        #[serde(default)]
        model: Option<ModelKeys>,
    }
    #[derive(serde::Deserialize)]
    struct ModelKeys {
        #[serde(default, deserialize_with = "keys_in_order")]
        model_dict: Vec<String>,
    }
    fn keys_in_order<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Vec<String>, D::Error> {
        struct Keys;
        impl<'de> Visitor<'de> for Keys {
            type Value = Vec<String>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Vec<String>, A::Error> {
                let mut keys = Vec::new();
                while let Some((k, IgnoredAny)) = m.next_entry::<String, IgnoredAny>()? {
                    keys.push(k);
                }
                Ok(keys)
            }
        }
        d.deserialize_map(Keys)
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let root: Option<Root> = match yaml {
        true => serde_yaml_ng::from_str(text).ok(),
        false => serde_json::from_str(text).ok(),
    };
    root.and_then(|r| r.model)
        .map_or(Vec::new(), |m| m.model_dict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_dict_keeps_the_written_order() {
        let text = r#"{"model": {"shared_dict": {}, "model_dict": {"water": {"a": [1]}, "alloy": {}, "b": 1}}}"#;
        assert_eq!(model_dict_order(text, false), ["water", "alloy", "b"]);
        let yaml = "model:\n  model_dict:\n    zeta: {}\n    alpha: {}\n";
        assert_eq!(model_dict_order(yaml, true), ["zeta", "alpha"]);
        assert!(model_dict_order("{\"model\": {}}", false).is_empty());
    }

    #[test]
    fn errors_name_the_multitask_key() {
        // The relocation of error paths: shared parts to shared_dict, the rest to the task.
        let refs = TaskRefs {
            descriptor: Some(("dpa1".into(), 0)),
            type_map: Some("type_map_all".into()),
            fitting: None,
            aliases: vec![],
            finetune_head: None,
        };
        let e = |p: &str| relocate(ConfigError::invalid(p, "x"), "water", &refs).to_string();
        assert_eq!(e("model.descriptor.sel"), "model.shared_dict.dpa1.sel: x");
        assert_eq!(
            e("model.type_map[2]"),
            "model.shared_dict.type_map_all[2]: x"
        );
        assert_eq!(
            e("model.fitting_net.neuron"),
            "model.model_dict.water.fitting_net.neuron: x"
        );
        assert_eq!(e("loss.start_pref_e"), "loss_dict.water.start_pref_e: x");
        assert_eq!(
            e("training.training_data.systems"),
            "training.data_dict.water.training_data.systems: x"
        );
        assert_eq!(e("training.numb_steps"), "training.numb_steps: x");
        assert_eq!(
            e("model.descriptors"),
            "model.model_dict.water.descriptors: x"
        );
        let shared_fit = TaskRefs {
            fitting: Some("fit".into()),
            ..refs
        };
        assert_eq!(
            relocate(
                ConfigError::invalid("model.fitting_net.neuron", "x"),
                "water",
                &shared_fit
            )
            .to_string(),
            "model.shared_dict.fit.neuron: x"
        );
    }
}

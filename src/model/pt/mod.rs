//! DeePMD-kit's PyTorch training checkpoints (`model.ckpt-N.pt`, docs/deepmd-spec.md §21.1):
//! one model or, multi-task, one per head (`model_dict` key). A head is read by building the
//! serialization tree DeePMD-kit's `dp convert-backend` would write for it and reading that as a
//! `.yaml` model, so a `.pt` gives exactly the model its `.yaml` gives.
//!
//! What fine-tuning needs besides the model is here too: the heads, each head's section of the
//! input (`model_params`), its type map, and `train_infos`.

mod archive;
mod state;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;

use super::yaml::{model_from_tree, YamlModel};
use super::Model;

/// The one head of a single-task checkpoint (its state dict's `model.Default.` keys).
pub const DEFAULT_HEAD: &str = "Default";

/// Whether `path` is a PyTorch file: named `.pt`/`.pth`, or a zip archive (what `torch.save`
/// writes; dpw's own files and `.yaml` models are neither).
pub fn is_pt(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext == "pt" || ext == "pth" {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"PK\x03\x04"
}

/// The model of head `head` of the checkpoint at `path` (`None`: a single-task file's one).
pub fn read_pt_model(path: &Path, head: Option<&str>) -> Result<Model> {
    let ckpt = Checkpoint::read(path)?;
    Ok(ckpt.model(head)?.model)
}

/// A `.pt` training checkpoint: its state dict's tensors and its `_extra_state`.
pub struct Checkpoint {
    path: PathBuf,
    state: archive::StateDict,
    /// The `model_dict` keys of a multi-task file, sorted; empty for a single-task one.
    tasks: Vec<String>,
}

impl Checkpoint {
    pub fn read(path: &Path) -> Result<Self> {
        let state = archive::read_state_dict(path)?;
        let params = (state.extra_state.get("model_params"))
            .ok_or_else(|| anyhow!("{}: _extra_state has no model_params", path.display()))?;
        let mut tasks: Vec<String> = match params.get("model_dict") {
            Some(Json::Object(m)) => m.keys().cloned().collect(),
            Some(_) => bail!(
                "{}: model_params.model_dict is not a mapping of heads",
                path.display()
            ),
            None => vec![],
        };
        tasks.sort();
        Ok(Checkpoint {
            path: path.to_path_buf(),
            state,
            tasks,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_multitask(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// The heads a model can be read from: the `model_dict` keys (sorted; the file does not
    /// keep the input's order), or [`DEFAULT_HEAD`] alone.
    pub fn heads(&self) -> Vec<&str> {
        match self.is_multitask() {
            true => self.tasks.iter().map(String::as_str).collect(),
            false => vec![DEFAULT_HEAD],
        }
    }

    /// The input's `model` section as training used it (normalized; multi-task: `shared_dict`
    /// as written and `model_dict` with the shared parts filled in).
    pub fn model_params(&self) -> &Json {
        &self.state.extra_state["model_params"]
    }

    /// `{"lr": …, "step": …}`: the learning rate and 0-based index of the last step taken.
    pub fn train_infos(&self) -> Option<&Json> {
        self.state.extra_state.get("train_infos")
    }

    /// The head `head` names: a `model_dict` key, or one of a head's `model_branch_alias`es;
    /// [`DEFAULT_HEAD`] (or none) for a single-task file. Refused as DeePMD-kit refuses it.
    pub fn head(&self, head: Option<&str>) -> Result<&str> {
        let p = self.path.display();
        let list = || {
            (self.tasks.iter())
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !self.is_multitask() {
            return match head {
                None | Some(DEFAULT_HEAD) => Ok(DEFAULT_HEAD),
                Some(h) => bail!(
                    "{p}: a single-task checkpoint; single-task pretrained models only provide \
                     the '{DEFAULT_HEAD}' branch, got '{h}'"
                ),
            };
        }
        let Some(h) = head else {
            bail!(
                "{p}: a multi-task checkpoint with the heads {}; head must be specified in \
                 multitask mode: give one with --head where the command has it (dpw test, dpw \
                 convert), or write that head's model with `dpw convert {p} --head HEAD \
                 model.yaml` and give the .yaml",
                list()
            );
        };
        if let Some(t) = self.tasks.iter().find(|t| *t == h) {
            return Ok(t);
        }
        let aliased = self.tasks.iter().find(|t| {
            let aliases = self.model_params()["model_dict"][t.as_str()].get("model_branch_alias");
            (aliases.and_then(Json::as_array)).is_some_and(|a| a.iter().any(|x| x == h))
        });
        aliased.map(String::as_str).ok_or_else(|| {
            anyhow!(
                "{p}: no head (model branch) or alias named '{h}'; the heads are {}",
                list()
            )
        })
    }

    /// The section of the input that built head `head` (a `model_dict` entry, or the whole
    /// `model_params` of a single-task file).
    pub fn head_params(&self, head: Option<&str>) -> Result<&Json> {
        let h = self.head(head)?;
        Ok(match self.is_multitask() {
            true => &self.model_params()["model_dict"][h],
            false => self.model_params(),
        })
    }

    /// Head `head`'s element names, in type order.
    pub fn type_map(&self, head: Option<&str>) -> Result<Vec<String>> {
        let mp = self.head_params(head)?;
        (mp.get("type_map").and_then(Json::as_array))
            .and_then(|a| a.iter().map(|t| t.as_str().map(str::to_string)).collect())
            .ok_or_else(|| {
                anyhow!(
                    "{}: model_params has no type_map list for this head",
                    self.path.display()
                )
            })
    }

    /// DeePMD-kit's serialization of head `head` (the tree of its `.yaml`, without the
    /// `software`, `version` and `time` stamps, which the checkpoint does not record).
    pub fn tree(&self, head: Option<&str>) -> Result<serde_yaml_ng::Value> {
        let h = self.head(head)?;
        let mp = self.head_params(Some(h))?;
        let refuse = |what: String| self.unmapped(h, &what);
        state::head_tree(&self.state, h, mp, &refuse).with_context(|| self.reading(h))
    }

    /// Head `head`'s model, and what of it dpw evaluates but cannot train from.
    pub fn model(&self, head: Option<&str>) -> Result<YamlModel> {
        let h = self.head(head)?;
        model_from_tree(&self.tree(Some(h))?).with_context(|| self.reading(h))
    }

    fn reading(&self, head: &str) -> String {
        match self.is_multitask() {
            true => format!("reading head '{head}' of {}", self.path.display()),
            false => format!("reading {}", self.path.display()),
        }
    }

    /// The refusal of a part this mapping does not cover, with DeePMD-kit's way to a `.yaml`.
    fn unmapped(&self, head: &str, what: &str) -> anyhow::Error {
        let p = self.path.display();
        let how = match self.is_multitask() {
            true => format!(
                "`dp --pt freeze -c {p} --head {head} -o frozen` then `dp convert-backend \
                 frozen.pth model.yaml`"
            ),
            false => format!("`dp convert-backend {p} model.yaml`"),
        };
        anyhow!(
            "{what} is not read from a .pt checkpoint (dpw maps {} with the ener fitting); \
             run {how} and give the .yaml",
            state::DESCRIPTORS
        )
    }
}

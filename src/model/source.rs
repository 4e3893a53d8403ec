//! A model from any file dpw reads: a dpw model or checkpoint, a DeePMD-kit `.yaml`, or one head
//! of a DeePMD-kit `.pt` training checkpoint; each checked by [`Model::check`] on the way in.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::file::{
    container_heads, head_container, is_container, model_from_container, pick_head, read_container,
    Container, HeadEntry,
};
use super::pt::{is_pt, Checkpoint};
use super::yaml::{read_yaml_model, YamlModel};
use super::Model;

pub fn read_model(path: &Path) -> Result<Model> {
    Ok(read_any(path, None)?.model)
}

/// [`read_model`] with a head for a multi-task `.pt` (`--head`); any other file has one model,
/// which a head other than a single-task `.pt`'s `Default` does not name.
pub fn read_model_head(path: &Path, head: Option<&str>) -> Result<Model> {
    Ok(read_any(path, head)?.model)
}

/// A model to start training from (`--init-model`, `--init-frz-model`): [`read_model`], but a
/// `.yaml` model whose fitting has `atom_ener` is refused. DeePMD-kit takes the fitting net's
/// output on an all-zero descriptor off those atoms' energies at every step, a term that moves
/// with the net; dpw takes it off the bias once, which is exact only for a net that stays.
pub fn read_model_to_train(path: &Path) -> Result<Model> {
    let YamlModel { model, atom_ener } = read_any(path, None)?;
    if let Some(ae) = atom_ener {
        let ae: Vec<String> = (ae.iter())
            .map(|e| e.map_or("null".into(), |x| x.to_string()))
            .collect();
        bail!(
            "{}: model.fitting.atom_ener is [{}]: dpw evaluates such a model, but cannot train \
             from it (training with atom_ener is not supported, as in input.json); `dpw convert \
             {} OUT.yaml` writes the same model with the vacuum energies in its bias and no \
             atom_ener, which trains",
            path.display(),
            ae.join(", "),
            path.display()
        );
    }
    Ok(model)
}

/// A model file read once: a dpw model or (multi-task) checkpoint, a DeePMD-kit `.pt`
/// checkpoint, or a DeePMD-kit `.yaml` (read when its model is asked for: it has no heads).
/// `--finetune` asks one file for its heads, a head's model or the descriptor its heads share,
/// and the `.pt`'s own input; a pretrained DeePMD-kit checkpoint is tens of MB, and a multi-task
/// fine-tune asked once per task.
pub struct ModelFile {
    path: PathBuf,
    kind: Kind,
}

enum Kind {
    Dpw(Container, Option<Vec<HeadEntry>>),
    Pt(Box<Checkpoint>),
    Yaml,
}

impl ModelFile {
    pub fn open(path: &Path) -> Result<Self> {
        if !path.exists() {
            bail!("model file {} does not exist", path.display());
        }
        let kind = if is_container(path) {
            let c = read_container(path)?;
            let heads = container_heads(&c);
            Kind::Dpw(c, heads)
        } else if is_pt(path) {
            Kind::Pt(Box::new(Checkpoint::read(path)?))
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            Kind::Yaml
        } else {
            bail!(
                "{}: not a model file dpw can read (a DeePMD-kit .yaml model or .pt checkpoint, \
                 or a dpw model or checkpoint)",
                path.display()
            )
        };
        Ok(ModelFile {
            path: path.to_path_buf(),
            kind,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The heads of a multi-task file, empty for a file of one model.
    pub fn heads(&self) -> Vec<String> {
        match &self.kind {
            Kind::Dpw(_, heads) => heads.iter().flatten().map(|h| h.name.clone()).collect(),
            Kind::Pt(ck) if ck.is_multitask() => ck.heads().iter().map(|h| h.to_string()).collect(),
            _ => Vec::new(),
        }
    }

    /// The DeePMD-kit checkpoint, whose own input `--use-pretrain-script` takes.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        match &self.kind {
            Kind::Pt(ck) => Some(ck),
            _ => None,
        }
    }

    /// The model, of `head` for a multi-task file (`--head`); a file of one model has no head
    /// but a single-task `.pt`'s `Default`.
    pub fn model(&self, head: Option<&str>) -> Result<YamlModel> {
        let path = &self.path;
        let model = match (&self.kind, head) {
            (Kind::Pt(ck), _) => return ck.model(head),
            (Kind::Dpw(c, Some(heads)), _) => {
                let k = pick_head(heads, head, path)?;
                model_from_container(&head_container(c, k)).with_context(|| {
                    format!("reading head '{}' of {}", heads[k].name, path.display())
                })?
            }
            (Kind::Dpw(_, None) | Kind::Yaml, Some(h)) => bail!(
                "--head {h}: {} holds one model; heads are those of a multi-task checkpoint \
                 (dpw's or a DeePMD-kit .pt)",
                path.display()
            ),
            (Kind::Yaml, None) => return read_yaml_model(path),
            (Kind::Dpw(c, None), None) => {
                model_from_container(c).with_context(|| format!("reading {}", path.display()))?
            }
        };
        Ok(YamlModel {
            model,
            atom_ener: None,
        })
    }

    /// The model whose descriptor `RANDOM` takes: DeePMD-kit takes the first task's of a
    /// multi-task model, which a `.pt` read here does not order; the heads of the models dpw
    /// trains share theirs, and one that does not is refused.
    pub fn shared_descriptor(&self, heads: &[String]) -> Result<Model> {
        let Some((first, rest)) = heads.split_first() else {
            return Ok(self.model(None)?.model);
        };
        let m = self.model(Some(first))?.model;
        let dlen = m.layout().descriptor_len();
        for h in rest {
            let o = self.model(Some(h))?.model;
            if o.params[..dlen] != m.params[..dlen]
                || (o.davg, o.dstd) != (m.davg.clone(), m.dstd.clone())
            {
                bail!(
                    "the heads {first} and {h} do not share one descriptor, and which is the \
                     first task's (the one DeePMD-kit's RANDOM takes) is not known here: give \
                     --model-branch HEAD"
                );
            }
        }
        Ok(m)
    }
}

fn read_any(path: &Path, head: Option<&str>) -> Result<YamlModel> {
    ModelFile::open(path)?.model(head)
}

//! A model from any file dpw reads: a dpw model or checkpoint, a DeePMD-kit `.yaml`, or one head
//! of a DeePMD-kit `.pt` training checkpoint; each checked by [`Model::check`] on the way in.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::file::{
    container_heads, head_container, is_container, model_from_container, pick_head, read_container,
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

/// The heads of a multi-task file (DeePMD-kit's `.pt` or dpw's checkpoint), empty for a file of
/// one model.
pub fn head_names(path: &Path) -> Result<Vec<String>> {
    if is_container(path) {
        let heads = container_heads(&read_container(path)?).unwrap_or_default();
        return Ok(heads.into_iter().map(|h| h.name).collect());
    }
    if is_pt(path) {
        let ck = Checkpoint::read(path)?;
        if ck.is_multitask() {
            return Ok(ck.heads().iter().map(|h| h.to_string()).collect());
        }
    }
    Ok(Vec::new())
}

/// The model whose descriptor `RANDOM` takes: DeePMD-kit takes the first task's of a
/// multi-task model, which a `.pt` read here does not order; the heads of the models dpw
/// trains share theirs, and one that does not is refused.
pub fn read_shared_descriptor(path: &Path, heads: &[String]) -> Result<Model> {
    let Some((first, rest)) = heads.split_first() else {
        return read_model(path);
    };
    // The file read once, every head taken from it.
    enum Opened {
        Dpw(super::file::Container, Vec<super::file::HeadEntry>),
        Pt(Box<Checkpoint>),
    }
    let opened = match is_container(path) {
        true => {
            let c = read_container(path)?;
            let entries = container_heads(&c).unwrap_or_default();
            Opened::Dpw(c, entries)
        }
        false => Opened::Pt(Box::new(Checkpoint::read(path)?)),
    };
    let head = |h: &str| -> Result<Model> {
        match &opened {
            Opened::Dpw(c, entries) => {
                model_from_container(&head_container(c, pick_head(entries, Some(h), path)?))
            }
            Opened::Pt(ck) => Ok(ck.model(Some(h))?.model),
        }
    };
    let m = head(first)?;
    let dlen = m.layout().descriptor_len();
    for h in rest {
        let o = head(h)?;
        if o.params[..dlen] != m.params[..dlen]
            || (o.davg, o.dstd) != (m.davg.clone(), m.dstd.clone())
        {
            bail!(
                "the heads {first} and {h} do not share one descriptor, and which is the first \
                 task's (the one DeePMD-kit's RANDOM takes) is not known here: give \
                 --model-branch HEAD"
            );
        }
    }
    Ok(m)
}

fn read_any(path: &Path, head: Option<&str>) -> Result<YamlModel> {
    if !path.exists() {
        bail!("model file {} does not exist", path.display());
    }
    if !is_container(path) && is_pt(path) {
        return Checkpoint::read(path)?.model(head);
    }
    let c = match is_container(path) {
        true => Some(read_container(path)?),
        false => None,
    };
    let heads = c.as_ref().and_then(container_heads);
    if let (Some(h), None) = (head, &heads) {
        bail!(
            "--head {h}: {} holds one model; heads are those of a multi-task checkpoint (dpw's \
             or a DeePMD-kit .pt)",
            path.display()
        );
    }
    if let Some(c) = c {
        let reading = || format!("reading {}", path.display());
        let model = match heads {
            Some(heads) => {
                let k = pick_head(&heads, head, path)?;
                model_from_container(&head_container(&c, k)).with_context(|| {
                    format!("reading head '{}' of {}", heads[k].name, path.display())
                })?
            }
            None => model_from_container(&c).with_context(reading)?,
        };
        return Ok(YamlModel {
            model,
            atom_ener: None,
        });
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext == "yaml" || ext == "yml" {
        return read_yaml_model(path);
    }
    bail!(
        "{}: not a model file dpw can read (a DeePMD-kit .yaml model or .pt checkpoint, or a dpw \
         model or checkpoint)",
        path.display()
    )
}

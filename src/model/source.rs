//! A model from any file dpw reads: a dpw model or checkpoint, or a DeePMD-kit `.yaml`; each
//! checked by [`Model::check`] on the way in.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::file::{is_container, model_from_container, read_container};
use super::{read_deepmd_yaml, Model};

pub fn read_model(path: &Path) -> Result<Model> {
    if !path.exists() {
        bail!("model file {} does not exist", path.display());
    }
    if is_container(path) {
        return model_from_container(&read_container(path)?)
            .with_context(|| format!("reading {}", path.display()));
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext == "yaml" || ext == "yml" {
        return read_deepmd_yaml(path);
    }
    bail!(
        "{}: not a model file dpw can read (a DeePMD-kit .yaml model, or a dpw model or checkpoint)",
        path.display()
    )
}

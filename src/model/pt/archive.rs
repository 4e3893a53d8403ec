//! The `.pt` file itself (docs/deepmd-spec.md §21.1): the zip archive and its pickle, read by
//! `pytorch-reader`, down to what dpw uses of it: the state dict's tensors by name and
//! `_extra_state` as a JSON tree. The optimizer state is parsed with the rest of the pickle but
//! not kept.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use pytorch_reader::{DType, PickleError, PickleValue, PytorchError, PytorchReader, Tensor};
use serde_json::Value as Json;

/// The key of `torch.save`'s dict that holds `ModelWrapper.state_dict()`.
const STATE_KEY: &str = "model";

/// A state dict: tensors by their full names (`model.<head>.atomic_model.…`) and the
/// `_extra_state` entry (`model_params`, `train_infos`).
pub struct StateDict {
    tensors: HashMap<String, Tensor>,
    pub extra_state: Json,
}

/// One tensor's values, widened to f64 (float32 values convert exactly), row-major.
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
    /// `float64` or `float32`, as DeePMD-kit's serialization names the dtype.
    pub dtype: &'static str,
}

pub fn read_state_dict(path: &Path) -> Result<StateDict> {
    let tensors = PytorchReader::with_top_level_key(path, STATE_KEY)
        .map_err(|e| explain(path, e))?
        .into_tensors()
        .into_iter()
        // `filter_layers.networks` and `filter_layers._networks` are two names of one
        // ModuleList, so every tensor under the second is a copy of one under the first.
        .filter(|(name, _)| !name.contains("._networks."))
        .collect();
    let extra = match PytorchReader::read_pickle_data(path, Some(STATE_KEY))
        .map_err(|e| explain(path, e))?
    {
        PickleValue::Dict(mut d) => d.remove("_extra_state"),
        _ => None,
    };
    let Some(extra) = extra else {
        bail!(
            "{}: the state dict has no `_extra_state` (model_params, train_infos): not a \
             DeePMD-kit training checkpoint (`dp --pt train` writes it)",
            path.display()
        );
    };
    let extra_state = to_json(extra, "_extra_state").with_context(|| path.display().to_string())?;
    Ok(StateDict {
        tensors,
        extra_state,
    })
}

impl StateDict {
    /// The names under `prefix`, for error messages and for counting a ModuleList's items.
    pub fn names_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        (self.tensors.keys())
            .map(String::as_str)
            .filter(move |n| n.starts_with(prefix))
    }

    /// The tensor `name`, or `None` where the state dict has none.
    pub fn get(&self, name: &str) -> Result<Option<Array>> {
        let Some(t) = self.tensors.get(name) else {
            return Ok(None);
        };
        let dtype = float_dtype(name, t.dtype())?;
        let bytes = t.read().with_context(|| format!("reading tensor {name}"))?;
        let data = match t.dtype() {
            DType::F32 => (bytes.chunks_exact(4))
                .map(|b| f32::from_ne_bytes(b.try_into().expect("4 bytes")) as f64)
                .collect(),
            _ => (bytes.chunks_exact(8))
                .map(|b| f64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .collect(),
        };
        Ok(Some(Array {
            shape: t.shape().to_vec(),
            data,
            dtype,
        }))
    }

    /// Tensor `name`'s shape and dtype, without reading its values.
    pub fn meta(&self, name: &str) -> Result<(&[usize], &'static str)> {
        let t = (self.tensors.get(name))
            .ok_or_else(|| anyhow!("the state dict has no tensor {name}"))?;
        Ok((t.shape(), float_dtype(name, t.dtype())?))
    }

    /// [`Self::get`] of a tensor the model cannot be without.
    pub fn need(&self, name: &str) -> Result<Array> {
        self.get(name)?
            .ok_or_else(|| anyhow!("the state dict has no tensor {name}"))
    }
}

/// DeePMD-kit's name of a float dtype; a model's parameters and statistics are never another.
fn float_dtype(name: &str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F64 => Ok("float64"),
        DType::F32 => Ok("float32"),
        other => bail!("tensor {name}: dtype {other:?}, where a float32 or float64 is needed"),
    }
}

/// An error of the reader, said in terms of what the user gave.
fn explain(path: &Path, e: PytorchError) -> anyhow::Error {
    let p = path.display();
    match e {
        // TorchScript names its module classes `__torch__.<python path>`: `dp freeze`'s output.
        PytorchError::Pickle(PickleError::UnsupportedType(name))
            if name.starts_with("__torch__") =>
        {
            anyhow!(
                "{p}: a frozen DeePMD-kit model (.pth) holds TorchScript, which dpw does not run; \
                 give the .pt checkpoint it was frozen from, or run `dp convert-backend {p} \
                 model.yaml` and give the .yaml"
            )
        }
        PytorchError::Zip(z) => anyhow!(
            "{p}: not a complete PyTorch checkpoint (truncated or corrupt?): the zip archive \
             cannot be read ({z})"
        ),
        PytorchError::KeyNotFound(k) => anyhow!(
            "{p}: not a DeePMD-kit training checkpoint (`dp --pt train` saves the state dict \
             under \"{STATE_KEY}\"): {k}"
        ),
        e => anyhow!("{p}: cannot read it as a PyTorch checkpoint: {e}"),
    }
}

/// A pickled value of `_extra_state` (plain dicts, lists, tuples, strings, numbers, bools,
/// None: the input's `model` section and `train_infos`) as JSON; `at` names it in errors.
fn to_json(v: PickleValue, at: &str) -> Result<Json> {
    Ok(match v {
        PickleValue::None => Json::Null,
        PickleValue::Bool(b) => b.into(),
        PickleValue::Int(i) => i.into(),
        PickleValue::Float(x) => serde_json::Number::from_f64(x)
            .map(Json::Number)
            .ok_or_else(|| anyhow!("{at}: {x} has no JSON form"))?,
        PickleValue::String(s) => s.into(),
        PickleValue::List(items) => (items.into_iter().enumerate())
            .map(|(i, v)| to_json(v, &format!("{at}[{i}]")))
            .collect::<Result<Vec<_>>>()?
            .into(),
        PickleValue::Dict(d) => Json::Object(
            d.into_iter()
                .map(|(k, v)| {
                    let v = to_json(v, &format!("{at}.{k}"))?;
                    Ok((k, v))
                })
                .collect::<Result<_>>()?,
        ),
        PickleValue::Bytes(_) => bail!("{at}: bytes, where DeePMD-kit writes none"),
        PickleValue::Unsupported(t) => bail!("{at}: a Python {t}, where DeePMD-kit writes none"),
    })
}

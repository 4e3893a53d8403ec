//! dpw's own files (frozen models and checkpoints): a JSON header and raw little-endian f64
//! arrays. Written atomically (temporary file in the same folder, then rename), so a crash while
//! saving never damages the file that was there before.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use super::{Model, ModelSpec};

const MAGIC: &[u8; 8] = b"DPWFILE1";

/// Writes `bytes` to `path` through a temporary sibling and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// As [`write_atomic`], the contents streamed by `fill` (a checkpoint is tens of MB: no copy of
/// it is built in memory).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .context("output path has no file name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let f = fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = std::io::BufWriter::new(f);
    fill(&mut w)
        .and_then(|_| w.flush())
        .and_then(|_| w.get_ref().sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

/// A header and named f64 arrays in one file.
pub fn write_container(path: &Path, header: &Value, arrays: &[(&str, &[f64])]) -> Result<()> {
    let lens: Vec<Value> = arrays.iter().map(|(n, a)| json!([n, a.len()])).collect();
    let head = serde_json::to_vec(&json!({ "header": header, "arrays": lens }))?;
    write_atomic_with(path, |w| {
        w.write_all(MAGIC)?;
        w.write_all(&(head.len() as u64).to_le_bytes())?;
        w.write_all(&head)?;
        for (_, a) in arrays {
            for x in a.iter() {
                w.write_all(&x.to_le_bytes())?;
            }
        }
        Ok(())
    })
}

pub struct Container {
    pub header: Value,
    pub arrays: Vec<(String, Vec<f64>)>,
}

impl Container {
    pub fn array(&self, name: &str) -> Result<&[f64]> {
        self.arrays
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.as_slice())
            .with_context(|| format!("the file has no array '{name}'"))
    }
}

pub fn is_container(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == MAGIC
}

pub fn read_container(path: &Path) -> Result<Container> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let bad = || {
        format!(
            "{} is not a dpw model or checkpoint file (or it is truncated)",
            path.display()
        )
    };
    ensure!(bytes.len() >= 16 && &bytes[..8] == MAGIC, bad());
    let hlen = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let head: Value = bytes
        .get(16..16 + hlen)
        .and_then(|h| serde_json::from_slice(h).ok())
        .with_context(bad)?;
    let mut off = 16 + hlen;
    let mut arrays = Vec::new();
    for a in head["arrays"].as_array().with_context(bad)? {
        let (name, n) = (
            a[0].as_str().with_context(bad)?,
            a[1].as_u64().with_context(bad)? as usize,
        );
        let raw = bytes.get(off..off + 8 * n).with_context(bad)?;
        arrays.push((
            name.to_string(),
            raw.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ));
        off += 8 * n;
    }
    if off != bytes.len() {
        bail!(bad());
    }
    Ok(Container {
        header: head["header"].clone(),
        arrays,
    })
}

/// The header and arrays that describe a model, shared by frozen models and checkpoints.
pub fn model_parts(m: &Model) -> (Value, Vec<(&'static str, &[f64])>) {
    let header = json!({ "spec": m.spec });
    let arrays = vec![
        ("params", m.params.as_slice()),
        ("davg", m.davg.as_slice()),
        ("dstd", m.dstd.as_slice()),
        ("bias", m.bias.as_slice()),
        ("out_std", m.out_std.as_slice()),
    ];
    (header, arrays)
}

pub fn model_from_container(c: &Container) -> Result<Model> {
    let spec: ModelSpec = serde_json::from_value(c.header["spec"].clone())
        .context("the model hyper-parameters are unreadable")?;
    let m = Model {
        params: c.array("params")?.to_vec(),
        davg: c.array("davg")?.to_vec(),
        dstd: c.array("dstd")?.to_vec(),
        bias: c.array("bias")?.to_vec(),
        out_std: c.array("out_std")?.to_vec(),
        spec,
    };
    let (nt, np) = (m.spec.ntypes(), m.layout().len);
    ensure!(
        m.params.len() == np,
        "the file holds {} parameters, its model needs {np}",
        m.params.len()
    );
    ensure!(
        m.davg.len() == 4 * nt && m.dstd.len() == 4 * nt && m.bias.len() == nt,
        "statistics have the wrong size"
    );
    Ok(m)
}

pub fn save_model(path: &Path, m: &Model) -> Result<()> {
    let (mut header, arrays) = model_parts(m);
    header["kind"] = json!("model");
    write_container(path, &header, &arrays)
}

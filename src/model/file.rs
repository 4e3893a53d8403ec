//! dpw's own files (frozen models and checkpoints): a JSON header and raw little-endian f64
//! arrays, then a CRC-32 of everything before it, so that a damaged file is refused on load
//! instead of training on. Written atomically (temporary file in the same folder, then rename),
//! so a crash while saving never damages the file that was there before.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use super::{Model, ModelSpec};

/// Files with a checksum trailer.
const MAGIC: &[u8; 8] = b"DPWFILE2";
/// Files of dpw before the checksum: still read, unverified.
const MAGIC_V1: &[u8; 8] = b"DPWFILE1";

/// Writes `bytes` to `path` through a temporary sibling and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// As [`write_atomic`], the contents streamed by `fill` (a checkpoint is tens of MB: no copy of
/// it is built in memory). A failure (a full disk, a file size limit) removes the temporary
/// file, which would otherwise fill the disk further and which nothing would ever read, and
/// names `path`, the file the user asked for.
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
        .with_context(|| format!("{}: not a file path", path.display()))?
        .to_string_lossy();
    if !dir.is_dir() {
        bail!(
            "cannot write {}: the folder {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let mut created = false;
    let write = || -> std::io::Result<()> {
        let f = fs::File::create(&tmp)?;
        created = true;
        let mut w = std::io::BufWriter::new(f);
        fill(&mut w)?;
        w.flush()?;
        w.get_ref().sync_all()?;
        drop(w);
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        if !created {
            return anyhow::Error::new(e).context(format!("cannot write {}", path.display()));
        }
        let removed = match fs::remove_file(&tmp) {
            Err(r) if r.kind() != std::io::ErrorKind::NotFound => {
                format!("could not be removed: {r}")
            }
            _ => "removed".to_string(),
        };
        anyhow::Error::new(e).context(format!(
            "cannot write {} (its temporary file {} {removed})",
            path.display(),
            tmp.display()
        ))
    })
}

/// Passes writes through, hashing them.
struct Crc<'a> {
    w: &'a mut dyn Write,
    h: crc32fast::Hasher,
}

impl Write for Crc<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.w.write(buf)?;
        self.h.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// A header and named f64 arrays in one file, with the checksum.
pub fn write_container(path: &Path, header: &Value, arrays: &[(&str, &[f64])]) -> Result<()> {
    let lens: Vec<Value> = arrays.iter().map(|(n, a)| json!([n, a.len()])).collect();
    let head = serde_json::to_vec(&json!({ "header": header, "arrays": lens }))?;
    write_atomic_with(path, |w| {
        let mut c = Crc {
            w,
            h: crc32fast::Hasher::new(),
        };
        c.write_all(MAGIC)?;
        c.write_all(&(head.len() as u64).to_le_bytes())?;
        c.write_all(&head)?;
        for (_, a) in arrays {
            for x in a.iter() {
                c.write_all(&x.to_le_bytes())?;
            }
        }
        let sum = c.h.finalize();
        c.w.write_all(&sum.to_le_bytes())
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

    /// An array that files of earlier versions (or of models without it) lack: empty then.
    pub fn array_or_empty(&self, name: &str) -> Vec<f64> {
        self.array(name)
            .map_or_else(|_| Vec::new(), <[f64]>::to_vec)
    }
}

pub fn is_container(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && (&magic == MAGIC || &magic == MAGIC_V1)
}

/// What a file that is not a dpw model or checkpoint is, for the error saying so.
fn not_a_container(path: &Path, bytes: &[u8]) -> String {
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e == "yaml" || e == "yml");
    if yaml && std::str::from_utf8(bytes).is_ok_and(|t| t.contains("model:")) {
        format!(
            "{} is a DeePMD-kit .yaml model, not a dpw model or checkpoint file",
            path.display()
        )
    } else {
        format!(
            "{} is not a dpw model or checkpoint file ({} bytes, no dpw signature)",
            path.display(),
            bytes.len()
        )
    }
}

pub fn read_container(path: &Path) -> Result<Container> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let magic = bytes.get(..8);
    if magic != Some(MAGIC) && magic != Some(MAGIC_V1) {
        bail!(not_a_container(path, &bytes));
    }
    let body = if magic == Some(MAGIC) {
        ensure!(
            bytes.len() >= 20,
            "{} is truncated ({} bytes)",
            path.display(),
            bytes.len()
        );
        let (body, sum) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(sum.try_into().expect("4 bytes"));
        let actual = crc32fast::hash(body);
        ensure!(
            stored == actual,
            "{} is damaged or truncated: its checksum does not match its contents (stored \
             crc32 {stored:08x}, computed {actual:08x}); use another checkpoint or model file",
            path.display()
        );
        body
    } else {
        tracing::debug!("{}: no checksum (an older dpw file)", path.display());
        &bytes[..]
    };
    parse_container(body).map_err(|why| {
        anyhow::anyhow!(
            "{} is not a readable dpw model or checkpoint file: {why}",
            path.display()
        )
    })
}

/// The header and arrays of a container's bytes (checksum trailer removed).
fn parse_container(bytes: &[u8]) -> Result<Container, String> {
    let hlen = bytes
        .get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or("truncated header")?;
    let head: Value = usize::try_from(hlen)
        .ok()
        .and_then(|h| bytes.get(16..16usize.checked_add(h)?))
        .ok_or_else(|| format!("header of {hlen} bytes in a file of {}", bytes.len()))
        .and_then(|h| serde_json::from_slice(h).map_err(|e| format!("header: {e}")))?;
    let mut off = 16 + hlen as usize;
    let mut arrays = Vec::new();
    let list = head["arrays"]
        .as_array()
        .ok_or("no array list in the header")?;
    for a in list {
        let (Some(name), Some(n)) = (a[0].as_str(), a[1].as_u64()) else {
            return Err(format!("bad array entry {a} in the header"));
        };
        let raw = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(8))
            .and_then(|len| bytes.get(off..off.checked_add(len)?))
            .ok_or_else(|| format!("array '{name}' of {n} values runs past the end of the file"))?;
        arrays.push((
            name.to_string(),
            raw.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ));
        off += raw.len();
    }
    if off != bytes.len() {
        return Err(format!("{} bytes after the last array", bytes.len() - off));
    }
    Ok(Container {
        header: head["header"].clone(),
        arrays,
    })
}

/// The header and arrays that describe a model, shared by frozen models and checkpoints.
pub fn model_parts(m: &Model) -> Parts<'_> {
    let header = json!({ "spec": m.spec });
    let mut arrays = vec![
        ("params", m.params.as_slice()),
        ("davg", m.davg.as_slice()),
        ("dstd", m.dstd.as_slice()),
        ("bias", m.bias.as_slice()),
    ];
    // Only a model with frame or atomic parameters has them, so other files stay as they were.
    if !m.fit_input_avg.is_empty() {
        arrays.push(("fit_input_avg", m.fit_input_avg.as_slice()));
        arrays.push(("fit_input_inv_std", m.fit_input_inv_std.as_slice()));
    }
    if !m.out_std.is_empty() {
        arrays.push(("out_std", m.out_std.as_slice()));
    }
    if !m.case_embd.is_empty() {
        arrays.push(("case_embd", m.case_embd.as_slice()));
    }
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
        fit_input_avg: c.array_or_empty("fit_input_avg"),
        fit_input_inv_std: c.array_or_empty("fit_input_inv_std"),
        out_std: c.array_or_empty("out_std"),
        case_embd: c.array_or_empty("case_embd"),
        spec,
    };
    m.check()?;
    Ok(m)
}

/// The `kind` of a file of several heads: a multi-task checkpoint, whose `header.heads[k]` is
/// head k's `{name, aliases, header}` and whose arrays of head k are named `h{k}/<array>`.
pub const HEADS_KIND: &str = "multitask-checkpoint";

/// A head of a file of several heads ([`HEADS_KIND`]).
pub struct HeadEntry {
    pub name: String,
    /// Other names it answers to (DeePMD-kit's `model_branch_alias`).
    pub aliases: Vec<String>,
}

/// The heads of a container, in order; `None` for a file of one model.
pub fn container_heads(c: &Container) -> Option<Vec<HeadEntry>> {
    if c.header["kind"] != json!(HEADS_KIND) {
        return None;
    }
    let heads = c.header["heads"].as_array()?;
    Some(
        heads
            .iter()
            .map(|h| HeadEntry {
                name: h["name"].as_str().unwrap_or_default().to_string(),
                aliases: (h["aliases"].as_array().into_iter().flatten())
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect(),
            })
            .collect(),
    )
}

/// Head `k` of a file of several heads, as the container of its own file.
pub fn head_container(c: &Container, k: usize) -> Container {
    let prefix = format!("h{k}/");
    Container {
        header: c.header["heads"][k]["header"].clone(),
        arrays: (c.arrays.iter())
            .filter_map(|(n, a)| Some((n.strip_prefix(&prefix)?.to_string(), a.clone())))
            .collect(),
    }
}

/// A file's header and its named arrays, borrowed from what they describe.
pub type Parts<'a> = (Value, Vec<(&'static str, &'a [f64])>);

/// One head of a file of several heads: its name, its aliases and its file's [`Parts`].
pub struct HeadParts<'a> {
    pub name: String,
    pub aliases: Vec<String>,
    pub parts: Parts<'a>,
}

/// Writes a file of several heads: `header`'s fields, and each head.
pub fn write_heads(path: &Path, mut header: Value, heads: &[HeadParts]) -> Result<()> {
    header["kind"] = json!(HEADS_KIND);
    header["heads"] = (heads.iter())
        .map(|h| json!({"name": h.name, "aliases": h.aliases, "header": h.parts.0}))
        .collect();
    let names: Vec<Vec<String>> = (heads.iter().enumerate())
        .map(|(k, h)| h.parts.1.iter().map(|(n, _)| format!("h{k}/{n}")).collect())
        .collect();
    let arrays: Vec<(&str, &[f64])> = (heads.iter().zip(&names))
        .flat_map(|(h, names)| (h.parts.1.iter().zip(names)).map(|((_, a), n)| (n.as_str(), *a)))
        .collect();
    write_container(path, &header, &arrays)
}

/// Which of `heads` (of the file at `path`) `head` names, by name or alias.
pub fn pick_head(heads: &[HeadEntry], head: Option<&str>, path: &Path) -> Result<usize> {
    let names = || {
        (heads.iter())
            .map(|h| format!("'{}'", h.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(h) = head else {
        bail!(
            "{}: a multi-task checkpoint with the heads {}; give the head with --head",
            path.display(),
            names()
        );
    };
    (heads
        .iter()
        .position(|e| e.name == h || e.aliases.iter().any(|a| a == h)))
    .ok_or_else(|| {
        anyhow::anyhow!(
            "{}: no head (model branch) or alias named '{h}'; the heads are {}",
            path.display(),
            names()
        )
    })
}

pub fn save_model(path: &Path, m: &Model) -> Result<()> {
    let (mut header, arrays) = model_parts(m);
    header["kind"] = json!("model");
    write_container(path, &header, &arrays)
}

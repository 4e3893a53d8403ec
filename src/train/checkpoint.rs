//! Training checkpoints: everything needed to continue a run bit for bit (parameters in the
//! training precision stored exactly as f64, statistics, Adam moments, step, sampler states,
//! display accumulators), in dpw's container format. Saving writes `<save_ckpt>-<step>`
//! atomically, then points `<save_ckpt>` at it (a symlink swapped in by rename, or an atomic
//! copy where symlinks are unavailable), then prunes old checkpoints. A crash at any moment
//! leaves `<save_ckpt>` naming a complete checkpoint.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::config::Precision;
use crate::data::Sampler;
use crate::model::file::{
    is_container, model_from_container, model_parts, read_container, write_container, Container,
    Parts, HEADS_KIND,
};
use crate::model::{read_deepmd_yaml, Model};

pub const KIND: &str = "checkpoint";
const VERSION: u64 = 1;

/// Shape of a run's data: a restart continues the checkpoint's batch stream only on data of
/// the same shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DataShape {
    pub nframes: Vec<usize>,
    pub batch_sizes: Vec<usize>,
    pub probs: Vec<f64>,
    /// `"mixed:N"`'s N ([`crate::train::dataset::DataSet::mixed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub model: Model,
    pub precision: Precision,
    /// Steps done (the next step index, 0-based).
    pub step: usize,
    /// lr of the last step done (informative).
    pub lr: f64,
    pub adam_m: Vec<f64>,
    pub adam_v: Vec<f64>,
    pub sampler: Sampler,
    pub valid_sampler: Option<Sampler>,
    pub train_shape: DataShape,
    pub valid_shape: Option<DataShape>,
    /// `disp_avg` running sums since the last display: `[count, then one per metric the loss
    /// can show]` (`ener`: rmse, rmse_e, rmse_f, rmse_v).
    pub disp_acc: Vec<f64>,
}

/// What a run saves: a [`Checkpoint`], or a multi-task run's (one per head).
pub trait Saved {
    /// Steps done.
    fn step(&self) -> usize;
    fn write(&self, path: &Path) -> Result<()>;
}

impl Saved for Checkpoint {
    fn step(&self) -> usize {
        self.step
    }

    fn write(&self, path: &Path) -> Result<()> {
        let (header, arrays) = self.parts()?;
        write_container(path, &header, &arrays)
    }
}

impl Checkpoint {
    /// The header and arrays of its file: the model's, then the training state's.
    pub fn parts(&self) -> Result<Parts<'_>> {
        let (mut header, mut arrays) = model_parts(&self.model);
        let h = header.as_object_mut().expect("model header is an object");
        h.insert("kind".into(), json!(KIND));
        h.insert("version".into(), json!(VERSION));
        h.insert("precision".into(), json!(self.precision.as_str()));
        h.insert("step".into(), json!(self.step));
        h.insert("lr".into(), json!(self.lr));
        h.insert("sampler".into(), serde_json::to_value(&self.sampler)?);
        h.insert(
            "valid_sampler".into(),
            serde_json::to_value(&self.valid_sampler)?,
        );
        h.insert(
            "train_shape".into(),
            serde_json::to_value(&self.train_shape)?,
        );
        h.insert(
            "valid_shape".into(),
            serde_json::to_value(&self.valid_shape)?,
        );
        arrays.push(("adam_m", &self.adam_m));
        arrays.push(("adam_v", &self.adam_v));
        arrays.push(("disp_acc", &self.disp_acc));
        Ok((header, arrays))
    }

    pub fn read(path: &Path) -> Result<Checkpoint> {
        if !path.exists() {
            bail!("checkpoint {} does not exist", path.display());
        }
        if !is_container(path) && read_deepmd_yaml(path).is_ok() {
            bail!(
                "{} is a DeePMD-kit .yaml model, not a training checkpoint: it has no optimizer \
                 state (use --init-model to start a new run from it)",
                path.display()
            );
        }
        let c = read_container(path)?;
        if c.header["kind"] == json!(HEADS_KIND) {
            bail!(
                "{} is a multi-task checkpoint: restart it with its multi-task input, or take \
                 a head with `dpw freeze -c {} --head HEAD`",
                path.display(),
                path.display()
            );
        }
        if c.header["kind"] != json!(KIND) {
            bail!(
                "{} is a frozen model, not a training checkpoint: it has no optimizer state \
                 (use --init-model to start a new run from it)",
                path.display()
            );
        }
        Self::from_container(&c, path)
    }

    /// The checkpoint a container holds (of the file at `path`, which errors name).
    pub fn from_container(c: &Container, path: &Path) -> Result<Checkpoint> {
        let h = &c.header;
        let ctx = || format!("reading checkpoint {}", path.display());
        ensure!(
            h["version"].as_u64() == Some(VERSION),
            "{}: checkpoint version {} is not supported (this dpw reads version {VERSION})",
            path.display(),
            h["version"]
        );
        let model = model_from_container(c).with_context(ctx)?;
        let precision = match h["precision"].as_str() {
            Some("float64") => Precision::F64,
            Some("float32") => Precision::F32,
            other => bail!("{}: unknown precision {other:?}", path.display()),
        };
        let field = |k: &str| -> Result<Value> { Ok(h[k].clone()) };
        let adam_m = c.array("adam_m").with_context(ctx)?.to_vec();
        let adam_v = c.array("adam_v").with_context(ctx)?.to_vec();
        ensure!(
            adam_m.len() == model.params.len() && adam_v.len() == model.params.len(),
            "{}: optimizer state has the wrong size",
            path.display()
        );
        let acc = c.array("disp_acc").with_context(ctx)?;
        let slots = model.spec.fitting.output.fitting().metrics().len();
        ensure!(acc.len() == 1 + slots, "{}: bad disp_acc", path.display());
        let ck = Checkpoint {
            model,
            precision,
            step: h["step"].as_u64().context("no step").with_context(ctx)? as usize,
            lr: h["lr"].as_f64().unwrap_or(f64::NAN),
            adam_m,
            adam_v,
            sampler: serde_json::from_value(field("sampler")?).with_context(ctx)?,
            valid_sampler: serde_json::from_value(field("valid_sampler")?).with_context(ctx)?,
            train_shape: serde_json::from_value(field("train_shape")?).with_context(ctx)?,
            valid_shape: serde_json::from_value(field("valid_shape")?).with_context(ctx)?,
            disp_acc: acc.to_vec(),
        };
        ck.check().map_err(|why| {
            anyhow::anyhow!(
                "{}: impossible training state: {why}; the file was altered or written by \
                 something else than dpw (its checksum, if it has one, matches its contents)",
                path.display()
            )
        })?;
        Ok(ck)
    }

    /// The restored state is one a run can reach: everything a restart indexes by or divides
    /// by is in range (a file with a valid checksum can still be crafted, and an older one has
    /// none), so that a restart cannot panic halfway. Names the field at fault.
    fn check(&self) -> Result<(), String> {
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(format!("lr is {}", self.lr));
        }
        let bad = |name: &str, a: &[f64], ok: fn(f64) -> bool| {
            (a.iter().position(|&x| !ok(x))).map(|i| format!("{name}[{i}] is {}", a[i]))
        };
        if let Some(e) = bad("adam_m", &self.adam_m, f64::is_finite)
            .or_else(|| bad("adam_v", &self.adam_v, |x| x.is_finite() && x >= 0.0))
            // NaN: a metric whose labels a displayed batch lacked (DeePMD-kit shows it so).
            .or_else(|| {
                bad("disp_acc", &self.disp_acc, |x| {
                    x.is_nan() || (x.is_finite() && x >= 0.0)
                })
            })
        {
            return Err(e);
        }
        if self.disp_acc[0].fract() != 0.0 {
            return Err(format!(
                "disp_acc[0], a count of steps, is {}",
                self.disp_acc[0]
            ));
        }
        let streams = [
            ("sampler", Some(&self.sampler), Some(&self.train_shape)),
            (
                "valid_sampler",
                self.valid_sampler.as_ref(),
                self.valid_shape.as_ref(),
            ),
        ];
        for (name, sampler, shape) in streams {
            match (sampler, shape) {
                (Some(s), Some(d)) => s
                    .check(&d.nframes, &d.batch_sizes, &d.probs, d.mixed)
                    .map_err(|why| format!("{name}: {why}"))?,
                (None, None) => {}
                (Some(_), None) => return Err(format!("{name} without its data shape")),
                (None, Some(_)) => return Err(format!("a data shape without {name}")),
            }
        }
        Ok(())
    }
}

/// `<save_ckpt>-<step>`.
pub fn numbered(save_ckpt: &Path, step: usize) -> PathBuf {
    let mut s = save_ckpt.as_os_str().to_owned();
    s.push(format!("-{step}"));
    PathBuf::from(s)
}

/// Saves `ck` as `<save_ckpt>-<step>`, points `<save_ckpt>` at it and rotates the numbered
/// checkpoints of the run (keeping at least the one just written). Returns the numbered path.
pub fn save(ck: &impl Saved, save_ckpt: &Path, rotation: &mut Rotation) -> Result<PathBuf> {
    let file = numbered(save_ckpt, ck.step());
    ck.write(&file)?;
    point_to(save_ckpt, &file, ck)?;
    if let Some(name) = file.file_name() {
        // Written over by this run: now one of its own.
        rotation.earlier.remove(name);
    }
    prune(save_ckpt, &file, rotation)?;
    Ok(file)
}

/// Which numbered checkpoints `max_ckpt_keep` may remove: the run's own.
///
/// DeePMD-kit 3.2.0's PT trainer removes, at each save, the oldest `<save_ckpt>*.pt` of the
/// folder whoever wrote it, so a fresh run in the folder of an earlier one deletes that run's
/// checkpoints one by one, without a word. dpw keeps them instead, and says so at the start: a
/// lost checkpoint cannot be had back, an extra one costs disk space the user can free. A restart
/// continues the run of its checkpoint, so there every numbered checkpoint already in the folder
/// is the run's and rotates as before the stop.
pub struct Rotation {
    keep: usize,
    /// Names of the numbered checkpoints an earlier run left, never removed.
    earlier: HashSet<OsString>,
}

impl Rotation {
    pub fn new(save_ckpt: &Path, keep: usize, restart: bool) -> Result<Rotation> {
        let mut earlier = Vec::new();
        if !restart {
            earlier = numbered_in(save_ckpt)?;
            earlier.sort_by_key(|c| c.step);
        }
        if let (Some(first), Some(last)) = (earlier.first(), earlier.last()) {
            let dir = dir_of(save_ckpt).display();
            let (first, last) = (first.path.display(), last.path.display());
            let found = match earlier.len() {
                1 => {
                    format!("a numbered checkpoint of an earlier run is in {dir} ({first}): it is")
                }
                n => format!(
                    "{n} numbered checkpoints of an earlier run are in {dir} ({first} to {last}): \
                     they are"
                ),
            };
            tracing::warn!(
                "{found} kept, as max_ckpt_keep rotates only this run's, except where this run \
                 saves at the same step"
            );
        }
        Ok(Rotation {
            keep: keep.max(1),
            earlier: earlier
                .into_iter()
                .filter_map(|c| c.path.file_name().map(|n| n.to_owned()))
                .collect(),
        })
    }
}

/// A numbered checkpoint found in the folder.
struct Numbered {
    mtime: Option<SystemTime>,
    step: u64,
    path: PathBuf,
}

/// The numbered checkpoints `<save_ckpt>-<step>` in the folder (plain files, not links).
fn numbered_in(save_ckpt: &Path) -> Result<Vec<Numbered>> {
    let prefix = format!(
        "{}-",
        save_ckpt
            .file_name()
            .context("save_ckpt has no file name")?
            .to_string_lossy()
    );
    let dir = dir_of(save_ckpt);
    let mut found = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(step) = name
            .strip_prefix(&prefix)
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        found.push(Numbered {
            mtime: meta.modified().ok(),
            step,
            path: e.path(),
        });
    }
    Ok(found)
}

fn dir_of(p: &Path) -> &Path {
    p.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(unix)]
fn point_to(link: &Path, target: &Path, _ck: &impl Saved) -> Result<()> {
    let name = target.file_name().context("checkpoint has no file name")?;
    let link_name = link
        .file_name()
        .context("save_ckpt has no file name")?
        .to_string_lossy();
    let tmp = dir_of(link).join(format!(".{link_name}.link{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp)
        .with_context(|| format!("cannot create symlink {}", tmp.display()))?;
    std::fs::rename(&tmp, link)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), link.display()))
}

#[cfg(not(unix))]
fn point_to(link: &Path, _target: &Path, ck: &impl Saved) -> Result<()> {
    ck.write(link)
}

/// Removes the run's oldest numbered checkpoints beyond its `keep` (by modification time, then
/// step), never `current`.
fn prune(save_ckpt: &Path, current: &Path, rotation: &Rotation) -> Result<()> {
    let mut found: Vec<Numbered> = numbered_in(save_ckpt)?
        .into_iter()
        .filter(|c| {
            c.path
                .file_name()
                .is_none_or(|n| !rotation.earlier.contains(n))
        })
        .collect();
    found.sort_by_key(|c| (c.mtime, c.step));
    let cur_name = current.file_name();
    let mut n = found.len();
    for c in &found {
        if n <= rotation.keep {
            break;
        }
        if c.path.file_name() == cur_name {
            continue;
        }
        remove_pruned(&c.path)?;
        n -= 1;
    }
    Ok(())
}

/// Removes a pruned checkpoint; one already gone (removed by hand, say) is as good as removed.
fn remove_pruned(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.with_context(|| format!("cannot remove {}", p.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_a_checkpoint_already_gone_is_no_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("model.ckpt-19");
        std::fs::write(&p, b"x").unwrap();
        remove_pruned(&p).unwrap();
        assert!(!p.exists());
        remove_pruned(&p).unwrap();
        // Other failures still are errors.
        let sub = d.path().join("dir");
        std::fs::create_dir(&sub).unwrap();
        assert!(remove_pruned(&sub).is_err());
    }
}

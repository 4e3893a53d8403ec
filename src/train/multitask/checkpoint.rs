//! A multi-task run's checkpoint: each head's [`Checkpoint`] (its model with the shared
//! descriptor, Adam's moments, its batch streams) in one file of several heads
//! ([`crate::model::file::HEADS_KIND`]), with the run's step and each head's count of updates. `dpw freeze --head`
//! and `dpw test --head` take a head from it.

use std::path::Path;

use anyhow::{anyhow, ensure, Context, Result};
use serde_json::json;

use crate::model::file::{container_heads, head_container, read_container, write_heads, HeadParts};
use crate::train::checkpoint::{Checkpoint, Saved};

pub struct MultiCheckpoint {
    /// Steps done, over all tasks.
    pub step: usize,
    /// lr of the last step done (informative).
    pub lr: f64,
    /// The seed of the run's task draw, which a restart continues.
    pub seed: u64,
    /// In `model_dict` order.
    pub heads: Vec<HeadCheckpoint>,
}

pub struct HeadCheckpoint {
    pub name: String,
    pub aliases: Vec<String>,
    /// The steps of this head's task so far: Adam's step count of its fitting net.
    pub updates: usize,
    /// Its `step` is the run's.
    pub ck: Checkpoint,
}

impl Saved for MultiCheckpoint {
    fn step(&self) -> usize {
        self.step
    }

    fn write(&self, path: &Path) -> Result<()> {
        let mut heads = Vec::with_capacity(self.heads.len());
        for h in &self.heads {
            let mut parts = h.ck.parts()?;
            parts.0["updates"] = json!(h.updates);
            heads.push(HeadParts {
                name: h.name.clone(),
                aliases: h.aliases.clone(),
                parts,
            });
        }
        let header = json!({"version": 1, "step": self.step, "lr": self.lr, "seed": self.seed});
        write_heads(path, header, &heads)
    }
}

impl MultiCheckpoint {
    /// A multi-task run's checkpoint, for `dpw train --restart` of its input.
    pub fn read(path: &Path) -> Result<Self> {
        let c = read_container(path)?;
        let heads = container_heads(&c).ok_or_else(|| {
            anyhow!(
                "{} is a checkpoint of a single-task run: restart it with a single-task input",
                path.display()
            )
        })?;
        let field = |k: &str| c.header[k].clone();
        let step = (field("step").as_u64())
            .with_context(|| format!("{}: no step", path.display()))? as usize;
        let seed =
            (field("seed").as_u64()).with_context(|| format!("{}: no seed", path.display()))?;
        let mut out = Vec::with_capacity(heads.len());
        for (k, h) in heads.into_iter().enumerate() {
            let sub = head_container(&c, k);
            let updates = (sub.header["updates"].as_u64()).with_context(|| {
                format!("{}: head '{}' has no update count", path.display(), h.name)
            })? as usize;
            let ck = Checkpoint::from_container(&sub, path)?;
            ensure!(
                ck.step == step,
                "{}: head '{}' is at step {}, the run at {step}",
                path.display(),
                h.name,
                ck.step
            );
            out.push(HeadCheckpoint {
                name: h.name,
                aliases: h.aliases,
                updates,
                ck,
            });
        }
        ensure!(
            out.iter().map(|h| h.updates).sum::<usize>() == step,
            "{}: the heads' update counts do not add up to the step, {step}",
            path.display()
        );
        Ok(MultiCheckpoint {
            step,
            lr: field("lr").as_f64().unwrap_or(f64::NAN),
            seed,
            heads: out,
        })
    }
}

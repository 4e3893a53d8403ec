//! The training / validation data of a run: systems found and loaded, batch sizes, number of
//! batches and system probabilities (docs/deepmd-spec.md §12), and the summary `dp train` prints.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::DataConfig;
use crate::data::{load_system_in, nbatches, system_probs, Disk, Files, Sampler, System};

pub struct DataSet {
    pub systems: Vec<System>,
    pub batch_sizes: Vec<usize>,
    pub nbatches: Vec<usize>,
    pub probs: Vec<f64>,
}

impl DataSet {
    pub fn nframes(&self) -> Vec<usize> {
        self.systems.iter().map(|s| s.nframes).collect()
    }

    /// A batch stream over these systems.
    pub fn sampler(&self, seed: u64) -> Sampler {
        Sampler::new(&self.nframes(), &self.batch_sizes, self.probs.clone(), seed)
    }

    /// DeePMD-kit's "Summary of DataSystem" table, one line per system.
    pub fn summary(&self, what: &str) -> Vec<String> {
        let mut lines = vec![
            format!("---Summary of DataSystem: {what:<13}---"),
            format!("found {} system(s):", self.systems.len()),
            format!(
                "{:>42}  {:>6}  {:>6}  {:>6}  {:>6}  {:>5}  {:>3}",
                "system", "natoms", "frames", "bch_sz", "n_bch", "prob", "pbc"
            ),
        ];
        for (i, s) in self.systems.iter().enumerate() {
            let mut name = s.path.display().to_string();
            if name.chars().count() > 42 {
                let tail: String = name
                    .chars()
                    .rev()
                    .take(39)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                name = format!("...{tail}");
            }
            let total: f64 = self.probs.iter().sum();
            lines.push(format!(
                "{:>42}  {:>6}  {:>6}  {:>6}  {:>6}  {:>5.3}  {:>3}",
                name,
                s.natoms,
                s.nframes,
                self.batch_sizes[i],
                self.nbatches[i],
                self.probs[i] / total,
                if s.cell.is_some() { "T" } else { "F" }
            ));
        }
        lines
    }
}

/// DeePMD-kit's `expand_sys_str`: every directory at or below `root` that holds a `type.raw`.
fn search_systems(fs: &dyn Files, root: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if fs.is_file(&root.join("type.raw")) {
        out.push(root.to_path_buf());
        return Ok(());
    }
    let entries = fs
        .list(root)
        .with_context(|| format!("cannot list {}", root.display()))?;
    for d in entries.iter().filter(|p| fs.is_dir(p)) {
        search_systems(fs, d, out)?;
    }
    Ok(())
}

/// The system folders of `systems`: each one a system, or a folder searched for systems.
pub fn find_systems(fs: &dyn Files, paths: &[PathBuf], what: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if !fs.is_dir(p) {
            if fs.is_file(p) {
                bail!("{what} system {} is not a folder", p.display());
            }
            bail!("{what} system folder {} does not exist", p.display());
        }
        let before = out.len();
        search_systems(fs, p, &mut out)?;
        if out.len() == before {
            bail!(
                "{what} system folder {} holds no deepmd/npy system (no type.raw in it or below it)",
                p.display()
            );
        }
    }
    Ok(out)
}

/// Finds, loads and sizes the systems of one data section.
pub fn load_data(cfg: &DataConfig, type_map: &[String], what: &str) -> Result<DataSet> {
    load_data_in(&Disk, cfg, type_map, what)
}

/// [`load_data`] from the files of `fs`.
pub fn load_data_in(
    fs: &dyn Files,
    cfg: &DataConfig,
    type_map: &[String],
    what: &str,
) -> Result<DataSet> {
    let paths = find_systems(fs, &cfg.system_paths, what)?;
    if let Some(p) = &cfg.sys_probs {
        if p.len() != paths.len() {
            bail!(
                "{what} data: sys_probs has {} entries but the systems expand to {} systems",
                p.len(),
                paths.len()
            );
        }
    }
    let mut systems = Vec::new();
    let mut batch_sizes = Vec::new();
    let mut kept_probs = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let sys =
            load_system_in(fs, p, type_map).with_context(|| format!("loading {what} data"))?;
        if !cfg.batch_size.keeps_system(sys.natoms) {
            tracing::info!(
                "{what} system {} ({} atoms) dropped by batch_size filter",
                p.display(),
                sys.natoms
            );
            continue;
        }
        let bs = cfg.batch_size.for_system(i, sys.natoms).with_context(|| {
            format!(
                "{what} data: batch_size lists no entry for system {i} ({}); the systems expand to {} systems",
                p.display(),
                paths.len()
            )
        })?;
        if let Some(sp) = &cfg.sys_probs {
            kept_probs.push(sp[i]);
        }
        systems.push(sys);
        batch_sizes.push(bs);
    }
    if systems.is_empty() {
        bail!("{what} data: no system left after the batch_size filter");
    }
    let nf: Vec<usize> = systems.iter().map(|s| s.nframes).collect();
    let nb = nbatches(&nf, &batch_sizes);
    let sys_probs = cfg.sys_probs.as_ref().map(|_| kept_probs.as_slice());
    let probs = system_probs(&cfg.auto_prob.to_string(), sys_probs, &nb)
        .map_err(|e| anyhow::anyhow!("{what} data: {e}"))?;
    if probs.iter().any(|p| !p.is_finite() || *p < 0.0) {
        bail!("{what} data: invalid system probabilities {probs:?}");
    }
    Ok(DataSet {
        systems,
        batch_sizes,
        nbatches: nb,
        probs,
    })
}

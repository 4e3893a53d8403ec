//! The training / validation data of a run: systems found and loaded, batch sizes, number of
//! batches and system probabilities (docs/deepmd-spec.md §12), and the summary `dp train` prints.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use web_time::Instant;

use crate::config::DataConfig;
use crate::data::{
    cache_budget, check_frames, check_images, find_systems, in_hdf5_file, keep_open, nbatches,
    nbatches_whole, read_system_in, system_probs, DataError, Disk, Files, Labels, Sampler, System,
    SystemInfo, SystemStore,
};

pub struct DataSet {
    /// What each system is; its frames come from `store`.
    pub systems: Vec<SystemInfo>,
    pub store: Arc<SystemStore>,
    pub batch_sizes: Vec<usize>,
    pub nbatches: Vec<usize>,
    pub probs: Vec<f64>,
    /// `batch_size: "mixed:N"`: each batch is N frames drawn one by one, each from a system of
    /// its own (`batch_sizes` are then N and `nbatches` whole batches, as DeePMD-kit's
    /// TensorFlow backend counts them for the system probabilities).
    pub mixed: Option<usize>,
}

impl DataSet {
    pub fn nframes(&self) -> Vec<usize> {
        self.systems.iter().map(|s| s.nframes).collect()
    }

    /// System `s` with its frames.
    pub fn system(&self, s: usize) -> Result<Arc<System>> {
        Ok(self.store.get(s)?)
    }

    /// How many systems, frames and atoms (summed over frames) hold each element of
    /// `type_map`, as lines for the log.
    pub fn element_counts(&self, type_map: &[String]) -> Vec<String> {
        let mut lines = vec![format!(
            "{:>8}  {:>8}  {:>10}  {:>14}",
            "element", "systems", "frames", "atoms"
        )];
        for (t, name) in type_map.iter().enumerate() {
            let (mut nsys, mut nframes, mut natoms) = (0usize, 0usize, 0usize);
            for s in &self.systems {
                let mut has = false;
                for c in &s.compositions {
                    let n = c.atype.iter().filter(|&&a| a == t).count();
                    if n > 0 {
                        has = true;
                        nframes += c.nframes;
                        natoms += n * c.nframes;
                    }
                }
                nsys += usize::from(has);
            }
            lines.push(format!("{name:>8}  {nsys:>8}  {nframes:>10}  {natoms:>14}"));
        }
        lines
    }

    /// A batch stream over these systems.
    pub fn sampler(&self, seed: u64) -> Sampler {
        match self.mixed {
            None => Sampler::new(&self.nframes(), &self.batch_sizes, self.probs.clone(), seed),
            Some(n) => Sampler::mixed(&self.nframes(), n, self.probs.clone(), seed),
        }
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
                if s.pbc { "T" } else { "F" }
            ));
        }
        lines
    }
}

/// Systems read in parallel at a time: enough to keep every thread busy, few enough that
/// streaming start-up holds little more than the cache budget.
pub(crate) fn window() -> usize {
    4 * rayon::current_num_threads()
}

/// A progress bar for one start-up phase, drawn only on a terminal.
pub fn phase_bar(len: usize, what: &str) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr_with_hz(4)
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(len as u64), target);
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} [{wide_bar}] {pos}/{len} {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Finds, loads and sizes the systems of one data section, for a model of cut-off `rcut`;
/// `labels`: what every system is read with and must hold (training and validation data:
/// the loss's; the data neighbour statistics are taken of: none).
pub fn load_data(
    cfg: &DataConfig,
    type_map: &[String],
    rcut: f64,
    what: &str,
    labels: &Labels,
) -> Result<DataSet> {
    load_data_in(&Disk, cfg, type_map, rcut, what, labels)
}

/// [`load_data`] from the files of `fs`. Every system is read once here (so a bad file, or a
/// cell whose periodic images within `rcut` would be too many, fails the start, not a later
/// step). Those that fit [`cache_budget`] stay in memory; the others are read again when
/// drawn (see [`SystemStore`]). Files not on disk (a web
/// page's) all stay in memory.
pub fn load_data_in(
    fs: &dyn Files,
    cfg: &DataConfig,
    type_map: &[String],
    rcut: f64,
    what: &str,
    labels: &Labels,
) -> Result<DataSet> {
    load_data_visiting(fs, cfg, type_map, rcut, what, labels, |_| (), |()| ())
}

/// The systems at `paths`, read and checked, each with its own result. HDF5 reads take turns
/// under the library's global lock, so a window of them is read on one thread (the other
/// computing meanwhile instead of waiting for the lock) and checked in parallel after.
fn read_window(
    fs: &dyn Files,
    paths: &[PathBuf],
    type_map: &[String],
    rcut: f64,
    labels: &Labels,
) -> Vec<Result<System, DataError>> {
    let read = |p: &PathBuf| read_system_in(fs, p, type_map, labels);
    let read: Vec<_> = if paths.iter().any(|p| in_hdf5_file(p)) {
        paths.iter().map(read).collect()
    } else {
        paths.par_iter().map(read).collect()
    };
    read.into_par_iter()
        .map(|sys| {
            let sys = sys?;
            sys.check_labels(labels)?;
            check_frames(&sys)?;
            check_images(&sys, rcut)?;
            Ok(sys)
        })
        .collect()
}

/// A system kept by [`load_data_visiting`]: its index among the kept systems, its frames and
/// its batch size.
pub(crate) struct Kept {
    pub index: usize,
    pub sys: Arc<System>,
    pub batch_size: usize,
}

/// [`load_data_in`], with work done on the kept systems as they are read: `compute` on the
/// systems of one window (in parallel with the reading of the next window), then `add` on its
/// result, window after window in system order (beside the computing of the next window).
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_data_visiting<D: Send>(
    fs: &dyn Files,
    cfg: &DataConfig,
    type_map: &[String],
    rcut: f64,
    what: &str,
    labels: &Labels,
    compute: impl Fn(Vec<Kept>) -> D + Sync,
    mut add: impl FnMut(D) + Send,
) -> Result<DataSet> {
    let t = Instant::now();
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
    let on_disk = fs.on_disk();
    let budget = if on_disk { cache_budget()? } else { usize::MAX };
    let mut used = 0usize;
    let mut systems = Vec::new();
    let mut kept_paths = Vec::new();
    let mut pinned = Vec::new();
    let mut batch_sizes = Vec::new();
    let mut kept_probs = Vec::new();
    // The kept systems read but not yet computed on, and the last window computed, not yet added.
    let mut ready: Vec<Kept> = Vec::new();
    let mut pending: Option<D> = None;
    let bar = phase_bar(paths.len(), &format!("reading {what} data"));
    let _open = keep_open();
    for (w, chunk) in paths.chunks(window()).enumerate() {
        let (loaded, done) = rayon::join(
            || read_window(fs, chunk, type_map, rcut, labels),
            || {
                let window = std::mem::take(&mut ready);
                let (done, ()) = rayon::join(
                    || compute(window),
                    || {
                        if let Some(d) = pending.take() {
                            add(d)
                        }
                    },
                );
                done
            },
        );
        pending = Some(done);
        for (k, (p, sys)) in chunk.iter().zip(loaded).enumerate() {
            let i = w * window() + k;
            let sys = sys.with_context(|| format!("loading {what} data"))?;
            bar.inc(1);
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
            let info = sys.info();
            let sys = Arc::new(sys);
            let fits = used.saturating_add(info.bytes()) <= budget;
            if fits {
                used += info.bytes();
            }
            pinned.push(fits.then(|| Arc::clone(&sys)));
            ready.push(Kept {
                index: systems.len(),
                sys,
                batch_size: bs,
            });
            systems.push(info);
            kept_paths.push(p.clone());
            batch_sizes.push(bs);
        }
    }
    let last = compute(ready);
    if let Some(d) = pending {
        add(d);
    }
    add(last);
    bar.finish_and_clear();
    if systems.is_empty() {
        bail!("{what} data: no system left after the batch_size filter");
    }
    let nf: Vec<usize> = systems.iter().map(|s| s.nframes).collect();
    let mixed = cfg.batch_size.mixed();
    let nb = match mixed {
        None => nbatches(&nf, &batch_sizes),
        Some(_) => nbatches_whole(&nf, &batch_sizes),
    };
    let sys_probs = cfg.sys_probs.as_ref().map(|_| kept_probs.as_slice());
    let probs = system_probs(&cfg.auto_prob.to_string(), sys_probs, &nb)
        .map_err(|e| anyhow::anyhow!("{what} data: {e}"))?;
    if probs.iter().any(|p| !p.is_finite() || *p < 0.0) {
        bail!("{what} data: invalid system probabilities {probs:?}");
    }
    let store = SystemStore::new(
        kept_paths,
        type_map.to_vec(),
        pinned,
        budget,
        labels.clone(),
    );
    let streamed = !store.all_in_memory();
    tracing::info!(
        "read {} {what} systems ({} frames) in {:.2} s; {}",
        systems.len(),
        nf.iter().sum::<usize>(),
        t.elapsed().as_secs_f64(),
        if streamed && budget == 0 {
            "DPW_DATA_CACHE_MB is 0: no frame stays in memory, every system is read from disk on demand".to_string()
        } else if streamed {
            let mib = |b: usize| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
            format!(
                "{} of frames exceed the {} MiB cache (DPW_DATA_CACHE_MB): {} stay in memory, the other systems are read from disk on demand",
                mib(systems.iter().map(SystemInfo::bytes).sum::<usize>()),
                budget >> 20,
                if used == 0 { "none of them".to_string() } else { mib(used) }
            )
        } else {
            "all frames in memory".to_string()
        }
    );
    Ok(DataSet {
        systems,
        store: Arc::new(store),
        batch_sizes,
        nbatches: nb,
        probs,
        mixed,
    })
}

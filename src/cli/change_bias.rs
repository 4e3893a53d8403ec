//! `dpw change-bias`: an energy model's bias re-fitted on data, or set to given values, as
//! `dp change-bias` does (docs/deepmd-spec.md §21.6, §21.7). Only the bias changes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::backend::Job;
use super::test::TestJob;
use crate::backend::{Backend, Real};
use crate::data::{find_systems, load_system, Disk};
use crate::dist::DeviceLink;
use crate::model::Model;
use crate::train::finetune::{bias_lines, refit_bias};

/// How the bias is re-fitted (`-m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BiasMode {
    /// change-by-statistic: the bias moves by the least-squares fit of what the model misses
    /// of the energy labels.
    Change,
    /// set-by-statistic: the bias is the least-squares fit of the energy labels alone.
    Set,
}

pub struct ChangeBiasJob {
    pub model: Model,
    pub systems: Vec<PathBuf>,
    /// Frames per system, the first ones; 0: all.
    pub nframes: usize,
    pub mode: BiasMode,
}

impl Job for ChangeBiasJob {
    /// The model with its new bias, and the log's report.
    type Output = (Model, String);

    fn run<T: Real, B: Backend<T>>(self, b: &B, _: DeviceLink<T, B::Buf>) -> Result<Self::Output> {
        let nt = self.model.spec.ntypes();
        let tester = TestJob {
            model: self.model,
            systems: self.systems,
            nframes: self.nframes,
            detail: None,
        };
        let nnei: usize = tester.model.spec.descriptor.slot_sel().iter().sum();
        let (mut counts, mut y) = (Vec::new(), Vec::new());
        for path in &find_systems(&Disk, &tester.systems, "change-bias")? {
            let sys = load_system(path, &tester.model.spec.type_map)?;
            if !sys.has_energy {
                bail!(
                    "{}: no energy.npy, which the bias is fitted to",
                    path.display()
                );
            }
            let nf = match tester.nframes {
                0 => sys.nframes,
                n => sys.nframes.min(n),
            };
            let pred: Vec<f64> = match self.mode {
                BiasMode::Set => vec![0.0; nf],
                BiasMode::Change => (tester.predictions(b, path, &sys, nf, nnei)?)
                    .into_iter()
                    .flat_map(|p| p.energy)
                    .collect(),
            };
            for (f, p) in pred.iter().enumerate() {
                counts.push(sys.type_counts(f, nt).iter().map(|&n| n as f64).collect());
                y.push(sys.energy[f] - p);
            }
        }
        if y.is_empty() {
            bail!("no frame to fit the bias to");
        }
        let mut model = tester.model;
        let report = refit_bias(&mut model, &counts, &y, self.mode == BiasMode::Change);
        Ok((model, report))
    }
}

/// `-b`: the bias set to `values`, one per type.
pub fn set_bias(model: &mut Model, values: &[f64]) -> Result<String> {
    let nt = model.spec.ntypes();
    if values.len() != nt {
        bail!(
            "-b: {} values for the model's {nt} types ({})",
            values.len(),
            model.spec.type_map.join(", ")
        );
    }
    let old = std::mem::replace(&mut model.bias, values.to_vec());
    let mut report = "set to the given values:".to_string();
    bias_lines(&mut report, model, &old);
    Ok(report)
}

/// Where the changed model goes: `-o`, else beside the input as `<stem>_updated` with the
/// input's extension (a `.pt`'s as `.yaml`: dpw writes DeePMD-kit's .yaml, from which `dp
/// convert-backend` makes a .pth).
pub fn output_path(input: &Path, output: Option<PathBuf>) -> PathBuf {
    output.unwrap_or_else(|| {
        let stem = input.file_stem().unwrap_or_default().to_string_lossy();
        let ext = match input.extension().and_then(|e| e.to_str()) {
            Some("pt" | "pth") | None => "yaml",
            Some(e) => e,
        };
        input.with_file_name(format!("{stem}_updated.{ext}"))
    })
}

/// `-f`: the systems a file lists, one per line (blank lines and `#` comments skipped).
pub fn listed_systems(file: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("reading the system list {}: {e}", file.display()))?;
    let systems: Vec<PathBuf> = (text.lines())
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect();
    if systems.is_empty() {
        bail!("{}: lists no system", file.display());
    }
    Ok(systems)
}

//! `dpw train --finetune`: a new run from a pretrained model's weights and statistics (a head of
//! a DeePMD-kit `.pt`, its `.yaml`, or a dpw model), its energy bias re-fitted on the new
//! training data by change-by-statistic, as DeePMD-kit's fine-tuning does (docs/deepmd-spec.md
//! §21.4, §21.6).

use std::fmt::Write as _;

use anyhow::Result;

use super::batch::assemble_frames;
use super::dataset::DataSet;
use super::predict::predict_batch;
use crate::backend::cpu::Cpu;
use crate::geometry::energy_bias;
use crate::model::Model;

/// The bias moved by the least-squares fit (minimum norm, as numpy's lstsq) of what `model`
/// misses of the energy labels of `frames` of each system; the model evaluated on the cpu in
/// float64, as DeePMD-kit evaluates it in the model's precision without gradient.
pub fn change_by_statistic(model: &mut Model, data: &DataSet, frames: &[Vec<usize>]) -> Result<()> {
    let (counts, y) = bias_rows(model, data, frames, true)?;
    tracing::info!("energy bias: {}", refit_bias(model, &counts, &y, true));
    Ok(())
}

/// The bias set to the least-squares fit of the energy labels of `frames` alone: a new fitting
/// net's (`--model-branch RANDOM`), as DeePMD-kit's set-by-statistic.
pub fn set_by_statistic(model: &mut Model, data: &DataSet, frames: &[Vec<usize>]) -> Result<()> {
    let (counts, y) = bias_rows(model, data, frames, false)?;
    tracing::info!("energy bias: {}", refit_bias(model, &counts, &y, false));
    Ok(())
}

/// Per frame of `frames`: the atom counts per type and the energy label, less the model's
/// prediction where `predict`.
fn bias_rows(
    model: &Model,
    data: &DataSet,
    frames: &[Vec<usize>],
    predict: bool,
) -> Result<(Vec<Vec<f64>>, Vec<f64>)> {
    let b = Cpu::default();
    let nt = model.spec.ntypes();
    let (mut counts, mut y) = (Vec::new(), Vec::new());
    for (s, frames) in frames.iter().enumerate() {
        if frames.is_empty() {
            continue;
        }
        let sys = data.system(s)?;
        if !sys.has_energy {
            anyhow::bail!(
                "{}: no energy.npy, which fine-tuning re-fits the energy bias to",
                sys.path.display()
            );
        }
        // Frames of one composition go in one call unless the descriptor's list is per type
        // and the system mixes compositions.
        let per_call = if sys.mixed && !model.spec.descriptor.is_mixed() {
            1
        } else {
            8
        };
        for call in frames.chunks(per_call) {
            let predicted = match predict {
                true => {
                    let batch = assemble_frames(&model.spec, &sys, call, "fine-tuning statistics")?;
                    predict_batch::<f64, _>(&b, model, &batch)?.energy
                }
                false => vec![0.0; call.len()],
            };
            for (&f, e) in call.iter().zip(&predicted) {
                counts.push(sys.type_counts(f, nt).iter().map(|&n| n as f64).collect());
                y.push(sys.energy[f] - e);
            }
        }
    }
    Ok((counts, y))
}

/// The bias fitted (minimum-norm least squares, as numpy's lstsq) to `y` per frame on the atom
/// counts per type: moved by the fit (`change`: y is the label less the model's prediction) or
/// set to it (y the label); returns the log's report.
pub fn refit_bias(model: &mut Model, counts: &[Vec<f64>], y: &[f64], change: bool) -> String {
    let (delta, std) = energy_bias(counts, y);
    let old = model.bias.clone();
    match change {
        true => model.bias.iter_mut().zip(&delta).for_each(|(b, d)| *b += d),
        false => model.bias = delta,
    }
    let mut report = format!(
        "{} frames, {} by statistic (residual std {std:.6e} eV):",
        y.len(),
        if change { "changed" } else { "set" }
    );
    bias_lines(&mut report, model, &old);
    report
}

/// One line per type: the bias before and after.
pub fn bias_lines(out: &mut String, model: &Model, old: &[f64]) {
    for (t, name) in model.spec.type_map.iter().enumerate() {
        let _ = write!(out, "\n  {name}: {:.10} -> {:.10}", old[t], model.bias[t]);
    }
}

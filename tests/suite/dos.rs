//! The `dos` fitting against DeePMD-kit 3.2.0's own numbers (`tests/reference/fittings/
//! dos_water`, made by `scripts/make-reference/dos.py`): a model DeePMD-kit wrote, read from
//! its `.yaml`; the frame and atomic DOS of three frames; and the gradient of DeePMD-kit's
//! `DOSLoss` (every term, the frame terms alone, the atomic terms alone) against its own backward
//! pass.

use std::path::PathBuf;

use serde_json::Value;

use dpw::backend::{Backend, Real};
use dpw::config::LossConfig;
use dpw::fitting::dos::config::{DosLossConfig, TERMS};
use dpw::model::{read_deepmd_yaml, Model};
use dpw::train::predict::{predict, step_of};
use dpw::train::step::StepLoss;

use super::descriptors::worst_tensor;
use super::labelled::LabelledFrames;
use super::Tol;
use crate::common::*;

const CASE: &str = "dos_water";

fn dir() -> PathBuf {
    repo(&format!("tests/reference/fittings/{CASE}"))
}

pub fn model() -> Model {
    read_deepmd_yaml(&dir().join("model.yaml")).unwrap()
}

/// The frame and atomic DOS of the three eval frames, each ≤ 1e-10 relative to its largest
/// value.
pub fn predictions<B: Backend<f64>>(b: &B) {
    predictions_at::<f64, B>(b, Tol::F64);
}

/// [`predictions`] in `T`, to `tol`.
pub fn predictions_at<T: Real, B: Backend<T>>(b: &B, tol: Tol) {
    let model = model();
    let fr = LabelledFrames::read(&dir().join("eval.npz"), "dos");
    let p = predict(b, &model, &fr.atype, &fr.all(true, true)).unwrap();
    let mut z = npz(&dir().join("eval.npz"));
    let want = |z: &mut _, k| -> Vec<f64> { npz_array(z, k).iter().copied().collect() };
    let errs = [
        ("dos", rel_to_max(&p.property, &want(&mut z, "dos"))),
        (
            "atomic dos",
            rel_to_max(&p.atom_property, &want(&mut z, "atom_dos")),
        ),
    ];
    eprintln!("{CASE}: relative to DeePMD-kit: {errs:?}");
    for (what, e) in errs {
        assert!(e <= tol.pred, "{CASE}: {what} off by {e:e} relative");
    }
}

fn loss_of(l: &Value) -> DosLossConfig {
    let pref = |which: &str| -> [f64; 4] {
        std::array::from_fn(|t| l[format!("{which}_pref_{}", TERMS[t])].as_f64().unwrap())
    };
    DosLossConfig {
        start: pref("start"),
        limit: pref("limit"),
    }
}

/// DOSLoss and its gradient, per tensor ≤ 1e-12 relative to DeePMD-kit's backward pass, with
/// every term, the frame terms alone and the atomic terms alone (the last also with the atomic
/// labels missing from the data: then the loss is the frame terms', as DeePMD-kit's with
/// `find_atom_dos` 0); and the loss's displayed metrics.
pub fn training_gradients<B: Backend<f64>>(b: &B) {
    training_gradients_at::<f64, B>(b, Tol::F64);
}

/// [`training_gradients`] in `T`, to `tol`.
pub fn training_gradients_at<T: Real, B: Backend<T>>(b: &B, tol: Tol) {
    let model = model();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("train_step.json")).unwrap())
            .unwrap();
    let fr = LabelledFrames::read(&dir().join("train_step.npz"), "dos");
    let mut z = npz(&dir().join("train_step.npz"));
    let coef = meta["lr"].as_f64().unwrap() / meta["start_lr"].as_f64().unwrap();
    for (key, value, prefix, more) in [
        ("loss", "loss_value", "grad", "more_loss"),
        (
            "loss_global",
            "loss_value_global",
            "grad_global",
            "more_loss_global",
        ),
        (
            "loss_atomic",
            "loss_value_atomic",
            "grad_atomic",
            "more_loss_atomic",
        ),
    ] {
        let loss = LossConfig::Dos(loss_of(&meta[key]));
        let (sums, grad, _) = step_of(
            b,
            &model,
            &fr.atype,
            &fr.all(true, true),
            StepLoss::Host { loss: &loss, coef },
        )
        .unwrap();
        let want = meta[value].as_f64().unwrap();
        let rl = (sums[0] - want).abs() / want;
        let worst = worst_tensor(&model, &grad, &mut z, prefix);
        eprintln!(
            "{CASE}, {key}: loss {} vs {want} (rel {rl:.1e}); worst per-tensor relative \
             gradient error {:.1e} ({})",
            sums[0], worst.0, worst.1
        );
        assert!(rl < tol.loss, "{CASE}: {key} off by {rl:e} relative");
        assert!(
            worst.0 < tol.grad,
            "{CASE}: {prefix} of {} off by {:e}",
            worst.1,
            worst.0
        );
        // The displayed metrics: the roots of the terms' mean squares (the frame terms' per
        // atom).
        let natoms = fr.atype.len() as f64;
        for (t, name) in [
            (0, "local_dos"),
            (1, "local_cdf"),
            (2, "global_dos"),
            (3, "global_cdf"),
        ] {
            if let Some(w) = meta[more]
                .get(format!("rmse_{name}"))
                .and_then(Value::as_f64)
            {
                let per = if t >= 2 { 1.0 / natoms } else { 1.0 };
                let mine = sums[1 + t].sqrt() * per;
                assert!(
                    (mine - w).abs() <= tol.loss * w,
                    "{key}: rmse_{name} {mine} vs {w}"
                );
            }
        }
    }
    // Without atomic labels, the full loss is its frame terms'.
    let loss = LossConfig::Dos(loss_of(&meta["loss"]));
    let (sums, grad, _) = step_of(
        b,
        &model,
        &fr.atype,
        &fr.all(true, false),
        StepLoss::Host { loss: &loss, coef },
    )
    .unwrap();
    let want = meta["loss_value_global"].as_f64().unwrap();
    assert!(
        (sums[0] - want).abs() < tol.loss * want,
        "no atomic labels: {}",
        sums[0]
    );
    assert!(sums[1].is_nan() && sums[2].is_nan());
    let worst = worst_tensor(&model, &grad, &mut z, "grad_global");
    assert!(
        worst.0 < tol.grad,
        "no atomic labels: {} off by {:e}",
        worst.1,
        worst.0
    );
}

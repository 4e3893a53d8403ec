//! The `property` fitting against DeePMD-kit 3.2.0's own numbers (`tests/reference/fittings/
//! property_*`, made by `scripts/make-reference/property.py`): models DeePMD-kit wrote, read
//! from its `.yaml`; the frame and atomic properties of three frames; and the gradient of
//! DeePMD-kit's `PropertyLoss` (smooth_mae and mse) against its own backward pass.

use std::path::PathBuf;

use serde_json::Value;

use dpw::backend::{Backend, Real};
use dpw::config::LossConfig;
use dpw::fitting::property::config::{LossFunc, PropertyLossConfig};
use dpw::model::{read_deepmd_yaml, Model};
use dpw::train::predict::{predict, step_of};
use dpw::train::step::StepLoss;

use super::descriptors::worst_tensor;
use super::labelled::LabelledFrames;
use super::Tol;
use crate::common::*;

/// se_e2_a with an extensive property on water (periodic), DPA-1 with an intensive one on
/// DeePMD-kit's property example (molecules, no box).
pub const PROPERTY_CASES: [&str; 2] = ["property_water", "property_mol"];

fn dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/fittings/{case}"))
}

pub fn model(case: &str) -> Model {
    read_deepmd_yaml(&dir(case).join("model.yaml")).unwrap()
}

/// The frame and atomic properties of the three eval frames, each ≤ 1e-10 relative to its
/// largest value.
pub fn predictions<B: Backend<f64>>(b: &B, case: &str) {
    predictions_at::<f64, B>(b, case, Tol::F64);
}

/// [`predictions`] in `T`, to `tol`.
pub fn predictions_at<T: Real, B: Backend<T>>(b: &B, case: &str, tol: Tol) {
    let model = model(case);
    let fr = LabelledFrames::read(&dir(case).join("eval.npz"), "property");
    let p = predict(b, &model, &fr.atype, &fr.all(true, false)).unwrap();
    let mut z = npz(&dir(case).join("eval.npz"));
    let want = |z: &mut _, k| -> Vec<f64> { npz_array(z, k).iter().copied().collect() };
    let errs = [
        (
            "property",
            rel_to_max(&p.property, &want(&mut z, "property")),
        ),
        (
            "atomic property",
            rel_to_max(&p.atom_property, &want(&mut z, "atom_property")),
        ),
    ];
    eprintln!("{case}: relative to DeePMD-kit: {errs:?}");
    for (what, e) in errs {
        assert!(e <= tol.pred, "{case}: {what} off by {e:e} relative");
    }
}

fn loss_of(l: &Value) -> PropertyLossConfig {
    let func = match l["loss_func"].as_str().unwrap() {
        "smooth_mae" => LossFunc::SmoothMae,
        "mse" => LossFunc::Mse,
        other => panic!("no case has loss_func {other}"),
    };
    PropertyLossConfig {
        loss_func: func,
        metric: vec![LossFunc::Mae],
        beta: l["beta"].as_f64().unwrap(),
    }
}

/// PropertyLoss and its gradient, per tensor ≤ 1e-12 relative to DeePMD-kit's backward pass,
/// for smooth_mae (both of its branches are taken) and mse; and its mae metric.
pub fn training_gradients<B: Backend<f64>>(b: &B, case: &str) {
    training_gradients_at::<f64, B>(b, case, Tol::F64);
}

/// [`training_gradients`] in `T`, to `tol`.
pub fn training_gradients_at<T: Real, B: Backend<T>>(b: &B, case: &str, tol: Tol) {
    let model = model(case);
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir(case).join("train_step.json")).unwrap())
            .unwrap();
    let fr = LabelledFrames::read(&dir(case).join("train_step.npz"), "property");
    let frames = fr.all(true, false);
    let mut z = npz(&dir(case).join("train_step.npz"));
    for (key, value, prefix) in [
        ("loss", "loss_value", "grad"),
        ("loss_mse", "loss_value_mse", "grad_mse"),
    ] {
        let loss = LossConfig::Property(loss_of(&meta[key]));
        let step = StepLoss::Host {
            loss: &loss,
            coef: 1.0,
        };
        let (sums, grad, pred) = step_of(b, &model, &fr.atype, &frames, step).unwrap();
        let want = meta[value].as_f64().unwrap();
        let rl = (sums[0] - want).abs() / want;
        let mae = sums[2] / pred.property.len() as f64;
        let want_mae = meta["more_loss"]["mae"].as_f64().unwrap();
        let worst = worst_tensor(&model, &grad, &mut z, prefix);
        eprintln!(
            "{case}, {key}: loss {} vs {want} (rel {rl:.1e}), mae {mae} vs {want_mae}; worst \
             per-tensor relative gradient error {:.1e} ({})",
            sums[0], worst.0, worst.1
        );
        assert!(rl < tol.loss, "{case}: {key} off by {rl:e} relative");
        assert!(
            (mae - want_mae).abs() <= tol.loss * want_mae,
            "{case}: mae {mae}"
        );
        assert!(
            worst.0 < tol.grad,
            "{case}: {prefix} of {} off by {:e}",
            worst.1,
            worst.0
        );
    }
}

//! The `dipole` and `polar` fittings against DeePMD-kit 3.2.0's own numbers (`tests/reference/
//! fittings/{dipole_water, polar_water, polar_water_diag}` on se_e2_a, `dipole_dpa{1,2,3}` on
//! DPA-1, DPA-2 and DPA-3, made by `scripts/make-reference/tensor.py`): models DeePMD-kit wrote, read from their `.yaml`; the frame and atomic tensors of
//! three frames; and the gradient of DeePMD-kit's `TensorLoss` (both terms, the frame term
//! alone, the atomic term alone) against its own backward pass.

use std::path::PathBuf;

use serde_json::Value;

use dpw::backend::{Backend, Real};
use dpw::config::LossConfig;
use dpw::fitting::tensor::config::TensorLossConfig;
use dpw::model::read_deepmd_yaml;
use dpw::train::batch::Frame;
use dpw::train::predict::{predict, step_of};
use dpw::train::step::StepLoss;

use super::descriptors::worst_tensor;
use super::labelled::LabelledFrames;
use super::Tol;
use crate::common::*;

/// Each case and its label's name (`{name}.npy`).
pub const TENSOR_CASES: &[(&str, &str)] = &[
    ("dipole_water", "dipole"),
    ("polar_water", "polarizability"),
    ("polar_water_diag", "polarizability"),
    ("dipole_dpa1", "dipole"),
    ("dipole_dpa2", "dipole"),
    ("dipole_dpa3", "dipole"),
];

fn dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/fittings/{case}"))
}

/// The frame and atomic tensors of the three eval frames, each ≤ 1e-10 relative to its largest
/// value (an excluded type's atomic tensor is zero in both).
pub fn predictions<B: Backend<f64>>(b: &B, (case, name): (&str, &str)) {
    predictions_at::<f64, B>(b, (case, name), Tol::F64);
}

/// [`predictions`] in `T`, to `tol`.
pub fn predictions_at<T: Real, B: Backend<T>>(b: &B, (case, name): (&str, &str), tol: Tol) {
    let model = read_deepmd_yaml(&dir(case).join("model.yaml")).unwrap();
    let fr = LabelledFrames::read(&dir(case).join("eval.npz"), name);
    let p = predict(b, &model, &fr.atype, &fr.all(true, true)).unwrap();
    let mut z = npz(&dir(case).join("eval.npz"));
    let want = |z: &mut _, k: &str| -> Vec<f64> { npz_array(z, k).iter().copied().collect() };
    let errs = [
        (name, rel_to_max(&p.property, &want(&mut z, name))),
        (
            "atomic",
            rel_to_max(&p.atom_property, &want(&mut z, &format!("atom_{name}"))),
        ),
    ];
    eprintln!("{case}: relative to DeePMD-kit: {errs:?}");
    for (what, e) in errs {
        assert!(e <= tol.pred, "{case}: {what} off by {e:e} relative");
    }
}

/// TensorLoss and its gradient, per parameter tensor ≤ 1e-12 relative to DeePMD-kit's backward
/// pass, with both terms, the frame term alone and the atomic term alone (the first also with
/// the frame labels missing: then it is the atomic term's, as DeePMD-kit's with `find_{name}`
/// 0); and the loss's displayed metrics.
pub fn training_gradients<B: Backend<f64>>(b: &B, (case, name): (&str, &str)) {
    training_gradients_at::<f64, B>(b, (case, name), Tol::F64);
}

/// [`training_gradients`] in `T`, to `tol`.
pub fn training_gradients_at<T: Real, B: Backend<T>>(b: &B, (case, name): (&str, &str), tol: Tol) {
    let model = read_deepmd_yaml(&dir(case).join("model.yaml")).unwrap();
    let meta: Value = json_file(&dir(case).join("train_step.json"));
    let fr = LabelledFrames::read(&dir(case).join("train_step.npz"), name);
    let mut z = npz(&dir(case).join("train_step.npz"));
    let metric = meta["tensor_loss_args"]["tensor_name"].as_str().unwrap();
    let check = |key: &str, value: &str, prefix: &str, more: &Value, frames: &[Frame]| {
        let l = &meta[key];
        let loss = LossConfig::Tensor(TensorLossConfig {
            pref_atomic: l["pref_atomic"].as_f64().unwrap(),
            pref: l["pref"].as_f64().unwrap(),
        });
        let step = StepLoss::Host {
            loss: &loss,
            coef: 1.0,
        };
        let (sums, grad, _) = step_of(b, &model, &fr.atype, frames, step).unwrap();
        let want = meta[value].as_f64().unwrap();
        let rl = (sums[0] - want).abs() / want;
        let worst = worst_tensor(
            &model,
            &grad,
            &mut npz(&dir(case).join("train_step.npz")),
            prefix,
        );
        eprintln!(
            "{case}, {key}: loss {} vs {want} (rel {rl:.1e}); worst per-tensor relative \
             gradient error {:.1e} ({})",
            sums[0], worst.0, worst.1
        );
        assert!(rl < tol.loss, "{case}: {key} off by {rl:e} relative");
        assert!(
            worst.0 < tol.grad,
            "{case}: {prefix} of {} off by {:e}",
            worst.1,
            worst.0
        );
        // The displayed metrics: the atomic term's root, the frame term's per atom with a
        // tensor.
        for (slot, which) in [(1, "local"), (2, "global")] {
            let w = more
                .get(format!("rmse_{which}_{metric}"))
                .and_then(Value::as_f64);
            if let Some(w) = w {
                let per = if slot == 2 { 1.0 / sums[3] } else { 1.0 };
                let mine = sums[slot].sqrt() * per;
                assert!(
                    (mine - w).abs() <= tol.loss * w,
                    "{case}, {key}: rmse_{which} {mine} vs {w}"
                );
            }
        }
    };
    let both = fr.all(true, true);
    check("loss", "loss_value", "grad", &meta["more_loss"], &both);
    check(
        "loss_global",
        "loss_value_global",
        "grad_global",
        &meta["more_loss_global"],
        &both,
    );
    check(
        "loss_atomic",
        "loss_value_atomic",
        "grad_atomic",
        &meta["more_loss_atomic"],
        &both,
    );
    // Without frame labels, the full loss is its atomic term's.
    let missing = &meta["global_label_missing"];
    let loss = LossConfig::Tensor(TensorLossConfig {
        pref_atomic: 1.0,
        pref: 1.0,
    });
    let (sums, grad, _) = step_of(
        b,
        &model,
        &fr.atype,
        &fr.all(false, true),
        StepLoss::Host {
            loss: &loss,
            coef: 1.0,
        },
    )
    .unwrap();
    let want = missing["loss_value"].as_f64().unwrap();
    assert!(
        (sums[0] - want).abs() < tol.loss * want,
        "{case}: no frame labels: {}",
        sums[0]
    );
    assert!(sums[2].is_nan());
    let worst = worst_tensor(&model, &grad, &mut z, "grad_atomic");
    assert!(
        worst.0 < tol.grad,
        "{case}: no frame labels: {} off by {:e}",
        worst.1,
        worst.0
    );
}

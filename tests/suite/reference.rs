//! Against DeePMD-kit 3.2.0's own numbers (`shared/reference/deepmd-3.2.0/model_A`).

use dpw::backend::{Backend, Prefactors};
use dpw::train::predict::{loss_and_grad, predict};

use crate::common::*;

pub fn predictions<B: Backend<f64>>(b: &B) {
    let (Some(model), Some(mut rf)) = (model_a(), ref_frames()) else { return };
    let frames: Vec<_> = (0..3).map(|f| rf.frame(f)).collect();
    let p = predict(b, &model, &rf.atype, &frames).unwrap();
    let (e, ae, f, v) = (
        npz_array(&mut rf.z, "energy"),
        npz_array(&mut rf.z, "atom_energy"),
        npz_array(&mut rf.z, "force"),
        npz_array(&mut rf.z, "virial"),
    );
    let n = rf.atype.len();
    let mut worst = [0.0f64; 4];
    for fr in 0..3 {
        worst[0] = worst[0].max((p.energy[fr] - e[[fr]]).abs());
        worst[1] = worst[1].max(max_abs_diff(&p.atom_energy[fr * n..(fr + 1) * n], &rf.sorted(&ae, fr)));
        worst[2] = worst[2].max(max_abs_diff(&p.force[3 * fr * n..3 * (fr + 1) * n], &rf.sorted(&f, fr)));
        let vref: Vec<f64> = (0..9).map(|k| v[[fr, k]]).collect();
        worst[3] = worst[3].max(max_abs_diff(&p.virial[9 * fr..9 * fr + 9], &vref));
    }
    eprintln!("max |Δ| vs DeePMD-kit: energy {:.2e}, atom energy {:.2e}, force {:.2e}, virial {:.2e}", worst[0], worst[1], worst[2], worst[3]);
    assert!(worst[0] <= 1e-9, "energy off by {}", worst[0]);
    assert!(worst[1] <= 1e-10, "atom energy off by {}", worst[1]);
    assert!(worst[2] <= 1e-10, "force off by {}", worst[2]);
    assert!(worst[3] <= 1e-9, "virial off by {}", worst[3]);
}

pub fn training_gradients<B: Backend<f64>>(b: &B) {
    let (Some(model), Some(rf), Some(dir)) = (model_a(), ref_frames(), model_a_dir()) else { return };
    let steps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train_steps.json")).unwrap()).unwrap();
    let s0 = &steps["steps"][0];
    let pref = Prefactors { e: 0.02, f: 1000.0, v: 0.0 };
    let (sums, grad, _) = loss_and_grad(b, &model, &rf.atype, &[rf.frame(0)], pref).unwrap();
    let n = rf.atype.len() as f64;
    let loss = pref.e * sums.e2 / n + pref.f * sums.f2 / (3.0 * n);
    let want = s0["loss"].as_f64().unwrap();
    eprintln!("loss {loss} vs DeePMD-kit {want}: rel {:.2e}", (loss - want).abs() / want);
    assert!((loss - want).abs() / want < 1e-7);
    let mut worst = 0.0f64;
    for t in model.layout().tensors {
        let r = read_npy(&dir.join(format!("grads_step0/{}.npy", t.name)));
        let r: Vec<f64> = r.iter().copied().collect();
        let mine = &grad[t.offset..t.offset + t.len()];
        let num: f64 = mine.iter().zip(&r).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        let den: f64 = r.iter().map(|x| x * x).sum::<f64>().sqrt();
        let rel = num / den.max(1e-300);
        if rel > 1e-7 {
            eprintln!("  {}: rel {rel:.2e}", t.name);
        }
        worst = worst.max(rel);
    }
    eprintln!("worst per-tensor relative gradient error: {worst:.2e}");
    assert!(worst < 1e-7, "gradient off by {worst}");
}

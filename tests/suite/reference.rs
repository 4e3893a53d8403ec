//! Against DeePMD-kit 3.2.0's own numbers (`tests/reference/deepmd-3.2.0/model_A`).

use dpw::backend::{Backend, Prefactors};
use dpw::train::predict::{loss_and_grad, predict};

use crate::common::*;

pub fn predictions<B: Backend<f64>>(b: &B) {
    let (model, mut rf) = (model_a(), ref_frames());
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
        worst[1] = worst[1].max(max_abs_diff(
            &p.atom_energy[fr * n..(fr + 1) * n],
            &rf.sorted(&ae, fr),
        ));
        worst[2] = worst[2].max(max_abs_diff(
            &p.force[3 * fr * n..3 * (fr + 1) * n],
            &rf.sorted(&f, fr),
        ));
        let vref: Vec<f64> = (0..9).map(|k| v[[fr, k]]).collect();
        worst[3] = worst[3].max(max_abs_diff(&p.virial[9 * fr..9 * fr + 9], &vref));
    }
    eprintln!(
        "max |Δ| vs DeePMD-kit: energy {:.2e}, atom energy {:.2e}, force {:.2e}, virial {:.2e}",
        worst[0], worst[1], worst[2], worst[3]
    );
    assert!(worst[0] <= 1e-9, "energy off by {}", worst[0]);
    assert!(worst[1] <= 1e-10, "atom energy off by {}", worst[1]);
    assert!(worst[2] <= 1e-10, "force off by {}", worst[2]);
    assert!(worst[3] <= 1e-9, "virial off by {}", worst[3]);
}

pub fn training_gradients<B: Backend<f64>>(b: &B) {
    let (model, rf, dir) = (model_a(), ref_frames(), model_a_dir());
    let steps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train_steps.json")).unwrap())
            .unwrap();
    let s0 = &steps["steps"][0];
    let pref = Prefactors {
        e: 0.02,
        f: 1000.0,
        v: 0.0,
    };
    let (sums, grad, _) = loss_and_grad(b, &model, &rf.atype, &[rf.frame(0)], pref).unwrap();
    let n = rf.atype.len() as f64;
    let loss = pref.e * sums.e2 / n + pref.f * sums.f2 / (3.0 * n);
    let want = s0["loss"].as_f64().unwrap();
    eprintln!(
        "loss {loss} vs DeePMD-kit {want}: rel {:.2e}",
        (loss - want).abs() / want
    );
    assert!((loss - want).abs() / want < 1e-7);
    let mut worst = 0.0f64;
    for t in model.layout().tensors {
        let r = read_npy(&dir.join(format!("grads_step0/{}.npy", t.name)));
        let r: Vec<f64> = r.iter().copied().collect();
        let mine = &grad[t.offset..t.offset + t.len()];
        let num: f64 = mine
            .iter()
            .zip(&r)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt();
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

/// R̂ of every slot and the descriptor of frame 0, through the backend's own ops.
pub fn env_mat_and_descriptor<B: Backend<f64>>(b: &B) {
    use dpw::train::batch::assemble;
    use dpw::train::step::{forward, DeviceModel, Workspace};
    let (model, rf, dir) = (model_a(), ref_frames(), model_a_dir());
    let mut z = npz(&dir.join("intermediates_frame0.npz"));
    let (env_ref, desc_ref) = (
        npz_array(&mut z, "env_mat_normalized"),
        npz_array(&mut z, "descriptor"),
    );
    let batch = assemble(&model.spec, &rf.atype, &[rf.frame(0)]).unwrap();
    let dm = DeviceModel::<f64, B>::new(b, &model);
    let mut w = Workspace::for_batch(b, &dm, &batch).unwrap();
    w.load(b, &batch);
    forward(b, &dm, &mut w);
    let (rhat, desc) = (b.download(w.rhat()), b.download(w.descriptor()));
    let d = &batch.dims;
    let sections = model.spec.descriptor.sections();
    let ndesc = d.m1 * d.m2;
    let (mut worst_env, mut worst_desc) = (0.0f64, 0.0f64);
    for ti in 0..d.ntypes {
        for c in d.centres(ti) {
            let orig = rf.perm[batch.centre_atom[c] as usize];
            for tj in d.sections() {
                for j in 0..d.sel[tj] {
                    let s = d.slot(ti, c, tj, j);
                    for k in 0..4 {
                        worst_env = worst_env
                            .max((rhat[4 * s + k] - env_ref[[orig, sections[tj] + j, k]]).abs());
                    }
                }
            }
            for k in 0..ndesc {
                worst_desc = worst_desc.max((desc[c * ndesc + k] - desc_ref[[orig, k]]).abs());
            }
        }
    }
    eprintln!("frame 0: max |Δ| env mat {worst_env:.2e}, descriptor {worst_desc:.2e}");
    assert!(worst_env < 1e-12 && worst_desc < 1e-12);
}

/// Three steps of Adam's and AdamW's weight decay (λ 0.05, a falling lr) give torch's own
/// parameters (tests/reference/optimizer/weight_decay.json) in T ("float64" or "float32").
pub fn weight_decay_steps<T: dpw::backend::Real, B: Backend<T>>(b: &B, precision: &str) {
    use dpw::backend::{AdamStep, WeightDecay};
    let path = repo("tests/reference/optimizer/weight_decay.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let reals = |v: &serde_json::Value| -> Vec<T> {
        (v.as_array().unwrap().iter())
            .map(|x| T::of(x.as_f64().unwrap()))
            .collect()
    };
    let lrs: Vec<f64> = (r["lr_per_step"].as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap())
        .collect();
    // float32 steps round differently from torch's (its lerp for the first moment) by an ulp.
    let tol = if precision == "float64" { 1e-15 } else { 1e-6 };
    for kind in ["AdamW", "Adam"] {
        let c = &r["cases"][format!("{kind}_{precision}")];
        let wd = c["weight_decay"].as_f64().unwrap();
        let decay = match kind {
            "AdamW" => WeightDecay::Decoupled(wd),
            _ => WeightDecay::L2(wd),
        };
        let mut p = b.upload(&reals(&c["params"]));
        let n = c["params"].as_array().unwrap().len();
        let (mut m, mut v) = (b.zeros(n), b.zeros(n));
        for (t, lr) in lrs.iter().enumerate() {
            let g = b.upload(&reals(&c["grads"][t]));
            let s = AdamStep {
                lr: *lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                t: t as u64 + 1,
                tail: None,
                decay,
            };
            b.adam(s, &mut p, &g, &mut m, &mut v);
            let got: Vec<f64> = b.download(&p).iter().map(|x| x.f64()).collect();
            let want: Vec<f64> = (c["params_after"][t].as_array().unwrap().iter())
                .map(|x| x.as_f64().unwrap())
                .collect();
            let worst = max_abs_diff(&got, &want);
            eprintln!("{kind} {precision} step {t}: max |Δθ| = {worst:.2e}");
            assert!(worst < tol, "{kind} {precision} step {t} off by {worst}");
            // The decay moved every parameter beyond the tolerance (the test can fail).
            if t == 0 {
                let p0: Vec<f64> = (c["params"].as_array().unwrap().iter())
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                let moved = max_abs_diff(&want, &p0);
                assert!(moved > 1e-5, "{kind}: the reference barely moves ({moved})");
            }
        }
    }
}

/// Two Adam steps (lr 1e-3, frames 0 then 1) reproduce DeePMD-kit's parameters; the loss at
/// lr 5e-4 checks the prefactor values used there.
pub fn adam_steps<B: Backend<f64>>(b: &B) {
    use dpw::backend::AdamStep;
    use dpw::train::batch::assemble;
    use dpw::train::step::{forward, gradient, DeviceModel, Workspace};
    let (mut model, rf, dir) = (model_a(), ref_frames(), model_a_dir());
    load_params(&mut model, &dir.join("params_step0"));
    let pref = Prefactors {
        e: 0.02,
        f: 1000.0,
        v: 0.0,
    };
    let mut dm = DeviceModel::<f64, B>::new(b, &model);
    for (step, after) in [(0usize, "params_after_step0"), (1, "params_after_step1")] {
        let batch = assemble(&model.spec, &rf.atype, &[rf.frame(step)]).unwrap();
        let mut w = Workspace::for_batch(b, &dm, &batch).unwrap();
        w.load(b, &batch);
        forward(b, &dm, &mut w);
        gradient(b, &mut dm, &mut w, pref);
        let s = AdamStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            t: step as u64 + 1,
            tail: None,
            decay: Default::default(),
        };
        b.adam(s, &mut dm.params, &dm.grad, &mut dm.m, &mut dm.v);
        let mut want = model.clone();
        load_params(&mut want, &dir.join(after));
        let worst = max_abs_diff(&dm.params_f64(b), &want.params);
        eprintln!("after Adam step {step} with dpw's gradients: max |Δθ| = {worst:.2e}");
        // Adam's first updates are ≈ lr·g/(|g|+eps): where a gradient component is near eps,
        // the 3e-8 relative difference of DeePMD-kit's float32 1/N moves it by ~1e-9.
        assert!(worst < 1e-8, "parameters after step {step} off by {worst}");
    }
    // The optimizer alone, fed DeePMD-kit's own gradients, reproduces its parameters exactly.
    let mut dm = DeviceModel::<f64, B>::new(b, &model);
    for (step, grads, after) in [
        (0u64, "grads_step0", "params_after_step0"),
        (1, "grads_step1", "params_after_step1"),
    ] {
        let mut g = model.clone();
        load_params(&mut g, &dir.join(grads));
        let gbuf = b.upload(&g.params);
        let s = AdamStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            t: step + 1,
            tail: None,
            decay: Default::default(),
        };
        b.adam(s, &mut dm.params, &gbuf, &mut dm.m, &mut dm.v);
        let mut want = model.clone();
        load_params(&mut want, &dir.join(after));
        let worst = max_abs_diff(&dm.params_f64(b), &want.params);
        eprintln!("after Adam step {step} with DeePMD-kit's gradients: max |Δθ| = {worst:.2e}");
        assert!(worst < 1e-15, "Adam step {step} off by {worst}");
    }
    let steps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train_steps.json")).unwrap())
            .unwrap();
    let r = &steps["loss_at_lr_5e-4_step0_params_frame0"];
    let pref = Prefactors {
        e: r["pref_e"].as_f64().unwrap(),
        f: r["pref_f"].as_f64().unwrap(),
        v: 0.0,
    };
    let model = model_a();
    let (sums, _, _) = loss_and_grad(b, &model, &rf.atype, &[rf.frame(0)], pref).unwrap();
    let n = rf.atype.len() as f64;
    let loss = pref.e * sums.e2 / n + pref.f * sums.f2 / (3.0 * n);
    let want = r["loss"].as_f64().unwrap();
    assert!((loss - want).abs() / want < 1e-7, "{loss} vs {want}");
}

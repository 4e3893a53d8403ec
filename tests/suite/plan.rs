//! The plan of a step: buffers made once and written in place, and the device-side ops that
//! keep a non-display step free of read-backs (the log copy, gradient clipping).

use dpw::backend::{AdamStep, AdamTail, Backend, Prefactors};
use dpw::data::System;
use dpw::train::batch::{assemble, assemble_frames};
use dpw::train::resident::ResidentSystem;
use dpw::train::step::DeviceModel;
use dpw::train::workspaces::{adam_step, batch_gradient, resident_gradient, Cache};

use super::fd::{random_system, small_model};

/// 100 training steps over two batches of one shape: the workspace and the model keep every
/// buffer (same ids), only one workspace is made, and the results equal a fresh workspace's.
pub fn buffers_stay_put<B: Backend<f64>>(b: &B) {
    let model = small_model(2, false, vec![6, 10], 5);
    let cell = Some([7.0, 0., 0., 0., 7.5, 0., 0., 0., 8.0]);
    let systems = [
        random_system(&[3, 5], cell, 1),
        random_system(&[3, 5], cell, 2),
    ];
    let batches: Vec<_> = systems
        .iter()
        .map(|s| assemble(&model.spec, &s.atype, &[s.frame()]).unwrap())
        .collect();
    assert_eq!(batches[0].dims, batches[1].dims);
    let pref = Prefactors {
        e: 1.0,
        f: 10.0,
        v: 0.1,
    };
    let opt = dpw::config::OptimizerConfig::default();
    let mut dm = DeviceModel::<f64, B>::new(b, &model);
    let model_ids =
        |dm: &DeviceModel<f64, B>| [&dm.params, &dm.grad, &dm.m, &dm.v].map(|x| b.buf_id(x));
    let ids0 = model_ids(&dm);
    let mut cache: Cache<f64, B> = Vec::new();
    let mut plan_ids = None;
    for step in 0..100 {
        let w = batch_gradient(b, &mut dm, &mut cache, &batches[step % 2], pref).unwrap();
        let ids = w.buffer_ids(b);
        assert_eq!(
            *plan_ids.get_or_insert_with(|| ids.clone()),
            ids,
            "step {step}"
        );
        b.adam(
            adam_step(&opt, 1e-3, step),
            &mut dm.params,
            &dm.grad,
            &mut dm.m,
            &mut dm.v,
        );
        assert_eq!(model_ids(&dm), ids0, "step {step}");
    }
    assert_eq!(cache.len(), 1);
    // The reused workspace gives what a new one gives for the same batch.
    let reused = {
        batch_gradient(b, &mut dm, &mut cache, &batches[0], pref).unwrap();
        dm.grad_f64(b)
    };
    let fresh = {
        let mut c: Cache<f64, B> = Vec::new();
        batch_gradient(b, &mut dm, &mut c, &batches[0], pref).unwrap();
        dm.grad_f64(b)
    };
    assert_eq!(reused, fresh);
}

/// `write` and `copy` land where they should, after the ops issued before them.
pub fn write_and_copy<B: Backend<f64>>(b: &B) {
    let mut x = b.upload(&[1.0, 2.0, 3.0]);
    let id = b.buf_id(&x);
    let mut log = b.zeros(8);
    b.copy(&x, &mut log, 1);
    b.write(&mut x, &[4.0, 5.0, 6.0]);
    b.copy(&x, &mut log, 5);
    assert_eq!(b.buf_id(&x), id);
    assert_eq!(b.download(&log), [0.0, 1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0]);
    let mut i = b.upload_idx(&[1, 2]);
    let id = b.idx_id(&i);
    b.write_idx(&mut i, &[-1, 7]);
    assert_eq!(b.idx_id(&i), id);
}

/// Adam with a tail (a multi-task head, AdamTail) is Adam on the three stretches apart (the
/// run's part, the head's own, its fitting net's), each with its own step count, bit for bit:
/// no count leaks into another stretch's update.
pub fn adam_tail_counts_its_own_steps<B: Backend<f64>>(b: &B) {
    let n = 300;
    let (from, fit_from) = (110, 170);
    let vals = |k: f64| -> Vec<f64> { (0..n).map(|i| ((i as f64 + k) * 0.37).sin()).collect() };
    let (g, p0, m0, v0) = (vals(1.0), vals(2.0), vals(3.0), vals(4.0));
    let v0: Vec<f64> = v0.iter().map(|x| x * x).collect();
    let step = |t: u64, tail: Option<AdamTail>| AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        t,
        tail,
        decay: Default::default(),
    };
    let run = |s: AdamStep, r: std::ops::Range<usize>| -> Vec<Vec<f64>> {
        let (mut p, mut m, mut v) = (
            b.upload(&p0[r.clone()]),
            b.upload(&m0[r.clone()]),
            b.upload(&v0[r.clone()]),
        );
        b.adam(s, &mut p, &b.upload(&g[r.clone()]), &mut m, &mut v);
        vec![b.download(&p), b.download(&m), b.download(&v)]
    };
    let tail = AdamTail {
        from,
        t: 2,
        fit_from,
        fit_t: 4,
    };
    let whole = run(step(7, Some(tail)), 0..n);
    let parts = [
        run(step(7, None), 0..from),
        run(step(2, None), from..fit_from),
        run(step(4, None), fit_from..n),
    ];
    for (k, name) in ["params", "m", "v"].iter().enumerate() {
        let want: Vec<f64> = parts.iter().flat_map(|p| p[k].clone()).collect();
        assert_eq!(whole[k], want, "{name}");
    }
    // The tail's own counts matter: with the run's they are another update.
    assert_ne!(whole, run(step(7, None), 0..n));
    let own_as_fit = AdamTail { fit_t: 2, ..tail };
    assert_ne!(whole, run(step(7, Some(own_as_fit)), 0..n));
}

/// Gradient clipping on the device against the host formula: the norm, the scaled gradient,
/// a gradient below the limit left alone, and a NaN norm reported without scaling.
pub fn clip_grad_norm<B: Backend<f64>>(b: &B) {
    let g: Vec<f64> = (0..1000)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) * 1e-2)
        .collect();
    let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
    let mut out = b.zeros(4);
    for (max, at) in [(0.5 * norm, 1), (2.0 * norm, 3)] {
        let mut gb = b.upload(&g);
        b.clip_grad_norm(&mut gb, max, &mut out, at);
        let got = b.download(&out)[at];
        assert!((got - norm).abs() <= 1e-13 * norm, "norm {got} vs {norm}");
        let coef = max / (norm + 1e-6);
        let want: Vec<f64> = if coef < 1.0 {
            g.iter().map(|x| x * coef).collect()
        } else {
            g.clone()
        };
        let gd = b.download(&gb);
        let worst = gd
            .iter()
            .zip(&want)
            .map(|(a, w)| (a - w).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1e-15, "max {max}: scaled gradient off by {worst}");
    }
    let mut bad = g.clone();
    bad[10] = f64::NAN;
    let mut gb = b.upload(&bad);
    b.clip_grad_norm(&mut gb, 1e-3, &mut out, 0);
    assert!(b.download(&out)[0].is_nan());
    assert_eq!(b.download(&gb)[11], bad[11]);
    // Adam on what the op left: the step runs on without a read-back; the trainer reports the
    // NaN from the logged norm.
    let mut p = b.zeros(g.len());
    let (mut m, mut v) = (b.zeros(g.len()), b.zeros(g.len()));
    let s = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        t: 1,
        tail: None,
        decay: Default::default(),
    };
    b.adam(s, &mut p, &gb, &mut m, &mut v);
    assert!(b.download(&p)[10].is_nan());
}

/// A batch gathered from frames resident on the device is the batch assembled on the host:
/// the same energies, forces, virials and gradient, bit for bit, for batches of one and two
/// frames in any order, in a workspace that keeps its buffers.
pub fn resident_batches_match_host<B: Backend<f64>>(b: &B) {
    let model = small_model(2, false, vec![6, 10], 5);
    let cell = [7.0, 0., 0., 0., 7.5, 0., 0., 0., 8.0];
    let frames: Vec<_> = (0..3)
        .map(|k| random_system(&[3, 5], Some(cell), 10 + k))
        .collect();
    let sys = System {
        path: "random".into(),
        natoms: 8,
        mixed: false,
        atype: frames[0].atype.clone(),
        orig_index: (0..8).collect(),
        nframes: 3,
        coord: frames.iter().flat_map(|f| f.coord.clone()).collect(),
        cell: Some(frames.iter().flat_map(|_| cell).collect()),
        energy: frames.iter().map(|f| f.energy).collect(),
        force: frames.iter().flat_map(|f| f.force.clone()).collect(),
        has_energy: true,
        has_force: true,
        virial: Some(frames.iter().flat_map(|f| f.virial.clone()).collect()),
        fparam: None,
        aparam: None,
        label: None,
        atom_label: None,
    };
    let pref = Prefactors {
        e: 1.0,
        f: 10.0,
        v: 0.1,
    };
    let mut dm = DeviceModel::<f64, B>::new(b, &model);
    let rs = ResidentSystem::<f64, B>::new(b, &model.spec, &sys, 2).unwrap();
    let mut cache: Cache<f64, B> = Vec::new();
    let mut ids: Vec<Option<Vec<u64>>> = vec![None, None];
    for pick in [
        vec![2],
        vec![1, 0],
        vec![0],
        vec![0, 2],
        vec![2],
        vec![2, 2],
    ] {
        let host = assemble_frames(&model.spec, &sys, &pick, "test").unwrap();
        let expect = {
            let w = batch_gradient(b, &mut dm, &mut cache, &host, pref).unwrap();
            [&w.energy, &w.force, &w.virial].map(|x| b.download(x))
        };
        let grad = dm.grad_f64(b);
        let w = resident_gradient(b, &mut dm, &mut cache, &rs, &pick, pref).unwrap();
        let got = [&w.energy, &w.force, &w.virial].map(|x| b.download(x));
        let plan = w.buffer_ids(b);
        assert_eq!(got, expect, "frames {pick:?}");
        assert_eq!(dm.grad_f64(b), grad, "frames {pick:?}");
        assert_eq!(
            *ids[pick.len() - 1].get_or_insert_with(|| plan.clone()),
            plan,
            "frames {pick:?}: the plan's buffers moved"
        );
    }
    assert_eq!(cache.len(), 2, "one workspace per batch size");
}

//! `batch_size: "mixed:N"` (DeePMD-kit's TensorFlow backend, `nopbc/mixed`): a batch of frames
//! of several systems, each padded to the largest frame's atoms with virtual atoms. The model
//! sees each frame as it would alone; the loss is TensorFlow's, whose natoms is the largest
//! frame's and whose force mean runs over the virtual atoms too (docs/deepmd-spec.md §12).

mod common;

use std::path::Path;

use dpw::backend::cpu::Cpu;
use dpw::backend::Prefactors;
use dpw::data::{load_system, Draw, Sampler, System};
use dpw::model::{read_deepmd_yaml, Model};
use dpw::train::batch::{assemble_frames, assemble_mixed};
use dpw::train::predict::{loss_and_grad_batch, predict_batch};
use serde_json::json;
use tempfile::TempDir;

use common::{rel_to_max, repo};

/// Water frames of 192 atoms (the example's data_0) and of 384 (tests/data/water_virial).
fn water_systems(m: &Model) -> [System; 2] {
    [
        load_system(&repo("examples/water/data_0"), &m.spec.type_map).unwrap(),
        load_system(&repo("tests/data/water_virial"), &m.spec.type_map).unwrap(),
    ]
}

/// One model of each mixed-type descriptor, DeePMD-kit's own (tests/reference).
const MODELS: [&str; 4] = [
    "dpa1/se_atten_l2_opts_water",
    "dpa2/water_small",
    "dpa3/water",
    "dpa2/se_e3_tebd_water",
];

fn model(case: &str) -> Model {
    read_deepmd_yaml(&repo(&format!("tests/reference/{case}/model.yaml"))).unwrap()
}

/// The picks of the batch: a small frame, a large one, another small one.
fn picks([small, large]: &[System; 2]) -> Vec<(&System, usize)> {
    vec![(small, 0), (large, 1), (small, 2)]
}

/// Each frame of a mixed batch is predicted as in a batch of its own: energy, atomic
/// energies, forces and virial; the virtual atoms have no energy and no force.
#[test]
fn a_mixed_batch_predicts_each_frame_as_alone() {
    for case in MODELS {
        let m = model(case);
        let systems = water_systems(&m);
        let picks = picks(&systems);
        let batch = assemble_mixed(&m.spec, &picks, "test").unwrap();
        let n = batch.dims.natoms;
        assert_eq!((batch.dims.nframes, n), (3, 384), "{case}");
        assert_eq!(batch.dims.ncentres(), 192 + 384 + 192, "{case}");
        let mixed = predict_batch::<f64, _>(&Cpu::default(), &m, &batch).unwrap();
        for (k, &(sys, f)) in picks.iter().enumerate() {
            let alone = assemble_frames(&m.spec, sys, &[f], "test").unwrap();
            let a = predict_batch::<f64, _>(&Cpu::default(), &m, &alone).unwrap();
            let na = sys.natoms;
            let atoms = |x: &[f64], w: usize| x[k * n * w..(k * n + na) * w].to_vec();
            let errs = [
                ("energy", rel_to_max(&mixed.energy[k..k + 1], &a.energy)),
                (
                    "atom energy",
                    rel_to_max(&atoms(&mixed.atom_energy, 1), &a.atom_energy),
                ),
                ("force", rel_to_max(&atoms(&mixed.force, 3), &a.force)),
                (
                    "virial",
                    rel_to_max(&mixed.virial[9 * k..9 * k + 9], &a.virial),
                ),
            ];
            for (what, e) in errs {
                assert!(e <= 1e-12, "{case}, frame {k}: {what} differs by {e:.1e}");
            }
            let virtual_atoms = (k * n + na)..(k + 1) * n;
            assert!(
                mixed.atom_energy[virtual_atoms.clone()]
                    .iter()
                    .all(|&x| x == 0.0)
                    && mixed.force[3 * virtual_atoms.start..3 * virtual_atoms.end]
                        .iter()
                        .all(|&x| x == 0.0),
                "{case}, frame {k}: a virtual atom has energy or force"
            );
        }
    }
}

/// TensorFlow's loss of a mixed batch of frames f with n_f atoms, n the largest: the energy
/// term over n, the force mean over n atoms a frame. With the same prefactors it is
/// Σ_f n_f / (n · nframes) times each frame's loss alone, and so is its gradient: the loss
/// sums are the frames' and the gradient is that sum of theirs.
#[test]
fn a_mixed_batch_has_tensorflows_loss_and_its_gradient() {
    let pref = Prefactors {
        e: 0.02,
        f: 1000.0,
        v: 0.5,
    };
    for case in MODELS {
        let m = model(case);
        let systems = water_systems(&m);
        let picks = picks(&systems);
        let batch = assemble_mixed(&m.spec, &picks, "test").unwrap();
        let (n, nf) = (batch.dims.natoms as f64, picks.len() as f64);
        let (sums, grad, _) =
            loss_and_grad_batch::<f64, _>(&Cpu::default(), &m, &batch, pref).unwrap();
        let mut want_sums = [0.0; 3];
        let mut want_grad = vec![0.0; grad.len()];
        for &(sys, f) in &picks {
            let alone = assemble_frames(&m.spec, sys, &[f], "test").unwrap();
            let (s, g, _) =
                loss_and_grad_batch::<f64, _>(&Cpu::default(), &m, &alone, pref).unwrap();
            for (w, x) in want_sums.iter_mut().zip([s.e2, s.f2, s.v2]) {
                *w += x;
            }
            let weight = sys.natoms as f64 / (n * nf);
            for (w, x) in want_grad.iter_mut().zip(&g) {
                *w += weight * x;
            }
        }
        let e = rel_to_max(&[sums.e2, sums.f2, sums.v2], &want_sums);
        assert!(e <= 1e-12, "{case}: the loss sums differ by {e:.1e}");
        let e = rel_to_max(&grad, &want_grad);
        assert!(e <= 1e-11, "{case}: the gradient differs by {e:.1e}");
    }
}

/// A mixed stream's batch: N frames, each the next of its system's shuffled pass, sorted by
/// system; every system's frames come round once an epoch; ranks split the global batch.
#[test]
fn a_mixed_stream_draws_n_frames_each_from_its_own_pass() {
    let nframes = [3, 5, 4];
    let mut s = Sampler::mixed(&nframes, 4, vec![0.2, 0.5, 0.3], 9);
    assert_eq!(s.mixed_size(), Some(4));
    let mut seen = vec![Vec::new(); 3];
    for _ in 0..60 {
        let (draw, nglobal) = s.draw((0, 1));
        let Draw::Mixed(picks) = draw else {
            panic!("a mixed stream gave {draw:?}")
        };
        assert_eq!((picks.len(), nglobal), (4, 4));
        assert!(picks.windows(2).all(|w| w[0] <= w[1]), "{picks:?}");
        for (sys, f) in picks {
            seen[sys].push(f);
        }
    }
    for (sys, frames) in seen.iter().enumerate() {
        // Draws of a system in order of drawing are not kept by the sorting within a batch,
        // but each whole pass holds every frame once: count them.
        let passes = frames.len() / nframes[sys];
        for f in 0..nframes[sys] {
            let c = frames.iter().filter(|&&x| x == f).count();
            assert!(
                c == passes || c == passes + 1,
                "system {sys} frame {f}: {c} of {frames:?}"
            );
        }
    }
    assert!(
        seen[1].len() > seen[0].len(),
        "probabilities 0.2 and 0.5: {seen:?}"
    );
    // Two ranks: the same global draw, each its half.
    let mut one = Sampler::mixed(&nframes, 2, vec![1.0; 3], 3);
    let (all, _) = one.draw((0, 2));
    let mut two = Sampler::mixed(&nframes, 2, vec![1.0; 3], 3);
    let (other, n) = two.draw((1, 2));
    let (Draw::Mixed(a), Draw::Mixed(b)) = (all, other) else {
        panic!("mixed draws")
    };
    assert_eq!((a.len(), b.len(), n), (2, 2, 4));
    // The stream state goes through a checkpoint, and a checkpoint of another stream is refused.
    let back: Sampler = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back.mixed_size(), Some(4));
    assert!(back
        .check(&nframes, &[4; 3], &[0.2, 0.5, 0.3], Some(4))
        .is_ok());
    let e = back
        .check(&nframes, &[4; 3], &[0.2, 0.5, 0.3], None)
        .unwrap_err();
    assert!(e.contains("mixed"), "{e}");
    let plain = Sampler::new(&nframes, &[4; 3], vec![1.0; 3], 1);
    assert!(!serde_json::to_string(&plain).unwrap().contains("mixed"));
}

/// DeePMD-kit's nopbc molecules of 7, 8 and 10 atoms, three systems.
fn nopbc_input(descriptor: serde_json::Value, batch_size: &str, steps: usize) -> serde_json::Value {
    json!({
        "model": {
            "type_map": ["C", "H", "O"],
            "descriptor": descriptor,
            "fitting_net": {"neuron": [8, 8], "seed": 1}
        },
        "learning_rate": {"start_lr": 0.001, "stop_lr": 1e-5, "decay_steps": 10},
        "loss": {"start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000, "limit_pref_f": 1},
        "training": {
            "training_data": {"systems": repo("tests/data/nopbc"), "batch_size": batch_size},
            "validation_data": {"systems": repo("tests/data/nopbc"), "batch_size": batch_size, "numb_btch": 2},
            "numb_steps": steps,
            "seed": 3,
            "disp_freq": 1,
            "save_freq": 1
        }
    })
}

fn se_atten() -> serde_json::Value {
    json!({"type": "se_atten", "sel": 12, "rcut": 4.0, "rcut_smth": 0.5, "neuron": [4, 8],
           "axis_neuron": 4, "attn": 8, "attn_layer": 1, "seed": 1})
}

fn lcurve(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("lcurve.out")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// `dpw train` on mixed batches: out.json keeps "mixed:N", and a restart from the step-2
/// checkpoint continues the same batch stream (steps 3 and 4 as in the run that saved it).
#[test]
fn training_on_mixed_batches_restarts_where_it_stopped() {
    let dir = TempDir::new().unwrap();
    let (ok, err) = common::dpw_train(dir.path(), &nopbc_input(se_atten(), "mixed:3", 4));
    assert!(ok, "{err}");
    let whole = lcurve(dir.path());
    assert_eq!(whole.len(), 4, "{whole:?}");
    let out = common::json_file(&dir.path().join("out.json"));
    assert_eq!(out["training"]["training_data"]["batch_size"], "mixed:3");
    let again = TempDir::new().unwrap();
    let input = nopbc_input(se_atten(), "mixed:3", 4);
    std::fs::write(again.path().join("input.json"), input.to_string()).unwrap();
    let ckpt = dir.path().join("model.ckpt-2");
    let (ok, err) = common::dpw_in(
        again.path(),
        &[
            "train",
            "input.json",
            "--restart",
            ckpt.to_str().unwrap(),
            "--backend",
            "cpu",
        ],
    );
    assert!(ok, "{err}");
    let resumed = lcurve(again.path());
    assert_eq!(
        resumed[resumed.len() - 2..],
        whole[2..],
        "{resumed:?}\n{whole:?}"
    );
}

/// A system's batches are counted as DeePMD-kit's TensorFlow backend counts them, whole ones (at
/// least one), for the system probabilities: 15 frames in batches of 4 are 3, as the summary
/// of the data shows.
#[test]
fn mixed_batches_count_whole_batches_as_tensorflow() {
    let dir = TempDir::new().unwrap();
    let (ok, log) = common::dpw_train(dir.path(), &nopbc_input(se_atten(), "mixed:4", 1));
    assert!(ok, "{log}");
    let rows: Vec<Vec<&str>> = (log.lines())
        .filter(|l| l.contains("tests/data/nopbc/C"))
        .map(|l| l.split_whitespace().rev().take(6).collect())
        .collect();
    // Training and validation: three systems each; (pbc, prob, n_bch, bch_sz, frames, natoms).
    assert_eq!(rows.len(), 6, "{log}");
    for r in rows {
        assert_eq!(r[..5], ["F", "0.333", "3", "4", "15"], "{log}");
    }
}

/// "mixed:N" asks for a mixed-type descriptor, as DeePMD-kit's TensorFlow backend does, and for
/// its N.
#[test]
fn mixed_batches_are_refused_where_they_cannot_be() {
    let dir = TempDir::new().unwrap();
    let se_e2_a = json!({"type": "se_e2_a", "sel": [4, 8, 4], "rcut": 4.0, "rcut_smth": 0.5,
                         "neuron": [4, 8], "axis_neuron": 4, "seed": 1});
    let (ok, err) = common::dpw_train(dir.path(), &nopbc_input(se_e2_a, "mixed:2", 1));
    assert!(!ok && !err.contains("panicked"), "{err}");
    assert!(
        err.contains("training.training_data.batch_size") && err.contains("mixed-type descriptor"),
        "{err}"
    );
    let (ok, err) = common::dpw_train(dir.path(), &nopbc_input(se_atten(), "mixed", 1));
    assert!(!ok && !err.contains("panicked"), "{err}");
    assert!(
        err.contains("batch_size") && err.contains("mixed:N"),
        "{err}"
    );
}

//! A diverging run stops with the error naming the step where the loss first became non-finite,
//! although the loss sums are read only at display steps and checkpoints; no checkpoint written
//! holds a non-finite parameter.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

fn sys(name: &str) -> String {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water"))
        .join(name)
        .display()
        .to_string()
}

/// float32 and lr 1e9: the energies overflow at step 2 (the loss of step 1 is finite).
fn diverging_input(disp_freq: usize, save_freq: usize) -> serde_json::Value {
    json!({
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {"type": "se_e2_a", "sel": [20, 28], "rcut_smth": 0.5, "rcut": 4.0,
                           "neuron": [4, 8], "axis_neuron": 4, "type_one_side": true, "seed": 1,
                           "precision": "float32"},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1, "precision": "float32"},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 1e9, "stop_lr": 1e9, "decay_steps": 5},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1,
                 "start_pref_f": 1000, "limit_pref_f": 1},
        "training": {
            "training_data": {"systems": [sys("data_0")], "batch_size": 1},
            "numb_steps": 40, "seed": 10, "disp_freq": disp_freq, "save_freq": save_freq
        }
    })
}

/// Runs `dpw train`; returns its stderr, failing unless it exits non-zero without a panic.
fn train_fails(dir: &Path, input: &serde_json::Value) -> String {
    std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["train", "input.json"])
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "training should have stopped:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("model.ckpt-")
        })
        .collect()
}

#[test]
fn divergence_is_reported_at_its_step_after_the_next_display() {
    // Read at step 5 (display), reported for step 2; nothing saved, lcurve.out has step 1 only.
    let d = tempfile::tempdir().unwrap();
    let err = train_fails(d.path(), &diverging_input(5, 100));
    assert!(err.contains("the loss is inf at step 2 (system "), "{err}");
    assert!(checkpoints(d.path()).is_empty());
    let lcurve = std::fs::read_to_string(d.path().join("lcurve.out")).unwrap();
    let steps: Vec<&str> = lcurve
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(steps, ["1"]);
}

#[test]
fn no_checkpoint_holds_a_diverged_model() {
    // A checkpoint is due at step 2 and displays are rare: the read before saving finds the
    // divergence and nothing is saved.
    let d = tempfile::tempdir().unwrap();
    let err = train_fails(d.path(), &diverging_input(100, 2));
    assert!(err.contains("the loss is inf at step 2 (system "), "{err}");
    assert!(checkpoints(d.path()).is_empty());
    assert!(!d.path().join("model.ckpt").exists());
}

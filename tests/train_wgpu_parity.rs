//! 40 training steps on the wgpu backend and on the cpu backend, in float64, write the same
//! lcurve.out to the printed digits at every 4th step. A small model on the water data and few
//! steps (the lr still decays 3 times) keep it to minutes on lavapipe (software Vulkan); 200
//! steps took 21 min on a busy 2-core machine.
#![cfg(feature = "wgpu")]
mod common;

use std::path::Path;
use std::process::Command;

fn train(dir: &Path, backend: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["train", "input.json", "--backend", backend])
        .current_dir(dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{backend}: {log}");
    std::fs::read_to_string(dir.join("lcurve.out")).unwrap()
}

#[test]
fn lcurve_of_40_steps_matches_cpu() {
    if let Err(e) = dpw::backend::wgpu::Wgpu::new_f64(wgpu::PowerPreference::HighPerformance) {
        let why = format!("no wgpu adapter with float64 ({e:#})");
        common::no_wgpu("lcurve_of_40_steps_matches_cpu", &why);
        return;
    }
    let water = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    let input = serde_json::json!({
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {"type": "se_e2_a", "sel": [46, 92], "rcut": 6.0, "rcut_smth": 0.5,
                           "neuron": [4, 8, 16], "axis_neuron": 4, "type_one_side": true, "seed": 1},
            "fitting_net": {"neuron": [16, 16], "resnet_dt": true, "seed": 1},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 0.001, "stop_lr": 1e-5, "decay_steps": 10},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000, "limit_pref_f": 1},
        "training": {
            "training_data": {"systems": [water.join("data_0")], "batch_size": 1},
            "validation_data": {"systems": [water.join("data_3")], "batch_size": 1, "numb_btch": 1},
            "numb_steps": 40, "seed": 3, "disp_freq": 4, "save_freq": 40
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let mut curves = Vec::new();
    for backend in ["cpu", "wgpu"] {
        let dir = tmp.path().join(backend);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("input.json"),
            serde_json::to_string_pretty(&input).unwrap(),
        )
        .unwrap();
        curves.push(train(&dir, backend));
    }
    let lines = curves[0].lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(lines, 11, "lines at steps 1, 4, ..., 40:\n{}", curves[0]);
    assert_eq!(curves[0], curves[1], "cpu and wgpu lcurve.out differ");
}

//! Training frames resident on the device (`train::resident`): a non-display step then writes
//! at most 1 KB from the host (counted by `dpw bench --profile`), and a run with resident frames
//! trains exactly as one that writes every batch from the host: the same lcurve.out and the
//! same checkpoint, byte for byte. On the cpu backend, and on wgpu where an adapter exists
//! (lavapipe in CI), whose force gather lists take their own resident path.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The water example's data and layout (192 atoms, sel [46, 92], batch 1) with tiny nets, so
/// that it trains in seconds even on a software GPU; a virial prefactor on, so every label is
/// used.
fn input(dir: &Path, precision: &str) -> PathBuf {
    let water = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    let input = serde_json::json!({
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {"type": "se_e2_a", "sel": [46, 92], "rcut": 6.0, "rcut_smth": 0.5,
                           "neuron": [4, 8, 16], "axis_neuron": 4, "type_one_side": true,
                           "seed": 1, "precision": precision},
            "fitting_net": {"neuron": [16, 16], "resnet_dt": true, "seed": 1,
                            "precision": precision},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 0.001, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                 "limit_pref_f": 1, "start_pref_v": 0.1, "limit_pref_v": 1},
        "training": {
            "training_data": {"systems": [water.join("data_0"), water.join("data_1")],
                              "batch_size": 1},
            "validation_data": {"systems": [water.join("data_3")], "batch_size": 1,
                                "numb_btch": 1},
            "numb_steps": 9, "seed": 3, "disp_freq": 3, "save_freq": 9
        }
    });
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("input.json");
    std::fs::write(&path, serde_json::to_string_pretty(&input).unwrap()).unwrap();
    path
}

/// DPA-1 on a mixed-type system of three compositions (tests/data/mixed/alloy, 6 frames),
/// batches of 2 frames, so that most batches hold frames of two compositions, each with its own
/// slot layout and padding type.
fn mixed_input(dir: &Path, precision: &str) -> PathBuf {
    let alloy = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mixed/alloy");
    let input = serde_json::json!({
        "model": {
            "type_map": ["Cu", "Ni", "Al"],
            "descriptor": {"type": "se_atten_v2", "sel": 40, "rcut": 4.0, "rcut_smth": 0.5,
                           "neuron": [4, 8], "axis_neuron": 4, "tebd_dim": 4, "attn": 8,
                           "attn_layer": 1, "seed": 1, "precision": precision},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1,
                            "precision": precision}
        },
        "learning_rate": {"type": "exp", "start_lr": 0.001, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                 "limit_pref_f": 1, "start_pref_v": 0.1, "limit_pref_v": 1},
        "training": {
            "training_data": {"systems": [&alloy], "batch_size": 2},
            "validation_data": {"systems": [&alloy], "batch_size": 1, "numb_btch": 1},
            "numb_steps": 9, "seed": 3, "disp_freq": 3, "save_freq": 9
        }
    });
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("input.json");
    std::fs::write(&path, serde_json::to_string_pretty(&input).unwrap()).unwrap();
    path
}

fn dpw(dir: &Path, resident_mb: &str, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(args)
        .env("DPW_RESIDENT_MB", resident_mb)
        .current_dir(dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dpw {args:?}: {log}");
    let resident = log.contains("training frames on the device: 2 of 2 systems")
        || log.contains("training frames on the device: 1 of 1 systems");
    assert_eq!(resident, resident_mb != "0", "{log}");
}

/// Host-to-device bytes and read-backs per profiled step.
fn step_counts(dir: &Path, backend: &str, resident_mb: &str) -> (f64, f64) {
    let args = [
        "bench",
        "input.json",
        "--backend",
        backend,
        "--steps",
        "2",
        "--warmup",
        "2",
        "--profile",
        "--json",
        "bench.json",
    ];
    dpw(dir, resident_mb, &args);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("bench.json")).unwrap()).unwrap();
    let c = &r["profile"]["counts_per_step"];
    (
        c["upload_bytes"].as_f64().unwrap(),
        c["readbacks"].as_f64().unwrap(),
    )
}

fn check_counts(tmp: &Path, backend: &str, precision: &str) {
    let dir = tmp.join(format!("bench-{backend}-{precision}"));
    input(&dir, precision);
    let (resident, readbacks) = step_counts(&dir, backend, "4096");
    assert!(
        resident <= 1024.0,
        "{backend}: {resident} bytes uploaded per step with resident frames"
    );
    assert_eq!(
        readbacks, 0.0,
        "{backend}: read-backs in a non-display step"
    );
    // Without residency the step writes the batch: what the counts above would catch.
    let (written, _) = step_counts(&dir, backend, "0");
    assert!(written > 100_000.0, "{backend}: {written} bytes per step");
}

/// How a test writes its input.json.
type Input = fn(&Path, &str) -> PathBuf;

/// lcurve.out and the last checkpoint of a run, with frames resident or not.
fn run(
    tmp: &Path,
    make: Input,
    backend: &str,
    precision: &str,
    resident_mb: &str,
) -> (Vec<u8>, Vec<u8>) {
    let dir = tmp.join(format!("train-{backend}-{precision}-{resident_mb}"));
    make(&dir, precision);
    dpw(
        &dir,
        resident_mb,
        &["train", "input.json", "--backend", backend],
    );
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    (read("lcurve.out"), read("model.ckpt-9"))
}

fn check_same_run(tmp: &Path, make: Input, backend: &str, precision: &str) {
    let written = run(tmp, make, backend, precision, "0");
    let resident = run(tmp, make, backend, precision, "4096");
    assert_eq!(
        String::from_utf8_lossy(&written.0),
        String::from_utf8_lossy(&resident.0),
        "{backend} {precision}: lcurve.out differs"
    );
    assert!(
        written.1 == resident.1,
        "{backend} {precision}: checkpoints differ"
    );
}

#[test]
fn cpu_resident_step_uploads_under_1kb() {
    check_counts(tempfile::tempdir().unwrap().path(), "cpu", "float64");
}

#[test]
fn cpu_resident_run_is_identical() {
    check_same_run(tempfile::tempdir().unwrap().path(), input, "cpu", "float64");
}

#[test]
fn cpu_resident_mixed_type_run_is_identical() {
    check_same_run(
        tempfile::tempdir().unwrap().path(),
        mixed_input,
        "cpu",
        "float64",
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_resident_step_uploads_under_1kb() {
    if common::wgpu_f64_present("wgpu_resident_step_uploads_under_1kb") {
        check_counts(tempfile::tempdir().unwrap().path(), "wgpu", "float32");
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_resident_run_is_identical() {
    if common::wgpu_f64_present("wgpu_resident_run_is_identical") {
        let tmp = tempfile::tempdir().unwrap();
        check_same_run(tmp.path(), input, "wgpu", "float32");
        check_same_run(tmp.path(), input, "wgpu", "float64");
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_resident_mixed_type_run_is_identical() {
    if common::wgpu_f64_present("wgpu_resident_mixed_type_run_is_identical") {
        let tmp = tempfile::tempdir().unwrap();
        check_same_run(tmp.path(), mixed_input, "wgpu", "float64");
    }
}

/// A device whose largest storage binding cannot hold a system's frames
/// (`DPW_WGPU_MAX_BINDING_MB`, as a browser's WebGPU) keeps none of them, says why, and trains
/// as a run that keeps none.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_frames_past_the_largest_binding_are_written_every_step() {
    if !common::wgpu_f64_present("wgpu_frames_past_the_largest_binding_are_written_every_step") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let written = run(tmp.path(), input, "wgpu", "float32", "0");
    let dir = tmp.path().join("small-binding");
    input(&dir, "float32");
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["train", "input.json", "--backend", "wgpu"])
        .env("DPW_RESIDENT_MB", "4096")
        .env("DPW_WGPU_MAX_BINDING_MB", "8")
        .current_dir(&dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("training frames on the device: 0 of 2 systems")
            && log
                .contains("(2 with an array over this adapter's largest storage binding (8.0 MiB"),
        "{log}"
    );
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&written.0),
        String::from_utf8_lossy(&read("lcurve.out"))
    );
    assert!(written.1 == read("model.ckpt-9"), "checkpoints differ");
}

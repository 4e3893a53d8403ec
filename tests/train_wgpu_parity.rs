//! Training steps on the wgpu backend and on the cpu backend, in float64, write the same
//! lcurve.out to the printed digits at every 4th step: 40 of se_e2_a, 12 of DPA-1. A small model
//! on the water data and few steps (the lr still decays 3 times) keep it to minutes on lavapipe
//! (software Vulkan); 200 steps took 21 min on a busy 2-core machine. Also: the profiled run
//! (`DPW_WGPU_PROFILE`) gives the same lcurve.out and a report of every dispatch.
#![cfg(feature = "wgpu")]
mod common;

use std::path::Path;
use std::process::Command;

fn train(dir: &Path, backend: &str) -> String {
    train_with(dir, backend, &[]).0
}

/// Trains in `dir` with `env` set: (lcurve.out, the log).
fn train_with(dir: &Path, backend: &str, env: &[(&str, &str)]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["train", "input.json", "--backend", backend])
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{backend}: {log}");
    (
        std::fs::read_to_string(dir.join("lcurve.out")).unwrap(),
        log,
    )
}

/// A directory of its own under `tmp`, with `input` as its input.json.
fn run_dir(tmp: &Path, name: &str, input: &serde_json::Value) -> std::path::PathBuf {
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("input.json"),
        serde_json::to_string_pretty(input).unwrap(),
    )
    .unwrap();
    dir
}

/// Trains `input` on cpu and on wgpu, each in a directory of its own; their lcurve.out, which
/// must have `lines` rows, are equal.
fn lcurves_match(test: &str, input: &serde_json::Value, lines: usize) {
    if !common::wgpu_f64_present(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut curves = Vec::new();
    for backend in ["cpu", "wgpu"] {
        curves.push(train(&run_dir(tmp.path(), backend, input), backend));
    }
    let rows = curves[0].lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, lines, "rows of lcurve.out:\n{}", curves[0]);
    assert_eq!(curves[0], curves[1], "cpu and wgpu lcurve.out differ");
}

/// A small se_e2_a model on the water data: an lcurve.out line every 4th step.
fn water_input(steps: usize) -> serde_json::Value {
    let water = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    serde_json::json!({
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
            "numb_steps": steps, "seed": 3, "disp_freq": 4, "save_freq": steps
        }
    })
}

#[test]
fn lcurve_of_40_steps_matches_cpu() {
    // Steps 1, 4, ..., 40.
    lcurves_match("lcurve_of_40_steps_matches_cpu", &water_input(40), 11);
}

/// `DPW_WGPU_PROFILE`: the report names every dispatch once (from GPU timestamps where the
/// adapter has them, else waited for), and the profiled run, a compute pass per dispatch, writes
/// the lcurve.out of the run without it.
#[test]
fn profile_reports_every_dispatch() {
    if !common::wgpu_f64_present("profile_reports_every_dispatch") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let input = water_input(8);
    let (plain, _) = train_with(&run_dir(tmp.path(), "plain", &input), "wgpu", &[]);
    let dir = run_dir(tmp.path(), "profiled", &input);
    let (profiled, log) = train_with(&dir, "wgpu", &[("DPW_WGPU_PROFILE", "1")]);
    assert_eq!(plain, profiled, "the profiled run's lcurve.out differs");

    let mut lines = log.lines().skip_while(|l| !l.contains("wgpu kernels, "));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no profile in the log:\n{log}"));
    let mut calls = 0;
    let mut rows = 0;
    for row in lines {
        let w: Vec<&str> = row.split_whitespace().collect();
        let [ms, "ms", n, "calls", us, "µs", "a", "call", kernel, prec] = w[..] else {
            break;
        };
        let (ms, us): (f64, f64) = (ms.parse().unwrap(), us.parse().unwrap());
        assert!(ms >= 0.0 && us >= 0.0, "{row}");
        assert!(kernel.contains(".wgsl:") && prec == "float64", "{row}");
        calls += n.parse::<u64>().unwrap();
        rows += 1;
    }
    assert!(rows > 10, "{rows} kernels in the profile:\n{log}");
    eprintln!("{head}");
    if head.contains("GPU timestamps") {
        let dispatches = head
            .split(" inside ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no dispatch count in {head}"));
        assert_eq!(calls, dispatches, "{head}");
    } else {
        assert!(head.contains("each dispatch waited for"), "{head}");
    }
}

/// DPA-1 (se_atten_v2, one attention layer) on the alloy data, kept tiny: its attention ops
/// run on the host on wgpu, the rest on the device.
#[test]
fn dpa1_lcurve_of_12_steps_matches_cpu() {
    let alloy = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/alloy/data");
    let input = serde_json::json!({
        "model": {
            "type_map": ["Cu", "Ni", "Al"],
            "descriptor": {"type": "se_atten_v2", "sel": 40, "rcut": 4.0, "rcut_smth": 0.5,
                           "neuron": [4, 8], "axis_neuron": 2, "tebd_dim": 4, "attn": 8,
                           "attn_layer": 1, "attn_dotr": true, "seed": 1},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 0.002, "stop_lr": 1e-5, "decay_steps": 4},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                 "limit_pref_f": 1, "start_pref_v": 0.02, "limit_pref_v": 1},
        "training": {
            "training_data": {"systems": [alloy.join("train/Cu36Ni36Al36")], "batch_size": 1},
            "validation_data": {"systems": [alloy.join("valid/Cu48Ni30Al30")], "batch_size": 1,
                                "numb_btch": 1},
            "numb_steps": 12, "seed": 3, "disp_freq": 4, "save_freq": 12
        }
    });
    // Steps 1, 4, 8, 12.
    lcurves_match("dpa1_lcurve_of_12_steps_matches_cpu", &input, 4);
}

/// DPA-2 (repinit with its three-body block, one repformer layer with both attentions) on the
/// water data, kept tiny: its block runs on the device through its tape (wgpu/tape.rs).
#[test]
fn dpa2_lcurve_of_8_steps_matches_cpu() {
    let mut input = water_input(8);
    input["model"]["descriptor"] = serde_json::json!({
        "type": "dpa2",
        "repinit": {"tebd_dim": 4, "rcut": 4.0, "rcut_smth": 0.5, "nsel": 40,
                    "neuron": [4, 8], "axis_neuron": 4, "use_three_body": true,
                    "three_body_sel": 16, "three_body_rcut": 3.0, "three_body_rcut_smth": 2.5,
                    "three_body_neuron": [2, 4]},
        "repformer": {"rcut": 3.0, "rcut_smth": 2.5, "nsel": 16, "nlayers": 1, "g1_dim": 8,
                      "g2_dim": 4, "attn1_hidden": 4, "attn1_nhead": 2, "attn2_hidden": 4,
                      "attn2_nhead": 2, "axis_neuron": 2, "update_g1_has_attn": true,
                      "update_g2_has_attn": true, "update_h2": true},
        "seed": 1
    });
    // Steps 1, 4, 8.
    lcurves_match("dpa2_lcurve_of_8_steps_matches_cpu", &input, 3);
}

/// `"mixed:3"` batches of DeePMD-kit's nopbc molecules (7, 8 and 10 atoms, three systems):
/// frames padded with virtual atoms, and more batch shapes than the plans kept, so plans are
/// dropped and the backend forgets their shapes ([`dpw::backend::Device::forget_shape`]) and
/// makes them again when a shape comes back.
#[test]
fn mixed_batches_lcurve_of_12_steps_matches_cpu() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nopbc");
    let input = serde_json::json!({
        "model": {
            "type_map": ["C", "H", "O"],
            "descriptor": {"type": "se_atten", "sel": 12, "rcut": 4.0, "rcut_smth": 0.5,
                           "neuron": [4, 8], "axis_neuron": 4, "attn": 8, "attn_layer": 1,
                           "seed": 1},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 0.002, "stop_lr": 1e-5, "decay_steps": 4},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                 "limit_pref_f": 1},
        "training": {
            "training_data": {"systems": [data], "batch_size": "mixed:3"},
            "validation_data": {"systems": [data], "batch_size": "mixed:2", "numb_btch": 2},
            "numb_steps": 12, "seed": 3, "disp_freq": 4, "save_freq": 12
        }
    });
    // Steps 1, 4, 8, 12.
    lcurves_match("mixed_batches_lcurve_of_12_steps_matches_cpu", &input, 4);
}

/// Frame and atomic parameters (DeePMD-kit's fparam example data, four frames of each of its
/// two systems): the fitting's input is joined on the device by copies and gathers.
#[test]
fn fparam_aparam_lcurve_of_8_steps_matches_cpu() {
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepmd-kit/examples/fparam/data");
    let input = serde_json::json!({
        "model": {
            "type_map": ["Be"],
            "descriptor": {"type": "se_e2_a", "sel": [60], "rcut": 5.0, "rcut_smth": 1.8,
                           "neuron": [4, 8], "axis_neuron": 4, "seed": 1},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "numb_fparam": 1,
                            "numb_aparam": 1, "seed": 1},
            "data_stat_nbatch": 1
        },
        "learning_rate": {"type": "exp", "start_lr": 0.002, "stop_lr": 1e-5, "decay_steps": 4},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                 "limit_pref_f": 1},
        "training": {
            "training_data": {"systems": [data.join("e3000_i2000"), data.join("e8000_i2000")],
                              "batch_size": 2},
            "numb_steps": 8, "seed": 3, "disp_freq": 4, "save_freq": 8
        }
    });
    // Steps 1, 4, 8.
    lcurves_match("fparam_aparam_lcurve_of_8_steps_matches_cpu", &input, 3);
}

/// The property fitting (DeePMD-kit's property example data, DPA-1 without attention layers,
/// an intensive 3-vector): the nets on the device, the head and loss on the host.
#[test]
fn property_lcurve_of_8_steps_matches_cpu() {
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepmd-kit/examples/property/data");
    let input = serde_json::json!({
        "model": {
            "type_map": ["H", "C", "N", "O"],
            "descriptor": {"type": "dpa1", "sel": 24, "rcut": 6.0, "rcut_smth": 0.5,
                           "neuron": [4, 8], "axis_neuron": 4, "tebd_dim": 4, "attn_layer": 0,
                           "type_one_side": true, "seed": 1},
            "fitting_net": {"type": "property", "property_name": "band_prop", "task_dim": 3,
                            "intensive": true, "neuron": [8, 8], "seed": 1},
            "data_stat_nbatch": 1
        },
        "learning_rate": {"type": "exp", "start_lr": 0.002, "stop_lr": 1e-5, "decay_steps": 4},
        "loss": {"type": "property", "loss_func": "smooth_mae", "metric": ["mae", "rmse"]},
        "training": {
            "training_data": {"systems": [data.join("data_0"), data.join("data_1")],
                              "batch_size": 2},
            "validation_data": {"systems": [data.join("data_2")], "batch_size": 2},
            "numb_steps": 8, "seed": 3, "disp_freq": 4, "save_freq": 8
        }
    });
    // Steps 1, 4, 8.
    lcurves_match("property_lcurve_of_8_steps_matches_cpu", &input, 3);
}

/// The DOS fitting (DeePMD-kit's DOS example data: one system with atomic labels, one with
/// frame labels), every term of its loss active.
#[test]
fn dos_lcurve_of_8_steps_matches_cpu() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/deepmd-kit/examples/dos/data/heat-221-reformat");
    let input = serde_json::json!({
        "model": {
            "type_map": ["Si"],
            "descriptor": {"type": "se_e2_a", "sel": [90], "rcut": 6.0, "rcut_smth": 1.8,
                           "neuron": [4, 8], "axis_neuron": 4, "type_one_side": true, "seed": 1},
            "fitting_net": {"type": "dos", "numb_dos": 250, "neuron": [8, 8], "seed": 1},
            "data_stat_nbatch": 1
        },
        "learning_rate": {"type": "exp", "start_lr": 0.002, "stop_lr": 1e-5, "decay_steps": 4},
        "loss": {"type": "dos", "start_pref_dos": 1, "limit_pref_dos": 2, "start_pref_cdf": 0.5,
                 "limit_pref_cdf": 0.1, "start_pref_ados": 3, "limit_pref_ados": 1,
                 "start_pref_acdf": 0.2, "limit_pref_acdf": 0.4},
        "training": {
            "training_data": {"systems": [data.join("atomic_system"), data.join("global_system")],
                              "batch_size": 1},
            "numb_steps": 8, "seed": 3, "disp_freq": 4, "save_freq": 8
        }
    });
    // Steps 1, 4, 8.
    lcurves_match("dos_lcurve_of_8_steps_matches_cpu", &input, 3);
}

/// The tensor fittings (DeePMD-kit's water_tensor example data: one system with atomic labels,
/// one with frame labels), H excluded: the head on the host, ∂L/∂gr into the descriptor's dual
/// pass on the device. A full polar (fit_diag false, scaled) and a dipole.
#[test]
fn tensor_lcurves_of_8_steps_match_cpu() {
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepmd-kit/examples/water_tensor");
    for (fitting, dir) in [
        (
            serde_json::json!({"type": "dipole", "neuron": [8, 8], "seed": 1}),
            "dipole",
        ),
        (
            serde_json::json!({"type": "polar", "fit_diag": false, "scale": [2.0, 0.5],
                               "neuron": [8, 8], "seed": 1}),
            "polar",
        ),
    ] {
        let data = root.join(dir).join("training_data_reformat");
        let input = serde_json::json!({
            "model": {
                "type_map": ["O", "H"],
                "atom_exclude_types": [1],
                "descriptor": {"type": "se_e2_a", "sel": [46, 92], "rcut": 4.0,
                               "rcut_smth": 3.8, "neuron": [4, 8], "axis_neuron": 4,
                               "type_one_side": true, "seed": 1},
                "fitting_net": fitting,
                "data_stat_nbatch": 1
            },
            "learning_rate": {"type": "exp", "start_lr": 0.002, "stop_lr": 1e-5,
                              "decay_steps": 4},
            "loss": {"type": "tensor", "pref": 1.0, "pref_atomic": 1.0},
            "training": {
                "training_data": {"systems": [data.join("atomic_system"),
                                              data.join("global_system")], "batch_size": 1},
                "numb_steps": 8, "seed": 3, "disp_freq": 4, "save_freq": 8
            }
        });
        // Steps 1, 4, 8.
        lcurves_match("tensor_lcurves_of_8_steps_match_cpu", &input, 3);
    }
}

/// dpw's `args` in `dir`: whether it succeeded, and its stdout and stderr.
fn dpw_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(args)
        .env("RUST_LOG", "info")
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("panicked"), "{args:?}: {text}");
    (out.status.success(), text)
}

/// Issue 59, defect 11: DeePMD-kit's se_e3 water hyper-parameters (sel [24, 48], rcut 4): a
/// frame's pair rows (192 atoms × 4032 pairs) × 16 take 99 MB a buffer in float64, so `dpw test`'s
/// calls of 2 frames passed lavapipe's 128 MiB storage binding and panicked. It evaluates as
/// many frames a call as the device takes, with the cpu's numbers; a training batch past any
/// adapter's binding (44 frames: 4.4 GB, wgpu's bindings are below 4 GiB) is refused at start-up
/// naming the system and the binding.
#[test]
fn se_e3_batches_past_the_storage_binding() {
    if !common::wgpu_f64_present("se_e3_batches_past_the_storage_binding") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let water = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    let mut input = water_input(0);
    input["model"]["descriptor"] = serde_json::json!({"type": "se_e3", "sel": [24, 48],
        "rcut": 4.0, "rcut_smth": 0.5, "neuron": [4, 8, 16], "seed": 1});
    input["training"]
        .as_object_mut()
        .unwrap()
        .remove("validation_data");
    input["training"]["save_freq"] = serde_json::json!(1);
    let dir = run_dir(tmp.path(), "model", &input);
    let (ok, log) = dpw_in(&dir, &["train", "input.json", "--backend", "cpu"]);
    assert!(ok, "{log}");
    let data = water.join("data_3");
    let mut energies = Vec::new();
    for backend in ["cpu", "wgpu"] {
        let args = [
            "test",
            "-m",
            "model.ckpt",
            "-s",
            data.to_str().unwrap(),
            "-n",
            "5",
            "-d",
            backend,
            "--backend",
            backend,
        ];
        let (ok, log) = dpw_in(&dir, &args);
        assert!(ok && log.contains("number of test data : 5"), "{log}");
        energies.push(std::fs::read_to_string(dir.join(format!("{backend}.e.out"))).unwrap());
    }
    let values = |s: &str| -> Vec<f64> {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(|l| {
                l.split_whitespace()
                    .map(|x| x.parse::<f64>().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (cpu, gpu) = (values(&energies[0]), values(&energies[1]));
    assert_eq!(cpu.len(), 10);
    for (c, g) in cpu.iter().zip(&gpu) {
        assert!((c - g).abs() <= 1e-9 * c.abs(), "cpu {cpu:?}\nwgpu {gpu:?}");
    }

    input["training"]["numb_steps"] = serde_json::json!(1);
    input["training"]["training_data"]["batch_size"] = serde_json::json!(44);
    let dir = run_dir(tmp.path(), "big", &input);
    let (ok, log) = dpw_in(&dir, &["train", "input.json", "--backend", "wgpu"]);
    assert!(!ok, "{log}");
    assert!(
        log.contains("training system") && log.contains("largest storage binding"),
        "{log}"
    );
    assert!(!dir.join("lcurve.out").exists(), "{log}");
}

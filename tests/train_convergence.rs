//! Convergence of the examples' models (not timed; minutes in release mode on a laptop).
//! Run it with `cargo test --release --test train_convergence -- --ignored --nocapture`.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

fn water() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water"))
}

/// `Force  RMSE : 1.234e-01 eV/A` → 0.1234, from dpw test's report.
fn report_value(report: &str, key: &str) -> f64 {
    let line = report
        .lines()
        .rev()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key:?} in\n{report}"));
    line.split(':')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Trains `input` in a temporary directory, then runs `dpw test -m model.ckpt` with
/// `test_args`; returns the test report and lcurve.out.
fn train_and_test(input: &Value, test_args: &[&str]) -> (String, String) {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("input.json"), input.to_string()).unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(d.path())
        .args(["train", "input.json"])
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(d.path())
        .args(["test", "-m", "model.ckpt"])
        .args(test_args)
        .output()
        .unwrap();
    assert!(out.status.success());
    let lcurve = std::fs::read_to_string(d.path().join("lcurve.out")).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), lcurve)
}

/// `examples/water/<file>` for `steps` steps of one schedule, validated on 80 frames of data_3
/// by `dpw test`: the force and per-atom energy RMSE.
fn water_trained(file: &str, steps: usize) -> (f64, f64) {
    let mut input: Value =
        serde_json::from_str(&std::fs::read_to_string(water().join(file)).unwrap()).unwrap();
    input["learning_rate"] = json!({"type": "exp", "start_lr": 1e-3, "stop_lr": 3.51e-8,
                                    "decay_steps": 200, "decay_rate": 0.95});
    input["training"]["numb_steps"] = json!(steps);
    input["training"]["disp_freq"] = json!(100);
    input["training"]["save_freq"] = json!(steps);
    let abs = |s: &str| water().join(s).display().to_string();
    input["training"]["training_data"]["systems"] =
        json!([abs("data_0"), abs("data_1"), abs("data_2")]);
    input["training"]["validation_data"]["systems"] = json!([abs("data_3")]);
    let (report, lcurve) = train_and_test(&input, &["-s", &abs("data_3"), "-n", "80"]);
    let f = report_value(&report, "Force  RMSE");
    let e = report_value(&report, "Energy RMSE/Natoms");
    eprintln!(
        "{file}: validation (data_3, 80 frames): force RMSE {f:.4} eV/Å, energy RMSE {e:.3e} eV/atom"
    );
    eprintln!("{lcurve}");
    (f, e)
}

// The water runs below are kept short for CI's sake (1000 steps of se_e2_a and se_e2_r, 500 of
// se_e3 and hybrid: 7.8 minutes for the whole file on 2 cores). Their bounds sit 10-15 % above
// what they measured (2026-11-28, in the comments), far below the untrained 0.9 eV/Å: training
// that does not converge fails them, a change of rounding does not.

/// se_e2_a (the water example): 0.178 eV/Å after these 1000 steps (from 0.9 at the start).
#[test]
#[ignore = "minutes of training; run in release mode (see the file's doc)"]
fn convergence_water_1000_steps() {
    let (f, _) = water_trained("input.json", 1000);
    assert!(
        f < 0.20,
        "validation force RMSE {f} ≥ 0.20 eV/Å after 1000 steps"
    );
}

/// se_e2_r sees distances only, so it fits water's forces less well than se_e2_a: 0.305 eV/Å
/// after these 1000 steps (from 0.9 at the start; 0.256 after 2000).
#[test]
#[ignore = "minutes of training; run in release mode (see the file's doc)"]
fn convergence_water_se_e2_r_1000_steps() {
    let (f, _) = water_trained("input_se_e2_r.json", 1000);
    assert!(
        f < 0.35,
        "validation force RMSE {f} ≥ 0.35 eV/Å after 1000 steps"
    );
}

/// se_e3 (examples/water/input_se_e3.json, rcut 4) over 500 steps, its pair embedding making
/// a step ~5× se_e2_r's: 0.408 eV/Å after them (from 0.94 at the start; 0.289 after 1000).
#[test]
#[ignore = "minutes of training; run in release mode (see the file's doc)"]
fn convergence_water_se_e3_500_steps() {
    let (f, _) = water_trained("input_se_e3.json", 500);
    assert!(
        f < 0.46,
        "validation force RMSE {f} ≥ 0.46 eV/Å after 500 steps"
    );
}

/// hybrid se_e2_a + se_e2_r (examples/water/input_hybrid.json, DeePMD-kit's water hybrid
/// example) over 500 steps: 0.174 eV/Å after them (from 0.98 at the start; 0.155 after 1000).
#[test]
#[ignore = "minutes of training; run in release mode (see the file's doc)"]
fn convergence_water_hybrid_500_steps() {
    let (f, _) = water_trained("input_hybrid.json", 500);
    assert!(
        f < 0.20,
        "validation force RMSE {f} ≥ 0.20 eV/Å after 500 steps"
    );
}

/// The alloy example as shipped (3 elements, type_one_side false, virial loss), validated on a
/// composition it was not trained on; about a minute in release mode on 2 cores.
#[test]
#[ignore = "a minute of training; run in release mode (see the file's doc)"]
fn convergence_alloy_example() {
    let alloy = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/alloy"));
    let mut input: Value =
        serde_json::from_str(&std::fs::read_to_string(alloy.join("input.json")).unwrap()).unwrap();
    let abs = |s: &Value| json!(alloy.join(s.as_str().unwrap()).display().to_string());
    for key in ["training_data", "validation_data"] {
        let systems = &mut input["training"][key]["systems"];
        *systems = systems.as_array().unwrap().iter().map(abs).collect();
    }
    let unseen = alloy.join("data/valid/Cu48Ni30Al30").display().to_string();
    let (report, lcurve) = train_and_test(&input, &["-s", &unseen]);
    let f = report_value(&report, "Force  RMSE");
    let e = report_value(&report, "Energy RMSE/Natoms");
    let v = report_value(&report, "Virial RMSE/Natoms");
    eprintln!(
        "validation (Cu48Ni30Al30, not trained on): force RMSE {f:.4} eV/Å, energy RMSE \
         {e:.3e} eV/atom, virial RMSE {v:.3e} eV/atom"
    );
    eprintln!("{lcurve}");
    // Untrained: forces 0.7 eV/Å, virial 0.18 eV/atom (the labels' RMS); after 1500 steps about
    // 0.08, 6e-3 and 0.03.
    assert!(f < 0.15, "force RMSE {f} ≥ 0.15 eV/Å");
    assert!(e < 0.02, "energy RMSE {e} ≥ 0.02 eV/atom");
    assert!(v < 0.08, "virial RMSE {v} ≥ 0.08 eV/atom");
}

/// The alloy example with DPA-1 (`input_se_atten_v2.json`: strip, smooth, one attention layer)
/// for 100 steps of a fast schedule, validated on the composition it was not trained on. Forces
/// start at 0.72 eV/Å (the labels' RMS); 0.17 was measured after 100 steps.
#[test]
#[ignore = "a minute of training; run in release mode (see the file's doc)"]
fn convergence_alloy_se_atten_v2_100_steps() {
    let alloy = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/alloy"));
    let file = alloy.join("input_se_atten_v2.json");
    let mut input: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let abs = |s: &Value| json!(alloy.join(s.as_str().unwrap()).display().to_string());
    for key in ["training_data", "validation_data"] {
        let systems = &mut input["training"][key]["systems"];
        *systems = systems.as_array().unwrap().iter().map(abs).collect();
    }
    input["training"]["numb_steps"] = json!(100);
    input["training"]["disp_freq"] = json!(50);
    input["learning_rate"]["decay_steps"] = json!(20);
    let unseen = alloy.join("data/valid/Cu48Ni30Al30").display().to_string();
    let (report, lcurve) = train_and_test(&input, &["-s", &unseen]);
    let f = report_value(&report, "Force  RMSE");
    eprintln!("se_atten_v2, 100 steps: validation force RMSE {f:.4} eV/Å\n{lcurve}");
    assert!(f < 0.25, "force RMSE {f} ≥ 0.25 eV/Å after 100 steps");
}

//! The `ener` fitting with frame and atomic parameters (`numb_fparam`, `numb_aparam`; issue
//! 53): the statistics `dpw train` computes against DeePMD-kit's own, the data it refuses, the
//! default frame parameters, the `.yaml` both ways and `dpw test`. The predictions and the
//! training gradient against DeePMD-kit's are the backend suites'
//! (`reference_fparam_predictions`, `reference_fparam_training_gradients`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ndarray::{Array1, Array2, ArrayD};
use ndarray_npy::write_npy;
use serde_json::{json, Value};
use tempfile::TempDir;

use common::*;
use dpw::model::{read_deepmd_yaml, read_model_to_train, write_deepmd_yaml};

const CASE: &str = "tests/reference/fittings/fparam_water";

fn eval_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo(CASE).join("eval.json")).unwrap()).unwrap()
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn flat(a: ArrayD<f64>) -> Vec<f64> {
    a.iter().copied().collect()
}

/// The reference's three frames as a deepmd/npy system in `dir`/`name`, with its parameters;
/// `fparam_width` cuts or repeats fparam's columns, `aparam` false leaves aparam.npy out.
fn write_system(dir: &Path, name: &str, fparam: Option<usize>, aparam: bool) -> PathBuf {
    let npz_path = repo(CASE).join("eval.npz");
    let mut sys = npz_system(&npz_path, &dir.join(name), &["O", "H"], true);
    sys.write("force_label", "force.npy");
    let e = Array1::from(flat(npz_array(&mut sys.z, "energy_label")));
    write_npy(sys.set.join("energy.npy"), &e).unwrap();
    let fp = sys.rows("fparam");
    if let Some(w) = fparam {
        let nf = fp.nrows();
        let cols: Vec<f64> = (0..nf)
            .flat_map(|f| (0..w).map(move |k| (f, k)))
            .map(|(f, k)| fp[[f, k % 2]])
            .collect();
        write_npy(
            sys.set.join("fparam.npy"),
            &Array2::from_shape_vec((nf, w), cols).unwrap(),
        )
        .unwrap();
    }
    if aparam {
        sys.write("aparam", "aparam.npy");
    }
    sys.dir
}

/// The reference's model section, trained `steps` on `systems` (all three frames in one batch,
/// one batch for the statistics).
fn input(systems: &[&Path], steps: usize) -> Value {
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(repo(CASE).join("input.json")).unwrap())
            .unwrap();
    let mut model = case["model"].clone();
    model["data_stat_nbatch"] = json!(1);
    json!({
        "model": model,
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000, "limit_pref_f": 1},
        "training": {
            "training_data": {"systems": systems, "batch_size": 3},
            "numb_steps": steps, "seed": 3, "disp_freq": 1, "save_freq": 1
        }
    })
}

fn dpw_train(dir: &Path, input: &Value) -> std::process::Output {
    std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(dir)
        .args(["train", "input.json", "--backend", "cpu"])
        .output()
        .unwrap()
}

fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    (a.iter().zip(b))
        .map(|(x, y)| ((x - y) / y).abs())
        .fold(0.0, f64::max)
}

/// DeePMD-kit's `compute_input_stats` of the three frames' parameters (eval.json) is what
/// `dpw train` computes on the same frames, and the trained model keeps them through a
/// checkpoint, a frozen `.yaml` and back.
#[test]
fn statistics_of_the_parameters_are_deepmd_kits() {
    let tmp = TempDir::new().unwrap();
    let sys = write_system(tmp.path(), "sys", Some(2), true);
    train_cpu(tmp.path(), &input(&[&sys], 1));
    let m = read_model_to_train(&tmp.path().join("model.ckpt-1")).unwrap();
    let st = &eval_json()["fit_input_stats_on_eval_frames"];
    let want_avg = [numbers(&st["fparam_avg"]), numbers(&st["aparam_avg"])].concat();
    let want_inv = [
        numbers(&st["fparam_inv_std"]),
        numbers(&st["aparam_inv_std"]),
    ]
    .concat();
    let (ra, ri) = (
        rel(&m.fit_input_avg, &want_avg),
        rel(&m.fit_input_inv_std, &want_inv),
    );
    eprintln!("fit input stats vs DeePMD-kit: avg {ra:.1e}, inv_std {ri:.1e}");
    assert!(ra < 1e-12 && ri < 1e-12, "{m:?}");

    let yaml = tmp.path().join("frozen.yaml");
    write_deepmd_yaml(&m, &yaml).unwrap();
    assert_eq!(read_deepmd_yaml(&yaml).unwrap(), m);

    // dpw test reads the parameters from the data as training does.
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(tmp.path())
        .args(["test", "-m", "frozen.yaml", "-s", "sys", "--backend", "cpu"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Energy RMSE"), "{text}");
}

/// DeePMD-kit's model.yaml of the reference reads with its statistics and writes back to a
/// file that reads to the same model.
#[test]
fn deepmd_kits_yaml_with_parameters_round_trips() {
    let m = read_deepmd_yaml(&repo(CASE).join("model.yaml")).unwrap();
    assert_eq!(
        (m.spec.fitting.numb_fparam, m.spec.fitting.numb_aparam),
        (2, 1)
    );
    assert_eq!(m.fit_input_avg.len(), 3);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("back.yaml");
    write_deepmd_yaml(&m, &out).unwrap();
    assert_eq!(read_deepmd_yaml(&out).unwrap(), m);
}

/// Data without the parameters the model takes, or with another number of them, is refused
/// naming the system, the file and the model's key; a default_fparam stands in for a missing
/// fparam.npy (and is then the statistics' every row).
#[test]
fn missing_parameters_are_refused_or_defaulted() {
    let tmp = TempDir::new().unwrap();
    for (name, fparam, aparam, says) in [
        ("no_aparam", Some(2), false, "no set has aparam.npy"),
        ("no_fparam", None, true, "no set has fparam.npy"),
        (
            "three_fparam",
            Some(3),
            true,
            "fparam.npy has 3 values per frame",
        ),
    ] {
        let dir = tmp.path().join(format!("run_{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let sys = write_system(tmp.path(), name, fparam, aparam);
        let out = dpw_train(&dir, &input(&[&sys], 1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(err.contains(says) && err.contains(name), "{name}: {err}");
        assert!(!dir.join("lcurve.out").exists(), "{name}: wrote lcurve.out");
    }

    let dir = tmp.path().join("run_default");
    std::fs::create_dir_all(&dir).unwrap();
    let sys = tmp.path().join("no_fparam");
    let mut inp = input(&[&sys], 1);
    inp["model"]["fitting_net"]["default_fparam"] = json!([0.75, 300.0]);
    train_cpu(&dir, &inp);
    let m = read_model_to_train(&dir.join("model.ckpt-1")).unwrap();
    assert_eq!(&m.fit_input_avg[..2], &[0.75, 300.0]);
    // Every row equal: a std of 0, taken as data_stat_protect (0.01).
    assert_eq!(&m.fit_input_inv_std[..2], &[100.0, 100.0]);
}

/// A model without parameters writes its hyper-parameters as earlier versions did, no key
/// added, so its checkpoints and frozen models stay byte for byte what they were.
#[test]
fn a_model_without_parameters_writes_no_new_key() {
    let spec = serde_json::to_value(model_a().spec).unwrap();
    for key in ["numb_fparam", "numb_aparam", "default_fparam"] {
        assert!(spec["fitting"].get(key).is_none(), "{spec}");
    }
}

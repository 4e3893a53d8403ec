//! The `dos` fitting (issue 53): the output bias `dpw train` computes against DeePMD-kit's own
//! from frame labels, atomic labels and both, training on DeePMD-kit's DOS example with its
//! lcurve.out, `dpw test` with dp test's lines and detail files, the `.yaml` both ways, and the
//! data it refuses. The predictions and the loss gradient against DeePMD-kit's are the backend
//! suites' (`reference_dos_predictions`, `reference_dos_training_gradients`).

mod common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tempfile::TempDir;

use common::*;
use dpw::model::{read_deepmd_yaml, write_deepmd_yaml};

fn case_dir() -> PathBuf {
    repo("tests/reference/fittings/dos_water")
}

/// The reference's three eval frames as a deepmd/npy system `dir`/`name`, with `dos.npy` where
/// `frame` and `atom_dos.npy` where `atomic`.
fn write_system(dir: &Path, name: &str, frame: bool, atomic: bool) -> PathBuf {
    let mut sys = npz_system(
        &case_dir().join("eval.npz"),
        &dir.join(name),
        &["O", "H"],
        true,
    );
    if frame {
        sys.write("dos_label", "dos.npy");
    }
    if atomic {
        sys.write("atom_dos_label", "atom_dos.npy");
    }
    sys.dir
}

/// The reference's model section, trained `steps` on `systems` (all three frames in one batch,
/// one batch for the statistics) with `loss`.
fn input(systems: &[&Path], loss: Value, steps: usize) -> Value {
    let mut model = json_file(&case_dir().join("input.json"))["model"].clone();
    model["data_stat_nbatch"] = json!(1);
    json!({
        "model": model,
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": loss,
        "training": {
            "training_data": {"systems": systems, "batch_size": 3},
            "numb_steps": steps, "seed": 3, "disp_freq": 1, "save_freq": 1
        }
    })
}

/// DeePMD-kit's output bias (eval.json `stats`): from frame labels alone (least squares over the
/// type counts), from atomic labels alone (the mean per type), from both (the atomic one), and
/// from both under a loss of the frame terms alone (which reads no atomic label: the frame
/// one). The checkpoint keeps it, and a frozen `.yaml` gives it back.
#[test]
fn output_bias_is_deepmd_kits() {
    let stats = &json_file(&case_dir().join("eval.json"))["stats"];
    let full = json!({"type": "dos", "start_pref_dos": 1, "limit_pref_dos": 1,
                      "start_pref_ados": 1, "limit_pref_ados": 1});
    let global = json!({"type": "dos", "start_pref_dos": 1, "limit_pref_dos": 1,
                        "start_pref_ados": 0, "limit_pref_ados": 0});
    for (what, frame, atomic, loss, want) in [
        ("frame labels", true, false, &full, "a_global_only"),
        ("atomic labels", false, true, &full, "b_atomic_only"),
        ("both", true, true, &full, "c_both"),
        ("both, frame terms", true, true, &global, "a_global_only"),
    ] {
        let tmp = TempDir::new().unwrap();
        let sys = write_system(tmp.path(), "sys", frame, atomic);
        let input = input(&[&sys], loss.clone(), 1);
        let what = format!("{what} ({want})");
        one_step_bias_is(tmp.path(), &input, &stats[want]["out_bias"], &what);
    }
}

/// DeePMD-kit's model.yaml is read and written back to the same model.
#[test]
fn deepmd_kits_yaml_both_ways() {
    let m = read_deepmd_yaml(&case_dir().join("model.yaml")).unwrap();
    assert_eq!(m.spec.fitting.dim_out(), 8);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("back.yaml");
    write_deepmd_yaml(&m, &out).unwrap();
    assert_eq!(read_deepmd_yaml(&out).unwrap(), m);
}

/// DeePMD-kit's DOS example (its input, two frames of each of its systems: one with atomic
/// labels, one with frame labels) trains with its lcurve.out columns, and `dpw test` reports dp
/// test's DOS lines and writes its per-frame detail files.
#[test]
fn deepmd_kits_dos_example_trains_and_tests() {
    let tmp = TempDir::new().unwrap();
    let data = repo("tests/data/deepmd-kit/examples/dos/data/heat-221-reformat");
    let mut v = json_file(&repo(
        "tests/data/deepmd-kit/examples/dos/train/input_torch.json",
    ));
    v["model"]["descriptor"]["neuron"] = json!([4, 8]);
    v["model"]["fitting_net"]["neuron"] = json!([16, 16]);
    v["loss"] = json!({"type": "dos", "start_pref_dos": 1, "limit_pref_dos": 1,
                       "start_pref_ados": 1, "limit_pref_ados": 1});
    let t = v["training"].as_object_mut().unwrap();
    t.remove("stop_batch");
    t.insert(
        "training_data".into(),
        json!({"systems": [data.join("atomic_system"), data.join("global_system")],
               "batch_size": 1}),
    );
    t.insert("numb_steps".into(), json!(4));
    t.insert("disp_freq".into(), json!(2));
    t.insert("save_freq".into(), json!(4));
    let (ok, log) = dpw_train(tmp.path(), &v);
    assert!(ok, "{log}");
    let lcurve = std::fs::read_to_string(tmp.path().join("lcurve.out")).unwrap();
    let head = lcurve.lines().next().unwrap();
    let cols: Vec<&str> = head.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "#",
            "step",
            "rmse_global_dos_trn",
            "rmse_local_dos_trn",
            "lr"
        ],
        "{lcurve}"
    );
    // Each step's batch is of one system: the other's column is NaN.
    for l in lcurve.lines().filter(|l| !l.starts_with('#')) {
        let v: Vec<f64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert!(v[1].is_nan() != v[2].is_nan(), "{lcurve}");
    }
    let sys = data.join("global_system");
    let (ok, out) = dpw_in(
        tmp.path(),
        &[
            "test",
            "-m",
            "model.ckpt-4",
            "-s",
            sys.to_str().unwrap(),
            "-d",
            "out",
        ],
    );
    assert!(ok, "{out}");
    for line in ["DOS MAE            : ", "DOS RMSE/Natoms    : "] {
        assert!(out.contains(line), "{out}");
    }
    for f in 0..2 {
        let text = std::fs::read_to_string(tmp.path().join(format!("out.dos.out.{f}"))).unwrap();
        assert!(text
            .lines()
            .next()
            .unwrap()
            .ends_with(&format!(" - {f}: data_dos pred_dos")));
        assert_eq!(text.lines().count(), 251, "{text}");
    }
}

/// A training system without the labels the loss reads trains, with a warning naming it and
/// the files, as DeePMD-kit reads it (its DOS labels are optional: zeros, `find_*` 0): its
/// batches add nothing to the loss. Where no system gives a type its bias, training is refused,
/// as DeePMD-kit's output statistics fail.
#[test]
fn data_without_the_losss_labels_are_warned_of() {
    let tmp = TempDir::new().unwrap();
    let bare = write_system(tmp.path(), "bare", true, false);
    let full = write_system(tmp.path(), "full", false, true);
    let loss = json!({"type": "dos"});
    let (ok, log) = dpw_train(tmp.path(), &input(&[&bare, &full], loss.clone(), 2));
    assert!(ok, "{log}");
    assert!(log.contains("bare: no set has atom_dos.npy"), "{log}");
    assert!(!log.contains("full: no set"), "{log}");

    let (ok, log) = dpw_train(tmp.path(), &input(&[&bare], loss, 1));
    assert!(!ok);
    assert!(
        log.contains("no statistics frame gives type 0 a dos bias"),
        "{log}"
    );
}

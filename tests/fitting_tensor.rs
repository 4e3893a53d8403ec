//! The `dipole` and `polar` fittings (issue 53): the output bias `dpw train` computes against
//! DeePMD-kit's own from frame labels, atomic labels and both (an excluded type's too), DeePMD-kit's
//! water_tensor and DPLR examples trained and tested with dp test's lines and detail file, the
//! `.yaml` both ways, atomic labels of the selected atoms alone, and the inputs it refuses. The
//! predictions and the loss gradient against DeePMD-kit's are the backend suites'
//! (`reference_tensor_predictions`, `reference_tensor_training_gradients`).

mod common;

use std::path::{Path, PathBuf};

use ndarray::{Array2, ArrayD};
use ndarray_npy::{write_npy, ReadNpyExt};
use serde_json::{json, Value};
use tempfile::TempDir;

use common::*;
use dpw::model::{read_deepmd_yaml, write_deepmd_yaml};

fn case_dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/fittings/{case}"))
}

/// A reference case's three eval frames as a deepmd/npy system `dir`/`name`, with `{label}.npy`
/// where `frame` and `atomic_{label}.npy` where `atomic` (of the O atoms alone where `o_only`).
fn write_system(
    dir: &Path,
    case: &str,
    label: &str,
    (frame, atomic, o_only): (bool, bool, bool),
) -> PathBuf {
    let name = format!("{case}-{frame}-{atomic}-{o_only}");
    let npz_path = case_dir(case).join("eval.npz");
    let mut sys = npz_system(&npz_path, &dir.join(name), &["O", "H"], true);
    if frame {
        sys.write(&format!("{label}_label"), &format!("{label}.npy"));
    }
    if atomic {
        let a = npz_array(&mut sys.z, &format!("atom_{label}_label"));
        let k = a.shape()[2];
        let keep: Vec<f64> = (a.outer_iter())
            .flat_map(|f| {
                (f.outer_iter().zip(sys.atype.iter()))
                    .filter(|(_, &t)| !o_only || t == 0)
                    .flat_map(|(r, _)| r.iter().copied().collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            })
            .collect();
        let nf = a.shape()[0];
        let a = Array2::from_shape_vec((nf, keep.len() / nf), keep).unwrap();
        assert_eq!(a.ncols() % k, 0);
        write_npy(sys.set.join(format!("atomic_{label}.npy")), &a).unwrap();
    }
    sys.dir
}

/// The reference's model section, trained `steps` on `systems` (all three frames in one batch,
/// one batch for the statistics) with `loss`.
fn input(case: &str, systems: &[&Path], loss: Value, steps: usize) -> Value {
    let mut model = json_file(&case_dir(case).join("input.json"))["model"].clone();
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

const CASES: [(&str, &str); 6] = [
    ("dipole_water", "dipole"),
    ("polar_water", "polarizability"),
    ("polar_water_diag", "polarizability"),
    ("dipole_dpa1", "dipole"),
    ("dipole_dpa2", "dipole"),
    ("dipole_dpa3", "dipole"),
];

/// DeePMD-kit's output bias (eval.json `stats`): from frame labels alone (least squares over the
/// counts of the types not excluded: an excluded type's 0), from atomic labels alone (the mean
/// per type, an excluded type's too) and from both (the atomic one). The checkpoint keeps it,
/// and a frozen `.yaml` gives it back.
#[test]
fn output_bias_is_deepmd_kits() {
    let both = json!({"type": "tensor", "pref": 1.0, "pref_atomic": 1.0});
    for (case, label) in CASES {
        let stats = &json_file(&case_dir(case).join("eval.json"))["stats"];
        for (what, frame, atomic, want) in [
            ("frame labels", true, false, "a_global_only"),
            ("atomic labels", false, true, "b_atomic_only"),
            ("both", true, true, "c_both"),
        ] {
            let tmp = TempDir::new().unwrap();
            let sys = write_system(tmp.path(), case, label, (frame, atomic, false));
            let input = input(case, &[&sys], both.clone(), 1);
            let what = format!("{case}, {what} ({want})");
            one_step_bias_is(tmp.path(), &input, &stats[want]["out_bias"], &what);
        }
    }
}

/// DeePMD-kit's model.yaml files are read and written back to the same models.
#[test]
fn deepmd_kits_yaml_both_ways() {
    for (case, _) in CASES {
        let m = read_deepmd_yaml(&case_dir(case).join("model.yaml")).unwrap();
        let (_, spec) = m.spec.fitting.output.tensor().expect("a tensor fitting");
        // The descriptor's rotation matrix width (se_e2_a's and DPA-1's last embedding width,
        // DPA-2's g2_dim, DPA-3's e_dim: DeePMD-kit's get_dim_emb), as DeePMD-kit's fitting has it.
        let eval = json_file(&case_dir(case).join("eval.json"));
        let want = eval["fitting_serialized"]["embedding_width"]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(spec.embedding_width, want, "{case}");
        assert_eq!(m.spec.descriptor.rot_width(), Some(want), "{case}");
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("back.yaml");
        write_deepmd_yaml(&m, &out).unwrap();
        assert_eq!(read_deepmd_yaml(&out).unwrap(), m, "{case}");
    }
}

/// Atomic labels of the selected atoms alone (the O atoms, H excluded: DeePMD-kit's sel_type
/// layout, as in its DPLR example) train as the same labels of every atom do: the same
/// lcurve.out.
#[test]
fn atomic_labels_of_the_selected_atoms_alone() {
    let atomic = json!({"type": "tensor", "pref": 0.0, "pref_atomic": 1.0});
    let mut curves = Vec::new();
    for o_only in [false, true] {
        let tmp = TempDir::new().unwrap();
        let sys = write_system(tmp.path(), "dipole_water", "dipole", (false, true, o_only));
        let (ok, log) = dpw_train(
            tmp.path(),
            &input("dipole_water", &[&sys], atomic.clone(), 3),
        );
        assert!(ok, "o_only {o_only}: {log}");
        curves.push(std::fs::read_to_string(tmp.path().join("lcurve.out")).unwrap());
    }
    assert_eq!(curves[0], curves[1]);
    assert_eq!(curves[0].lines().filter(|l| !l.starts_with('#')).count(), 3);
}

/// DeePMD-kit's water_tensor examples (their inputs, two frames of each of their systems: one
/// with atomic labels, one with frame labels) train with its lcurve.out columns; out.json keeps
/// the excluded types; `dpw test -d` reports dp test's lines and writes its detail file.
#[test]
fn deepmd_kits_tensor_examples_train_and_test() {
    for (dir, input, metric, label, name) in [
        (
            "dipole",
            "dipole_input_torch.json",
            "dipole",
            "dipole",
            "Dipole",
        ),
        (
            "polar",
            "polar_input.json",
            "polar",
            "polarizability",
            "Polarizability",
        ),
    ] {
        let tmp = TempDir::new().unwrap();
        let src = repo(&format!(
            "tests/data/deepmd-kit/examples/water_tensor/{dir}"
        ));
        copy_dir(&src, tmp.path());
        let mut v = json_file(&src.join(input));
        v["model"]["descriptor"]["neuron"] = json!([4, 8]);
        v["model"]["descriptor"]["axis_neuron"] = json!(4);
        v["model"]["fitting_net"]["neuron"] = json!([8, 8]);
        v["training"]["numb_steps"] = json!(2);
        v["training"]["disp_freq"] = json!(1);
        v["training"]["save_freq"] = json!(2);
        let (ok, log) = dpw_train(tmp.path(), &v);
        assert!(ok, "{input}: {log}");
        let lcurve = std::fs::read_to_string(tmp.path().join("lcurve.out")).unwrap();
        let header = lcurve.lines().next().unwrap();
        for col in [
            format!("rmse_global_{metric}_val"),
            format!("rmse_global_{metric}_trn"),
            format!("rmse_local_{metric}_val"),
            format!("rmse_local_{metric}_trn"),
        ] {
            assert!(header.contains(&col), "{input}: {header}");
        }
        let out = json_file(&tmp.path().join("out.json"));
        assert_eq!(out["model"]["atom_exclude_types"], json!([1]), "{input}");
        // A tensor model's checkpoint restarts (its metrics' sums are the loss's).
        v["training"]["numb_steps"] = json!(3);
        std::fs::write(tmp.path().join("input3.json"), v.to_string()).unwrap();
        let restart = [
            "train",
            "input3.json",
            "--backend",
            "cpu",
            "--restart",
            "model.ckpt-2",
        ];
        let (ok, log) = dpw_in(tmp.path(), &restart);
        assert!(ok, "{input}, restart: {log}");
        let lcurve = std::fs::read_to_string(tmp.path().join("lcurve.out")).unwrap();
        let last = lcurve.lines().last().unwrap();
        assert!(last.trim_start().starts_with("3 "), "{input}: {lcurve}");
        let (ok, log) = dpw_in(tmp.path(), &["freeze", "-o", "frozen.yaml"]);
        assert!(ok, "{log}");
        let (ok, log) = dpw_in(
            tmp.path(),
            &[
                "test",
                "-m",
                "frozen.yaml",
                "-s",
                "training_data_reformat/global_system",
                "-d",
                "detail",
            ],
        );
        assert!(ok, "{log}");
        for line in [
            format!("{name}  RMSE       : "),
            format!("{name}  RMSE/sqrtN : "),
            format!("{name}  RMSE/N     : "),
        ] {
            assert!(log.contains(&line), "{input}: {line} in {log}");
        }
        let detail = std::fs::read_to_string(tmp.path().join("detail.out")).unwrap();
        let first = if metric == "dipole" { "x" } else { "pxx" };
        assert!(
            detail.starts_with(&format!("# data_{first} ")),
            "{input}: {detail}"
        );
        let width = if metric == "dipole" { 6 } else { 18 };
        let rows: Vec<&str> = detail.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 2, "{detail}");
        assert!(rows.iter().all(|r| r.split_whitespace().count() == width));
        // The label columns are the data's (stored in float32 by DeePMD-kit's example).
        let path = tmp.path().join(format!(
            "training_data_reformat/global_system/set.000/{label}.npy"
        ));
        let want = ArrayD::<f32>::read_npy(std::fs::File::open(&path).unwrap()).unwrap();
        let got: Vec<f64> = (rows.iter())
            .flat_map(|r| r.split_whitespace().take(width / 2))
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(got, want.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
    }
}

/// What dpw refuses, naming the key: type exclusion for an energy model, a tensor fitting on a
/// descriptor without a rotation matrix, a scale of the wrong length, a sel_type out of range, a
/// tensor loss without terms or trained on an energy model.
#[test]
fn refused_inputs_name_the_key() {
    let base = || {
        input(
            "polar_water",
            &[Path::new("sys")],
            json!({"type": "tensor", "pref": 1.0, "pref_atomic": 1.0}),
            1,
        )
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            {
                let mut v = base();
                v["model"]["fitting_net"] = json!({"neuron": [8]});
                v["loss"] = json!({"type": "ener"});
                v
            },
            "model.atom_exclude_types: type exclusion is implemented for the dipole and polar",
        ),
        (
            {
                let mut v = base();
                v["model"]["descriptor"]["type"] = json!("se_e2_r");
                v["model"]["descriptor"].as_object_mut().unwrap().remove("axis_neuron");
                v
            },
            "model.fitting_net: the dipole and polar fittings read the descriptor's rotation matrix",
        ),
        (
            {
                let mut v = base();
                v["model"]["fitting_net"]["scale"] = json!([1.0, 2.0, 3.0]);
                v
            },
            "model.fitting_net.scale: 3 values, but type_map has 2 types",
        ),
        (
            {
                let mut v = base();
                v["model"]["fitting_net"]["sel_type"] = json!([2]);
                v
            },
            "model.fitting_net.sel_type[0]: 2 is not a type index below 2",
        ),
        (
            {
                let mut v = base();
                v["loss"] = json!({"type": "tensor", "pref": 0.0, "pref_atomic": 0.0});
                v
            },
            "pref and pref_atomic are both 0",
        ),
        (
            {
                let mut v = base();
                v["loss"] = json!({"type": "ener"});
                v
            },
            "loss.type: the \"ener\" loss does not train a \"polar\" fitting",
        ),
    ];
    for (v, want) in cases {
        let tmp = TempDir::new().unwrap();
        let (ok, log) = dpw_train(tmp.path(), &v);
        assert!(!ok && log.contains(want), "{want}: {log}");
    }
}

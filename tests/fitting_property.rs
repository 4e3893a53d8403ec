//! The `property` fitting (issue 53): the output statistics `dpw train` computes against
//! DeePMD-kit's own, training on DeePMD-kit's property example with its lcurve.out, `dpw test`
//! with dp test's lines and detail files, the `.yaml` both ways, and the inputs and data it
//! refuses. The predictions and the loss gradient against DeePMD-kit's are the backend suites'
//! (`reference_property_predictions`, `reference_property_training_gradients`).

mod common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tempfile::TempDir;

use common::*;
use dpw::model::{read_deepmd_yaml, read_model_to_train, write_deepmd_yaml};

fn case_dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/fittings/{case}"))
}

/// A reference case's three eval frames as a deepmd/npy system `dir`/`name` (no box for the
/// molecules), with their `band_prop.npy` unless `label` is false.
fn write_system(dir: &Path, case: &str, name: &str, label: bool) -> PathBuf {
    let meta = json_file(&case_dir(case).join("eval.json"));
    let type_map: Vec<&str> = (meta["type_map"].as_array().unwrap().iter())
        .map(|t| t.as_str().unwrap())
        .collect();
    let pbc = meta["pbc"].as_bool().unwrap();
    let npz_path = case_dir(case).join("eval.npz");
    let mut sys = npz_system(&npz_path, &dir.join(name), &type_map, pbc);
    if label {
        sys.write("property_label", "band_prop.npy");
    }
    sys.dir
}

/// The case's model section, trained `steps` on `systems` (all three frames in one batch, one
/// batch for the statistics) with DeePMD-kit's default property loss.
fn input(case: &str, systems: &[&Path], steps: usize) -> Value {
    let mut model = json_file(&case_dir(case).join("input.json"))["model"].clone();
    model["data_stat_nbatch"] = json!(1);
    json!({
        "model": model,
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "property"},
        "training": {
            "training_data": {"systems": systems, "batch_size": 3},
            "numb_steps": steps, "seed": 3, "disp_freq": 1, "save_freq": 1
        }
    })
}

/// DeePMD-kit's output statistics of the three frames' labels (`compute_output_stats`, in
/// eval.json) are what `dpw train` computes on the same frames, extensive (per type, least
/// squares over the type counts) and intensive (over the type fractions); the checkpoint keeps
/// them, and a frozen `.yaml` gives them back.
#[test]
fn output_statistics_are_deepmd_kits() {
    for case in ["property_water", "property_mol"] {
        let tmp = TempDir::new().unwrap();
        let sys = write_system(tmp.path(), case, "sys", true);
        let (ok, log) = dpw_train(tmp.path(), &input(case, &[&sys], 1));
        assert!(ok, "{case}: {log}");
        let m = read_model_to_train(&tmp.path().join("model.ckpt-1")).unwrap();
        let meta = json_file(&case_dir(case).join("eval.json"));
        let (rb, rs) = (
            rel_to_max(&m.bias, &json_numbers(&meta["out_bias"])),
            rel_to_max(&m.out_std, &json_numbers(&meta["out_std"])),
        );
        eprintln!("{case}: output statistics vs DeePMD-kit: bias {rb:.1e}, std {rs:.1e}");
        assert!(
            rb < 1e-12 && rs < 1e-12,
            "{case}: {:?} {:?}",
            m.bias,
            m.out_std
        );

        let yaml = tmp.path().join("frozen.yaml");
        write_deepmd_yaml(&m, &yaml).unwrap();
        let back = read_deepmd_yaml(&yaml).unwrap();
        assert_eq!(back, m, "{case}: the .yaml gives back another model");
    }
}

/// DeePMD-kit's model.yaml of each case is read and written back to the same model.
#[test]
fn deepmd_kits_yaml_both_ways() {
    for case in ["property_water", "property_mol"] {
        let m = read_deepmd_yaml(&case_dir(case).join("model.yaml")).unwrap();
        let spec = m.spec.fitting.output.property().unwrap();
        assert_eq!(
            (spec.task_dim, spec.property_name.as_str()),
            (3, "band_prop")
        );
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("back.yaml");
        write_deepmd_yaml(&m, &out).unwrap();
        assert_eq!(read_deepmd_yaml(&out).unwrap(), m, "{case}");
    }
}

/// DeePMD-kit's property example (its input with narrower nets, four frames of each of its
/// systems) trains with DeePMD-kit's lcurve.out columns (the `metric` list: `mae`), freezes,
/// and `dpw test` reports dp test's property lines and writes its per-frame detail files, the
/// same from the checkpoint and from the frozen `.yaml`.
#[test]
fn deepmd_kits_property_example_trains_and_tests() {
    let tmp = TempDir::new().unwrap();
    let data = repo("tests/data/deepmd-kit/examples/property/data");
    let example = repo("tests/data/deepmd-kit/examples/property/train/input_torch.json");
    let mut v = json_file(&example);
    v["model"]["descriptor"]["neuron"] = json!([4, 8]);
    v["model"]["descriptor"]["attn"] = json!(8);
    v["model"]["descriptor"]["axis_neuron"] = json!(4);
    v["model"]["fitting_net"]["neuron"] = json!([16, 16]);
    v["loss"]["metric"] = json!(["rmse", "mae"]);
    let t = v["training"].as_object_mut().unwrap();
    t.insert(
        "training_data".into(),
        json!({"systems": [data.join("data_0"), data.join("data_1")], "batch_size": 2}),
    );
    t.insert(
        "validation_data".into(),
        json!({"systems": [data.join("data_2")], "batch_size": 2}),
    );
    t.insert("numb_steps".into(), json!(6));
    t.insert("disp_freq".into(), json!(3));
    t.insert("save_freq".into(), json!(6));
    let (ok, log) = dpw_train(tmp.path(), &v);
    assert!(ok, "{log}");
    let lcurve = std::fs::read_to_string(tmp.path().join("lcurve.out")).unwrap();
    let lines: Vec<&str> = lcurve.lines().collect();
    assert_eq!(
        lines[0], "# step        mae_val     mae_trn      rmse_val    rmse_trn   lr      ",
        "{lcurve}"
    );
    let last: Vec<f64> = (lines.last().unwrap().split_whitespace())
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(last.len(), 6, "{lcurve}");
    assert!(last.iter().all(|x| x.is_finite()), "{lcurve}");
    // rmse ≥ mae, for validation and training alike.
    assert!(last[3] >= last[1] && last[4] >= last[2], "{lcurve}");

    let (ok, log) = dpw_in(tmp.path(), &["freeze", "-c", ".", "-o", "frozen.yaml"]);
    assert!(ok, "{log}");
    let sys = data.join("data_2");
    let mut reports = Vec::new();
    for (model, prefix) in [("model.ckpt-6", "ckpt"), ("frozen.yaml", "yaml")] {
        let (ok, out) = dpw_in(
            tmp.path(),
            &[
                "test",
                "-m",
                model,
                "-s",
                sys.to_str().unwrap(),
                "-d",
                prefix,
            ],
        );
        assert!(ok, "{out}");
        assert!(out.contains("PROPERTY MAE            : "), "{out}");
        assert!(out.contains("PROPERTY RMSE           : "), "{out}");
        // As dp test, the weighted average even over one system, of the same errors.
        let mae = |text: &str| {
            text.lines()
                .find(|l| l.contains("PROPERTY MAE"))
                .map(str::to_string)
        };
        let (system, average) =
            (out.split_once("weighted average of errors")).expect("a weighted average");
        assert!(average.contains("# number of systems : 1"), "{out}");
        assert_eq!(mae(average), mae(system), "{out}");
        let mut files = Vec::new();
        for f in 0..4 {
            let text =
                std::fs::read_to_string(tmp.path().join(format!("{prefix}.property.out.{f}")))
                    .unwrap();
            let head = text.lines().next().unwrap();
            assert!(
                head.starts_with("# ")
                    && head.ends_with(&format!(" - {f}: data_property pred_property")),
                "{text}"
            );
            assert_eq!(text.lines().count(), 4, "{text}");
            files.push(text.lines().skip(1).map(str::to_string).collect::<Vec<_>>());
        }
        let mae_line = out
            .lines()
            .find(|l| l.contains("PROPERTY MAE"))
            .unwrap()
            .to_string();
        reports.push((mae_line, files));
    }
    assert_eq!(
        reports[0], reports[1],
        "checkpoint and frozen model disagree"
    );
}

/// A property fitting with the `ener` loss, data without the property's file, and a label of
/// another width are refused naming the key or the file.
#[test]
fn refusals_name_the_key_and_the_file() {
    let tmp = TempDir::new().unwrap();
    let sys = write_system(tmp.path(), "property_water", "sys", true);
    let mut v = input("property_water", &[&sys], 1);
    v["loss"] = json!({"type": "ener"});
    let (ok, log) = dpw_train(tmp.path(), &v);
    assert!(!ok);
    assert!(
        log.contains("loss.type") && log.contains("\"property\""),
        "{log}"
    );

    let bare = write_system(tmp.path(), "property_water", "bare", false);
    let (ok, log) = dpw_train(tmp.path(), &input("property_water", &[&bare], 1));
    assert!(!ok);
    assert!(
        log.contains("bare") && log.contains("band_prop.npy"),
        "{log}"
    );

    let mut v = input("property_water", &[&sys], 1);
    v["model"]["fitting_net"]["task_dim"] = json!(2);
    let (ok, log) = dpw_train(tmp.path(), &v);
    assert!(!ok);
    assert!(
        log.contains("band_prop.npy") && log.contains("[nframes, 2]"),
        "{log}"
    );
    assert!(!tmp.path().join("lcurve.out").exists());
}

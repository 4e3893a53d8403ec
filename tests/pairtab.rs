//! Pair tables (issue 57, item 4): models with a table by use_srtab (ZBL) or linear_ener, their
//! files both ways, their inputs, and their refusals. The numbers against DeePMD-kit's are the
//! backend suites' (`reference_pairtab_*`, tests/reference/pairtab).

mod common;

use std::path::PathBuf;

use dpw::model::{read_deepmd_yaml, read_model, write_deepmd_yaml};
use dpw::train::predict::predict;
use serde_json::{json, Value};

use common::*;

fn case_dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/pairtab/{case}"))
}

/// The cases of a DP model with a table (a ZBL mix, linear ones, a table reaching beyond the
/// descriptor).
const CASES: [&str; 4] = [
    "zbl_water",
    "linear_sum_water",
    "linear_list_water",
    "linear_far_water",
];

/// A DeePMD-kit model read, written by dpw and read again is the same model; so is one through
/// a dpw model file (`dpw convert`'s other format, and a checkpoint's).
#[test]
fn model_files_keep_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    for case in &CASES {
        let m = read_deepmd_yaml(&case_dir(case).join("model.yaml")).unwrap();
        assert!(m.spec.short_range.is_some(), "{case}");
        let yaml = tmp.path().join(format!("{case}.yaml"));
        write_deepmd_yaml(&m, &yaml).unwrap();
        assert_eq!(read_deepmd_yaml(&yaml).unwrap(), m, "{case}: yaml");
        let file = tmp.path().join(format!("{case}.dpw"));
        dpw::model::file::save_model(&file, &m).unwrap();
        assert_eq!(read_model(&file).unwrap(), m, "{case}: dpw model file");
    }
}

/// A pair table alone (DeePMD-kit's `linear` of one pairtab) is refused by name, as DeePMD-kit's
/// PyTorch refuses a `pairtab` model.
#[test]
fn a_table_alone_is_refused() {
    let e = read_deepmd_yaml(&case_dir("pairtab_water").join("model.yaml")).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("model.models") && e.contains("pairtab"), "{e}");
}

/// An atom pair closer than the table's first distance: an error naming the frame and the
/// table, as DeePMD-kit's PyTorch refuses it ("coord go beyond table lower boundary").
#[test]
fn a_pair_below_the_table_is_an_error() {
    let m = read_deepmd_yaml(&case_dir("zbl_water").join("model.yaml")).unwrap();
    let coord = vec![0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 3.0, 0.0, 0.0];
    let frame = dpw::train::batch::Frame {
        coord: &coord,
        cell: None,
        energy: 0.0,
        force: &[0.0; 9],
        virial: None,
        fparam: None,
        aparam: None,
        label: None,
        atom_label: None,
    };
    let b = dpw::backend::cpu::Cpu::default();
    let e = predict::<f64, _>(&b, &m, &[0, 1, 1], &[frame]).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("frame 0") && e.contains("0.3") && e.contains("first distance"),
        "{e}"
    );
}

/// The reference cases' own inputs (their model sections, the table beside them) train two
/// steps on the water data; the trained model's `.yaml` evaluates with `dpw test`.
#[test]
fn reference_inputs_train() {
    for case in ["zbl_water", "linear_list_water", "linear_far_water"] {
        let tmp = tempfile::tempdir().unwrap();
        let input: Value = serde_json::from_str(
            &std::fs::read_to_string(case_dir(case).join("input.json")).unwrap(),
        )
        .unwrap();
        let mut model = input["model"].clone();
        // The table's path as the case gives it, relative to the case's folder.
        let table = case_dir("").join("tab.txt");
        match model.get_mut("use_srtab") {
            Some(t) => *t = json!(table),
            None => model["models"][1]["tab_file"] = json!(table),
        }
        let mut input = tiny_water_input(json!([water().to_str().unwrap()]), 2);
        input["model"] = model;
        let (ok, log) = dpw_train(tmp.path(), &input);
        assert!(ok, "{case}: {log}");
        let out: Value = json_file(&tmp.path().join("out.json"));
        assert_eq!(
            dpw::config::deepmd_input_errors(&out),
            Vec::<String>::new(),
            "{case}: out.json"
        );
        let (ok, log) = dpw_in(tmp.path(), &["freeze", "-o", "frozen.yaml"]);
        assert!(ok, "{case}: {log}");
        let (ok, log) = dpw_in(
            tmp.path(),
            &[
                "test",
                "-m",
                "frozen.yaml",
                "-s",
                water().to_str().unwrap(),
                "-n",
                "1",
            ],
        );
        assert!(ok && log.contains("Force  RMSE"), "{case}: {log}");
    }
}

/// What use_srtab and linear_ener need, refused by key.
#[test]
fn pair_table_inputs_are_checked() {
    let table = case_dir("tab.txt");
    let base = || {
        let input: Value = serde_json::from_str(
            &std::fs::read_to_string(case_dir("zbl_water").join("input.json")).unwrap(),
        )
        .unwrap();
        let mut i = tiny_water_input(json!([water().to_str().unwrap()]), 1);
        i["model"] = input["model"].clone();
        i["model"]["use_srtab"] = json!(table);
        i
    };
    let refused = |input: &Value, parts: &[&str]| {
        let e = dpw::config::Config::from_value(input, &repo(""))
            .expect_err("refused")
            .to_string();
        for p in parts {
            assert!(e.contains(p), "{parts:?}: {e}");
        }
    };
    let mut i = base();
    i["model"].as_object_mut().unwrap().remove("sw_rmin");
    refused(&i, &["model.sw_rmin", "missing"]);
    let mut i = base();
    i["model"]["sw_rmax"] = json!(0.5);
    refused(&i, &["model.sw_rmax", "exceed"]);
    let mut i = base();
    i["model"]["use_srtab"] = json!("no-such-table.txt");
    refused(&i, &["model.use_srtab", "no-such-table.txt"]);
    let mut i = tiny_water_input(json!([water().to_str().unwrap()]), 1);
    i["model"]["use_srtab"] = json!(table);
    i["model"]["sw_rmin"] = json!(0.8);
    i["model"]["sw_rmax"] = json!(1.2);
    refused(&i, &["model.use_srtab", "mixed-type", "se_e2_a"]);
    let mut i = base();
    i["model"].as_object_mut().unwrap().remove("use_srtab");
    refused(&i, &["model.smin_alpha", "use_srtab"]);
}

/// DeePMD-kit 3.2.0's dpmodel reads the `.yaml` dpw writes of each case and predicts what it
/// predicts from its own file (energies and atomic energies, bit for bit when this was
/// written). Needs `DPW_DEEPMD_PYTHON` (a Python with deepmd-kit); without it a visible skip,
/// or a failure under `DPW_REQUIRE_DEEPMD=1`, as tests/dpa1.rs's.
#[test]
fn deepmd_kit_reads_dpws_pair_table_yaml() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = &CASES;
    for case in cases {
        let m = read_deepmd_yaml(&case_dir(case).join("model.yaml")).unwrap();
        write_deepmd_yaml(&m, &tmp.path().join(format!("{case}.yaml"))).unwrap();
    }
    // DeepPot cannot evaluate these models from a .yaml (its numpy backend has no forces for
    // them); the model's own call gives energies.
    let script = r#"
import sys, numpy as np
from deepmd.dpmodel.utils.serialization import load_dp_model
from deepmd.dpmodel.model.base_model import BaseModel
root, tmp = sys.argv[1:3]
for case in sys.argv[3:]:
    z = np.load(f"{root}/{case}/eval.npz")
    nf = z["coord"].shape[0]
    out = []
    for path in (f"{root}/{case}/model.yaml", f"{tmp}/{case}.yaml"):
        m = BaseModel.deserialize(load_dp_model(path)["model"])
        r = m(z["coord"].reshape(nf, -1, 3), np.tile(z["atype"], (nf, 1)), z["box"].reshape(nf, 3, 3))
        out.append(np.asarray(r["energy"]).ravel())
    print(case, float(np.abs(out[0] - out[1]).max()))
"#;
    deepmd_agrees(
        "deepmd_kit_reads_dpws_pair_table_yaml",
        script,
        &case_dir(""),
        tmp.path(),
        cases,
    );
}

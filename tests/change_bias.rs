//! `dpw change-bias` against DeePMD-kit 3.2.0's `dp --pt change-bias` on its own checkpoints
//! (tests/reference/multitask/cb_*, README there): the bias after, per type, and that nothing
//! else of the model changes.

mod common;

use std::path::{Path, PathBuf};

use dpw::model::{read_deepmd_yaml, read_model_head};
use serde_json::Value;

use common::*;

fn reference(rel: &str) -> PathBuf {
    repo(&format!("tests/reference/multitask/{rel}"))
}

fn change_bias(dir: &Path, args: &[&str]) -> (bool, String) {
    let mut all = vec!["change-bias"];
    all.extend(args);
    all.extend(["--backend", "cpu"]);
    dpw_in(dir, &all)
}

/// Each case's bias after, as DeePMD-kit's `bias.json` has it, to 1e-8 eV (DeePMD-kit's own
/// re-fit of a DPA-1 model carries ~1e-10 of neighbour-list noise, README there); every other
/// tensor and statistic as in the pretrained head.
#[test]
fn biases_are_deepmd_kits() {
    let tmp = tempfile::tempdir().unwrap();
    let water3 = repo("examples/water/data_3");
    let alloy = repo("examples/alloy/data/train");
    let se_a = reference("pre_se_a/model.ckpt.pt");
    let mt = reference("pre_mt/model.ckpt.pt");
    let cases: [(&str, &Path, Vec<&str>, Option<&str>); 4] = [
        (
            "cb_se_a_change",
            &se_a,
            vec!["-s", water3.to_str().unwrap(), "-m", "change"],
            None,
        ),
        (
            "cb_se_a_set",
            &se_a,
            vec!["-s", water3.to_str().unwrap(), "-m", "set"],
            None,
        ),
        ("cb_se_a_value", &se_a, vec!["-b", "-93.5", "-187.25"], None),
        (
            "cb_mt_alloy",
            &mt,
            vec!["-s", alloy.to_str().unwrap(), "--model-branch", "alloy"],
            Some("alloy"),
        ),
    ];
    for (case, model, args, head) in cases {
        let out = tmp.path().join(format!("{case}.yaml"));
        let mut all = vec![model.to_str().unwrap()];
        all.extend(&args);
        all.extend(["-o", out.to_str().unwrap()]);
        let (ok, log) = change_bias(tmp.path(), &all);
        assert!(ok, "{case}: {log}");
        let after = read_deepmd_yaml(&out).unwrap();
        let before = read_model_head(model, head).unwrap();
        let meta: Value = json_file(&reference(&format!("{case}/bias.json")));
        let mut worst = 0.0f64;
        for (t, name) in after.spec.type_map.iter().enumerate() {
            let want = meta["out_bias_after"][name].as_f64().unwrap();
            worst = worst.max((after.bias[t] - want).abs());
        }
        eprintln!("{case}: bias off DeePMD-kit's by {worst:.1e} eV");
        assert!(worst <= 1e-8, "{case}: bias off by {worst}");
        let mut same = after.clone();
        same.bias.clone_from(&before.bias);
        assert_eq!(same, before, "{case}: only the bias changes");
        predicts_deepmd_energies("biases_are_deepmd_kits", &after, case, None);
    }
}

/// What `dp change-bias` refuses, refused by dpw too, naming what to give; and the output's
/// default name.
#[test]
fn change_bias_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let mt = reference("pre_mt/model.ckpt.pt");
    let water3 = repo("examples/water/data_3");
    let (ok, log) = change_bias(
        tmp.path(),
        &[mt.to_str().unwrap(), "-s", water3.to_str().unwrap()],
    );
    assert!(
        !ok && log.contains("alloy") && log.contains("water"),
        "{log}"
    );
    let yaml = tmp.path().join("m.yaml");
    std::fs::copy(reference("pre_se_a/model.yaml"), &yaml).unwrap();
    let (ok, log) = change_bias(tmp.path(), &["m.yaml", "-b", "1.0"]);
    assert!(
        !ok && log.contains("-b: 1 values") && log.contains("O, H"),
        "{log}"
    );
    let (ok, log) = change_bias(tmp.path(), &["m.yaml", "-b", "1.0", "2.0"]);
    assert!(ok, "{log}");
    let m = read_deepmd_yaml(&tmp.path().join("m_updated.yaml")).unwrap();
    assert_eq!(m.bias, vec![1.0, 2.0]);
    let (ok, log) = change_bias(tmp.path(), &["m.yaml", "-b", "1.0", "2.0", "-o", "m.pth"]);
    assert!(!ok && log.contains("dp convert-backend"), "{log}");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (ok, log) = change_bias(tmp.path(), &["m.yaml", "-s", "empty"]);
    assert!(!ok, "{log}");
}

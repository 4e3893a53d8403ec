//! `dpw train --finetune` against DeePMD-kit 3.2.0's `dp --pt train --finetune` on its own
//! checkpoints (tests/reference/multitask, README there): the start (numb_steps 0) is the
//! pretrained head with its bias re-fitted by change-by-statistic on the new data.

mod common;

use std::path::{Path, PathBuf};

use dpw::model::{read_model, read_model_head};
use serde_json::{json, Value};

use common::*;

fn reference(rel: &str) -> PathBuf {
    repo(&format!("tests/reference/multitask/{rel}"))
}

/// A case's input in a fresh folder that sees the repository's `examples/` (the inputs' data
/// paths are repository-relative), with `model` changed by `edit`.
fn folder(case: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo("examples"), tmp.path().join("examples")).unwrap();
    let mut input = json_file(&reference(&format!("{case}/input.json")));
    edit(&mut input["model"]);
    std::fs::write(tmp.path().join("input.json"), input.to_string()).unwrap();
    tmp
}

fn finetune(dir: &Path, args: &[&str]) -> (bool, String) {
    let mut all = vec!["train", "input.json", "--backend", "cpu", "--finetune"];
    all.extend(args);
    dpw_in(dir, &all)
}

/// The fine-tuned start's bias against DeePMD-kit's (`want`, per element), to 1e-8 eV (its DPA-1
/// re-fits carry ~1e-10 of neighbour-list noise), and every other tensor the pretrained head's.
fn assert_start(dir: &Path, pretrained: &Path, head: Option<&str>, want: &Value) {
    let start = read_model(&dir.join("model.ckpt-0")).unwrap();
    let before = read_model_head(pretrained, head).unwrap();
    let mut worst = 0.0f64;
    for (t, name) in start.spec.type_map.iter().enumerate() {
        worst = worst.max((start.bias[t] - want[name].as_f64().unwrap()).abs());
    }
    eprintln!("{}: bias off DeePMD-kit's by {worst:.1e} eV", dir.display());
    assert!(worst <= 1e-8, "bias off by {worst}");
    let mut same = start.clone();
    same.bias.clone_from(&before.bias);
    assert_eq!(same, before, "only the bias changes");
}

/// ft_se_a: a single-task se_e2_a model fine-tuned on other water data.
#[test]
fn single_task_start_is_deepmd_kits() {
    let tmp = folder("ft_se_a", |_| {});
    let pre = reference("pre_se_a/model.ckpt.pt");
    let (ok, log) = finetune(tmp.path(), &[pre.to_str().unwrap()]);
    assert!(ok, "{log}");
    let meta = json_file(&reference("ft_se_a/bias.json"));
    assert_start(
        tmp.path(),
        &pre,
        None,
        &meta["heads"]["Default"]["out_bias_after"],
    );
}

/// The alloy head of the multi-task DPA-1 model fine-tuned on the alloy training data with its
/// own type_map: DeePMD-kit's change-bias of that head on the same data (cb_mt_alloy; its
/// fine-tune ft_mt_alloy, on a subset type_map, agrees with it to 9e-16).
#[test]
fn multi_task_head_start_is_deepmd_kits() {
    let tmp = folder("ft_mt_alloy", |m| {
        m["type_map"] = json!(["O", "H", "Cu", "Ni", "Al"]);
    });
    let pre = reference("pre_mt/model.ckpt.pt");
    let (ok, log) = finetune(
        tmp.path(),
        &[pre.to_str().unwrap(), "--model-branch", "alloy"],
    );
    assert!(ok, "{log}");
    let meta = json_file(&reference("cb_mt_alloy/bias.json"));
    assert_start(tmp.path(), &pre, Some("alloy"), &meta["out_bias_after"]);
}

/// A case, its input's change, the arguments after `--finetune`, what the error names.
type Refusal<'a> = (
    &'a str,
    Box<dyn FnOnce(&mut Value)>,
    Vec<&'a str>,
    &'a [&'a str],
);

/// What dpw does not fine-tune yet, and what DeePMD-kit refuses, refused naming it.
#[test]
fn finetune_refusals() {
    let pre = reference("pre_se_a/model.ckpt.pt");
    let mt = reference("pre_mt/model.ckpt.pt");
    let cases: [Refusal; 5] = [
        (
            "ft_se_a",
            Box::new(|m| m["type_map"] = json!(["H", "O"])),
            vec![pre.to_str().unwrap()],
            &["type_map"],
        ),
        (
            "ft_se_a",
            Box::new(|m| m["descriptor"]["neuron"] = json!([4, 16])),
            vec![pre.to_str().unwrap()],
            &["neuron"],
        ),
        (
            "ft_se_a",
            Box::new(|_| {}),
            vec![pre.to_str().unwrap(), "--model-branch", "water"],
            &["Default"],
        ),
        (
            "ft_mt_alloy",
            Box::new(|_| {}),
            vec![mt.to_str().unwrap(), "--model-branch", "foo"],
            &["foo", "alloy", "water"],
        ),
        (
            "ft_mt_alloy",
            Box::new(|_| {}),
            vec![mt.to_str().unwrap(), "--model-branch", "RANDOM"],
            &["RANDOM", "not implemented"],
        ),
    ];
    for (case, edit, args, parts) in cases {
        let tmp = folder(case, edit);
        let (ok, log) = finetune(tmp.path(), &args);
        assert!(!ok, "{args:?}: {log}");
        for p in parts {
            assert!(log.contains(p), "{args:?}: {p:?} not in {log}");
        }
        assert!(!tmp.path().join("model.ckpt-0").exists());
    }
}

/// Fine-tuning to another type_map of the pretrained elements (DeePMD-kit's change_type_map):
/// DeePMD-kit's own starts, model for model: ft_mt_alloy (O H Cu Ni Al → Al Ni Cu: a subset in
/// another order) and ft_mt_water_ho (→ H O: the type embedding's width 4 is then twice the
/// types, so its rows become W[idx] − [I, I]); every tensor and statistic to 1e-15, the bias to
/// 1e-8 eV.
#[test]
fn type_map_change_is_deepmd_kits() {
    let pre = reference("pre_mt/model.ckpt.pt");
    for (case, head) in [("ft_mt_alloy", "alloy"), ("ft_mt_water_ho", "water")] {
        let tmp = folder(case, |_| {});
        let (ok, log) = finetune(tmp.path(), &[pre.to_str().unwrap(), "--model-branch", head]);
        assert!(ok, "{case}: {log}");
        let mine = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
        let theirs =
            dpw::model::read_deepmd_yaml(&reference(&format!("{case}/model.yaml"))).unwrap();
        assert_eq!(mine.spec, theirs.spec, "{case}");
        let worst = |a: &[f64], b: &[f64]| {
            assert_eq!(a.len(), b.len());
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        let p = worst(&mine.params, &theirs.params);
        let s = worst(&mine.davg, &theirs.davg).max(worst(&mine.dstd, &theirs.dstd));
        let b = worst(&mine.bias, &theirs.bias);
        eprintln!("{case}: parameters {p:.1e}, statistics {s:.1e}, bias {b:.1e} eV");
        assert!(p <= 1e-15 && s <= 1e-15 && b <= 1e-8, "{case}: {p} {s} {b}");
    }
}

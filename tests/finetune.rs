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

/// A case's input in a fresh folder that sees the repository's `examples/` and `tests/` (the inputs' data
/// paths are repository-relative), with `model` changed by `edit`.
fn folder(case: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    folder_with(case, |input| edit(&mut input["model"]))
}

/// [`folder`] with the whole input changed by `edit`.
fn folder_with(case: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for d in ["examples", "tests"] {
        std::os::unix::fs::symlink(repo(d), tmp.path().join(d)).unwrap();
    }
    let mut input = json_file(&reference(&format!("{case}/input.json")));
    edit(&mut input);
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
    let start = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
    predicts_deepmd_energies("single_task_start_is_deepmd_kits", &start, "ft_se_a", None);
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
    let start = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
    let test = "multi_task_head_start_is_deepmd_kits";
    predicts_deepmd_energies(test, &start, "cb_mt_alloy", None);
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
    let yaml = reference("pre_mt/model_alloy.yaml");
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
            vec![yaml.to_str().unwrap(), "--use-pretrain-script"],
            &["--use-pretrain-script", "model_alloy.yaml is not one"],
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
        assert_deepmd_start(&mine, &theirs, case);
        predicts_deepmd_energies("type_map_change_is_deepmd_kits", &mine, case, None);
    }
}

/// A head of a multi-task model whose tasks share the fitting net (sf_pre) fine-tuned alone,
/// its model section from the `.pt` (`--use-pretrain-script`): the head's case embedding
/// (water's one-hot row) and every tensor kept, the bias alone re-fitted, as DeePMD-kit loads
/// the head's state (its `case_embd` buffer included) into the single-task model.
#[test]
fn a_shared_fitting_head_keeps_its_case_embedding() {
    let pre = reference("sf_pre/model.ckpt.pt");
    let tmp = folder("ft_mt_water_ho", |m| {
        m["type_map"] = json!(["O", "H", "Cu", "Ni", "Al"]);
        m["descriptor"] = json!({});
        m["fitting_net"] = json!({});
    });
    let (ok, log) = finetune(
        tmp.path(),
        &[
            pre.to_str().unwrap(),
            "--model-branch",
            "water",
            "--use-pretrain-script",
        ],
    );
    assert!(ok, "{log}");
    let start = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
    let before = read_model_head(&pre, Some("water")).unwrap();
    assert_eq!(start.case_embd, [0.0, 1.0]);
    assert_ne!(start.bias, before.bias);
    let mut same = start.clone();
    same.bias.clone_from(&before.bias);
    assert_eq!(same, before, "only the bias changes");
    let out = json_file(&tmp.path().join("out.json"));
    assert_eq!(out["model"]["fitting_net"]["dim_case_embd"], 2);
}

/// Fine-tuning to a type_map with an element the pretrained model lacks (ft_mt_newtype: the
/// water head of pre_mt, O H Cu Ni Al → C H O, on the C4H3O1 molecule), as DeePMD-kit's
/// change_type_map: every tensor DeePMD-kit's but the new element's type-embedding row, which
/// both draw uniform in [0, 1) (DeePMD-kit's torch.rand) before taking off the one-hot skip;
/// C's davg/dstd those of the molecule's data and H's and O's the pretrained ones, to 1e-15.
/// Its bias is re-fitted by change-by-statistic from the start (C 0, H and O pretrained): on
/// DeePMD-kit's start, whose C row is its own draw, that re-fit is DeePMD-kit's to 1e-8 eV; on
/// dpw's, it is the bias dpw's fine-tune gives.
#[test]
fn a_new_element_is_added_as_deepmd_kit_adds_it() {
    let pre = reference("pre_mt/model.ckpt.pt");
    let tmp = folder("ft_mt_newtype", |_| {});
    let (ok, log) = finetune(
        tmp.path(),
        &[pre.to_str().unwrap(), "--model-branch", "water"],
    );
    assert!(ok && log.contains("new elements C"), "{log}");
    let mine = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
    let theirs = dpw::model::read_deepmd_yaml(&reference("ft_mt_newtype/model.yaml")).unwrap();
    assert_eq!(mine.spec, theirs.spec);
    let tebd = mine.layout().descriptor.own.attn().cloned().unwrap().tebd;
    let c_row = tebd.w..tebd.w + tebd.dim;
    // tebd_dim 4 is neither 3 types nor twice them: no skip, the row is the draw itself.
    for p in [&mine, &theirs] {
        assert!(p.params[c_row.clone()]
            .iter()
            .all(|w| (0.0..1.0).contains(w)));
    }
    assert_ne!(mine.params[c_row.clone()], theirs.params[c_row.clone()]);
    let mut same = mine.clone();
    same.params[c_row.clone()].copy_from_slice(&theirs.params[c_row.clone()]);
    assert_eq!(same.params, theirs.params);
    let s = max_abs_diff(&mine.davg, &theirs.davg).max(max_abs_diff(&mine.dstd, &theirs.dstd));
    eprintln!("davg/dstd off DeePMD-kit's by {s:.1e}");
    assert!(s <= 1e-15, "{s}");

    let meta = json_file(&reference("ft_mt_newtype/bias.json"));
    let head = &meta["heads"]["Default"];
    let start: Vec<f64> = (mine.spec.type_map.iter())
        .map(|t| head["out_bias_start"][t].as_f64().unwrap())
        .collect();
    let mut deepmd_start = theirs.clone();
    deepmd_start.bias.clone_from(&start);
    let refit = rebias_on_molecule(tmp.path(), &deepmd_start, "deepmd_start");
    let mut worst = 0.0f64;
    for (t, name) in refit.spec.type_map.iter().enumerate() {
        worst = worst.max((refit.bias[t] - head["out_bias_after"][name].as_f64().unwrap()).abs());
    }
    eprintln!("re-fit of DeePMD-kit's start off its bias by {worst:.1e} eV");
    assert!(worst <= 1e-8, "{worst}");
    let mut dpw_start = mine.clone();
    dpw_start.bias = start;
    let refit = rebias_on_molecule(tmp.path(), &dpw_start, "dpw_start");
    let b = max_abs_diff(&refit.bias, &mine.bias);
    assert!(b <= 1e-9, "{b}");
}

/// `--model-branch RANDOM` (ft_mt_random, O H Cu Ni Al → Cu Ni Al) and, the same to DeePMD-kit,
/// a multi-task model without `--model-branch` (with a warning): the pretrained descriptor (its
/// parameters and statistics, on the new type_map) under a new fitting net, the bias set by
/// statistic: DeePMD-kit's start but for the fitting net's random draws.
#[test]
fn random_branch_takes_the_descriptor_alone() {
    let pre = reference("pre_mt/model.ckpt.pt");
    let theirs = dpw::model::read_deepmd_yaml(&reference("ft_mt_random/model.yaml")).unwrap();
    let meta = json_file(&reference("ft_mt_random/bias.json"));
    for branch in [Some("RANDOM"), None] {
        let tmp = folder("ft_mt_random", |_| {});
        let mut args = vec![pre.to_str().unwrap()];
        args.extend(branch.map(|b| ["--model-branch", b]).into_iter().flatten());
        let (ok, log) = finetune(tmp.path(), &args);
        assert!(ok, "{branch:?}: {log}");
        assert_eq!(log.contains("re-initialized"), branch.is_none(), "{log}");
        let mine = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
        assert_eq!(mine.spec, theirs.spec);
        let dlen = mine.layout().descriptor_len();
        let p = max_abs_diff(&mine.params[..dlen], &theirs.params[..dlen]);
        let s = max_abs_diff(&mine.davg, &theirs.davg).max(max_abs_diff(&mine.dstd, &theirs.dstd));
        let mut b = 0.0f64;
        for (t, name) in mine.spec.type_map.iter().enumerate() {
            let want = meta["heads"]["Default"]["out_bias_after"][name]
                .as_f64()
                .unwrap();
            b = b.max((mine.bias[t] - want).abs());
        }
        eprintln!("{branch:?}: descriptor {p:.1e}, statistics {s:.1e}, bias {b:.1e} eV");
        assert!(
            p <= 1e-15 && s <= 1e-15 && b <= 1e-8,
            "{branch:?}: {p} {s} {b}"
        );
        assert_ne!(
            mine.params[dlen..],
            theirs.params[dlen..],
            "a new fitting net"
        );
    }
}

/// `--use-pretrain-script` (ft_mt_alloy_script: input.json's descriptor and fitting_net empty):
/// the model is the head's own, and the start DeePMD-kit's (the same as ft_mt_alloy's).
#[test]
fn use_pretrain_script_takes_the_heads_model_section() {
    let pre = reference("pre_mt/model.ckpt.pt");
    let tmp = folder("ft_mt_alloy_script", |_| {});
    let args = [
        pre.to_str().unwrap(),
        "--model-branch",
        "alloy",
        "--use-pretrain-script",
    ];
    let (ok, log) = finetune(tmp.path(), &args);
    assert!(ok, "{log}");
    let mine = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
    let theirs = dpw::model::read_deepmd_yaml(&reference("ft_mt_alloy/model.yaml")).unwrap();
    assert_deepmd_start(&mine, &theirs, "ft_mt_alloy_script");
    let out = json_file(&tmp.path().join("out.json"));
    assert_eq!(out["model"]["descriptor"]["type"], "se_atten");
    assert_eq!(out["model"]["type_map"], json!(["Al", "Ni", "Cu"]));
}

/// A pretrained energy model's input with a dipole fitting, the tensor loss and DeePMD-kit's
/// water_tensor dipole data, in a fresh folder.
fn dipole_folder() -> tempfile::TempDir {
    folder_with("ft_se_a", |input| {
        let m = &mut input["model"];
        m["fitting_net"] = json!({"type": "dipole", "neuron": [8, 8], "resnet_dt": true,
                                  "precision": "float64", "seed": 2});
        m["atom_exclude_types"] = json!([1]);
        input["loss"] = json!({"type": "tensor", "pref": 1.0, "pref_atomic": 1.0});
        let data = "tests/data/deepmd-kit/examples/water_tensor/dipole/training_data_reformat";
        input["training"]["training_data"]["systems"] = json!([
            format!("{data}/atomic_system"),
            format!("{data}/global_system")
        ]);
    })
}

/// A dipole fitting net on a pretrained energy model's descriptor, `--model-branch RANDOM`, as
/// DeePMD-kit fine-tunes a pretrained model to another property: the descriptor's parameters
/// and statistics are the pretrained model's, the dipole's output statistics those of its data
/// (a fresh dipole model's on the same input: set-by-statistic), and no energy is read. Without
/// RANDOM the fitting nets differ and the run is refused; a pretrained dipole fitting, whose
/// bias would be changed by statistic, is refused by name.
#[test]
fn a_new_dipole_fitting_on_a_pretrained_descriptor() {
    let pre = reference("pre_se_a/model.ckpt.pt");
    let tmp = dipole_folder();
    let (ok, log) = finetune(
        tmp.path(),
        &[pre.to_str().unwrap(), "--model-branch", "RANDOM"],
    );
    assert!(ok, "{log}");
    let mine = read_model(&tmp.path().join("model.ckpt-0")).unwrap();
    let before = read_model_head(&pre, None).unwrap();
    let dlen = mine.layout().descriptor_len();
    assert_eq!(
        mine.params[..dlen],
        before.params[..dlen],
        "the pretrained descriptor"
    );
    assert_eq!((&mine.davg, &mine.dstd), (&before.davg, &before.dstd));
    let fresh = dipole_folder();
    let (ok, log) = dpw_in(fresh.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(ok, "{log}");
    let fresh = read_model(&fresh.path().join("model.ckpt-0")).unwrap();
    assert_eq!(
        mine.bias, fresh.bias,
        "the dipole's output statistics of its data"
    );
    assert!(mine.bias.iter().any(|&b| b != 0.0), "{:?}", mine.bias);

    let (ok, log) = finetune(dipole_folder().path(), &[pre.to_str().unwrap()]);
    let named = "model.fitting_net.type: \"dipole\" in input.json, \"ener\" in the --finetune";
    assert!(!ok && log.contains(named), "{log}");
    let dipole = tmp.path().join("model.ckpt-0");
    let (ok, log) = finetune(dipole_folder().path(), &[dipole.to_str().unwrap()]);
    assert!(
        !ok && log.contains("changes its output bias by statistic, which dpw does for the ener"),
        "{log}"
    );
}

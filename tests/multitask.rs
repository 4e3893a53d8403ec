//! Issue 56, item 3: multi-task training as DeePMD-kit 3.2.0 does it, against runs of its own
//! (tests/reference/multitask/mt_steps and mt_stats, made by
//! scripts/make-reference/multitask_steps.py; their data are the one-frame systems of
//! tests/data/multitask, so that every batch is DeePMD-kit's whatever the batch order).

mod common;

use std::path::Path;

use serde_json::{json, Value};
use tempfile::TempDir;

use common::{dpw_in, json_file, max_abs_diff, rel_to_max, repo};
use dpw::config::multitask::{model_dict_order, MultiTaskConfig};
use dpw::model::{read_model, write_deepmd_yaml, Model};

/// A folder for a run, where the references' repository-relative paths hold (`tests` links
/// to the repository's).
fn tree() -> TempDir {
    let t = TempDir::new().unwrap();
    std::os::unix::fs::symlink(repo("tests"), t.path().join("tests")).unwrap();
    t
}

/// The backends a `dpw` process can train on here: cpu, and wgpu where it has float64.
fn backends(test: &str) -> Vec<&'static str> {
    let mut b = vec!["cpu"];
    #[cfg(feature = "wgpu")]
    if common::wgpu_f64_present(test) {
        b.push("wgpu");
    }
    let _ = test;
    b
}

/// `dpw train` of reference case `case`'s input in a new folder, on `backend`.
fn train(case: &str, backend: &str, extra: &[&str]) -> TempDir {
    let t = tree();
    // The file itself: the order of model_dict's tasks is the task draw's.
    let input = repo(&format!("tests/reference/multitask/{case}/input.json"));
    std::fs::copy(input, t.path().join("input.json")).unwrap();
    let mut args = vec!["train", "input.json", "--backend", backend];
    args.extend(extra);
    let (ok, log) = dpw_in(t.path(), &args);
    assert!(ok, "{case} on {backend}: {log}");
    t
}

/// Head `head` of the run's last checkpoint, through `dpw freeze --head`.
fn head(dir: &Path, head: &str) -> Model {
    let out = format!("{head}.dpw");
    let (ok, log) = dpw_in(
        dir,
        &["freeze", "-c", "model.ckpt", "--head", head, "-o", &out],
    );
    assert!(ok, "{log}");
    read_model(&dir.join(out)).unwrap()
}

fn deepmd_head(case: &str, head: &str) -> Model {
    read_model(&repo(&format!(
        "tests/reference/multitask/{case}/model_{head}.yaml"
    )))
    .unwrap()
}

/// The tasks of reference case `case`, in model_dict order.
fn tasks_of(case: &str) -> Vec<String> {
    let path = repo(&format!("tests/reference/multitask/{case}/input.json"));
    model_dict_order(&std::fs::read_to_string(path).unwrap(), false)
}

/// DeePMD-kit's steps of reference case `case` from the heads of `pre` (`--init-model`),
/// replayed on each backend: the same tasks drawn, the same lcurve.out, and after the last
/// step every head's parameters, statistics and biases DeePMD-kit's. Each backend's heads
/// (in task order: water, alloy, ...), for the case's own checks.
fn replay_deepmd_steps(case: &str, pre: &str, test: &str) -> Vec<(&'static str, Vec<Model>)> {
    let theirs = std::fs::read_to_string(repo(&format!(
        "tests/reference/multitask/{case}/lcurve.out"
    )))
    .unwrap();
    let init = format!("tests/reference/multitask/{pre}/model.ckpt.pt");
    let mut out = Vec::new();
    for backend in backends(test) {
        let t = train(case, backend, &["--init-model", &init]);
        let lcurve = std::fs::read_to_string(t.path().join("lcurve.out")).unwrap();
        assert_eq!(lcurve, theirs, "{backend}");
        let names = tasks_of(case);
        let heads = names.iter().map(|h| {
            let (mine, dp) = (head(t.path(), h), deepmd_head(case, h));
            let d = rel_to_max(&mine.params, &dp.params);
            eprintln!("{backend} {h}: parameters after the steps, max |Δ| / max |p| = {d:.1e}");
            // DeePMD-kit takes the loss's 1/N in float32 (tests/reference/deepmd-3.2.0).
            assert!(d < 1e-9, "{backend} {h}: {d:e}");
            assert_eq!(
                (&mine.davg, &mine.dstd),
                (&dp.davg, &dp.dstd),
                "{backend} {h}"
            );
            assert_eq!(mine.bias, dp.bias, "{backend} {h}");
            assert_eq!(mine.case_embd, dp.case_embd, "{backend} {h}");
            mine
        });
        out.push((backend, heads.collect()));
    }
    out
}

/// Eight steps of DeePMD-kit's multi-task run from the heads of `pre_mt` (`--init-model`):
/// the same tasks drawn (alloy, alloy, water, alloy × 5), the same lcurve.out, and after the
/// last step every head's parameters — the shared descriptor's, updated at every step, and each
/// fitting net's, updated at its task's steps with Adam counting those alone — DeePMD-kit's.
#[test]
fn eight_steps_from_deepmd_kits_heads_are_deepmd_kits() {
    replay_deepmd_steps(
        "mt_steps",
        "pre_mt",
        "eight_steps_from_deepmd_kits_heads_are_deepmd_kits",
    );
}

/// DeePMD-kit's eight steps of `mt_steps` with the descriptor shared at level 1 (`l1_steps`:
/// `"dpa1:1"`, the type embedding alone shared), from the heads of `pre_mt`: the same
/// lcurve.out and, after the last step, both heads' parameters DeePMD-kit's — the type embedding
/// one tensor updated at every step, each task's rest of the descriptor at its own steps.
#[test]
fn eight_steps_at_shared_level_1_are_deepmd_kits() {
    let runs = replay_deepmd_steps(
        "l1_steps",
        "pre_mt",
        "eight_steps_at_shared_level_1_are_deepmd_kits",
    );
    for (backend, heads) in runs {
        let (w, a) = (&heads[0], &heads[1]);
        let tebd = w.layout().descriptor.tebd().unwrap().end();
        let dlen = w.layout().descriptor_len();
        assert_eq!(w.params[..tebd], a.params[..tebd], "{backend}");
        assert_ne!(w.params[tebd..dlen], a.params[tebd..dlen], "{backend}");
    }
}

/// DeePMD-kit's eight steps of `sf_steps` with the descriptor shared at level 1 beside the
/// shared fitting net (`lf_steps`, from the heads of `lf_pre`): the same lcurve.out and both
/// heads' parameters after the last step DeePMD-kit's — the type embedding and the fitting net
/// stepped (and counted by Adam) at every step, each task's rest of the descriptor at its own.
#[test]
fn eight_steps_at_level_1_beside_a_shared_fitting_net_are_deepmd_kits() {
    let test = "eight_steps_at_level_1_beside_a_shared_fitting_net_are_deepmd_kits";
    for (backend, heads) in replay_deepmd_steps("lf_steps", "lf_pre", test) {
        let (w, a) = (&heads[0], &heads[1]);
        let tebd = w.layout().descriptor.tebd().unwrap().end();
        let dlen = w.layout().descriptor_len();
        assert_eq!(w.params[..tebd], a.params[..tebd], "{backend}");
        assert_ne!(w.params[tebd..dlen], a.params[tebd..dlen], "{backend}");
        assert_eq!(w.params[dlen..], a.params[dlen..], "{backend}");
    }
}

/// The same from scratch (`lf_stats`): each head's statistics its own data's and its energy
/// bias DeePMD-kit's, one fitting net.
#[test]
fn a_new_run_at_level_1_beside_a_shared_fitting_net_is_deepmd_kits() {
    let [w, a] = fresh_heads_are_deepmd_kits("lf_stats");
    let dlen = w.layout().descriptor_len();
    assert_ne!(w.dstd, a.dstd);
    assert_eq!(w.params[dlen..], a.params[dlen..]);
}

/// A run from scratch at shared level 1 (`l1_stats`): each head's davg/dstd are those of its own
/// task's data, not merged over the tasks, and its energy bias DeePMD-kit's.
#[test]
fn level_1_statistics_are_each_tasks_own() {
    let [w, a] = fresh_heads_are_deepmd_kits("l1_stats");
    assert_ne!(w.dstd, a.dstd);
}

/// The heads (water, alloy) of a run from scratch of reference case `case`, whose davg/dstd and
/// energy biases are checked against DeePMD-kit's.
fn fresh_heads_are_deepmd_kits(case: &str) -> [Model; 2] {
    let t = train(case, "cpu", &[]);
    ["water", "alloy"].map(|h| {
        let (mine, dp) = (head(t.path(), h), deepmd_head(case, h));
        let d = rel_to_max(&mine.dstd, &dp.dstd);
        eprintln!("{case} {h}: dstd max |Δ| / max = {d:.1e}");
        assert!(d < 1e-13, "{h}: dstd {d:e}");
        assert_eq!(mine.davg, dp.davg, "{h}");
        let b = rel_to_max(&mine.bias, &dp.bias);
        assert!(b < 1e-14, "{h}: bias {b:e}");
        mine
    })
}

/// A run from scratch: the shared descriptor's davg/dstd merged over the tasks (their sums
/// added; both tasks have O and H atoms, the alloy task in a frame of its own) and each head's
/// energy bias fitted on its own data are DeePMD-kit's.
#[test]
fn fresh_statistics_are_deepmd_kits() {
    // The heads differ in their fitting nets (each drawn from its own seed) and share the rest.
    let [w, a] = fresh_heads_are_deepmd_kits("mt_stats");
    let dlen = w.layout().descriptor_len();
    assert_eq!(w.params[..dlen], a.params[..dlen]);
    assert_ne!(w.params[dlen..], a.params[dlen..]);
}

/// The merged statistics are those of one run on all the tasks' data, whatever model_prob.
#[test]
fn merged_statistics_are_the_statistics_of_the_tasks_data() {
    let mut input = json_file(&repo("tests/reference/multitask/mt_stats/input.json"));
    input["training"]["model_prob"] = json!({"water": 1.0, "alloy": 1.0});
    let t = tree();
    std::fs::write(t.path().join("input.json"), input.to_string()).unwrap();
    let (ok, log) = dpw_in(t.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(ok, "{log}");
    let merged = head(t.path(), "water");

    let mut single = json!({
        "model": input["model"]["model_dict"]["water"].clone(),
        "learning_rate": input["learning_rate"],
        "loss": input["loss_dict"]["water"],
        "training": {
            "training_data": {"systems": ["tests/data/multitask/water_f0", "tests/data/multitask/alloy_f0", "tests/data/multitask/water_f1"], "batch_size": 1},
            "numb_steps": 0, "seed": 10,
        },
    });
    single["model"]["type_map"] = input["model"]["shared_dict"]["type_map_all"].clone();
    single["model"]["descriptor"] = input["model"]["shared_dict"]["dpa1"].clone();
    let u = tree();
    std::fs::write(u.path().join("input.json"), single.to_string()).unwrap();
    let (ok, log) = dpw_in(u.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(ok, "{log}");
    let (ok, log) = dpw_in(u.path(), &["freeze", "-c", "model.ckpt", "-o", "m.dpw"]);
    assert!(ok, "{log}");
    let union = read_model(&u.path().join("m.dpw")).unwrap();
    // Sums in another order: sqrt(E[x²] − E[x]²) magnifies their last bits (3e-14).
    let d = rel_to_max(&merged.dstd, &union.dstd);
    assert!(d < 1e-12, "{d:e}");
    assert_eq!(merged.davg, union.davg);
}

/// `dpw freeze` of a multi-task checkpoint names its heads when none or an unknown one is
/// given, and takes a head by its alias.
#[test]
fn freeze_takes_a_head_by_name_or_alias() {
    let mut input = json_file(&repo("tests/reference/multitask/mt_stats/input.json"));
    input["model"]["model_dict"]["alloy"]["model_branch_alias"] = json!(["CuNiAl"]);
    let t = tree();
    std::fs::write(t.path().join("input.json"), input.to_string()).unwrap();
    assert!(dpw_in(t.path(), &["train", "input.json", "--backend", "cpu"]).0);
    let (ok, log) = dpw_in(t.path(), &["freeze", "-c", "model.ckpt", "-o", "x.dpw"]);
    // (Written back from a parsed value, the input lists its tasks sorted.)
    assert!(
        !ok && log.contains("'alloy', 'water'") && log.contains("--head"),
        "{log}"
    );
    let (ok, log) = dpw_in(
        t.path(),
        &["freeze", "-c", "model.ckpt", "--head", "Cu", "-o", "x.dpw"],
    );
    assert!(
        !ok && log.contains("no head (model branch) or alias named 'Cu'"),
        "{log}"
    );
    let by_alias = {
        let (ok, log) = dpw_in(
            t.path(),
            &[
                "freeze",
                "-c",
                "model.ckpt",
                "--head",
                "CuNiAl",
                "-o",
                "a.dpw",
            ],
        );
        assert!(ok, "{log}");
        read_model(&t.path().join("a.dpw")).unwrap()
    };
    assert_eq!(by_alias.params, head(t.path(), "alloy").params);
    // out.json keeps the alias, and every task's model whole.
    let out = json_file(&t.path().join("out.json"));
    assert_eq!(
        out["model"]["model_dict"]["alloy"]["model_branch_alias"],
        json!(["CuNiAl"])
    );
    assert_eq!(
        out["model"]["model_dict"]["water"]["descriptor"]["type"],
        "se_atten"
    );
    assert_eq!(out["loss_dict"]["alloy"]["start_pref_v"], 0.5);
    assert!(out["training"]["data_dict"]["alloy"]["validation_data"].is_object());
    // DeePMD-kit's strict check of a multi-task input takes it (the data keys, stat_file_mode
    // included, in data_dict, not in training).
    assert!(out["training"].get("stat_file_mode").is_none());
    common::deepmd_agrees(
        "freeze_takes_a_head_by_name_or_alias",
        "import json, sys\n\
         from deepmd.utils.argcheck import normalize\n\
         from deepmd.utils.compat import update_deepmd_input\n\
         d = update_deepmd_input(json.load(open(sys.argv[2] + '/out.json')), warning=False)\n\
         normalize(d, multi_task=True)\n\
         print('out.json 0')\n",
        &repo(""),
        t.path(),
        &["out.json"],
    );
}

/// `input` read as a multi-task input whose tasks come in pre_mt's order (water, alloy).
fn parse(input: &Value) -> Result<MultiTaskConfig, String> {
    let text =
        std::fs::read_to_string(repo("tests/reference/multitask/pre_mt/input.json")).unwrap();
    let order = model_dict_order(&text, false);
    MultiTaskConfig::from_value(input, &order, &repo("")).map_err(|e| e.to_string())
}

/// Each of `cases` (a JSON pointer into `good`, the value set there, what the error says)
/// refused saying it.
fn refused_each(good: &Value, cases: Vec<(&str, Value, &str)>) {
    for (ptr, value, says) in cases {
        let mut bad = good.clone();
        let (parent, key) = ptr.rsplit_once('/').unwrap();
        bad.pointer_mut(parent).unwrap()[key] = value;
        let e = parse(&bad).unwrap_err();
        assert!(e.contains(says), "{ptr}: {e}");
    }
}

/// Keys of a multi-task input name where they are in it; what dpw does not do is said.
#[test]
fn multitask_input_errors_name_the_key() {
    let good = json_file(&repo("tests/reference/multitask/pre_mt/input.json"));
    let c = parse(&good).unwrap();
    let names: Vec<&str> = c.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["water", "alloy"]);
    assert_eq!(c.model_prob, [0.25, 0.75]);
    assert_eq!(c.descriptor_key, "dpa1");
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/model/shared_dict/dpa1/sel",
            json!("many"),
            "model.shared_dict.dpa1.sel",
        ),
        (
            "/model/model_dict/water/fitting_net/neuron",
            json!(8),
            "model.model_dict.water.fitting_net.neuron",
        ),
        (
            "/loss_dict/alloy/start_pref_x",
            json!(1),
            "loss_dict.alloy.start_pref_x",
        ),
        (
            "/model/model_dict/water/descriptor",
            json!("dpa1:1"),
            "model.model_dict.alloy.descriptor: shared level 0 differs from the first task's 1",
        ),
        (
            "/model/model_dict/water/descriptor",
            json!("dpa1:2"),
            "sharing a descriptor at shared level 2 is not implemented",
        ),
        (
            "/model/model_dict/water/fitting_net",
            json!("dpa1:1"),
            "sharing a fitting_net at shared level 1 is not implemented",
        ),
        (
            "/model/model_dict/water/descriptor",
            json!("dpa9"),
            "\"dpa9\" is not a key of model.shared_dict",
        ),
        (
            "/model/model_dict/alloy/type_map",
            json!(["Cu", "Ni", "Al"]),
            "tasks sharing a descriptor share its type_map",
        ),
        (
            "/model/model_dict/alloy/data_stat_protect",
            json!(0.02),
            "model.model_dict.alloy.data_stat_protect: 0.02 differs from task 'water''s 0.01",
        ),
        (
            "/training/model_prob",
            json!({"water": 1.0}),
            "missing: [\"alloy\"]",
        ),
        (
            "/training/model_prob",
            json!({"water": 0.0, "alloy": 0.0}),
            "sum to 0",
        ),
        (
            "/training/num_epoch_dict",
            json!({"water": 1}),
            "mutually exclusive with training.numb_steps",
        ),
        (
            "/training/data_dict/alloy/training_data/batch_size",
            json!(0),
            "training.data_dict.alloy.training_data.batch_size",
        ),
        (
            "/model/model_dict/alloy/finetune_head",
            json!("RANDOM"),
            "RANDOM is not a head",
        ),
    ];
    refused_each(&good, cases);
    let mut bad = good.clone();
    bad["model"]["model_dict"]["alloy"]["descriptor"] =
        good["model"]["shared_dict"]["dpa1"].clone();
    let e = parse(&bad).unwrap_err();
    assert!(
        e.contains("shares one descriptor among all the tasks"),
        "{e}"
    );
    // Shared level 1 shares a type embedding, which se_e2_a has not, beside fitting nets of
    // the tasks' own.
    let mut level1 = good.clone();
    for t in ["water", "alloy"] {
        level1["model"]["model_dict"][t]["descriptor"] = json!("dpa1:1");
    }
    assert_eq!(parse(&level1).unwrap().descriptor_level, 1);
    let mut three_body = level1.clone();
    three_body["model"]["shared_dict"]["dpa1"] =
        json!({"type": "se_e3_tebd", "sel": 24, "rcut": 4.0, "neuron": [2, 4]});
    assert_eq!(parse(&three_body).unwrap().descriptor_level, 1);
    let mut se_a = level1.clone();
    se_a["model"]["shared_dict"]["dpa1"] = json!({"type": "se_e2_a", "sel": [20, 40, 1, 1, 1]});
    let e = parse(&se_a).unwrap_err();
    assert!(
        e.contains("which a se_e2_a descriptor does not have"),
        "{e}"
    );

    // Without model_prob the tasks are drawn by their numbers of systems (1 and 2).
    let mut no_prob = good.clone();
    no_prob["training"]
        .as_object_mut()
        .unwrap()
        .remove("model_prob");
    assert_eq!(parse(&no_prob).unwrap().model_prob, [1.0 / 3.0, 2.0 / 3.0]);
}

/// Eight steps of DeePMD-kit's multi-task run whose tasks share the fitting net with a case
/// embedding (`sf_steps`, from the heads of `sf_pre`): the same lcurve.out, and after the last
/// step both heads' parameters — all shared, Adam counting every step of the run — each
/// head's bias and its case embedding (the one-hot row of its name among the sorted names)
/// DeePMD-kit's.
#[test]
fn eight_steps_of_a_shared_fitting_net_are_deepmd_kits() {
    let test = "eight_steps_of_a_shared_fitting_net_are_deepmd_kits";
    for (backend, heads) in replay_deepmd_steps("sf_steps", "sf_pre", test) {
        let (w, a) = (&heads[0], &heads[1]);
        assert_eq!(w.params, a.params, "{backend}: one fitting net");
        assert_ne!(w.case_embd, a.case_embd, "{backend}");
    }
}

/// Eight steps of DeePMD-kit's run of three tasks of which two (alloy, alloy2) share the
/// fitting net `fit` and water has its own (`pf_steps`, from the heads of `pf_pre`; the tasks
/// drawn alloy, alloy, water, alloy, alloy, alloy2 × 3): the same lcurve.out and every head's
/// parameters after the last step — the shared fitting net updated at the steps of either alloy
/// task, Adam counting those, water's at water's — DeePMD-kit's.
#[test]
fn eight_steps_of_a_fitting_net_shared_by_some_tasks_are_deepmd_kits() {
    let test = "eight_steps_of_a_fitting_net_shared_by_some_tasks_are_deepmd_kits";
    for (backend, heads) in replay_deepmd_steps("pf_steps", "pf_pre", test) {
        let [w, a, a2] = &heads[..] else {
            panic!("three heads")
        };
        let dlen = w.layout().descriptor_len();
        assert_eq!(a.params, a2.params, "{backend}: one fitting net");
        assert_eq!(w.params[..dlen], a.params[..dlen], "{backend}");
        assert_ne!(w.params[dlen..], a.params[dlen..], "{backend}");
    }
}

/// A new run of `pf_stats`: the alloy tasks' heads one parameter vector and water's fitting net
/// its own; each head's statistics, energy bias and case embedding DeePMD-kit's.
#[test]
fn a_new_run_sharing_a_fitting_net_among_some_tasks_is_deepmd_kits() {
    let t = train("pf_stats", "cpu", &[]);
    let heads: Vec<Model> = (tasks_of("pf_stats").iter())
        .map(|h| {
            let (mine, dp) = (head(t.path(), h), deepmd_head("pf_stats", h));
            assert_eq!(mine.case_embd, dp.case_embd, "{h}");
            assert_eq!(mine.davg, dp.davg, "{h}");
            assert!(rel_to_max(&mine.dstd, &dp.dstd) < 1e-13, "{h}");
            assert!(rel_to_max(&mine.bias, &dp.bias) < 1e-14, "{h}");
            mine
        })
        .collect();
    let dlen = heads[0].layout().descriptor_len();
    assert_eq!(heads[1].params, heads[2].params);
    assert_eq!(heads[0].params[..dlen], heads[1].params[..dlen]);
    assert_ne!(heads[0].params[dlen..], heads[1].params[dlen..]);
}

/// A new run whose tasks share the fitting net: one parameter vector in both heads, each
/// head's energy bias fitted on its own data and its case embedding DeePMD-kit's
/// (`sf_stats`, DeePMD-kit's run of 0 steps).
#[test]
fn a_new_shared_fitting_run_has_deepmd_kits_case_embeddings_and_biases() {
    let t = train("sf_stats", "cpu", &[]);
    let (w, a) = (head(t.path(), "water"), head(t.path(), "alloy"));
    assert_eq!(w.params, a.params);
    for (h, mine) in [("water", w), ("alloy", a)] {
        let dp = deepmd_head("sf_stats", h);
        assert_eq!(mine.case_embd, dp.case_embd, "{h}");
        assert_eq!(mine.davg, dp.davg, "{h}");
        assert!(rel_to_max(&mine.dstd, &dp.dstd) < 1e-13, "{h}");
        assert!(rel_to_max(&mine.bias, &dp.bias) < 1e-14, "{h}");
    }
    assert_eq!(
        (
            head(t.path(), "alloy").case_embd,
            head(t.path(), "water").case_embd
        ),
        (vec![1.0, 0.0], vec![0.0, 1.0])
    );
}

/// DeePMD-kit 3.2.0's dpmodel reads the `.yaml` dpw writes of each head of `sf_steps` (its
/// case embedding and dim_case_embd with it) and predicts what it predicts from its own file.
/// Needs `DPW_DEEPMD_PYTHON` (a Python with deepmd-kit); without it a visible skip, or a
/// failure under `DPW_REQUIRE_DEEPMD=1`, as tests/dpa1.rs's.
#[test]
fn deepmd_kit_reads_dpws_yaml_of_a_shared_fitting_head() {
    let tmp = TempDir::new().unwrap();
    for h in ["water", "alloy"] {
        let m = deepmd_head("sf_steps", h);
        assert_eq!(m.spec.fitting.dim_case_embd, 2);
        write_deepmd_yaml(&m, &tmp.path().join(format!("{h}.yaml"))).unwrap();
        let back = read_model(&tmp.path().join(format!("{h}.yaml"))).unwrap();
        assert_eq!(back, m, "{h}");
    }
    let script = r#"
import sys, numpy as np
from deepmd.dpmodel.utils.serialization import load_dp_model
from deepmd.dpmodel.model.base_model import BaseModel
root, tmp = sys.argv[1:3]
sysd = f"{root}/tests/data/multitask/water_f0"
coord = np.load(f"{sysd}/set.000/coord.npy").reshape(1, -1, 3)
box = np.load(f"{sysd}/set.000/box.npy").reshape(1, 3, 3)
atype = np.loadtxt(f"{sysd}/type.raw", dtype=int).reshape(1, -1)
for head in sys.argv[3:]:
    out = []
    for path in (f"{root}/tests/reference/multitask/sf_steps/model_{head}.yaml", f"{tmp}/{head}.yaml"):
        m = BaseModel.deserialize(load_dp_model(path)["model"])
        out.append(np.asarray(m(coord, atype, box)["atom_energy"]).ravel())
    print(head, float(np.abs(out[0] - out[1]).max()))
"#;
    common::deepmd_agrees(
        "deepmd_kit_reads_dpws_yaml_of_a_shared_fitting_head",
        script,
        &repo(""),
        tmp.path(),
        &["water", "alloy"],
    );
}

/// A shared fitting net that takes a frame parameter (`sf_fparam`: DeePMD-kit's fparam example
/// systems, one per task, model_prob 1 and 3): every head's fparam statistics are the tasks'
/// merged as DeePMD-kit merges them (the second task's sums weighted by 3 / 1), and its energy
/// bias its own task's.
#[test]
fn a_shared_fitting_nets_frame_parameter_statistics_are_merged_as_deepmd_kits() {
    let t = train("sf_fparam", "cpu", &[]);
    let (c, h) = (head(t.path(), "cold"), head(t.path(), "hot"));
    assert_eq!(c.params, h.params);
    for (name, mine) in [("cold", c), ("hot", h)] {
        let dp = deepmd_head("sf_fparam", name);
        let d = rel_to_max(&mine.fit_input_avg, &dp.fit_input_avg)
            .max(rel_to_max(&mine.fit_input_inv_std, &dp.fit_input_inv_std));
        eprintln!("{name}: fparam statistics off DeePMD-kit's by {d:.1e}");
        assert!(d < 1e-14, "{name}: {d:e}");
        assert!(rel_to_max(&mine.bias, &dp.bias) < 1e-13, "{name}");
        assert_eq!(mine.case_embd, dp.case_embd, "{name}");
    }
}

/// What dpw does not do with a shared fitting net, and a case embedding that cannot tell the
/// tasks apart, are said naming the key.
#[test]
fn shared_fitting_errors_name_the_key() {
    let good = json_file(&repo("tests/reference/multitask/sf_pre/input.json"));
    let c = parse(&good).unwrap();
    assert_eq!(
        c.fitting_keys,
        [Some("fit".to_string()), Some("fit".to_string())]
    );
    let own = good["model"]["shared_dict"]["fit"].clone();
    // A fitting net named by one task is that task's.
    let mut one = good.clone();
    one["model"]["model_dict"]["alloy"]["fitting_net"] = own.clone();
    assert_eq!(
        parse(&one).unwrap().fitting_keys,
        [Some("fit".into()), None]
    );
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/model/model_dict/water/fitting_net",
            json!("fit:1"),
            "shared level 1",
        ),
        (
            "/model/shared_dict/fit/dim_case_embd",
            json!(1),
            "dim_case_embd: 1 is fewer than the 2 tasks",
        ),
    ];
    refused_each(&good, cases);
    // Each task its own fitting net, with case embeddings of two widths.
    let mut bad = good.clone();
    for (h, dim) in [("water", 2), ("alloy", 3)] {
        bad["model"]["model_dict"][h]["fitting_net"] = own.clone();
        bad["model"]["model_dict"][h]["fitting_net"]["dim_case_embd"] = json!(dim);
    }
    let e = parse(&bad).unwrap_err();
    assert!(
        e.contains("model.model_dict.alloy.fitting_net.dim_case_embd: 3 differs"),
        "{e}"
    );
}

/// Reference case `case`'s run from the heads of `pre`, with a checkpoint every 4 steps, and
/// the same restarted from its checkpoint at step 4: the same lcurve.out lines and every head's
/// parameters at the end. The restarted run's folder.
fn restart_goes_on(case: &str, pre: &str) -> TempDir {
    let text = std::fs::read_to_string(repo(&format!(
        "tests/reference/multitask/{case}/input.json"
    )))
    .unwrap();
    let every4 = text.replace("\"save_freq\": 8", "\"save_freq\": 4");
    assert_ne!(every4, text);
    let whole = tree();
    std::fs::write(whole.path().join("input.json"), &every4).unwrap();
    let init = format!("tests/reference/multitask/{pre}/model.ckpt.pt");
    let (ok, log) = dpw_in(
        whole.path(),
        &["train", "input.json", "--init-model", &init],
    );
    assert!(ok, "{log}");
    let t = tree();
    std::fs::write(t.path().join("input.json"), &every4).unwrap();
    for f in ["model.ckpt-4", "lcurve.out"] {
        std::fs::copy(whole.path().join(f), t.path().join(f)).unwrap();
    }
    let (ok, log) = dpw_in(
        t.path(),
        &["train", "input.json", "--restart", "model.ckpt-4"],
    );
    assert!(ok, "{log}");
    let lines = |d: &Path| -> Vec<String> {
        (std::fs::read_to_string(d.join("lcurve.out"))
            .unwrap()
            .lines())
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
    };
    assert_eq!(lines(t.path()), lines(whole.path()));
    assert_eq!(lines(t.path()).len(), 8);
    for h in tasks_of(case) {
        let (a, b) = (head(t.path(), &h), head(whole.path(), &h));
        assert_eq!(a.params, b.params, "{case} {h}");
    }
    t
}

/// A run restarted from its checkpoint at step 4 ends where the run of 8 steps does, bit for
/// bit: every head's parameters, Adam's moments and step counts (the shared descriptor's and
/// each fitting net's), the batch streams and the task draw go on. (lcurve.out gets its header
/// again at the restart, as DeePMD-kit's.)
#[test]
fn a_restart_goes_on_as_the_run_would() {
    let t = restart_goes_on("mt_steps", "pre_mt");
    // A single-task input does not restart a multi-task checkpoint.
    let single = json!({
        "model": {"type_map": ["O", "H"], "descriptor": {"type": "se_e2_a", "sel": [8, 8], "rcut": 3.0, "neuron": [2], "axis_neuron": 1}, "fitting_net": {"neuron": [2]}},
        "training": {"training_data": {"systems": ["tests/data/multitask/water_f0"], "batch_size": 1}, "numb_steps": 1},
    });
    std::fs::write(t.path().join("single.json"), single.to_string()).unwrap();
    let (ok, log) = dpw_in(
        t.path(),
        &["train", "single.json", "--restart", "model.ckpt"],
    );
    assert!(!ok && log.contains("is a multi-task checkpoint"), "{log}");
}

/// The same of three tasks, two of which share a fitting net (`pf_steps`): the shared
/// fitting net's holder and its Adam count (the steps of the tasks sharing it) go on.
#[test]
fn a_restart_of_a_fitting_net_shared_by_some_tasks_goes_on() {
    restart_goes_on("pf_steps", "pf_pre");
}

/// `pf_stats`' tasks trained 8 steps from scratch with water's own fitting net narrower than the
/// one alloy and alloy2 share (heads of different lengths): the shared parts go between heads
/// by their own extents, and a restart at step 4 ends where the whole run does.
#[test]
fn fitting_nets_of_different_widths_share_by_their_own_extents() {
    let mut input = json_file(&repo("tests/reference/multitask/pf_stats/input.json"));
    input["model"]["model_dict"]["water"]["fitting_net"]["neuron"] = json!([4]);
    input["training"]["numb_steps"] = json!(8);
    input["training"]["save_freq"] = json!(4);
    let run = |dir: &Path, extra: &[&str]| {
        std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
        let mut args = vec!["train", "input.json"];
        args.extend(extra);
        let (ok, log) = dpw_in(dir, &args);
        assert!(ok, "{log}");
    };
    let whole = tree();
    run(whole.path(), &[]);
    let [w, a, a2] = ["water", "alloy", "alloy2"].map(|h| head(whole.path(), h));
    let dlen = w.layout().descriptor_len();
    assert!(w.params.len() < a.params.len());
    assert_eq!(w.params[..dlen], a.params[..dlen]);
    assert_eq!(a.params, a2.params);
    let t = tree();
    for f in ["model.ckpt-4", "lcurve.out"] {
        std::fs::copy(whole.path().join(f), t.path().join(f)).unwrap();
    }
    run(t.path(), &["--restart", "model.ckpt-4"]);
    for h in ["water", "alloy", "alloy2"] {
        assert_eq!(
            head(t.path(), h).params,
            head(whole.path(), h).params,
            "{h}"
        );
    }
}

/// `num_epoch_dict`: numb_steps = ceil(Σ_k e_k·B_k) and model_prob the shares e_k·B_k / Σ, as
/// DeePMD-kit's `resolve_model_prob_from_epochs` (B_k the batches of one epoch of task k: water
/// 80 frames of batch 1, alloy two systems of 15 drawn by their sizes, ceil(max 15 / ½) = 30).
#[test]
fn epochs_per_task_make_the_steps_and_the_draw() {
    let mut input = json_file(&repo("tests/reference/multitask/pre_mt/input.json"));
    let t = input["training"].as_object_mut().unwrap();
    t.remove("numb_steps");
    t.remove("model_prob");
    t.insert(
        "num_epoch_dict".into(),
        json!({"water": 0.05, "alloy": 0.1}),
    );
    t.insert("save_freq".into(), json!(100));
    let dir = tree();
    std::os::unix::fs::symlink(repo("examples"), dir.path().join("examples")).unwrap();
    std::fs::write(dir.path().join("input.json"), input.to_string()).unwrap();
    let (ok, log) = dpw_in(dir.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(ok, "{log}");
    // 0.05 × 80 + 0.1 × 30 = 7 steps, drawn 3 : 4 (the tasks as written back: alloy, water).
    assert!(
        log.contains("num_epoch_dict: numb_steps 7 (steps per task [3.0"),
        "{log}"
    );
    assert!(log.contains("model_prob [0.42857142857142"), "{log}");
    let lcurve = std::fs::read_to_string(dir.path().join("lcurve.out")).unwrap();
    assert_eq!(
        lcurve.lines().last().unwrap().split_whitespace().next(),
        Some("7")
    );
    let out = json_file(&dir.path().join("out.json"));
    assert_eq!(
        out["training"]["num_epoch_dict"],
        json!({"water": 0.05, "alloy": 0.1})
    );
    assert!(out["training"]
        .get("numb_steps")
        .is_none_or(|v| v.is_null()));
    let c = parse(&{
        let mut v = input.clone();
        v["training"]["numb_steps"] = json!(5);
        v
    });
    assert!(c
        .unwrap_err()
        .contains("mutually exclusive with training.numb_steps"));
}

/// A multi-task input fine-tuned (ft_mt_multitask: `dp --pt train input.json --finetune
/// pre_mt.pt`): `water` names a head and has no finetune_head, so it resumes that head as it
/// is; `alloy_ft` is fine-tuned from head `alloy` (finetune_head), its bias re-fitted on its
/// data. Each head is DeePMD-kit's start, tensor for tensor (the bias to 1e-8 eV: DeePMD-kit's
/// DPA-1 re-fits carry ~1e-10 of neighbour-list noise). --model-branch is refused, as there.
#[test]
fn a_multitask_finetune_starts_each_task_by_deepmd_kits_rules() {
    let t = tree();
    std::os::unix::fs::symlink(repo("examples"), t.path().join("examples")).unwrap();
    std::fs::copy(
        repo("tests/reference/multitask/ft_mt_multitask/input.json"),
        t.path().join("input.json"),
    )
    .unwrap();
    let pre = "tests/reference/multitask/pre_mt/model.ckpt.pt";
    let (ok, log) = dpw_in(
        t.path(),
        &[
            "train",
            "input.json",
            "--finetune",
            pre,
            "--model-branch",
            "alloy",
        ],
    );
    assert!(!ok && log.contains("finetune_head"), "{log}");
    let (ok, log) = dpw_in(t.path(), &["train", "input.json", "--finetune", pre]);
    assert!(ok, "{log}");
    for h in ["water", "alloy_ft"] {
        let (mine, dp) = (head(t.path(), h), deepmd_head("ft_mt_multitask", h));
        common::assert_deepmd_start(&mine, &dp, h);
        let test = "a_multitask_finetune_starts_each_task_by_deepmd_kits_rules";
        common::predicts_deepmd_energies(test, &mine, "ft_mt_multitask", Some(h));
    }
}

/// The davg/dstd rows of type `t` in every statistics block of `m`.
fn stat_rows(m: &Model, t: usize) -> Vec<f64> {
    let (nt, blocks) = (m.spec.ntypes(), m.spec.descriptor.stat_blocks());
    let k = m.davg.len() / (blocks * nt);
    (0..blocks)
        .flat_map(|b| {
            let at = (b * nt + t) * k;
            [&m.davg[at..at + k], &m.dstd[at..at + k]].concat()
        })
        .collect()
}

/// A multi-task input fine-tuned to an element the pretrained model lacks (ft_mt_mt_newtype:
/// pre_mt's O H Cu Ni Al and C; `water` resumes its head, `mol` is fine-tuned from head water on
/// the C4H3O1 molecule). Both heads hold one descriptor, DeePMD-kit's but for C's
/// type-embedding row (each draws it uniform in [0, 1)); C's davg/dstd are those of all the
/// tasks' data, DeePMD-kit's to 1e-15; the pretrained elements keep the pretrained statistics
/// (DeePMD-kit recomputes them from the new data, Cu, Ni and Al from none: spec §21.4); water's
/// bias is the pretrained head's; mol's is re-fitted with the statistics the model keeps, where
/// DeePMD-kit re-fitted with C's of the first task's data and then replaced them (its re-fit
/// reproduced from that start to 1e-8 eV).
#[test]
fn a_multitask_finetune_to_a_new_element_is_deepmd_kits_start() {
    let t = tree();
    std::os::unix::fs::symlink(repo("examples"), t.path().join("examples")).unwrap();
    let case = "tests/reference/multitask/ft_mt_mt_newtype";
    std::fs::copy(
        repo(&format!("{case}/input.json")),
        t.path().join("input.json"),
    )
    .unwrap();
    let pre = "tests/reference/multitask/pre_mt/model.ckpt.pt";
    let (ok, log) = dpw_in(t.path(), &["train", "input.json", "--finetune", pre]);
    assert!(ok && log.contains("new elements C"), "{log}");
    let pretrained = deepmd_head("pre_mt", "water");
    let [w, m] = ["water", "mol"].map(|h| head(t.path(), h));
    let dlen = w.layout().descriptor_len();
    assert_eq!(w.params[..dlen], m.params[..dlen]);
    assert_eq!((&w.davg, &w.dstd), (&m.davg, &m.dstd));
    let c = w.spec.type_map.iter().position(|e| e == "C").unwrap();
    let layout = w.layout();
    let tebd = layout.descriptor.tebd().unwrap();
    let c_row = tebd.w + c * tebd.dim..tebd.w + (c + 1) * tebd.dim;
    for (h, mine) in [("water", &w), ("mol", &m)] {
        let dp = deepmd_head("ft_mt_mt_newtype", h);
        assert_eq!(mine.spec, dp.spec, "{h}");
        for p in [&mine.params, &dp.params] {
            assert!(
                p[c_row.clone()].iter().all(|x| (0.0..1.0).contains(x)),
                "{h}"
            );
        }
        let mut same = mine.clone();
        same.params[c_row.clone()].copy_from_slice(&dp.params[c_row.clone()]);
        assert_eq!(same.params, dp.params, "{h}");
        let s = max_abs_diff(&stat_rows(mine, c), &stat_rows(&dp, c));
        eprintln!("{h}: C's davg/dstd off DeePMD-kit's by {s:.1e}");
        assert!(s <= 1e-15, "{h}: {s}");
        for e in 0..c {
            assert_eq!(
                stat_rows(mine, e),
                stat_rows(&pretrained, e),
                "{h} type {e}"
            );
        }
        assert_ne!(
            stat_rows(mine, 0),
            stat_rows(&dp, 0),
            "{h}: DeePMD-kit's O recomputed"
        );
    }
    let bias = json_file(&repo(&format!("{case}/bias.json")));
    let theirs = |h: &str| -> Vec<f64> {
        (w.spec.type_map.iter())
            .map(|e| bias["heads"][h]["out_bias_after"][e].as_f64().unwrap())
            .collect()
    };
    assert_eq!(w.bias, theirs("water"));
    // DeePMD-kit re-fitted mol's bias before it merged the statistics, with C's rows those of
    // the first task's data (water's: no C, so davg 0 and dstd 0.1): from that start, with its
    // C row, dpw's change-bias gives DeePMD-kit's bias.
    let mut deepmd_start = m.clone();
    deepmd_start.params[c_row.clone()]
        .copy_from_slice(&deepmd_head("ft_mt_mt_newtype", "mol").params[c_row.clone()]);
    deepmd_start.bias.clone_from(&w.bias);
    let k = m.davg.len() / m.spec.ntypes();
    deepmd_start.davg[c * k..(c + 1) * k].fill(0.0);
    deepmd_start.dstd[c * k..(c + 1) * k].fill(0.1);
    let refit = common::rebias_on_molecule(t.path(), &deepmd_start, "deepmd_start");
    let b = max_abs_diff(&refit.bias, &theirs("mol"));
    eprintln!("mol: the re-fit of DeePMD-kit's start off its bias by {b:.1e} eV");
    assert!(b <= 1e-8, "{b}");
    // dpw re-fits with the statistics the model keeps.
    let mut dpw_start = m.clone();
    dpw_start.bias.clone_from(&w.bias);
    let refit = common::rebias_on_molecule(t.path(), &dpw_start, "dpw_start");
    let b = max_abs_diff(&refit.bias, &m.bias);
    assert!(b <= 1e-9, "{b}");
}

/// An energy head and a dipole head on one shared descriptor (DPA-1 here; DeePMD-kit trains
/// such a model as it trains two energy heads): both train, lcurve.out has each head's columns,
/// and each frozen head holds the same descriptor beside its own fitting.
#[test]
fn an_energy_head_and_a_dipole_head_share_a_descriptor() {
    let mut input = json_file(&repo("tests/reference/multitask/mt_stats/input.json"));
    let dict = input["model"]["model_dict"].as_object_mut().unwrap();
    let mut dipole = dict.remove("alloy").unwrap();
    dipole["fitting_net"]["type"] = json!("dipole");
    dipole["atom_exclude_types"] = json!([1]);
    dict.insert("dipole".into(), dipole);
    let losses = input["loss_dict"].as_object_mut().unwrap();
    losses.remove("alloy");
    losses.insert(
        "dipole".into(),
        json!({"type": "tensor", "pref": 1.0, "pref_atomic": 1.0}),
    );
    let data = "tests/data/deepmd-kit/examples/water_tensor/dipole/training_data_reformat";
    let training = &mut input["training"];
    training["model_prob"] = json!({"water": 1.0, "dipole": 1.0});
    training["data_dict"]
        .as_object_mut()
        .unwrap()
        .remove("alloy");
    training["data_dict"]["dipole"] = json!({"training_data": {
        "systems": [format!("{data}/atomic_system"), format!("{data}/global_system")],
        "batch_size": 1}});
    training["numb_steps"] = json!(4);
    let t = tree();
    std::fs::write(t.path().join("input.json"), input.to_string()).unwrap();
    let (ok, log) = dpw_in(t.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(ok, "{log}");
    let lcurve = std::fs::read_to_string(t.path().join("lcurve.out")).unwrap();
    let header = lcurve.lines().next().unwrap();
    for column in ["rmse_e_trn_water", "rmse_local_dipole_trn_dipole"] {
        assert!(header.contains(column), "{header}");
    }
    let (water, dipole) = (head(t.path(), "water"), head(t.path(), "dipole"));
    assert!(dipole.spec.fitting.output.reads_rot());
    assert!(water.spec.fitting.output.is_ener());
    let dlen = water.layout().descriptor_len();
    assert_eq!(
        water.params[..dlen],
        dipole.params[..dlen],
        "one descriptor"
    );
}

//! Issue 57, item 6: every example input of DeePMD-kit's that dpw loads
//! (tests/data/deepmd-kit/examples.tsv says which) trains a step on its own data, as a user runs
//! it: from its folder, its `../data` in place, the input unchanged but for the length of the run.
//! The refusals of the others are tests/config_input.rs's.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use tempfile::TempDir;

use common::repo;

/// The examples dpw loads, by examples.tsv.
fn loadable() -> Vec<String> {
    let tsv = std::fs::read_to_string(repo("tests/data/deepmd-kit/examples.tsv")).unwrap();
    tsv.lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, outcome)| *outcome == "loads")
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Where each example folder's `../data` comes from in this repository: the same DeePMD-kit
/// data (examples/water is its water data; tests/data/nopbc holds one of its nopbc systems, and
/// tests/data/deepmd-kit/examples/{fparam,property}/data four frames of each of its fparam and
/// property systems, .../dos/data two of each of its DOS systems, .../water_tensor two frames of
/// each of its dipole and polarizability systems, .../water/dplr/train/data two of its DPLR
/// Wannier-centre system; all cut from DeePMD-kit bc902daf with numpy's `a[:n]`) or, for the
/// LMDB example, its own validation LMDB standing in for its training one too; and the pair
/// tables of water/zbl and water/d3 beside their inputs.
fn link_data(tree: &Path) {
    let link = |from: PathBuf, to: PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(from, to).unwrap();
    };
    for k in 0..4 {
        link(
            repo(&format!("examples/water/data_{k}")),
            tree.join(format!("water/data/data_{k}")),
        );
    }
    link(repo("tests/data/nopbc"), tree.join("nopbc/data"));
    for example in ["dos", "fparam", "property"] {
        link(
            repo(&format!("tests/data/deepmd-kit/examples/{example}/data")),
            tree.join(format!("{example}/data")),
        );
    }
    link(
        repo("tests/data/deepmd-kit/examples/water/dplr/train/data"),
        tree.join("water/dplr/train/data"),
    );
    for tensor in ["dipole", "polar"] {
        for set in ["training_data_reformat", "validation_data_reformat"] {
            let at = format!("water_tensor/{tensor}/{set}");
            link(
                repo(&format!("tests/data/deepmd-kit/examples/{at}")),
                tree.join(at),
            );
        }
    }
    for table in ["water/zbl/H2O_tab_potential.txt", "water/d3/dftd3.txt"] {
        link(
            repo(&format!("tests/data/deepmd-kit/examples/{table}")),
            tree.join(table),
        );
    }
    let lmdb = repo("tests/data/deepmd-kit/examples/lmdb_downsample_data/water_validation.lmdb");
    for name in ["water_training.lmdb", "water_validation.lmdb"] {
        link(lmdb.clone(), tree.join("lmdb_downsample_data").join(name));
    }
}

/// The input of `example` with a run of one step (one in a thousand epochs where it counts in
/// epochs, and a ten-thousandth of each task's in a multi-task one), each step shown and saved.
fn one_step(example: &str) -> Value {
    let path = repo("tests/data/deepmd-kit/examples").join(example);
    let mut input: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let training = input["training"].as_object_mut().unwrap();
    if training.contains_key("num_epoch") {
        training.insert("num_epoch".into(), json!(0.001));
    } else if let Some(Value::Object(epochs)) = training.get_mut("num_epoch_dict") {
        // A multi-task run of ceil(Σ epochs × batches per epoch) steps: one.
        for e in epochs.values_mut() {
            *e = json!(e.as_f64().unwrap() * 1e-4);
        }
    } else {
        // Under whichever of DeePMD-kit's names the example gives it (fparam's: stop_batch).
        for alias in ["stop_batch", "numb_step", "num_step", "num_steps"] {
            training.remove(alias);
        }
        training.insert("numb_steps".into(), json!(1));
    }
    training.insert("disp_freq".into(), json!(1));
    training.insert("save_freq".into(), json!(1));
    input
}

#[test]
fn deepmd_kits_loadable_examples_train_a_step_on_their_data() {
    let examples = loadable();
    assert!(examples.len() >= 12, "{examples:?}");
    let tree = TempDir::new().unwrap();
    link_data(tree.path());
    for example in &examples {
        let input_path = tree.path().join(example);
        let dir = input_path.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            &input_path,
            serde_json::to_string_pretty(&one_step(example)).unwrap(),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
            .current_dir(dir)
            .args(["train", input_path.file_name().unwrap().to_str().unwrap()])
            .args(["--backend", "cpu"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("panicked"),
            "{example}: {err}"
        );
        let lcurve = std::fs::read_to_string(dir.join("lcurve.out")).unwrap();
        let last = lcurve.lines().last().unwrap();
        assert_eq!(
            last.split_whitespace().next(),
            Some("1"),
            "{example}: {lcurve}"
        );
        std::fs::remove_file(dir.join("lcurve.out")).unwrap();
    }
}

//! `dpw test` end to end: DeePMD-kit's .yaml model reproduces its own predictions, and bad
//! inputs end with a clear message and a non-zero exit.
mod common;

use std::process::Command;

use common::*;

fn dpw(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(args)
        .output()
        .unwrap()
}

fn columns(path: &std::path::Path) -> Vec<Vec<f64>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect()
}

#[test]
fn reproduces_deepmd_predictions_from_its_yaml() {
    let (dir, mut rf) = (model_a_dir(), ref_frames());
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("detail");
    let out = dpw(&[
        "test",
        "-m",
        dir.join("model.yaml").to_str().unwrap(),
        "-s",
        repo("examples/water/data_0").to_str().unwrap(),
        "-n",
        "3",
        "-d",
        prefix.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("number of test data : 3") && report.contains("Force  RMSE"),
        "{report}"
    );
    let e = columns(&tmp.path().join("detail.e.out"));
    let want_e = npz_array(&mut rf.z, "energy");
    for f in 0..3 {
        assert!(
            (e[f][1] - want_e[[f]]).abs() < 1e-9,
            "frame {f}: {} vs {}",
            e[f][1],
            want_e[[f]]
        );
        assert!((e[f][0] - rf.energy_label[f]).abs() < 1e-9);
    }
    // Force rows are in dpw's (and DeePMD-kit's) type-sorted atom order.
    let frows = columns(&tmp.path().join("detail.f.out"));
    let want_f = npz_array(&mut rf.z, "force");
    let n = rf.atype.len();
    for f in 0..3 {
        let pred: Vec<f64> = frows[f * n..(f + 1) * n]
            .iter()
            .flat_map(|r| r[3..6].to_vec())
            .collect();
        assert!(max_abs_diff(&pred, &rf.sorted(&want_f, f)) < 1e-10);
    }
    let text = std::fs::read_to_string(tmp.path().join("detail.e.out")).unwrap();
    assert!(text
        .lines()
        .next()
        .unwrap()
        .ends_with("data_0: data_e pred_e"));
    assert!(
        text.lines().nth(1).unwrap().contains("e+04"),
        "C-style %.18e expected"
    );
}

#[test]
fn bad_inputs_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let garbage = tmp.path().join("junk.bin");
    std::fs::write(&garbage, b"not a model").unwrap();
    let yaml = model_a_dir().join("model.yaml");
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec!["test", "-m", "/nonexistent/model.yaml", "-s", "."],
            "does not exist",
        ),
        (
            vec!["test", "-m", garbage.to_str().unwrap(), "-s", "."],
            "junk.bin",
        ),
        (
            vec![
                "test",
                "-m",
                yaml.to_str().unwrap(),
                "-s",
                "/nonexistent/system",
            ],
            "/nonexistent/system",
        ),
    ];
    for (args, needle) in cases {
        let out = dpw(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

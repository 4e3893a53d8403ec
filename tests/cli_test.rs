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
    // dp test ends with the weighted average even over one system: the same lines again.
    let (system, average) = report
        .split_once("# ----------weighted average of errors-----------")
        .expect("a weighted average");
    assert!(average.contains("# number of systems : 1"), "{report}");
    let rmse = |text: &str| {
        text.lines()
            .find(|l| l.contains("Energy RMSE/Natoms"))
            .map(str::to_string)
    };
    assert_eq!(rmse(average), rmse(system), "{report}");
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

/// Trains (numb_steps 0: the initial model, cpu) `descriptor` on `systems` with `type_map` in
/// `dir`, and returns its checkpoint.
fn new_model(
    dir: &std::path::Path,
    type_map: &[&str],
    descriptor: serde_json::Value,
    systems: &[std::path::PathBuf],
) -> std::path::PathBuf {
    let mut input = tiny_water_input(serde_json::json!(systems), 0);
    input["model"]["type_map"] = serde_json::json!(type_map);
    input["model"]["descriptor"] = descriptor;
    common::train_cpu(dir, &input);
    dir.join("model.ckpt")
}

/// `dpw test` with `args` after `-m model -d prefix`; its report and its energies
/// (data_e, pred_e) per frame.
fn test_energies(
    model: &std::path::Path,
    prefix: &std::path::Path,
    args: &[&str],
    limits: Option<&str>,
) -> (String, Vec<Vec<f64>>) {
    let (m, p) = (model.to_str().unwrap(), prefix.to_str().unwrap());
    let mut all = vec!["test", "-m", m, "-d", p];
    all.extend(args);
    let out = match limits {
        None => dpw(&all),
        // A shell that sets the limits and execs dpw, so that they bind dpw alone.
        Some(l) => Command::new("sh")
            .env("RAYON_NUM_THREADS", "2")
            .env("MALLOC_ARENA_MAX", "2")
            .env("RUST_LOG", "info")
            .arg("-c")
            .arg(format!("ulimit {l} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_dpw"))
            .args(&all)
            .output()
            .unwrap(),
    };
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && !err.contains("panicked"),
        "{all:?}: {err}"
    );
    let e = columns(&std::path::PathBuf::from(format!("{p}.e.out")));
    (format!("{}{err}", String::from_utf8_lossy(&out.stdout)), e)
}

/// Issue 59: `dp test` evaluates mixed-type data (`deepmd/npy/mixed`) with a model whose
/// descriptor is not mixed-type, each frame with its own types; so does `dpw test`, a
/// composition at a time, each frame's energy that of the same frame in its own system.
#[test]
fn mixed_type_data_is_tested_with_any_model() {
    let tmp = tempfile::tempdir().unwrap();
    let alloy = repo("examples/alloy/data/train");
    let systems: Vec<_> = ["Cu65Ni32Al11_a", "Cu36Ni36Al36", "Cu27Ni54Al27"]
        .iter()
        .map(|s| alloy.join(s))
        .collect();
    let descriptor = serde_json::json!({"type": "se_e2_a", "sel": [24, 20, 16], "rcut": 4.0,
        "rcut_smth": 0.5, "neuron": [4, 8], "axis_neuron": 4, "seed": 1});
    let model = new_model(tmp.path(), &["Cu", "Ni", "Al"], descriptor, &systems);
    let mixed = repo("tests/data/mixed/alloy");
    let (report, got) = test_energies(
        &model,
        &tmp.path().join("mixed"),
        &["-s", mixed.to_str().unwrap(), "--backend", "cpu"],
        None,
    );
    assert!(report.contains("number of test data : 6"), "{report}");
    let mut want = Vec::new();
    for (k, s) in systems.iter().enumerate() {
        let prefix = tmp.path().join(format!("own{k}"));
        let args = ["-s", s.to_str().unwrap(), "-n", "2", "--backend", "cpu"];
        want.extend(test_energies(&model, &prefix, &args, None).1);
    }
    assert_eq!(got.len(), 6);
    for row in &got {
        let label = |w: &&Vec<f64>| (w[0] - row[0]).abs() <= 1e-6 * row[0].abs();
        let same = want.iter().find(label).unwrap_or_else(|| {
            panic!("no frame of the systems has the label of {row:?}: {want:?}")
        });
        assert!(
            (same[1] - row[1]).abs() <= 1e-10 * row[1].abs(),
            "{row:?} vs {same:?}"
        );
    }
}

/// Issue 59, defect 11: `dpw test` evaluates as many frames a call as fit, fewer where a call's
/// workspace cannot be had (here under a `ulimit -v` that holds one frame's and not three's),
/// with the numbers of a run that had the memory.
#[test]
fn test_evaluates_in_calls_that_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo("examples/water/data_0");
    // se_e3 rows are pairs of neighbours: 192 atoms × (8·16 + 8·8) pairs × (4·192 + 2)
    // values of its net, ~230 MB a frame with the adjoints of its output.
    let descriptor = serde_json::json!({"type": "se_e3", "sel": [8, 8], "rcut": 4.0,
        "rcut_smth": 0.5, "neuron": [192], "seed": 1});
    let model = new_model(
        tmp.path(),
        &["O", "H"],
        descriptor,
        std::slice::from_ref(&data),
    );
    let args = ["-s", data.to_str().unwrap(), "-n", "3", "--backend", "cpu"];
    let (_, want) = test_energies(&model, &tmp.path().join("whole"), &args, None);
    let limit = format!("-v {}", 1 << 20);
    let (log, got) = test_energies(&model, &tmp.path().join("pieces"), &args, Some(&limit));
    assert!(
        log.contains("cannot allocate") && log.contains("evaluating 1 frames a call"),
        "{log}"
    );
    assert_eq!(got, want);
}

/// Issue 57 item 3: `dpw test` on data without some labels reports what the labels there allow,
/// as `dp test` (find_energy / find_force 0: that error left out, the detail files written
/// with 0 for the missing label); data without any label is evaluated, said so, and exits 0 as
/// `dp test` does. tests/data/unlabelled/water is frames 0-3 of examples/water/data_3 without
/// labels; `energy_only` is data_3 without force.npy.
#[test]
fn data_without_labels_is_tested_for_what_it_has() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_a_dir().join("model.yaml");
    let energy_only = tmp.path().join("energy_only");
    copy_dir(&repo("examples/water/data_3"), &energy_only);
    std::fs::remove_file(energy_only.join("set.000/force.npy")).unwrap();
    let unlabelled = repo("tests/data/unlabelled/water");
    let run = |name: &str, systems: &[&std::path::Path]| {
        let mut args = vec!["-n", "4", "--backend", "cpu"];
        for s in systems {
            args.extend(["-s", s.to_str().unwrap()]);
        }
        let prefix = tmp.path().join(name);
        let (report, e) = test_energies(&model, &prefix, &args, None);
        let f = columns(&tmp.path().join(format!("{name}.f.out")));
        (report, e, f)
    };
    let metric = |report: &str, name: &str| -> Vec<String> {
        (report.lines())
            .filter(|l| l.starts_with(name))
            .map(String::from)
            .collect()
    };
    let (full, full_e, full_f) = run("full", &[&repo("examples/water/data_3")]);
    // The system's own lines, before the weighted average (which repeats them for one system).
    let own = |report: &str| {
        report
            .split("# ----------weighted average")
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(metric(&own(&full), "Force").len(), 2, "{full}");

    let (report, e, f) = run("energy_only", &[&energy_only]);
    assert_eq!(
        metric(&report, "Energy"),
        metric(&full, "Energy"),
        "{report}"
    );
    assert!(metric(&report, "Force").is_empty(), "{report}");
    assert_eq!(e, full_e);
    assert!(
        f.iter().all(|r| r[..3] == [0.0; 3]),
        "data_f of no label: 0"
    );
    assert_eq!(
        f.iter().map(|r| &r[3..]).collect::<Vec<_>>(),
        full_f.iter().map(|r| &r[3..]).collect::<Vec<_>>()
    );

    let (report, e, _) = run("none", &[&unlabelled]);
    assert!(report.contains("number of test data : 4"), "{report}");
    assert!(
        metric(&report, "Energy").is_empty() && metric(&report, "Force").is_empty(),
        "{report}"
    );
    assert!(
        report
            .contains("has no energy, force or virial labels (energy.npy, force.npy, virial.npy)"),
        "{report}"
    );
    assert!(e.iter().all(|r| r[0] == 0.0), "data_e of no label: 0");
    let pred = |rows: &[Vec<f64>]| rows.iter().map(|r| r[1]).collect::<Vec<_>>();
    assert_eq!(pred(&e), pred(&full_e));

    // The weighted average over both: the energy of the one system that has it, no force.
    let (report, _, _) = run("both", &[&energy_only, &unlabelled]);
    let average = &report[report.find("weighted average").expect("an average")..];
    assert_eq!(
        metric(average, "Energy"),
        metric(&own(&full), "Energy"),
        "{report}"
    );
    assert!(metric(average, "Force").is_empty(), "{report}");
}

//! Data-parallel training over MPI (feature `mpi`): the real binary under
//! `mpirun --allow-run-as-root --oversubscribe -np 2`, on the water data with a tiny model.
//!
//! Without `mpirun` on PATH every test prints "SKIPPED: ..." and returns; DPW_REQUIRE_MPI=1 turns
//! that skip into a failure (for CI, which installs openmpi-bin).
#![cfg(feature = "mpi")]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dpw::model::file::{model_from_container, read_container};
use dpw::model::read_model_head;
use serde_json::{json, Value};

/// One MPI job at a time: the machine may have two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn water() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water"))
}

fn sys(name: &str) -> String {
    water().join(name).display().to_string()
}

fn have_mpirun(test: &str) -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("DPW_REQUIRE_MPI").is_err(),
            "{test}: mpirun is not on PATH but DPW_REQUIRE_MPI is set"
        );
        // Straight to stderr (eprintln! is captured by the test harness): skips stay visible.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev)"
        );
    }
    ok
}

macro_rules! mpi_or_skip {
    ($name:expr) => {
        if !have_mpirun($name) {
            return;
        }
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    };
}

/// A tiny se_e2_a model on the water data: a few ms per step.
fn tiny_input(numb_steps: usize, batch_size: usize, scale: &str) -> Value {
    json!({
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {"type": "se_e2_a", "sel": [20, 28], "rcut_smth": 0.5, "rcut": 4.0,
                           "neuron": [4, 8], "axis_neuron": 4, "type_one_side": true, "seed": 1},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5,
                          "scale_by_worker": scale},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1,
                 "start_pref_f": 1000, "limit_pref_f": 1, "start_pref_v": 0, "limit_pref_v": 0},
        "training": {
            "training_data": {"systems": [sys("data_0"), sys("data_1"), sys("data_2")],
                              "batch_size": batch_size},
            "validation_data": {"systems": [sys("data_3")], "batch_size": 2, "numb_btch": 1},
            "numb_steps": numb_steps, "seed": 10, "disp_freq": 5, "save_freq": 1000
        }
    })
}

fn write_input(dir: &Path, v: &Value) -> PathBuf {
    let p = dir.join("input.json");
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

fn dpw_exe() -> &'static str {
    env!("CARGO_BIN_EXE_dpw")
}

/// `mpirun -np N dpw train input.json EXTRA...` in `dir`.
fn mpirun(dir: &Path, np: usize, extra: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .args(["-x", "RAYON_NUM_THREADS=1", "-x", "RUST_LOG=info"])
        .arg(dpw_exe())
        .args(["train", "input.json"])
        .args(extra)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// `dpw train input.json` in `dir`, one process.
fn one_rank(dir: &Path) -> Output {
    Command::new(dpw_exe())
        .args(["train", "input.json"])
        .env("RAYON_NUM_THREADS", "1")
        .current_dir(dir)
        .output()
        .unwrap()
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{what} panicked:\n{err}");
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn lcurve(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("lcurve.out")).unwrap()
}

fn params(dir: &Path) -> Vec<f64> {
    model_from_container(&read_container(&dir.join("model.ckpt")).unwrap())
        .unwrap()
        .params
}

#[test]
fn two_ranks_follow_one_rank_with_the_global_batch() {
    mpi_or_skip!("two_ranks_follow_one_rank_with_the_global_batch");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_input(a.path(), &tiny_input(20, 1, "none"));
    let out = ok(mpirun(a.path(), 2, &[]), "2 ranks × batch 1");
    write_input(b.path(), &tiny_input(20, 2, "none"));
    ok(one_rank(b.path()), "1 rank × batch 2");
    assert_eq!(lcurve(a.path()), lcurve(b.path()));
    let (pa, pb) = (params(a.path()), params(b.path()));
    assert_eq!(pa.len(), pb.len());
    let scale = pb.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (i, (x, y)) in pa.iter().zip(&pb).enumerate() {
        assert!(
            (x - y).abs() <= 1e-12 * scale.max(x.abs()),
            "parameter {i}: {x} (2 ranks) vs {y} (1 rank)"
        );
    }
    // The parameters moved (the comparison is not of two untrained models).
    let init = tempfile::tempdir().unwrap();
    write_input(init.path(), &tiny_input(0, 2, "none"));
    ok(
        Command::new(dpw_exe())
            .args(["train", "input.json"])
            .current_dir(init.path())
            .output()
            .unwrap(),
        "0 steps",
    );
    assert_ne!(params(init.path()), pb);
    let err = stderr(&out);
    assert!(err.contains("world size:           2"), "{err}");
    assert!(err.contains("gradient all-reduce over 2 ranks"), "{err}");
    // Without a CUDA backend the path is host MPI, said once, without a warning.
    assert!(
        err.contains("gradient all-reduce: host MPI (the backend is not CUDA)"),
        "{err}"
    );
}

fn lr_at_step_1(dir: &Path) -> String {
    let text = lcurve(dir);
    let line = text.lines().find(|l| !l.starts_with('#')).unwrap();
    line.split_whitespace().last().unwrap().to_string()
}

#[test]
fn scale_by_worker_scales_the_printed_lr() {
    mpi_or_skip!("scale_by_worker_scales_the_printed_lr");
    for (scale, lr) in [
        ("linear", "2.0e-03"),
        ("sqrt", "1.4e-03"),
        ("none", "1.0e-03"),
    ] {
        let d = tempfile::tempdir().unwrap();
        write_input(d.path(), &tiny_input(1, 1, scale));
        let out = ok(mpirun(d.path(), 2, &[]), scale);
        assert_eq!(lr_at_step_1(d.path()), lr, "scale_by_worker {scale}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("(scale_by_worker {scale})")),
            "{scale}: {err}"
        );
    }
}

/// Only rank 0 writes: with each rank in its own working directory (MPMD `-wdir`), rank 1's
/// stays empty.
#[test]
fn only_rank_0_writes_files() {
    mpi_or_skip!("only_rank_0_writes_files");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let input = write_input(a.path(), &tiny_input(3, 1, "linear"));
    let input = input.to_str().unwrap();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe"])
        .args(["-x", "RAYON_NUM_THREADS=1"])
        .args(["-np", "1", "-wdir", a.path().to_str().unwrap()])
        .args([
            dpw_exe(),
            "train",
            input,
            "-l",
            "train.log",
            "-m",
            "workers",
        ])
        .arg(":")
        .args(["-np", "1", "-wdir", b.path().to_str().unwrap()])
        .args([
            dpw_exe(),
            "train",
            input,
            "-l",
            "train.log",
            "-m",
            "workers",
        ])
        .output()
        .unwrap();
    ok(out, "MPMD run");
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let na = names(a.path());
    for f in ["out.json", "lcurve.out", "model.ckpt", "model.ckpt-3"] {
        assert!(na.contains(&f.to_string()), "{f} missing from {na:?}");
    }
    // Rank 1 wrote its own log (workers mode with -l) and nothing else.
    assert_eq!(names(b.path()), ["train_1.log"]);
    assert!(na.contains(&"train_0.log".to_string()), "{na:?}");
}

#[test]
fn mpi_log_modes() {
    mpi_or_skip!("mpi_log_modes");
    let rank1 = "my rank:              1";
    let rank0 = "my rank:              0";

    // master: rank 0 alone; nothing from rank 1, no prefixes; -l gets rank 0's log.
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(5, 1, "linear"));
    let err = stderr(&ok(mpirun(d.path(), 2, &["-l", "train.log"]), "master"));
    assert!(err.contains(rank0) && !err.contains(rank1), "{err}");
    assert!(!err.contains("[1]") && !err.contains("[0]"), "{err}");
    let log = std::fs::read_to_string(d.path().join("train.log")).unwrap();
    assert!(
        log.contains(rank0) && log.contains("batch       5: trn"),
        "{log}"
    );
    assert!(!d.path().join("train_1.log").exists());

    // collect: every rank's lines, prefixed, printed (and logged) by rank 0.
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(5, 1, "linear"));
    let err = stderr(&ok(
        mpirun(d.path(), 2, &["-m", "collect", "-l", "train.log"]),
        "collect",
    ));
    for e in [
        &err,
        &std::fs::read_to_string(d.path().join("train.log")).unwrap(),
    ] {
        assert!(
            e.lines()
                .any(|l| l.starts_with("[1] ") && l.contains(rank1)),
            "{e}"
        );
        assert!(
            e.lines()
                .any(|l| l.starts_with("[0] ") && l.contains(rank0)),
            "{e}"
        );
        assert!(
            e.lines()
                .any(|l| l.starts_with("[1] ") && l.contains("batch       5: trn")),
            "{e}"
        );
    }

    // workers: each rank prints its own, prefixed; -l gives one file per rank.
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(5, 1, "linear"));
    let err = stderr(&ok(
        mpirun(d.path(), 2, &["-m", "workers", "-l", "train.log"]),
        "workers",
    ));
    assert!(
        err.lines()
            .any(|l| l.starts_with("[1] ") && l.contains(rank1)),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("[0] ") && l.contains(rank0)),
        "{err}"
    );
    let l1 = std::fs::read_to_string(d.path().join("train_1.log")).unwrap();
    assert!(l1.contains(rank1) && !l1.contains(rank0), "{l1}");
    let l0 = std::fs::read_to_string(d.path().join("train_0.log")).unwrap();
    assert!(l0.contains(rank0) && !l0.contains(rank1), "{l0}");
}

/// A copy of the first `nf` frames of water's data_3 (float32 .npy), with the cell of frame
/// `bad` zeroed.
fn system_with_a_bad_cell(dir: &Path, nf: usize, bad: usize) -> PathBuf {
    use ndarray::{s, Array2};
    use ndarray_npy::{read_npy, write_npy};
    let src = water().join("data_3");
    let dst = dir.join("bad_system");
    std::fs::create_dir_all(dst.join("set.000")).unwrap();
    for f in ["type.raw", "type_map.raw"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    for name in ["box", "coord", "energy", "force"] {
        let p = src.join("set.000").join(format!("{name}.npy"));
        let q = dst.join("set.000").join(format!("{name}.npy"));
        if name == "energy" {
            let a: ndarray::Array1<f32> = read_npy(&p).unwrap();
            write_npy(&q, &a.slice(s![..nf]).to_owned()).unwrap();
        } else {
            let mut a: Array2<f32> = read_npy(&p).unwrap();
            if name == "box" {
                a.row_mut(bad).fill(0.0);
            }
            write_npy(&q, &a.slice(s![..nf, ..]).to_owned()).unwrap();
        }
    }
    dst
}

/// A frame with a singular cell: every rank finds it when loading the data (before any
/// all-reduce), and the job ends at once, the frame named once.
#[test]
fn a_bad_frame_ends_the_job_at_load() {
    mpi_or_skip!("a_bad_frame_ends_the_job_at_load");
    let d = tempfile::tempdir().unwrap();
    let bad = system_with_a_bad_cell(d.path(), 2, 1);
    let mut input = tiny_input(50, 1, "linear");
    input["training"]["training_data"]["systems"] = json!([bad.display().to_string()]);
    input["training"]
        .as_object_mut()
        .unwrap()
        .remove("validation_data");
    write_input(d.path(), &input);
    let t = Instant::now();
    let out = mpirun(d.path(), 2, &[]);
    let took = t.elapsed();
    let err = stderr(&out);
    eprintln!("{took:?}\n{err}");
    assert!(!out.status.success(), "{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{err}");
    assert!(err.contains("frame 1: the cell (box.npy)"), "{err}");
    assert_eq!(err.matches("is singular").count(), 1, "{err}");
    assert!(err.contains("bad_system"), "{err}");
}

/// Rank 0 alone writes lcurve.out. A name it cannot write (a folder) is refused at start-up,
/// before the first all-reduce, by the output-path check every rank makes (issue 32); the job
/// must end at once, saying why.
#[test]
fn an_unwritable_lcurve_ends_the_job_at_start_up() {
    mpi_or_skip!("an_unwritable_lcurve_ends_the_job_at_start_up");
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("lcurve.out")).unwrap();
    write_input(d.path(), &tiny_input(50, 1, "linear"));
    let t = Instant::now();
    let out = mpirun(d.path(), 2, &[]);
    let took = t.elapsed();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{err}");
    assert!(err.contains("lcurve.out is a folder"), "{err}");
}

/// An error every rank meets (here a missing data folder) is reported once, by rank 0, and the
/// job exits non-zero without an abort.
#[test]
fn a_failure_on_all_ranks_is_reported_once() {
    mpi_or_skip!("a_failure_on_all_ranks_is_reported_once");
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(5, 1, "linear");
    input["training"]["training_data"]["systems"] = json!(["/nonexistent/data"]);
    write_input(d.path(), &input);
    let out = mpirun(d.path(), 2, &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("/nonexistent/data").count(), 1, "{err}");
}

/// A 2-rank run continued from its checkpoint comes out identical; and the checkpoint of a
/// 2-rank run can be continued by one rank (the batch stream carries on, only the global batch
/// is smaller).
#[test]
fn restart_under_mpi_and_with_another_rank_count() {
    mpi_or_skip!("restart_under_mpi_and_with_another_rank_count");
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(16, 1, "none");
    input["training"]["save_freq"] = json!(8);
    input["training"]["disp_freq"] = json!(2);
    write_input(d.path(), &input);
    ok(mpirun(d.path(), 2, &[]), "2 ranks, 16 steps");
    let first = lcurve(d.path());
    let p16 = params(d.path());
    std::fs::remove_file(d.path().join("model.ckpt-16")).unwrap();
    ok(
        mpirun(d.path(), 2, &["--restart", "model.ckpt-8"]),
        "2 ranks, restart",
    );
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(lines(&first), lines(&lcurve(d.path())));
    assert_eq!(p16, params(d.path()));

    std::fs::remove_file(d.path().join("model.ckpt-16")).unwrap();
    let out = ok(
        Command::new(dpw_exe())
            .args(["train", "input.json", "--restart", "model.ckpt-8"])
            .current_dir(d.path())
            .output()
            .unwrap(),
        "1 rank, restart of a 2-rank run",
    );
    let err = stderr(&out);
    assert!(!err.contains("new batch stream"), "{err}");
    let l = lines(&lcurve(d.path()));
    assert_eq!(l.len(), lines(&first).len());
    assert_eq!(l[..4], lines(&first)[..4]);
    assert_ne!(p16, params(d.path()));
}

/// A multi-task run (two tasks sharing the tiny descriptor) on 2 ranks × batch 1 ends where
/// 1 rank × batch 2 does: every rank draws rank 0's task sequence and the ranks all-reduce that
/// task's gradient, each head's parameters to 1e-12. (A display step's other-task columns are
/// rank 0's half batch there, so lcurve.out is not compared.)
#[test]
fn a_multitask_run_on_two_ranks_follows_one_rank() {
    mpi_or_skip!("a_multitask_run_on_two_ranks_follows_one_rank");
    let input = |bs: usize| {
        let single = tiny_input(12, bs, "none");
        json!({
            "model": {
                "shared_dict": {"tm": ["O", "H"], "d": single["model"]["descriptor"]},
                "model_dict": {
                    "a": {"type_map": "tm", "descriptor": "d", "data_stat_nbatch": 2,
                          "fitting_net": {"neuron": [8, 8], "seed": 2}},
                    "b": {"type_map": "tm", "descriptor": "d", "data_stat_nbatch": 2,
                          "fitting_net": {"neuron": [8, 8], "seed": 3}}
                }
            },
            "learning_rate": single["learning_rate"],
            "loss_dict": {"a": single["loss"], "b": single["loss"]},
            "training": {
                "model_prob": {"a": 1.0, "b": 2.0},
                "data_dict": {
                    "a": {"training_data": {"systems": [sys("data_0")], "batch_size": bs}},
                    "b": {"training_data": {"systems": [sys("data_1"), sys("data_2")],
                                            "batch_size": bs}}
                },
                "numb_steps": 12, "seed": 10, "disp_freq": 5, "save_freq": 1000
            }
        })
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_input(a.path(), &input(1));
    ok(mpirun(a.path(), 2, &[]), "2 ranks × batch 1");
    write_input(b.path(), &input(2));
    ok(one_rank(b.path()), "1 rank × batch 2");
    for h in ["a", "b"] {
        let head = |d: &Path| {
            read_model_head(&d.join("model.ckpt"), Some(h))
                .unwrap()
                .params
        };
        let (pa, pb) = (head(a.path()), head(b.path()));
        let scale = pb.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let worst = (pa.iter().zip(&pb))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1e-12 * scale, "head {h}: {worst:e}");
    }
}

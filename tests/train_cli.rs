//! `dpw train` / `dpw freeze` through the real binary on the water data with a tiny model:
//! lcurve.out format, reproducibility, restart, interruption by SIGKILL, bad inputs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dpw::model::file::{model_from_container, read_container};
use dpw::train::checkpoint::Checkpoint;
use serde_json::{json, Value};

fn water() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water"))
}

fn sys(name: &str) -> String {
    water().join(name).display().to_string()
}

/// A tiny se_e2_a model on the water data: a few ms per step.
fn tiny_input(numb_steps: usize) -> Value {
    json!({
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {"type": "se_e2_a", "sel": [20, 28], "rcut_smth": 0.5, "rcut": 4.0,
                           "neuron": [4, 8], "axis_neuron": 4, "type_one_side": true, "seed": 1},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1},
            "data_stat_nbatch": 2
        },
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1,
                 "start_pref_f": 1000, "limit_pref_f": 1, "start_pref_v": 0, "limit_pref_v": 0},
        "training": {
            "training_data": {"systems": [sys("data_0"), sys("data_1"), sys("data_2")],
                              "batch_size": "auto"},
            "validation_data": {"systems": [sys("data_3")], "batch_size": 2, "numb_btch": 2},
            "numb_steps": numb_steps, "seed": 10, "disp_freq": 1, "save_freq": 1000
        }
    })
}

fn write_input(dir: &Path, v: &Value) -> PathBuf {
    let p = dir.join("input.json");
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

fn dpw(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dpw"));
    c.current_dir(dir).env("RUST_LOG", "info");
    c
}

fn run(dir: &Path, args: &[&str]) -> Output {
    let out = dpw(dir).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "dpw panicked:\n{err}");
    out
}

fn run_ok(dir: &Path, args: &[&str]) -> Output {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "dpw {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn train(dir: &Path, input: &Value, extra: &[&str]) -> Output {
    write_input(dir, input);
    let mut args = vec!["train", "input.json"];
    args.extend_from_slice(extra);
    run_ok(dir, &args)
}

fn lcurve(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("lcurve.out")).unwrap()
}

fn data_lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.starts_with('#')).collect()
}

/// A `%11.2e` (or `%8.1e`) field: right-aligned, one digit, point, decimals, `e±dd`.
fn is_py_e(field: &str, width: usize, prec: usize) -> bool {
    if field.len() < width {
        return false;
    }
    let t = field.trim_start();
    if t == "nan" {
        return true;
    }
    let t = t.strip_prefix('-').unwrap_or(t);
    let Some((mant, exp)) = t.split_once('e') else {
        return false;
    };
    let mb = mant.as_bytes();
    let mant_ok = mb.len() == 2 + prec
        && mb[0].is_ascii_digit()
        && mb[1] == b'.'
        && mb[2..].iter().all(u8::is_ascii_digit);
    let eb = exp.as_bytes();
    mant_ok
        && (eb[0] == b'+' || eb[0] == b'-')
        && eb.len() >= 3
        && eb[1..].iter().all(u8::is_ascii_digit)
}

/// Checks one data line: `%7d`, then `ncols` × `"   %11.2e"`-style fields, then `"   %8.1e"`.
fn check_line(l: &str, step: usize, ncols: usize, pairs: bool) {
    assert_eq!(&l[..7], format!("{step:7}"), "step field of {l:?}");
    let mut rest = &l[7..];
    for _ in 0..ncols {
        let n = if pairs { 2 } else { 1 };
        assert!(rest.starts_with("   "), "{l:?}");
        rest = &rest[3..];
        for k in 0..n {
            if k == 1 {
                assert!(rest.starts_with(' '), "{l:?}");
                rest = &rest[1..];
            }
            assert!(
                is_py_e(&rest[..11], 11, 2),
                "field {:?} of {l:?}",
                &rest[..11]
            );
            rest = &rest[11..];
        }
    }
    assert!(rest.starts_with("   "), "{l:?}");
    assert!(is_py_e(&rest[3..], 8, 1), "lr field of {l:?}");
}

#[test]
fn lcurve_header_and_lines_have_deepmd_format() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(7);
    input["training"]["disp_freq"] = json!(3);
    train(d.path(), &input, &[]);
    let text = lcurve(d.path());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "# step       rmse_val    rmse_trn    rmse_e_val  rmse_e_trn    rmse_f_val  rmse_f_trn   lr      "
    );
    assert_eq!(
        lines[1],
        "# If there is no available reference data, rmse_*_{val,trn} will print nan"
    );
    assert_eq!(lines.len(), 5, "{text}");
    for (l, step) in lines[2..].iter().zip([1, 3, 6]) {
        check_line(l, step, 3, true);
    }
    assert!(text.ends_with('\n'));
    // out.json: the expanded input with the sel list.
    let out: Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("out.json")).unwrap()).unwrap();
    assert_eq!(out["model"]["descriptor"]["sel"], json!([20, 28]));
    assert_eq!(out["training"]["disp_freq"], json!(3));

    // Without validation data only _trn columns; an active virial term without virial labels
    // shows nan.
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(2);
    input["training"]["validation_data"] = Value::Null;
    input["loss"]["start_pref_v"] = json!(1.0);
    input["loss"]["limit_pref_v"] = json!(1.0);
    train(d.path(), &input, &[]);
    let text = lcurve(d.path());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "# step       rmse_trn    rmse_e_trn    rmse_f_trn    rmse_v_trn   lr      "
    );
    for (l, step) in lines[2..].iter().zip([1, 2]) {
        check_line(l, step, 4, false);
        assert!(l.contains("        nan"), "{l}");
    }
}

#[test]
fn same_seed_gives_identical_output() {
    let mut input = tiny_input(6);
    // Exercise the options dpw implements beyond the defaults.
    input["learning_rate"]["warmup_steps"] = json!(2);
    input["learning_rate"]["smooth"] = json!(true);
    input["loss"]["intensive_ener_virial"] = json!(true);
    input["training"]["gradient_max_norm"] = json!(5.0);
    input["model"]["descriptor"]["sel"] = json!("auto");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    train(a.path(), &input, &[]);
    train(b.path(), &input, &[]);
    let la = lcurve(a.path());
    assert_eq!(data_lines(&la).len(), 6);
    assert_eq!(la, lcurve(b.path()));
    let ca = std::fs::read(a.path().join("model.ckpt-6")).unwrap();
    assert_eq!(ca, std::fs::read(b.path().join("model.ckpt-6")).unwrap());
    // Another seed, another run.
    let c = tempfile::tempdir().unwrap();
    input["training"]["seed"] = json!(11);
    train(c.path(), &input, &[]);
    assert_ne!(la, lcurve(c.path()));
}

/// A descriptor and a fitting net of two precisions (DeePMD-kit's `water_multi_task` example:
/// a float32 DPA-3, the fitting net at its float64 default), or a hybrid's parts, train as the
/// float64 model, with a warning naming the keys; out.json keeps them as given.
#[test]
fn mixed_precisions_train_in_float64() {
    let input = tiny_input(3);
    let mut mixed = input.clone();
    mixed["model"]["descriptor"]["precision"] = json!("float32");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    train(a.path(), &input, &[]);
    let out = train(b.path(), &mixed, &[]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains(
            "model.descriptor.precision (float32), model.fitting_net.precision (float64) differ"
        ) && log.contains("float64"),
        "{log}"
    );
    assert_eq!(lcurve(a.path()), lcurve(b.path()));
    let expanded: Value =
        serde_json::from_str(&std::fs::read_to_string(b.path().join("out.json")).unwrap()).unwrap();
    assert_eq!(expanded["model"]["descriptor"]["precision"], "float32");
    // A hybrid's parts of two precisions, likewise.
    let part = input["model"]["descriptor"].clone();
    let mut hybrid = input.clone();
    hybrid["model"]["descriptor"] = json!({"type": "hybrid", "list": [part.clone(), part]});
    let mut mixed = hybrid.clone();
    mixed["model"]["descriptor"]["list"][1]["precision"] = json!("float32");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    train(a.path(), &hybrid, &[]);
    let out = train(b.path(), &mixed, &[]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("model.descriptor.list[1].precision (float32)"),
        "{log}"
    );
    assert_eq!(lcurve(a.path()), lcurve(b.path()));
}

fn ckpt(path: &Path) -> Checkpoint {
    Checkpoint::read(path).unwrap()
}

fn assert_same_state(a: &Checkpoint, b: &Checkpoint) {
    assert_eq!(a.step, b.step);
    let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&a.model.params) == bits(&b.model.params),
        "parameters differ"
    );
    assert!(bits(&a.adam_m) == bits(&b.adam_m), "Adam m differs");
    assert!(bits(&a.adam_v) == bits(&b.adam_v), "Adam v differs");
}

#[test]
fn restart_continues_bit_for_bit() {
    for precision in ["float64", "float32"] {
        let mut input = tiny_input(8);
        input["training"]["save_freq"] = json!(4);
        input["model"]["descriptor"]["precision"] = json!(precision);
        input["model"]["fitting_net"]["precision"] = json!(precision);
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        train(a.path(), &input, &[]);
        // The same run, continued from its step-4 checkpoint: lines 5..8 and the final state
        // must come out identical.
        train(b.path(), &input, &[]);
        let first = lcurve(b.path());
        std::fs::remove_file(b.path().join("model.ckpt-8")).unwrap();
        train(b.path(), &input, &["--restart", "model.ckpt-4"]);
        let la = lcurve(a.path());
        let lb = lcurve(b.path());
        assert_eq!(first, la);
        assert_eq!(data_lines(&la), data_lines(&lb), "{precision}");
        // DeePMD-kit appends on restart, header included.
        assert_eq!(lb.matches("# step").count(), 2);
        let (ca, cb) = (
            ckpt(&a.path().join("model.ckpt")),
            ckpt(&b.path().join("model.ckpt")),
        );
        assert_same_state(&ca, &cb);
        assert_eq!(
            std::fs::read_link(b.path().join("model.ckpt")).unwrap(),
            PathBuf::from("model.ckpt-8")
        );
    }
}

#[test]
fn sigkill_during_checkpoints_leaves_a_loadable_one_and_restart_recovers() {
    let mut input = tiny_input(60);
    input["training"]["save_freq"] = json!(1);
    input["training"]["disp_freq"] = json!(3);
    input["training"]["disp_avg"] = json!(true);
    input["training"]["max_ckpt_keep"] = json!(3);
    let reference = tempfile::tempdir().unwrap();
    train(reference.path(), &input, &[]);

    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &input);
    let link = d.path().join("model.ckpt");
    // The step model.ckpt points at (0 when there is none yet).
    let linked_step = || {
        std::fs::read_link(&link)
            .ok()
            .and_then(|t| {
                t.to_string_lossy()
                    .strip_prefix("model.ckpt-")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0usize)
    };
    let mut kills = 0;
    // Each run is killed a little after it has saved a new checkpoint, at varying offsets into
    // the step-and-save cycle (save_freq 1: most of the time is spent saving).
    for delay_us in [0u64, 1500, 3000, 5000, 8000, 13000, 21000] {
        let before = linked_step();
        let mut args = vec!["train", "input.json"];
        if before > 0 {
            args.extend(["--restart", "model.ckpt"]);
        }
        let mut child = dpw(d.path())
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while linked_step() <= before
            && child.try_wait().unwrap().is_none()
            && t.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_micros(500));
        }
        std::thread::sleep(Duration::from_micros(delay_us));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
            eprintln!(
                "killed {delay_us} µs after the save of step {}",
                linked_step()
            );
        }
        child.wait().unwrap();
        if link.exists() {
            let c = read_container(&link).unwrap_or_else(|e| {
                panic!("model.ckpt unreadable after a kill {delay_us} µs after a save: {e:#}")
            });
            model_from_container(&c).unwrap();
            Checkpoint::read(&link).unwrap();
        }
    }
    assert!(
        kills > 0,
        "the runs ended before any kill; make them longer"
    );
    // Finish the interrupted run: the same lcurve lines and final state as without kills.
    let mut args = vec!["train", "input.json"];
    if link.exists() {
        args.extend(["--restart", "model.ckpt"]);
    }
    run_ok(d.path(), &args);
    assert_eq!(
        data_lines(&lcurve(reference.path())),
        data_lines(&lcurve(d.path()))
    );
    assert_same_state(
        &ckpt(&reference.path().join("model.ckpt")),
        &ckpt(&d.path().join("model.ckpt")),
    );
    let numbered = std::fs::read_dir(d.path())
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n.to_string_lossy().starts_with("model.ckpt-")
        })
        .count();
    assert!(numbered <= 3, "max_ckpt_keep 3, found {numbered}");
}

#[test]
fn init_model_and_freeze() {
    let a = tempfile::tempdir().unwrap();
    train(a.path(), &tiny_input(3), &[]);
    // numb_steps 0 from --init-model: the saved model is the source's.
    let b = tempfile::tempdir().unwrap();
    let src = a.path().join("model.ckpt").display().to_string();
    train(b.path(), &tiny_input(0), &["--init-model", &src]);
    let (ma, mb) = (
        ckpt(&a.path().join("model.ckpt")),
        ckpt(&b.path().join("model.ckpt-0")),
    );
    assert_eq!(ma.model, mb.model);
    assert_eq!(mb.step, 0);
    // A new run from it starts at step 1 with a fresh optimizer.
    let c = tempfile::tempdir().unwrap();
    train(c.path(), &tiny_input(2), &["--init-model", &src]);
    let lc = lcurve(c.path());
    assert!(data_lines(&lc)[0].starts_with("      1 "), "{lc}");
    assert_eq!(ckpt(&c.path().join("model.ckpt")).step, 2);

    // freeze → a model file that dpw test reads.
    run_ok(
        a.path(),
        &["freeze", "-c", "model.ckpt", "-o", "frozen.dpw"],
    );
    let frozen =
        model_from_container(&read_container(&a.path().join("frozen.dpw")).unwrap()).unwrap();
    assert_eq!(frozen, ma.model);
    let out = run_ok(
        a.path(),
        &["test", "-m", "frozen.dpw", "-s", &sys("data_3"), "-n", "2"],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Force  RMSE"));
    // convert: to DeePMD-kit's yaml and back, bit for bit.
    run_ok(a.path(), &["convert", "model.ckpt", "model.yaml"]);
    run_ok(a.path(), &["convert", "model.yaml", "back.dpw"]);
    let back = model_from_container(&read_container(&a.path().join("back.dpw")).unwrap()).unwrap();
    assert_eq!(back, ma.model);
    run_ok(a.path(), &["freeze", "-c", ".", "-o", "frozen.yaml"]);
    assert_eq!(
        dpw::model::read_deepmd_yaml(&a.path().join("frozen.yaml")).unwrap(),
        ma.model
    );
    // A frozen model cannot be restarted from.
    let out = run(
        a.path(),
        &["train", "input.json", "--restart", "frozen.dpw"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--init-model"));
}

#[test]
fn bad_inputs_fail_cleanly_without_touching_outputs() {
    let set = |f: &dyn Fn(&mut Value)| {
        let mut v = tiny_input(3);
        f(&mut v);
        serde_json::to_string_pretty(&v).unwrap()
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("malformed JSON", "{\"model\": {".into(), "malformed JSON"),
        (
            "unknown key",
            set(&|v| v["model"]["descriptor"]["nueron"] = json!([4])),
            "unknown key 'nueron'",
        ),
        (
            "missing system folder",
            set(&|v| v["training"]["training_data"]["systems"] = json!(["/nonexistent/data_9"])),
            "does not exist",
        ),
        (
            "batch_size 0",
            set(&|v| v["training"]["training_data"]["batch_size"] = json!(0)),
            "batch_size",
        ),
        (
            "numb_steps negative",
            set(&|v| v["training"]["numb_steps"] = json!(-5)),
            "numb_steps",
        ),
        (
            "disp_freq 0",
            set(&|v| v["training"]["disp_freq"] = json!(0)),
            "disp_freq",
        ),
        (
            "unsupported descriptor",
            set(&|v| v["model"]["descriptor"]["type"] = json!("se_a_mask")),
            "not supported",
        ),
        (
            "DPA-1 with a key it refuses",
            set(&|v| {
                v["model"]["descriptor"]["type"] = json!("se_atten_v2");
                v["model"]["descriptor"]["attn_mask"] = json!(true);
            }),
            "attn_mask",
        ),
        (
            "relative_f",
            set(&|v| v["loss"]["relative_f"] = json!(0.1)),
            "relative_f",
        ),
    ];
    let d = tempfile::tempdir().unwrap();
    let sentinels = ["out.json", "lcurve.out", "model.ckpt", "model.ckpt-3"];
    for s in sentinels {
        std::fs::write(d.path().join(s), format!("sentinel {s}")).unwrap();
    }
    let check = |what: &str, args: &[&str], expect: &str| {
        let out = run(d.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: succeeded");
        assert!(
            err.contains(expect),
            "{what}: expected {expect:?} in\n{err}"
        );
        for s in sentinels {
            assert_eq!(
                std::fs::read_to_string(d.path().join(s)).unwrap(),
                format!("sentinel {s}"),
                "{what}: {s} changed"
            );
        }
    };
    for (what, text, expect) in &cases {
        std::fs::write(d.path().join("input.json"), text).unwrap();
        check(what, &["train", "input.json"], expect);
    }
    check("missing input", &["train", "nothere.json"], "nothere.json");
    std::fs::write(
        d.path().join("input.json"),
        serde_json::to_string(&tiny_input(3)).unwrap(),
    )
    .unwrap();
    check(
        "restart from a missing checkpoint",
        &["train", "input.json", "--restart", "gone.ckpt"],
        "does not exist",
    );
    check(
        "restart from a damaged checkpoint",
        &["train", "input.json", "--restart", "model.ckpt"],
        "not a dpw model or checkpoint",
    );
}

#[test]
fn restart_with_more_steps_or_other_data() {
    let d = tempfile::tempdir().unwrap();
    train(d.path(), &tiny_input(2), &[]);
    // More steps on the same data: continues (the lr schedule follows the new numb_steps).
    let out = train(d.path(), &tiny_input(4), &["--restart", "model.ckpt"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("new batch stream"));
    assert_eq!(ckpt(&d.path().join("model.ckpt")).step, 4);
    // Other data: a new batch stream, with a warning.
    let mut input = tiny_input(6);
    input["training"]["training_data"]["systems"] = json!([sys("data_0"), sys("data_2")]);
    let out = train(d.path(), &input, &["--restart", "model.ckpt"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("new batch stream"));
    let lc = lcurve(d.path());
    let steps: Vec<&str> = data_lines(&lc).iter().map(|l| &l[..7]).collect();
    assert_eq!(
        steps,
        ["      1", "      2", "      3", "      4", "      5", "      6"]
    );
    // A different model is refused.
    let mut input = tiny_input(8);
    input["model"]["fitting_net"]["neuron"] = json!([8, 16]);
    write_input(d.path(), &input);
    let out = run(
        d.path(),
        &["train", "input.json", "--restart", "model.ckpt"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("model.fitting_net.neuron"));
}

/// `numb_epoch` in place of `numb_steps`: the steps DeePMD-kit 3.2.0 makes of it. On these
/// systems (80, 160 and 80 frames, one per batch, drawn by size) `dp --pt train` logs
/// "Computed num_steps=4 from num_epoch=0.01 and total_numb_batch=320".
#[test]
fn numb_epoch_gives_deepmd_kits_steps() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(0);
    let training = input["training"].as_object_mut().unwrap();
    training.remove("numb_steps");
    training.insert("num_epoch".into(), json!(0.01));
    let out = train(d.path(), &input, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("numb_steps 4: numb_epoch 0.01 of 320 batches"),
        "{err}"
    );
    assert_eq!(
        data_lines(&lcurve(d.path())).last().unwrap()[..7].trim(),
        "4"
    );
    // out.json keeps what was given, as DeePMD-kit would read it back.
    let out_json: Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("out.json")).unwrap()).unwrap();
    assert_eq!(out_json["training"]["numb_epoch"], json!(0.01));
    assert!(out_json["training"].get("numb_steps").is_none());

    // Both, or neither: refused naming the keys.
    for (steps, epochs, says) in [
        (
            Some(5),
            Some(1.0),
            "give numb_steps or numb_epoch, not both",
        ),
        (None, None, "numb_epoch"),
    ] {
        let mut input = tiny_input(0);
        let training = input["training"].as_object_mut().unwrap();
        training.remove("numb_steps");
        if let Some(s) = steps {
            training.insert("numb_steps".into(), json!(s));
        }
        if let Some(e) = epochs {
            training.insert("numb_epoch".into(), json!(e));
        }
        write_input(d.path(), &input);
        let out = run(d.path(), &["train", "input.json"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
    }
}

/// `model.type_map` left out: the names come from the training systems' type_map.raw, as
/// DeePMD-kit's TensorFlow backend takes them (the longest, the others agreeing with its start);
/// systems that disagree are refused naming the file; systems with none name their types by
/// index, `Type_0`, `Type_1`, … (DeePMD-kit's TensorFlow backend trains them by index, as its
/// fparam/train/input_aparam.json example does).
#[test]
fn type_map_from_the_data_when_not_given() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(1);
    input["model"].as_object_mut().unwrap().remove("type_map");
    let out = train(d.path(), &input, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            r#"model.type_map not given: ["O", "H"], from the training systems' type_map.raw"#
        ),
        "{err}"
    );
    let out_json: Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("out.json")).unwrap()).unwrap();
    assert_eq!(out_json["model"]["type_map"], json!(["O", "H"]));

    // A system whose type_map.raw begins otherwise, and systems without one.
    let swapped = d.path().join("swapped");
    common::copy_dir(&water().join("data_0"), &swapped);
    std::fs::write(swapped.join("type_map.raw"), "H\nO\n").unwrap();
    let bare = d.path().join("bare");
    common::copy_dir(&water().join("data_0"), &bare);
    std::fs::remove_file(bare.join("type_map.raw")).unwrap();
    let only = |systems: Value| {
        let mut input = input.clone();
        input["training"]["training_data"]["systems"] = systems;
        input["training"]
            .as_object_mut()
            .unwrap()
            .remove("validation_data");
        input
    };
    write_input(
        d.path(),
        &only(json!([sys("data_0"), swapped.display().to_string()])),
    );
    let out = run(d.path(), &["train", "input.json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("do not begin as"),
        "{err}"
    );

    let e = tempfile::tempdir().unwrap();
    let out = train(e.path(), &only(json!([bare.display().to_string()])), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no training system has a type_map.raw")
            && err.contains(r#"["Type_0", "Type_1"]"#),
        "{err}"
    );
    let out_json: Value =
        serde_json::from_str(&std::fs::read_to_string(e.path().join("out.json")).unwrap()).unwrap();
    assert_eq!(out_json["model"]["type_map"], json!(["Type_0", "Type_1"]));
    // A type.raw that is not indices: refused naming the file.
    std::fs::write(bare.join("type.raw"), "0\nO\n").unwrap();
    write_input(d.path(), &only(json!([bare.display().to_string()])));
    let out = run(d.path(), &["train", "input.json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("type.raw") && err.contains("\"O\""),
        "{err}"
    );
}

/// A fresh folder where no libcuda loads; where one does, the calling test's error path cannot
/// be reached: None, after saying it was skipped (the GPU tests are tests/backend_cuda.rs).
#[cfg(feature = "cuda")]
fn driverless_dir() -> Option<tempfile::TempDir> {
    // SAFETY: only tries to dlopen libcuda under its usual names.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        eprintln!("SKIPPED: {test}: a CUDA driver is present");
        return None;
    }
    Some(tempfile::tempdir().unwrap())
}

#[cfg(feature = "cuda")]
#[test]
fn backend_cuda_without_a_driver_fails_clearly_before_any_output() {
    let Some(d) = driverless_dir() else { return };
    write_input(d.path(), &tiny_input(1));
    let out = run(d.path(), &["train", "input.json", "--backend", "cuda"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "dpw succeeded without CUDA:\n{err}");
    assert!(err.contains("no CUDA driver found"), "{err}");
    assert!(!d.path().join("lcurve.out").exists());
    assert!(!d.path().join("model.ckpt").exists());
}

#[cfg(feature = "cuda")]
#[test]
fn backend_auto_without_a_driver_says_why_and_trains_elsewhere() {
    let Some(d) = driverless_dir() else { return };
    let out = train(d.path(), &tiny_input(1), &["--backend", "auto"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("auto backend: not cuda (no CUDA driver found"),
        "{err}"
    );
    assert!(
        err.contains("auto backend: wgpu") || err.contains("auto backend: cpu"),
        "{err}"
    );
    assert!(!data_lines(&lcurve(d.path())).is_empty());
}

/// The step `checkpoint saved to …model.ckpt-N` names in a log.
fn saved_step(log: &str) -> Option<usize> {
    let tail = log.rsplit("checkpoint saved to ").next()?;
    let name = tail.split_whitespace().next()?.trim_end_matches(';');
    name.rsplit("model.ckpt-").next()?.parse().ok()
}

#[cfg(unix)]
#[test]
fn sigint_and_sigterm_save_the_step_and_restart_bit_for_bit() {
    let mut input = tiny_input(600);
    input["training"]["disp_freq"] = json!(5);
    let reference = tempfile::tempdir().unwrap();
    train(reference.path(), &input, &[]);
    use std::os::unix::process::ExitStatusExt;
    for (sig, number) in [("INT", 2), ("TERM", 15)] {
        let d = tempfile::tempdir().unwrap();
        write_input(d.path(), &input);
        let log = d.path().join("stderr.log");
        let mut child = dpw(d.path())
            .args(["train", "input.json"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Signalled once training is under way (step 10 displayed).
        let t = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(120) {
            let lines = std::fs::read_to_string(d.path().join("lcurve.out")).unwrap_or_default();
            if data_lines(&lines).len() >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        let kill = Command::new("kill")
            .args([format!("-{sig}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let status = child.wait().unwrap();
        let err = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.signal(), Some(number), "SIG{sig}:\n{err}");
        assert!(!err.contains("panicked"), "{err}");
        let step = saved_step(&err).unwrap_or_else(|| panic!("no checkpoint named:\n{err}"));
        assert!((10..600).contains(&step), "step {step}");
        assert!(
            err.contains(&format!("interrupted by SIG{sig} after step {step}"))
                && err.contains(&format!("--restart ./model.ckpt-{step}")),
            "{err}"
        );
        assert_eq!(
            ckpt(&d.path().join(format!("model.ckpt-{step}"))).step,
            step
        );
        // Continued from it: the same lines and final state as the uninterrupted run.
        run_ok(
            d.path(),
            &[
                "train",
                "input.json",
                "--restart",
                &format!("model.ckpt-{step}"),
            ],
        );
        assert_eq!(
            data_lines(&lcurve(reference.path())),
            data_lines(&lcurve(d.path())),
            "SIG{sig}"
        );
        assert_same_state(
            &ckpt(&reference.path().join("model.ckpt")),
            &ckpt(&d.path().join("model.ckpt")),
        );
    }
}

#[test]
fn dp_train_options_and_neighbor_stat() {
    let d = tempfile::tempdir().unwrap();
    // `sel: "auto"` is made from the counts `dpw neighbor-stat` prints for the training
    // systems (DeePMD-kit's factor 1.1, rounded up to a multiple of 4).
    let out = run_ok(
        d.path(),
        &[
            "neighbor-stat",
            "-s",
            &sys("data_0"),
            "-s",
            &sys("data_1"),
            "-s",
            &sys("data_2"),
            "-r",
            "4.0",
            "-t",
            "O",
            "H",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let min_dist: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("min_nbor_dist: "))
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    assert!(min_dist > 0.5 && min_dist < 1.5, "{text}");
    let max: Vec<usize> = serde_json::from_str(
        text.lines()
            .find_map(|l| l.strip_prefix("max_nbor_size: "))
            .unwrap(),
    )
    .unwrap();
    let mut input = tiny_input(0);
    input["model"]["descriptor"]["sel"] = json!("auto");
    // -o names the expanded input; --skip-neighbor-stat refuses "auto".
    train(d.path(), &input, &["-o", "expanded.json"]);
    assert!(!d.path().join("out.json").exists());
    let expanded: Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("expanded.json")).unwrap())
            .unwrap();
    let want: Vec<usize> = max
        .iter()
        .map(|&c| 4 * ((c * 11 / 10).div_ceil(4)))
        .collect();
    assert_eq!(expanded["model"]["descriptor"]["sel"], json!(want));
    let out = run(d.path(), &["train", "input.json", "--skip-neighbor-stat"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--skip-neighbor-stat"),
        "{err}"
    );
    // Log lines to a pipe carry no colour codes.
    assert!(!err.contains('\u{1b}'), "{err:?}");

    // -t: a new run from a frozen DeePMD-kit yaml, bit for bit its parameters.
    let a = tempfile::tempdir().unwrap();
    train(a.path(), &tiny_input(3), &["--skip-neighbor-stat"]);
    run_ok(a.path(), &["freeze", "-o", "frozen.yaml"]);
    let frozen = a.path().join("frozen.yaml").display().to_string();
    let b = tempfile::tempdir().unwrap();
    train(b.path(), &tiny_input(0), &["-t", &frozen]);
    assert_eq!(
        ckpt(&b.path().join("model.ckpt-0")).model,
        ckpt(&a.path().join("model.ckpt")).model
    );
    let out = run(
        b.path(),
        &["train", "input.json", "-t", &frozen, "-i", &frozen],
    );
    assert!(!out.status.success());
}

#[test]
fn dpw_test_all_frames_searched_systems_and_virial_files() {
    let d = tempfile::tempdir().unwrap();
    train(d.path(), &tiny_input(0), &[]);
    let frames = |args: &[&str]| -> Vec<usize> {
        let out = run_ok(d.path(), args);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("# number of test data : "))
            .map(|n| n.parse().unwrap())
            .collect()
    };
    let data_3 = sys("data_3");
    // -n 0 is every frame, as in DeePMD-kit 3 (and the default).
    let all = frames(&["test", "-m", "model.ckpt", "-s", &data_3, "-n", "0"]);
    assert_eq!(all.len(), 1);
    assert!(all[0] > 2);
    assert_eq!(
        frames(&["test", "-m", "model.ckpt", "-s", &data_3, "-n", "100000"]),
        all
    );
    assert_eq!(frames(&["test", "-m", "model.ckpt", "-s", &data_3]), all);
    // A folder is searched for systems, as `dpw train` does.
    let searched = frames(&[
        "test",
        "-m",
        "model.ckpt",
        "-s",
        &water().display().to_string(),
        "-n",
        "1",
    ]);
    assert_eq!(searched, vec![1, 1, 1, 1]);
    // Data without virial labels: dp test's .v.out and .v_peratom.out all the same, with zeros
    // for the data and the predicted virial.
    let out = run_ok(
        d.path(),
        &[
            "test",
            "-m",
            "model.ckpt",
            "-s",
            &data_3,
            "-n",
            "2",
            "-d",
            "detail",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("Virial"), "{stdout}");
    for (suffix, scale) in [("v", 1.0), ("v_peratom", 192.0)] {
        let text = std::fs::read_to_string(d.path().join(format!("detail.{suffix}.out"))).unwrap();
        assert!(text.starts_with(&format!("# {data_3}: data_vxx")), "{text}");
        let rows: Vec<Vec<f64>> = data_lines(&text)
            .iter()
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(r.len(), 18);
            assert!(r[..9].iter().all(|&x| x == 0.0), "{r:?}");
            assert!(r[9..].iter().any(|&x| x != 0.0), "{r:?}");
        }
        if suffix == "v_peratom" {
            let v = std::fs::read_to_string(d.path().join("detail.v.out")).unwrap();
            let first: f64 = data_lines(&v)[0]
                .split_whitespace()
                .nth(9)
                .unwrap()
                .parse()
                .unwrap();
            assert!((rows[0][9] * scale - first).abs() <= 1e-12 * first.abs());
        }
    }
}

#[test]
fn wgpu_probe_under_auto_is_quiet_and_piped_logs_have_no_colour() {
    let d = tempfile::tempdir().unwrap();
    train(d.path(), &tiny_input(0), &[]);
    let out = dpw(d.path())
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .args([
            "test",
            "-m",
            "model.ckpt",
            "-s",
            &sys("data_3"),
            "-n",
            "1",
            "--backend",
            "auto",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
    // Not a terminal: no colour codes.
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

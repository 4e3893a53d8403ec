//! Bad inputs and faults a user can hit, through the real binary: each must end with a non-zero
//! exit (or succeed where the input is valid), no panic or abort, a message naming the culprit,
//! and no damaged file (issue 15).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::{ReadNpyExt, WriteNpyExt};
use serde_json::{json, Value};

mod common;

use common::{copy_dir, water, water_system};

/// A tiny model on water data_0 (`systems` replaces the training systems when given), one frame
/// a batch.
fn tiny_input(numb_steps: usize, systems: &[&Path]) -> Value {
    let systems: Vec<String> = if systems.is_empty() {
        vec![water().join("data_0").display().to_string()]
    } else {
        systems.iter().map(|p| p.display().to_string()).collect()
    };
    let mut input = common::tiny_water_input(json!(systems), numb_steps);
    input["model"]["data_stat_nbatch"] = json!(2);
    input["training"]["training_data"]["batch_size"] = json!(1);
    input
}

fn write_input(dir: &Path, v: &Value) {
    std::fs::write(
        dir.join("input.json"),
        serde_json::to_string_pretty(v).unwrap(),
    )
    .unwrap();
}

fn dpw(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dpw"));
    cmd.args(args);
    run(cmd, dir, args)
}

/// Runs dpw under the `ulimit` options `limits` (`-f 8`: POSIX sh counts 512-byte blocks),
/// which are set in a shell that then execs it, so that they bind dpw alone.
fn dpw_under(dir: &Path, limits: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("sh");
    // A virtual memory limit counts each thread's stack and malloc arena: fixed numbers of
    // both, whatever the machine's cores.
    cmd.env("RAYON_NUM_THREADS", "2")
        .env("MALLOC_ARENA_MAX", "2")
        .arg("-c")
        .arg(format!("ulimit {limits} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_dpw"))
        .args(args);
    run(cmd, dir, args)
}

fn run(mut cmd: Command, dir: &Path, args: &[&str]) -> Output {
    let out = cmd
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "dpw {args:?} panicked:\n{err}");
    assert!(
        !err.contains("memory allocation of"),
        "dpw {args:?} aborted:\n{err}"
    );
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = dpw(dir, args);
    assert!(
        out.status.success(),
        "dpw {args:?} failed:\n{}",
        stderr(&out)
    );
    out
}

/// Runs a command that must fail cleanly (exit 1, no abort) and returns its stderr, after
/// checking it names every one of `names`.
fn fails(dir: &Path, args: &[&str], names: &[&str]) -> String {
    failed(dpw(dir, args), args, names)
}

/// Checks that `out`, dpw's run with `args`, failed cleanly naming every one of `names`, and
/// returns its stderr.
fn failed(out: Output, args: &[&str], names: &[&str]) -> String {
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "dpw {args:?}:\n{err}");
    let last = err
        .lines()
        .rev()
        .find(|l| l.contains("ERROR"))
        .unwrap_or("");
    eprintln!("CASE dpw {} → exit 1: {}", args.join(" "), last.trim());
    for n in names {
        assert!(err.contains(n), "dpw {args:?}: {n:?} not in\n{err}");
    }
    err
}

/// [`fails`] for `dpw train input.json --backend cpu` (plus `extra`), which must be refused at
/// start-up, before the statistics are computed.
fn fails_at_start(dir: &Path, extra: &[&str], names: &[&str]) {
    let mut args = vec!["train", "input.json", "--backend", "cpu"];
    args.extend(extra);
    let err = fails(dir, &args, names);
    assert!(
        !err.contains("statistics over"),
        "refused before any work:\n{err}"
    );
}

/// The names in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// An npy file as f64, whatever its precision.
fn read_npy(p: &Path) -> ArrayD<f64> {
    let bytes = std::fs::read(p).unwrap();
    ArrayD::<f64>::read_npy(&bytes[..])
        .or_else(|_| ArrayD::<f32>::read_npy(&bytes[..]).map(|a| a.mapv(f64::from)))
        .unwrap()
}

fn write_npy(p: &Path, a: &ArrayD<f64>) {
    a.write_npy(std::fs::File::create(p).unwrap()).unwrap();
}

/// A copy of water data_0 in `dir`/name, with `edit` applied to each named array of set.000.
fn edited_system(dir: &Path, name: &str, edit: impl Fn(&str, &mut ArrayD<f64>)) -> PathBuf {
    let dst = dir.join(name);
    copy_dir(&water().join("data_0"), &dst);
    for f in ["coord", "box", "energy", "force"] {
        let p = dst.join("set.000").join(format!("{f}.npy"));
        let mut a = read_npy(&p);
        edit(f, &mut a);
        write_npy(&p, &a);
    }
    dst
}

/// Point 1: a model whose type_map has an element the data lack trains and tests (every op then
/// runs over an empty range of atoms).
#[test]
fn element_absent_from_the_data() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(3, &[]);
    input["model"]["type_map"] = json!(["O", "H", "C"]);
    input["model"]["descriptor"]["sel"] = json!([20, 28, 4]);
    write_input(d.path(), &input);
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    // An O-only system: the O rows of data_0.
    let o_only = d.path().join("o_only");
    copy_dir(&water().join("data_0"), &o_only);
    let types = std::fs::read_to_string(o_only.join("type.raw")).unwrap();
    let n_o = types.split_whitespace().filter(|t| *t == "0").count();
    std::fs::write(o_only.join("type.raw"), "0\n".repeat(n_o)).unwrap();
    for f in ["coord", "force"] {
        let p = o_only.join("set.000").join(format!("{f}.npy"));
        let a = read_npy(&p);
        let nf = a.shape()[0];
        let v: Vec<f64> = a.iter().copied().collect();
        let per = v.len() / nf;
        let kept: Vec<f64> = v.chunks(per).flat_map(|c| c[..3 * n_o].to_vec()).collect();
        write_npy(
            &p,
            &ArrayD::from_shape_vec(IxDyn(&[nf, 3 * n_o]), kept).unwrap(),
        );
    }
    let sys = o_only.display().to_string();
    ok(d.path(), &["freeze", "-o", "m.yaml"]);
    for model in ["model.ckpt", "m.yaml"] {
        let out = ok(
            d.path(),
            &[
                "test",
                "-m",
                model,
                "-s",
                &sys,
                "-n",
                "3",
                "--backend",
                "cpu",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Energy RMSE"), "{text}");
        assert!(!text.contains("nan"), "{text}");
    }
    // The H/O model of a fresh run on the O-only system too.
    let d2 = tempfile::tempdir().unwrap();
    write_input(d2.path(), &tiny_input(2, &[&o_only]));
    ok(d2.path(), &["train", "input.json", "--backend", "cpu"]);
}

/// Point 3: a second run in the same folder is refused, naming the first one's pid; the first
/// run's outputs are untouched.
#[test]
fn second_run_in_one_folder_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(1_000_000, &[]);
    input["training"]["disp_freq"] = json!(1000);
    write_input(d.path(), &input);
    let mut first = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(d.path())
        .args(["train", "input.json", "--backend", "cpu"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lock = d.path().join(".dpw-train.lock");
    let pid = first.id().to_string();
    let t = std::time::Instant::now();
    while std::fs::read_to_string(&lock).map_or(true, |s| s.trim() != pid) {
        assert!(
            t.elapsed().as_secs() < 60,
            "the first run never took its lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Wait for its lcurve.out header, then compare it before and after the refused run.
    while !std::fs::read_to_string(d.path().join("lcurve.out")).is_ok_and(|s| s.contains('\n')) {
        assert!(t.elapsed().as_secs() < 60, "no lcurve.out");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out_json = std::fs::read(d.path().join("out.json")).unwrap();
    fails_at_start(d.path(), &[], &["another dpw train", &format!("pid {pid}")]);
    assert_eq!(std::fs::read(d.path().join("out.json")).unwrap(), out_json);
    first.kill().unwrap();
    first.wait().unwrap();
    // The lock went with the process: the next run starts.
    write_input(d.path(), &tiny_input(2, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
}

/// Point 4: output paths are checked at start-up, before any statistics.
#[test]
fn bad_output_paths_fail_at_start() {
    let d = tempfile::tempdir().unwrap();
    for (key, value, names) in [
        (
            "save_ckpt",
            "ckpt/",
            &["training.save_ckpt", "names a folder"][..],
        ),
        (
            "save_ckpt",
            "nodir/model.ckpt",
            &["training.save_ckpt", "nodir", "does not exist"],
        ),
        (
            "disp_file",
            "nodir/lcurve.out",
            &["training.disp_file", "does not exist"],
        ),
    ] {
        let mut input = tiny_input(5, &[]);
        input["training"][key] = json!(value);
        input["training"]["save_freq"] = json!(2);
        write_input(d.path(), &input);
        fails_at_start(d.path(), &[], names);
    }
    assert_eq!(files_in(d.path()), ["input.json"], "nothing written");
}

/// Point 5: an npy header claiming more data than the file holds, a box in the wrong unit
/// and an absurd sel are named errors, not aborts.
#[test]
fn huge_claims_are_named_errors() {
    let d = tempfile::tempdir().unwrap();
    // coord.npy's header claims 1e11 frames.
    let sys = water_system(d.path(), "big_header");
    let p = sys.join("set.000/coord.npy");
    let mut bytes = std::fs::read(&p).unwrap();
    assert_eq!(bytes[8], 118, "a 128-byte v1 header");
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 576), }";
    let header = format!("{dict:<117}\n");
    bytes[10..128].copy_from_slice(header.as_bytes());
    std::fs::write(&p, &bytes).unwrap();
    write_input(d.path(), &tiny_input(2, &[&sys]));
    fails(
        d.path(),
        &["train", "input.json", "--backend", "cpu"],
        &["coord.npy", "99999999999", "truncated or damaged"],
    );

    // A box scaled by 1e-3 (nm typed as Å, say).
    let sys = edited_system(d.path(), "tiny_box", |f, a| {
        if f == "box" {
            a.mapv_inplace(|x| x * 1e-3);
        }
    });
    write_input(d.path(), &tiny_input(2, &[&sys]));
    fails(
        d.path(),
        &["train", "input.json", "--backend", "cpu"],
        &["tiny_box", "frame 0", "thick", "box.npy"],
    );

    // A thin cell of one atom passes the load but would need 10^5 periodic images.
    let sys = d.path().join("thin");
    std::fs::create_dir_all(sys.join("set.000")).unwrap();
    std::fs::write(sys.join("type.raw"), "0\n").unwrap();
    let arr = |shape: &[usize], v: Vec<f64>| ArrayD::from_shape_vec(IxDyn(shape), v).unwrap();
    write_npy(&sys.join("set.000/coord.npy"), &arr(&[1, 3], vec![0.0; 3]));
    write_npy(&sys.join("set.000/force.npy"), &arr(&[1, 3], vec![0.0; 3]));
    write_npy(&sys.join("set.000/energy.npy"), &arr(&[1], vec![-1.0]));
    let cell = vec![0.15, 0.0, 0.0, 0.0, 0.15, 0.0, 0.0, 0.0, 5.0];
    write_npy(&sys.join("set.000/box.npy"), &arr(&[1, 9], cell));
    let mut input = tiny_input(2, &[&sys]);
    input["model"]["descriptor"]["rcut"] = json!(6.0);
    write_input(d.path(), &input);
    fails(
        d.path(),
        &["train", "input.json", "--backend", "cpu"],
        &["thin", "frame 0", "periodic images", "limit"],
    );

    let mut input = tiny_input(2, &[]);
    input["model"]["descriptor"]["sel"] = json!([100000, 28]);
    write_input(d.path(), &input);
    fails(
        d.path(),
        &["train", "input.json", "--backend", "cpu"],
        &["model.descriptor.sel", "4096"],
    );
}

/// Point 6: frames no model can learn from are found at load, named by system, frame and
/// atoms, by `dpw train` and by `dpw test`.
#[test]
fn bad_frames_are_named_at_load() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(1, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let overlap = edited_system(d.path(), "overlap", |f, a| {
        if f == "coord" {
            // Atom 5 of frame 37 onto atom 4.
            for k in 0..3 {
                let x = a[[37, 12 + k]];
                a[[37, 15 + k]] = x + if k == 0 { 0.01 } else { 0.0 };
            }
        }
    });
    let flat = edited_system(d.path(), "flat", |f, a| {
        if f == "box" {
            for k in 6..9 {
                a[[12, k]] = 0.0;
            }
        }
    });
    for (sys, names) in [
        (
            &overlap,
            &["overlap", "frame 37", "atoms 4 and 5", "0.0100 Å"][..],
        ),
        (&flat, &["flat", "frame 12", "singular"]),
    ] {
        write_input(d.path(), &tiny_input(30, &[sys]));
        fails(
            d.path(),
            &["train", "input.json", "--backend", "cpu"],
            names,
        );
        let s = sys.display().to_string();
        let err = fails(
            d.path(),
            &["test", "-m", "model.ckpt", "-s", &s, "--backend", "cpu"],
            names,
        );
        assert!(!err.contains("nan"), "{err}");
    }
}

/// Point 8: a damaged checkpoint or model is refused by its checksum; a model file breaking
/// the model rules (here a negative rcut in a yaml) is refused like an input.json; a file of
/// an older dpw (no checksum) still loads.
#[test]
fn damaged_models_are_refused() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(2, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    ok(d.path(), &["freeze", "-o", "m.dpw"]);
    ok(d.path(), &["freeze", "-o", "m.yaml"]);
    let ckpt = std::fs::canonicalize(d.path().join("model.ckpt")).unwrap();
    let good = std::fs::read(&ckpt).unwrap();
    // A flipped byte in the last parameters.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 100] ^= 0x40;
    std::fs::write(d.path().join("bad.ckpt"), &bad).unwrap();
    fails(
        d.path(),
        &["train", "input.json", "--restart", "bad.ckpt"],
        &["bad.ckpt", "checksum"],
    );
    fails(
        d.path(),
        &["freeze", "-c", "bad.ckpt", "-o", "x.dpw"],
        &["bad.ckpt", "checksum"],
    );
    assert!(!d.path().join("x.dpw").exists());

    let yaml = std::fs::read_to_string(d.path().join("m.yaml")).unwrap();
    assert!(yaml.contains("rcut: 4.0"), "{yaml}");
    std::fs::write(
        d.path().join("neg.yaml"),
        yaml.replace("rcut: 4.0", "rcut: -6.0"),
    )
    .unwrap();
    let s = water().join("data_1").display().to_string();
    fails(
        d.path(),
        &["test", "-m", "neg.yaml", "-s", &s, "--backend", "cpu"],
        &["neg.yaml", "rcut", "-6"],
    );

    // dpw's files before the checksum: DPWFILE1, no trailer.
    let mut old = std::fs::read(d.path().join("m.dpw")).unwrap();
    old.truncate(old.len() - 4);
    old[..8].copy_from_slice(b"DPWFILE1");
    std::fs::write(d.path().join("old.dpw"), &old).unwrap();
    ok(d.path(), &["convert", "old.dpw", "old.yaml"]);
    assert_eq!(
        std::fs::read_to_string(d.path().join("old.yaml"))
            .unwrap()
            .lines()
            .filter(|l| !l.contains("time"))
            .collect::<Vec<_>>(),
        yaml.lines()
            .filter(|l| !l.contains("time"))
            .collect::<Vec<_>>()
    );
}

/// Point 9: freezing a checkpoint onto itself is refused and leaves it whole.
#[test]
fn freeze_onto_its_checkpoint_is_refused() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(2, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let before = std::fs::read(d.path().join("model.ckpt-2")).unwrap();
    for (c, o) in [
        ("model.ckpt", "model.ckpt"),
        ("model.ckpt-2", "model.ckpt-2"),
        ("model.ckpt", "model.ckpt-2"),
        (".", "model.ckpt"),
    ] {
        fails(
            d.path(),
            &["freeze", "-c", c, "-o", o],
            &["is the input", "itself"],
        );
    }
    fails(
        d.path(),
        &["convert", "model.ckpt", "model.ckpt-2"],
        &["is the input", "itself"],
    );
    assert_eq!(
        std::fs::read(d.path().join("model.ckpt-2")).unwrap(),
        before
    );
    ok(
        d.path(),
        &["train", "input.json", "--restart", "model.ckpt"],
    );
}

/// Point 10: temporary files of dead processes are removed at start; a live one's are not.
#[test]
fn stale_temp_files_are_removed() {
    let d = tempfile::tempdir().unwrap();
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let alive = std::process::id();
    let stale = [
        format!(".model.ckpt-19.tmp{dead}"),
        format!(".out.json.tmp{dead}"),
        format!(".model.ckpt.link{dead}"),
        format!(".lcurve.out.tmp{dead}"),
    ];
    let kept = [
        format!(".model.ckpt-3.tmp{alive}"),
        format!(".other.tmp{dead}"),
    ];
    for n in stale.iter().chain(&kept) {
        std::fs::write(d.path().join(n), b"partial").unwrap();
    }
    write_input(d.path(), &tiny_input(2, &[]));
    let out = ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let err = stderr(&out);
    for n in &stale {
        assert!(!d.path().join(n).exists(), "{n} not removed");
        assert!(err.contains(n.as_str()), "{n} not reported:\n{err}");
    }
    for n in &kept {
        assert!(d.path().join(n).exists(), "{n} removed");
    }
}

/// Point 11: a fixed sel below the data's neighbour count is warned about as dp train does.
#[test]
fn small_sel_is_warned_about() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(1, &[]);
    input["model"]["descriptor"]["sel"] = json!([4, 28]);
    write_input(d.path(), &input);
    let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
    assert!(
        err.contains("sel of type 0 (O) is not enough! The expected value is not less than"),
        "{err}"
    );
    assert!(err.contains("but you set it to 4"), "{err}");
    assert!(!err.contains("sel of type 1"), "{err}");
}

fn alloy() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/alloy/data/train"
    ))
}

/// The expanded input (`-o`, out.json's contents) of `dpw train` on `input`.
fn expanded(input: &Value) -> Value {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), input);
    ok(
        d.path(),
        &["train", "input.json", "--backend", "cpu", "-o", "exp.json"],
    );
    serde_json::from_str(&std::fs::read_to_string(d.path().join("exp.json")).unwrap()).unwrap()
}

/// A run of `numb_steps` of `descriptor` (tiny nets) on the training systems of the water
/// example (data_0..2) or of the alloy example (its four training systems).
fn input_with(descriptor: Value, on_alloy: bool, numb_steps: usize) -> Value {
    let systems: Vec<PathBuf> = match on_alloy {
        true => [
            "Cu65Ni32Al11_a",
            "Cu65Ni32Al11_b",
            "Cu36Ni36Al36",
            "Cu27Ni54Al27",
        ]
        .iter()
        .map(|s| alloy().join(s))
        .collect(),
        false => (0..3).map(|k| water().join(format!("data_{k}"))).collect(),
    };
    let systems: Vec<&Path> = systems.iter().map(PathBuf::as_path).collect();
    let mut input = tiny_input(numb_steps, &systems);
    input["model"]["descriptor"] = descriptor;
    if on_alloy {
        input["model"]["type_map"] = json!(["Cu", "Ni", "Al"]);
    }
    input
}

/// Issue 59, defect 3, and issue 57 item 5: `sel: "auto"` is DeePMD-kit 3.2.0's for every
/// descriptor family: per type (se_e2_a, se_e2_r, se_e3), and for the mixed-type se_atten and
/// se_atten_v2 the count of all types together (NeighborStat with mixed_type), not the sum of the
/// per-type maxima. The numbers are what DeePMD-kit 3.2.0's `update_sel` writes into the model on
/// the same data (scripts/make-reference/auto_sel.py prints them; its NeighborStat: water rcut 4
/// [16, 26], rcut 6 [38, 72], mixed 108; alloy rcut 5 [35, 30, 21], mixed 51). A hybrid's
/// sub-descriptors are refused "auto" by the config (DeePMD-kit resolves each at its own rcut).
#[test]
fn auto_sel_is_deepmd_kits() {
    let net = json!({"neuron": [4, 8], "rcut_smth": 0.5, "sel": "auto", "seed": 1});
    // "kind:R" asks for "auto:R".
    let with = |kind: &str, rcut: f64| {
        let mut d = net.clone();
        let (kind, ratio) = kind.split_once(':').unwrap_or((kind, ""));
        if !ratio.is_empty() {
            d["sel"] = json!(format!("auto:{ratio}"));
        }
        d["type"] = json!(kind);
        d["rcut"] = json!(rcut);
        if kind.starts_with("se_atten") {
            d["attn"] = json!(8);
            d["attn_layer"] = json!(1);
            d["tebd_dim"] = json!(4);
        }
        d
    };
    for (kind, rcut, on_alloy, want) in [
        ("se_e2_a", 6.0, false, json!([44, 80])),
        ("se_e2_r", 6.0, false, json!([44, 80])),
        ("se_e3", 4.0, false, json!([20, 28])),
        ("se_atten", 6.0, false, json!([120])),
        ("se_atten_v2", 6.0, false, json!([120])),
        ("se_e2_a:1.5", 6.0, false, json!([60, 108])),
        ("se_atten:1.5", 6.0, false, json!([164])),
        ("se_e2_a", 5.0, true, json!([40, 36, 24])),
        ("se_atten", 5.0, true, json!([56])),
        ("se_atten_v2", 5.0, true, json!([56])),
    ] {
        let out = expanded(&input_with(with(kind, rcut), on_alloy, 0));
        assert_eq!(
            out["model"]["descriptor"]["sel"], want,
            "{kind} rcut {rcut}"
        );
    }
}

/// Issue 57 item 5 (and 55): DPA-2's three lists and DPA-3's two each take "auto[:factor]",
/// counted at the list's own rcut over all types together, as DeePMD-kit 3.2.0's `update_sel`
/// does (scripts/make-reference/auto_sel.py, water data_0..2: DPA-2 repinit rcut 5 "auto" 76,
/// three-body rcut 3.5 "auto:1.25" 36, repformer rcut 4 "auto:1.3" 52; DPA-3 e_rcut 4.5 "auto"
/// 60, a_rcut 3 "auto:0.9" 16). out.json holds the numbers; before the count (an input's
/// expanded form) the lists stay "auto:<factor>".
#[test]
fn auto_sel_of_dpa2_and_dpa3_lists_is_deepmd_kits() {
    let dpa2 = json!({"type": "dpa2",
        "repinit": {"rcut": 5.0, "rcut_smth": 0.5, "nsel": "auto", "neuron": [4, 8],
                    "axis_neuron": 4, "use_three_body": true, "three_body_rcut": 3.5,
                    "three_body_rcut_smth": 0.5, "three_body_sel": "auto:1.25",
                    "three_body_neuron": [2, 4]},
        "repformer": {"rcut": 4.0, "rcut_smth": 0.5, "nsel": "auto:1.3", "nlayers": 1,
                      "g1_dim": 8, "g2_dim": 4, "axis_neuron": 4, "attn1_hidden": 4,
                      "attn1_nhead": 1, "attn2_hidden": 4, "attn2_nhead": 1}});
    let dpa3 = json!({"type": "dpa3",
        "repflow": {"n_dim": 8, "e_dim": 4, "a_dim": 4, "nlayers": 1, "e_rcut": 4.5,
                    "e_rcut_smth": 0.5, "e_sel": "auto", "a_rcut": 3.0, "a_rcut_smth": 0.5,
                    "a_sel": "auto:0.9", "axis_neuron": 2}});
    let dpa2_lists = [
        ("repinit", "nsel", "auto:1.1", 76),
        ("repinit", "three_body_sel", "auto:1.25", 36),
        ("repformer", "nsel", "auto:1.3", 52),
    ];
    let dpa3_lists = [
        ("repflow", "e_sel", "auto:1.1", 60),
        ("repflow", "a_sel", "auto:0.9", 16),
    ];
    for (descriptor, lists) in [(dpa2, &dpa2_lists[..]), (dpa3, &dpa3_lists[..])] {
        let input = input_with(descriptor, false, 0);
        let given = dpw::config::Config::from_value(&input, &common::repo("")).unwrap();
        let before = given.to_expanded_json();
        let out = expanded(&input);
        for &(block, key, auto, want) in lists {
            assert_eq!(
                before["model"]["descriptor"][block][key],
                json!(auto),
                "{key}"
            );
            assert_eq!(
                out["model"]["descriptor"][block][key],
                json!(want),
                "{block}.{key}"
            );
        }
    }
    // Without the neighbour statistics an "auto" list cannot be counted: refused by its key.
    let d = tempfile::tempdir().unwrap();
    let mut input = input_with(dpa3_numeric_e_sel(), false, 0);
    input["model"]["descriptor"]["repflow"]["a_sel"] = json!("auto");
    write_input(d.path(), &input);
    fails(
        d.path(),
        &["train", "input.json", "--skip-neighbor-stat"],
        &["model.descriptor.repflow.a_sel", "--skip-neighbor-stat"],
    );
}

/// Issue 57 item 5: a numeric sel of each DPA-2 and DPA-3 list below the data's count at its
/// rcut is warned about, list by list, as DeePMD-kit's `update_sel` warns
/// (scripts/make-reference/auto_sel.py, water data_0..2, all types together: DPA-2 repinit
/// rcut 5 67 > 60, three-body rcut 3.5 29 > 20, repformer rcut 4 39 > 30; DPA-3 e_rcut 4.5
/// 52 > 40, a_rcut 3 17 > 10). dpw warned of the main list only.
#[test]
fn small_sel_of_each_dpa2_and_dpa3_list_is_warned_about() {
    let mut dpa2 = json!({"type": "dpa2",
        "repinit": {"rcut": 5.0, "rcut_smth": 0.5, "nsel": 60, "neuron": [4, 8],
                    "axis_neuron": 4, "use_three_body": true, "three_body_rcut": 3.5,
                    "three_body_rcut_smth": 0.5, "three_body_sel": 20,
                    "three_body_neuron": [2, 4]},
        "repformer": {"rcut": 4.0, "rcut_smth": 0.5, "nsel": 30, "nlayers": 1,
                      "g1_dim": 8, "g2_dim": 4, "axis_neuron": 4, "attn1_hidden": 4,
                      "attn1_nhead": 1, "attn2_hidden": 4, "attn2_nhead": 1}});
    let mut dpa3 = dpa3_numeric_e_sel();
    dpa3["repflow"]["e_sel"] = json!(40);
    dpa3["repflow"]["a_sel"] = json!(10);
    let main = "sel (one list for all types)";
    let cases = [
        (
            dpa2.take(),
            vec![
                (main.to_string(), 67, 60),
                (
                    "repinit.three_body_sel (all types, rcut 3.5)".into(),
                    29,
                    20,
                ),
                ("repformer.nsel (all types, rcut 4)".into(), 39, 30),
            ],
        ),
        (
            dpa3.take(),
            vec![
                (main.to_string(), 52, 40),
                ("repflow.a_sel (all types, rcut 3)".into(), 17, 10),
            ],
        ),
    ];
    for (descriptor, want) in cases {
        let d = tempfile::tempdir().unwrap();
        write_input(d.path(), &input_with(descriptor, false, 0));
        let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
        let warned = err.lines().filter(|l| l.contains("is not enough!")).count();
        assert_eq!(warned, want.len(), "{err}");
        for (what, count, given) in want {
            let line = format!(
                "{what} is not enough! The expected value is not less than {count} (the most \
                 neighbours of all types together), but you set it to {given}."
            );
            assert!(err.contains(&line), "{line:?} not in\n{err}");
        }
    }
}

/// A small DPA-3 with a numeric e_sel.
fn dpa3_numeric_e_sel() -> Value {
    json!({"type": "dpa3", "repflow": {"n_dim": 8, "e_dim": 4, "a_dim": 4, "nlayers": 1,
        "e_rcut": 4.5, "e_rcut_smth": 0.5, "e_sel": 60, "a_rcut": 3.0, "a_rcut_smth": 0.5,
        "a_sel": 16, "axis_neuron": 2}})
}

/// Issue 59, defect 3: the sel warning of a mixed-type descriptor compares its one sel (nnei)
/// with the count of all types together, and names neither a type nor an element.
#[test]
fn small_mixed_sel_is_warned_about_as_one_list() {
    let d = tempfile::tempdir().unwrap();
    let descriptor = json!({"type": "se_atten_v2", "sel": 40, "rcut": 5.0, "rcut_smth": 0.5,
                            "neuron": [4, 8], "attn": 8, "attn_layer": 1, "tebd_dim": 4});
    write_input(d.path(), &input_with(descriptor, true, 0));
    let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
    assert!(
        err.contains(
            "sel (one list for all types) is not enough! The expected value is not less than 51"
        ) && err.contains("but you set it to 40"),
        "{err}"
    );
    assert!(!err.contains("sel of type"), "{err}");
}

/// Issue 57 item 5: DeePMD-kit's `update_sel` skips the warning for a sel of 0 (a type left out
/// on purpose), and checks each of a hybrid's sub-descriptors against the counts at its own rcut
/// (scripts/make-reference/auto_sel.py: water data_0..2, se_e2_a rcut 6 [0, 28] warns type 1
/// only, 72 > 28; a hybrid of se_e2_a rcut 6 [46, 92] and se_e2_r rcut 4 [10, 20] warns types
/// 0 and 1 of the se_e2_r, 16 > 10 and 26 > 20). dpw warned of the 0, and of no sub-descriptor.
#[test]
fn sel_warnings_skip_0_and_check_each_sub_descriptor_at_its_rcut() {
    let sub = |kind: &str, rcut: f64, sel: Value| json!({"type": kind, "sel": sel, "rcut": rcut, "rcut_smth": 0.5, "neuron": [4, 8]});
    let warnings = |descriptor: Value| {
        let d = tempfile::tempdir().unwrap();
        write_input(d.path(), &input_with(descriptor, false, 0));
        let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
        let lines: Vec<String> = (err.lines())
            .filter(|l| l.contains("is not enough!"))
            .map(|l| l[l.find("sel of").unwrap()..].to_string())
            .collect();
        lines
    };
    let tail = "The accuracy of your model may get worse.";
    assert_eq!(
        warnings(sub("se_e2_a", 6.0, json!([0, 28]))),
        [format!(
            "sel of type 1 (H) is not enough! The expected value is not less than 72, \
             but you set it to 28. {tail}"
        )]
    );
    let hybrid = json!({"type": "hybrid", "list": [
        sub("se_e2_a", 6.0, json!([46, 92])),
        sub("se_e2_r", 4.0, json!([10, 20])),
    ]});
    assert_eq!(
        warnings(hybrid),
        [(0, "O", 16, 10), (1, "H", 26, 20)].map(|(t, e, want, have)| format!(
            "sel of type {t} ({e}) in model.descriptor.list[1] (se_e2_r, rcut 4) is not \
             enough! The expected value is not less than {want}, but you set it to {have}. {tail}"
        ))
    );
}

/// Issue 57 item 5: `dpw neighbor-stat --mixed-type` (alias `--one-type`) prints the count of
/// all types together that se_atten's sel is made from, as `dp neighbor-stat --mixed-type` does
/// (scripts/make-reference/auto_sel.py: the alloy's training systems, rcut 5, Cu Ni Al:
/// min_nbor_dist 2.071108, max_nbor_size [35, 30, 21], with --mixed-type [51]).
#[test]
fn neighbor_stat_mixed_type_is_deepmd_kits() {
    let d = tempfile::tempdir().unwrap();
    let systems = alloy().display().to_string();
    let args = [
        "neighbor-stat",
        "-s",
        &systems,
        "-r",
        "5",
        "-t",
        "Cu",
        "Ni",
        "Al",
    ];
    let printed = |extra: &[&str]| {
        let args = [&args[..], extra].concat();
        String::from_utf8(ok(d.path(), &args).stdout).unwrap()
    };
    assert_eq!(
        printed(&[]),
        "min_nbor_dist: 2.071108\nmax_nbor_size: [35, 30, 21]\n"
    );
    for flag in ["--mixed-type", "--one-type"] {
        assert_eq!(
            printed(&[flag]),
            "min_nbor_dist: 2.071108\nmax_nbor_size: [51]\n"
        );
    }
}

/// Issue 57 item 3: `dpw neighbor-stat` reads data without energy or force labels, as
/// `dp neighbor-stat` does (its numbers on tests/data/unlabelled/water, DeePMD-kit 3.2.0: see
/// tests/data/README.md); training on such data is refused naming the system and the labels.
#[test]
fn neighbor_stat_reads_unlabelled_data_and_train_refuses_it() {
    let d = tempfile::tempdir().unwrap();
    let sys = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/unlabelled/water"
    ));
    let s = sys.display().to_string();
    let args = ["neighbor-stat", "-s", &s, "-r", "6", "-t", "O", "H"];
    let printed = |extra: &[&str]| {
        let args = [&args[..], extra].concat();
        String::from_utf8(ok(d.path(), &args).stdout).unwrap()
    };
    assert_eq!(
        printed(&[]),
        "min_nbor_dist: 0.897768\nmax_nbor_size: [35, 68]\n"
    );
    assert_eq!(
        printed(&["--mixed-type"]),
        "min_nbor_dist: 0.897768\nmax_nbor_size: [101]\n"
    );
    write_input(d.path(), &tiny_input(1, &[&sys]));
    let out = dpw(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "{s}: no set has energy.npy or force.npy: training needs energy and force labels"
        )),
        "{err}"
    );
}

/// Issue 59, defect 4: a sel with no neighbour slot at all (every entry 0) is refused at
/// start-up naming the key, for every descriptor and a hybrid's sub-descriptor, where se_atten_v2
/// panicked, se_e3 panicked and se_e2_r gave a NaN loss; `attn_layer: 0` (no attention layers,
/// which DeePMD-kit allows) trains.
#[test]
fn all_zero_sel_is_refused_and_attn_layer_0_trains() {
    let atten = |sel: Value, layers: usize| {
        json!({"type": "se_atten_v2", "sel": sel, "rcut": 4.0, "rcut_smth": 0.5,
               "neuron": [4, 8], "attn": 8, "attn_layer": layers, "tebd_dim": 4})
    };
    let radial = json!({"type": "se_e2_r", "sel": [0, 0], "rcut": 4.0, "rcut_smth": 0.5,
                        "neuron": [4, 8]});
    let cases = [
        (atten(json!(0), 1), "model.descriptor.sel"),
        (atten(json!(0), 0), "model.descriptor.sel"),
        (
            json!({"type": "se_e3", "sel": [0, 0], "rcut": 4.0, "rcut_smth": 0.5,
                   "neuron": [4, 8]}),
            "model.descriptor.sel",
        ),
        (radial.clone(), "model.descriptor.sel"),
        (
            json!({"type": "hybrid", "list": [
                {"type": "se_e2_a", "sel": [20, 28], "rcut": 4.0, "rcut_smth": 0.5,
                 "neuron": [4, 8], "axis_neuron": 4},
                radial,
            ]}),
            "model.descriptor.list[1].sel",
        ),
    ];
    for (descriptor, key) in cases {
        let d = tempfile::tempdir().unwrap();
        write_input(d.path(), &input_with(descriptor, false, 1));
        fails_at_start(d.path(), &[], &[key, "keeps no neighbour"]);
    }
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &input_with(atten(json!(40), 0), false, 1));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
}

/// Issue 59, defect 7: a `type_map.raw` that lists an element twice is refused naming the file
/// (it made every H an O).
#[test]
fn duplicate_element_in_type_map_raw_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let sys = water_system(d.path(), "sys");
    std::fs::write(sys.join("type_map.raw"), "O\nO\n").unwrap();
    write_input(d.path(), &tiny_input(1, &[&sys]));
    fails_at_start(d.path(), &[], &["sys/type_map.raw", "\"O\"", "twice"]);
}

/// Issue 59, defect 8: a system listed twice is used twice, as DeePMD-kit uses it: two
/// systems, each with its own share of the probability (prob_sys_size: by batches), so the
/// system listed twice is drawn twice as often.
#[test]
fn system_listed_twice_is_used_twice() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (water().join("data_0"), water().join("data_1"));
    write_input(d.path(), &tiny_input(1, &[&a, &b, &a]));
    let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
    assert!(err.contains("found 3 system(s)"), "{err}");
    assert!(!err.contains("symbolic link"), "{err}");
    // The summary's rows: system, natoms, frames, bch_sz, n_bch, prob, pbc.
    let probs: Vec<(String, f64)> = err
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let at = cols.iter().position(|c| c.contains("water/data_"))?;
            (cols.len() == at + 7).then(|| (cols[at].to_string(), cols[at + 5].parse().unwrap()))
        })
        .collect();
    assert_eq!(probs.len(), 3, "{err}");
    assert!(
        probs[0].0.ends_with("data_0") && probs[2].0.ends_with("data_0"),
        "{probs:?}"
    );
    assert_eq!(probs[0].1, probs[2].1, "{probs:?}");
    let total: f64 = probs.iter().map(|p| p.1).sum();
    assert!((total - 1.0).abs() < 2e-3, "{probs:?}");
}

/// Issue 59, defect 5: a workspace that cannot fit the machine's memory (se_e3, whose rows are
/// pairs of neighbour slots: sel² of them per atom) is refused before it is allocated, naming
/// sel², instead of being allocated under overcommit and killed. Under a `ulimit -v` too, so
/// that a failing check cannot take the machine's memory.
#[test]
fn se_e3_workspace_beyond_memory_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let descriptor = json!({"type": "se_e3", "sel": [2000, 2000], "rcut": 4.0,
                            "rcut_smth": 0.5, "neuron": [4, 8]});
    write_input(d.path(), &input_with(descriptor, false, 1));
    let args = ["train", "input.json", "--backend", "cpu"];
    let out = dpw_under(d.path(), &format!("-v {}", 4 << 20), &args);
    failed(
        out,
        &args,
        &[
            "training system",
            "cannot allocate",
            "MemAvailable",
            "se_e3",
            "sel²",
            "sel",
        ],
    );
    assert!(!d.path().join("lcurve.out").exists());
}

/// Issue 59 (minor): a type error of `dpw neighbor-stat` names the type map it has (`-t`), not a
/// model's, which neighbor-stat has none of.
#[test]
fn neighbor_stat_type_errors_name_no_model() {
    let d = tempfile::tempdir().unwrap();
    let sys = water_system(d.path(), "sys");
    let s = sys.to_str().unwrap();
    let err = fails(
        d.path(),
        &["neighbor-stat", "-s", s, "-r", "4", "-t", "O"],
        &["\"H\""],
    );
    assert!(!err.contains("model"), "{err}");
    std::fs::remove_file(sys.join("type_map.raw")).unwrap();
    let err = fails(
        d.path(),
        &["neighbor-stat", "-s", s, "-r", "4", "-t", "O"],
        &["type 1"],
    );
    assert!(!err.contains("model"), "{err}");
}

/// Issue 59 (minor): an npy array of a type dpw does not read (here complex64) is refused with
/// every type it reads: float16/32/64 and integers.
#[test]
fn npy_of_an_unread_type_lists_the_types_read() {
    let d = tempfile::tempdir().unwrap();
    let sys = water_system(d.path(), "sys");
    let p = sys.join("set.000/energy.npy");
    let n = read_npy(&p).len();
    let header = format!("{{'descr': '<c8', 'fortran_order': False, 'shape': ({n},), }}");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 64 - (10 + header.len() + 1) % 64;
    let header = format!("{header}{}\n", " ".repeat(pad));
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(vec![0u8; 8 * n]);
    std::fs::write(&p, bytes).unwrap();
    let s = sys.to_str().unwrap();
    fails(
        d.path(),
        &["neighbor-stat", "-s", s, "-r", "4", "-t", "O", "H"],
        &["energy.npy", "float16", "float32", "float64", "integers"],
    );
}

/// Point 12: causes are printed once; a DeePMD-kit yaml is named as such where a checkpoint is
/// needed, and `--init-model` takes one.
#[test]
fn messages_name_things_once() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(2, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    ok(d.path(), &["freeze", "-o", "m.yaml"]);

    // coord.npy is a folder.
    let sys = water_system(d.path(), "dir_coord");
    let c = sys.join("set.000/coord.npy");
    std::fs::remove_file(&c).unwrap();
    std::fs::create_dir(&c).unwrap();
    let s = sys.display().to_string();
    let err = fails(
        d.path(),
        &["test", "-m", "m.yaml", "-s", &s, "--backend", "cpu"],
        &["coord.npy"],
    );
    assert!(err.matches("os error").count() == 1, "{err}");

    // A truncated npy.
    let sys = water_system(d.path(), "short_force");
    let f = sys.join("set.000/force.npy");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let s = sys.display().to_string();
    let err = fails(
        d.path(),
        &["test", "-m", "m.yaml", "-s", &s, "--backend", "cpu"],
        &["force.npy", "truncated"],
    );
    assert!(err.matches("failed to fill").count() <= 1, "{err}");

    fails(
        d.path(),
        &["train", "input.json", "--restart", "m.yaml"],
        &["m.yaml", "DeePMD-kit .yaml model", "--init-model"],
    );
    fails(
        d.path(),
        &["freeze", "-c", "m.yaml", "-o", "x.dpw"],
        &["m.yaml", "already a model", "dpw convert"],
    );
    let out = ok(
        d.path(),
        &[
            "train",
            "input.json",
            "--init-model",
            "m.yaml",
            "--backend",
            "cpu",
        ],
    );
    assert!(stderr(&out).contains("initial parameters and statistics from m.yaml"));
}

/// Point 12: a batch error names the frame by its index in the system, as the load does.
#[test]
fn batch_errors_name_frames_by_their_index() {
    use dpw::data::System;
    use dpw::model::{DescriptorSpec, FittingSpec, ModelSpec};
    let natoms = 2;
    let good = [6.0, 0.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0, 6.0];
    let mut cell: Vec<f64> = (0..4).flat_map(|_| good).collect();
    cell[3 * 9 + 8] = 0.0;
    let sys = System {
        path: PathBuf::from("sys_in_memory"),
        natoms,
        mixed: false,
        atype: vec![0, 0],
        orig_index: vec![0, 1],
        nframes: 4,
        coord: (0..4)
            .flat_map(|_| [0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
            .collect(),
        cell: Some(cell),
        energy: vec![0.0; 4],
        force: vec![0.0; 4 * 6],
        virial: None,
        has_energy: true,
        has_force: true,
        fparam: None,
        aparam: None,
        label: None,
        atom_label: None,
    };
    let spec = ModelSpec {
        short_range: None,
        linear: None,
        type_map: vec!["O".into()],
        descriptor: DescriptorSpec {
            kind: Default::default(),
            rcut: 4.0,
            rcut_smth: 0.5,
            sel: vec![8],
            neuron: vec![2],
            axis_neuron: 2,
            resnet_dt: false,
            type_one_side: true,
            env_protection: 0.0,
            set_davg_zero: false,
            own: dpw::model::OwnKeys::Se,
        },
        fitting: FittingSpec::new(vec![2], false),
    };
    let err = dpw::train::batch::assemble_frames(&spec, &sys, &[1, 3], "training").unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("sys_in_memory") && msg.contains("frame 3"),
        "{msg}"
    );
    assert!(
        !msg.contains("frame 1") && !msg.contains("frame 0"),
        "{msg}"
    );
}

/// Issue 32, point 1: a schedule whose lr rises above start_lr (a stop_lr above it, a
/// stop_lr_ratio or a decay_rate above 1) is refused at start-up, naming the keys: the loss
/// prefactors `limit + (start − limit)·lr/start_lr` would go negative and train to NaN.
#[test]
fn rising_learning_rate_is_refused() {
    let d = tempfile::tempdir().unwrap();
    for (key, value, names) in [
        (
            "stop_lr",
            1e-2,
            &["learning_rate.stop_lr", "must be <= learning_rate.start_lr"][..],
        ),
        (
            "stop_lr_ratio",
            2.0,
            &["learning_rate.stop_lr_ratio", "<= 1"],
        ),
        ("decay_rate", 1.5, &["learning_rate.decay_rate", "<= 1"]),
    ] {
        let mut input = tiny_input(5, &[]);
        if key == "stop_lr_ratio" {
            input["learning_rate"]
                .as_object_mut()
                .unwrap()
                .remove("stop_lr");
        }
        input["learning_rate"][key] = json!(value);
        write_input(d.path(), &input);
        fails_at_start(d.path(), &[], names);
    }
    assert_eq!(files_in(d.path()), ["input.json"], "nothing written");
    // A constant lr (stop_lr = start_lr) trains.
    let mut input = tiny_input(2, &[]);
    input["learning_rate"]["stop_lr"] = json!(1e-3);
    write_input(d.path(), &input);
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
}

/// Issue 32, point 2: the lock file goes when the run ends, cleanly or by an error after it was
/// taken; one a killed run left behind is taken over, saying so.
#[test]
fn lock_file_goes_with_the_run() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join(".dpw-train.lock");
    write_input(d.path(), &tiny_input(2, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(!lock.exists(), "left behind by a finished run");
    fails(
        d.path(),
        &[
            "train",
            "input.json",
            "--backend",
            "cpu",
            "--init-model",
            "missing.ckpt",
        ],
        &["--init-model", "missing.ckpt", "does not exist"],
    );
    assert!(!lock.exists(), "left behind by a failed run");
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    std::fs::write(&lock, format!("{dead}\n")).unwrap();
    let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
    assert!(
        err.contains(&format!(
            "took over ./.dpw-train.lock, left behind by dpw train pid {dead}"
        )),
        "{err}"
    );
    assert!(!lock.exists(), "a taken-over lock left behind");
}

/// Issue 32, point 3: `dpw train input.yaml` (or .yml) reads YAML as `dp train` does, and a
/// byte-order mark at the start of input.json is skipped.
#[test]
fn yaml_input_and_byte_order_mark() {
    let input = tiny_input(2, &[]);
    let d = tempfile::tempdir().unwrap();
    for name in ["input.yaml", "input.yml"] {
        std::fs::write(
            d.path().join(name),
            serde_yaml_ng::to_string(&input).unwrap(),
        )
        .unwrap();
        ok(d.path(), &["train", name, "--backend", "cpu"]);
        let out: Value =
            serde_json::from_str(&std::fs::read_to_string(d.path().join("out.json")).unwrap())
                .unwrap();
        assert_eq!(out["training"]["numb_steps"], json!(2));
    }
    std::fs::write(d.path().join("bad.yaml"), "model: [1, 2\n").unwrap();
    fails(
        d.path(),
        &["train", "bad.yaml", "--backend", "cpu"],
        &["malformed YAML in bad.yaml", "line"],
    );
    let text = format!("\u{feff}{}", serde_json::to_string_pretty(&input).unwrap());
    std::fs::write(d.path().join("input.json"), text).unwrap();
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
}

/// Issue 32, point 4: an output that would replace the input, a data file, or another output
/// (a checkpoint of the run included) is refused at start-up, naming both paths and the keys or
/// flags naming them, before anything is written; so is an output in a missing folder.
#[test]
fn colliding_outputs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let sys = water_system(d.path(), "sys");
    let base = tiny_input(2, &[&sys]);
    // (extra arguments, a training key set to a value, what the message names)
    type Case<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>, &'a [&'a str]);
    let cases: [Case; 9] = [
        (
            &["-l", "input.json"],
            None,
            &["-l/--log-path input.json is the input file input.json"],
        ),
        (
            &[],
            Some(("disp_file", "input.json")),
            &["training.disp_file ./input.json is the input file input.json"],
        ),
        (
            &["-l", "lcurve.out"],
            None,
            &["-l/--log-path lcurve.out and training.disp_file ./lcurve.out"],
        ),
        (
            &[],
            Some(("save_ckpt", "lcurve.out")),
            &["training.save_ckpt ./lcurve.out and training.disp_file ./lcurve.out"],
        ),
        (
            &["-o", "lcurve.out"],
            None,
            &["-o/--output lcurve.out and training.disp_file ./lcurve.out"],
        ),
        (
            &["-l", "model.ckpt-3"],
            None,
            &["-l/--log-path model.ckpt-3 is a checkpoint file of training.save_ckpt"],
        ),
        (
            &["-o", "sys/set.000/coord.npy"],
            None,
            &[
                "-o/--output",
                "data system",
                "training.training_data.systems",
            ],
        ),
        (
            &["-l", ".dpw-train.lock"],
            None,
            &["-l/--log-path .dpw-train.lock and the run's lock file"],
        ),
        (
            &["-o", "nodir/out.json"],
            None,
            &["-o/--output", "nodir", "does not exist"],
        ),
    ];
    for (args, key, names) in cases {
        let mut input = base.clone();
        if let Some((k, v)) = key {
            input["training"][k] = json!(v);
        }
        write_input(d.path(), &input);
        let before = std::fs::read(d.path().join("input.json")).unwrap();
        let coord = std::fs::read(sys.join("set.000/coord.npy")).unwrap();
        fails_at_start(d.path(), args, names);
        assert_eq!(std::fs::read(d.path().join("input.json")).unwrap(), before);
        assert_eq!(std::fs::read(sys.join("set.000/coord.npy")).unwrap(), coord);
        assert_eq!(
            files_in(d.path()),
            ["input.json", "sys"],
            "dpw train {args:?} wrote something"
        );
    }
}

/// Issue 32, point 5: an interrupted run saves its checkpoint and then dies by the signal
/// itself, as the parent expects of a process it signalled; a second signal right after the
/// first (a wrapper forwarding the one its process group got) is the same request.
#[cfg(unix)]
#[test]
fn interrupt_ends_by_the_signal() {
    use std::os::unix::process::ExitStatusExt;
    let kill = |sig: &str, pid: u32| {
        let s = Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .unwrap();
        assert!(s.success(), "kill -{sig}");
    };
    for twice in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let mut input = tiny_input(1_000_000, &[]);
        input["training"]["disp_freq"] = json!(10);
        write_input(d.path(), &input);
        let log = d.path().join("stderr.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_dpw"))
            .current_dir(d.path())
            .args(["train", "input.json", "--backend", "cpu"])
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !std::fs::read_to_string(d.path().join("lcurve.out"))
            .is_ok_and(|s| s.lines().count() >= 3)
        {
            assert!(t.elapsed().as_secs() < 120, "training never got under way");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let pid = child.id();
        if twice {
            // Both pending while it is stopped: they arrive together once it goes on.
            kill("STOP", pid);
            kill("INT", pid);
            kill("TERM", pid);
            kill("CONT", pid);
        } else {
            kill("TERM", pid);
        }
        let status = child.wait().unwrap();
        let err = std::fs::read_to_string(&log).unwrap();
        assert!(!err.contains("panicked"), "{err}");
        // Two signals pending together are taken in either order (two threads may take one
        // each): the run ends by whichever it took first, and takes the other as the same
        // request.
        let (first, other, want) = if twice && err.contains("WARN SIGTERM:") {
            ("SIGTERM", "SIGINT", 15)
        } else if twice {
            ("SIGINT", "SIGTERM", 2)
        } else {
            ("SIGTERM", "", 15)
        };
        assert_eq!(status.code(), None, "{err}");
        assert_eq!(status.signal(), Some(want), "{err}");
        assert!(
            err.contains(&format!("interrupted by {first}"))
                && err.contains("checkpoint saved to ./model.ckpt-"),
            "{err}"
        );
        if twice {
            assert!(
                err.contains(&format!(
                    "{other} within 2 s of the first signal: the same request"
                )),
                "{err}"
            );
        }
        assert!(!d.path().join(".dpw-train.lock").exists(), "{err}");
    }
}

/// dpw with the environment variables `env` set.
fn dpw_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dpw"));
    cmd.args(args).envs(env.iter().copied());
    run(cmd, dir, args)
}

/// Issue 59, defect 1: the file `-l` names is left as it was when the input cannot be read
/// (missing, malformed, an unknown key), and an existing file that is not a dpw log is refused
/// even with a valid input; a previous dpw log is replaced.
#[test]
fn log_file_waits_for_the_input() {
    let d = tempfile::tempdir().unwrap();
    let npy = water().join("data_0/set.000/energy.npy");
    let precious = std::fs::read(&npy).unwrap();
    std::fs::write(d.path().join("e.npy"), &precious).unwrap();
    std::fs::write(d.path().join("model.ckpt-5"), &precious).unwrap();
    let mut misspelt = tiny_input(2, &[]);
    misspelt["training"]["numb_stps"] = json!(2);
    let cases: [(&str, Option<String>, &str); 4] = [
        ("missing.json", None, "missing.json"),
        ("bad.json", Some("{\"model\": [".into()), "bad.json"),
        (
            "misspelt.json",
            Some(misspelt.to_string()),
            "unknown key 'numb_stps'",
        ),
        // Refused as not a log, or as a checkpoint file of the run.
        (
            "valid.json",
            Some(tiny_input(2, &[]).to_string()),
            "-l/--log-path",
        ),
    ];
    for (input, text, names) in cases {
        if let Some(t) = &text {
            std::fs::write(d.path().join(input), t).unwrap();
        }
        for log in ["e.npy", "model.ckpt-5"] {
            let args = ["train", input, "-l", log, "--backend", "cpu"];
            fails(d.path(), &args, &[names]);
            assert_eq!(
                std::fs::read(d.path().join(log)).unwrap(),
                precious,
                "dpw {args:?} changed {log}"
            );
        }
    }
    fails(
        d.path(),
        &["train", "valid.json", "-l", "e.npy"],
        &["-l/--log-path e.npy: the file exists and is not a dpw log"],
    );
    // A dpw log is the log of the run before: the next run replaces it.
    let args = ["train", "valid.json", "-l", "train.log", "--backend", "cpu"];
    ok(d.path(), &args);
    let first = std::fs::read_to_string(d.path().join("train.log")).unwrap();
    assert!(
        first.contains("dpw") && first.contains("trained 2 steps"),
        "{first}"
    );
    ok(d.path(), &args);
}

/// Issue 59, defect 10 and the minor on settings: every DPW_* value is checked by one rule
/// before anything is read or written (the previous run's lcurve.out and out.json stay as they
/// were); empty is the default, without a warning.
#[test]
fn settings_are_checked_before_anything() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(2, &[]));
    let args = ["train", "input.json", "--backend", "cpu"];
    ok(d.path(), &args);
    let outputs = ["lcurve.out", "out.json"].map(|f| d.path().join(f));
    let before = outputs.each_ref().map(|p| std::fs::read(p).unwrap());
    for (var, value, expected) in [
        ("DPW_RESIDENT_MB", "abc", "a whole number of MiB"),
        ("DPW_DATA_CACHE_MB", "1.5", "a whole number of MiB"),
        ("DPW_WGPU_DENSE", "wide", "`tiled` or `flat`"),
        ("DPW_WGPU_PASSES", "all", "`shared` or `each`"),
        ("DPW_CUDA_ATTN", "gpu", "`host` or `kernels`"),
        ("DPW_CUDA_TAPE", "device", "`host` or `kernels`"),
        ("DPW_WGPU_PROFILE", "maybe", "expected 1, true, on or yes"),
        ("DPW_CUDA_GRAPH", "2", "expected 1, true, on or yes"),
        ("DPW_NCCL", "x", "expected 1, true, on or yes"),
        ("DPW_NO_AVX512", "sure", "expected 1, true, on or yes"),
    ] {
        let out = dpw_env(d.path(), &[(var, value)], &args);
        let err = failed(out, &args, &[&format!("{var}=\"{value}\""), expected]);
        assert!(!err.contains("training systems"), "data read first:\n{err}");
        for (p, b) in outputs.iter().zip(&before) {
            assert_eq!(
                &std::fs::read(p).unwrap(),
                b,
                "{var}={value}: {p:?} changed"
            );
        }
    }
    let out = ok_env(
        d.path(),
        &[("DPW_DATA_CACHE_MB", ""), ("DPW_RESIDENT_MB", " ")],
        &args,
    );
    let err = stderr(&out);
    assert!(
        !err.contains("DPW_DATA_CACHE_MB=") && !err.contains("DPW_RESIDENT_MB="),
        "{err}"
    );
    let out = ok_env(d.path(), &[("DPW_DATA_CACHE_MB", "0")], &args);
    let err = stderr(&out);
    assert!(
        err.contains("DPW_DATA_CACHE_MB is 0: no frame stays in memory")
            && !err.contains("MiB of frames exceed"),
        "{err}"
    );
}

fn ok_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let out = dpw_env(dir, env, args);
    assert!(
        out.status.success(),
        "dpw {args:?} with {env:?} failed:\n{}",
        stderr(&out)
    );
    out
}

/// Issue 59, minor: a log file that takes no lines (a full disk: /dev/full) is an error, not a
/// success with lines lost; a file that is not a log (/proc/version) is refused up front.
#[cfg(target_os = "linux")]
#[test]
fn log_write_errors_are_errors() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(2, &[]));
    let args = ["train", "input.json", "-l", "/dev/full", "--backend", "cpu"];
    let err = failed(
        dpw(d.path(), &args),
        &args,
        &["cannot write the log file /dev/full", "lacks lines"],
    );
    assert!(err.contains("trained 2 steps"), "{err}");
    fails(
        d.path(),
        &["train", "input.json", "-l", "/proc/version"],
        &["-l/--log-path /proc/version", "not a dpw log"],
    );
}

/// Issue 59, minor: Ctrl-C before the first step (here while the run waits for its
/// --init-model, a pipe no one writes) stops at once, says so, and leaves no lock file.
#[cfg(unix)]
#[test]
fn interrupt_during_start_up_is_said() {
    use std::os::unix::process::ExitStatusExt;
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(2, &[]));
    let fifo = d.path().join("init.ckpt");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let log = d.path().join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(d.path())
        .env("RUST_LOG", "info")
        .args(["train", "input.json", "--init-model", "init.ckpt"])
        .args(["--backend", "cpu"])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let lock = d.path().join(".dpw-train.lock");
    let t = std::time::Instant::now();
    while !lock.exists() {
        assert!(t.elapsed().as_secs() < 120, "the run never took its lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let s = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(s.success());
    // Not a timing: a run that ignored the signal would wait for its pipe for ever.
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed().as_secs() > 120 {
            child.kill().unwrap();
            panic!("SIGINT did not stop the run");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.signal(), Some(2), "{err}");
    assert!(
        err.contains("SIGINT during start-up, before the first training step: stopping now"),
        "{err}"
    );
    assert!(!lock.exists(), "{err}");
}

/// Issue 59, minors: a restart says what it does with a training.seed (the checkpoint's batch
/// stream goes on) and with validation_data removed (no validation), without false warnings.
#[test]
fn restart_notes_say_what_happens() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(2, &[]);
    input["training"]["validation_data"] = json!({
        "systems": [water().join("data_3")], "batch_size": 1, "numb_btch": 1
    });
    write_input(d.path(), &input);
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    input["training"]["numb_steps"] = json!(3);
    input["training"]["seed"] = json!(11);
    input["training"]
        .as_object_mut()
        .unwrap()
        .remove("validation_data");
    write_input(d.path(), &input);
    let args = [
        "train",
        "input.json",
        "--restart",
        "model.ckpt",
        "--backend",
        "cpu",
    ];
    let err = stderr(&ok(d.path(), &args));
    assert!(
        err.contains(
            "training.seed 11 is not used: a restart continues the checkpoint's batch stream"
        ),
        "{err}"
    );
    assert!(
        err.contains("no validation_data (the checkpoint's run had)")
            && !err.contains("validation data differ"),
        "{err}"
    );
}

/// Issue 59, minors: messages that name what happened: a dangling `model.ckpt` link names its
/// target; `dpw test -d` and `dpw convert` into a missing folder name the folder (before any
/// evaluation, and with no temporary file that never was); one earlier checkpoint is one; the
/// help names the descriptors dpw trains.
#[test]
fn messages_name_what_happened() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(1, &[]);
    input["training"]["save_freq"] = json!(1);
    write_input(d.path(), &input);
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let err = stderr(&ok(d.path(), &["train", "input.json", "--backend", "cpu"]));
    assert!(
        err.contains("a numbered checkpoint of an earlier run is in")
            && err.contains("model.ckpt-1): it is kept"),
        "{err}"
    );
    let sys = water().join("data_0").display().to_string();
    let err = fails(
        d.path(),
        &["test", "-m", "model.ckpt", "-s", &sys, "-d", "nodir/x"],
        &["-d/--detail-file nodir/x: the folder nodir does not exist"],
    );
    assert!(!err.contains("temporary"), "{err}");
    let err = fails(
        d.path(),
        &["convert", "model.ckpt", "nodir/x.yaml"],
        &["cannot write nodir/x.yaml: the folder nodir does not exist"],
    );
    assert!(!err.contains("temporary"), "{err}");
    #[cfg(unix)]
    {
        let link = d.path().join("gone/model.ckpt");
        std::fs::create_dir(d.path().join("gone")).unwrap();
        std::os::unix::fs::symlink("model.ckpt-9", &link).unwrap();
        fails(
            d.path(),
            &["freeze", "-c", "gone"],
            &["gone/model.ckpt is a link to gone/model.ckpt-9, which does not exist"],
        );
    }
    for (args, names) in [
        (&["--help"][..], "se_atten"),
        (&["train", "--help"][..], "se_e3"),
    ] {
        let out = ok(d.path(), args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(names) && text.contains("hybrid"), "{text}");
    }
}

/// An npy file of float16 values (exact small integers here) in `shape`.
fn write_f16_npy(p: &Path, shape: &[usize], v: &[f64]) {
    let mut bytes = Vec::new();
    ArrayD::from_elem(IxDyn(shape), 0i16)
        .write_npy(&mut bytes)
        .unwrap();
    let at = bytes.windows(3).position(|w| w == b"<i2").unwrap();
    bytes[at + 1] = b'f';
    let start = bytes.len() - 2 * v.len();
    for (item, &x) in bytes[start..].chunks_exact_mut(2).zip(v) {
        let bits: u16 = if x == 0.0 {
            0
        } else {
            let e = x.abs().log2().floor();
            let mant = ((x.abs() / 2f64.powf(e) - 1.0) * 1024.0) as u16;
            (u16::from(x < 0.0) << 15) | (((e as i32 + 15) as u16) << 10) | mant
        };
        item.copy_from_slice(&bits.to_le_bytes());
    }
    std::fs::write(p, bytes).unwrap();
}

/// Issue 32, point 6: integer and float16 arrays are widened, as DeePMD-kit casts them.
#[test]
fn integer_and_float16_arrays_are_widened() {
    let d = tempfile::tempdir().unwrap();
    // Two frames of one water molecule in a 10 Å box.
    let coord = [
        0., 0., 0., 1., 0., 0., 0., 1., 0., 5., 5., 5., 6., 5., 5., 5., 6., 5.,
    ];
    let cell = [10., 0., 0., 0., 10., 0., 0., 0., 10.];
    let cells: Vec<f64> = cell.iter().chain(&cell).copied().collect();
    let energy = [-5.0, -4.0];
    let force = [0.0; 18];
    let arr =
        |shape: &[usize], v: &[f64]| ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap();
    let ints = d.path().join("ints");
    let halves = d.path().join("halves");
    for sys in [&ints, &halves] {
        std::fs::create_dir_all(sys.join("set.000")).unwrap();
        std::fs::write(sys.join("type.raw"), "0\n1\n1\n").unwrap();
    }
    let set = ints.join("set.000");
    let file = |n: &str| std::fs::File::create(set.join(n)).unwrap();
    arr(&[2, 9], &coord)
        .mapv(|x| x as i64)
        .write_npy(file("coord.npy"))
        .unwrap();
    arr(&[2, 9], &cells)
        .mapv(|x| x as i32)
        .write_npy(file("box.npy"))
        .unwrap();
    arr(&[2], &energy)
        .mapv(|x| x as i16)
        .write_npy(file("energy.npy"))
        .unwrap();
    arr(&[2, 9], &force)
        .mapv(|x| x as u8)
        .write_npy(file("force.npy"))
        .unwrap();
    let set = halves.join("set.000");
    write_f16_npy(&set.join("coord.npy"), &[2, 9], &coord);
    write_f16_npy(&set.join("box.npy"), &[2, 9], &cells);
    write_f16_npy(&set.join("energy.npy"), &[2], &energy);
    write_f16_npy(&set.join("force.npy"), &[2, 9], &force);
    write_input(d.path(), &tiny_input(2, &[&ints, &halves]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let s = halves.display().to_string();
    let out = ok(
        d.path(),
        &["test", "-m", "model.ckpt", "-s", &s, "--backend", "cpu"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Energy RMSE") && !text.contains("nan"),
        "{text}"
    );
}

/// The temporary files (`.NAME.tmpPID`) left in `dir`.
fn temp_files(dir: &Path) -> Vec<String> {
    files_in(dir)
        .into_iter()
        .filter(|n| n.contains(".tmp"))
        .collect()
}

/// A `ulimit -f` (in 512-byte blocks, or 1024 in bash) that lets a tiny run write out.json and
/// lcurve.out but not its first checkpoint, found from the sizes a free run writes.
fn size_limit_below_the_checkpoint() -> String {
    let d = tempfile::tempdir().unwrap();
    let input = tiny_input(2, &[]);
    write_input(d.path(), &input);
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let size = |n: &str| std::fs::metadata(d.path().join(n)).unwrap().len();
    let small = size("out.json").max(size("lcurve.out"));
    let blocks = small / 512 + 1;
    assert!(
        blocks * 1024 < size("model.ckpt-2"),
        "no file size limit fits between {small} B and the checkpoint's {} B",
        size("model.ckpt-2")
    );
    format!("-f {blocks}")
}

/// Issue 32, point 6: a write that fails (a full disk; here a file size limit, with SIGXFSZ
/// ignored by the shell as a full disk sends none) names the file the user asked for and
/// leaves no temporary file behind.
#[test]
fn failed_write_names_the_file_and_leaves_no_temp_file() {
    let limit = size_limit_below_the_checkpoint();
    let d = tempfile::tempdir().unwrap();
    let input = tiny_input(2, &[]);
    write_input(d.path(), &input);
    let args = ["train", "input.json", "--backend", "cpu"];
    let out = dpw_under(d.path(), &format!("{limit} && trap '' XFSZ"), &args);
    failed(out, &args, &["./model.ckpt-2 ", "File too large"]);
    assert_eq!(temp_files(d.path()), Vec::<String>::new());
    // The same for a frozen model.
    write_input(d.path(), &input);
    ok(d.path(), &args);
    let args = ["freeze", "-o", "frozen.dpw"];
    let out = dpw_under(d.path(), &format!("{limit} && trap '' XFSZ"), &args);
    failed(out, &args, &["frozen.dpw ", "File too large"]);
    assert_eq!(temp_files(d.path()), Vec::<String>::new());
    assert!(!d.path().join("frozen.dpw").exists());
}

/// Issue 32, point 7: SIGXFSZ (a write past `ulimit -f`) does not kill dpw: the write fails as
/// on a full disk, with the same message.
#[test]
fn file_size_limit_is_an_error_not_a_death() {
    let limit = size_limit_below_the_checkpoint();
    let d = tempfile::tempdir().unwrap();
    let input = tiny_input(2, &[]);
    write_input(d.path(), &input);
    let args = ["train", "input.json", "--backend", "cpu"];
    let out = dpw_under(d.path(), &limit, &args);
    failed(out, &args, &["./model.ckpt-2 ", "File too large"]);
    assert_eq!(temp_files(d.path()), Vec::<String>::new());
}

/// Issue 32, point 5: a model name DeePMD-kit reads as one of its own formats that dpw does not
/// write (.pth, .pb, ...) is refused, saying how to get there through the .yaml; .yaml, .dpw and
/// the default name still work.
#[test]
fn freeze_to_a_format_dpw_cannot_write_is_refused() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(1, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    for o in [
        "frozen_model.pth",
        "frozen_model.pb",
        "m.savedmodel",
        "m.json",
        "m.dp",
        "M.PTH",
    ] {
        fails(
            d.path(),
            &["freeze", "-o", o],
            &[o, "dp convert-backend", ".yaml"],
        );
        assert!(!d.path().join(o).exists(), "{o} was written");
    }
    fails(
        d.path(),
        &["convert", "model.ckpt", "m.pth"],
        &["`dpw convert model.ckpt m.yaml && dp convert-backend m.yaml m.pth`"],
    );
    ok(d.path(), &["freeze", "-o", "m.yml"]);
    ok(d.path(), &["freeze", "-o", "m.dpw"]);
    ok(d.path(), &["freeze"]);
    assert!(d.path().join("frozen_model.dpw").exists());
}

/// Issue 32, point 12: errors whose squares overflow (energy labels of 1e200) are reported as
/// the huge numbers they are, for the system and in the average over systems, not as inf.
#[test]
fn huge_errors_do_not_overflow_the_rmse() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(1, &[]));
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let big = edited_system(d.path(), "big", |f, a| {
        if f == "energy" {
            a.fill(1e200);
        }
    });
    let other = water().join("data_1");
    let (big, other) = (big.display().to_string(), other.display().to_string());
    let out = ok(
        d.path(),
        &[
            "test",
            "-m",
            "model.ckpt",
            "-s",
            &big,
            "-s",
            &other,
            "-n",
            "3",
            "--backend",
            "cpu",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rmse: Vec<&str> = text.lines().filter(|l| l.contains("RMSE")).collect();
    eprintln!(
        "CASE dpw test on 1e200 energies → exit 0:\n{}",
        rmse.join("\n")
    );
    assert!(!text.contains("inf"), "{text}");
    assert!(
        text.contains("Energy RMSE        : 1.000000e+200 eV"),
        "{text}"
    );
    // The average over both systems: 1e200/√2.
    assert!(
        text.contains("Energy RMSE        : 7.071068e+199 eV"),
        "{text}"
    );
}

/// The numbered checkpoints `model.ckpt-N` in `dir`, by step.
fn numbered_checkpoints(dir: &Path) -> Vec<usize> {
    let mut steps: Vec<usize> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_prefix("model.ckpt-")?.parse().ok()
        })
        .collect();
    steps.sort();
    steps
}

/// Issue 32, point 11: a fresh run rotates (max_ckpt_keep) only its own checkpoints; an
/// earlier run's in the folder are kept and named at the start. A restart continues the
/// rotation as one run, over every numbered checkpoint in the folder.
#[test]
fn fresh_run_keeps_an_earlier_runs_checkpoints() {
    let d = tempfile::tempdir().unwrap();
    let mut input = tiny_input(4, &[]);
    input["training"]["save_freq"] = json!(2);
    write_input(d.path(), &input);
    ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    assert_eq!(numbered_checkpoints(d.path()), [2, 4]);
    input["training"]["numb_steps"] = json!(3);
    input["training"]["save_freq"] = json!(1);
    input["training"]["max_ckpt_keep"] = json!(2);
    write_input(d.path(), &input);
    let out = ok(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let err = stderr(&out);
    assert!(
        err.contains("earlier run") && err.contains("model.ckpt-4"),
        "{err}"
    );
    // Step 2 is this run's now (written over), step 4 the earlier run's.
    assert_eq!(numbered_checkpoints(d.path()), [2, 3, 4]);
    // A restart saves from the second step on, as DeePMD-kit does (here 5 and 6), and takes
    // every numbered checkpoint in the folder as its run's.
    input["training"]["numb_steps"] = json!(6);
    write_input(d.path(), &input);
    let out = ok(
        d.path(),
        &[
            "train",
            "input.json",
            "--restart",
            "model.ckpt",
            "--backend",
            "cpu",
        ],
    );
    assert!(!stderr(&out).contains("earlier run"), "{}", stderr(&out));
    assert_eq!(numbered_checkpoints(d.path()), [5, 6]);
}

/// Issue 32, point 4: memory that is not there (here a `ulimit -v`) for the batch workspace is
/// an error naming it, its size and what lowers it, not an abort.
#[test]
fn out_of_memory_names_the_allocation() {
    // Room for start-up (the binary, its threads and water data_0 take under 300 MB), far less
    // than one array of the workspace below.
    const LIMIT: usize = 1 << 30;
    let d = tempfile::tempdir().unwrap();
    let args = ["train", "input.json", "--backend", "cpu"];
    let limit = format!("-v {}", LIMIT >> 10);
    let mut input = tiny_input(1, &[]);
    write_input(d.path(), &input);
    let out = dpw_under(d.path(), &limit, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    // Issue 59, defect 10: the failure leaves the outputs of the run before as they were.
    let outputs = ["lcurve.out", "out.json"].map(|f| d.path().join(f));
    let before = outputs.each_ref().map(|p| std::fs::read(p).unwrap());
    // G, the embedding net's output: one frame's neighbour slots × m1 values.
    let m1 = 1 << 15;
    input["model"]["descriptor"]["neuron"] = json!([4, m1]);
    write_input(d.path(), &input);
    let types = std::fs::read_to_string(water().join("data_0/type.raw")).unwrap();
    let natoms = types.split_whitespace().count();
    let nnei: usize = input["model"]["descriptor"]["sel"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap() as usize)
        .sum();
    let g_bytes = natoms * nnei * m1 * 8;
    assert!(g_bytes > 2 * LIMIT, "G is {g_bytes} B, too small to fail");
    let out = dpw_under(d.path(), &limit, &args);
    failed(
        out,
        &args,
        &[
            "out of memory",
            "the workspace of a batch of 1 frame of",
            "MiB",
            "sel or neuron",
        ],
    );
    for (p, b) in outputs.iter().zip(&before) {
        assert_eq!(&std::fs::read(p).unwrap(), b, "{p:?} changed");
    }
}

/// Issue 59, defect 9: a model that does not fit input.json is described in input.json's
/// names and values, and named for what it is: a descriptor of another type by the two types
/// alone, a `-t` model as such (not "the --init-model file … in the checkpoint"), and no key
/// input.json does not have (`kind`, se_e2_r's `axis_neuron`).
#[test]
fn model_mismatch_says_what_differs_in_input_json_terms() {
    let d = tempfile::tempdir().unwrap();
    write_input(d.path(), &tiny_input(1, &[]));
    let se_atten = common::repo("tests/reference/dpa1/se_atten_l0_water/model.yaml");
    let y = se_atten.display().to_string();
    let err = fails(
        d.path(),
        &["train", "input.json", "-t", &y, "--backend", "cpu"],
        &[
            "the model of the -t/--init-frz-model model does not match input.json's: \
           model.descriptor.type: \"se_e2_a\" in input.json, \"se_atten\" in the \
           -t/--init-frz-model model",
        ],
    );
    assert!(
        !err.contains("checkpoint") && !err.contains("descriptor.neuron"),
        "{err}"
    );
    fails(
        d.path(),
        &[
            "train",
            "input.json",
            "--init-model",
            &y,
            "--backend",
            "cpu",
        ],
        &[&format!(
            "model.descriptor.type: \"se_e2_a\" in input.json, \"se_atten\" in the \
             --init-model file {y}"
        )],
    );

    // se_e2_r against an se_e2_a model, then against an se_e2_r one of other widths.
    let mut input = tiny_input(1, &[]);
    input["model"]["descriptor"] = json!({"type": "se_e2_r", "sel": [46, 92], "rcut": 6.0,
        "rcut_smth": 0.5, "neuron": [4, 8], "type_one_side": true, "seed": 1});
    write_input(d.path(), &input);
    let model_a = common::model_a_dir().join("model.yaml");
    let err = fails(
        d.path(),
        &["train", "input.json", "-t", &model_a.display().to_string()],
        &["model.descriptor.type: \"se_e2_r\" in input.json, \"se_e2_a\" in the -t"],
    );
    assert!(
        !err.contains("axis_neuron") && !err.contains("kind") && !err.contains("null"),
        "{err}"
    );
    let se_e2_r = common::repo("tests/reference/descriptors/se_e2_r_water/model.yaml");
    let err = fails(
        d.path(),
        &["train", "input.json", "-t", &se_e2_r.display().to_string()],
        &["model.descriptor.neuron: [4,8] in input.json, [4,8,16] in the -t/--init-frz-model model"],
    );
    assert!(
        !err.contains("axis_neuron") && !err.contains("kind"),
        "{err}"
    );
}

/// Issue 59 (minor): parameter-sized vectors that do not fit (here under a `ulimit -v`) are an
/// error naming them, not an abort ("memory allocation of N bytes failed", exit 134).
#[test]
fn parameters_beyond_memory_are_an_error() {
    // Room for start-up and the model itself (19 M parameters, 152 MB), not for the ten copies
    // a run keeps at its peak.
    const LIMIT: usize = 1 << 30;
    let d = tempfile::tempdir().unwrap();
    let args = ["train", "input.json", "--backend", "cpu"];
    let mut input = tiny_input(1, &[]);
    input["model"]["fitting_net"]["neuron"] = json!([3072, 3072]);
    write_input(d.path(), &input);
    let out = dpw_under(d.path(), &format!("-v {}", LIMIT >> 10), &args);
    failed(
        out,
        &args,
        &["out of memory", "parameters", "fitting_net neuron"],
    );
}

//! Fuzzing of input.json key by key, and of a run's output paths, in process.
//!
//! Every key dpw knows (those of the expanded input, which lists them all with their defaults,
//! as out.json does) is set in turn to values of the wrong type, out of range, huge, negative,
//! NaN-like or empty, and is removed: loading must succeed or fail naming the key, never panic.
//! The outputs of a run (`-o`, `-l`, `disp_file`, `save_ckpt`) are pointed at random at the
//! inputs, at each other and into missing folders: the start-up check must refuse every clash,
//! naming a path, and never panic. Deterministic (a fixed seed); `DPW_FUZZ_CASES` sets the
//! number of output cases (default 2000).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use dpw::backend::Dims;
use dpw::config::Config;
use dpw::data::Disk;
use dpw::train::budget::check_workspace;
use dpw::train::outputs::{check_files, RunFile, RunFiles};
use dpw::train::setup::{prepare_in, Start};
use dpw::train::step::DeviceModel;

fn water() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water"))
}

/// The water example with every default filled in.
fn full_input() -> Value {
    let text = std::fs::read_to_string(water().join("input.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    Config::from_value(&v, &water()).unwrap().to_expanded_json()
}

/// A step of a path in a JSON tree.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// The path of every node below the root.
fn node_paths(v: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    let children: Vec<(Step, &Value)> = match v {
        Value::Object(m) => m.iter().map(|(k, c)| (Step::Key(k.clone()), c)).collect(),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, c)| (Step::Index(i), c))
            .collect(),
        _ => return,
    };
    for (s, c) in children {
        at.push(s);
        out.push(at.clone());
        node_paths(c, at, out);
        at.pop();
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// The last key of `path` (an array element is named by its array's key).
fn last_key(path: &[Step]) -> &str {
    path.iter()
        .rev()
        .find_map(|s| match s {
            Step::Key(k) => Some(k.as_str()),
            Step::Index(_) => None,
        })
        .expect("every path starts with a key")
}

fn bad_values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(""),
        json!("x"),
        json!("nan"),
        json!(".inf"),
        json!("-1"),
        json!([]),
        json!([1, "a"]),
        json!({}),
        json!({"a": 1}),
        json!(0),
        json!(-1),
        json!(-0.5),
        json!(0.5),
        json!(2.5),
        json!(1e-320),
        json!(1e308),
        json!(-1e308),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(4294967296u64),
    ]
}

/// Loads `v`; `Ok(None)` if it loads, `Ok(Some(message))` for an error, `Err` for a panic.
fn load(v: &Value) -> Result<Option<String>, ()> {
    catch_unwind(AssertUnwindSafe(|| {
        Config::from_value(v, &water()).err().map(|e| e.to_string())
    }))
    .map_err(|_| ())
}

#[test]
fn every_key_with_every_bad_value() {
    let base = full_input();
    let mut paths = Vec::new();
    node_paths(&base, &mut Vec::new(), &mut paths);
    let values = bad_values();
    let (mut cases, mut refused) = (0, 0);
    let mut faults = Vec::new();
    let t = std::time::Instant::now();
    for path in &paths {
        let key = last_key(path);
        let mut variants: Vec<(String, Value)> = values
            .iter()
            .map(|bad| {
                let mut v = base.clone();
                *node_mut(&mut v, path) = bad.clone();
                (bad.to_string(), v)
            })
            .collect();
        if let Some(Step::Key(k)) = path.last() {
            let mut v = base.clone();
            if let Some(m) = node_mut(&mut v, &path[..path.len() - 1]).as_object_mut() {
                m.remove(k);
            }
            variants.push(("(removed)".into(), v));
        }
        for (what, v) in variants {
            cases += 1;
            match load(&v) {
                Err(()) => faults.push(format!("{path:?} = {what}: panicked")),
                Ok(Some(msg)) => {
                    refused += 1;
                    if !msg.contains(key) {
                        faults.push(format!("{path:?} = {what}: {key:?} not in {msg:?}"));
                    }
                }
                Ok(None) => {}
            }
        }
    }
    eprintln!(
        "{} keys, {cases} cases ({refused} refused) in {:.1} s",
        paths.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(paths.len() > 50, "only {} keys walked", paths.len());
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

fn cases() -> u64 {
    std::env::var("DPW_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Copies the files of water data_0 (the system folder and set.000) into `dst`.
fn copy_system(dst: &Path) {
    let src = water().join("data_0");
    for sub in ["", "set.000"] {
        std::fs::create_dir_all(dst.join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dst.join(sub).join(e.file_name())).unwrap();
            }
        }
    }
}

/// Names an output may take: inputs, other outputs' names, a step file of the checkpoint,
/// folders, missing folders, and a name through `..`.
const TARGETS: &[&str] = &[
    "input.json",
    "out.json",
    "lcurve.out",
    "train.log",
    "model.ckpt",
    "model.ckpt-100",
    "init.ckpt",
    "sys/set.000/coord.npy",
    "sys/type.raw",
    "sys/notes.txt",
    "sys",
    "sub",
    "sub/",
    "sub/../out.json",
    "sub/lcurve.out",
    "missing/out.json",
    ".dpw-train.lock",
    "other.out",
];

/// Whether two names of [`TARGETS`] are one file (`sub/../x` is `x`).
fn same(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.strip_prefix("sub/../").unwrap_or(s).to_string();
    norm(a) == norm(b)
}

#[test]
fn output_paths_that_clash_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().canonicalize().unwrap();
    copy_system(&root.join("sys"));
    std::fs::create_dir(root.join("sub")).unwrap();
    for f in ["input.json", "init.ckpt", "sys/notes.txt"] {
        std::fs::write(root.join(f), "{}").unwrap();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    let pick = |rng: &mut ChaCha8Rng| TARGETS[rng.random_range(0..TARGETS.len())];
    let (mut refused, mut faults) = (0, Vec::new());
    let t = std::time::Instant::now();
    for case in 0..cases() {
        let out = pick(&mut rng);
        let log = rng.random_bool(0.5).then(|| pick(&mut rng));
        let (disp, ckpt) = (pick(&mut rng), pick(&mut rng));
        let model = rng.random_bool(0.3).then_some("init.ckpt");
        let mut input = full_input();
        input["training"]["training_data"]["systems"] = json!([root.join("sys")]);
        input["training"]["validation_data"]["systems"] = json!([root.join("sys")]);
        input["training"]["disp_file"] = json!(disp);
        input["training"]["save_ckpt"] = json!(ckpt);
        let cfg = Config::from_value(&input, &root).unwrap();
        let files = RunFiles {
            input: RunFile::new("the input file", root.join("input.json")),
            model: model.map(|m| RunFile::new("--init-model", root.join(m))),
            outputs: [("-o/--output", Some(out)), ("-l/--log-path", log)]
                .into_iter()
                .filter_map(|(flag, p)| Some(RunFile::new(flag, root.join(p?))))
                .collect(),
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            check_files(&root, &files, &cfg.training)
        }));
        let named: Vec<&str> = [Some(out), log, Some(disp), Some(ckpt)]
            .into_iter()
            .flatten()
            .collect();
        let case = format!("case {case}: -o {out} -l {log:?} disp_file {disp} save_ckpt {ckpt}");
        let outputs_clash = named
            .iter()
            .enumerate()
            .any(|(i, a)| named[i + 1..].iter().any(|b| same(a, b)));
        // A file of the system folder that is not data (notes.txt) may be written; a
        // checkpoint written over the model the run starts from is how a restart goes on.
        let inputs = ["sys", "sys/type.raw", "sys/set.000/coord.npy", "input.json"];
        let replaces_input = named.iter().any(|o| inputs.iter().any(|i| same(o, i)))
            || (model.is_some()
                && [Some(out), log, Some(disp)]
                    .into_iter()
                    .flatten()
                    .any(|o| same(o, "init.ckpt")));
        let must_fail = outputs_clash
            || replaces_input
            || named
                .iter()
                .any(|o| o.starts_with("missing/") || o.ends_with('/'))
            || named.contains(&"sub")
            || named.contains(&".dpw-train.lock");
        match result {
            Err(_) => faults.push(format!("{case}: panicked")),
            Ok(Err(e)) => {
                refused += 1;
                let msg = format!("{e:#}");
                let names_one = named.iter().any(|n| msg.contains(n.trim_end_matches('/')));
                if !names_one {
                    faults.push(format!("{case}: no path named in {msg:?}"));
                }
            }
            Ok(Ok(())) if must_fail => faults.push(format!("{case}: accepted")),
            Ok(Ok(())) => {}
        }
    }
    eprintln!(
        "{} output cases ({refused} refused) in {:.1} s",
        cases(),
        t.elapsed().as_secs_f64()
    );
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// A tiny model of `descriptor` on water data_0, one statistics batch.
fn tiny_with(descriptor: Value) -> Value {
    json!({
        "model": {"type_map": ["O", "H"], "descriptor": descriptor,
                  "fitting_net": {"neuron": [8], "seed": 1}, "data_stat_nbatch": 1},
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "ener"},
        "training": {"training_data": {"systems": [water().join("data_0")], "batch_size": 1},
                     "numb_steps": 1, "seed": 1}
    })
}

/// Values of a sel or size key: zero, negative, non-integer, huge, of the wrong length.
fn size_values() -> Vec<Value> {
    vec![
        json!(0),
        json!(-1),
        json!(2.5),
        json!("2"),
        json!(1e308),
        json!(u64::MAX),
        json!(4294967296u64),
        json!(5000),
        json!([]),
        json!([0]),
        json!([0, 0]),
        json!([0, 0, 0]),
        json!([-1, 2]),
        json!([2.5, 3]),
        json!([2000, 2000]),
        json!([100000, 1]),
        json!([1e18, 1e18]),
        json!([u64::MAX, u64::MAX]),
        json!("auto"),
        json!("auto:0.01"),
    ]
}

/// Issue 59: the sel and size keys of the newer descriptors (se_e3, se_atten, se_atten_v2, and a
/// hybrid's list) set to zero, negative, non-integer, huge or ill-sized values. Loading refuses
/// them naming the key, or the whole start-up of a run follows (the data read, sel resolved, the
/// model checked and its statistics computed, and the workspace of a one-frame batch checked
/// against the memory): it must end in a model or an error, never a panic nor an allocation of
/// what the memory cannot hold.
#[test]
fn descriptor_sels_and_sizes_of_every_kind() {
    let common = json!({"rcut": 4.0, "rcut_smth": 0.5, "neuron": [4, 8], "seed": 1});
    let with = |extra: Value| {
        let mut d = common.clone();
        d.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        d
    };
    let atten = json!({"sel": 40, "attn": 8, "attn_layer": 1, "tebd_dim": 4, "axis_neuron": 4});
    let attn_keys = [
        "sel",
        "neuron",
        "axis_neuron",
        "attn",
        "attn_layer",
        "tebd_dim",
    ];
    let mut v2 = atten.clone();
    v2["type"] = json!("se_atten_v2");
    let mut v1 = atten;
    v1["type"] = json!("se_atten");
    let sub_a = with(json!({"type": "se_e2_a", "sel": [20, 28], "axis_neuron": 4}));
    let sub_r = with(json!({"type": "se_e2_r", "sel": [20, 28]}));
    let bases = [
        (
            with(json!({"type": "se_e3", "sel": [20, 28]})),
            vec!["sel", "neuron"],
        ),
        (with(v1), attn_keys.to_vec()),
        (with(v2), attn_keys.to_vec()),
        (
            json!({"type": "hybrid", "list": [sub_a, sub_r]}),
            vec![
                "list/0/sel",
                "list/1/sel",
                "list/0/neuron",
                "list/0/axis_neuron",
            ],
        ),
    ];
    let b = dpw::backend::cpu::Cpu::default();
    let (mut cases, mut refused, mut faults) = (0, 0, Vec::new());
    let t = std::time::Instant::now();
    for (descriptor, keys) in &bases {
        for key in keys {
            for bad in size_values() {
                cases += 1;
                let mut input = tiny_with(descriptor.clone());
                let at = format!("/model/descriptor/{key}");
                *input.pointer_mut(&at).unwrap() = bad.clone();
                let case = format!("{} {key} = {bad}", descriptor["type"]);
                let name = key.rsplit('/').next().unwrap();
                let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
                    let cfg = Config::from_value(&input, &water()).map_err(|e| e.to_string())?;
                    let setup = prepare_in(
                        &Disk,
                        cfg,
                        Start::Fresh,
                        true,
                        Path::new("."),
                        web_time::Instant::now(),
                    )
                    .map_err(|e| format!("{e:#}"))?;
                    let model = &setup.model;
                    let dm = DeviceModel::<f64, _>::new(&b, model);
                    let dims = Dims::of_descriptor(&model.spec.descriptor, 1, &[64, 128]);
                    check_workspace(&b, &dm, &dims).map_err(|e| e.to_string())
                }));
                match outcome {
                    Err(_) => faults.push(format!("{case}: panicked")),
                    Ok(Err(msg)) => {
                        refused += 1;
                        if !msg.contains(name) && !msg.contains("cannot allocate") {
                            faults.push(format!("{case}: {name:?} not in {msg:?}"));
                        }
                    }
                    Ok(Ok(())) => {}
                }
            }
        }
    }
    eprintln!(
        "{cases} sel and size cases ({refused} refused) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

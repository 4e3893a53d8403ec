//! Mixed-type data (`deepmd/npy/mixed`): tests/data/mixed/alloy, six alloy frames of three
//! compositions in one system, and DeePMD-kit 3.2.0's numbers on it
//! (tests/reference/mixed_data.json, made by scripts/make-reference/mixed_data.py): the frames
//! read are the alloy example's, batches of mixed compositions predict what DeePMD-kit does,
//! the statistics and the energy bias are DeePMD-kit's, a DPA-1 model trains on them, and what
//! dpw does not read is refused by name.
mod common;

use std::path::{Path, PathBuf};

use dpw::backend::cpu::Cpu;
use dpw::data::{load_system, System};
use dpw::geometry::{energy_bias, Cell, EnvStats};
use dpw::model::{read_deepmd_yaml, Model};
use dpw::train::batch::{assemble, assemble_frames, Frame};
use dpw::train::predict::predict_batch;
use ndarray::{ArrayD, IxDyn};
use ndarray_npy::WriteNpyExt;
use serde_json::{json, Value};

use common::repo;

const MIXED: &str = "tests/data/mixed/alloy";

fn type_map() -> Vec<String> {
    ["Cu", "Ni", "Al"].map(String::from).to_vec()
}

fn reference() -> Value {
    let text = std::fs::read_to_string(repo("tests/reference/mixed_data.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn mixed() -> System {
    load_system(&repo(MIXED), &type_map()).unwrap_or_else(|e| panic!("{e:#}"))
}

fn numbers(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(numbers).collect(),
        v => vec![v.as_f64().unwrap()],
    }
}

/// The model DeePMD-kit evaluated: se_atten (concat, davg != 0, so the padding slots' type
/// reaches the energy).
fn model() -> Model {
    read_deepmd_yaml(&repo("tests/reference/dpa1/se_atten_l2_alloy/model.yaml")).unwrap()
}

fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    common::max_abs_diff(a, b) / scale
}

/// Each frame is the alloy frame it was made from: its atoms sorted by type are the source's
/// atoms (a frame's type blocks were only rotated), with the same coordinates, forces and
/// labels; its types are those DeePMD-kit's loader gives, read through the data's own
/// type_map.raw (Al, Cu, Ni) onto the model's (Cu, Ni, Al); and its padding type is that of its
/// first atom in the file, as DeePMD-kit (which does not sort a mixed frame) takes it.
#[test]
fn frames_are_the_alloy_frames_they_came_from() {
    let r = reference();
    let sys = mixed();
    assert!(sys.mixed);
    assert_eq!((sys.natoms, sys.nframes), (108, 6));
    let deepmd_atype: Vec<Vec<usize>> = (r["deepmd_atype"].as_array().unwrap().iter())
        .map(|f| numbers(f).iter().map(|&t| t as usize).collect())
        .collect();
    for (k, src) in r["frames"].as_array().unwrap().iter().enumerate() {
        let from = load_system(&repo(src["system"].as_str().unwrap()), &type_map()).unwrap();
        let f = src["frame"].as_u64().unwrap() as usize;
        assert_eq!(sys.frame_atype(k), &from.atype[..], "frame {k}");
        assert_eq!(sys.frame_coord(k), from.frame_coord(f), "frame {k}");
        assert_eq!(sys.frame_force(k), from.frame_force(f), "frame {k}");
        assert_eq!(sys.frame_cell(k), from.frame_cell(f), "frame {k}");
        assert_eq!(sys.frame_virial(k), from.frame_virial(f), "frame {k}");
        assert_eq!(sys.energy[k], from.energy[f], "frame {k}");
        let rows = sys.frame_orig_index(k);
        for (i, &row) in rows.iter().enumerate() {
            assert_eq!(
                sys.frame_atype(k)[i],
                deepmd_atype[k][row],
                "frame {k} atom {i}"
            );
        }
        assert_eq!(sys.pad_type(k), deepmd_atype[k][0], "frame {k}");
    }
    // The rotated blocks put Ni, then Al first in frames 1 and 2: not the lowest type present.
    assert_eq!(
        (0..3).map(|k| sys.pad_type(k)).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    let info = sys.info();
    assert!(info.mixed);
    assert_eq!(info.compositions.len(), 3);
    assert!(info.compositions.iter().all(|c| c.nframes == 2));
}

/// A batch of a mixed system's frames of one composition is the batch of the same frames of the
/// normal system, number for number; with a first atom of another type in the file, only the
/// padding slots' type differs (DeePMD-kit's atom 0).
#[test]
fn batches_are_those_of_the_normal_systems() {
    let m = model();
    let sys = mixed();
    let r = reference();
    let source = |k: usize| {
        load_system(
            &repo(r["frames"][k]["system"].as_str().unwrap()),
            &type_map(),
        )
        .unwrap()
    };
    // Frames 0 and 3 (Cu65Ni32Al11_a 0, 1) list Cu first; frame 1 (Cu36Ni36Al36 0) Ni first.
    for (mixed_frames, src, src_frames, pad) in [
        (vec![0, 3], source(0), vec![0, 1], 0),
        (vec![1], source(1), vec![0], 1),
    ] {
        let a = assemble_frames(&m.spec, &sys, &mixed_frames, "test").unwrap();
        let fr: Vec<Frame> = src_frames.iter().map(|&f| Frame::of(&src, f)).collect();
        let b = assemble(&m.spec, &src.atype, &fr).unwrap();
        assert_eq!(a.dims, b.dims);
        assert_eq!(
            (&a.rij, &a.owner, &a.centre_atom),
            (&b.rij, &b.owner, &b.centre_atom)
        );
        assert_eq!(
            (&a.energy, &a.force, &a.virial),
            (&b.energy, &b.force, &b.virial)
        );
        for (s, (&x, &y)) in a.nei_type.iter().zip(&b.nei_type).enumerate() {
            match a.owner[s] < 0 {
                true => assert_eq!((x, y), (pad, 0), "padding slot {s}"),
                false => assert_eq!(x, y, "slot {s}"),
            }
        }
    }
}

/// One batch of all six frames (three compositions) on the cpu backend predicts DeePMD-kit's
/// energies, forces and virials (PyTorch, each frame with its own types in file order), and the
/// same numbers as each frame alone.
#[test]
fn a_batch_of_mixed_compositions_predicts_deepmds_numbers() {
    let m = model();
    let sys = mixed();
    let ev = &reference()["eval"];
    let all: Vec<usize> = (0..sys.nframes).collect();
    let batch = assemble_frames(&m.spec, &sys, &all, "test").unwrap();
    let centres = |f| {
        (0..3)
            .map(|t| batch.dims.frame_centres(t, f).len())
            .collect::<Vec<_>>()
    };
    assert!(
        (1..sys.nframes).any(|f| centres(f) != centres(0)),
        "one composition"
    );
    let p = predict_batch::<f64, _>(&Cpu::default(), &m, &batch).unwrap();
    let n = sys.natoms;
    // Forces back to the file's atom order.
    let mut force = vec![0.0; p.force.len()];
    for f in 0..sys.nframes {
        for (i, &row) in sys.frame_orig_index(f).iter().enumerate() {
            let (to, from) = (3 * (f * n + row), 3 * (f * n + i));
            force[to..to + 3].copy_from_slice(&p.force[from..from + 3]);
        }
    }
    let (e, fo, v) = (
        rel(&p.energy, &numbers(&ev["energy"])),
        rel(&force, &numbers(&ev["force"])),
        rel(&p.virial, &numbers(&ev["virial"])),
    );
    eprintln!("against DeePMD-kit: energy {e:.2e}, force {fo:.2e}, virial {v:.2e}");
    assert!(e < 1e-13 && fo < 1e-12 && v < 1e-12, "{e} {fo} {v}");
    // Sorted by type with the lowest type as padding, frames 1 and 2 would give other energies.
    let sorted = numbers(&ev["energy_sorted_by_type"]);
    assert!((p.energy[1] - sorted[1]).abs() > 1.0);
    for f in 0..sys.nframes {
        let one = assemble_frames(&m.spec, &sys, &[f], "test").unwrap();
        let q = predict_batch::<f64, _>(&Cpu::default(), &m, &one).unwrap();
        assert!((q.energy[0] - p.energy[f]).abs() <= 1e-12 * p.energy[f].abs());
        assert!(rel(&q.force, &p.force[3 * f * n..3 * (f + 1) * n]) < 1e-12);
    }
}

/// The training gradient of a batch of three compositions is the mean of its frames' own (the
/// loss is a mean over frames of one atom count), through every pass of DPA-1 on the cpu
/// backend: the per-frame bookkeeping of a batch of mixed compositions adds nothing and loses
/// nothing.
#[test]
fn a_batch_of_mixed_compositions_has_the_mean_gradient_of_its_frames() {
    use dpw::backend::Prefactors;
    use dpw::train::step::DeviceModel;
    use dpw::train::workspaces::{batch_gradient, Cache};

    let m = model();
    let sys = mixed();
    let b = Cpu::default();
    let pref = Prefactors {
        e: 0.5,
        f: 20.0,
        v: 0.3,
    };
    let grad = |frames: &[usize]| {
        let batch = assemble_frames(&m.spec, &sys, frames, "test").unwrap();
        let mut dm = DeviceModel::<f64, Cpu>::new(&b, &m);
        let mut cache: Cache<f64, Cpu> = Vec::new();
        batch_gradient(&b, &mut dm, &mut cache, &batch, pref).unwrap();
        dm.grad_f64(&b)
    };
    let frames = [0, 1, 2];
    let whole = grad(&frames);
    let mut mean = vec![0.0; whole.len()];
    for f in frames {
        for (m, g) in mean.iter_mut().zip(grad(&[f])) {
            *m += g / frames.len() as f64;
        }
    }
    let r = rel(&whole, &mean);
    eprintln!("batch gradient against the mean of its frames': {r:.2e}");
    assert!(r < 1e-12, "{r}");
}

/// davg/dstd and the energy bias over the six frames, each with its own types, are what
/// DeePMD-kit's `dp train` path computes (`make_stat_input`, `compute_or_load_stat`: the bias is
/// the least squares over each frame's own type counts, its `real_natoms_vec`).
#[test]
fn statistics_and_bias_are_deepmds() {
    let r = reference();
    let st = &r["stats"];
    assert_eq!(numbers(&st["frames_used"]), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let m = model();
    let mut d = m.spec.descriptor.clone();
    d.set_davg_zero = st["set_davg_zero"].as_bool().unwrap();
    let sys = mixed();
    let mut env = EnvStats::new(3);
    let (mut counts, mut energy) = (Vec::new(), Vec::new());
    for f in 0..sys.nframes {
        let cell = Cell::new(sys.frame_cell(f).unwrap());
        env.add_frame(&d, sys.frame_coord(f), cell.as_ref(), sys.frame_atype(f));
        counts.push(sys.type_counts(f, 3).iter().map(|&c| c as f64).collect());
        energy.push(sys.energy[f]);
    }
    let (davg, dstd) = env.davg_dstd(d.set_davg_zero);
    let (bias, _) = energy_bias(&counts, &energy);
    let (a, s, b) = (
        rel(&davg, &numbers(&st["davg_per_type"])),
        rel(&dstd, &numbers(&st["dstd_per_type"])),
        rel(&bias, &numbers(&st["energy_bias"])),
    );
    eprintln!("against DeePMD-kit: davg {a:.2e}, dstd {s:.2e}, bias {b:.2e}");
    assert!(a < 1e-13 && s < 1e-13 && b < 1e-13, "{a} {s} {b}");
}

fn dpw(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// A small se_atten (concat, set_davg_zero false, as the reference) on the mixed system,
/// batches of three frames of mixed compositions.
fn train_input(steps: usize) -> Value {
    let mut desc = json!({"type": "se_atten", "sel": 48, "rcut": 4.0, "rcut_smth": 0.5,
        "neuron": [4, 8, 16], "axis_neuron": 4, "tebd_dim": 8, "attn": 8, "attn_layer": 2,
        "set_davg_zero": false, "seed": 1});
    desc["_comment"] =
        json!("as tests/reference/dpa1/se_atten_l2_alloy, with DeePMD-kit's defaults");
    json!({
        "model": {"type_map": type_map(), "descriptor": desc,
                  "fitting_net": {"neuron": [16, 16], "resnet_dt": true, "seed": 2},
                  "data_stat_nbatch": 1},
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                 "limit_pref_f": 1, "start_pref_v": 0.02, "limit_pref_v": 1},
        "training": {
            "training_data": {"systems": [repo(MIXED)], "batch_size": 6},
            "validation_data": {"systems": [repo(MIXED)], "batch_size": 3},
            "numb_steps": steps, "seed": 10, "disp_freq": 1, "save_freq": 1000
        }
    })
}

/// `dpw train` on the mixed system (cpu): statistics over one batch of all six frames are
/// DeePMD-kit's (in the frozen model), then steps on batches of three compositions with finite
/// losses, and `dpw test` on the mixed system.
#[test]
fn dpa1_trains_and_tests_on_mixed_data() {
    let d = tempfile::tempdir().unwrap();
    let write = |v: &Value| {
        std::fs::write(
            d.path().join("input.json"),
            serde_json::to_string(v).unwrap(),
        )
        .unwrap()
    };
    write(&train_input(0));
    let out = dpw(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let out = dpw(d.path(), &["freeze", "-o", "m.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = read_deepmd_yaml(&d.path().join("m.yaml")).unwrap();
    let st = &reference()["stats"];
    for (name, ours, theirs) in [
        ("davg", &m.davg, numbers(&st["davg_per_type"])),
        ("dstd", &m.dstd, numbers(&st["dstd_per_type"])),
        ("bias", &m.bias, numbers(&st["energy_bias"])),
    ] {
        let r = rel(ours, &theirs);
        eprintln!("dpw train's {name} against DeePMD-kit's: {r:.2e}");
        assert!(r < 1e-13, "{name}: {ours:?} vs {theirs:?}");
    }

    let mut input = train_input(4);
    input["training"]["training_data"]["batch_size"] = json!(3);
    write(&input);
    std::fs::remove_file(d.path().join("lcurve.out")).ok();
    let out = dpw(d.path(), &["train", "input.json", "--backend", "cpu"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lcurve = std::fs::read_to_string(d.path().join("lcurve.out")).unwrap();
    let rows: Vec<&str> = lcurve.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 4, "{lcurve}");
    assert!(rows.iter().all(|r| !r.contains("nan")), "{lcurve}");

    let sys = repo(MIXED).display().to_string();
    let out = dpw(
        d.path(),
        &["test", "-m", "model.ckpt", "-s", &sys, "--backend", "cpu"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("number of test data : 6"), "{text}");
}

/// A copy of the mixed system with `edit` applied to its files (relative path, contents).
fn edited(dir: &Path, edit: impl Fn(&Path)) -> PathBuf {
    let dst = dir.join("sys");
    for entry in walk(&repo(MIXED)) {
        let rel = entry.strip_prefix(repo(MIXED)).unwrap();
        std::fs::create_dir_all(dst.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(&entry, dst.join(rel)).unwrap();
    }
    edit(&dst);
    dst
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        match p.is_dir() {
            true => out.extend(walk(&p)),
            false => out.push(p),
        }
    }
    out
}

/// Rewrites set.000's real_atom_types.npy as `[rows, cols]` of `value(frame, atom)`.
fn real_types(sys: &Path, rows: usize, cols: usize, value: impl Fn(usize, usize) -> i64) {
    let v: Vec<i64> = (0..rows * cols)
        .map(|k| value(k / cols, k % cols))
        .collect();
    let a = ArrayD::from_shape_vec(IxDyn(&[rows, cols]), v).unwrap();
    let f = std::fs::File::create(sys.join("set.000/real_atom_types.npy")).unwrap();
    a.write_npy(f).unwrap();
}

/// A change to a copy of the mixed system's files.
type Edit = Box<dyn Fn(&Path)>;

/// What dpw does not read as DeePMD-kit would is refused, naming the file, the frame and atom
/// where there is one, and what was expected.
#[test]
fn what_is_not_read_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "virtual atom",
            Box::new(|s| real_types(s, 4, 108, |f, a| if (f, a) == (2, 107) { -1 } else { 1 })),
            vec!["real_atom_types.npy", "frame 2, atom 107", "virtual atom"],
        ),
        (
            "type past type_map.raw",
            Box::new(|s| real_types(s, 4, 108, |f, a| if (f, a) == (1, 5) { 3 } else { 1 })),
            vec![
                "real_atom_types.npy",
                "frame 1, atom 5",
                "lists only 3 elements",
            ],
        ),
        (
            "negative type",
            Box::new(|s| real_types(s, 4, 108, |f, _| if f == 3 { -2 } else { 1 })),
            vec![
                "real_atom_types.npy",
                "frame 3, atom 0",
                "not a non-negative integer",
            ],
        ),
        (
            "element not in the model",
            Box::new(|s| std::fs::write(s.join("type_map.raw"), "Al\nCu\nZn\n").unwrap()),
            vec!["type_map.raw", "\"Zn\"", "absent from the type_map"],
        ),
        (
            "shape",
            Box::new(|s| real_types(s, 4, 107, |_, _| 0)),
            vec!["real_atom_types.npy", "[4, 108]", "[4, 107]"],
        ),
        (
            "one set without types",
            Box::new(|s| std::fs::remove_file(s.join("set.001/real_atom_types.npy")).unwrap()),
            vec!["set.001", "real_atom_types.npy", "must all have it"],
        ),
        (
            "type.raw of two types",
            Box::new(|s| {
                std::fs::write(s.join("type.raw"), format!("1\n{}", "0\n".repeat(107))).unwrap()
            }),
            vec!["type.raw", "atom 1 has type 0 but atom 0 has 1", "one type"],
        ),
    ];
    for (i, (what, edit, names)) in cases.iter().enumerate() {
        let dir = d.path().join(i.to_string());
        let sys = edited(&dir, edit);
        let err = format!("{:#}", load_system(&sys, &type_map()).unwrap_err());
        for n in names {
            assert!(err.contains(n), "{what}: {n:?} not in {err}");
        }
    }
    // Without type_map.raw the types index the model's type_map, as DeePMD-kit reads them.
    let sys = edited(&d.path().join("no_map"), |s| {
        std::fs::remove_file(s.join("type_map.raw")).unwrap()
    });
    let read = load_system(&sys, &type_map()).unwrap();
    assert_eq!(read.type_counts(1, 3), [36, 36, 36]);
    let sys = edited(&d.path().join("no_map_range"), |s| {
        std::fs::remove_file(s.join("type_map.raw")).unwrap();
        real_types(s, 4, 108, |f, a| if (f, a) == (0, 9) { 3 } else { 0 });
    });
    let err = load_system(&sys, &type_map()).unwrap_err().to_string();
    assert!(
        err.contains("frame 0, atom 9 has type 3, out of range"),
        "{err}"
    );
}

/// Mixed-type data with a descriptor that keeps one neighbour section per type (se_e2_a) is
/// refused at start-up, naming the system and the descriptor.
#[test]
fn mixed_data_needs_a_mixed_type_descriptor() {
    let d = tempfile::tempdir().unwrap();
    let mut input = train_input(2);
    input["model"]["descriptor"] = json!({"type": "se_e2_a", "sel": [30, 30, 30], "rcut": 4.0,
        "rcut_smth": 0.5, "neuron": [4, 8], "axis_neuron": 4, "seed": 1});
    std::fs::write(d.path().join("input.json"), input.to_string()).unwrap();
    let out = dpw(d.path(), &["train", "input.json", "--backend", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for n in [MIXED, "needs a mixed-type descriptor", "not se_e2_a"] {
        assert!(err.contains(n), "{n:?} not in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

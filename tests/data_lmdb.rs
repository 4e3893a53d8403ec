//! DeePMD-kit's LMDB training data (src/data/lmdb.rs): an environment reads as the deepmd/npy
//! systems of its frames, trains as they do, and a bad one is refused naming what is wrong.
#![cfg(feature = "lmdb")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dpw::data::{find_systems, load_system, load_system_with, Disk, Labels, Missing, System};
use heed::types::Bytes;
use heed::EnvOpenOptions;
use ndarray::{s, Array1, Array2};
use ndarray_npy::{read_npy, write_npy};
use rmpv::Value;
use tempfile::TempDir;

use common::{copy_dir, repo};

/// tests/data/lmdb/water_c4h3o1.lmdb (scripts/make-reference/lmdb_data.py): frames 0-3 of the
/// water example's data_3 (system id 0) interleaved with the 15 frames of tests/data/nopbc/C4H3O1
/// (system id 1), in DeePMD-kit's LMDB format.
fn lmdb() -> PathBuf {
    repo("tests/data/lmdb/water_c4h3o1.lmdb")
}

fn type_map() -> Vec<String> {
    ["O", "H", "C"].map(String::from).to_vec()
}

/// The npy form of the LMDB's frames at `dir`: data_3's first four frames, and C4H3O1.
fn npy_form(dir: &Path) -> Vec<PathBuf> {
    let water = dir.join("water4");
    let src = repo("examples/water/data_3");
    std::fs::create_dir_all(water.join("set.000")).unwrap();
    for f in ["type.raw", "type_map.raw"] {
        std::fs::copy(src.join(f), water.join(f)).unwrap();
    }
    for f in ["coord", "box", "force"] {
        let a: Array2<f32> = read_npy(src.join(format!("set.000/{f}.npy"))).unwrap();
        write_npy(
            water.join(format!("set.000/{f}.npy")),
            &a.slice(s![..4, ..]).to_owned(),
        )
        .unwrap();
    }
    let e: Array1<f32> = read_npy(src.join("set.000/energy.npy")).unwrap();
    write_npy(
        water.join("set.000/energy.npy"),
        &e.slice(s![..4]).to_owned(),
    )
    .unwrap();
    let mol = dir.join("C4H3O1");
    copy_dir(&repo("tests/data/nopbc/C4H3O1"), &mol);
    vec![water, mol]
}

fn assert_same(a: &System, b: &System) {
    assert_eq!(
        (a.natoms, a.nframes, a.mixed),
        (b.natoms, b.nframes, b.mixed)
    );
    assert_eq!(a.atype, b.atype);
    assert_eq!(a.orig_index, b.orig_index);
    assert_eq!(a.coord, b.coord);
    assert_eq!(a.cell, b.cell);
    assert_eq!(a.energy, b.energy);
    assert_eq!(a.force, b.force);
    assert_eq!(a.virial, b.virial);
    assert_eq!((a.has_energy, a.has_force), (b.has_energy, b.has_force));
}

#[test]
fn an_lmdb_reads_as_the_npy_systems_of_its_frames() {
    let tmp = TempDir::new().unwrap();
    let npy = npy_form(tmp.path());
    let found = find_systems(&Disk, &[lmdb()], "training").unwrap();
    let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
    let file = lmdb().display().to_string();
    assert_eq!(names, [format!("{file}#0"), format!("{file}#1")]);
    for (from_lmdb, from_npy) in found.iter().zip(&npy) {
        let a = load_system(from_lmdb, &type_map()).unwrap();
        let b = load_system(from_npy, &type_map()).unwrap();
        assert_same(&a, &b);
    }
    // The molecule's frames have no cell; its atoms were sorted by type as a folder's are.
    let mol = load_system(&found[1], &type_map()).unwrap();
    assert!(mol.cell.is_none() && mol.nframes == 15);
    assert_ne!(mol.orig_index, (0..8).collect::<Vec<_>>());
}

/// `dpw train` on the LMDB and on the npy form of its frames: the same statistics and batches,
/// so the same lcurve.out.
#[test]
fn training_on_lmdb_equals_training_on_its_npy_form() {
    let tmp = TempDir::new().unwrap();
    let npy = npy_form(tmp.path());
    let mut lcurves = Vec::new();
    for systems in [serde_json::json!(lmdb()), serde_json::json!(npy)] {
        let run = TempDir::new().unwrap();
        let mut input = common::tiny_water_input(systems, 6);
        input["model"]["type_map"] = serde_json::json!(type_map());
        input["model"]["descriptor"]["sel"] = serde_json::json!([20, 28, 4]);
        common::train_cpu(run.path(), &input);
        lcurves.push(std::fs::read_to_string(run.path().join("lcurve.out")).unwrap());
    }
    assert_eq!(lcurves[0].lines().count(), 8);
    assert_eq!(lcurves[0], lcurves[1]);
}

/// tests/data/lmdb/dos_si32.lmdb and fparam_be54.lmdb (scripts/make-reference/lmdb_labels.py):
/// the frames of DeePMD-kit's DOS example system heat-221 (`dos`, and `atomic_dos`, which
/// DeePMD-kit reads as `atom_dos`) and of its fparam example system e3000_i2000 (`fparam`,
/// `aparam`), and their npy form.
fn labelled_lmdbs() -> [(PathBuf, PathBuf, &'static str); 2] {
    let examples = repo("tests/data/deepmd-kit/examples");
    [
        (
            repo("tests/data/lmdb/dos_si32.lmdb"),
            examples.join("dos/data/heat-221"),
            "Si",
        ),
        (
            repo("tests/data/lmdb/fparam_be54.lmdb"),
            examples.join("fparam/data/e3000_i2000"),
            "Be",
        ),
    ]
}

fn dos_labels(name: &str, missing: Missing) -> Labels {
    Labels::Frame {
        name: name.into(),
        width: 250,
        frame: true,
        atomic: true,
        missing,
        excluded: vec![],
    }
}

/// The labels of the other fittings (a DOS, frame and atomic parameters) read from an LMDB as
/// from the npy form of its frames, and one it lacks is missing from both alike.
#[test]
fn an_lmdbs_fitting_labels_read_as_from_npy() {
    let mut read = Vec::new();
    for (lmdb, npy, element) in labelled_lmdbs() {
        let type_map = vec![element.to_string()];
        let found = find_systems(&Disk, std::slice::from_ref(&lmdb), "training").unwrap();
        assert_eq!(found.len(), 1, "{}", lmdb.display());
        let labels = dos_labels("dos", Missing::Refuse);
        let a = load_system_with(&found[0], &type_map, &labels).unwrap();
        let b = load_system_with(&npy, &type_map, &labels).unwrap();
        assert_same(&a, &b);
        assert_eq!((&a.fparam, &a.aparam), (&b.fparam, &b.aparam));
        assert_eq!((&a.label, &a.atom_label), (&b.label, &b.atom_label));
        let missing = dos_labels("band_prop", Missing::Refuse);
        let a_missing = load_system_with(&found[0], &type_map, &missing).unwrap();
        let b_missing = load_system_with(&npy, &type_map, &missing).unwrap();
        assert!(a_missing.label.is_none() && a_missing.atom_label.is_none());
        assert!(a_missing.check_labels(&missing).is_err());
        assert!(b_missing.check_labels(&missing).is_err());
        read.push(a);
    }
    // Each holds what its example does, so the equalities above are not of empty labels.
    let [dos, be] = &read[..] else { unreachable!() };
    assert_eq!(dos.label.as_ref().map(|l| l.width), Some(250));
    assert_eq!(
        dos.atom_label.as_ref().map(|l| l.values.len()),
        Some(2 * 32 * 250)
    );
    assert_eq!(
        be.fparam.as_ref().map(|p| (p.width, p.values.len())),
        Some((1, 4))
    );
    assert_eq!(
        be.aparam.as_ref().map(|p| (p.width, p.values.len())),
        Some((1, 4 * 54))
    );
}

/// `dpw train` of DeePMD-kit's DOS example on the LMDB and on the npy form of its frames: the
/// same statistics and batches, so the same lcurve.out.
#[test]
fn training_a_dos_on_lmdb_equals_training_on_its_npy_form() {
    let [(lmdb, npy, _), _] = labelled_lmdbs();
    let mut lcurves = Vec::new();
    for systems in [serde_json::json!(lmdb), serde_json::json!([npy])] {
        let mut v = common::json_file(&repo(
            "tests/data/deepmd-kit/examples/dos/train/input_torch.json",
        ));
        v["model"]["descriptor"]["neuron"] = serde_json::json!([4, 8]);
        v["model"]["fitting_net"]["neuron"] = serde_json::json!([16, 16]);
        v["loss"] = serde_json::json!({"type": "dos", "start_pref_dos": 1, "limit_pref_dos": 1,
                                       "start_pref_ados": 1, "limit_pref_ados": 1});
        let t = v["training"].as_object_mut().unwrap();
        t.remove("stop_batch");
        t.insert(
            "training_data".into(),
            serde_json::json!({"systems": systems, "batch_size": 1}),
        );
        t.insert("numb_steps".into(), serde_json::json!(2));
        t.insert("disp_freq".into(), serde_json::json!(1));
        t.insert("save_freq".into(), serde_json::json!(2));
        let run = TempDir::new().unwrap();
        let (ok, log) = common::dpw_train(run.path(), &v);
        assert!(ok, "{log}");
        lcurves.push(std::fs::read_to_string(run.path().join("lcurve.out")).unwrap());
    }
    assert_eq!(lcurves[0].lines().count(), 4, "{}", lcurves[0]);
    assert_eq!(lcurves[0], lcurves[1]);
}

/// DeePMD-kit's own example (examples/lmdb_downsample_data, its validation LMDB as the training
/// and validation data) trains a step.
#[test]
fn deepmd_kits_lmdb_example_trains() {
    let example = repo("tests/data/deepmd-kit/examples/lmdb_downsample_data");
    let mut input: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(example.join("input_lmdb.json")).unwrap())
            .unwrap();
    let data = example.join("water_validation.lmdb");
    input["training"]["training_data"]["systems"] = serde_json::json!(data);
    input["training"]["validation_data"]["systems"] = serde_json::json!(data);
    input["training"]["numb_steps"] = serde_json::json!(1);
    let run = TempDir::new().unwrap();
    let out = common::train_cpu(run.path(), &input);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("20 frames in 1 system"), "{err}");
    let lcurve = std::fs::read_to_string(run.path().join("lcurve.out")).unwrap();
    assert_eq!(lcurve.lines().count(), 3, "{lcurve}");
    // out.json names the LMDB as a string, as given: DeePMD-kit reads LMDB data only from one
    // (from a list it searches for npy systems, finds none and fails).
    let out: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.path().join("out.json")).unwrap())
            .unwrap();
    assert_eq!(
        out["training"]["training_data"]["systems"],
        serde_json::json!(data)
    );
}

/// An LMDB environment at `dir` holding `records` (key, msgpack value), as DeePMD-kit's are
/// written.
fn write_lmdb(dir: &Path, records: &[(&str, Value)]) {
    std::fs::create_dir_all(dir).unwrap();
    let env = unsafe { EnvOpenOptions::new().map_size(1 << 20).open(dir) }.unwrap();
    let mut wtxn = env.write_txn().unwrap();
    let db = env
        .create_database::<Bytes, Bytes>(&mut wtxn, None)
        .unwrap();
    for (key, value) in records {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, value).unwrap();
        db.put(&mut wtxn, key.as_bytes(), &bytes).unwrap();
    }
    wtxn.commit().unwrap();
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn array(dtype: &str, shape: &[u64], data: Vec<u8>) -> Value {
    map(vec![
        ("type", dtype.into()),
        (
            "shape",
            Value::Array(shape.iter().map(|&d| d.into()).collect()),
        ),
        ("data", Value::Binary(data)),
    ])
}

fn f64s(x: &[f64]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A two-atom frame (an H2 molecule in a 10 Å box) with `drop` left out.
fn frame(drop: &str) -> Value {
    let fields = vec![
        (
            "atom_types",
            array(
                "int32",
                &[2],
                [1i32, 1].iter().flat_map(|t| t.to_le_bytes()).collect(),
            ),
        ),
        (
            "coords",
            array("float64", &[2, 3], f64s(&[0.0, 0.0, 0.0, 0.74, 0.0, 0.0])),
        ),
        (
            "cells",
            array(
                "float64",
                &[3, 3],
                f64s(&[10., 0., 0., 0., 10., 0., 0., 0., 10.]),
            ),
        ),
        ("energies", array("float64", &[], f64s(&[-1.0]))),
        ("forces", array("float64", &[2, 3], f64s(&[0.0; 6]))),
    ];
    map(fields.into_iter().filter(|(k, _)| *k != drop).collect())
}

fn meta(nframes: u64) -> Value {
    map(vec![
        ("nframes", nframes.into()),
        ("frame_idx_fmt", "012d".into()),
        ("type_map", Value::Array(vec!["O".into(), "H".into()])),
    ])
}

/// `dpw neighbor-stat` on the LMDB environment `data`.
fn neighbor_stat(data: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["neighbor-stat", "-s"])
        .arg(data)
        .args(["-r", "4", "-t", "O", "H"])
        .output()
        .unwrap()
}

/// The stderr of `dpw neighbor-stat` on `data`, which must fail cleanly.
fn refused(data: &Path) -> String {
    let out = neighbor_stat(data);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    err
}

#[test]
fn a_bad_lmdb_is_refused_naming_the_record() {
    let tmp = TempDir::new().unwrap();
    let good = tmp.path().join("good.lmdb");
    write_lmdb(
        &good,
        &[("__metadata__", meta(1)), ("000000000000", frame(""))],
    );
    let out = neighbor_stat(&good);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    type Records<'a> = Vec<(&'a str, Value)>;
    let cases: [(&str, Records, &str); 5] = [
        (
            "no-meta",
            vec![("000000000000", frame(""))],
            "no record \"__metadata__\"",
        ),
        (
            "short",
            vec![("__metadata__", meta(2)), ("000000000000", frame(""))],
            "no record \"000000000001\"",
        ),
        (
            "no-types",
            vec![
                ("__metadata__", meta(1)),
                ("000000000000", frame("atom_types")),
            ],
            "record \"000000000000\", atom_types",
        ),
        (
            "no-coords",
            vec![("__metadata__", meta(1)), ("000000000000", frame("coords"))],
            "record \"000000000000\", coords",
        ),
        (
            "not-a-map",
            vec![("__metadata__", meta(1)), ("000000000000", Value::from(3))],
            "record \"000000000000\" is not a msgpack map",
        ),
    ];
    for (name, records, says) in cases {
        let dir = tmp.path().join(format!("{name}.lmdb"));
        write_lmdb(&dir, &records);
        let err = refused(&dir);
        assert!(
            err.contains(says) && err.contains(&*dir.to_string_lossy()),
            "{name}: {err}"
        );
    }

    // An element the model lacks (O and H only): named where the LMDB lists it.
    let err = refused(&lmdb());
    let names = format!("{}#__metadata__/type_map: element \"C\"", lmdb().display());
    assert!(err.contains(&names), "{err}");

    // Named .lmdb but not one: said so, not searched for npy systems.
    let empty = tmp.path().join("empty.lmdb");
    std::fs::create_dir_all(&empty).unwrap();
    let err = refused(&empty);
    assert!(err.contains("is not an LMDB environment"), "{err}");
}

/// `frame` with the fields `extra` added.
fn with(frame: Value, extra: Vec<(&str, Value)>) -> Value {
    let Value::Map(mut fields) = frame else {
        unreachable!("a frame is a map")
    };
    fields.extend(extra.into_iter().map(|(k, v)| (k.into(), v)));
    Value::Map(fields)
}

/// As DeePMD-kit reads a label: absent where `find_<label>` is 0 (so the frame is of another
/// system), and the frames of one system must agree on its shape (refused naming the record).
#[test]
fn find_flags_and_shapes_of_an_lmdbs_labels() {
    let tmp = TempDir::new().unwrap();
    let dos = |values: &[f64]| array("float64", &[values.len() as u64], f64s(values));
    let labels = Labels::Frame {
        name: "dos".into(),
        width: 2,
        frame: true,
        atomic: false,
        missing: Missing::Refuse,
        excluded: vec![],
    };
    let type_map = ["O", "H"].map(String::from);
    let read = |name: &str, frames: [Value; 2]| {
        let dir = tmp.path().join(name);
        let [a, b] = frames;
        write_lmdb(
            &dir,
            &[
                ("__metadata__", meta(2)),
                ("000000000000", a),
                ("000000000001", b),
            ],
        );
        let found = find_systems(&Disk, std::slice::from_ref(&dir), "training").unwrap();
        (dir, found)
    };

    let (_, found) = read(
        "flag.lmdb",
        [
            with(frame(""), vec![("dos", dos(&[1.0, 2.0]))]),
            with(
                frame(""),
                vec![("dos", dos(&[3.0, 4.0])), ("find_dos", 0.into())],
            ),
        ],
    );
    assert_eq!(found.len(), 2);
    let labelled = load_system_with(&found[0], &type_map, &labels).unwrap();
    assert_eq!(labelled.label.unwrap().values, [1.0, 2.0]);
    let unlabelled = load_system_with(&found[1], &type_map, &labels).unwrap();
    assert!(unlabelled.label.is_none());

    let (dir, found) = read(
        "shapes.lmdb",
        [
            with(frame(""), vec![("dos", dos(&[1.0, 2.0]))]),
            with(frame(""), vec![("dos", dos(&[3.0, 4.0, 5.0]))]),
        ],
    );
    let err = load_system_with(&found[0], &type_map, &labels)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("record \"000000000001\", dos") && err.contains(&*dir.to_string_lossy()),
        "{err}"
    );
}

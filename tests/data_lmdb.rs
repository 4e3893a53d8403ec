//! DeePMD-kit's LMDB training data (src/data/lmdb.rs): an environment reads as the deepmd/npy
//! systems of its frames, trains as they do, and a bad one is refused naming what is wrong.
#![cfg(feature = "lmdb")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dpw::data::{find_systems, load_system, Disk, System};
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

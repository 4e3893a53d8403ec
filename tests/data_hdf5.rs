//! deepmd/hdf5 systems: the same frames and batches as the deepmd/npy folders they were
//! written from, DeePMD-kit's `file.hdf5` / `file.hdf5#/group` system names, and named errors
//! for bad files. Needs the HDF5 C library installed (dpw loads it at run time).

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use dpw::data::{keep_open, load_system, search_systems, DataError, Hdf5Writer};
use dpw::model::{FittingSpec, ModelSpec};
use dpw::train::batch::assemble_frames;
use ndarray::ArrayD;
use ndarray_npy::read_npy;
use tempfile::TempDir;

/// While any pass over the data runs (a `keep_open` guard lives), every HDF5 file the process
/// opens stays open until the pass ends, and an open file cannot be written: the tests of this
/// file, which write HDF5 files and run passes, take turns.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn water(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water")).join(name)
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Copies the npy folder `dir` into group `name` of `file`, as dpdata lays a system out:
/// integer `type.raw`, string `type_map.raw`, float32 `set.*/*.npy` datasets.
fn put_system(file: &Hdf5Writer, name: &str, dir: &Path) {
    let text = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let types: Vec<i64> = text("type.raw")
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    file.write(&format!("{name}/type.raw"), &[types.len()], &types)
        .unwrap();
    let map = text("type_map.raw");
    let elems: Vec<&str> = map.split_whitespace().collect();
    file.write_strings(&format!("{name}/type_map.raw"), &elems)
        .unwrap();
    for k in 0.. {
        let set_dir = dir.join(format!("set.{k:03}"));
        if !set_dir.is_dir() {
            break;
        }
        for f in ["coord", "box", "energy", "force"] {
            let a: ArrayD<f32> = read_npy(set_dir.join(format!("{f}.npy"))).unwrap();
            let at = format!("{name}/set.{k:03}/{f}.npy");
            file.write(&at, a.shape(), a.as_slice().unwrap()).unwrap();
        }
    }
}

fn water_file(dir: &Path) -> PathBuf {
    let p = dir.join("water.hdf5");
    let f = Hdf5Writer::create(&p).unwrap();
    for k in 0..3 {
        let name = format!("data_{k}");
        put_system(&f, &format!("train/{name}"), &water(&name));
    }
    p
}

/// Dataset `set.000/<name>.npy` of the water example's `data_0`.
fn water_set0(name: &str) -> Vec<f32> {
    let a: ArrayD<f32> = read_npy(water("data_0").join(format!("set.000/{name}.npy"))).unwrap();
    a.iter().copied().collect()
}

fn spec() -> ModelSpec {
    ModelSpec {
        short_range: None,
        linear: None,
        type_map: names(&["O", "H"]),
        descriptor: common::water_descriptor(),
        fitting: FittingSpec::new(vec![8], true),
    }
}

#[test]
fn hdf5_and_npy_give_identical_frames_and_batches() {
    let _turn = one_at_a_time();
    let tmp = TempDir::new().unwrap();
    let file = water_file(tmp.path());
    let found = search_systems(&file).unwrap();
    let expect: Vec<PathBuf> = (0..3)
        .map(|k| PathBuf::from(format!("{}#/train/data_{k}", file.display())))
        .collect();
    assert_eq!(found, expect);
    let group = PathBuf::from(format!("{}#/train", file.display()));
    assert_eq!(search_systems(&group).unwrap(), expect);

    let tm = names(&["O", "H"]);
    for (k, p) in found.iter().enumerate() {
        let a = load_system(p, &tm).unwrap();
        let b = load_system(&water(&format!("data_{k}")), &tm).unwrap();
        assert_eq!(
            (a.natoms, a.nframes, &a.atype, &a.orig_index),
            (b.natoms, b.nframes, &b.atype, &b.orig_index)
        );
        assert_eq!(a.coord, b.coord);
        assert_eq!(a.cell, b.cell);
        assert_eq!(a.energy, b.energy);
        assert_eq!(a.force, b.force);
        assert_eq!(a.virial, b.virial);
        let frames = [3, 0, 41];
        let ba = assemble_frames(&spec(), &a, &frames, "training").unwrap();
        let bb = assemble_frames(&spec(), &b, &frames, "training").unwrap();
        assert_eq!(ba.rij, bb.rij);
        assert_eq!(ba.owner, bb.owner);
        assert_eq!(ba.force, bb.force);
        assert_eq!(ba.energy, bb.energy);
    }
}

fn load_err(p: &Path) -> String {
    match load_system(p, &names(&["O", "H"])) {
        Ok(_) => panic!("{} loaded", p.display()),
        Err(e) => {
            let _: &DataError = &e;
            e.to_string()
        }
    }
}

#[test]
fn bad_hdf5_files_get_named_errors() {
    let _turn = one_at_a_time();
    let tmp = TempDir::new().unwrap();
    let not_h5 = tmp.path().join("fake.hdf5");
    std::fs::write(&not_h5, "not an hdf5 file").unwrap();
    let e = load_err(&PathBuf::from(format!("{}#/sys", not_h5.display())));
    assert!(
        e.contains("fake.hdf5") && e.contains("not an HDF5 file"),
        "{e}"
    );

    let file = water_file(tmp.path());
    let e = load_err(&PathBuf::from(format!("{}#/nowhere", file.display())));
    assert!(e.contains("water.hdf5") && e.contains("/nowhere"), "{e}");
    let e = search_systems(&PathBuf::from(format!("{}#/nowhere", file.display())))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nowhere"), "{e}");

    // A coord dataset of the wrong width, and a missing force dataset.
    let f = Hdf5Writer::open(&file).unwrap();
    f.unlink("train/data_0/set.000/coord.npy").unwrap();
    f.write("train/data_0/set.000/coord.npy", &[80, 5], &[0.0f32; 400])
        .unwrap();
    f.unlink("train/data_1/set.000/force.npy").unwrap();
    drop(f);
    let e = load_err(&PathBuf::from(format!("{}#/train/data_0", file.display())));
    assert!(
        e.contains("water.hdf5#/train/data_0/set.000/coord.npy") && e.contains("[80, 5]"),
        "{e}"
    );
    let e = load_err(&PathBuf::from(format!("{}#/train/data_1", file.display())));
    assert!(
        e.contains("water.hdf5#/train/data_1/set.000/force.npy") && e.contains("missing"),
        "{e}"
    );
}

/// `dpw train` on the HDF5 file and on the npy folders it holds: the same lcurve.out.
#[test]
fn training_on_hdf5_equals_training_on_npy() {
    let _turn = one_at_a_time();
    let tmp = TempDir::new().unwrap();
    let file = water_file(tmp.path());
    let mut lcurves = Vec::new();
    let npy: Vec<PathBuf> = (0..3).map(|k| water(&format!("data_{k}"))).collect();
    for systems in [serde_json::json!(file), serde_json::json!(npy)] {
        let run = TempDir::new().unwrap();
        common::train_cpu(run.path(), &common::tiny_water_input(systems, 8));
        lcurves.push(std::fs::read_to_string(run.path().join("lcurve.out")).unwrap());
    }
    assert_eq!(lcurves[0].lines().count(), 10);
    assert_eq!(lcurves[0], lcurves[1]);
}

/// A pass over the data keeps its HDF5 files open only while it runs (its guard lives): a file
/// rewritten between two passes is read anew by the second.
#[test]
fn a_file_rewritten_between_passes_is_read_anew() {
    let _turn = one_at_a_time();
    let tmp = TempDir::new().unwrap();
    let file = water_file(tmp.path());
    let sys = PathBuf::from(format!("{}#/train/data_0", file.display()));
    let tm = names(&["O", "H"]);
    let pass = || {
        let _open = keep_open();
        let first = load_system(&sys, &tm).unwrap();
        // The second read in the pass goes through the file kept open.
        assert_eq!(load_system(&sys, &tm).unwrap().energy, first.energy);
        first.energy[0]
    };
    let e0 = pass();
    {
        let f = Hdf5Writer::open(&file).unwrap();
        let mut v = water_set0("energy");
        v[0] += 1.0;
        f.unlink("train/data_0/set.000/energy.npy").unwrap();
        f.write("train/data_0/set.000/energy.npy", &[v.len()], &v)
            .unwrap();
    }
    let e1 = pass();
    assert!((e1 - (e0 + 1.0)).abs() < 1e-3, "{e0} then {e1}");
}

/// Integer datasets (any width, signed or not) are widened to f64, as the npy reader widens
/// integer arrays: DeePMD-kit casts whatever it loads.
#[test]
fn integer_datasets_are_widened() {
    let _turn = one_at_a_time();
    let tmp = TempDir::new().unwrap();
    let file = water_file(tmp.path());
    let sys = PathBuf::from(format!("{}#/train/data_0", file.display()));
    let floats = load_system(&sys, &names(&["O", "H"])).unwrap();
    let f = Hdf5Writer::open(&file).unwrap();
    let set = "train/data_0/set.000";
    let rounded = |name: &str| -> Vec<f32> {
        f.unlink(&format!("{set}/{name}.npy")).unwrap();
        water_set0(name).iter().map(|x| x.round()).collect()
    };
    let e: Vec<i32> = rounded("energy").iter().map(|&x| x as i32).collect();
    f.write(&format!("{set}/energy.npy"), &[e.len()], &e)
        .unwrap();
    let force: Vec<i8> = rounded("force").iter().map(|&x| x as i8).collect();
    let nf = floats.nframes;
    f.write(&format!("{set}/force.npy"), &[nf, force.len() / nf], &force)
        .unwrap();
    drop(f);
    let ints = load_system(&sys, &names(&["O", "H"])).unwrap();
    let round = |v: &[f64]| v.iter().map(|x| x.round()).collect::<Vec<_>>();
    assert_eq!(ints.energy, round(&floats.energy));
    assert_eq!(ints.force, round(&floats.force));
    assert_eq!(ints.coord, floats.coord);
}

/// Without the HDF5 library (here: `DPW_HDF5_LIB` naming none), `dpw train` on HDF5 data stops
/// with an error that names the file and says what is missing; `DPW_HDF5_LIB` naming another
/// library (the C maths library) says that it is not HDF5's and which symbol it lacks.
#[test]
fn a_missing_library_is_a_named_error() {
    let _turn = one_at_a_time();
    let tmp = TempDir::new().unwrap();
    let file = water_file(tmp.path());
    let input = common::tiny_water_input(serde_json::json!(file), 2);
    std::fs::write(tmp.path().join("input.json"), input.to_string()).unwrap();
    let train_with = |lib: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
            .current_dir(tmp.path())
            .env("DPW_HDF5_LIB", lib)
            .args(["train", "input.json", "--backend", "cpu"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && !err.contains("panicked"), "{err}");
        assert!(err.contains("water.hdf5"), "{err}");
        assert!(!tmp.path().join("lcurve.out").exists());
        err
    };
    let err = train_with("/nowhere/libhdf5.so");
    assert!(
        err.contains("HDF5 C library") && err.contains("DPW_HDF5_LIB=/nowhere/libhdf5.so"),
        "{err}"
    );
    let err = train_with("libm.so.6");
    assert!(
        err.contains("libm.so.6: not an HDF5 library: it has no symbol H5open"),
        "{err}"
    );
}

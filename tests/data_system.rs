mod common;

use std::fs;
use std::path::{Path, PathBuf};

use dpw::data::{load_system, DataError};
use ndarray::{Array1, Array2, Array3};
use ndarray_npy::{read_npy, write_npy};
use tempfile::TempDir;

use common::repo;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn raw_frames(path: &Path) -> Array2<f32> {
    read_npy(path).unwrap()
}

#[test]
fn water_loads_sorted_and_equal_to_raw() {
    let dir = repo("examples/water/data_0");
    let sys = load_system(&dir, &names(&["O", "H"])).unwrap();
    assert_eq!((sys.nframes, sys.natoms), (80, 192));
    assert_eq!(sys.type_counts(0, 2), vec![64, 128]);
    assert!(sys.atype[..64].iter().all(|&t| t == 0));
    assert!(sys.atype[64..].iter().all(|&t| t == 1));
    assert!(sys.virial.is_none());

    let set = dir.join("set.000");
    let coord = raw_frames(&set.join("coord.npy"));
    let force = raw_frames(&set.join("force.npy"));
    let cell = raw_frames(&set.join("box.npy"));
    let energy: Array1<f32> = read_npy(set.join("energy.npy")).unwrap();
    for (f, i) in [(0, 0), (7, 100), (79, 191)] {
        let o = sys.orig_index[i];
        for d in 0..3 {
            assert_eq!(sys.frame_coord(f)[3 * i + d], coord[[f, 3 * o + d]] as f64);
            assert_eq!(sys.frame_force(f)[3 * i + d], force[[f, 3 * o + d]] as f64);
        }
        assert_eq!(sys.frame_cell(f).unwrap()[4], cell[[f, 4]] as f64);
        assert_eq!(sys.energy[f], energy[f] as f64);
    }
}

#[test]
fn all_water_systems_load() {
    for i in 0..4 {
        let dir = repo(&format!("examples/water/data_{i}"));
        let sys = load_system(&dir, &names(&["O", "H"])).unwrap();
        assert_eq!((sys.natoms, sys.type_counts(0, 2)), (192, vec![64, 128]));
        assert!(sys.cell.is_some() && sys.nframes > 0);
        assert_eq!(sys.coord.len(), sys.nframes * 192 * 3);
    }
}

#[test]
fn nopbc_loads_without_cell_and_permutes_atoms() {
    let dir = repo("tests/data/nopbc/C4H3O1");
    let sys = load_system(&dir, &names(&["C", "H", "O"])).unwrap();
    assert!(sys.cell.is_none() && sys.frame_cell(0).is_none());
    assert_eq!((sys.nframes, sys.natoms), (15, 8));
    // type.raw is "1 1 1 0 0 0 0 2" over type_map.raw "C H O".
    assert_eq!(sys.orig_index, vec![3, 4, 5, 6, 0, 1, 2, 7]);
    assert_eq!(sys.atype, vec![0, 0, 0, 0, 1, 1, 1, 2]);
    let coord = raw_frames(&dir.join("set.000/coord.npy"));
    for d in 0..3 {
        assert_eq!(sys.frame_coord(14)[d], coord[[14, 9 + d]] as f64);
        assert_eq!(sys.frame_coord(14)[12 + d], coord[[14, d]] as f64);
    }
}

#[test]
fn water_virial_loads_virial() {
    let dir = repo("tests/data/water_virial");
    let sys = load_system(&dir, &names(&["O", "H"])).unwrap();
    assert_eq!((sys.nframes, sys.natoms), (30, 384));
    let raw = raw_frames(&dir.join("set.000/virial.npy"));
    assert_eq!(sys.frame_virial(29).unwrap()[8], raw[[29, 8]] as f64);
}

/// A valid periodic system of `types` (one int per atom) with `nf` frames in set.000,
/// float64 npy with shapes `[nf, natoms*3]`.
fn write_system(types: &[usize], nf: usize) -> TempDir {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let na = types.len();
    let text: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    fs::write(dir.join("type.raw"), text.join("\n")).unwrap();
    let set = dir.join("set.000");
    fs::create_dir(&set).unwrap();
    let per_atom = Array2::from_shape_fn((nf, na * 3), |(f, k)| (f * 1000 + k) as f64);
    write_npy(set.join("coord.npy"), &per_atom).unwrap();
    write_npy(set.join("force.npy"), &(-&per_atom)).unwrap();
    // Wide enough that no two of the synthetic atoms (up to ~350 Å out) meet through the
    // periodic images: the loader refuses overlapping atoms.
    let cell = Array2::from_shape_fn((nf, 9), |(_, k)| if k % 4 == 0 { 1000.0 } else { 0.0 });
    write_npy(set.join("box.npy"), &cell).unwrap();
    write_npy(
        set.join("energy.npy"),
        &Array1::from_shape_fn(nf, |f| -(f as f64)),
    )
    .unwrap();
    tmp
}

fn error_of(dir: &Path, type_map: &[&str]) -> String {
    let err: DataError = load_system(dir, &names(type_map)).unwrap_err();
    err.to_string()
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} does not mention {p:?}");
    }
}

#[test]
fn synthetic_system_accepts_3d_shapes_and_float32() {
    let tmp = write_system(&[0, 1, 0], 4);
    let set = tmp.path().join("set.000");
    let coord = Array3::from_shape_fn((4, 3, 3), |(f, a, d)| (f * 100 + a * 10 + d) as f32);
    write_npy(set.join("coord.npy"), &coord).unwrap();
    let energy = Array2::from_shape_fn((4, 1), |(f, _)| f as f32);
    write_npy(set.join("energy.npy"), &energy).unwrap();
    let sys = load_system(tmp.path(), &names(&["O", "H"])).unwrap();
    assert_eq!(sys.orig_index, vec![0, 2, 1]);
    assert_eq!(
        sys.frame_coord(3),
        &[300., 301., 302., 320., 321., 322., 310., 311., 312.]
    );
    assert_eq!(sys.energy, vec![0., 1., 2., 3.]);
}

#[test]
fn data_type_map_is_remapped_by_name() {
    let tmp = write_system(&[0, 1, 1, 0, 1], 2);
    fs::write(tmp.path().join("type_map.raw"), "H\nO\n").unwrap();
    let sys = load_system(tmp.path(), &names(&["O", "H"])).unwrap();
    // Data H (0) becomes model type 1, data O (1) model type 0; O atoms sort first.
    assert_eq!(sys.atype, vec![0, 0, 0, 1, 1]);
    assert_eq!(sys.orig_index, vec![1, 2, 4, 0, 3]);
    assert_eq!(sys.type_counts(0, 2), vec![3, 2]);
}

#[test]
fn multiple_sets_concatenate_and_virial_needs_every_set() {
    let tmp = write_system(&[0, 1], 3);
    let (set0, set1) = (tmp.path().join("set.000"), tmp.path().join("set.001"));
    fs::create_dir(&set1).unwrap();
    for f in ["coord.npy", "force.npy", "box.npy", "energy.npy"] {
        fs::copy(set0.join(f), set1.join(f)).unwrap();
    }
    write_npy(set1.join("virial.npy"), &Array2::<f64>::zeros((3, 9))).unwrap();
    let sys = load_system(tmp.path(), &names(&["O", "H"])).unwrap();
    assert_eq!(sys.nframes, 6);
    assert_eq!(sys.energy, vec![0., -1., -2., 0., -1., -2.]);
    assert!(sys.virial.is_none());
}

#[test]
fn error_missing_type_raw() {
    let tmp = write_system(&[0, 1], 2);
    fs::remove_file(tmp.path().join("type.raw")).unwrap();
    assert_mentions(&error_of(tmp.path(), &["O", "H"]), &["type.raw"]);
}

#[test]
fn error_missing_coord() {
    let tmp = write_system(&[0, 1], 2);
    fs::remove_file(tmp.path().join("set.000/coord.npy")).unwrap();
    assert_mentions(
        &error_of(tmp.path(), &["O", "H"]),
        &["set.000/coord.npy", "missing"],
    );
}

#[test]
fn error_missing_box_without_nopbc() {
    let tmp = write_system(&[0, 1], 2);
    fs::remove_file(tmp.path().join("set.000/box.npy")).unwrap();
    assert_mentions(&error_of(tmp.path(), &["O", "H"]), &["box.npy", "missing"]);
    fs::write(tmp.path().join("nopbc"), "").unwrap();
    assert!(load_system(tmp.path(), &names(&["O", "H"]))
        .unwrap()
        .cell
        .is_none());
}

#[test]
fn error_wrong_coord_shape() {
    let tmp = write_system(&[0, 1], 2);
    write_npy(
        tmp.path().join("set.000/coord.npy"),
        &Array2::<f64>::zeros((2, 9)),
    )
    .unwrap();
    assert_mentions(
        &error_of(tmp.path(), &["O", "H"]),
        &["coord.npy", "[nframes, 6]", "[2, 9]"],
    );
}

#[test]
fn error_frame_count_mismatch() {
    let tmp = write_system(&[0, 1], 3);
    write_npy(
        tmp.path().join("set.000/energy.npy"),
        &Array1::<f64>::zeros(2),
    )
    .unwrap();
    assert_mentions(
        &error_of(tmp.path(), &["O", "H"]),
        &["energy.npy", "coord.npy", "2", "3"],
    );
}

#[test]
fn error_element_absent_from_model_type_map() {
    let tmp = write_system(&[0, 1, 2], 2);
    fs::write(tmp.path().join("type_map.raw"), "O H C\n").unwrap();
    assert_mentions(
        &error_of(tmp.path(), &["O", "H"]),
        &["type_map.raw", "\"C\"", "[\"O\", \"H\"]"],
    );
    // An element nobody uses may be absent.
    let tmp = write_system(&[0, 1], 2);
    fs::write(tmp.path().join("type_map.raw"), "O H C\n").unwrap();
    assert!(load_system(tmp.path(), &names(&["O", "H"])).is_ok());
}

#[test]
fn error_type_index_out_of_range_without_type_map_raw() {
    let tmp = write_system(&[0, 1, 2], 2);
    assert_mentions(
        &error_of(tmp.path(), &["O", "H"]),
        &["type.raw", "type 2", "atom 2"],
    );
}

#[test]
fn error_nan_in_force_names_the_frame() {
    let tmp = write_system(&[0, 1], 4);
    let mut force = Array2::<f64>::zeros((4, 6));
    force[[2, 4]] = f64::NAN;
    write_npy(tmp.path().join("set.000/force.npy"), &force).unwrap();
    assert_mentions(
        &error_of(tmp.path(), &["O", "H"]),
        &["force.npy", "frame 2"],
    );
}

#[test]
fn error_no_set_directory() {
    let tmp = write_system(&[0, 1], 2);
    fs::rename(tmp.path().join("set.000"), tmp.path().join("sets")).unwrap();
    let msg = error_of(tmp.path(), &["O", "H"]);
    assert_mentions(&msg, &[&tmp.path().display().to_string(), "set.*"]);
}

#[test]
fn integer_npy_is_widened() {
    // DeePMD-kit casts integer arrays to its float type; so does dpw (issue 32).
    let tmp = write_system(&[0, 1], 2);
    write_npy(
        tmp.path().join("set.000/energy.npy"),
        &Array1::<i64>::from_vec(vec![-7, 3]),
    )
    .unwrap();
    let sys = load_system(tmp.path(), &names(&["O", "H"])).unwrap();
    assert_eq!(sys.energy, vec![-7.0, 3.0]);
}

/// Every file below `root`, by path relative to `base`, in memory (what the web page fetches).
fn mem_copy(root: &Path, base: &Path, out: &mut dpw::data::MemFiles) {
    for e in fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            mem_copy(&p, base, out);
        } else {
            out.insert(p.strip_prefix(base).unwrap(), fs::read(&p).unwrap());
        }
    }
}

#[test]
fn memory_files_read_as_the_disk() {
    use dpw::data::{load_system_in, Files, MemFiles};
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    let mut mem = MemFiles::default();
    mem_copy(&base.join("data_1"), &base, &mut mem);
    mem.insert("data_1/nopbc_not_here.txt", Vec::new());
    let tm = names(&["O", "H"]);
    let disk = load_system(&base.join("data_1"), &tm).unwrap();
    let from_mem = load_system_in(&mem, Path::new("data_1"), &tm).unwrap();
    assert_eq!(disk.nframes, from_mem.nframes);
    assert_eq!(disk.coord, from_mem.coord);
    assert_eq!(disk.cell, from_mem.cell);
    assert_eq!(disk.force, from_mem.force);
    assert_eq!(disk.energy, from_mem.energy);
    assert_eq!(disk.atype, from_mem.atype);
    // Two sets, found and ordered as on disk.
    assert!(mem.is_dir(Path::new("data_1/set.001")));
    assert_eq!(
        mem.list(Path::new("data_1")).unwrap(),
        [
            "nopbc_not_here.txt",
            "set.000",
            "set.001",
            "type.raw",
            "type_map.raw"
        ]
        .map(|n| PathBuf::from("data_1").join(n))
    );
    // A missing file is named as on disk.
    let err = load_system_in(&mem, Path::new("data_9"), &tm).unwrap_err();
    assert!(matches!(err, DataError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("data_9/type.raw"), "{err}");
}

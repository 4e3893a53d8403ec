//! Training data at scale: the system search (symbolic-link loops, per-element counts),
//! parallel start-up statistics equal to the sequential sums, and streaming frames from disk
//! giving the same training as holding them in memory.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dpw::config::Config;
use dpw::data::{find_systems, search_systems, Disk, Labels};
use dpw::geometry::{build_nlist, energy_bias, env_row, Cell, EnvStats};
use dpw::train::dataset::{load_data, DataSet};
use dpw::train::stats::{
    data_stats, load_training_with_stats, neighbor_and_data_stats, neighbor_stats, stat_frames,
    Pass, StatDraw,
};
use serde_json::{json, Value};
use tempfile::TempDir;

use common::{copy_dir, water};

#[cfg(unix)]
#[test]
fn symlink_loops_are_searched_once() {
    use std::os::unix::fs::symlink;
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("data");
    copy_dir(&water().join("data_0"), &root.join("a/sys0"));
    copy_dir(&water().join("data_1"), &root.join("b/sys1"));
    // A folder linking to itself, a loop through two folders, and a second way to a system.
    symlink(&root, root.join("a/self")).unwrap();
    symlink(root.join("b"), root.join("a/to_b")).unwrap();
    symlink(root.join("a"), root.join("b/to_a")).unwrap();
    symlink(root.join("a/sys0"), root.join("again")).unwrap();
    let found = find_systems(&Disk, std::slice::from_ref(&root), "training").unwrap();
    let names: Vec<String> = found
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert_eq!(names.len(), 2, "each system once: {names:?}");
    assert!(names.iter().any(|n| n.ends_with("sys0")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("sys1")), "{names:?}");
    // `dpw test -s DIR` uses the same search.
    assert_eq!(search_systems(&root).unwrap(), found);
}

#[test]
fn search_finds_nested_systems_and_names_an_empty_folder() {
    let tmp = TempDir::new().unwrap();
    let root = tmp.path();
    copy_dir(&water().join("data_0"), &root.join("x/outer"));
    copy_dir(&water().join("data_1"), &root.join("x/outer/inner"));
    std::fs::create_dir_all(root.join("empty/sub")).unwrap();
    let found = search_systems(&root.join("x")).unwrap();
    assert_eq!(
        found,
        vec![root.join("x/outer"), root.join("x/outer/inner")],
        "like DeePMD-kit's rglob, a system's subfolders are searched too"
    );
    let err = search_systems(&root.join("empty")).unwrap_err().to_string();
    assert!(
        err.contains("empty") && err.contains("no type.raw"),
        "{err}"
    );
    let err = search_systems(&root.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing") && err.contains("does not exist"),
        "{err}"
    );
}

fn config(v: &Value, dir: &Path) -> Config {
    let p = dir.join("input.json");
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    dpw::config::load_config(&p).unwrap()
}

/// The training data of `cfg`, loaded as `dpw train` loads them.
fn training_data(cfg: &Config) -> anyhow::Result<DataSet> {
    load_data(
        &cfg.training.training_data,
        &cfg.model.type_map,
        cfg.model.descriptor.rcut,
        "training",
        &Labels::EnergyForce,
    )
}

/// The tiny water model on `systems`, validating on data_3.
fn tiny_input(systems: Value, steps: usize) -> Value {
    let mut v = common::tiny_water_input(systems, steps);
    v["training"]["validation_data"] =
        json!({"systems": [water().join("data_3")], "batch_size": 2, "numb_btch": 2});
    v
}

fn water_systems() -> Value {
    json!([
        water().join("data_0"),
        water().join("data_1"),
        water().join("data_2")
    ])
}

/// The statistics computed in parallel windows, padded slots counted rather than added, equal
/// bit for bit one sequential pass over every slot of the same frames (the way they were first
/// computed), on the shipped example with its own model.
#[test]
fn parallel_statistics_equal_the_sequential_sums() {
    let tmp = TempDir::new().unwrap();
    let mut input: Value =
        serde_json::from_str(&std::fs::read_to_string(water().join("input.json")).unwrap())
            .unwrap();
    input["training"]["training_data"]["systems"] = water_systems();
    input["training"]
        .as_object_mut()
        .unwrap()
        .remove("validation_data");
    let cfg = config(&input, tmp.path());
    let type_map = cfg.model.type_map.clone();
    let data = training_data(&cfg).unwrap();
    let lines = data.element_counts(&type_map);
    assert_eq!(lines.len(), 3);
    assert!(
        lines[1].split_whitespace().eq(["O", "3", "320", "20480"]),
        "{lines:?}"
    );
    assert!(
        lines[2].split_whitespace().eq(["H", "3", "320", "40960"]),
        "{lines:?}"
    );

    let d = common::water_descriptor();
    let frames = stat_frames(&data.systems, &data.batch_sizes, 10, 7);
    let got = data_stats(&d, 2, &data, &frames).unwrap();

    // The sums as they were first written: every slot of every atom's full neighbour list, a
    // padded one included, added one at a time in system, frame, atom and slot order.
    let mut env = EnvStats::new(2);
    let params = d.env();
    let (mut counts, mut energy) = (Vec::new(), Vec::new());
    for (s, fr) in frames.iter().enumerate() {
        let sys = data.system(s).unwrap();
        for &f in fr {
            let cell = sys.frame_cell(f).and_then(Cell::new);
            let nl = build_nlist(
                sys.frame_coord(f),
                cell.as_ref(),
                &sys.atype,
                d.rcut,
                &d.sel,
            );
            for (slot, &o) in nl.owner.iter().enumerate() {
                let t = sys.atype[slot / nl.nnei];
                let row = if o >= 0 {
                    env_row(nl.rij[3 * slot..3 * slot + 3].try_into().unwrap(), &params).0
                } else {
                    [0.0; 4]
                };
                env.r[t][0] += 1.0;
                env.r[t][1] += row[0];
                env.r[t][2] += row[0] * row[0];
                for v in &row[1..] {
                    env.a[t][0] += 1.0;
                    env.a[t][1] += v;
                    env.a[t][2] += v * v;
                }
            }
            counts.push(vec![64.0, 128.0]);
            energy.push(sys.energy[f]);
        }
    }
    let (davg, dstd) = env.davg_dstd(d.set_davg_zero);
    let (bias, std) = energy_bias(&counts, &energy);
    assert_eq!(got.davg, davg);
    assert_eq!(got.dstd, dstd);
    assert_eq!(got.bias, bias);
    assert_eq!(got.residual_std, std);
    assert_eq!(got.nframes, 30);

    let ns = neighbor_stats(&data, 2, d.rcut, false).unwrap();
    assert_eq!(ns.nframes, 320);
    assert!(ns.max_count[0] > 0 && ns.max_count[1] > ns.max_count[0]);
    // All types together: one count, reached at one atom, so at most the per-type maxima's sum.
    let mixed = neighbor_stats(&data, 2, d.rcut, true).unwrap().max_count;
    assert!(mixed.len() == 1 && mixed[0] > ns.max_count[1], "{mixed:?}");
    assert!(mixed[0] <= ns.max_count[0] + ns.max_count[1], "{mixed:?}");
    // Both in one pass: the same numbers.
    assert_eq!(
        neighbor_and_data_stats(&d, 2, &data, &frames).unwrap(),
        (ns, got)
    );
}

/// The statistics computed on the systems as they are read (window after window, beside the
/// reading) equal those of a pass over the data after loading, bit for bit.
#[test]
fn statistics_while_reading_equal_those_after_loading() {
    let tmp = TempDir::new().unwrap();
    // More systems than a window of reading holds.
    let systems: Vec<PathBuf> = (0..10)
        .map(|k| {
            let dir = tmp.path().join(format!("sys{k:02}"));
            copy_dir(&water().join(format!("data_{}", k % 3)), &dir);
            dir
        })
        .collect();
    let cfg = config(&tiny_input(json!(systems), 1), tmp.path());
    let d = common::water_descriptor();
    let pass = Pass {
        ntypes: 2,
        count: Some(d.rcut),
        mixed: false,
        stat: Some(&d),
    };
    let draw = StatDraw {
        nbatch: 3,
        batch_factor: 2,
        seed: 11,
    };
    let (data, ns, st) = load_training_with_stats(
        &Disk,
        &cfg.training.training_data,
        &cfg.model.type_map,
        d.rcut,
        pass,
        &draw,
        &Labels::EnergyForce,
    )
    .unwrap();
    let bs: Vec<usize> = data.batch_sizes.iter().map(|b| 2 * b).collect();
    let frames = stat_frames(&data.systems, &bs, 3, 11);
    let after = neighbor_and_data_stats(&d, 2, &data, &frames).unwrap();
    assert_eq!((ns.unwrap(), st.unwrap()), after);
    assert_eq!(after.1.nframes, frames.iter().map(Vec::len).sum::<usize>());
}

fn dpw(dir: &Path, cache_mb: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dpw"));
    c.current_dir(dir)
        .env("RUST_LOG", "info")
        .env_remove("DPW_DATA_CACHE_MB");
    if let Some(mb) = cache_mb {
        c.env("DPW_DATA_CACHE_MB", mb);
    }
    let out = c.args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "dpw panicked:\n{err}");
    out
}

/// With a cache of 0 MiB every batch reads its system from disk again; the run is the same.
#[test]
fn streaming_and_in_memory_give_identical_lcurve() {
    let mut lcurves = Vec::new();
    for cache in [None, Some("0")] {
        let tmp = TempDir::new().unwrap();
        let p = tmp.path().join("input.json");
        let input = tiny_input(water_systems(), 12);
        std::fs::write(&p, serde_json::to_string_pretty(&input).unwrap()).unwrap();
        let out = dpw(
            tmp.path(),
            cache,
            &["train", "input.json", "--backend", "cpu"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let streamed = err.contains("read from disk on demand");
        assert_eq!(streamed, cache.is_some(), "{err}");
        lcurves.push(std::fs::read_to_string(tmp.path().join("lcurve.out")).unwrap());
    }
    assert_eq!(lcurves[0].lines().count(), 14);
    assert_eq!(lcurves[0], lcurves[1]);
}

/// An element of type_map in no system is counted as 0 in the summary, and a system with an
/// element outside type_map is refused, naming the system and the element.
#[test]
fn per_element_counts_and_unknown_elements() {
    let tmp = TempDir::new().unwrap();
    let mut input = tiny_input(water_systems(), 0);
    input["model"]["type_map"] = json!(["O", "H", "C"]);
    input["model"]["descriptor"]["sel"] = json!([20, 28, 4]);
    input["training"]
        .as_object_mut()
        .unwrap()
        .remove("validation_data");
    let cfg = config(&input, tmp.path());
    let data = training_data(&cfg).unwrap();
    let lines = data.element_counts(&cfg.model.type_map);
    assert!(
        lines[3].split_whitespace().eq(["C", "0", "0", "0"]),
        "{lines:?}"
    );

    input["model"]["type_map"] = json!(["O"]);
    input["model"]["descriptor"]["sel"] = json!([20]);
    let cfg = config(&input, tmp.path());
    let err = training_data(&cfg).err().unwrap();
    let msg = format!("{err:#}");
    assert!(msg.contains("data_0") && msg.contains("\"H\""), "{msg}");
}

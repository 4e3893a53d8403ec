//! Mutation fuzzing of every loader a user's file reaches: a deepmd/npy system (npy files and
//! type.raw), input.json, a DeePMD-kit yaml model, and dpw's model and checkpoint files. Each
//! case mutates a real file (bit flips, special bytes, cut, inserted or repeated spans, and for
//! text, numbers replaced by extreme ones) and loads it: an error is fine, a panic is a crash.
//! Deterministic per seed; `DPW_FUZZ_CASES` (default 1000 per loader) sets the campaign length,
//! `DPW_FUZZ_SEED` its first seed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::{ReadNpyExt, WriteNpyExt};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use dpw::config::{Config, Precision};
use dpw::data::{load_system_in, MemFiles, Sampler};
use dpw::model::file::{model_from_container, read_container, save_model, write_container};
use dpw::model::{
    read_deepmd_yaml, write_deepmd_yaml, DescriptorSpec, FittingSpec, Model, ModelSpec,
};
use dpw::train::checkpoint::{Checkpoint, DataShape, Saved};

fn cases() -> u64 {
    std::env::var("DPW_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn first_seed() -> u64 {
    std::env::var("DPW_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1e308",
    "-1e308",
    "1e-320",
    "nan",
    "NaN",
    ".nan",
    "inf",
    "-.inf",
    "18446744073709551616",
    "4294967296",
    "99999999999",
    "2147483648",
    "65536",
    "-6",
];

/// One to four random mutations of `b`; `text` adds number replacements.
fn mutate(rng: &mut ChaCha8Rng, b: &mut Vec<u8>, text: bool) {
    for _ in 0..rng.random_range(1..=4) {
        let n = b.len();
        if n == 0 {
            b.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..n);
        match rng.random_range(0..if text { 8 } else { 7 }) {
            0 => b[at] ^= 1 << rng.random_range(0..8),
            1 => b[at] = [0u8, 0xff, 0x7f, 0x80, b'9', b'-', b'\n', b':'][rng.random_range(0..8)],
            2 => b.truncate(at),
            3 => {
                let end = (at + rng.random_range(1..=64)).min(n);
                b.drain(at..end);
            }
            4 => {
                let ins: Vec<u8> = (0..rng.random_range(1..=16))
                    .map(|_| rng.random())
                    .collect();
                b.splice(at..at, ins);
            }
            5 => {
                let end = (at + rng.random_range(1..=256)).min(n);
                let span = b[at..end].to_vec();
                let to = rng.random_range(0..=b.len());
                b.splice(to..to, span);
            }
            6 => {
                // An 8-byte value (a length, a float) overwritten.
                let v: u64 = [u64::MAX, 1 << 40, 0, rng.random(), f64::NAN.to_bits()]
                    [rng.random_range(0..5)];
                for (k, byte) in v.to_le_bytes().iter().enumerate() {
                    if at + k < n {
                        b[at + k] = *byte;
                    }
                }
            }
            _ => {
                // A number of the text replaced by an extreme one.
                let starts: Vec<usize> = (0..n)
                    .filter(|&i| b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit()))
                    .collect();
                if let Some(&s) = starts.get(rng.random_range(0..starts.len().max(1))) {
                    let e = (s..n)
                        .find(|&i| !b[i].is_ascii_digit() && b[i] != b'.')
                        .unwrap_or(n);
                    let num = NUMBERS[rng.random_range(0..NUMBERS.len())];
                    b.splice(s..e, num.bytes());
                }
            }
        }
    }
}

/// Runs `load` on `cases()` mutations of `original`; returns the seeds whose load panicked.
fn campaign(
    name: &str,
    original: &[u8],
    text: bool,
    mut load: impl FnMut(&[u8]),
) -> (u64, Vec<u64>) {
    let mut crashes = Vec::new();
    let n = cases();
    let t = std::time::Instant::now();
    for seed in first_seed()..first_seed() + n {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut b = original.to_vec();
        mutate(&mut rng, &mut b, text);
        if catch_unwind(AssertUnwindSafe(|| load(&b))).is_err() {
            crashes.push(seed);
        }
    }
    eprintln!(
        "{name}: {n} cases in {:.1} s, {} crashes {crashes:?}",
        t.elapsed().as_secs_f64(),
        crashes.len()
    );
    (n, crashes)
}

fn water0() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/water/data_0"
    ))
}

fn npy_bytes(a: &ArrayD<f64>) -> Vec<u8> {
    let mut out = Vec::new();
    a.write_npy(&mut out).unwrap();
    out
}

/// The first 3 frames of water data_0 as in-memory files.
fn small_system() -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        (
            "sys/type.raw".to_string(),
            std::fs::read(water0().join("type.raw")).unwrap(),
        ),
        (
            "sys/type_map.raw".to_string(),
            std::fs::read(water0().join("type_map.raw")).unwrap(),
        ),
    ];
    for f in ["coord", "box", "energy", "force"] {
        let bytes = std::fs::read(water0().join(format!("set.000/{f}.npy"))).unwrap();
        let a = ArrayD::<f32>::read_npy(&bytes[..]).unwrap().mapv(f64::from);
        let mut shape = a.shape().to_vec();
        shape[0] = 3;
        let v: Vec<f64> = a.iter().copied().take(shape.iter().product()).collect();
        let a = ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap();
        files.push((format!("sys/set.000/{f}.npy"), npy_bytes(&a)));
    }
    files
}

#[test]
fn fuzz_npy_system() {
    let files = small_system();
    let type_map = ["O".to_string(), "H".to_string()];
    let mut all = Vec::new();
    for (k, (name, original)) in files.iter().enumerate() {
        // Text mutations too: an npy header is text, its shape numbers worth replacing.
        let (_, crashes) = campaign(name, original, true, |b| {
            let mut mem = MemFiles::default();
            for (j, (n, bytes)) in files.iter().enumerate() {
                mem.insert(n, if j == k { b.to_vec() } else { bytes.clone() });
            }
            let _ = load_system_in(&mem, Path::new("sys"), &type_map);
        });
        all.extend(crashes.into_iter().map(|s| (name.clone(), s)));
    }
    assert!(all.is_empty(), "crashes (file, seed): {all:?}");
}

#[test]
fn fuzz_input_json() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/water/input.json");
    let original = std::fs::read(path).unwrap();
    let (_, crashes) = campaign("input.json", &original, true, |b| {
        if let Ok(v) = serde_json::from_slice(b) {
            let _ = Config::from_value(&v, Path::new(""));
        }
    });
    assert!(crashes.is_empty(), "crash seeds: {crashes:?}");
}

fn small_model() -> Model {
    let spec = ModelSpec {
        short_range: None,
        linear: None,
        type_map: vec!["O".into(), "H".into()],
        descriptor: DescriptorSpec {
            kind: Default::default(),
            rcut: 4.0,
            rcut_smth: 0.5,
            sel: vec![6, 8],
            neuron: vec![2, 4],
            axis_neuron: 2,
            resnet_dt: false,
            type_one_side: false,
            env_protection: 0.0,
            set_davg_zero: false,
            own: dpw::model::OwnKeys::Se,
        },
        fitting: FittingSpec::new(vec![4, 4], true),
    };
    Model::new(spec, 1)
}

#[test]
fn fuzz_yaml_model() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.yaml");
    write_deepmd_yaml(&small_model(), &p).unwrap();
    let original = std::fs::read(&p).unwrap();
    let case = d.path().join("case.yaml");
    let (_, crashes) = campaign("yaml", &original, true, |b| {
        std::fs::write(&case, b).unwrap();
        let _ = read_deepmd_yaml(&case);
    });
    assert!(crashes.is_empty(), "crash seeds: {crashes:?}");
}

/// `b` with its CRC-32 trailer recomputed, so a mutation reaches the parser behind it.
fn resealed(b: &[u8]) -> Vec<u8> {
    let mut out = b.to_vec();
    if out.len() >= 4 && out.starts_with(b"DPWFILE2") {
        let n = out.len() - 4;
        let sum = crc32fast::hash(&out[..n]);
        out[n..].copy_from_slice(&sum.to_le_bytes());
    }
    out
}

#[test]
fn fuzz_dpw_model_and_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let model = small_model();
    let mpath = d.path().join("m.dpw");
    save_model(&mpath, &model).unwrap();
    let np = model.params.len();
    let ck = Checkpoint {
        model: model.clone(),
        precision: Precision::F64,
        step: 7,
        lr: 1e-3,
        adam_m: vec![0.1; np],
        adam_v: vec![0.2; np],
        sampler: Sampler::new(&[3], &[1], vec![1.0], 5),
        valid_sampler: None,
        train_shape: DataShape {
            nframes: vec![3],
            batch_sizes: vec![1],
            probs: vec![1.0],
            mixed: None,
        },
        valid_shape: None,
        disp_acc: vec![0.0; 5],
    };
    let cpath = d.path().join("model.ckpt-7");
    ck.write(&cpath).unwrap();
    let case = d.path().join("case");
    let mut all = Vec::new();
    for (name, p) in [("model", &mpath), ("checkpoint", &cpath)] {
        let original = std::fs::read(p).unwrap();
        for reseal in [false, true] {
            let (_, crashes) = campaign(
                &format!("{name} resealed {reseal}"),
                &original,
                false,
                |b| {
                    let b = if reseal { resealed(b) } else { b.to_vec() };
                    std::fs::write(&case, &b).unwrap();
                    if let Ok(c) = read_container(&case) {
                        let _ = model_from_container(&c);
                    }
                    let _ = Checkpoint::read(&case);
                },
            );
            all.extend(crashes.into_iter().map(|s| (name, reseal, s)));
        }
    }
    assert!(all.is_empty(), "crashes (file, resealed, seed): {all:?}");
}

/// A checkpoint of `model`, its sampler part way through an epoch of two systems.
fn checkpoint_of(model: Model) -> Checkpoint {
    let np = model.params.len();
    let mut sampler = Sampler::new(&[3, 2], &[1, 2], vec![0.5, 0.5], 5);
    for _ in 0..3 {
        sampler.next_batch();
    }
    Checkpoint {
        model,
        precision: Precision::F64,
        step: 7,
        lr: 1e-3,
        adam_m: vec![0.1; np],
        adam_v: vec![0.2; np],
        sampler,
        valid_sampler: None,
        train_shape: DataShape {
            nframes: vec![3, 2],
            batch_sizes: vec![1, 2],
            probs: vec![0.5, 0.5],
            mixed: None,
        },
        valid_shape: None,
        disp_acc: vec![0.0; 5],
    }
}

/// A model of each descriptor kind: se_e2_a's [`small_model`], the others DeePMD-kit's
/// reference models.
fn models_of_each_kind() -> Vec<(&'static str, Model)> {
    let reference = |case: &str| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/reference")
            .join(case)
            .join("model.yaml");
        read_deepmd_yaml(&p).unwrap()
    };
    vec![
        ("se_e2_a", small_model()),
        ("se_e2_r", reference("descriptors/se_e2_r_water")),
        ("se_e3", reference("descriptors/se_e3_water")),
        ("hybrid", reference("descriptors/hybrid_water")),
        ("se_atten", reference("dpa1/se_atten_l0_water")),
        ("se_atten_v2", reference("dpa1/se_atten_v2_alloy")),
    ]
}

/// Issue 59, defect 6: a checkpoint whose checksum is right (or an older one without any) but
/// whose state no run reaches is refused on load, naming the file and the field, for every
/// descriptor kind; a restart panicked in the sampler (`next` past the frames) or in the batch
/// thread (an `order` entry out of range).
#[test]
fn crafted_checkpoint_states_are_refused() {
    type Edit = fn(&mut serde_json::Value, &mut [(String, Vec<f64>)]);
    let edits: [(&str, Edit); 11] = [
        (
            "sampler: systems[0].next is 4, past the system's 3 frames",
            |h, _| h["sampler"]["systems"][0]["next"] = 4.into(),
        ),
        (
            "sampler: systems[1].order is not an order of the system's 2 frames",
            |h, _| h["sampler"]["systems"][1]["order"][0] = 9.into(),
        ),
        ("sampler: systems[1].order is not an order", |h, _| {
            h["sampler"]["systems"][1]["order"] = serde_json::json!([1, 1])
        }),
        ("sampler: systems[0].batch_size is 0, not 1", |h, _| {
            h["sampler"]["systems"][0]["batch_size"] = 0.into()
        }),
        ("sampler: cumulative probabilities [0.5]", |h, _| {
            h["sampler"]["cumulative"] = serde_json::json!([0.5])
        }),
        ("sampler: 1 systems for 2", |h, _| {
            h["sampler"]["systems"].as_array_mut().unwrap().pop();
        }),
        (
            "sampler: frame counts [0, 2] and batch sizes [1, 2] must be positive",
            |h, _| h["train_shape"]["nframes"] = serde_json::json!([0, 2]),
        ),
        ("lr is NaN", |h, _| h["lr"] = serde_json::Value::Null),
        ("valid_sampler without its data shape", |h, _| {
            h["valid_sampler"] = h["sampler"].clone()
        }),
        ("adam_v[2] is -1", |_, a| {
            a.iter_mut().find(|(n, _)| n == "adam_v").unwrap().1[2] = -1.0
        }),
        ("disp_acc[0], a count of steps, is 0.5", |_, a| {
            a.iter_mut().find(|(n, _)| n == "disp_acc").unwrap().1[0] = 0.5
        }),
    ];
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("model.ckpt-7");
    for (kind, model) in models_of_each_kind() {
        checkpoint_of(model).write(&path).unwrap();
        Checkpoint::read(&path).unwrap_or_else(|e| panic!("{kind}: {e:#}"));
        let c = read_container(&path).unwrap();
        for (want, edit) in &edits {
            let (mut header, mut arrays) = (c.header.clone(), c.arrays.clone());
            edit(&mut header, &mut arrays[..]);
            let named: Vec<(&str, &[f64])> = (arrays.iter())
                .map(|(n, a)| (n.as_str(), a.as_slice()))
                .collect();
            write_container(&path, &header, &named).unwrap();
            for legacy in [false, true] {
                if legacy {
                    // dpw's files before the checksum: DPWFILE1, no CRC trailer.
                    let mut b = std::fs::read(&path).unwrap();
                    b[..8].copy_from_slice(b"DPWFILE1");
                    b.truncate(b.len() - 4);
                    std::fs::write(&path, b).unwrap();
                }
                let e = format!("{:#}", Checkpoint::read(&path).unwrap_err());
                assert!(
                    e.contains(&format!("{}: impossible training state", path.display()))
                        && e.contains(want),
                    "{kind} (legacy {legacy}): {want:?} not in {e}"
                );
            }
        }
    }
}

/// Mutation fuzzing of a checkpoint of each descriptor kind, resealed so that the mutations
/// reach the state behind the checksum: every checkpoint that loads must also run, its batch
/// stream handing out frames of its systems only.
#[test]
fn fuzz_checkpoints_of_each_kind() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("model.ckpt-7");
    let case = d.path().join("case");
    let mut all = Vec::new();
    for (kind, model) in models_of_each_kind() {
        checkpoint_of(model).write(&path).unwrap();
        let original = std::fs::read(&path).unwrap();
        let (_, crashes) = campaign(&format!("checkpoint {kind}"), &original, true, |b| {
            std::fs::write(&case, resealed(b)).unwrap();
            if let Ok(ck) = Checkpoint::read(&case) {
                let mut s = ck.sampler.clone();
                for _ in 0..8 {
                    let (sys, frames) = s.next_batch();
                    let nf = ck.train_shape.nframes[sys];
                    assert!(frames.iter().all(|&f| f < nf), "{frames:?} of {nf}");
                }
            }
        });
        all.extend(crashes.into_iter().map(|s| (kind, s)));
    }
    assert!(all.is_empty(), "crashes (kind, seed): {all:?}");
}

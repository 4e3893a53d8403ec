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
use dpw::model::file::{model_from_container, read_container, save_model};
use dpw::model::{
    read_deepmd_yaml, write_deepmd_yaml, DescriptorSpec, FittingSpec, Model, ModelSpec,
};
use dpw::train::checkpoint::{Checkpoint, DataShape};

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
            list: vec![],
            attention: None,
        },
        fitting: FittingSpec {
            neuron: vec![4, 4],
            resnet_dt: true,
        },
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
        },
        valid_shape: None,
        disp_acc: [0.0; 5],
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

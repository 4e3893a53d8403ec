//! Benchmark data: `N` systems of `M` frames derived from the shipped water data, written as
//! deepmd/npy folders and as one deepmd/hdf5 file (the HDF5 C library must be installed), with
//! an input.json for each.
//!
//!     cargo run --release --example gen-data -- OUT N M
//!
//! System `i` takes the frames of water system `i mod 4`, keeps a random subset of its O and H
//! atoms (so natoms varies across systems), perturbs the coordinates (σ 0.01 Å) and forces, and
//! scales the energy with the atom count. Every third system has virial labels and every fifth
//! is `nopbc`; systems of more than 10 frames are split into sets of 10. Everything is drawn
//! from a seed per system, so a size is the same data set on every machine.
//!
//! A Rust example rather than a Python script: it reads the water data with dpw's own reader
//! and writes HDF5 through the library dpw reads it with, and needs no numpy/h5py installed.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use dpw::data::{load_system, Hdf5Writer, System};
use ndarray::{Array1, Array2};
use ndarray_npy::write_npy;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// Frames per `set.*`.
const SET_SIZE: usize = 10;

/// One generated system, atoms in `type.raw` order.
struct Generated {
    types: Vec<usize>,
    pbc: bool,
    /// Per set: coord `[nf][natoms*3]`, box `[nf][9]`, energy `[nf]`, force, virial `[nf][9]`.
    sets: Vec<Set>,
}

struct Set {
    coord: Array2<f32>,
    cell: Array2<f32>,
    energy: Array1<f32>,
    force: Array2<f32>,
    virial: Option<Array2<f32>>,
}

fn generate(src: &System, index: usize, nframes: usize) -> Generated {
    let mut rng = ChaCha8Rng::seed_from_u64(0x6765_6e00 + index as u64);
    let noise = Normal::new(0.0, 0.01).expect("valid sigma");
    // Keep 30-100 % of each element's atoms, at least one of each.
    let mut keep = Vec::new();
    for t in 0..2 {
        let atoms: Vec<usize> = (0..src.natoms).filter(|&i| src.atype[i] == t).collect();
        let frac = rng.random_range(0.3..=1.0);
        let n = ((atoms.len() as f64 * frac).round() as usize).max(1);
        let mut chosen: Vec<usize> = atoms.clone();
        for k in 0..n {
            let j = rng.random_range(k..chosen.len());
            chosen.swap(k, j);
        }
        chosen.truncate(n);
        chosen.sort();
        keep.extend(chosen);
    }
    let natoms = keep.len();
    let scale = natoms as f64 / src.natoms as f64;
    let pbc = index % 5 != 4;
    let with_virial = index.is_multiple_of(3);
    let mut sets = Vec::new();
    let mut f0 = 0;
    while f0 < nframes {
        let nf = SET_SIZE.min(nframes - f0);
        let mut coord = Array2::zeros((nf, natoms * 3));
        let mut force = Array2::zeros((nf, natoms * 3));
        let mut cell = Array2::zeros((nf, 9));
        let mut energy = Array1::zeros(nf);
        let mut virial = Array2::zeros((nf, 9));
        for k in 0..nf {
            let f = rng.random_range(0..src.nframes);
            let (c, fo) = (src.frame_coord(f), src.frame_force(f));
            for (a, &i) in keep.iter().enumerate() {
                for x in 0..3 {
                    coord[[k, 3 * a + x]] = (c[3 * i + x] + noise.sample(&mut rng)) as f32;
                    force[[k, 3 * a + x]] = (fo[3 * i + x] + noise.sample(&mut rng)) as f32;
                }
            }
            if let Some(b) = src.frame_cell(f) {
                for x in 0..9 {
                    cell[[k, x]] = b[x] as f32;
                }
            }
            energy[k] = (src.energy[f] * scale + noise.sample(&mut rng)) as f32;
            for x in 0..9 {
                // A symmetric tensor of plausible size (eV), for the virial loss terms.
                let (r, c) = (x / 3, x % 3);
                virial[[k, x]] =
                    ((r.min(c) * 3 + r.max(c)) as f64 * 0.1 + 10.0 * noise.sample(&mut rng)) as f32;
            }
        }
        sets.push(Set {
            coord,
            cell,
            energy,
            force,
            virial: with_virial.then_some(virial),
        });
        f0 += nf;
    }
    Generated {
        types: keep.iter().map(|&i| src.atype[i]).collect(),
        pbc,
        sets,
    }
}

fn write_npy_system(dir: &Path, g: &Generated) -> Result<()> {
    fs::create_dir_all(dir)?;
    let types: Vec<String> = g.types.iter().map(usize::to_string).collect();
    fs::write(dir.join("type.raw"), types.join(" ") + "\n")?;
    fs::write(dir.join("type_map.raw"), "O\nH\n")?;
    if !g.pbc {
        fs::write(dir.join("nopbc"), "")?;
    }
    for (k, s) in g.sets.iter().enumerate() {
        let set = dir.join(format!("set.{k:03}"));
        fs::create_dir_all(&set)?;
        write_npy(set.join("coord.npy"), &s.coord)?;
        write_npy(set.join("energy.npy"), &s.energy)?;
        write_npy(set.join("force.npy"), &s.force)?;
        if g.pbc {
            write_npy(set.join("box.npy"), &s.cell)?;
        }
        if let Some(v) = &s.virial {
            write_npy(set.join("virial.npy"), v)?;
        }
    }
    Ok(())
}

/// The system as dpdata's deepmd/hdf5 writer lays it out, in group `name` of `file`.
fn write_group(file: &Hdf5Writer, name: &str, g: &Generated) -> Result<()> {
    let types: Vec<i64> = g.types.iter().map(|&t| t as i64).collect();
    file.write(&format!("{name}/type.raw"), &[types.len()], &types)?;
    file.write_strings(&format!("{name}/type_map.raw"), &["O", "H"])?;
    if !g.pbc {
        // h5py stores a numpy bool as one byte; only the dataset's presence matters.
        file.write(&format!("{name}/nopbc"), &[], &[1i8])?;
    }
    for (k, s) in g.sets.iter().enumerate() {
        let set = format!("{name}/set.{k:03}");
        let nf = s.energy.len();
        let flat = |a: &ndarray::Array2<f32>| a.iter().copied().collect::<Vec<f32>>();
        let put = |f: &str, shape: &[usize], data: &[f32]| {
            file.write(&format!("{set}/{f}.npy"), shape, data)
        };
        put("coord", &[nf, s.coord.ncols()], &flat(&s.coord))?;
        put("energy", &[nf], &s.energy.to_vec())?;
        put("force", &[nf, s.force.ncols()], &flat(&s.force))?;
        if g.pbc {
            put("box", &[nf, 9], &flat(&s.cell))?;
        }
        if let Some(v) = &s.virial {
            put("virial", &[nf, 9], &flat(v))?;
        }
    }
    Ok(())
}

/// input.json for `systems`: the water example's model with `numb_steps` steps.
fn input_json(template: &Path, systems: &str, steps: usize) -> Result<String> {
    let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(template)?)?;
    v["training"]["training_data"]["systems"] = serde_json::json!(systems);
    v["training"]["numb_steps"] = serde_json::json!(steps);
    v["training"]["disp_freq"] = serde_json::json!(steps.clamp(1, 100));
    v["training"]["save_freq"] = serde_json::json!(steps.max(1));
    if let Some(t) = v["training"].as_object_mut() {
        t.remove("validation_data");
    }
    v.as_object_mut().map(|o| o.remove("_comment"));
    Ok(serde_json::to_string_pretty(&v)? + "\n")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, n, m] = &args[..] else {
        bail!("usage: gen-data OUT NSYSTEMS NFRAMES");
    };
    let out = PathBuf::from(out);
    let (n, m): (usize, usize) = (n.parse()?, m.parse()?);
    if n == 0 || m == 0 {
        bail!("NSYSTEMS and NFRAMES must be positive");
    }
    let water = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    let type_map = vec!["O".to_string(), "H".to_string()];
    let sources = (0..4)
        .map(|k| load_system(&water.join(format!("data_{k}")), &type_map))
        .collect::<Result<Vec<_>, _>>()?;
    let npy = out.join("npy");
    if out.exists() {
        bail!("{} exists; give a new folder", out.display());
    }
    fs::create_dir_all(&npy)?;
    let h5 = Hdf5Writer::create(&out.join("data.hdf5"))?;
    for i in 0..n {
        let g = generate(&sources[i % 4], i, m);
        let name = format!("sys.{i:05}");
        write_npy_system(&npy.join(&name), &g).with_context(|| format!("writing {name}"))?;
        write_group(&h5, &name, &g)?;
        if (i + 1) % 500 == 0 {
            eprintln!("{} / {n} systems", i + 1);
        }
    }
    let template = water.join("input.json");
    fs::write(out.join("input-npy.json"), input_json(&template, "npy", 1)?)?;
    fs::write(
        out.join("input-hdf5.json"),
        input_json(&template, "data.hdf5", 1)?,
    )?;
    eprintln!(
        "wrote {n} systems of {m} frames to {} (npy/ and data.hdf5)",
        out.display()
    );
    Ok(())
}

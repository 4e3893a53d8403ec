//! DeePMD-kit's `.pt` training checkpoints read as dpw models (src/model/pt), against DeePMD-kit
//! 3.2.0's own files in tests/reference/multitask: every head of every `.pt` there gives the
//! serialization tree of its `model.yaml` (which DeePMD-kit wrote from the same checkpoint), the
//! same model bit for bit, and DeePMD-kit's predictions on the `eval*.npz` frames; the command
//! line reads it; what cannot be read is refused with what to do.
mod common;

use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

use dpw::backend::cpu::Cpu;
use dpw::model::pt::Checkpoint;
use dpw::model::{read_deepmd_yaml, read_model, read_model_head, read_model_to_train, Model};
use dpw::train::batch::Frame;
use dpw::train::predict::predict;

use common::{dpw_in, max_abs_diff, npz, npz_array, npz_i64, rel_to_max, repo};

fn case(rel: &str) -> PathBuf {
    repo(&format!("tests/reference/multitask/{rel}"))
}

/// Every head of every `.pt` in the references, with the `.yaml` DeePMD-kit serialized it to
/// and the npz of its predictions (where the case has one).
const HEADS: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "pre_se_a/model.ckpt.pt",
        "Default",
        "pre_se_a/model.yaml",
        None,
    ),
    (
        "pre_mt/model.ckpt.pt",
        "water",
        "pre_mt/model_water.yaml",
        None,
    ),
    (
        "pre_mt/model.ckpt.pt",
        "alloy",
        "pre_mt/model_alloy.yaml",
        None,
    ),
    (
        "mt_steps/model.ckpt.pt",
        "water",
        "mt_steps/model_water.yaml",
        None,
    ),
    (
        "mt_steps/model.ckpt.pt",
        "alloy",
        "mt_steps/model_alloy.yaml",
        None,
    ),
    (
        "sf_pre/model.ckpt.pt",
        "water",
        "sf_pre/model_water.yaml",
        None,
    ),
    (
        "sf_pre/model.ckpt.pt",
        "alloy",
        "sf_pre/model_alloy.yaml",
        None,
    ),
    (
        "pf_pre/model.ckpt.pt",
        "water",
        "pf_pre/model_water.yaml",
        None,
    ),
    (
        "pf_pre/model.ckpt.pt",
        "alloy",
        "pf_pre/model_alloy.yaml",
        None,
    ),
    (
        "pf_pre/model.ckpt.pt",
        "alloy2",
        "pf_pre/model_alloy2.yaml",
        None,
    ),
    (
        "lf_pre/model.ckpt.pt",
        "water",
        "lf_pre/model_water.yaml",
        None,
    ),
    (
        "lf_pre/model.ckpt.pt",
        "alloy",
        "lf_pre/model_alloy.yaml",
        None,
    ),
    (
        "ft_se_a/model.ckpt.pt",
        "Default",
        "ft_se_a/model.yaml",
        Some("ft_se_a/eval.npz"),
    ),
    (
        "ft_mt_alloy/model.ckpt.pt",
        "Default",
        "ft_mt_alloy/model.yaml",
        Some("ft_mt_alloy/eval.npz"),
    ),
    (
        "ft_mt_water_ho/model.ckpt.pt",
        "Default",
        "ft_mt_water_ho/model.yaml",
        Some("ft_mt_water_ho/eval.npz"),
    ),
    (
        "ft_mt_newtype/model.ckpt.pt",
        "Default",
        "ft_mt_newtype/model.yaml",
        Some("ft_mt_newtype/eval.npz"),
    ),
    (
        "ft_mt_random/model.ckpt.pt",
        "Default",
        "ft_mt_random/model.yaml",
        Some("ft_mt_random/eval.npz"),
    ),
    (
        "ft_mt_multitask/model.ckpt.pt",
        "water",
        "ft_mt_multitask/model_water.yaml",
        Some("ft_mt_multitask/eval_water.npz"),
    ),
    (
        "ft_mt_multitask/model.ckpt.pt",
        "alloy_ft",
        "ft_mt_multitask/model_alloy_ft.yaml",
        Some("ft_mt_multitask/eval_alloy_ft.npz"),
    ),
    (
        "cb_se_a_change/model_updated.pt",
        "Default",
        "cb_se_a_change/model.yaml",
        Some("cb_se_a_change/eval.npz"),
    ),
    (
        "cb_se_a_set/model_updated.pt",
        "Default",
        "cb_se_a_set/model.yaml",
        Some("cb_se_a_set/eval.npz"),
    ),
    (
        "cb_se_a_value/model_updated.pt",
        "Default",
        "cb_se_a_value/model.yaml",
        Some("cb_se_a_value/eval.npz"),
    ),
    (
        "cb_mt_alloy/model_updated.pt",
        "alloy",
        "cb_mt_alloy/model.yaml",
        Some("cb_mt_alloy/eval.npz"),
    ),
    // change-bias of the alloy head leaves the water head as pre_mt had it (README).
    (
        "cb_mt_alloy/model_updated.pt",
        "water",
        "pre_mt/model_water.yaml",
        None,
    ),
];

/// The paths where two trees differ, at most `limit` of them.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Mapping(x), Value::Mapping(y)) => {
            for (k, v) in x {
                let name = format!("{path}.{}", k.as_str().unwrap_or("?"));
                match y.get(k) {
                    Some(w) => differences(v, w, &name, out),
                    None => out.push(format!("{name}: only in the .pt's tree")),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!(
                    "{path}.{}: only in the .yaml",
                    k.as_str().unwrap_or("?")
                ));
            }
        }
        (Value::Sequence(x), Value::Sequence(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                differences(v, w, &format!("{path}[{i}]"), out);
            }
        }
        // Bit for bit: a float's shortest repr reads back as the same f64.
        (Value::Number(x), Value::Number(y))
            if x.is_f64()
                && y.is_f64()
                && x.as_f64().map(f64::to_bits) != y.as_f64().map(f64::to_bits) =>
        {
            out.push(format!("{path}: {x} vs {y}"))
        }
        _ if a != b => out.push(format!(
            "{path}: {} vs {}",
            serde_yaml_ng::to_string(a).unwrap_or_default().trim(),
            serde_yaml_ng::to_string(b).unwrap_or_default().trim()
        )),
        _ => {}
    }
}

fn yaml_tree(rel: &str) -> Value {
    let text = std::fs::read_to_string(case(rel)).unwrap();
    let mut v: Value = serde_yaml_ng::from_str(&text).unwrap();
    // The stamps of the writer, which a checkpoint does not record.
    for k in ["software", "version", "time"] {
        v.as_mapping_mut().unwrap().remove(k);
    }
    v
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The same model: the same hyper-parameters, and every number bit for bit.
fn assert_same_model(a: &Model, b: &Model, what: &str) {
    assert_eq!(a.spec, b.spec, "{what}: spec");
    for (name, x, y) in [
        ("params", &a.params, &b.params),
        ("davg", &a.davg, &b.davg),
        ("dstd", &a.dstd, &b.dstd),
        ("bias", &a.bias, &b.bias),
        ("out_std", &a.out_std, &b.out_std),
        ("fit_input_avg", &a.fit_input_avg, &b.fit_input_avg),
        (
            "fit_input_inv_std",
            &a.fit_input_inv_std,
            &b.fit_input_inv_std,
        ),
    ] {
        assert_eq!(bits(x), bits(y), "{what}: {name}");
    }
}

/// Every `.pt` and every head of it is in [`HEADS`].
#[test]
fn every_checkpoint_and_head_is_checked() {
    let mut found = vec![];
    for dir in std::fs::read_dir(case("")).unwrap() {
        for f in std::fs::read_dir(dir.unwrap().path()).into_iter().flatten() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "pt") {
                let ckpt = Checkpoint::read(&p).unwrap_or_else(|e| panic!("{e:#}"));
                let rel = p
                    .strip_prefix(case(""))
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                for h in ckpt.heads() {
                    found.push((rel.clone(), h.to_string()));
                }
            }
        }
    }
    found.sort();
    let mut listed: Vec<(String, String)> = (HEADS.iter())
        .map(|(p, h, _, _)| (p.to_string(), h.to_string()))
        .collect();
    listed.sort();
    assert_eq!(found, listed);
}

/// Each head's tree is DeePMD-kit's serialization of it, key for key and bit for bit (but the
/// writer's stamps), and reads as the same model as that `.yaml`.
#[test]
fn every_head_is_its_deepmd_kit_yaml() {
    for &(pt, head, yaml, _) in HEADS {
        let what = format!("{pt} head {head}");
        let ckpt = Checkpoint::read(&case(pt)).unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let tree = ckpt
            .tree(Some(head))
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let mut diff = vec![];
        differences(&tree, &yaml_tree(yaml), "", &mut diff);
        assert!(diff.is_empty(), "{what} vs {yaml}:\n{}", diff.join("\n"));

        let from_pt = ckpt
            .model(Some(head))
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let from_yaml = read_deepmd_yaml(&case(yaml)).unwrap();
        assert_same_model(&from_pt.model, &from_yaml, &what);
    }
}

/// What fine-tuning reads besides the model: heads, type maps, each head's input section, and
/// train_infos (spec §21.1: the last step's lr and 0-based index).
#[test]
fn heads_type_maps_and_train_infos() {
    let mt = Checkpoint::read(&case("pre_mt/model.ckpt.pt")).unwrap();
    assert!(mt.is_multitask());
    assert_eq!(mt.heads(), ["alloy", "water"]);
    let all = ["O", "H", "Cu", "Ni", "Al"];
    assert_eq!(mt.type_map(Some("water")).unwrap(), all);
    assert_eq!(
        mt.head_params(Some("alloy")).unwrap()["fitting_net"]["seed"],
        3
    );
    assert_eq!(
        mt.model_params()["shared_dict"]["type_map_all"],
        serde_json::json!(all)
    );
    let infos = mt.train_infos().unwrap();
    assert_eq!(infos["step"], 5);
    assert_eq!(
        infos["lr"].as_f64().unwrap().to_bits(),
        4.64158883361278e-5f64.to_bits()
    );

    let st = Checkpoint::read(&case("ft_mt_alloy/model.ckpt.pt")).unwrap();
    assert!(!st.is_multitask());
    assert_eq!(st.heads(), ["Default"]);
    assert_eq!(st.type_map(None).unwrap(), ["Al", "Ni", "Cu"]);
    assert_eq!(
        st.head_params(Some("Default")).unwrap()["descriptor"]["type"],
        "se_atten"
    );
    assert_eq!(
        st.train_infos().unwrap(),
        &serde_json::json!({"lr": 0.0, "step": 0})
    );
}

/// Frames of an `eval*.npz`, atoms sorted by type as dpw's batches are, and DeePMD-kit's
/// predictions in that order.
struct Eval {
    atype: Vec<usize>,
    coord: Vec<Vec<f64>>,
    cell: Option<Vec<Vec<f64>>>,
    energy: Vec<f64>,
    atom_energy: Vec<f64>,
    force: Vec<f64>,
    virial: Vec<f64>,
}

fn eval(path: &Path) -> Eval {
    let mut z = npz(path);
    let names: Vec<String> = z.names().unwrap();
    let atype: Vec<usize> = npz_i64(&mut z, "atype")
        .iter()
        .map(|&t| t as usize)
        .collect();
    let n = atype.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| atype[i]);
    let per_atom = |a: ndarray::ArrayD<f64>, w: usize| -> Vec<Vec<f64>> {
        (a.outer_iter())
            .map(|f| {
                let f: Vec<f64> = f.iter().copied().collect();
                (order.iter())
                    .flat_map(|&i| f[i * w..(i + 1) * w].to_vec())
                    .collect()
            })
            .collect()
    };
    let flat = |a: ndarray::ArrayD<f64>| a.iter().copied().collect::<Vec<f64>>();
    let has_box = names.iter().any(|n| n.trim_end_matches(".npy") == "box");
    Eval {
        atype: order.iter().map(|&i| atype[i]).collect(),
        coord: per_atom(npz_array(&mut z, "coord"), 3),
        cell: has_box.then(|| {
            let b = npz_array(&mut z, "box");
            b.outer_iter()
                .map(|f| f.iter().copied().collect())
                .collect()
        }),
        energy: flat(npz_array(&mut z, "energy")),
        atom_energy: per_atom(npz_array(&mut z, "atom_energy"), 1).concat(),
        force: per_atom(npz_array(&mut z, "force"), 3).concat(),
        virial: flat(npz_array(&mut z, "virial")),
    }
}

/// dpw's energies, atomic energies, forces and virials of each head on its eval frames are
/// DeePMD-kit's (DeepPot on the `.pt`) to 1e-10 of their largest value.
#[test]
fn predictions_are_deepmd_kits() {
    for &(pt, head, _, npz) in HEADS {
        let Some(npz) = npz else { continue };
        let model = read_model_head(&case(pt), Some(head)).unwrap_or_else(|e| panic!("{e:#}"));
        let e = eval(&case(npz));
        let no_labels = vec![0.0; 3 * e.atype.len()];
        let frames: Vec<Frame> = (0..e.energy.len())
            .map(|f| Frame {
                coord: &e.coord[f],
                cell: e.cell.as_ref().map(|c| c[f].as_slice()),
                energy: 0.0,
                force: &no_labels,
                virial: None,
                fparam: None,
                aparam: None,
                label: None,
                atom_label: None,
            })
            .collect();
        let p = predict::<f64, _>(&Cpu::default(), &model, &e.atype, &frames).unwrap();
        let parts = [
            ("energy", &p.energy, &e.energy),
            ("atom energy", &p.atom_energy, &e.atom_energy),
            ("force", &p.force, &e.force),
            ("virial", &p.virial, &e.virial),
        ];
        let shown: Vec<String> = (parts.iter())
            .map(|(w, a, b)| format!("{w} {:.1e}", max_abs_diff(a, b)))
            .collect();
        eprintln!("{pt} {head}: max abs vs DeePMD-kit: {}", shown.join(", "));
        for (what, a, b) in parts {
            let r = rel_to_max(a, b);
            assert!(
                r <= 1e-10,
                "{pt} {head}: {what} off by {r:e} of its largest value"
            );
        }
    }
}

/// `dpw convert` writes a head of a `.pt` as DeePMD-kit's `.yaml`, which reads back as the same
/// model; `dpw test` evaluates a head directly.
#[test]
fn convert_and_test_take_a_pt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pt = case("pre_mt/model.ckpt.pt");
    let pt = pt.to_str().unwrap();
    let (ok, out) = dpw_in(dir, &["convert", pt, "alloy.yaml", "--head", "alloy"]);
    assert!(ok, "{out}");
    let back = read_deepmd_yaml(&dir.join("alloy.yaml")).unwrap();
    let direct = read_model_head(Path::new(pt), Some("alloy")).unwrap();
    assert_same_model(&back, &direct, "dpw convert --head alloy");

    let single = case("ft_se_a/model.ckpt.pt");
    let (ok, out) = dpw_in(dir, &["convert", single.to_str().unwrap(), "se_a.yaml"]);
    assert!(ok, "{out}");
    let back = read_deepmd_yaml(&dir.join("se_a.yaml")).unwrap();
    assert_same_model(&back, &read_model(&single).unwrap(), "dpw convert");
    // What training starts from (--init-model) reads it too.
    assert_same_model(
        &read_model_to_train(&single).unwrap(),
        &back,
        "--init-model",
    );

    let system = repo("examples/alloy/data/train/Cu27Ni54Al27");
    let pt = case("cb_mt_alloy/model_updated.pt");
    let args = ["test", "-m", pt.to_str().unwrap(), "--head", "alloy", "-s"];
    let (ok, out) = dpw_in(
        dir,
        &[
            &args[..],
            &[system.to_str().unwrap(), "-n", "1", "--backend", "cpu"],
        ]
        .concat(),
    );
    assert!(ok && out.contains("Energy RMSE"), "{out}");
}

fn err_of(r: anyhow::Result<Model>) -> String {
    match r {
        Ok(_) => panic!("read where a refusal was expected"),
        Err(e) => format!("{e:#}"),
    }
}

/// A head is chosen as DeePMD-kit chooses one: a multi-task file needs it, a single-task file
/// has only `Default`, and a name that is no head is refused with the list.
#[test]
fn heads_are_refused_as_deepmd_kit_does() {
    let mt = case("pre_mt/model.ckpt.pt");
    let e = err_of(read_model(&mt));
    assert!(
        e.contains("a multi-task checkpoint with the heads 'alloy', 'water'; head must be specified in multitask mode")
            && e.contains("--head"),
        "{e}"
    );
    let e = err_of(read_model_head(&mt, Some("foo")));
    assert!(
        e.contains("no head (model branch) or alias named 'foo'; the heads are 'alloy', 'water'"),
        "{e}"
    );

    let st = case("pre_se_a/model.ckpt.pt");
    assert!(read_model_head(&st, Some("Default")).is_ok());
    let e = err_of(read_model_head(&st, Some("water")));
    assert!(
        e.contains("single-task pretrained models only provide the 'Default' branch, got 'water'"),
        "{e}"
    );

    let yaml = case("pre_se_a/model.yaml");
    let e = err_of(read_model_head(&yaml, Some("water")));
    assert!(
        e.contains("--head water") && e.contains("holds one model"),
        "{e}"
    );

    // The command line says the same, and how to choose.
    let tmp = tempfile::tempdir().unwrap();
    let (ok, out) = dpw_in(tmp.path(), &["convert", mt.to_str().unwrap(), "x.yaml"]);
    assert!(
        !ok && out.contains("head must be specified") && out.contains("--head HEAD"),
        "{out}"
    );
    assert!(!tmp.path().join("x.yaml").exists());
}

/// A copy of the `.pt` at `src` in `dir` whose pickle has the string `from` (pickled as
/// BINUNICODE, so matched with its length) replaced by `to` of the same length, its zip
/// checksums made right: a checkpoint DeePMD-kit could have written with another setting.
fn with_pickled_string(src: &Path, from: &str, to: &str, dir: &Path) -> PathBuf {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(src).unwrap();
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    // data.pkl's central directory entry: its local header's offset and its size.
    let central = (0..bytes.len() - 46)
        .find(|&i| {
            bytes[i..].starts_with(b"PK\x01\x02")
                && bytes[i + 46..i + 46 + u16_at(&bytes, i + 28)].ends_with(b"/data.pkl")
        })
        .expect("a data.pkl entry");
    let (local, size) = (u32_at(&bytes, central + 42), u32_at(&bytes, central + 20));
    let start = local + 30 + u16_at(&bytes, local + 26) + u16_at(&bytes, local + 28);
    let pickled = |s: &str| [&(s.len() as u32).to_le_bytes()[..], s.as_bytes()].concat();
    let (from, to) = (pickled(from), pickled(to));
    let data = &mut bytes[start..start + size];
    let at = (0..data.len())
        .find(|&i| data[i..].starts_with(&from))
        .expect("the string");
    data[at..at + to.len()].copy_from_slice(&to);
    let crc = crc32fast::hash(data).to_le_bytes();
    // The local header's, the data descriptor's after the data (flag bit 3), the directory's.
    let end = start + size;
    let descriptor = if bytes[end..].starts_with(b"PK\x07\x08") {
        end + 4
    } else {
        end
    };
    for at in [local + 14, descriptor, central + 16] {
        bytes[at..at + 4].copy_from_slice(&crc);
    }
    let out = dir.join(src.file_name().unwrap());
    std::fs::write(&out, bytes).unwrap();
    out
}

/// A descriptor the mapping does not cover is refused by name, with DeePMD-kit's way to a
/// `.yaml` (for a multi-task file, through a frozen head).
#[test]
fn unmapped_descriptor_is_refused_with_the_way_to_a_yaml() {
    let tmp = tempfile::tempdir().unwrap();
    let st = with_pickled_string(
        &case("pre_se_a/model.ckpt.pt"),
        "se_e2_a",
        "se_e2_r",
        tmp.path(),
    );
    let e = err_of(read_model(&st));
    let p = st.display();
    assert!(
        e.contains("the descriptor `se_e2_r` is not read from a .pt checkpoint")
            && e.contains(&format!(
                "run `dp convert-backend {p} model.yaml` and give the .yaml"
            )),
        "{e}"
    );

    let sub = tmp.path().join("mt");
    std::fs::create_dir(&sub).unwrap();
    let mt = with_pickled_string(&case("pre_mt/model.ckpt.pt"), "se_atten", "se_a_ebd", &sub);
    let e = err_of(read_model_head(&mt, Some("alloy")));
    let p = mt.display();
    assert!(
        e.contains("reading head 'alloy'")
            && e.contains("the descriptor `se_a_ebd`")
            && e.contains(&format!(
                "run `dp --pt freeze -c {p} --head alloy -o frozen` then `dp convert-backend \
                 frozen.pth model.yaml` and give the .yaml"
            )),
        "{e}"
    );
}

/// A frozen `.pth` is TorchScript: refused with the way to a model dpw reads.
#[test]
fn frozen_pth_is_refused() {
    let pth = case("pre_se_a/frozen.pth");
    let e = err_of(read_model(&pth));
    assert!(
        e.contains("a frozen DeePMD-kit model (.pth) holds TorchScript")
            && e.contains("give the .pt checkpoint")
            && e.contains("dp convert-backend"),
        "{e}"
    );
}

/// A `.pt` cut short anywhere, or not a checkpoint at all, is an error naming the file.
#[test]
fn truncated_or_corrupt_pt_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(case("pre_se_a/model.ckpt.pt")).unwrap();
    let n = bytes.len();
    for len in [0, 3, 100, n / 3, n / 2, n - 22, n - 1] {
        let p = tmp.path().join(format!("cut_{len}.pt"));
        std::fs::write(&p, &bytes[..len]).unwrap();
        let e = err_of(read_model(&p));
        assert!(e.contains(&format!("cut_{len}.pt")), "{len}: {e}");
    }
    let p = tmp.path().join("cut.pt");
    std::fs::write(&p, &bytes[..n / 2]).unwrap();
    let e = err_of(read_model(&p));
    assert!(
        e.contains("not a complete PyTorch checkpoint (truncated or corrupt?)"),
        "{e}"
    );

    let p = tmp.path().join("text.pt");
    std::fs::write(&p, "model:\n  type: standard\n").unwrap();
    let e = err_of(read_model(&p));
    assert!(e.contains("text.pt"), "{e}");
}

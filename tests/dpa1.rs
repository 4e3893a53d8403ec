//! DPA-1 (se_atten, se_atten_v2) around its descriptor stage: the parameter layout against
//! DeePMD-kit 3.2.0's tensors (tests/reference/dpa1/), `Dims` with one mixed neighbour section,
//! the batch's one mixed list and per-slot neighbour types, the statistics against DeePMD-kit's
//! `compute_input_stats`, and the clear error where the missing stage is needed.
mod common;

use std::path::PathBuf;

use dpw::backend::Dims;
use dpw::geometry::{Cell, EnvStats};
use dpw::model::{read_deepmd_yaml, Model, Skip};
use dpw::train::batch::{assemble, Frame};
use serde_json::Value;

use common::{assert_layout_is_train_steps, deepmd_agrees, eval_frames, repo, EvalFrames};

const CASES: [&str; 4] = [
    "se_atten_l0_water",
    "se_atten_l2_alloy",
    "se_atten_v2_alloy",
    "se_atten_l2_opts_water",
];

fn case_dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/dpa1/{case}"))
}

fn model(case: &str) -> Model {
    read_deepmd_yaml(&case_dir(case).join("model.yaml")).unwrap_or_else(|e| panic!("{e:#}"))
}

fn eval_json(case: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("eval.json")).unwrap())
        .unwrap()
}

fn frames(case: &str) -> EvalFrames {
    eval_frames(&case_dir(case))
}

/// The README's `parameters` column.
fn parameters(case: &str) -> usize {
    match case {
        "se_atten_l0_water" => 1929,
        "se_atten_l2_alloy" => 3209,
        "se_atten_v2_alloy" => 3397,
        "se_atten_l2_opts_water" => 2489,
        _ => unreachable!(),
    }
}

/// Every tensor of the layout is a `grad.*` array of DeePMD-kit's train step, by name and shape,
/// and the other way round; the count is the README's.
#[test]
fn layout_names_and_shapes_are_deepmds() {
    for case in CASES {
        let m = model(case);
        assert_eq!(m.layout().len, parameters(case), "{case}: parameter count");
        assert_layout_is_train_steps(&m, &case_dir(case).join("train_step.npz"), case);
    }
}

/// The nets' structure: one embedding net of the README's input width, strip's type net only
/// for strip, the type embedding's skip by widths, linear attention projections, one fitting
/// net for every type, and trainable_ln false as frozen ranges.
#[test]
fn layout_structure() {
    // (case, embed input, strip input, tebd skip, dim_descrpt)
    let want = [
        ("se_atten_l0_water", 9, None, Skip::Double, 16 * 4 + 4),
        ("se_atten_l2_alloy", 17, None, Skip::None, 16 * 4 + 8),
        ("se_atten_v2_alloy", 1, Some(16), Skip::None, 16 * 4 + 8),
        ("se_atten_l2_opts_water", 9, None, Skip::None, 16 * 4),
    ];
    for (case, nin, strip_nin, skip, dim) in want {
        let m = model(case);
        let layout = m.layout();
        let (l, fit) = (&layout.descriptor, &layout.fitting);
        let a = l.own.attn().expect("a DPA-1 layout has attention nets");
        let cfg = m.spec.descriptor.attn().unwrap();
        assert_eq!(m.spec.dim_descrpt(), dim, "{case}");
        assert_eq!(l.embed.len(), 1, "{case}");
        assert_eq!(l.embed[0].name, "embed");
        assert_eq!(l.embed[0].layers[0].nin, nin, "{case}");
        assert_eq!(
            a.strip.as_ref().map(|n| n.layers[0].nin),
            strip_nin,
            "{case}"
        );
        assert_eq!(a.tebd.skip, skip, "{case}");
        assert_eq!((a.tebd.ntypes, a.tebd.dim), (m.spec.ntypes(), cfg.tebd_dim));
        assert_eq!(a.tebd.b.is_some(), cfg.use_tebd_bias, "{case}");
        assert_eq!(a.layers.len(), cfg.attn_layer, "{case}");
        for k in &a.layers {
            for (p, nin, nout) in [(&k.proj_in, 16, 3 * cfg.attn), (&k.proj_out, cfg.attn, 16)] {
                assert_eq!((p.nin, p.nout), (nin, nout));
                assert!(
                    p.act == dpw::model::Activation::Linear
                        && p.skip == Skip::None
                        && p.idt.is_none()
                );
            }
        }
        assert_eq!(fit.nets.len(), 1, "{case}");
        assert_eq!(fit.nets[0].name, "fit");
        assert_eq!(fit.nets[0].layers[0].nin, dim);
        for t in 0..m.spec.ntypes() {
            assert_eq!(fit.net(t), &fit.nets[0]);
        }
        let ln: Vec<_> = (0..cfg.attn_layer)
            .flat_map(|k| ["w", "b"].map(|x| layout.tensor(&format!("attn{k}.ln.{x}")).unwrap()))
            .collect();
        if cfg.trainable_ln {
            assert!(l.frozen.is_empty(), "{case}");
        } else {
            let n: usize = l.frozen.iter().map(|r| r.len()).sum();
            assert_eq!(n, ln.iter().map(|t| t.len()).sum::<usize>(), "{case}");
            for t in &ln {
                assert!((t.offset..t.offset + t.len()).all(|i| layout.is_frozen(i)));
            }
            let fit0 = layout.tensor("fit.layer0.w").unwrap().offset;
            assert!(!layout.is_frozen(fit0));
        }
    }
}

/// A fresh DPA-1 model: the layer norms start at scale 1 and shift 0, everything else drawn.
#[test]
fn fresh_model_initialises_every_tensor() {
    let spec = model("se_atten_l2_alloy").spec;
    let m = Model::new(spec, 7);
    let l = m.layout();
    for t in &l.tensors {
        let x = &m.params[t.offset..t.offset + t.len()];
        if t.name.ends_with(".ln.w") {
            assert!(x.iter().all(|&v| v == 1.0), "{}", t.name);
        } else if t.name.ends_with(".ln.b") {
            assert!(x.iter().all(|&v| v == 0.0), "{}", t.name);
        } else {
            assert!(x.iter().all(|&v| v != 0.0), "{}", t.name);
        }
    }
}

/// DPA-1's Dims: ntypes centre types, one neighbour section of nnei slots.
#[test]
fn dims_have_one_mixed_section() {
    let spec = model("se_atten_l2_alloy").spec;
    let d = Dims::of_descriptor(&spec.descriptor, 2, &[3, 0, 2]);
    assert_eq!((d.ntypes, d.nsec, d.nnei), (3, 1, 48));
    assert_eq!(d.sel, [48]);
    assert_eq!(d.nslots(), 2 * 5 * 48);
    assert_eq!(d.block(0, 0), 0..6 * 48);
    assert_eq!(d.block(1, 0), 6 * 48..6 * 48);
    assert_eq!(d.block(2, 0), 6 * 48..10 * 48);
    assert_eq!(d.slot(2, 7, 0, 5), 6 * 48 + 48 + 5);
    assert_eq!(d.type_slots(2), 6 * 48..10 * 48);
    assert_eq!(d.sections().count(), 1);
    // Per-type sections as before for the others.
    let e = Dims::new(2, &[3, 2], &[4, 6], 16, 4);
    assert_eq!((e.ntypes, e.nsec), (2, 2));
    assert_eq!(e.block(1, 1), 2 * 3 * 10 + 2 * 2 * 4..2 * 5 * 10);
}

/// Brute force: every (owner, r_j − r_i) within rcut of atom i over the periodic images.
fn brute_neighbours(coord: &[f64], cell: &[f64], i: usize, rcut: f64) -> Vec<(f64, usize)> {
    let n = coord.len() / 3;
    let mut out = Vec::new();
    for a in -2i32..=2 {
        for b in -2i32..=2 {
            for c in -2i32..=2 {
                let shift: Vec<f64> = (0..3)
                    .map(|k| a as f64 * cell[k] + b as f64 * cell[3 + k] + c as f64 * cell[6 + k])
                    .collect();
                for j in 0..n {
                    if a == 0 && b == 0 && c == 0 && j == i {
                        continue;
                    }
                    let d: f64 = (0..3)
                        .map(|k| (coord[3 * j + k] + shift[k] - coord[3 * i + k]).powi(2))
                        .sum::<f64>()
                        .sqrt();
                    if d <= rcut {
                        out.push((d, j));
                    }
                }
            }
        }
    }
    out.sort_by(|x, y| x.partial_cmp(y).unwrap());
    out
}

/// A batch of the eval frames: each centre's slots are ONE list of every neighbour within rcut,
/// nearest first, then padding; a real slot's type is its neighbour's, a padding slot's the
/// frame's lowest type.
#[test]
fn batch_slots_are_one_mixed_list_with_neighbour_types() {
    for case in ["se_atten_l0_water", "se_atten_v2_alloy"] {
        let m = model(case);
        let d = &m.spec.descriptor;
        let fr = frames(case);
        let n = fr.atype.len();
        let frames = fr.unlabelled(&[]);
        let hb = assemble(&m.spec, &fr.atype, &frames).unwrap();
        let dims = &hb.dims;
        assert_eq!((dims.nsec, dims.ntypes), (1, m.spec.ntypes()));
        assert_eq!(hb.nei_type.len(), dims.nslots());
        let nnei = d.nnei();
        let mut most = 0;
        for c in 0..dims.ncentres() {
            let ti = dims.centre_type(c);
            let f = dims.centre_frame(c);
            let i = hb.centre_atom[c] as usize - f * n;
            let want = brute_neighbours(&fr.coord[f], &fr.cell[f], i, d.rcut);
            most = most.max(want.len());
            assert!(want.len() <= nnei, "{case}: sel is large enough");
            for j in 0..nnei {
                let s = dims.slot(ti, c, 0, j);
                if j < want.len() {
                    let o = hb.owner[s];
                    assert!(o >= 0, "{case}: centre {c} slot {j} is padding");
                    let r = &hb.rij[3 * s..3 * s + 3];
                    let dist = r.iter().map(|x| x * x).sum::<f64>().sqrt();
                    assert!(
                        (dist - want[j].0).abs() < 1e-12,
                        "{case}: centre {c} slot {j}"
                    );
                    assert_eq!(o as usize - f * n, want[j].1, "{case}: centre {c} slot {j}");
                    assert_eq!(hb.nei_type[s] as usize, fr.atype[want[j].1]);
                } else {
                    assert_eq!(hb.owner[s], -1, "{case}: centre {c} slot {j}");
                    assert_eq!(hb.nei_type[s], fr.atype[0] as i32);
                }
            }
        }
        let j = eval_json(case);
        let max = &j["neighbour_list"]["max_neighbours_within_rcut_on_eval_frames"];
        assert_eq!(most as u64, max.as_u64().unwrap(), "{case}");
    }
}

/// Padding takes the lowest type present: a frame of the water's H atoms alone pads with H.
#[test]
fn padding_slots_take_the_lowest_type_present() {
    let m = model("se_atten_l0_water");
    let fr = frames("se_atten_l0_water");
    let first_h = fr.atype.iter().position(|&t| t == 1).unwrap();
    let coord = fr.coord[0][3 * first_h..].to_vec();
    let atype = fr.atype[first_h..].to_vec();
    let frame = Frame {
        coord: &coord,
        cell: Some(&fr.cell[0]),
        energy: 0.0,
        force: &[],
        virial: None,
        fparam: None,
        aparam: None,
        label: None,
        atom_label: None,
    };
    let hb = assemble(&m.spec, &atype, &[frame]).unwrap();
    let pads: Vec<i32> = (hb.owner.iter().zip(&hb.nei_type))
        .filter(|(&o, _)| o < 0)
        .map(|(_, &t)| t)
        .collect();
    assert!(!pads.is_empty());
    assert!(pads.iter().all(|&t| t == 1));
    // The other descriptors have no per-slot types.
    let spec = common::model_a().spec;
    let hb = assemble(
        &spec,
        &fr.atype,
        &[Frame {
            coord: &fr.coord[0],
            ..frame
        }],
    )
    .unwrap();
    assert!(hb.nei_type.is_empty());
}

/// davg/dstd on the eval frames as DeePMD-kit's `compute_input_stats` gives them for a mixed
/// list: one row per centre type over all its neighbours.
#[test]
fn statistics_are_deepmds_for_a_mixed_list() {
    for case in CASES {
        let m = model(case);
        let d = &m.spec.descriptor;
        let fr = frames(case);
        let mut env = EnvStats::new(m.spec.ntypes());
        for (coord, cell) in fr.coord.iter().zip(&fr.cell) {
            env.add_frame(d, coord, Cell::new(cell).as_ref(), &fr.atype);
        }
        let (davg, dstd) = env.davg_dstd(d.set_davg_zero);
        let j = eval_json(case);
        let want = &j["deepmd_compute_input_stats_on_these_frames"];
        let rows = |k: &str| -> Vec<f64> {
            (want[k].as_array().unwrap().iter())
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect()
        };
        for (name, ours, theirs) in [
            ("davg", &davg, rows("davg_per_type")),
            ("dstd", &dstd, rows("dstd_per_type")),
        ] {
            assert_eq!(ours.len(), theirs.len());
            for (k, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1e-3),
                    "{case} {name}[{k}]: {a} vs DeePMD-kit's {b}"
                );
            }
        }
    }
}

/// `dpw test` evaluates a model DeePMD-kit made (se_atten_v2: strip, smooth, two attention
/// layers) on a system of the alloy example; the numbers themselves are the backend suite's
/// (`reference_se_atten_predictions`).
#[test]
fn dpw_test_runs_a_deepmd_kit_model() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["test", "-m"])
        .arg(case_dir("se_atten_v2_alloy").join("model.yaml"))
        .arg("-s")
        .arg(repo("examples/alloy/data/train/Cu36Ni36Al36"))
        .args(["-n", "2", "--backend", "cpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("Force  RMSE"),
        "{stdout}{stderr}"
    );
}

/// Issue 59, defect 2: a fitting's `atom_ener` (here `[1.0, 2.0, 3.0]` in the se_atten alloy
/// model) takes the net's output on an all-zero descriptor off every atom's energy, as
/// DeePMD-kit's dpmodel does; `dp test` of DeePMD-kit 3.2.0 on this frame gives 32.5311425 eV
/// (dpw gave 219.8177293 before, ignoring the key). Training from such a model (`-t`,
/// `--init-model`) is refused, naming the key; `dpw convert` writes the same energies without it.
#[test]
fn atom_ener_of_a_yaml_model_is_deepmd_kits() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(case_dir("se_atten_l2_alloy").join("model.yaml")).unwrap();
    let from = "\n    atom_ener: null\n";
    assert!(text.contains(from), "the fixture lost its atom_ener key");
    let yaml = tmp.path().join("atom_ener.yaml");
    std::fs::write(
        &yaml,
        text.replacen(from, "\n    atom_ener: [1.0, 2.0, 3.0]\n", 1),
    )
    .unwrap();
    let dpw = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        (out.status.code(), err)
    };
    let system = repo("examples/alloy/data/train/Cu36Ni36Al36");
    let energy = |model: &str| {
        let (code, err) = dpw(&[
            "test",
            "-m",
            model,
            "-s",
            system.to_str().unwrap(),
            "-n",
            "1",
            "-d",
            "out",
            "--backend",
            "cpu",
        ]);
        assert_eq!(code, Some(0), "{err}");
        let e = std::fs::read_to_string(tmp.path().join("out.e.out")).unwrap();
        let last = e.lines().last().unwrap().split_whitespace().nth(1).unwrap();
        last.parse::<f64>().unwrap()
    };
    let e = energy("atom_ener.yaml");
    assert!((e - 32.5311425).abs() < 1e-6, "{e}");

    // The same model with its vacuum energies in the bias, as a plain model.
    let (code, err) = dpw(&["convert", "atom_ener.yaml", "folded.yaml"]);
    assert_eq!(code, Some(0), "{err}");
    let folded = std::fs::read_to_string(tmp.path().join("folded.yaml")).unwrap();
    assert!(folded.contains("atom_ener: []"), "{folded}");
    assert!((energy("folded.yaml") - 32.5311425).abs() < 1e-6);

    let mut input: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("examples/alloy/input_se_atten_v2.json")).unwrap(),
    )
    .unwrap();
    input["training"]["training_data"]["systems"] = serde_json::json!([system]);
    input["training"]
        .as_object_mut()
        .unwrap()
        .remove("validation_data");
    std::fs::write(tmp.path().join("input.json"), input.to_string()).unwrap();
    for flag in ["-t", "--init-model"] {
        let (code, err) = dpw(&[
            "train",
            "input.json",
            flag,
            "atom_ener.yaml",
            "--backend",
            "cpu",
        ]);
        assert_eq!(code, Some(1), "{flag}: {err}");
        assert!(
            err.contains(
                "atom_ener.yaml: model.fitting.atom_ener is [1, 2, 3]: dpw evaluates \
                          such a model, but cannot train from it"
            ),
            "{flag}: {err}"
        );
    }
}

/// DeePMD-kit 3.2.0 itself reads the `.yaml` dpw writes for each case and predicts what it
/// predicts from its own file (energy, forces, virial on the eval frames). Needs a Python with
/// deepmd-kit: `DPW_DEEPMD_PYTHON=/path/to/python`. Without it the test is a visible skip, or a
/// failure when `DPW_REQUIRE_DEEPMD=1` (the convention of `DPW_REQUIRE_WGPU`).
#[test]
fn deepmd_kit_reads_dpws_dpa1_yaml() {
    let tmp = tempfile::tempdir().unwrap();
    for case in CASES {
        let ours = tmp.path().join(format!("{case}.yaml"));
        dpw::model::write_deepmd_yaml(&model(case), &ours).unwrap();
    }
    let script = r#"
import sys, numpy as np
from deepmd.infer import DeepPot
root, tmp = sys.argv[1:3]
for case in sys.argv[3:]:
    z = np.load(f"{root}/{case}/eval.npz")
    nf = z["coord"].shape[0]
    out = []
    for path in (f"{root}/{case}/model.yaml", f"{tmp}/{case}.yaml"):
        e, f, v = DeepPot(path).eval(z["coord"].reshape(nf, -1), z["box"].reshape(nf, 9),
                                     z["atype"].tolist())[:3]
        out.append(np.concatenate([e.ravel(), f.ravel(), v.ravel()]))
    # DeePMD-kit's numpy backend gives NaN forces and virials for se_atten_l0_water from its
    # own file too: the same NaNs count as agreeing, the energies must be finite.
    assert np.isfinite(out[0][:nf]).all()
    same_nan = bool((np.isnan(out[0]) == np.isnan(out[1])).all())
    print(case, float(np.nanmax(np.abs(out[0] - out[1]))) if same_nan else "nan-mismatch")
"#;
    deepmd_agrees(
        "deepmd_kit_reads_dpws_dpa1_yaml",
        script,
        &repo("tests/reference/dpa1"),
        tmp.path(),
        &CASES,
    );
}

/// A dpw model file (and so a checkpoint) keeps DPA-1's attention keys and one sel; the other
/// descriptors' specs are written without the key, as before.
#[test]
fn model_files_keep_the_attention_keys() {
    let tmp = tempfile::tempdir().unwrap();
    for case in CASES {
        let m = model(case);
        let path = tmp.path().join(format!("{case}.dpw"));
        dpw::model::file::save_model(&path, &m).unwrap();
        let back = dpw::model::read_model(&path).unwrap();
        assert_eq!(back.spec, m.spec, "{case}");
        assert_eq!(back.params, m.params, "{case}");
        let json = serde_json::to_value(&m.spec.descriptor).unwrap();
        assert!(json.get("attention").is_some() && json["sel"].as_array().unwrap().len() == 1);
    }
    let json = serde_json::to_value(&common::model_a().spec.descriptor).unwrap();
    assert!(json.get("attention").is_none() && json.get("kind").is_none());
}

/// A DPA-1 part inside a hybrid (its one mixed list beside per-type sections) is refused by
/// the spec check, whatever the source (input.json refuses it already).
#[test]
fn dpa1_inside_hybrid_is_refused() {
    let mut spec = common::model_a().spec;
    let atten = model("se_atten_l0_water").spec.descriptor;
    let mut first = spec.descriptor.clone();
    first.sel = vec![46, 92];
    spec.descriptor = dpw::model::DescriptorSpec::hybrid(vec![first, atten]);
    let e = format!("{:#}", spec.check().unwrap_err());
    assert!(e.contains("list[1].type: se_atten inside hybrid"), "{e}");
}

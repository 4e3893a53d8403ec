//! DPA-2 around its blocks: the parameter layout against DeePMD-kit 3.2.0's tensors
//! (tests/reference/dpa2/), the descriptor read from and written back to DeePMD-kit's `.yaml`,
//! its three blocks' statistics, input.json's keys (the reference inputs, DeePMD-kit's own
//! examples) and the clear errors for bad ones. Its energies, forces and training gradients are
//! the backend suites'.
mod common;

use std::path::{Path, PathBuf};

use dpw::config::{Config, Sel};
use dpw::model::{read_deepmd_yaml, DescriptorSpec, Model};
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use common::{assert_layout_is_train_steps, repo};

/// Every DPA-2 case of tests/reference/dpa2 (`se_e3_tebd_water` is another descriptor).
const CASES: [&str; 10] = [
    "water_small",
    "water_attn",
    "water_h2",
    "water_direct_dist",
    "water_concat_tebd",
    "water_three_body",
    "water_strip",
    "alloy",
    "water_nopbc",
    "alloy_small_cell",
];

fn case_dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/dpa2/{case}"))
}

fn model(case: &str) -> Model {
    read_deepmd_yaml(&case_dir(case).join("model.yaml")).unwrap_or_else(|e| panic!("{case}: {e:#}"))
}

fn yaml_file(path: &Path) -> Yaml {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every tensor of the layout is a `grad.*` array of DeePMD-kit's train step, by name and shape,
/// and the other way round, and the tensors tile the parameter vector.
#[test]
fn layout_names_and_shapes_are_deepmds() {
    for case in CASES {
        let n = assert_layout_is_train_steps(
            &model(case),
            &case_dir(case).join("train_step.npz"),
            case,
        );
        assert!(n > 10, "{case}: {n} tensors");
    }
}

/// The `.yaml` dpw writes of each of DeePMD-kit's DPA-2 models reads back the same model, its
/// descriptor section is DeePMD-kit's, every key and value (the three blocks' davg/dstd per
/// slot of their own lists), and its `model_def_script` descriptor is DeePMD-kit's less the
/// seed.
#[test]
fn yaml_round_trips_in_deepmd_form() {
    for case in CASES {
        let m = model(case);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m.yaml");
        dpw::model::write_deepmd_yaml(&m, &out).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert!(
            read_deepmd_yaml(&out).unwrap() == m,
            "{case}: the model read back differs"
        );
        let (orig, ours) = (
            yaml_file(&case_dir(case).join("model.yaml")),
            yaml_file(&out),
        );
        same_tree(
            &orig["model"]["descriptor"],
            &ours["model"]["descriptor"],
            &format!("{case}: model.descriptor"),
        );
        let mut def = orig["model_def_script"]["descriptor"].clone();
        def.as_mapping_mut().unwrap().remove("seed");
        same_tree(
            &def,
            &ours["model_def_script"]["descriptor"],
            &format!("{case}: model_def_script.descriptor"),
        );
    }
}

/// Fails naming the first path where `ours` differs from `theirs`.
fn same_tree(theirs: &Yaml, ours: &Yaml, path: &str) {
    match (theirs, ours) {
        (Yaml::Mapping(a), Yaml::Mapping(b)) => {
            let keys = |m: &serde_yaml_ng::Mapping| -> Vec<String> {
                m.keys().map(|k| k.as_str().unwrap().to_string()).collect()
            };
            let (mut ka, mut kb) = (keys(a), keys(b));
            ka.sort();
            kb.sort();
            assert_eq!(ka, kb, "{path}: keys differ");
            for k in ka {
                same_tree(&a[k.as_str()], &b[k.as_str()], &format!("{path}.{k}"));
            }
        }
        (Yaml::Sequence(a), Yaml::Sequence(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                same_tree(x, y, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(theirs, ours, "{path}"),
    }
}

/// dpw's davg/dstd are one row per type of each block, repinit, repformer and three-body in
/// that order: slot 0 of each block's `[nt][nsel][4]` in the file.
#[test]
fn statistics_keep_each_blocks_rows_in_order() {
    for (case, blocks) in [
        ("alloy", &["repinit_variable", "repformers_variable"][..]),
        (
            "water_three_body",
            &[
                "repinit_variable",
                "repformers_variable",
                "repinit_three_body_variable",
            ][..],
        ),
    ] {
        let m = model(case);
        let file = yaml_file(&case_dir(case).join("model.yaml"));
        let nt = m.spec.ntypes();
        let mut want = [vec![], vec![]];
        for block in blocks {
            let vars = &file["model"]["descriptor"][*block]["@variables"];
            for (k, name) in ["davg", "dstd"].iter().enumerate() {
                for t in 0..nt {
                    let row = &vars[*name]["value"][t][0];
                    want[k].extend((0..4).map(|c| row[c].as_f64().unwrap()));
                }
            }
        }
        assert_eq!(m.spec.descriptor.stat_blocks(), blocks.len(), "{case}");
        assert_eq!(m.davg, want[0], "{case}");
        assert_eq!(m.dstd, want[1], "{case}");
        // DeePMD-kit's statistics, not the default std 1, so that a mix-up of blocks shows.
        assert!(m.dstd.iter().all(|&s| s > 0.0 && s != 1.0), "{case}");
    }
    // alloy's set_davg_zero false gives its davg DeePMD-kit's means too.
    assert!(model("alloy").davg.iter().any(|&a| a != 0.0));
}

/// A training input around `model` (a reference's `model` section), loaded from a fresh folder.
fn config_with(model: serde_json::Value) -> Result<Config, String> {
    let mut input = common::tiny_water_input(json!([common::water().join("data_0")]), 1);
    input["model"] = model;
    let dir = tempfile::tempdir().unwrap();
    Config::from_value(&input, dir.path()).map_err(|e| e.to_string())
}

fn spec_of(c: &Config) -> DescriptorSpec {
    let d = &c.model.descriptor;
    let Sel::Fixed(sel) = d.sel.clone() else {
        panic!("DPA-2's nsel is a number")
    };
    dpw::train::setup::descriptor_spec(d, sel)
}

/// Each case's input.json (every key spelled out) gives the spec DeePMD-kit's own file of the
/// model gives, and out.json's form of it loads back to the same config.
#[test]
fn input_json_gives_the_files_spec() {
    for case in CASES {
        let input = common::json_file(&case_dir(case).join("input.json"));
        let c = config_with(input["model"].clone()).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(spec_of(&c), model(case).spec.descriptor, "{case}");
        let expanded = c.to_expanded_json();
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            Config::from_value(&expanded, dir.path()).unwrap(),
            c,
            "{case}"
        );
        let errors = dpw::config::deepmd_input_errors(&expanded);
        assert!(errors.is_empty(), "{case}: {errors:#?}");
    }
}

/// water_small's input with `edit` applied to its descriptor.
fn edited(edit: &dyn Fn(&mut serde_json::Value)) -> Result<Config, String> {
    let mut input = common::json_file(&case_dir("water_small").join("input.json"));
    edit(&mut input["model"]["descriptor"]);
    config_with(input["model"].clone())
}

/// Bad inputs are refused naming the key (and argcheck's defaults and aliases are taken).
#[test]
fn bad_inputs_are_refused_naming_the_key() {
    let refused = |edit: &dyn Fn(&mut serde_json::Value), words: &[&str]| {
        let e = edited(edit).unwrap_err();
        for w in words {
            assert!(e.contains(w), "{words:?}: {e}");
        }
    };
    refused(
        &|d| d["repformer"]["g3_dim"] = 3.into(),
        &["model.descriptor.repformer.g3_dim"],
    );
    refused(
        &|d| d["repformer"]["update_style"] = "x".into(),
        &["model.descriptor.repformer.update_style", "\"x\""],
    );
    refused(
        &|d| d["repinit"]["nsel"] = 10.into(),
        &[
            "model.descriptor",
            "repinit nsel 10 must exceed the repformer's 16",
        ],
    );
    refused(
        &|d| d["use_econf_tebd"] = true.into(),
        &["model.descriptor.use_econf_tebd"],
    );
    refused(
        &|d| d["repformer"]["update_residual_init"] = "zero".into(),
        &["model.descriptor.repformer.update_residual_init"],
    );
    refused(
        &|d| d["repinit"]["activation_function"] = "gelu".into(),
        &["model.descriptor.repinit.activation_function"],
    );
    refused(
        &|d| d["precision"] = "float16".into(),
        &["model.descriptor.precision"],
    );
    refused(
        &|d| d["exclude_types"] = json!([[0, 2]]),
        &["model.descriptor.exclude_types[0]"],
    );

    // argcheck's defaults for what is left out, and its alias of add_tebd_to_repinit_out.
    let c = edited(&|d| {
        let o = d.as_object_mut().unwrap();
        o.remove("add_tebd_to_repinit_out");
        o.remove("concat_output_tebd");
        o.insert("repformer_add_type_ebd_to_seq".into(), true.into());
        let r = d["repformer"].as_object_mut().unwrap();
        for key in ["nlayers", "ln_eps", "update_style", "attn2_hidden"] {
            r.remove(key);
        }
    })
    .unwrap();
    let c = c.model.descriptor.dpa2.unwrap();
    assert!(c.add_tebd_to_repinit_out && c.concat_output_tebd);
    let r = &c.repformer;
    assert_eq!((r.nlayers, r.ln_eps, r.attn2_hidden), (3, 1e-5, 16));
    assert_eq!(r.update_style.as_str(), "res_avg");
}

/// The `.yaml` reader refuses what dpw does not build and keys DeePMD-kit refuses, naming
/// them, and reads a version-2 file as DeePMD-kit does (use_sqrt_nnei, g1_out_conv, g1_out_mlp
/// false).
#[test]
fn yaml_refusals_and_old_versions() {
    let read_edited = |case: &str, edit: &dyn Fn(&mut Yaml)| {
        let mut tree = yaml_file(&case_dir(case).join("model.yaml"));
        edit(&mut tree["model"]["descriptor"]);
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.yaml");
        std::fs::write(&path, serde_yaml_ng::to_string(&tree).unwrap()).unwrap();
        read_deepmd_yaml(&path).map_err(|e| format!("{e:#}"))
    };
    let refused = |case: &str, edit: &dyn Fn(&mut Yaml), words: &[&str]| {
        let e = read_edited(case, edit).unwrap_err();
        for w in words {
            assert!(e.contains(w), "{words:?}: {e}");
        }
    };
    refused(
        "water_small",
        &|d| d["use_econf_tebd"] = true.into(),
        &["model.descriptor.use_econf_tebd"],
    );
    refused(
        "water_small",
        &|d| d["repformer_args"]["g3_dim"] = 3.into(),
        &["model.descriptor.repformer_args", "g3_dim"],
    );
    refused(
        "water_small",
        &|d| d["@version"] = 5.into(),
        &["model.descriptor.@version"],
    );
    refused(
        "water_small",
        &|d| d["repformer_args"]["nsel"] = 40.into(),
        &[
            "model.descriptor",
            "repinit nsel 40 must exceed the repformer's 40",
        ],
    );
    // Version 2: the self-MLP and conv are inputs of linear1, which water_attn's is too narrow
    // for.
    refused(
        "water_attn",
        &|d| d["@version"] = 2.into(),
        &["repformer_layers[0].linear1", "expected shape [39, 6]"],
    );
    // water_direct_dist has the three off anyway: version 2 reads the same model.
    let v2 = read_edited("water_direct_dist", &|d| d["@version"] = 2.into()).unwrap();
    assert!(v2 == model("water_direct_dist"));
}

/// DeePMD-kit's own DPA-2 examples (copies in tests/data/deepmd-kit/examples/water/dpa2, from
/// deepmd-kit commit bc902daf747d93c5d7314338d287fd2dd0a7e32c; tests/data/README.md) load (their
/// nsel are numbers), and their out.json is an input DeePMD-kit's schema takes.
#[test]
fn deepmd_kits_dpa2_examples_load() {
    let dir = repo("tests/data/deepmd-kit/examples/water/dpa2");
    for (name, nlayers, g2_attn, strip) in [
        ("small", 3, false, false),
        ("medium", 6, true, false),
        ("large", 12, true, false),
        ("compressible", 3, false, true),
    ] {
        let path = dir.join(format!("input_torch_{name}.json"));
        let input = common::json_file(&path);
        let c = config_with(input["model"].clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let spec = spec_of(&c);
        let d = spec.dpa2.as_ref().unwrap();
        assert_eq!(
            (spec.rcut, spec.sel.as_slice(), spec.neuron.as_slice()),
            (6.0, &[120][..], &[25, 50, 100][..]),
            "{name}"
        );
        assert_eq!(spec.axis_neuron, 12, "{name}");
        let (i, r) = (&d.repinit, &d.repformer);
        assert!(i.use_three_body && i.three_body_sel == 48, "{name}");
        assert_eq!(
            (r.rcut, r.nsel, r.nlayers, r.g1_dim),
            (4.0, 48, nlayers, 128)
        );
        assert_eq!(r.update_g2_has_attn, g2_attn, "{name}");
        assert_eq!(i.tebd_input_mode == dpw::model::TebdInputMode::Strip, strip);
        // argcheck's defaults for the keys the examples leave out.
        assert!(
            d.concat_output_tebd && d.smooth && !d.use_tebd_bias,
            "{name}"
        );
        assert_eq!(spec.stat_blocks(), 3);
        let errors = dpw::config::deepmd_input_errors(&c.to_expanded_json());
        assert!(errors.is_empty(), "{name}: {errors:#?}");
    }
}

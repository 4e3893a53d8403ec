//! DPA-2 and se_e3_tebd (its three-body block alone) around their blocks: the parameter layout
//! against DeePMD-kit 3.2.0's tensors (tests/reference/dpa2/), the descriptor read from and
//! written back to DeePMD-kit's `.yaml`, the blocks' statistics, input.json's keys (the
//! reference inputs, DeePMD-kit's own examples) and the clear errors for bad ones. Their
//! energies, forces and training gradients are the backend suites'.
mod common;

use std::path::{Path, PathBuf};

use dpw::backend::cpu::Cpu;
use dpw::config::{Config, Sel};
use dpw::geometry::{Cell, EnvStats};
use dpw::model::{read_deepmd_yaml, DescriptorSpec, Model, OwnKeys, TebdInputMode};
use dpw::train::predict::predict;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use common::{assert_layout_is_train_steps, eval_frames, repo};

/// tests/reference/dpa2's se_e3_tebd case: DeePMD-kit's `DescrptSeTTebd`.
const SE_E3_TEBD: &str = "se_e3_tebd_water";

/// Every DPA-2 case of tests/reference/dpa2.
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

/// Every case of tests/reference/dpa2: the DPA-2 ones and se_e3_tebd's.
fn all_cases() -> impl Iterator<Item = &'static str> {
    CASES.into_iter().chain([SE_E3_TEBD])
}

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
    for case in all_cases() {
        let n = assert_layout_is_train_steps(
            &model(case),
            &case_dir(case).join("train_step.npz"),
            case,
        );
        assert!(n > 10, "{case}: {n} tensors");
    }
}

/// The `.yaml` dpw writes of each of DeePMD-kit's DPA-2 and se_e3_tebd models reads back the
/// same model, its descriptor section is DeePMD-kit's, every key and value (the blocks'
/// davg/dstd per slot of their own lists), and its `model_def_script` descriptor is
/// DeePMD-kit's less the seed.
#[test]
fn yaml_round_trips_in_deepmd_form() {
    for case in all_cases() {
        let m = model(case);
        let tmp = tempfile::tempdir().unwrap();
        let out = write_and_read_back(&m, tmp.path(), case);
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

/// `m` written as a `.yaml` in `dir`, which reads back the same model; the file's path.
fn write_and_read_back(m: &Model, dir: &Path, case: &str) -> PathBuf {
    let out = dir.join("m.yaml");
    dpw::model::write_deepmd_yaml(m, &out).unwrap_or_else(|e| panic!("{case}: {e:#}"));
    assert!(
        read_deepmd_yaml(&out).unwrap() == *m,
        "{case}: the model read back differs"
    );
    out
}

/// A case's model.yaml with `edit` applied to its descriptor, as read.
fn read_edited(case: &str, edit: &dyn Fn(&mut Yaml)) -> Result<Model, String> {
    let mut tree = yaml_file(&case_dir(case).join("model.yaml"));
    edit(&mut tree["model"]["descriptor"]);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&tree).unwrap()).unwrap();
    read_deepmd_yaml(&path).map_err(|e| format!("{e:#}"))
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
        panic!("the references' sel are numbers")
    };
    dpw::train::setup::descriptor_spec(d, sel)
}

/// Each case's input.json (every key spelled out) gives the spec DeePMD-kit's own file of the
/// model gives, and out.json's form of it loads back to the same config.
#[test]
fn input_json_gives_the_files_spec() {
    for case in all_cases() {
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

/// A case's input with `edit` applied to its descriptor.
fn edited(case: &str, edit: &dyn Fn(&mut serde_json::Value)) -> Result<Config, String> {
    let mut input = common::json_file(&case_dir(case).join("input.json"));
    edit(&mut input["model"]["descriptor"]);
    config_with(input["model"].clone())
}

/// A message that says every one of `words`.
fn says_all(e: &str, words: &[&str]) {
    for w in words {
        assert!(e.contains(w), "{words:?}: {e}");
    }
}

/// Bad inputs are refused naming the key (and argcheck's defaults and aliases are taken).
#[test]
fn bad_inputs_are_refused_naming_the_key() {
    let refused = |edit: &dyn Fn(&mut serde_json::Value), words: &[&str]| {
        says_all(&edited("water_small", edit).unwrap_err(), words)
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
    let c = edited("water_small", &|d| {
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
    let c = c.model.descriptor.own.dpa2().cloned().unwrap();
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
    let refused = |case: &str, edit: &dyn Fn(&mut Yaml), words: &[&str]| {
        says_all(&read_edited(case, edit).unwrap_err(), words)
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
        let d = spec.own.dpa2().unwrap();
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

/// se_e3_tebd's davg/dstd on the eval frames are DeePMD-kit's `compute_input_stats` (eval.json's
/// `davg_dstd`, the same as model.yaml's dstd): one row per centre type over its mixed list,
/// with set_davg_zero true (the case's) and false.
#[test]
fn se_e3_tebd_statistics_are_deepmds() {
    let m = model(SE_E3_TEBD);
    let mut d = m.spec.descriptor.clone();
    let fr = eval_frames(&case_dir(SE_E3_TEBD));
    let want =
        &common::json_file(&case_dir(SE_E3_TEBD).join("eval.json"))["davg_dstd"]["se_e3_tebd"];
    let stats = |d: &DescriptorSpec| {
        let mut env = EnvStats::new(m.spec.ntypes());
        for (coord, cell) in fr.coord.iter().zip(&fr.cell) {
            env.add_frame(d, coord, Cell::new(cell).as_ref(), &fr.atype);
        }
        env.davg_dstd(d.set_davg_zero)
    };
    let close = |a: f64, b: f64, what: &str| {
        assert!(
            (a - b).abs() <= 1e-14 * b.abs().max(1.0),
            "{what}: {a} vs {b}"
        );
    };
    let (davg, dstd) = stats(&d);
    assert_eq!((davg.len(), dstd.len()), (8, 8));
    assert!(davg.iter().all(|&a| a == 0.0));
    for (k, (&a, &b)) in dstd.iter().zip(&m.dstd).enumerate() {
        close(a, b, &format!("dstd[{k}] vs model.yaml's"));
    }
    for t in 0..2 {
        let sd = common::json_numbers(&want["dstd_radial_angular_per_type_used"][t]);
        close(dstd[4 * t], sd[0], "σ_r");
        (1..4).for_each(|q| close(dstd[4 * t + q], sd[1], "σ_a"));
    }
    d.set_davg_zero = false;
    let (davg, _) = stats(&d);
    let mu = common::json_numbers(&want["deepmd_davg_radial_per_type_if_set_davg_zero_false"]);
    for t in 0..2 {
        close(davg[4 * t], mu[t], "μ_r");
        assert_eq!(&davg[4 * t + 1..4 * t + 4], &[0.0; 3]);
    }
}

/// se_e3_tebd: bad inputs are refused naming the key; argcheck's defaults are taken for what is
/// left out (not the class's: neuron [10, 20, 40], use_tebd_bias true), and a list sel is
/// summed into one mixed-type list.
#[test]
fn se_e3_tebd_inputs_take_argchecks_keys() {
    let refused = |edit: &dyn Fn(&mut serde_json::Value), words: &[&str]| {
        says_all(&edited(SE_E3_TEBD, edit).unwrap_err(), words)
    };
    refused(
        &|d| d["axis_neuron"] = 4.into(),
        &["model.descriptor.axis_neuron"],
    );
    refused(
        &|d| d["tebd_input_mode"] = "x".into(),
        &["model.descriptor.tebd_input_mode", "\"x\""],
    );
    refused(
        &|d| d["use_econf_tebd"] = true.into(),
        &["model.descriptor.use_econf_tebd"],
    );
    refused(
        &|d| d["activation_function"] = "gelu".into(),
        &["model.descriptor.activation_function"],
    );
    refused(
        &|d| d["exclude_types"] = json!([[0, 2]]),
        &["model.descriptor.exclude_types[0]"],
    );
    refused(
        &|d| d["rcut_smth"] = 3.5.into(),
        &["model.descriptor.rcut_smth"],
    );
    refused(&|d| d["sel"] = json!([]), &["model.descriptor.sel"]);
    refused(
        &|d| d["tebd_dim"] = 0.into(),
        &["model.descriptor.tebd_dim"],
    );
    refused(
        &|d| *d = json!({"type": "hybrid", "list": [d.clone()]}),
        &[
            "model.descriptor.list[0].type",
            "se_e3_tebd inside hybrid is not supported",
        ],
    );

    let c = edited(SE_E3_TEBD, &|d| {
        *d = json!({"type": "se_e3_tebd", "sel": [10, 14]})
    })
    .unwrap();
    let spec = spec_of(&c);
    let t = spec.own.se_e3_tebd().unwrap();
    assert_eq!(spec.sel, [24]);
    assert_eq!((spec.rcut, spec.rcut_smth), (6.0, 0.5));
    assert_eq!(spec.neuron, [10, 20, 40]);
    assert!(!spec.resnet_dt && spec.set_davg_zero && spec.env_protection == 0.0);
    assert_eq!((t.tebd_dim, t.tebd_input_mode), (8, TebdInputMode::Concat));
    assert!(t.use_tebd_bias && t.concat_output_tebd && t.smooth && t.trainable);
    assert!(t.exclude_types.is_empty());
    assert_eq!(spec.dim(), 40 + 8);
    let c = edited(SE_E3_TEBD, &|d| d["sel"] = "auto:1.5".into()).unwrap();
    assert_eq!(c.model.descriptor.sel, Sel::Auto(1.5));
}

/// se_e3_tebd_water's model in strip mode with H–H pairs excluded and no type-embedding bias,
/// freshly drawn, with the case's statistics: what DeePMD-kit's reference (concat) does not
/// reach.
fn se_e3_tebd_strip() -> Model {
    let theirs = model(SE_E3_TEBD);
    let mut spec = theirs.spec.clone();
    let OwnKeys::SeE3Tebd(t) = &mut spec.descriptor.own else {
        unreachable!("an se_e3_tebd model")
    };
    t.tebd_input_mode = TebdInputMode::Strip;
    t.exclude_types = vec![[1, 1]];
    t.use_tebd_bias = false;
    Model {
        dstd: theirs.dstd,
        ..Model::new(spec, 5)
    }
}

/// se_e3_tebd in strip mode ([`se_e3_tebd_strip`]): its `.yaml` has `embeddings_strip`, the
/// pair and the bias-free type embedding, and reads back the same model; the reader refuses
/// what DeePMD-kit's does not build or dpw lacks, naming the key.
#[test]
fn se_e3_tebd_yaml_strip_and_refusals() {
    let m = se_e3_tebd_strip();
    let names: Vec<String> = m.layout().tensors.iter().map(|t| t.name.clone()).collect();
    assert!(names.contains(&"embed_strip.layer2.w".to_string()));
    assert!(!names.contains(&"tebd.layer0.b".to_string()));
    let tmp = tempfile::tempdir().unwrap();
    let path = write_and_read_back(&m, tmp.path(), "strip");
    let tree = yaml_file(&path);
    let d = &tree["model"]["descriptor"];
    assert_eq!(d["embeddings_strip"]["networks"][0]["in_dim"], 10);
    assert_eq!(d["embeddings"]["networks"][0]["in_dim"], 1);
    assert_eq!(
        d["exclude_types"],
        serde_yaml_ng::to_value([[1, 1]]).unwrap()
    );
    assert_eq!(d["type_embedding"]["use_tebd_bias"], false);

    let refused = |edit: &dyn Fn(&mut Yaml), words: &[&str]| {
        says_all(&read_edited(SE_E3_TEBD, edit).unwrap_err(), words)
    };
    refused(
        &|d| d["use_econf_tebd"] = true.into(),
        &["model.descriptor.use_econf_tebd"],
    );
    refused(
        &|d| d["axis_neuron"] = 4.into(),
        &["model.descriptor", "axis_neuron"],
    );
    refused(
        &|d| d["compress"] = serde_yaml_ng::from_str("'@variables': {}").unwrap(),
        &["model.descriptor.compress"],
    );
    refused(&|d| d["ntypes"] = 3.into(), &["model.descriptor.ntypes"]);
    refused(
        &|d| d["type_embedding"]["use_tebd_bias"] = false.into(),
        &["model.descriptor.type_embedding", "expected null"],
    );
    refused(
        &|d| d["tebd_input_mode"] = "strip".into(),
        &["model.descriptor.embeddings", "expected shape [1, 2]"],
    );
}

/// DeePMD-kit's own se_e3_tebd example (a copy in
/// tests/data/deepmd-kit/examples/water/se_e3_tebd, from deepmd-kit commit
/// bc902daf747d93c5d7314338d287fd2dd0a7e32c) loads with argcheck's defaults for what it leaves
/// out, and its out.json is an input DeePMD-kit's schema takes.
#[test]
fn deepmd_kits_se_e3_tebd_example_loads() {
    let path = repo("tests/data/deepmd-kit/examples/water/se_e3_tebd/input_torch.json");
    let c = config_with(common::json_file(&path)["model"].clone()).unwrap();
    let spec = spec_of(&c);
    let t = spec.own.se_e3_tebd().unwrap();
    assert_eq!(
        (spec.rcut, spec.rcut_smth, spec.sel.as_slice()),
        (4.0, 0.5, &[40][..])
    );
    assert_eq!(spec.neuron, [2, 4, 8]);
    assert_eq!((t.tebd_dim, t.tebd_input_mode), (8, TebdInputMode::Concat));
    assert!(t.use_tebd_bias && t.concat_output_tebd && t.smooth);
    assert_eq!(spec.dim(), 16);
    let errors = dpw::config::deepmd_input_errors(&c.to_expanded_json());
    assert!(errors.is_empty(), "{errors:#?}");
}

/// DeePMD-kit 3.2.0 reads the `.yaml` dpw writes of its se_e3_tebd in strip mode with an
/// excluded pair ([`se_e3_tebd_strip`]) and predicts what dpw predicts (energy, forces, virial
/// on the case's eval frames): the strip type net and the exclusion against DeePMD-kit itself.
/// Needs a Python with deepmd-kit, as tests/dpa1.rs's `deepmd_kit_reads_dpws_dpa1_yaml`.
#[test]
fn deepmd_kit_predicts_dpws_se_e3_tebd_strip_as_dpw() {
    let m = se_e3_tebd_strip();
    let fr = eval_frames(&case_dir(SE_E3_TEBD));
    let no_force = vec![0.0; 3 * fr.atype.len()];
    let frames = fr.unlabelled(&no_force);
    let p = predict::<f64, _>(&Cpu::default(), &m, &fr.atype, &frames).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    dpw::model::write_deepmd_yaml(&m, &tmp.path().join(format!("{SE_E3_TEBD}.yaml"))).unwrap();
    let ours = [p.energy, p.force, p.virial].concat();
    let ours = serde_json::to_string(&ours).unwrap();
    std::fs::write(tmp.path().join(format!("{SE_E3_TEBD}.json")), ours).unwrap();
    // DeePMD-kit's PyTorch backend, on the `.pth` `dp convert-backend` makes of dpw's file (its
    // numpy backend gives NaN forces for se_e3_tebd, from DeePMD-kit's own file too).
    let script = r#"
import json, sys, numpy as np
from deepmd.entrypoints.convert_backend import convert_backend
from deepmd.infer import DeepPot
root, tmp, case = sys.argv[1:4]
convert_backend(INPUT=f"{tmp}/{case}.yaml", OUTPUT=f"{tmp}/{case}.pth")
z = np.load(f"{root}/{case}/eval.npz")
nf = z["coord"].shape[0]
e, f, v = DeepPot(f"{tmp}/{case}.pth").eval(z["coord"].reshape(nf, -1),
                                            z["box"].reshape(nf, 9), z["atype"].tolist())[:3]
theirs = np.concatenate([e.ravel(), f.ravel(), v.ravel()])
ours = np.array(json.load(open(f"{tmp}/{case}.json")))
assert np.abs(f).max() > 1e-3, "a model whose atoms feel their neighbours"
print(f"max |F| {np.abs(f).max():.1e}", file=sys.stderr)
print(case, float(np.abs(theirs - ours).max()))
"#;
    common::deepmd_agrees(
        "deepmd_kit_predicts_dpws_se_e3_tebd_strip_as_dpw",
        script,
        &repo("tests/reference/dpa2"),
        tmp.path(),
        &[SE_E3_TEBD],
    );
}

//! DPA-3 around its block: the parameter layout against DeePMD-kit 3.2.0's tensors
//! (tests/reference/dpa3/), the descriptor's keys read from DeePMD-kit's `.yaml`, and the clear
//! errors for what dpw does not build. Its energies, forces, virials and training gradient
//! against DeePMD-kit's are the backend suites' (`reference_dpa3_predictions`,
//! `reference_dpa3_training_gradients`).
mod common;

use std::path::PathBuf;

use dpw::model::{read_deepmd_yaml, Model};

use common::{assert_layout_is_train_steps, repo};

const CASES: [&str; 14] = [
    "water",
    "water_nopbc",
    "alloy",
    "alloy_small_cell",
    "water_no_angle",
    "alloy_dynamic_sel",
    "water_res_avg",
    "water_res_incr",
    "water_a_compress",
    "water_a_compress_split",
    "water_edge_dist_exp_sw",
    "water_concat_tebd",
    "water_fit_silut",
    "water_sequential",
];

fn case_dir(case: &str) -> PathBuf {
    repo(&format!("tests/reference/dpa3/{case}"))
}

fn model(case: &str) -> anyhow::Result<Model> {
    read_deepmd_yaml(&case_dir(case).join("model.yaml"))
}

/// Every tensor of the layout is a `grad.*` array of DeePMD-kit's train step, by name and shape,
/// and the other way round, and the tensors tile the parameter vector.
#[test]
fn layout_names_and_shapes_are_deepmds() {
    for case in CASES {
        let m = model(case).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert_layout_is_train_steps(&m, &case_dir(case).join("train_step.npz"), case);
    }
}

/// The keys as DeePMD-kit wrote them: the geometry in the shared keys, the block's own in
/// `dpa3`, D's width N (2N with concat_output_tebd), one fitting net.
#[test]
fn keys_from_deepmds_yaml() {
    let m = model("water").unwrap();
    let d = &m.spec.descriptor;
    let c = d.own.dpa3().unwrap();
    assert_eq!(
        (d.rcut, d.rcut_smth, d.sel.as_slice()),
        (3.5, 2.0, &[24][..])
    );
    assert_eq!((c.a_rcut, c.a_rcut_smth, c.a_sel), (3.0, 2.0, 14));
    assert_eq!(
        (d.m1(), c.e_dim, c.a_dim, c.nlayers, c.axis_neuron),
        (6, 5, 4, 3, 2)
    );
    assert_eq!(m.spec.dim_descrpt(), 6);
    assert_eq!(m.layout().fitting.nets.len(), 1);
    assert_eq!(model("water_concat_tebd").unwrap().spec.dim_descrpt(), 12);
    let dyn_sel = model("alloy_dynamic_sel").unwrap();
    let c = dyn_sel.spec.descriptor.own.dpa3().unwrap();
    assert!(c.use_dynamic_sel && c.sel_reduce_factor == 4.0);
    let ex = model("alloy").unwrap();
    let c = ex.spec.descriptor.own.dpa3().unwrap();
    assert_eq!(c.exclude_types, vec![[0, 1], [2, 2]]);
    assert!(c.excludes(1, 0) && c.excludes(2, 2) && !c.excludes(0, 2));
}

fn parse(path: &std::path::Path) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The `.yaml` dpw writes of each of DeePMD-kit's DPA-3 models reads back the same model, and
/// its descriptor section is DeePMD-kit's, every key and value (davg/dstd as DeePMD-kit's rows
/// per slot, the block's env_mat as DeePMD-kit writes it).
#[test]
fn yaml_round_trips_in_deepmd_form() {
    for case in CASES {
        let path = case_dir(case).join("model.yaml");
        let m = model(case).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m.yaml");
        dpw::model::write_deepmd_yaml(&m, &out).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert!(
            read_deepmd_yaml(&out).unwrap() == m,
            "{case}: the model read back differs"
        );
        let (orig, ours) = (parse(&path), parse(&out));
        let (d0, d1) = (&orig["model"]["descriptor"], &ours["model"]["descriptor"]);
        if d0 != d1 {
            let (a, b) = (d0.as_mapping().unwrap(), d1.as_mapping().unwrap());
            let differ: Vec<_> = (a.iter())
                .filter(|(k, v)| b.get(*k) != Some(*v))
                .map(|(k, _)| k.as_str().unwrap_or("?").to_string())
                .chain(
                    b.keys()
                        .filter(|k| !a.contains_key(*k))
                        .map(|k| format!("+{}", k.as_str().unwrap_or("?"))),
                )
                .collect();
            panic!("{case}: descriptor sections differ at {differ:?}");
        }
        assert_eq!(ours["model_def_script"]["descriptor"]["type"], "dpa3");
    }
}

/// The shipped DPA-3 example with `edit` applied to its descriptor, loaded from a fresh folder.
fn example_with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<dpw::config::Config, String> {
    let text = std::fs::read_to_string(repo("examples/water/input_dpa3.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v["model"]["descriptor"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.json");
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    dpw::config::load_config(&path).map_err(|e| e.to_string())
}

/// input.json's DPA-3 keys: the example loads with its values and argcheck's defaults for the
/// others, DeePMD-kit's aliases are taken, and what dpw lacks or DeePMD-kit forbids is refused
/// naming the key.
#[test]
fn input_keys_load_and_bad_ones_are_named() {
    let c = example_with(|_| {}).unwrap();
    let d = &c.model.descriptor;
    let r = d.own.dpa3().unwrap();
    assert_eq!(
        (d.rcut, d.rcut_smth, d.neuron.as_slice()),
        (6.0, 5.3, &[32][..])
    );
    assert_eq!((r.e_dim, r.a_dim, r.nlayers, r.a_sel), (16, 8, 3, 30));
    assert!(r.use_exp_switch && r.edge_init_use_dist && r.smooth_edge_update);
    // Defaults: argcheck's.
    assert_eq!(
        (
            r.n_multi_edge_message,
            r.a_compress_rate,
            r.sel_reduce_factor
        ),
        (1, 0, 10.0)
    );
    assert!(r.optim_update && r.use_loc_mapping && !r.use_dynamic_sel);
    // DeePMD-kit's aliases of edge_init_use_dist and use_exp_switch.
    let c = example_with(|d| {
        let rf = d["repflow"].as_object_mut().unwrap();
        rf.remove("edge_init_use_dist");
        rf.remove("use_exp_switch");
        rf.insert("edge_use_dist".into(), false.into());
        rf.insert("use_env_envelope".into(), false.into());
    })
    .unwrap();
    let r = c.model.descriptor.own.dpa3().cloned().unwrap();
    assert!(!r.use_exp_switch && !r.edge_init_use_dist);
    let refused = |edit: &dyn Fn(&mut serde_json::Value), key: &str| {
        let e = example_with(edit).unwrap_err();
        assert!(e.contains(key), "{key}: {e}");
    };
    refused(
        &|d| {
            d["repflow"]["sequential_update"] = true.into();
            d["repflow"]["update_style"] = "res_avg".into();
        },
        "sequential_update needs update_style res_residual and update_angle",
    );
    refused(
        &|d| d["repflow"]["update_style"] = "res_x".into(),
        "repflow.update_style",
    );
    refused(
        &|d| d["repflow"]["update_residual_init"] = "zero".into(),
        "update_residual_init",
    );
    refused(
        &|d| d["repflow"]["a_sel"] = 200.into(),
        "a_sel 200 exceeds e_sel",
    );
    refused(
        &|d| d["repflow"]["a_rcut"] = 7.0.into(),
        "a_rcut 7 exceeds e_rcut",
    );
    refused(
        &|d| {
            d["repflow"]["use_dynamic_sel"] = true.into();
            d["repflow"]["smooth_edge_update"] = false.into();
        },
        "use_dynamic_sel needs smooth_edge_update",
    );
    refused(
        &|d| d["activation_function"] = "gelu".into(),
        "activation_function",
    );
    refused(&|d| d["use_econf_tebd"] = true.into(), "use_econf_tebd");
    refused(&|d| d["add_chg_spin_ebd"] = true.into(), "add_chg_spin_ebd");
    refused(&|d| d["repflow"]["e_dmi"] = 3.into(), "e_dmi");
    refused(
        &|d| d["exclude_types"] = serde_json::json!([[0, 1, 1]]),
        "exclude_types[0]",
    );
}

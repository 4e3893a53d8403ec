//! input.json → Config: DeePMD-kit's defaults, aliases, the expanded round trip, and one test
//! per class of error, each checking that the message points at the offending key.
mod common;

use dpw::config::{
    deepmd_input_errors, load_config, AutoProb, BatchSizeSpec, Config, ConfigError, Precision,
    ProbBlock, ScaleByWorker, Sel,
};
use serde_json::{json, Value};

/// A water input in the style of DeePMD-kit's examples/water/se_e2_a, using the forms that
/// model_A does not: automatic sel, string and list batch sizes, aliases, comments.
fn water() -> Value {
    json!({
        "_comment": "that's all",
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {
                "type": "se_a",
                "sel": "auto:1.1",
                "rcut_smth": 0.50,
                "rcut": 6.00,
                "neuron": [25, 50, 100],
                "resnet_dt": false,
                "n_axis_neuron": 16,
                "type_one_side": true,
                "seed": 1,
                "_comment": " that's all"
            },
            "fitting_net": {"neuron": [240, 240, 240], "resnet_dt": true, "seed": 1},
            "_comment": " that's all"
        },
        "learning_rate": {"type": "exp", "decay_steps": 5000, "start_lr": 0.001, "stop_lr": 3.51e-8},
        "loss": {
            "type": "ener",
            "start_pref_e": 0.02, "limit_pref_e": 1,
            "start_pref_f": 1000, "limit_pref_f": 1,
            "start_pref_v": 0, "limit_pref_v": 0
        },
        "training": {
            "training_data": {
                "systems": ["data/data_0", "data/data_1", "data/data_2"],
                "batch_size": "auto:32",
                "_comment": "that's all"
            },
            "validation_data": {
                "systems": ["data/data_3"],
                "batch_size": [1],
                "numb_btch": 3
            },
            "numb_steps": 1000000,
            "seed": 10,
            "disp_file": "lcurve.out",
            "disp_freq": 100,
            "save_freq": 1000
        }
    })
}

/// Writes `input` as input.json in a fresh directory and loads it.
fn load(input: &Value) -> (tempfile::TempDir, Result<Config, ConfigError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.json");
    std::fs::write(&path, serde_json::to_string_pretty(input).unwrap()).unwrap();
    let result = load_config(&path);
    (dir, result)
}

/// The water input with the value at JSON pointer `ptr` replaced (or added).
fn water_with(ptr: &str, value: Value) -> Value {
    let mut v = water();
    let (parent, key) = ptr.rsplit_once('/').unwrap();
    v.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert(key.to_string(), value);
    v
}

/// The message of a load that must fail.
fn error_of(input: &Value) -> String {
    let (_dir, result) = load(input);
    let err = result.expect_err("input should be rejected");
    err.to_string()
}

/// An input refused as unsupported (not as malformed), the message naming each of `parts`.
fn assert_unsupported(input: &Value, parts: &[&str]) {
    let (_dir, result) = load(input);
    let err = result.expect_err("input should be refused");
    assert!(
        matches!(err.inner(), ConfigError::Unsupported { .. }),
        "{err}"
    );
    assert_mentions(&err.to_string(), parts);
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} should mention {p:?}");
    }
}

#[test]
fn model_a_loads_with_values_and_defaults() {
    let c = load_config(common::model_a_dir().join("input.json")).unwrap();

    let m = &c.model;
    assert_eq!(m.type_map, ["O", "H"]);
    assert_eq!(m.data_stat_nbatch, 10);
    assert_eq!(m.data_stat_protect, 0.01);
    let d = &m.descriptor;
    assert_eq!(d.r#type, "se_e2_a");
    assert_eq!(d.sel, Sel::Fixed(vec![46, 92]));
    assert_eq!((d.rcut, d.rcut_smth), (6.0, 0.5));
    assert_eq!(d.neuron, [8, 16, 32]);
    assert_eq!(d.axis_neuron, 4);
    assert!(!d.resnet_dt && d.type_one_side && d.trainable && !d.set_davg_zero);
    assert_eq!(d.precision, Precision::F64);
    assert_eq!(d.seed, Some(1));
    assert_eq!(d.env_protection, 0.0);
    let f = &m.fitting_net;
    assert_eq!(f.neuron, [32, 32, 32]);
    assert!(f.resnet_dt && f.trainable);
    assert_eq!(f.precision, Precision::F64);
    assert_eq!((f.rcond, f.seed), (None, Some(1)));
    assert!(f.atom_ener.is_empty());

    let lr = &c.learning_rate;
    assert_eq!(lr.start_lr, 1e-3);
    assert_eq!(lr.stop_lr, Some(3.51e-8));
    assert_eq!(lr.final_lr(), 3.51e-8);
    assert_eq!(lr.decay_steps, 5000);
    assert_eq!(lr.decay_rate, None);
    assert!(!lr.smooth);
    assert_eq!(lr.warmup_steps_for(100_000), 0);
    assert_eq!(lr.warmup_start_factor, 0.0);
    assert_eq!(lr.scale_by_worker, ScaleByWorker::Linear);

    let l = c.loss.ener().unwrap();
    assert_eq!((l.start_pref_e, l.limit_pref_e), (0.02, 1.0));
    assert_eq!((l.start_pref_f, l.limit_pref_f), (1000.0, 1.0));
    assert_eq!((l.start_pref_v, l.limit_pref_v), (0.0, 0.0));
    assert!(l.has_e() && l.has_f() && !l.has_v());
    assert_eq!(l.relative_f, None);
    assert!(!l.intensive_ener_virial);

    assert_eq!(
        (c.optimizer.adam_beta1, c.optimizer.adam_beta2),
        (0.9, 0.999)
    );

    let t = &c.training;
    assert_eq!(t.numb_steps, 100_000);
    assert_eq!(t.seed, Some(10));
    assert_eq!(t.disp_file, "lcurve.out");
    assert_eq!((t.disp_freq, t.save_freq), (100, 100_000));
    assert_eq!((t.save_ckpt.as_str(), t.max_ckpt_keep), ("model.ckpt", 5));
    assert!(!t.disp_avg && t.disp_training && t.time_training);
    assert_eq!(t.gradient_max_norm, 0.0);
    assert!(t.validation_data.is_none());
    let td = &t.training_data;
    assert_eq!(td.batch_size, BatchSizeSpec::Fixed(1));
    assert_eq!(td.auto_prob, AutoProb::SysSize);
    assert_eq!(td.sys_probs, None);
    assert_eq!(td.systems[0], "../../../../examples/water/data_0");
    // Resolved against model_A/.
    for (i, p) in td.system_paths.iter().enumerate() {
        let want = common::repo(&format!("examples/water/data_{i}"));
        assert_eq!(p.canonicalize().unwrap(), want.canonicalize().unwrap());
    }
}

#[test]
fn water_input_with_auto_sel_and_string_and_list_batch_sizes() {
    let (dir, result) = load(&water());
    let c = result.unwrap();
    let d = &c.model.descriptor;
    assert_eq!(d.r#type, "se_a");
    assert_eq!(d.sel, Sel::Auto(1.1));
    assert_eq!(
        d.axis_neuron, 16,
        "n_axis_neuron is an alias of axis_neuron"
    );
    assert_eq!(d.neuron, [25, 50, 100]);
    assert!(d.type_one_side);
    assert_eq!(c.model.fitting_net.neuron, [240, 240, 240]);

    let t = &c.training;
    assert_eq!(t.numb_steps, 1_000_000);
    assert_eq!(t.training_data.batch_size, BatchSizeSpec::Auto(32));
    // 192 atoms ⇒ auto:32 gives batch size 1 (the water example's value).
    assert_eq!(t.training_data.batch_size.for_system(0, 192), Some(1));
    assert_eq!(BatchSizeSpec::Auto(32).for_system(0, 5), Some(7));
    assert_eq!(BatchSizeSpec::Max(32).for_system(0, 5), Some(6));
    assert_eq!(BatchSizeSpec::Filter(32).for_system(0, 64), Some(1));
    assert!(!BatchSizeSpec::Filter(32).keeps_system(64));
    assert_eq!(BatchSizeSpec::PerSystem(vec![2]).for_system(1, 5), None);
    assert_eq!(
        t.training_data.system_paths[1],
        dir.path().join("data/data_1")
    );
    let v = t.validation_data.as_ref().unwrap();
    assert_eq!(v.numb_btch, 3);
    assert_eq!(v.data.batch_size, BatchSizeSpec::PerSystem(vec![1]));
    assert_eq!(v.data.system_paths, [dir.path().join("data/data_3")]);
}

#[test]
fn other_accepted_forms() {
    // "auto" alone, a single systems string, max:/filter: batch sizes, block probabilities.
    let mut v = water_with("/model/descriptor/sel", json!("auto"));
    let td = v.pointer_mut("/training/training_data").unwrap();
    *td = json!({"systems": "data", "batch_size": "auto", "auto_prob": "prob_sys_size;0:1:1.0"});
    let (_d, c) = load(&v);
    let c = c.unwrap();
    assert_eq!(c.model.descriptor.sel, Sel::Auto(1.1));
    let td = &c.training.training_data;
    assert_eq!(td.systems, ["data"]);
    assert_eq!(td.batch_size, BatchSizeSpec::Auto(32));
    let block = ProbBlock {
        start: 0,
        end: 1,
        weight: 1.0,
    };
    assert_eq!(td.auto_prob, AutoProb::SysSizeBlocks(vec![block]));

    for (given, want) in [
        (json!("max:100"), BatchSizeSpec::Max(100)),
        (json!("filter:200"), BatchSizeSpec::Filter(200)),
        (json!([1, 2, 3]), BatchSizeSpec::PerSystem(vec![1, 2, 3])),
        (json!(4), BatchSizeSpec::Fixed(4)),
    ] {
        let (_d, c) = load(&water_with("/training/training_data/batch_size", given));
        assert_eq!(c.unwrap().training.training_data.batch_size, want);
    }

    // Sections left out get DeePMD-kit's defaults; stop_lr_ratio replaces stop_lr.
    let mut v = water();
    let root = v.as_object_mut().unwrap();
    root.remove("loss");
    root.insert("learning_rate".into(), json!({"stop_lr_ratio": 1e-3}));
    root.insert(
        "optimizer".into(),
        json!({"type": "Adam", "adam_beta2": 0.99}),
    );
    let (_d, c) = load(&v);
    let c = c.unwrap();
    assert_eq!(c.loss.ener().unwrap().start_pref_f, 1000.0);
    assert_eq!(
        (c.learning_rate.stop_lr, c.learning_rate.stop_lr_ratio),
        (None, Some(1e-3))
    );
    assert_eq!(c.learning_rate.final_lr(), 1e-6);
    assert_eq!(c.optimizer.adam_beta2, 0.99);
    // `1e6` steps written as a float is still an integer.
    let (_d, c) = load(&water_with("/training/numb_steps", json!(1e6)));
    assert_eq!(c.unwrap().training.numb_steps, 1_000_000);
    // Unsupported keys at their DeePMD-kit default value are fine.
    let (_d, c) = load(&water_with("/loss/start_pref_ae", json!(0.0)));
    c.unwrap();
}

#[test]
fn expanded_json_round_trips() {
    let text = std::fs::read_to_string(common::model_a_dir().join("input.json")).unwrap();
    let model_a = serde_json::from_str(&text).unwrap();
    for input in [water(), model_a] {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::from_value(&input, dir.path()).unwrap();
        let expanded = c.to_expanded_json();

        // Every default is present and aliases are normalised.
        let d = &expanded["model"]["descriptor"];
        assert!(d.get("axis_neuron").is_some() && d.get("n_axis_neuron").is_none());
        assert_eq!(d["type"], input["model"]["descriptor"]["type"]);
        assert_eq!(d["activation_function"], "tanh");
        assert_eq!(d["exclude_types"], json!([]));
        assert_eq!(expanded["model"]["fitting_net"]["numb_fparam"], json!(0));
        assert_eq!(expanded["loss"]["loss_func"], "mse");
        assert_eq!(expanded["optimizer"]["type"], "Adam");
        assert_eq!(expanded["training"]["save_ckpt"], "model.ckpt");
        assert_eq!(expanded["training"]["tensorboard"], false);

        // Loading it again, from a file beside the original, gives the same config.
        let path = dir.path().join("out.json");
        std::fs::write(&path, serde_json::to_string_pretty(&expanded).unwrap()).unwrap();
        assert_eq!(load_config(&path).unwrap(), c);
        assert_eq!(
            Config::from_value(&expanded, dir.path())
                .unwrap()
                .to_expanded_json(),
            expanded
        );
    }
}

// ---- errors -------------------------------------------------------------------------------

#[test]
fn unknown_key_names_path_and_valid_keys() {
    let msg = error_of(&water_with("/model/descriptor/nueron", json!([10, 20])));
    assert_mentions(
        &msg,
        &[
            "'nueron'",
            "model.descriptor.nueron",
            "valid keys",
            "neuron",
            "axis_neuron",
            "rcut_smth",
        ],
    );
    let msg = error_of(&water_with("/trainig", json!({})));
    assert_mentions(&msg, &["trainig", "<root>", "training", "learning_rate"]);
    // The typed variant carries the same facts.
    let (_d, r) = load(&water_with("/loss/start_pref_x", json!(1)));
    match r.unwrap_err().inner() {
        ConfigError::UnknownKey {
            key, path, valid, ..
        } => {
            assert_eq!(
                (key.as_str(), path.as_str()),
                ("start_pref_x", "loss.start_pref_x")
            );
            assert!(valid.iter().any(|k| k == "start_pref_e"));
        }
        other => panic!("expected UnknownKey, got {other:?}"),
    }
}

#[test]
fn wrong_type_names_path_and_expectation() {
    let msg = error_of(&water_with("/model/descriptor/rcut", json!("six")));
    assert_mentions(
        &msg,
        &["model.descriptor.rcut", "expected a number", "\"six\""],
    );
    let msg = error_of(&water_with("/training/disp_avg", json!(1)));
    assert_mentions(&msg, &["training.disp_avg", "true or false"]);
    let msg = error_of(&water_with("/model/descriptor/neuron", json!([10, 2.5])));
    assert_mentions(
        &msg,
        &["model.descriptor.neuron[1]", "non-negative integer"],
    );
    let msg = error_of(&water_with("/model/descriptor/sel", json!("many")));
    assert_mentions(&msg, &["model.descriptor.sel", "auto:<factor>"]);
}

#[test]
fn zero_batch_size_is_rejected() {
    let msg = error_of(&water_with("/training/training_data/batch_size", json!(0)));
    assert_mentions(&msg, &["training.training_data.batch_size", ">= 1"]);
    let msg = error_of(&water_with(
        "/training/training_data/batch_size",
        json!([1, 0, 1]),
    ));
    assert_mentions(&msg, &["training.training_data.batch_size[1]", ">= 1"]);
    let msg = error_of(&water_with(
        "/training/training_data/batch_size",
        json!([1, 1]),
    ));
    assert_mentions(&msg, &["training.training_data.batch_size", "3 systems"]);
    let msg = error_of(&water_with(
        "/training/training_data/batch_size",
        json!("auto:0"),
    ));
    assert_mentions(&msg, &["training.training_data.batch_size", "auto:N"]);
}

#[test]
fn negative_or_missing_numb_steps_is_rejected() {
    let msg = error_of(&water_with("/training/numb_steps", json!(-5)));
    assert_mentions(&msg, &["training.numb_steps", "non-negative integer", "-5"]);
    let mut v = water();
    v["training"].as_object_mut().unwrap().remove("numb_steps");
    assert_mentions(&error_of(&v), &["training.numb_steps", "missing"]);
}

#[test]
fn zero_disp_freq_is_rejected() {
    let msg = error_of(&water_with("/training/disp_freq", json!(0)));
    assert_mentions(&msg, &["training.disp_freq", ">= 1"]);
    let msg = error_of(&water_with("/training/save_freq", json!(0)));
    assert_mentions(&msg, &["training.save_freq", ">= 1"]);
}

#[test]
fn empty_systems_is_rejected() {
    let msg = error_of(&water_with("/training/training_data/systems", json!([])));
    assert_mentions(&msg, &["training.training_data.systems", "empty"]);
    let msg = error_of(&water_with("/training/validation_data/systems", json!([])));
    assert_mentions(&msg, &["training.validation_data.systems", "empty"]);
}

#[test]
fn unknown_auto_prob_is_rejected() {
    for bad in ["prob_size", "prob_sys_size;0:1", "prob_sys_size;2:1:0.5"] {
        let msg = error_of(&water_with("/training/training_data/auto_prob", json!(bad)));
        assert_mentions(
            &msg,
            &["training.training_data.auto_prob", "prob_uniform", bad],
        );
    }
}

#[test]
fn sel_length_must_match_type_map() {
    let msg = error_of(&water_with("/model/descriptor/sel", json!([46, 92, 10])));
    assert_mentions(&msg, &["model.descriptor.sel", "3 entries", "2 types"]);
}

#[test]
fn rcut_smth_must_be_below_rcut() {
    let msg = error_of(&water_with("/model/descriptor/rcut_smth", json!(6.0)));
    assert_mentions(&msg, &["model.descriptor.rcut_smth", "smaller than rcut"]);
}

#[test]
fn empty_type_map_is_rejected() {
    let msg = error_of(&water_with("/model/type_map", json!([])));
    assert_mentions(&msg, &["model.type_map", "empty"]);
    let msg = error_of(&water_with("/model/type_map", json!(["O", "O"])));
    assert_mentions(&msg, &["model.type_map[1]", "twice"]);
}

#[test]
fn malformed_json_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.json");
    std::fs::write(&path, "{\n  \"model\": {\n    \"rcut\": 6.0,\n  }\n}\n").unwrap();
    let err = load_config(&path).unwrap_err();
    match &err {
        ConfigError::Json { file, line, .. } => {
            assert_eq!(file, &path);
            assert_eq!(*line, 4);
        }
        other => panic!("expected Json, got {other:?}"),
    }
    assert_mentions(&err.to_string(), &["input.json", "line 4", "column"]);

    let missing = dir.path().join("nope.json");
    assert_mentions(
        &load_config(&missing).unwrap_err().to_string(),
        &["nope.json"],
    );
}

#[test]
fn key_errors_name_the_file() {
    let (dir, r) = load(&water_with("/model/descriptor/rcut", json!("six")));
    let msg = r.unwrap_err().to_string();
    assert!(msg.starts_with(&dir.path().join("input.json").display().to_string()));
}

#[test]
fn unsupported_settings_are_errors() {
    let msg = error_of(&water_with("/model/descriptor/type", json!("se_a_mask")));
    assert_mentions(
        &msg,
        &[
            "descriptor type 'se_a_mask' is not supported",
            "se_e2_a (se_a)",
            "se_e2_r (se_r)",
            "se_e3 (se_at, se_a_3be, se_t)",
            "se_atten (dpa1)",
            "se_atten_v2",
            "dpa2",
            "hybrid",
        ],
    );
    let cases = [
        (
            "/model/descriptor/activation_function",
            json!("gelu"),
            "model.descriptor.activation_function",
        ),
        (
            "/model/descriptor/exclude_types",
            json!([[0, 1]]),
            "model.descriptor.exclude_types",
        ),
        (
            "/model/descriptor/precision",
            json!("float16"),
            "model.descriptor.precision",
        ),
        (
            "/model/fitting_net/use_aparam_as_mask",
            json!(true),
            "model.fitting_net.use_aparam_as_mask",
        ),
        (
            "/model/fitting_net/type",
            json!("population"),
            "model.fitting_net.type",
        ),
        ("/loss/start_pref_pf", json!(1.0), "loss.start_pref_pf"),
        ("/loss/limit_pref_ae", json!(1.0), "loss.limit_pref_ae"),
        ("/loss/loss_func", json!("mae"), "loss.loss_func"),
        ("/loss/use_huber", json!(true), "loss.use_huber"),
        ("/learning_rate/type", json!("cosine"), "learning_rate.type"),
        (
            "/optimizer",
            json!({"type": "HybridMuon"}),
            "optimizer.type",
        ),
        ("/training/tensorboard", json!(true), "training.tensorboard"),
    ];
    for (ptr, value, path) in cases {
        assert_unsupported(&water_with(ptr, value), &[path]);
    }
}

/// The water input with DeePMD-kit's se_e2_r descriptor: its keys are se_e2_a's less
/// axis_neuron, and it has one embedding net per neighbour type only.
fn water_se_r(ty: &str) -> Value {
    let mut v = water_with("/model/descriptor/type", json!(ty));
    let d = v.pointer_mut("/model/descriptor").unwrap();
    d.as_object_mut().unwrap().remove("n_axis_neuron");
    v
}

#[test]
fn se_e2_r_takes_deepmd_keys_and_defaults() {
    for ty in ["se_e2_r", "se_r"] {
        let (_d, r) = load(&water_se_r(ty));
        let d = r.unwrap().model.descriptor;
        assert_eq!(d.kind, dpw::model::DescriptorType::SeE2R);
        assert_eq!(d.r#type, ty);
        assert!(d.type_one_side && d.axis_neuron == 1);
    }
    // type_one_side defaults to true (DeePMD-kit's default for se_e2_r, false for se_e2_a).
    let mut v = water_se_r("se_r");
    let d = v.pointer_mut("/model/descriptor").unwrap();
    d.as_object_mut().unwrap().remove("type_one_side");
    assert!(load(&v).1.unwrap().model.descriptor.type_one_side);

    let mut v = water_se_r("se_r");
    *v.pointer_mut("/model/descriptor/type_one_side").unwrap() = json!(false);
    assert_unsupported(&v, &["model.descriptor.type_one_side", "se_e2_r"]);

    let mut v = water_se_r("se_e2_r");
    v.pointer_mut("/model/descriptor")
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert("axis_neuron".into(), json!(4));
    assert_mentions(&error_of(&v), &["model.descriptor.axis_neuron"]);
}

/// The water input with DeePMD-kit's se_e3 descriptor: se_e2_a's keys less axis_neuron and
/// type_one_side (`descrpt_se_t_args`).
fn water_se_t(ty: &str) -> Value {
    let mut v = water_se_r(ty);
    let d = v.pointer_mut("/model/descriptor").unwrap();
    d.as_object_mut().unwrap().remove("type_one_side");
    v
}

#[test]
fn se_e3_takes_deepmd_keys_and_defaults() {
    for ty in ["se_e3", "se_at", "se_a_3be", "se_t"] {
        let (_d, r) = load(&water_se_t(ty));
        let cfg = r.unwrap();
        let d = &cfg.model.descriptor;
        assert_eq!(d.kind, dpw::model::DescriptorType::SeE3);
        assert_eq!(d.r#type, ty);
        assert!(!d.type_one_side && d.axis_neuron == 1);
        assert!(!d.resnet_dt && !d.set_davg_zero && d.env_protection == 0.0);
    }
    for (key, value) in [("type_one_side", json!(true)), ("axis_neuron", json!(4))] {
        let mut v = water_se_t("se_e3");
        v.pointer_mut("/model/descriptor")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(key.into(), value);
        assert_mentions(&error_of(&v), &[&format!("model.descriptor.{key}")]);
    }
    for (key, value) in [
        ("exclude_types", json!([[0, 1]])),
        ("activation_function", json!("gelu")),
    ] {
        let mut v = water_se_t("se_e3");
        *v.pointer_mut("/model/descriptor")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .entry(key)
            .or_insert(json!(null)) = value;
        assert_unsupported(&v, &[&format!("model.descriptor.{key}")]);
    }
}

/// `optimizer.type` Adam or AdamW with DeePMD-kit's defaults for weight_decay (0 and 0.001),
/// written back into out.json; the optimizers dpw lacks are refused by name.
#[test]
fn adamw_and_weight_decay_are_read() {
    use dpw::backend::WeightDecay;
    let (_d, c) = load(&water_with("/optimizer", json!({"type": "AdamW"})));
    let c = c.unwrap();
    let out = c.to_expanded_json();
    assert_eq!(
        (&out["optimizer"]["type"], &out["optimizer"]["weight_decay"]),
        (&json!("AdamW"), &json!(1e-3))
    );
    let o = c.optimizer;
    assert_eq!((o.adamw, o.weight_decay), (true, 1e-3));
    assert_eq!(o.decay(), WeightDecay::Decoupled(1e-3));
    let (_d, c) = load(&water_with(
        "/optimizer",
        json!({"type": "Adam", "weight_decay": 0.01}),
    ));
    assert_eq!(c.unwrap().optimizer.decay(), WeightDecay::L2(0.01));
    let (_d, c) = load(&water_with("/optimizer", json!({})));
    assert_eq!(c.unwrap().optimizer.decay(), WeightDecay::None);
    assert_unsupported(
        &water_with("/optimizer", json!({"type": "LKF"})),
        &["optimizer.type", "LKF"],
    );
    assert_mentions(
        &error_of(&water_with("/optimizer", json!({"type": "adam"}))),
        &["optimizer.type", "\"Adam\", \"AdamW\""],
    );
    assert_mentions(
        &error_of(&water_with("/optimizer", json!({"weight_decay": -1.0}))),
        &["optimizer.weight_decay"],
    );
}

/// The fitting net takes DeePMD-kit's activations that dpw's dense layers have; another is
/// refused naming the key.
#[test]
fn fitting_activation_is_read() {
    use dpw::model::Activation;
    let (_d, c) = load(&water_with(
        "/model/fitting_net/activation_function",
        json!("silut:10.0"),
    ));
    let c = c.unwrap();
    assert_eq!(c.model.fitting_net.activation, Activation::Silut(10.0));
    let out = c.to_expanded_json();
    assert_eq!(
        out["model"]["fitting_net"]["activation_function"],
        "silut:10.0"
    );
    assert_unsupported(
        &water_with("/model/fitting_net/activation_function", json!("gelu")),
        &["model.fitting_net.activation_function", "gelu"],
    );
}

#[test]
fn conflicting_keys_are_rejected() {
    let msg = error_of(&water_with("/learning_rate/stop_lr_ratio", json!(0.01)));
    assert_mentions(&msg, &["learning_rate.stop_lr_ratio", "not both"]);
    let msg = error_of(&water_with("/model/descriptor/axis_neuron", json!(4)));
    assert_mentions(&msg, &["model.descriptor.n_axis_neuron", "alias"]);
    let msg = error_of(&water_with("/model/descriptor/n_axis_neuron", json!(200)));
    assert_mentions(
        &msg,
        &["model.descriptor.axis_neuron", "last embedding width (100)"],
    );
}

/// The water input with DeePMD-kit's hybrid descriptor: a `list` of descriptors, each taking its
/// own type's keys.
fn water_hybrid() -> Value {
    water_with(
        "/model/descriptor",
        json!({
            "type": "hybrid",
            "list": [
                {"type": "se_e2_a", "sel": [46, 92], "rcut": 6.0, "rcut_smth": 0.5,
                 "neuron": [4, 8, 16], "axis_neuron": 4, "type_one_side": true, "seed": 1},
                {"type": "se_e2_r", "sel": [16, 28], "rcut": 4.0, "rcut_smth": 0.5,
                 "neuron": [4, 8], "seed": 3},
            ],
        }),
    )
}

#[test]
fn hybrid_takes_a_list_of_descriptors() {
    let (_d, r) = load(&water_hybrid());
    let cfg = r.unwrap();
    let d = &cfg.model.descriptor;
    assert_eq!(d.kind, dpw::model::DescriptorType::Hybrid);
    assert_eq!(d.own.list().len(), 2);
    assert_eq!(d.own.list()[0].kind, dpw::model::DescriptorType::SeE2A);
    assert_eq!(d.own.list()[1].kind, dpw::model::DescriptorType::SeE2R);
    assert!(d.own.list()[1].type_one_side && d.own.list()[1].axis_neuron == 1);
    // The one list: the largest rcut and, per type, the largest sel.
    assert_eq!(d.rcut, 6.0);
    assert_eq!(d.sel, dpw::config::Sel::Fixed(vec![46, 92]));

    // Each item is checked by its own schema, named by its place in the list.
    let mut v = water_hybrid();
    v.pointer_mut("/model/descriptor/list/1")
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert("axis_neuron".into(), json!(4));
    assert_mentions(&error_of(&v), &["model.descriptor.list[1].axis_neuron"]);
    // A hybrid has no keys but type and list.
    let mut v = water_hybrid();
    v.pointer_mut("/model/descriptor")
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert("rcut".into(), json!(6.0));
    assert_mentions(&error_of(&v), &["model.descriptor.rcut"]);
    // Nested hybrid, sel "auto" inside hybrid, an empty list: refused by name.
    let mut v = water_hybrid();
    *v.pointer_mut("/model/descriptor/list/1").unwrap() =
        water_hybrid()["model"]["descriptor"].clone();
    assert_unsupported(&v, &["model.descriptor.list[1].type", "inside hybrid"]);
    let mut v = water_hybrid();
    *v.pointer_mut("/model/descriptor/list/0/sel").unwrap() = json!("auto");
    assert_mentions(&error_of(&v), &["model.descriptor.list[0].sel", "auto"]);
    let mut v = water_hybrid();
    *v.pointer_mut("/model/descriptor/list").unwrap() = json!([]);
    assert_mentions(&error_of(&v), &["model.descriptor.list", "empty"]);
    let mut v = water_hybrid();
    v.pointer_mut("/model/descriptor/list/1")
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert("precision".into(), json!("float32"));
    // Parts of two precisions: the model trains in float64 (train::setup warns).
    let d = load(&v).1.unwrap().model.descriptor;
    assert_eq!(
        (
            d.precision,
            d.own.list()[0].precision,
            d.own.list()[1].precision
        ),
        (Precision::F64, Precision::F64, Precision::F32)
    );
}

// ---- DPA-1 (se_atten, se_atten_v2): parsed and checked, not trainable yet ------------------

/// The water input with a DPA-1 descriptor of only the given keys (the rest DeePMD-kit's
/// defaults).
fn water_atten(descriptor: Value) -> Value {
    water_with("/model/descriptor", descriptor)
}

fn dpa1_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/dpa1")
}

#[test]
fn se_atten_takes_deepmd_defaults() {
    use dpw::config::TebdInputMode;
    use dpw::model::DescriptorType;
    // DeePMD-kit 3.2.0's argcheck defaults (descrpt_se_atten_common_args + descrpt_se_atten_args).
    for ty in ["se_atten", "dpa1"] {
        let (_d, r) = load(&water_atten(json!({"type": ty})));
        let d = r.unwrap().model.descriptor;
        assert_eq!((d.kind, d.r#type.as_str()), (DescriptorType::SeAtten, ty));
        assert_eq!(d.sel, Sel::Auto(1.1));
        assert_eq!((d.rcut, d.rcut_smth), (6.0, 0.5));
        assert_eq!((d.neuron.as_slice(), d.axis_neuron), (&[10, 20, 40][..], 4));
        assert!(!d.resnet_dt && !d.type_one_side && d.trainable && d.set_davg_zero);
        assert_eq!(
            (d.precision, d.seed, d.env_protection),
            (Precision::F64, None, 0.0)
        );
        let a = d.own.attention().cloned().unwrap();
        assert_eq!((a.tebd_dim, a.tebd_input_mode), (8, TebdInputMode::Concat));
        assert_eq!((a.attn, a.attn_layer, a.attn_dotr), (128, 2, true));
        assert_eq!(
            (a.scaling_factor, a.normalize, a.temperature),
            (1.0, true, None)
        );
        assert_eq!((a.trainable_ln, a.ln_eps), (true, 1e-5));
        assert!(!a.smooth_type_embedding && a.concat_output_tebd && !a.use_tebd_bias);
    }
    // se_atten_v2: strip and smooth always, set_davg_zero false by default.
    let (_d, r) = load(&water_atten(json!({"type": "se_atten_v2"})));
    let d = r.unwrap().model.descriptor;
    assert_eq!(d.kind, DescriptorType::SeAttenV2);
    assert!(!d.set_davg_zero);
    let a = d.own.attention().cloned().unwrap();
    assert_eq!(a.tebd_input_mode, TebdInputMode::Strip);
    assert!(a.smooth_type_embedding);
    // The other descriptors have no attention keys.
    assert_eq!(
        load(&water()).1.unwrap().model.descriptor.own.attention(),
        None
    );
}

/// Issue 57, item 2: out.json holds no null where DeePMD-kit 3.2.0's argcheck (`dp train
/// out.json`) wants a value: `training.mixed_precision` (a dict or no key; before: null,
/// "requires <dict> but None is not a dict") and se_atten's `temperature` (a float or no key);
/// a temperature given is kept, and the expanded input loads back to the same config.
#[test]
fn out_json_has_no_null_that_deepmd_kit_refuses() {
    for (input, temperature) in [
        (water(), None),
        (water_atten(json!({"type": "se_atten"})), None),
        (
            water_atten(json!({"type": "se_atten_v2", "temperature": 0.5})),
            Some(json!(0.5)),
        ),
    ] {
        let (dir, c) = load(&input);
        let c = c.unwrap();
        let expanded = c.to_expanded_json();
        assert_eq!(expanded["training"].get("mixed_precision"), None);
        let d = &expanded["model"]["descriptor"];
        assert_eq!(d.get("temperature"), temperature.as_ref());
        assert_eq!(Config::from_value(&expanded, dir.path()).unwrap(), c);
    }
    // dpw's earlier out.json files (with the null) still load.
    let mut old = water();
    old["training"]["mixed_precision"] = Value::Null;
    load(&old).1.unwrap();
}

/// Issue 57: `model.type` is known. "standard" (DeePMD-kit's own out.json has it) trains and
/// is written to out.json; DPA-4's input (DeePMD-kit's examples/water/dpa4/input.json has
/// `"type": "DPA4"`, its own descriptor keys and a top-level `validating`) is refused naming
/// DPA-4, not the first unknown key (before: "unknown key 'validating'"); a pair-table model
/// alone is named too.
#[test]
fn model_type_is_known_and_named_first() {
    let mut multi = water();
    multi["model"]["model_dict"] = json!({"water": {}});
    assert_unsupported(&multi, &["model.model_dict", "multi-task"]);
    let mut standard = water();
    standard["model"]["type"] = json!("standard");
    let c = load(&standard).1.unwrap();
    assert_eq!(c.to_expanded_json()["model"]["type"], "standard");
    let mut dpa4 = water();
    dpa4["model"]["type"] = json!("DPA4");
    dpa4["model"]["descriptor"] = json!({"rcut": 6.0, "channels": 32, "lmax": 3});
    dpa4["model"]["enable_tf32"] = json!(true);
    dpa4["validating"] = json!({"compiled_infer": false});
    assert_unsupported(&dpa4, &["model.type", "DPA-4", "\"standard\""]);
    for (ty, named) in [("pairtab", "a pair table alone"), ("zbl_mix", "not known")] {
        assert_unsupported(
            &water_with("/model/type", json!(ty)),
            &["model.type", ty, named],
        );
    }
}

#[test]
fn se_atten_reads_the_reference_inputs() {
    use dpw::config::TebdInputMode;
    // The model sections DeePMD-kit built the reference models from (tests/reference/dpa1).
    for case in [
        "se_atten_l0_water",
        "se_atten_l2_alloy",
        "se_atten_v2_alloy",
        "se_atten_l2_opts_water",
    ] {
        let text = std::fs::read_to_string(dpa1_dir().join(case).join("input.json")).unwrap();
        let model: Value = serde_json::from_str(&text).unwrap();
        let given = &model["model"]["descriptor"];
        let v = water_with("/model", model["model"].clone());
        let (_d, r) = load(&v);
        let d = r.unwrap_or_else(|e| panic!("{case}: {e}")).model.descriptor;
        let a = d.own.attention().unwrap();
        assert_eq!(
            d.sel,
            Sel::Fixed(vec![given["sel"].as_u64().unwrap() as usize])
        );
        assert_eq!(d.neuron, [4, 8, 16]);
        assert_eq!(d.set_davg_zero, given["set_davg_zero"].as_bool().unwrap());
        assert_eq!(d.resnet_dt, given["resnet_dt"].as_bool().unwrap());
        assert_eq!(d.type_one_side, given["type_one_side"].as_bool().unwrap());
        assert_eq!(a.attn_layer as u64, given["attn_layer"].as_u64().unwrap());
        assert_eq!(a.tebd_dim as u64, given["tebd_dim"].as_u64().unwrap());
        assert_eq!(a.temperature, given["temperature"].as_f64());
        assert_eq!(a.ln_eps, given["ln_eps"].as_f64().unwrap());
        assert_eq!(a.normalize, given["normalize"].as_bool().unwrap());
        assert_eq!(a.trainable_ln, given["trainable_ln"].as_bool().unwrap());
        assert_eq!(a.attn_dotr, given["attn_dotr"].as_bool().unwrap());
        assert_eq!(a.use_tebd_bias, given["use_tebd_bias"].as_bool().unwrap());
        assert_eq!(
            a.concat_output_tebd,
            given["concat_output_tebd"].as_bool().unwrap()
        );
        let v2 = given["type"] == "se_atten_v2";
        let smooth = v2 || given["smooth_type_embedding"].as_bool().unwrap();
        assert_eq!(a.smooth_type_embedding, smooth, "{case}");
        let mode = if v2 {
            TebdInputMode::Strip
        } else {
            TebdInputMode::Concat
        };
        assert_eq!(a.tebd_input_mode, mode, "{case}");

        // The expanded input loads back to the same config.
        let dir = tempfile::tempdir().unwrap();
        let c = Config::from_value(&v, dir.path()).unwrap();
        let expanded = c.to_expanded_json();
        assert_eq!(
            Config::from_value(&expanded, dir.path()).unwrap(),
            c,
            "{case}"
        );

        // The model spec made from the input is the one DeePMD-kit's own file of the same
        // model gives: its attention keys and one mixed sel.
        let Sel::Fixed(sel) = d.sel.clone() else {
            unreachable!()
        };
        let spec = dpw::train::setup::descriptor_spec(&d, sel);
        let file = dpw::model::read_deepmd_yaml(&dpa1_dir().join(case).join("model.yaml"))
            .unwrap()
            .spec
            .descriptor;
        assert_eq!(spec, file, "{case}");
        assert_eq!(spec.sel.len(), 1);
    }
}

#[test]
fn se_atten_aliases_and_deprecated_keys() {
    use dpw::config::TebdInputMode;
    let atten = |extra: Value| {
        let mut d = json!({"type": "se_atten", "sel": 30, "neuron": [4, 8]});
        d.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        water_atten(d)
    };
    let parsed = |extra: Value| load(&atten(extra)).1.unwrap().model.descriptor;
    // DeePMD-kit's misspelt alias, and n_axis_neuron.
    let d = parsed(json!({"smooth_type_embdding": true, "n_axis_neuron": 2}));
    assert!(d.own.attention().cloned().unwrap().smooth_type_embedding);
    assert_eq!(d.axis_neuron, 2);
    // A sel list: only its sum matters to DeePMD-kit; kept as given, of any length (DeePMD-kit
    // serializes sel 30 as [30]).
    let d = parsed(json!({"sel": [10, 20]}));
    assert_eq!(d.sel, Sel::Fixed(vec![10, 20]));
    // The model's spec has one mixed section, the sum.
    let spec = dpw::train::setup::descriptor_spec(&d, vec![10, 20]);
    assert_eq!(spec.sel, [30]);
    assert_eq!(parsed(json!({"sel": [30]})).sel, Sel::Fixed(vec![30]));
    assert_mentions(
        &error_of(&atten(json!({"sel": []}))),
        &["model.descriptor.sel", "empty"],
    );
    // stripped_type_embedding (deprecated) overrides tebd_input_mode when given.
    let mode = |extra| parsed(extra).own.attention().unwrap().tebd_input_mode;
    assert_eq!(
        mode(json!({"tebd_input_mode": "strip"})),
        TebdInputMode::Strip
    );
    assert_eq!(
        mode(json!({"stripped_type_embedding": true})),
        TebdInputMode::Strip
    );
    assert_eq!(
        mode(json!({"stripped_type_embedding": false, "tebd_input_mode": "strip"})),
        TebdInputMode::Concat
    );
    assert_eq!(
        mode(json!({"stripped_type_embedding": null, "tebd_input_mode": "strip"})),
        TebdInputMode::Strip
    );
    assert_eq!(
        parsed(json!({"ln_eps": null}))
            .own
            .attention()
            .unwrap()
            .ln_eps,
        1e-5
    );
    assert_eq!(
        parsed(json!({"lmax": 1}))
            .own
            .attention()
            .unwrap()
            .attn_layer,
        2
    );

    let msg = error_of(&atten(json!({"tebd_input_mode": "sum"})));
    assert_mentions(&msg, &["model.descriptor.tebd_input_mode", "\"sum\""]);
    let msg = error_of(&atten(
        json!({"smooth_type_embdding": true, "smooth_type_embedding": true}),
    ));
    assert_mentions(&msg, &["model.descriptor.smooth_type_embdding", "alias"]);
    for (key, value) in [
        ("tebd_dim", json!(0)),
        ("attn", json!(0)),
        ("scaling_factor", json!(0.0)),
        ("temperature", json!(-1.0)),
        ("ln_eps", json!(0.0)),
    ] {
        let msg = error_of(&atten(json!({ key: value })));
        assert_mentions(&msg, &[&format!("model.descriptor.{key}")]);
    }
}

#[test]
fn se_atten_refuses_what_dpw_lacks_by_name() {
    for ty in ["se_atten", "se_atten_v2"] {
        for (key, value) in [
            ("attn_mask", json!(true)),
            ("use_econf_tebd", json!(true)),
            ("exclude_types", json!([[0, 1]])),
            ("activation_function", json!("gelu")),
            ("lmax", json!(2)),
        ] {
            assert_unsupported(
                &water_atten(json!({"type": ty, key: value})),
                &[&format!("model.descriptor.{key}")],
            );
        }
        // The defaults themselves are accepted.
        let (_d, r) = load(&water_atten(json!({
            "type": ty, "attn_mask": false, "use_econf_tebd": false, "exclude_types": [],
            "activation_function": "tanh"
        })));
        r.unwrap();
    }
    // se_atten_v2 has no tebd_input_mode, stripped_type_embedding or smooth_type_embedding.
    for key in [
        "tebd_input_mode",
        "stripped_type_embedding",
        "smooth_type_embedding",
    ] {
        let err = load(&water_atten(json!({"type": "se_atten_v2", key: null})))
            .1
            .unwrap_err();
        assert!(
            matches!(err.inner(), ConfigError::UnknownKey { .. }),
            "{key}: {err}"
        );
        assert_mentions(&err.to_string(), &[&format!("model.descriptor.{key}")]);
    }
    // Not inside hybrid (yet).
    let mut v = water_hybrid();
    *v.pointer_mut("/model/descriptor/list/1").unwrap() = json!({"type": "se_atten_v2", "sel": 30});
    assert_unsupported(&v, &["model.descriptor.list[1].type", "inside hybrid"]);
}

/// DPA-1 under each of its names sets up for training (statistics, model, batches), with its
/// keys as DeePMD-kit defaults them.
#[test]
fn training_se_atten_prepares() {
    use dpw::train::setup::{prepare_in, Start};
    for ty in ["se_atten", "dpa1", "se_atten_v2"] {
        let dir = tempfile::tempdir().unwrap();
        let mut v = water_atten(json!({"type": ty, "sel": 30}));
        v["training"]["numb_steps"] = json!(1);
        v["training"]["training_data"]["systems"] = json!(["data_0"]);
        if v["training"].get("validation_data").is_some() {
            v["training"]["validation_data"]["systems"] = json!(["data_3"]);
        }
        let water = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
        let cfg = Config::from_value(&v, &water).unwrap();
        let start = web_time::Instant::now();
        let setup = prepare_in(&dpw::data::Disk, cfg, Start::Fresh, true, dir.path(), start)
            .unwrap_or_else(|e| panic!("{ty}: {e:#}"));
        let a = setup.model.spec.descriptor.own.attention().unwrap();
        assert_eq!((a.attn, a.attn_layer, a.tebd_dim), (128, 2, 8), "{ty}");
    }
}

/// The paths where two JSON values differ (numbers compared by value: `1` equals `1.0`).
fn json_differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p1), Some(p2)) => json_differences(&p, p1, p2, out),
                    _ => out.push(p),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p1, p2)) in x.iter().zip(y).enumerate() {
                json_differences(&format!("{path}[{i}]"), p1, p2, out);
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a == b => {}
        _ => out.push(path.to_string()),
    }
}

/// Issue 57, items 1 and 2: DeePMD-kit's own out.json (its `normalize` of the shipped examples,
/// tests/data/deepmd-kit/out-*.json, made by scripts/make-reference/deepmd_args.py) loads to the
/// same config as the input it came from (before: "unknown key" 30 times in a row), and dpw's
/// out.json holds the same keys and values as DeePMD-kit's (before: 40 of DeePMD-kit's keys
/// missing), so `dp train out.json` reads the model dpw trained.
#[test]
fn deepmd_kits_out_json_loads_and_dpw_writes_the_same() {
    for name in ["water", "alloy"] {
        let dir = common::repo("examples").join(name);
        let ours = load_config(dir.join("input.json")).unwrap();
        let file = common::repo("tests/data/deepmd-kit").join(format!("out-{name}.json"));
        let theirs: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(Config::from_value(&theirs, &dir).unwrap(), ours, "{name}");

        let mut differences = vec![];
        json_differences("", &ours.to_expanded_json(), &theirs, &mut differences);

        // dpw writes the systems resolved against input.json's folder, what "default" and
        // "auto" stand for, and the optimizer section DeePMD-kit leaves out when not given.
        differences.retain(|p| !p.ends_with(".systems"));
        let expanded = ours.to_expanded_json();
        for (path, dpw, deepmd) in [
            (
                "/model/descriptor/precision",
                json!("float64"),
                json!("default"),
            ),
            (
                "/model/fitting_net/precision",
                json!("float64"),
                json!("default"),
            ),
            (
                "/training/training_data/batch_size",
                json!("auto:32"),
                json!("auto"),
            ),
        ] {
            if theirs.pointer(path) == Some(&deepmd) {
                assert_eq!(expanded.pointer(path), Some(&dpw), "{name}: {path}");
                differences.retain(|p| p.replace('.', "/") != path);
            }
        }
        assert_eq!(
            expanded["optimizer"],
            json!({"type": "Adam", "adam_beta1": 0.9, "adam_beta2": 0.999, "weight_decay": 0.0})
        );
        differences.retain(|p| p != ".optimizer");
        assert_eq!(differences, Vec::<String>::new(), "{name}");
    }
}

/// Issue 57, item 1: every key DeePMD-kit 3.2.0 knows is known. At DeePMD-kit's default it is
/// accepted (and written to out.json); otherwise it is refused naming what dpw lacks, at the
/// key that asks for it; only a key DeePMD-kit does not know either is an unknown key.
#[test]
fn deepmd_keys_beyond_dpw_are_accepted_at_their_default_and_refused_by_name() {
    for (ptr, value) in [
        ("/training/acc_freq", json!(1)),
        ("/training/enable_ema", json!(false)),
        ("/training/stat_file_mode", json!("update")),
        (
            "/validating",
            json!({"full_validation": false, "validation_freq": 5000}),
        ),
        ("/model/fitting_net/default_fparam", Value::Null),
        ("/model/bridging_method", json!("None")),
        ("/model/info", json!({})),
        ("/loss/f_use_norm", json!(false)),
        ("/loss/start_pref_h", json!(0)),
        ("/model/descriptor/env_protection", json!(0.0)),
    ] {
        let (_dir, c) = load(&water_with(ptr, value.clone()));
        let expanded = c
            .unwrap_or_else(|e| panic!("{ptr}: {e}"))
            .to_expanded_json();
        let written = expanded.pointer(ptr).unwrap();
        let mut differences = vec![];
        json_differences(ptr, written, &value, &mut differences);
        // An object gets the defaults of the keys it lacks.
        differences.retain(|p| !(value.is_object() && p.starts_with(&format!("{ptr}."))));
        assert_eq!(differences, Vec::<String>::new());
    }
    for (ptr, value, parts) in [
        (
            "/training/enable_ema",
            json!(true),
            vec!["training.enable_ema", "EMA", "false"],
        ),
        (
            "/training/zero_stage",
            json!(2),
            vec!["training.zero_stage", "ZeRO", "0"],
        ),
        (
            "/model/pair_exclude_types",
            json!([[0, 1]]),
            vec!["model.pair_exclude_types", "type exclusion"],
        ),
        (
            "/training/acc_freq",
            json!(4),
            vec![
                "training.acc_freq",
                "not implemented in dpw",
                "DeePMD-kit: ",
                "1",
            ],
        ),
        (
            "/validating",
            json!({"validation_freq": 5000, "full_validation": true}),
            vec!["validating.full_validation", "false", "boolean true"],
        ),
        (
            "/loss/start_pref_h",
            json!(1.0),
            vec!["loss.start_pref_h", "0.0"],
        ),
    ] {
        assert_unsupported(&water_with(ptr, value), &parts);
    }
    let msg = error_of(&water_with("/training/enable_emma", json!(false)));
    assert_mentions(&msg, &["unknown key 'enable_emma'", "training.enable_emma"]);
}

/// Issue 57, items 1 and 6: DeePMD-kit's own example inputs (tests/data/deepmd-kit/examples, see
/// its README) each load or are refused for what dpw lacks, never for an unknown key; what
/// each gives is kept in tests/data/deepmd-kit/examples.tsv (the key that asks for a missing
/// feature, or `loads`), so that a change shows here.
#[test]
fn deepmd_kits_example_inputs_load_or_name_what_dpw_lacks() {
    let root = common::repo("tests/data/deepmd-kit/examples");
    let mut inputs = vec![];
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                inputs.push(path);
            }
        }
    }
    inputs.sort();
    let mut table = String::new();
    for path in &inputs {
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        let mut input: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        // As `dpw train` reads it: without a type_map, the training data's.
        dpw::cli::train::type_map_from_data(path, &mut input).unwrap();
        let parsed = match dpw::config::multitask::is_multitask(&input) {
            true => dpw::config::parse_multitask_input(path, &input)
                .map(|_| ())
                .map_err(|e| match e {
                    ConfigError::InFile { error, .. } => *error,
                    e => e,
                }),
            false => Config::from_value(&input, path.parent().unwrap()).map(|_| ()),
        };
        let outcome = match parsed {
            Ok(_) => "loads".to_string(),
            Err(e) => {
                assert!(
                    !matches!(e.inner(), ConfigError::UnknownKey { .. }),
                    "{name}: {e}"
                );
                e.to_string()
            }
        };
        table.push_str(&format!("{name}\t{outcome}\n"));
    }
    let kept = common::repo("tests/data/deepmd-kit/examples.tsv");
    let expected = std::fs::read_to_string(&kept).unwrap_or_default();
    if expected != table {
        let fresh = kept.with_extension("tsv.new");
        std::fs::write(&fresh, &table).unwrap();
        panic!(
            "the outcomes differ from {}; they are in {} (diff them, and move it there if right)",
            kept.display(),
            fresh.display()
        );
    }
}

/// Issue 57, item 2: dpw's out.json of every example input it loads (DeePMD-kit's and dpw's own)
/// is an input DeePMD-kit 3.2.0's strict check takes, by its schema; DeePMD-kit's own out.json
/// passes the same check, and a broken one does not.
#[test]
fn dpws_out_json_is_a_valid_deepmd_kit_input() {
    for name in ["water", "alloy"] {
        let file = common::repo("tests/data/deepmd-kit").join(format!("out-{name}.json"));
        let theirs: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(deepmd_input_errors(&theirs), Vec::<String>::new(), "{name}");
    }
    let mut inputs: Vec<std::path::PathBuf> = ["water", "alloy"]
        .iter()
        .flat_map(|d| std::fs::read_dir(common::repo("examples").join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    let tsv = std::fs::read_to_string(common::repo("tests/data/deepmd-kit/examples.tsv")).unwrap();
    let examples = common::repo("tests/data/deepmd-kit/examples");
    inputs.extend(
        (tsv.lines().filter_map(|l| l.split_once('\t')))
            .filter(|(_, outcome)| *outcome == "loads")
            .map(|(name, _)| examples.join(name)),
    );
    assert!(inputs.len() >= 18, "{inputs:?}");
    for path in &inputs {
        let mut input: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        dpw::cli::train::type_map_from_data(path, &mut input).unwrap();
        // A multi-task input's out.json: each task's part is a single-task input DeePMD-kit's
        // check takes (its schema is of those).
        let outs = match dpw::config::multitask::is_multitask(&input) {
            true => (dpw::config::parse_multitask_input(path, &input)
                .unwrap()
                .tasks
                .iter())
            .map(|t| t.config.to_expanded_json())
            .collect(),
            false => vec![Config::from_value(&input, path.parent().unwrap())
                .unwrap()
                .to_expanded_json()],
        };
        for out in outs {
            let errors = deepmd_input_errors(&out);
            assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
        }
    }

    // The check can fail: a key DeePMD-kit does not know, a value of a type it does not take, a
    // required key missing, a tag it does not have.
    let good = load_config(common::repo("examples/water/input.json"))
        .unwrap()
        .to_expanded_json();
    for (ptr, key, value, says) in [
        (
            "/training",
            "numb_stps",
            Some(json!(3)),
            "training.numb_stps: not a key",
        ),
        (
            "/model/descriptor",
            "rcut",
            Some(json!("6")),
            "model.descriptor.rcut: \"6\" is not of type float",
        ),
        (
            "/training/training_data",
            "systems",
            None,
            "training.training_data.systems: required",
        ),
        (
            "/model/descriptor",
            "type",
            Some(json!("se_e9")),
            "model.descriptor.type: \"se_e9\" is not one",
        ),
    ] {
        let mut bad = good.clone();
        let parent = bad.pointer_mut(ptr).unwrap().as_object_mut().unwrap();
        match value {
            Some(v) => parent.insert(key.into(), v),
            None => parent.remove(key),
        };
        let errors = deepmd_input_errors(&bad);
        assert!(
            errors.iter().any(|e| e.starts_with(says)),
            "{says}: {errors:#?}"
        );
    }
}

/// README's table of DeePMD-kit's example inputs, made from examples.tsv: one row per outcome
/// (the message up to its first `;`, the key it names in code), with the inputs that give it.
fn examples_table(tsv: &str) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    for (name, outcome) in tsv.lines().filter_map(|l| l.split_once('\t')) {
        let said = match outcome {
            "loads" => "**trains**".to_string(),
            o => {
                let o = o.split("; ").next().unwrap();
                match o.split_once(": ") {
                    Some((key, why)) => format!("`{key}`: {why}"),
                    None => o.to_string(),
                }
            }
        };
        let name = format!("`{name}`");
        match rows.iter_mut().find(|(s, _)| *s == said) {
            Some((_, names)) => names.push(name),
            None => rows.push((said, vec![name])),
        }
    }
    rows.sort_by_key(|(said, _)| said != "**trains**");
    let mut table = String::from("| dpw | DeePMD-kit's example inputs |\n|---|---|\n");
    for (said, names) in rows {
        let said = said.replace('|', "\\|");
        table.push_str(&format!("| {said} | {} |\n", names.join(", ")));
    }
    table
}

/// Issue 57, item 6: README's list of what DeePMD-kit's examples ask that dpw lacks is the one
/// examples.tsv holds (which the test above keeps true).
#[test]
fn readme_lists_deepmd_kits_examples_as_examples_tsv_has_them() {
    let tsv = std::fs::read_to_string(common::repo("tests/data/deepmd-kit/examples.tsv")).unwrap();
    let readme = std::fs::read_to_string(common::repo("README.md")).unwrap();
    let (begin, end) = (
        "<!-- made from tests/data/deepmd-kit/examples.tsv: begin -->\n",
        "<!-- made from tests/data/deepmd-kit/examples.tsv: end -->",
    );
    let start = readme.find(begin).expect("README has the examples table") + begin.len();
    let stop = readme[start..].find(end).expect("its end") + start;
    let table = examples_table(&tsv);
    assert!(
        readme[start..stop] == table,
        "README.md's examples table is not examples.tsv's; it should read:\n{table}"
    );
}

/// Issue 57: DeePMD-kit's other spellings of the keys dpw reads are dpw's too (taken from its
/// schema; before, `numb_step`, `num_steps`, `auto_prob_style` and `numb_batch` were unknown).
#[test]
fn deepmd_kits_aliases_are_read() {
    for (ptr, alias, value) in [
        ("/training", "num_steps", json!(7)),
        ("/training", "numb_step", json!(7)),
        (
            "/training/training_data",
            "auto_prob_style",
            json!("prob_uniform"),
        ),
        ("/training/validation_data", "numb_batch", json!(2)),
    ] {
        let mut input = water();
        let parent = input.pointer_mut(ptr).unwrap().as_object_mut().unwrap();
        let canonical = match alias {
            "auto_prob_style" => "auto_prob",
            "numb_batch" => "numb_btch",
            _ => "numb_steps",
        };
        parent.remove(canonical);
        parent.insert(alias.into(), value.clone());
        let c = load(&input).1.unwrap();
        let expanded = c.to_expanded_json();
        assert_eq!(expanded.pointer(ptr).unwrap()[canonical], value, "{alias}");
        assert_alias_beside_its_key_is_refused(&input, ptr, canonical, &value);
    }
}

fn assert_alias_beside_its_key_is_refused(
    input: &Value,
    ptr: &str,
    canonical: &str,
    value: &Value,
) {
    let mut both = input.clone();
    let parent = both.pointer_mut(ptr).unwrap().as_object_mut().unwrap();
    parent.insert(canonical.into(), value.clone());
    assert_mentions(&error_of(&both), &["is an alias of", canonical]);
}

/// `training.enable_compile` (DeePMD-kit's switch to compile its step with torch.compile, which
/// changes its speed alone) is taken either way, as the scripts/gpu-check.sh inputs for
/// `--pt-expt` set it; the config is the same as without it.
#[test]
fn enable_compile_is_taken_either_way() {
    let water = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/water");
    let text = std::fs::read_to_string(water.join("input.json")).unwrap();
    let base: Value = serde_json::from_str(&text).unwrap();
    let want = Config::from_value(&base, &water).unwrap();
    for on in [true, false] {
        let mut v = base.clone();
        v["training"]["enable_compile"] = json!(on);
        assert_eq!(Config::from_value(&v, &water).unwrap(), want, "{on}");
    }
}

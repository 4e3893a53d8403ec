//! DeePMD-kit v3 YAML model files: reading the real DeePMD-kit 3.2.0 export of model_A, bit-exact
//! write → read round trips, the written file's structure against DeePMD's, and bad files.
mod common;

use std::collections::BTreeSet;
use std::path::Path;

use dpw::model::{
    read_deepmd_yaml, write_deepmd_yaml, DescriptorSpec, DescriptorType, FittingSpec, Model,
    ModelSpec,
};
use ndarray::ArrayD;
use serde_yaml_ng::Value;

use common::{model_a_dir, repo};

fn npy(dir: &Path, name: &str) -> ArrayD<f64> {
    let path = dir.join("npy").join(format!("{name}.npy"));
    ndarray_npy::read_npy(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bits(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn assert_same(a: &Model, b: &Model) {
    assert_eq!(a.spec, b.spec);
    assert_eq!(bits(&a.params), bits(&b.params), "params");
    assert_eq!(bits(&a.davg), bits(&b.davg), "davg");
    assert_eq!(bits(&a.dstd), bits(&b.dstd), "dstd");
    assert_eq!(bits(&a.bias), bits(&b.bias), "bias");
}

fn parse(path: &Path) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn reads_model_a_exactly() {
    let dir = model_a_dir();
    let m = read_deepmd_yaml(&dir.join("model.yaml")).unwrap();

    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let expect = ModelSpec {
        short_range: None,
        linear: None,
        type_map: vec!["O".into(), "H".into()],
        descriptor: DescriptorSpec {
            kind: Default::default(),
            rcut: 6.0,
            rcut_smth: 0.5,
            sel: vec![46, 92],
            neuron: vec![8, 16, 32],
            axis_neuron: 4,
            resnet_dt: false,
            type_one_side: true,
            env_protection: 0.0,
            set_davg_zero: false,
            own: dpw::model::OwnKeys::Se,
        },
        fitting: FittingSpec::new(vec![32, 32, 32], true),
    };
    assert_eq!(m.spec, expect);
    let md = &meta["descriptor"];
    assert_eq!(md["sel"], serde_json::json!(m.spec.descriptor.sel));
    assert_eq!(md["neuron"], serde_json::json!(m.spec.descriptor.neuron));
    assert_eq!(md["rcut"].as_f64(), Some(m.spec.descriptor.rcut));
    assert_eq!(md["type_one_side"], serde_json::json!(true));
    assert_eq!(
        meta["fitting"]["neuron"],
        serde_json::json!(m.spec.fitting.neuron)
    );

    // Every trainable tensor, bit for bit, and every npy tensor accounted for.
    let layout = m.layout();
    let index: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("npy/index.json")).unwrap())
            .unwrap();
    let mut seen = 0;
    for t in &layout.tensors {
        let want = npy(&dir, &t.name);
        assert_eq!(want.shape(), t.shape.as_slice(), "{}", t.name);
        let got = &m.params[t.offset..t.offset + t.len()];
        assert_eq!(bits(got), bits(want.as_slice().unwrap()), "{}", t.name);
        assert!(index.contains_key(&t.name), "{} not in index.json", t.name);
        seen += 1;
    }
    let trainable = index
        .keys()
        .filter(|k| k.starts_with("embed.") || k.starts_with("fit.t"))
        .count();
    assert_eq!(
        seen, trainable,
        "layout and npy export list the same tensors"
    );

    // Statistics: every davg/dstd row of a type equals the stored one.
    let nt = 2;
    for (name, stored) in [("descrpt.davg", &m.davg), ("descrpt.dstd", &m.dstd)] {
        let a = npy(&dir, name);
        assert_eq!(a.shape(), &[nt, 138, 4]);
        for t in 0..nt {
            for j in 0..138 {
                for c in 0..4 {
                    assert_eq!(a[[t, j, c]].to_bits(), stored[t * 4 + c].to_bits());
                }
            }
        }
    }
    let out_bias = npy(&dir, "out_bias");
    let bias_atom_e = npy(&dir, "fit.bias_atom_e");
    for t in 0..nt {
        assert_eq!(m.bias[t], out_bias[[0, t, 0]] + bias_atom_e[[t, 0]]);
    }
}

#[test]
fn model_a_round_trips_and_matches_deepmd_structure() {
    let dir = model_a_dir();
    let m = read_deepmd_yaml(&dir.join("model.yaml")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("model_A.yaml");
    write_deepmd_yaml(&m, &out).unwrap();
    assert_same(&read_deepmd_yaml(&out).unwrap(), &m);

    // Same key paths as DeePMD's own file, except the provenance keys at the top.
    let (orig, ours) = (parse(&dir.join("model.yaml")), parse(&out));
    let provenance = ["backend", "model_def_script", "software", "time", "version"];
    let top = |v: &Value| -> BTreeSet<String> {
        v.as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap().to_string())
            .filter(|k| !provenance.contains(&k.as_str()))
            .collect()
    };
    assert_eq!(top(&orig), top(&ours));
    assert_same_model_keys("model_A", &orig, &ours);
    // model_A has equal davg rows and zero bias_atom_e, so even the values agree everywhere but
    // out_std, which dpw writes as 1 (`write_deepmd_yaml`), and the printing follows PyYAML's so
    // closely that the text of the section is the same.
    let ones: Value = serde_yaml_ng::from_str("[[[1.0], [1.0]]]").unwrap();
    assert_eq!(ours["model"]["@variables"]["out_std"]["value"], ones);
    let mut orig = orig;
    orig["model"]["@variables"]["out_std"]["value"] = ones;
    assert!(orig["model"] == ours["model"], "model sections differ");
    let orig_text = std::fs::read_to_string(dir.join("model.yaml"))
        .unwrap()
        .replace("0.5712937217877426", "1.0");
    let section = &orig_text[..orig_text.find("\nsoftware:").unwrap() + 1];
    assert!(std::fs::read_to_string(&out).unwrap().contains(section));

    // The top level says who wrote it and how to rebuild the model in DeePMD-kit.
    for key in provenance {
        assert!(ours.get(key).is_some(), "{key}");
    }
    let def = &ours["model_def_script"];
    assert_eq!(def["descriptor"]["type"], Value::from("se_e2_a"));
    assert_eq!(def["type_map"], orig["model"]["type_map"]);
}

/// Every mapping key path; list items share one path (`networks[]`), values are not compared.
/// The `model` sections of two `.yaml` files have the same key paths.
fn assert_same_model_keys(case: &str, orig: &Value, ours: &Value) {
    let (mut ko, mut kw) = (BTreeSet::new(), BTreeSet::new());
    key_paths(&orig["model"], "model", &mut ko);
    key_paths(&ours["model"], "model", &mut kw);
    let missing: Vec<_> = ko.difference(&kw).collect();
    let extra: Vec<_> = kw.difference(&ko).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{case}: missing {missing:?}, extra {extra:?}"
    );
}

fn key_paths(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                let p = format!("{path}.{}", k.as_str().unwrap());
                out.insert(p.clone());
                key_paths(v, &p, out);
            }
        }
        Value::Sequence(s) => s
            .iter()
            .for_each(|v| key_paths(v, &format!("{path}[]"), out)),
        _ => {}
    }
}

fn two_sided_spec() -> ModelSpec {
    ModelSpec {
        short_range: None,
        linear: None,
        type_map: vec!["O".into(), "H".into(), "No".into()],
        descriptor: DescriptorSpec {
            kind: Default::default(),
            rcut: 5.25,
            rcut_smth: 0.1,
            sel: vec![7, 12, 3],
            neuron: vec![4, 8, 16],
            axis_neuron: 3,
            resnet_dt: true,
            type_one_side: false,
            env_protection: 1e-7,
            set_davg_zero: true,
            own: dpw::model::OwnKeys::Se,
        },
        fitting: FittingSpec::new(vec![10, 20, 20], true),
    }
}

#[test]
fn two_sided_model_round_trips_bit_exactly() {
    let mut m = Model::new(two_sided_spec(), 7);
    assert_eq!(m.layout().descriptor.embed.len(), 9);
    // Statistics that exercise the float printer: tiny, huge, negative zero, many digits.
    m.davg = vec![
        0.1,
        -0.0,
        1e-5,
        3e-300,
        1.5e16,
        -2.5e-8,
        0.3,
        1.0 / 3.0,
        5e-324,
        7.0,
        1e22,
        -1e-7,
    ];
    m.dstd = (0..12)
        .map(|i| 1.0 + i as f64 * 0.123456789012345)
        .collect();
    m.bias = vec![-93.5734023030599, -187.1468046061198, 0.0];
    // Half the parameters as arbitrary finite bit patterns (all exponents, subnormals included).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (i, p) in m.params.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = f64::from_bits(state ^ (state >> 29) ^ i as u64);
        *p = if x.is_finite() { x } else { -0.0 };
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.yaml");
    write_deepmd_yaml(&m, &out).unwrap();
    let back = read_deepmd_yaml(&out).unwrap();
    assert_same(&back, &m);

    // Writing again over an existing file works and leaves no temporary behind.
    write_deepmd_yaml(&back, &out).unwrap();
    let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(names.len(), 1);

    let text = std::fs::read_to_string(&out).unwrap();
    // PyYAML reads `1e-05` as a string: exponents carry a dot and a sign. `No` must be quoted.
    assert!(text.contains("- 1.0e-05\n"));
    assert!(text.contains("- 3.0e-300\n"));
    assert!(text.contains("- 1.5e+16\n"));
    assert!(text.contains("- 'No'\n"));
    let tree = parse(&out);
    // 1 whatever the data: DeePMD-kit's TF model multiplies the fitted energies by out_std.
    let ones: Value = serde_yaml_ng::from_str("[[[1.0], [1.0], [1.0]]]").unwrap();
    assert_eq!(tree["model"]["@variables"]["out_std"]["value"], ones);
    let emb = &tree["model"]["descriptor"]["embeddings"];
    assert_eq!(emb["ndim"], Value::from(2));
    assert_eq!(emb["networks"].as_sequence().unwrap().len(), 9);
    // Integers stay integers.
    assert_eq!(tree["model"]["descriptor"]["sel"][1], Value::from(12u64));
    assert!(tree["model"]["fitting"]["dim_descrpt"].is_u64());
}

#[test]
fn embedding_nets_are_ordered_like_networkcollection() {
    // (centre ti, neighbour tj) is network ti + tj*nt in DeePMD's collection; the layout names
    // net k `embed.c{k % nt}_n{k / nt}`. Check that the file's k-th network is the layout's.
    let m = Model::new(two_sided_spec(), 3);
    let layout = m.layout();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.yaml");
    write_deepmd_yaml(&m, &out).unwrap();
    let tree = parse(&out);
    let nets = tree["model"]["descriptor"]["embeddings"]["networks"]
        .as_sequence()
        .unwrap();
    for (ti, tj) in [(0, 1), (2, 0), (1, 2)] {
        let k = dpw::model::embed_net_index(false, 3, ti, tj);
        assert_eq!(k, ti + tj * 3);
        let t = layout
            .tensor(&format!("embed.c{ti}_n{tj}.layer0.w"))
            .unwrap();
        let w = nets[k]["layers"][0]["@variables"]["w"]["value"][0]
            .as_sequence()
            .unwrap();
        for (c, v) in w.iter().enumerate() {
            assert_eq!(v.as_f64().unwrap(), m.params[t.offset + c]);
        }
    }
}

fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "fixture lacks {from:?}");
    text.replacen(from, to, 1)
}

fn read_err(text: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("bad.yaml");
    std::fs::write(&p, text).unwrap();
    format!("{:#}", read_deepmd_yaml(&p).unwrap_err())
}

#[test]
fn bad_files_name_the_culprit() {
    let m = Model::new(two_sided_spec(), 1);
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("good.yaml");
    write_deepmd_yaml(&m, &p).unwrap();
    let good = std::fs::read_to_string(&p).unwrap();

    let e = read_err("model:\n  descriptor: [1, 2\n");
    assert!(e.contains("not valid YAML"), "{e}");

    let e = read_err(&edit(&good, "type: se_e2_a", "type: se_a_mask"));
    assert!(
        e.contains("model.descriptor.type: unsupported value \"se_a_mask\""),
        "{e}"
    );
    // se_atten is read, and an se_e2_a section lacks its keys.
    let e = read_err(&edit(&good, "type: se_e2_a", "type: se_atten"));
    assert!(
        e.contains("model.descriptor: missing key `tebd_input_mode`"),
        "{e}"
    );

    // A zbl model is a list of models, not a descriptor and a fitting.
    let e = read_err(&edit(&good, "type: standard", "type: zbl"));
    assert!(e.contains("model: unknown key descriptor"), "{e}");

    // Frame parameters are read: they widen the fitting net's input, which the file's weights
    // then do not match.
    let e = read_err(&edit(&good, "numb_fparam: 0", "numb_fparam: 2"));
    assert!(
        e.contains("model.fitting.nets") && e.contains("expected shape"),
        "{e}"
    );
    let e = read_err(&edit(
        &good,
        "use_aparam_as_mask: false",
        "use_aparam_as_mask: true",
    ));
    assert!(
        e.contains("model.fitting.use_aparam_as_mask: unsupported"),
        "{e}"
    );

    let e = read_err(&edit(
        &good,
        "exclude_types: []",
        "exclude_types:\n    - - 0\n      - 1",
    ));
    assert!(e.contains("exclude_types: unsupported"), "{e}");

    // A wrong weight shape: declare sel so that the layout expects other widths than the file.
    let mut other = two_sided_spec();
    other.descriptor.neuron = vec![4, 8, 12];
    let q = tmp.path().join("other.yaml");
    write_deepmd_yaml(&Model::new(other, 1), &q).unwrap();
    let text = std::fs::read_to_string(&q).unwrap();
    let fixed = text.replace(
        "    neuron:\n    - 4\n    - 8\n    - 12\n",
        "    neuron:\n    - 4\n    - 8\n    - 16\n",
    );
    assert_ne!(fixed, text);
    let e = read_err(&fixed);
    assert!(
        e.contains("model.descriptor.embeddings.networks[0].layers[2].@variables.w: expected shape [8, 16], found [8, 12]"),
        "{e}"
    );
    // A net with more layers than neuron says.
    let fewer = text.replace(
        "    neuron:\n    - 4\n    - 8\n    - 12\n",
        "    neuron:\n    - 4\n    - 8\n",
    );
    assert_ne!(fewer, text);
    let e = read_err(&fewer);
    assert!(
        e.contains("model.descriptor.embeddings.networks[0].layers: expected 2 layers, found 3"),
        "{e}"
    );

    // A ragged nested list.
    let tree: Value = serde_yaml_ng::from_str(&good).unwrap();
    let mut tree = tree;
    let b = &mut tree["model"]["fitting"]["nets"]["networks"][1]["layers"][0]["@variables"]["w"]
        ["value"][2];
    b.as_sequence_mut().unwrap().pop();
    let e = read_err(&serde_yaml_ng::to_string(&tree).unwrap());
    assert!(
        e.contains("model.fitting.nets.networks[1].layers[0].@variables.w.value[2]: ragged"),
        "{e}"
    );

    // davg rows that differ within a type cannot be stored in dpw.
    let mut tree: Value = serde_yaml_ng::from_str(&good).unwrap();
    tree["model"]["descriptor"]["@variables"]["davg"]["value"][1][3][0] = Value::from(0.5);
    let e = read_err(&serde_yaml_ng::to_string(&tree).unwrap());
    assert!(
        e.contains("model.descriptor.@variables.davg: rows of type 1 differ"),
        "{e}"
    );

    // A missing key.
    let mut tree: Value = serde_yaml_ng::from_str(&good).unwrap();
    tree["model"]["descriptor"]
        .as_mapping_mut()
        .unwrap()
        .remove("axis_neuron");
    let e = read_err(&serde_yaml_ng::to_string(&tree).unwrap());
    assert!(
        e.contains("model.descriptor: missing key `axis_neuron`"),
        "{e}"
    );
}

/// A descriptor's models DeePMD-kit 3.2.0 wrote (`tests/reference/descriptors/<case>`): dpw
/// reads them, writes them back with the same key paths and the same descriptor section, and
/// reads its own file back unchanged. Returns the model and dpw's `model_def_script` descriptor.
fn round_trips_in_deepmd_form(case: &str, kind: DescriptorType) -> (Model, Value) {
    let path = repo(&format!("tests/reference/descriptors/{case}/model.yaml"));
    let m = read_deepmd_yaml(&path).unwrap();
    assert_eq!(m.spec.descriptor.kind, kind);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.yaml");
    write_deepmd_yaml(&m, &out).unwrap();
    assert_same(&read_deepmd_yaml(&out).unwrap(), &m);
    let (orig, ours) = (parse(&path), parse(&out));
    assert_same_model_keys(case, &orig, &ours);
    let (d0, d1) = (&orig["model"]["descriptor"], &ours["model"]["descriptor"]);
    assert!(d0 == d1, "{case}: descriptor sections differ");
    (m, ours["model_def_script"]["descriptor"].clone())
}

/// se_e2_r: DeePMD-kit's form is type "se_r", davg/dstd of the radial column alone, no
/// axis_neuron.
#[test]
fn se_e2_r_models_round_trip_in_deepmd_form() {
    for case in ["se_e2_r_water", "se_e2_r_alloy"] {
        let (_, def) = round_trips_in_deepmd_form(case, DescriptorType::SeE2R);
        assert_eq!(def["type"], Value::from("se_e2_r"));
        assert!(def.get("axis_neuron").is_none());
    }
}

/// se_e3: DeePMD-kit writes one net per (ti, tj), zeros where ti > tj (dpw leaves those out),
/// type "se_e3", no axis_neuron, type_one_side or spin.
#[test]
fn se_e3_models_round_trip_in_deepmd_form() {
    for case in ["se_e3_water", "se_e3_alloy"] {
        let (m, def) = round_trips_in_deepmd_form(case, DescriptorType::SeE3);
        let nt = m.spec.ntypes();
        assert_eq!(m.layout().descriptor.embed.len(), nt * (nt + 1) / 2);
        assert_eq!(def["type"], Value::from("se_e3"));
        assert!(def.get("axis_neuron").is_none() && def.get("type_one_side").is_none());
    }
}

/// hybrid: DeePMD-kit writes `{type: hybrid, list: [...]}`, each sub-descriptor in its own form;
/// dpw's nets of sub-descriptor k are named `d{k}.`.
#[test]
fn hybrid_models_round_trip_in_deepmd_form() {
    for (case, second) in [("hybrid_water", "se_e2_r"), ("hybrid_alloy", "se_e3")] {
        let (m, def) = round_trips_in_deepmd_form(case, DescriptorType::Hybrid);
        assert_eq!(m.spec.descriptor.own.list().len(), 2);
        assert!(m.layout().tensor("d1.embed.t0_t0.layer0.w").is_some() || second == "se_e2_r");
        assert!(m.layout().tensor("d0.embed.t0.layer0.w").is_some() || second == "se_e3");
        assert_eq!(def["type"], Value::from("hybrid"));
        assert_eq!(def["list"][0]["type"], Value::from("se_e2_a"));
        assert_eq!(def["list"][1]["type"], Value::from(second));
    }
}

/// The array at a `/`-separated path of a parsed DeePMD-kit file (list items as numbers),
/// flattened.
fn yaml_array(v: &Value, path: &str) -> Vec<f64> {
    let mut at = v;
    for k in path.split('/') {
        at = match k.parse::<usize>() {
            Ok(i) => &at[i],
            Err(_) => &at[k],
        };
    }
    fn flat(v: &Value, out: &mut Vec<f64>) {
        match v {
            Value::Sequence(s) => s.iter().for_each(|x| flat(x, out)),
            x => out.push(x.as_f64().expect("a number")),
        }
    }
    let mut out = Vec::new();
    flat(&at["value"], &mut out);
    out
}

/// Where DeePMD-kit 3.2.0's DPA-1 file keeps the tensor dpw names `name`.
fn dpa1_path(name: &str) -> String {
    let d = "model/descriptor";
    let parts: Vec<&str> = name.split('.').collect();
    let layer = |l: &str| l.trim_start_matches("layer").to_string();
    match parts[..] {
        ["tebd", "layer0", x] => format!("{d}/type_embedding/embedding/layers/0/@variables/{x}"),
        ["embed", l, x] => format!(
            "{d}/embeddings/networks/0/layers/{}/@variables/{x}",
            layer(l)
        ),
        ["embed_strip", l, x] => {
            format!(
                "{d}/embeddings_strip/networks/0/layers/{}/@variables/{x}",
                layer(l)
            )
        }
        ["fit", l, x] => format!(
            "model/fitting/nets/networks/0/layers/{}/@variables/{x}",
            layer(l)
        ),
        [k, p, x] if k.starts_with("attn") => {
            let k = &k["attn".len()..];
            let inner = match p {
                "in" => "attention_layer/in_proj/@variables",
                "out" => "attention_layer/out_proj/@variables",
                _ => "attn_layer_norm/@variables",
            };
            format!("{d}/attention_layers/attention_layers/{k}/{inner}/{x}")
        }
        _ => panic!("unexpected tensor {name}"),
    }
}

/// DPA-1 (DeePMD-kit writes se_atten as `type: dpa1`, se_atten_v2 as itself): every tensor
/// dpw reads is the file's by name, davg/dstd are its rows, and the file dpw writes back reads
/// the same, with DeePMD-kit's key paths and the same values everywhere but the statistics'
/// storage and the provenance.
#[test]
fn dpa1_models_round_trip_in_deepmd_form() {
    for (case, kind, tag) in [
        ("se_atten_l0_water", DescriptorType::SeAtten, "dpa1"),
        ("se_atten_l2_alloy", DescriptorType::SeAtten, "dpa1"),
        (
            "se_atten_v2_alloy",
            DescriptorType::SeAttenV2,
            "se_atten_v2",
        ),
        ("se_atten_l2_opts_water", DescriptorType::SeAtten, "dpa1"),
    ] {
        let path = repo(&format!("tests/reference/dpa1/{case}/model.yaml"));
        let m = read_deepmd_yaml(&path).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert_eq!(m.spec.descriptor.kind, kind);
        let orig = parse(&path);
        assert_eq!(orig["model"]["descriptor"]["type"], Value::from(tag));
        for t in m.layout().tensors {
            let want = yaml_array(&orig, &dpa1_path(&t.name));
            assert_eq!(
                bits(&m.params[t.offset..t.offset + t.len()]),
                bits(&want),
                "{case}: {}",
                t.name
            );
        }
        // davg/dstd: DeePMD-kit's `[ntypes][nnei][4]`, dpw's row of slot 0 per type.
        let (nt, nnei) = (m.spec.ntypes(), m.spec.descriptor.nnei());
        for (name, ours) in [("davg", &m.davg), ("dstd", &m.dstd)] {
            let all = yaml_array(&orig, &format!("model/descriptor/@variables/{name}"));
            assert_eq!(all.len(), nt * nnei * 4);
            let rows: Vec<f64> = (0..nt)
                .flat_map(|t| all[t * nnei * 4..][..4].to_vec())
                .collect();
            assert_eq!(bits(ours), bits(&rows), "{case}: {name}");
        }

        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m.yaml");
        write_deepmd_yaml(&m, &out).unwrap();
        assert_same(&read_deepmd_yaml(&out).unwrap(), &m);
        let ours = parse(&out);
        assert_same_model_keys(case, &orig, &ours);
        // The descriptor and fitting sections are DeePMD-kit's, values included (davg/dstd as
        // DeePMD-kit's equal rows, bias_atom_e folded into out_bias: both zero here).
        let (d0, d1) = (&orig["model"]["descriptor"], &ours["model"]["descriptor"]);
        assert!(d0 == d1, "{case}: descriptor sections differ");
        // atom_ener: DeePMD-kit writes the input's (absent: null here), dpw `[]`; both none.
        let no_atom_ener = |v: &Value| {
            let mut v = v.clone();
            v.as_mapping_mut().unwrap().remove("atom_ener");
            v
        };
        let (f0, f1) = (&orig["model"]["fitting"], &ours["model"]["fitting"]);
        assert!(
            no_atom_ener(f0) == no_atom_ener(f1),
            "{case}: fitting sections differ"
        );
        let def = &ours["model_def_script"]["descriptor"];
        let input_type = if kind == DescriptorType::SeAttenV2 {
            "se_atten_v2"
        } else {
            "se_atten"
        };
        assert_eq!(def["type"], Value::from(input_type));
    }
}

/// DeePMD-kit keeps davg/dstd per slot; dpw one row per type: a DPA-1 file whose rows differ
/// across slots is refused, naming the file and the array.
#[test]
fn dpa1_unequal_statistics_rows_are_refused() {
    let path = repo("tests/reference/dpa1/se_atten_l2_alloy/model.yaml");
    let mut v = parse(&path);
    let row = &mut v["model"]["descriptor"]["@variables"]["dstd"]["value"][1][7][0];
    *row = Value::from(0.5);
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, serde_yaml_ng::to_string(&v).unwrap()).unwrap();
    let e = format!("{:#}", read_deepmd_yaml(&bad).unwrap_err());
    assert!(e.contains("bad.yaml"), "{e}");
    assert!(
        e.contains("model.descriptor.@variables.dstd") && e.contains("type 1"),
        "{e}"
    );
}

/// `path` read from `text` written to a temporary `.yaml`: the model or the error in full.
fn read_text(text: &str) -> Result<Model, String> {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.yaml");
    std::fs::write(&p, text).unwrap();
    read_deepmd_yaml(&p).map_err(|e| format!("{e:#}"))
}

/// Issue 59 (minor): what DeePMD-kit 3.2.0's deserialisers refuse, dpw refuses: an unknown key
/// in any node it reads (a constructor's TypeError there), a format `@version` beyond the one
/// DeePMD-kit reads, `tot_ener_zero: true` (NotImplementedError), and a fitting or descriptor
/// whose own type_map is not the model's.
#[test]
fn yaml_models_deepmd_kit_refuses_are_refused() {
    let m = Model::new(two_sided_spec(), 1);
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("good.yaml");
    write_deepmd_yaml(&m, &p).unwrap();
    let good: Value = parse(&p);
    assert_same(
        &read_text(&serde_yaml_ng::to_string(&good).unwrap()).unwrap(),
        &m,
    );
    let edited = |path: &[&str], key: &str, v: Value| {
        let mut tree = good.clone();
        let mut node = &mut tree;
        for k in path {
            node = match k.parse::<usize>() {
                Ok(i) => &mut node[i],
                Err(_) => &mut node[*k],
            };
        }
        node.as_mapping_mut().unwrap().insert(Value::from(key), v);
        read_text(&serde_yaml_ng::to_string(&tree).unwrap()).unwrap_err()
    };
    let fitting_layer = ["model", "fitting", "nets", "networks", "0", "layers", "1"];
    for (path, what) in [
        (&["model"][..], "model"),
        (&["model", "descriptor"][..], "model.descriptor"),
        (&["model", "fitting"][..], "model.fitting"),
        (
            &["model", "fitting", "@variables"][..],
            "model.fitting.@variables",
        ),
        (
            &["model", "descriptor", "embeddings"][..],
            "model.descriptor.embeddings",
        ),
        (
            &fitting_layer[..],
            "model.fitting.nets.networks[0].layers[1]",
        ),
    ] {
        let e = edited(path, "frobnicate", Value::from(1));
        assert!(
            e.contains(&format!("{what}: unknown key frobnicate")),
            "{what}: {e}"
        );
        let e = edited(path, "@version", Value::from(99));
        let refused = e.contains(&format!("{what}.@version: version 99 is not supported"));
        // @variables has no version of its own; its unknown key is enough there.
        assert!(refused || what.ends_with("@variables"), "{what}: {e}");
    }
    let e = edited(&["model", "fitting"], "tot_ener_zero", Value::from(true));
    assert!(
        e.contains("model.fitting.tot_ener_zero: unsupported value true"),
        "{e}"
    );
    let other_map: Value = serde_yaml_ng::from_str("[H, O, 'No']").unwrap();
    for what in ["fitting", "descriptor"] {
        let e = edited(&["model", what], "type_map", other_map.clone());
        assert!(
            e.contains(&format!("model.{what}.type_map: [\"H\", \"O\", \"No\"] differs from the model's type_map [\"O\", \"H\", \"No\"]")),
            "{e}"
        );
    }
    // The model's own version is required to be 2, as DeePMD-kit's DPAtomicModel requires it.
    let mut tree = good.clone();
    tree["model"].as_mapping_mut().unwrap().remove("@version");
    let e = read_text(&serde_yaml_ng::to_string(&tree).unwrap()).unwrap_err();
    assert!(
        e.contains("model.@version: version 1 is not supported"),
        "{e}"
    );
}

/// Issue 59 (minor): a UTF-8 byte-order mark is read past (PyYAML does); a file cut short is
/// said to be truncated, with its last line; a training input in YAML is named as such.
#[test]
fn yaml_bom_truncation_and_training_inputs() {
    let m = Model::new(two_sided_spec(), 1);
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("good.yaml");
    write_deepmd_yaml(&m, &p).unwrap();
    let good = std::fs::read_to_string(&p).unwrap();
    assert_same(&read_text(&format!("\u{feff}{good}")).unwrap(), &m);

    // Cut at a line end inside the fitting (valid YAML, keys lost) and inside a line.
    let at = good.find("  fitting:\n").unwrap() + 400;
    let line_end = at + good[at..].find('\n').unwrap() + 1;
    for cut in [line_end, at] {
        let lines = good[..cut].lines().count();
        let e = read_text(&good[..cut]).unwrap_err();
        assert!(
            e.contains(&format!(
                "the file is truncated or incomplete: it ends at line {lines}"
            )),
            "{e}"
        );
    }

    let input = common::tiny_water_input(serde_json::json!(["data"]), 1);
    let e = read_text(&serde_yaml_ng::to_string(&input).unwrap()).unwrap_err();
    assert!(
        e.contains("is a training input (it has `training`), not a model"),
        "{e}"
    );
}

/// Issue 59, defect 9: models that differ in their descriptor type differ by that, said once,
/// whatever their other keys (an se_e2_a input against an se_atten checkpoint whose other keys
/// agreed gave an empty list); keys no input.json sets still give a non-empty one.
#[test]
fn model_differences_name_the_descriptor_type() {
    let mut mine = two_sided_spec();
    mine.type_map.truncate(1);
    mine.descriptor.sel = vec![22];
    let mut theirs = mine.clone();
    theirs.descriptor.kind = DescriptorType::SeAtten;
    theirs.descriptor.own = dpw::model::OwnKeys::Attention(dpw::model::AttentionConfig {
        tebd_dim: 8,
        tebd_input_mode: dpw::model::TebdInputMode::Concat,
        attn: 16,
        attn_layer: 0,
        attn_dotr: true,
        scaling_factor: 1.0,
        normalize: true,
        temperature: None,
        trainable_ln: true,
        ln_eps: 1e-5,
        smooth_type_embedding: false,
        concat_output_tebd: true,
        use_tebd_bias: false,
    });
    assert_eq!(
        mine.differences(&theirs, "input.json", "the --restart checkpoint"),
        [
            "model.descriptor.type: \"se_e2_a\" in input.json, \"se_atten\" in the --restart \
          checkpoint"
        ]
    );
    let mut r = mine.clone();
    r.descriptor.kind = DescriptorType::SeE2R;
    r.descriptor.axis_neuron = 1;
    let mut r2 = r.clone();
    r2.descriptor.neuron = vec![4, 8];
    assert_eq!(
        r.differences(&r2, "input.json", "m.yaml"),
        ["model.descriptor.neuron: [4,8,16] in input.json, [4,8] in m.yaml"]
    );
    // se_e2_r's axis_neuron is no key of input.json: a crafted difference there is still shown.
    r2.descriptor = r.descriptor.clone();
    r2.descriptor.axis_neuron = 2;
    let d = r.differences(&r2, "input.json", "m.yaml");
    assert!(
        d.len() == 1 && d[0].starts_with("keys that input.json does not set"),
        "{d:?}"
    );
}

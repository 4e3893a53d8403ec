//! A training step with virial labels against DeePMD-kit 3.2.0 (TensorFlow backend):
//! `tests/reference/virial_step/`, made by `scripts/make-reference/virial_step.py` on two frames
//! of `tests/data/water_virial` (2 types) and of the alloy example (3 types), both with
//! `type_one_side: false`, at half the starting lr so that every prefactor is interpolated; the
//! full loss, and the virial term alone (whose share of the full gradient is small).

use std::path::PathBuf;

use serde_json::Value;

use dpw::backend::Backend;
use dpw::data::load_system;
use dpw::model::{DescriptorSpec, FittingSpec, Model, ModelSpec};
use dpw::train::batch::Frame;
use dpw::train::loss::Loss;
use dpw::train::predict::loss_and_grad;

use crate::common::*;

fn reference_dir() -> PathBuf {
    repo("tests/reference/virial_step")
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

/// The case's model, from its meta data and the `param.*` tensors of its npz.
fn model(meta: &Value, z: &mut ndarray_npy::NpzReader<std::fs::File>) -> Model {
    let d = &meta["descriptor"];
    let type_map = json_strings(&meta["type_map"]);
    let nt = type_map.len();
    let spec = ModelSpec {
        short_range: None,
        linear: None,
        type_map,
        descriptor: DescriptorSpec {
            kind: Default::default(),
            rcut: f(&d["rcut"]),
            rcut_smth: f(&d["rcut_smth"]),
            sel: usizes(&d["sel"]),
            neuron: usizes(&d["neuron"]),
            axis_neuron: d["axis_neuron"].as_u64().unwrap() as usize,
            resnet_dt: d["resnet_dt"].as_bool().unwrap(),
            type_one_side: d["type_one_side"].as_bool().unwrap(),
            env_protection: 0.0,
            set_davg_zero: false,
            own: dpw::model::OwnKeys::Se,
        },
        fitting: FittingSpec::new(
            usizes(&meta["fitting"]["neuron"]),
            meta["fitting"]["resnet_dt"].as_bool().unwrap(),
        ),
    };
    let mut m = Model::new(spec, 0);
    let layout = m.layout();
    for t in &layout.tensors {
        let a = npz_array(z, &format!("param.{}", t.name));
        assert_eq!(a.len(), t.len(), "{}", t.name);
        m.params[t.offset..t.offset + t.len()].copy_from_slice(a.as_slice().unwrap());
    }
    let (davg, dstd) = (npz_array(z, "davg"), npz_array(z, "dstd"));
    for t in 0..nt {
        for k in 0..4 {
            m.davg[4 * t + k] = davg[[t, k]];
            m.dstd[4 * t + k] = dstd[[t, k]];
        }
    }
    m.bias = npz_array(z, "out_bias").iter().copied().collect();
    m
}

fn case<B: Backend<f64>>(b: &B, name: &str) {
    let dir = reference_dir();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    let sys_path = repo(meta["system"].as_str().unwrap());
    let mut z = npz(&dir.join(format!("{name}.npz")));
    let model = model(&meta, &mut z);
    let sys = load_system(&sys_path, &model.spec.type_map).unwrap();
    assert!(sys.virial.is_some(), "{name}: the system has virial labels");
    let frames: Vec<Frame> = usizes(&meta["frames"])
        .iter()
        .map(|&i| Frame::of(&sys, i))
        .collect();
    let start_lr = f(&meta["start_lr"]);
    let lr = f(&meta["lr"]);
    for (cfg_key, key, grad_prefix) in [
        ("loss", "loss_value_at_start_lr", None),
        ("loss", "loss_value", Some("grad")),
        ("loss_virial_only", "loss_value_virial_only", Some("vgrad")),
    ] {
        let lr = if key == "loss_value_at_start_lr" {
            start_lr
        } else {
            lr
        };
        let l = &meta[cfg_key];
        let cfg = super::descriptors::loss_config(l);
        let loss = Loss::new(&cfg, start_lr, &model.spec.fitting.output);
        let p = loss.prefactors(lr, sys.natoms, true);
        let (sums, grad, pred) = loss_and_grad(b, &model, &sys.atype, &frames, p.op).unwrap();
        let mine = loss
            .metrics(&sums.values(), frames.len(), sys.natoms, &p)
            .get("rmse")
            .unwrap()
            .powi(2);
        let want = f(&meta[key]);
        let rl = (mine - want).abs() / want;
        let wv: Vec<f64> = meta["virial"].as_array().unwrap().iter().map(f).collect();
        let dv = max_abs_diff(&pred.virial, &wv);
        eprintln!("{name}, {key} (lr {lr:e}): {mine} vs DeePMD-kit {want} (rel {rl:.1e}); virial max |Δ| {dv:.1e}");
        assert!(dv < 1e-9, "{name}: virial off by {dv}");
        assert!(rl < 1e-7, "{name}: {key} off by {rl:e} relative");
        let Some(prefix) = grad_prefix else {
            continue;
        };
        let worst = super::descriptors::worst_tensor(&model, &grad, &mut z, prefix);
        eprintln!(
            "{name}, {key}: worst per-tensor relative gradient error {:.1e} ({})",
            worst.0, worst.1
        );
        assert!(
            worst.0 < 1e-7,
            "{name}: {prefix} of {} off by {:e}",
            worst.1,
            worst.0
        );
    }
}

pub fn training_gradients<B: Backend<f64>>(b: &B) {
    case(b, "water_virial");
    case(b, "alloy");
}

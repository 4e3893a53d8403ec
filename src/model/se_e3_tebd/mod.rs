//! se_e3_tebd (`"type": "se_e3_tebd"`, DeePMD-kit 3.2.0's `DescrptSeTTebd`): DPA-2's
//! three-body block alone on the model's list, with a type embedding of its own
//! (docs/deepmd-spec.md §20.4, §20.12). Its keys (`descrpt_se_e3_tebd_args`) beside the shared
//! ones of [`super::DescriptorSpec`] (rcut, rcut_smth, sel as one nnei, neuron, resnet_dt,
//! env_protection, set_davg_zero), their input.json form, and where its tensors live, named as
//! tests/reference/dpa2/se_e3_tebd_water's `grad.*` arrays. The math is
//! `backend/cpu/three_body.rs`.

pub(crate) mod input;
pub(super) mod yaml;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::layout::{untrained, Builder, DescriptorLayout, Net, OwnNets, TebdLayout};
use super::{pair_excluded, Activation, DescriptorSpec, TebdInputMode};

/// Its keys for the log.
pub(super) fn describe(d: &DescriptorSpec, head: String) -> String {
    let c = d.own.se_e3_tebd().expect("se_e3_tebd has its keys");
    format!(
        "{head} tebd_dim {} {}",
        c.tebd_dim,
        c.tebd_input_mode.as_str()
    )
}

/// [`SeE3TebdConfig::dim`] of its net's width.
pub(super) fn dim(d: &DescriptorSpec) -> usize {
    let c = d.own.se_e3_tebd().expect("se_e3_tebd has its keys");
    c.dim(d.m1())
}

/// Its layout: its block's tensors ([`SeE3TebdLayout`]), held fixed where it is not
/// `trainable`.
pub(super) fn layout(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout {
    let c = d.own.se_e3_tebd().expect("se_e3_tebd has its keys");
    let start = b.len();
    let l = SeE3TebdLayout::new(d, nt, b);
    let frozen = untrained(c.trainable, start, b);
    DescriptorLayout::own(OwnNets::SeE3Tebd(l), frozen)
}

/// se_e3_tebd's own keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeE3TebdConfig {
    pub tebd_dim: usize,
    pub tebd_input_mode: TebdInputMode,
    /// φ of its embedding nets (`activation_function`).
    pub activation: Activation,
    /// The strip type net's output scaled by the switches.
    pub smooth: bool,
    /// Pairs of types whose pairs are removed (both orders).
    pub exclude_types: Vec<[usize; 2]>,
    /// Append the centre's type embedding to D.
    pub concat_output_tebd: bool,
    pub use_tebd_bias: bool,
    /// false holds the whole descriptor fixed.
    pub trainable: bool,
}

/// The keys input.json shares with the other descriptors, where [`DescriptorSpec`] and
/// input.json's `DescriptorConfig` hold them.
pub struct Shared<'a> {
    /// As input.json gives it: a number, or `"auto[:factor]"`.
    pub sel: Value,
    pub rcut: f64,
    pub rcut_smth: f64,
    pub neuron: &'a [usize],
    pub resnet_dt: bool,
    pub set_davg_zero: bool,
    pub env_protection: f64,
}

impl<'a> From<&'a DescriptorSpec> for Shared<'a> {
    fn from(d: &'a DescriptorSpec) -> Self {
        Shared {
            sel: json!(d.sel[0]),
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            neuron: &d.neuron,
            resnet_dt: d.resnet_dt,
            set_davg_zero: d.set_davg_zero,
            env_protection: d.env_protection,
        }
    }
}

impl SeE3TebdConfig {
    /// Whether (t_i, t_j) is excluded.
    pub fn excludes(&self, ti: usize, tj: usize) -> bool {
        pair_excluded(&self.exclude_types, ti, tj)
    }

    /// D's width: M3 (the net's last width), then T with concat_output_tebd.
    pub fn dim(&self, m3: usize) -> usize {
        m3 + if self.concat_output_tebd {
            self.tebd_dim
        } else {
            0
        }
    }

    /// input.json's descriptor with every key but `seed`: what out.json (with the input's
    /// precision) and the `model_def_script` of a `.yaml` (float64, as dpw writes its files)
    /// hold.
    pub fn input_json(&self, s: &Shared, precision: &str) -> Value {
        json!({
            "type": "se_e3_tebd",
            "sel": s.sel,
            "rcut": s.rcut,
            "rcut_smth": s.rcut_smth,
            "neuron": s.neuron,
            "tebd_dim": self.tebd_dim,
            "tebd_input_mode": self.tebd_input_mode.as_str(),
            "resnet_dt": s.resnet_dt,
            "set_davg_zero": s.set_davg_zero,
            "activation_function": self.activation.name(),
            "env_protection": s.env_protection,
            "smooth": self.smooth,
            "exclude_types": self.exclude_types,
            "precision": precision,
            "trainable": self.trainable,
            "concat_output_tebd": self.concat_output_tebd,
            "use_econf_tebd": false,
            "use_tebd_bias": self.use_tebd_bias,
        })
    }
}

/// The three-body block's nets: `{name}` on [e_jk, T_j, T_k] (1 + 2T wide) for concat, on e_jk
/// alone with `{name}_strip` on [T_j, T_k] (2T) for strip; the hidden layers' φ `act`.
pub(super) fn three_body_nets(
    b: &mut Builder,
    name: &str,
    (tebd_dim, mode): (usize, TebdInputMode),
    neuron: &[usize],
    dt_act: (bool, Activation),
) -> (Net, Option<Net>) {
    let types = 2 * tebd_dim;
    match mode {
        TebdInputMode::Concat => (b.net(name.into(), 1 + types, neuron, dt_act, None), None),
        TebdInputMode::Strip => {
            let main = b.net(name.into(), 1, neuron, dt_act, None);
            let strip = b.net(format!("{name}_strip"), types, neuron, dt_act, None);
            (main, Some(strip))
        }
    }
}

/// Where se_e3_tebd's tensors live: `tebd.layer0.{w,b}`, `embed.layer{l}.*`,
/// `embed_strip.layer{l}.*` (tests/reference/dpa2/README.md).
#[derive(Clone, Debug, PartialEq)]
pub struct SeE3TebdLayout {
    pub tebd: TebdLayout,
    pub embed: Net,
    pub embed_strip: Option<Net>,
}

impl SeE3TebdLayout {
    pub(super) fn new(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> Self {
        let c = d.own.se_e3_tebd().expect("an se_e3_tebd spec");
        let tebd = b.tebd(nt, c.tebd_dim, c.use_tebd_bias);
        let mode = (c.tebd_dim, c.tebd_input_mode);
        let (embed, embed_strip) =
            three_body_nets(b, "embed", mode, &d.neuron, (d.resnet_dt, c.activation));
        SeE3TebdLayout {
            tebd,
            embed,
            embed_strip,
        }
    }
}

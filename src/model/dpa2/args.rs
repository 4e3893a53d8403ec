//! DPA-2's keys in DeePMD-kit's own form: `RepinitArgs.serialize()` and
//! `RepformerArgs.serialize()` have exactly input.json's `repinit` and `repformer` keys, so the
//! `.yaml` writer (`repinit_args`, `repformer_args`, the `model_def_script`) and out.json write
//! them from here.

use serde_json::{json, Value};

use super::Dpa2Config;
use crate::model::DescriptorSpec;

/// The repinit keys a descriptor's shared fields hold ([`DescriptorSpec`]'s and input.json's
/// `DescriptorConfig`'s).
pub struct RepinitShared<'a> {
    pub rcut: f64,
    pub rcut_smth: f64,
    pub nsel: usize,
    pub neuron: &'a [usize],
    pub axis_neuron: usize,
    pub type_one_side: bool,
    pub resnet_dt: bool,
    pub set_davg_zero: bool,
}

impl<'a> From<&'a DescriptorSpec> for RepinitShared<'a> {
    fn from(d: &'a DescriptorSpec) -> Self {
        RepinitShared {
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            nsel: d.sel[0],
            neuron: &d.neuron,
            axis_neuron: d.axis_neuron,
            type_one_side: d.type_one_side,
            resnet_dt: d.resnet_dt,
            set_davg_zero: d.set_davg_zero,
        }
    }
}

impl Dpa2Config {
    /// Every repinit key.
    pub fn repinit_json(&self, s: &RepinitShared) -> Value {
        let i = &self.repinit;
        json!({
            "rcut": s.rcut,
            "rcut_smth": s.rcut_smth,
            "nsel": s.nsel,
            "neuron": s.neuron,
            "axis_neuron": s.axis_neuron,
            "tebd_dim": i.tebd_dim,
            "tebd_input_mode": i.tebd_input_mode.as_str(),
            "set_davg_zero": s.set_davg_zero,
            "activation_function": i.activation.name(),
            "resnet_dt": s.resnet_dt,
            "type_one_side": s.type_one_side,
            "use_three_body": i.use_three_body,
            "three_body_neuron": i.three_body_neuron,
            "three_body_sel": i.three_body_sel,
            "three_body_rcut": i.three_body_rcut,
            "three_body_rcut_smth": i.three_body_rcut_smth,
        })
    }

    /// Every repformer key, ln_eps as the number it stands for.
    pub fn repformer_json(&self) -> Value {
        let r = &self.repformer;
        json!({
            "rcut": r.rcut,
            "rcut_smth": r.rcut_smth,
            "nsel": r.nsel,
            "nlayers": r.nlayers,
            "g1_dim": r.g1_dim,
            "g2_dim": r.g2_dim,
            "axis_neuron": r.axis_neuron,
            "direct_dist": r.direct_dist,
            "update_g1_has_conv": r.update_g1_has_conv,
            "update_g1_has_drrd": r.update_g1_has_drrd,
            "update_g1_has_grrg": r.update_g1_has_grrg,
            "update_g1_has_attn": r.update_g1_has_attn,
            "update_g2_has_g1g1": r.update_g2_has_g1g1,
            "update_g2_has_attn": r.update_g2_has_attn,
            "update_h2": r.update_h2,
            "attn1_hidden": r.attn1_hidden,
            "attn1_nhead": r.attn1_nhead,
            "attn2_hidden": r.attn2_hidden,
            "attn2_nhead": r.attn2_nhead,
            "attn2_has_gate": r.attn2_has_gate,
            "activation_function": r.activation.name(),
            "update_style": r.update_style.as_str(),
            "update_residual": r.update_residual,
            "update_residual_init": if r.residual_norm { "norm" } else { "const" },
            "set_davg_zero": r.set_davg_zero,
            "trainable_ln": r.trainable_ln,
            "use_sqrt_nnei": r.use_sqrt_nnei,
            "g1_out_conv": r.g1_out_conv,
            "g1_out_mlp": r.g1_out_mlp,
            "ln_eps": r.ln_eps,
        })
    }

    /// input.json's descriptor (`type: dpa2`) with every key but `seed`: what out.json (with
    /// the input's precision) and the `model_def_script` of a `.yaml` (float64, as dpw writes
    /// its files) hold.
    pub fn input_json(&self, s: &RepinitShared, precision: &str, env_protection: f64) -> Value {
        json!({
            "type": "dpa2",
            "repinit": self.repinit_json(s),
            "repformer": self.repformer_json(),
            "concat_output_tebd": self.concat_output_tebd,
            "precision": precision,
            "smooth": self.smooth,
            "exclude_types": self.exclude_types,
            "env_protection": env_protection,
            "trainable": self.trainable,
            "add_tebd_to_repinit_out": self.add_tebd_to_repinit_out,
            "use_econf_tebd": false,
            "use_tebd_bias": self.use_tebd_bias,
        })
    }
}

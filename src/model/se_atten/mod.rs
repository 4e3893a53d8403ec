//! DPA-1 (`"type": "se_atten"` or `"dpa1"`, and `"se_atten_v2"`): its keys
//! ([`AttentionConfig`], beside the shared ones of [`super::DescriptorSpec`]), where its tensors
//! live ([`AttnLayout`]) and its `.yaml`. The math is `backend/cpu/attn.rs`.

pub(crate) mod input;
pub(super) mod yaml;

use serde::{Deserialize, Serialize};

use super::layout::{Builder, DescriptorLayout, Layer, Net, OwnNets, TebdLayout};
use super::{Activation, DescriptorSpec, TebdInputMode};

/// Its keys for the log.
pub(super) fn describe(d: &DescriptorSpec, head: String) -> String {
    let a = d.attn().expect("DPA-1 has its keys");
    format!(
        "{head} axis {} tebd_dim {} {} attn {} × {} layers{}{}",
        d.axis_neuron,
        a.tebd_dim,
        a.tebd_input_mode.as_str(),
        a.attn,
        a.attn_layer,
        if a.smooth_type_embedding {
            ", smooth"
        } else {
            ""
        },
        if d.type_one_side {
            ", type_one_side"
        } else {
            ""
        },
    )
}

/// se_e2_a's width, and with `concat_output_tebd` the centre's type embedding (tebd_dim)
/// after it.
pub(super) fn dim(d: &DescriptorSpec) -> usize {
    let a = d.attn().expect("DPA-1 has its keys");
    super::se::dim(d) + if a.concat_output_tebd { a.tebd_dim } else { 0 }
}

/// The keys se_atten and se_atten_v2 add to the common descriptor keys (DeePMD-kit 3.2.0's
/// `descrpt_se_atten_args`, `descrpt_se_atten_v2_args`), with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionConfig {
    /// Width of the type embedding (`tebd_dim`, 8).
    pub tebd_dim: usize,
    /// se_atten: `tebd_input_mode` ("concat") or the deprecated `stripped_type_embedding`;
    /// se_atten_v2: always strip.
    pub tebd_input_mode: TebdInputMode,
    /// Hidden width of the attention's queries, keys and values (`attn`, 128).
    pub attn: usize,
    /// Number of attention layers (`attn_layer`, 2; 0 = none).
    pub attn_layer: usize,
    /// Gate the attention weights by r̂_j·r̂_k (`attn_dotr`, true).
    pub attn_dotr: bool,
    /// The logits' scale is (attn·scaling_factor)^(−1/2) unless `temperature` is given.
    pub scaling_factor: f64,
    /// Normalise q, k, v to unit length (`normalize`, true).
    pub normalize: bool,
    /// The logits' scale itself, when given (`temperature`, null).
    pub temperature: Option<f64>,
    /// Layer norm with trainable scale and shift (`trainable_ln`, true); false keeps them at
    /// 1 and 0.
    pub trainable_ln: bool,
    /// The layer norm's ε (`ln_eps`; null means 1e-5, as DeePMD-kit's PyTorch and dpmodel).
    pub ln_eps: f64,
    /// se_atten: `smooth_type_embedding` (false); se_atten_v2: always true. Smooth attention
    /// (logits and weights scaled by the neighbours' switches) and, with strip, the type
    /// net's output scaled by the switch.
    pub smooth_type_embedding: bool,
    /// Append the centre's type embedding to the descriptor (`concat_output_tebd`, true).
    pub concat_output_tebd: bool,
    /// A bias in the type-embedding layer (`use_tebd_bias`, false).
    pub use_tebd_bias: bool,
}

/// DPA-1's nets beside [`DescriptorLayout::embed`] (which holds its one embedding net, `embed[0]`,
/// named `embed`, input width 1 + 2·tebd_dim for concat, 1 + tebd_dim with type_one_side, 1
/// for strip).
#[derive(Clone, Debug, PartialEq)]
pub struct AttnLayout {
    /// T = skip(I) + W (+ b): the type embedding, one linear layer over one-hot rows.
    pub tebd: TebdLayout,
    /// strip's type net N_t (`embed_strip`, input 2·tebd_dim, tebd_dim with type_one_side);
    /// None for concat.
    pub strip: Option<Net>,
    pub layers: Vec<AttnLayerLayout>,
}

/// One attention layer: in_proj `[M1][3·attn]` and out_proj `[attn][M1]` as linear `Layer`s
/// with bias, no skip, no idt (`act: Linear`, `skip: Skip::None`, `idt: None`), and the layer
/// norm's scale and shift `[M1]`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnLayerLayout {
    pub proj_in: Layer,
    pub proj_out: Layer,
    pub ln_w: usize,
    pub ln_b: usize,
}

/// DPA-1's layout (tensor order in the module's doc).
pub(super) fn layout(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout {
    let a = d.attn().expect("a DPA-1 spec has its attention keys");
    let tebd = b.tebd(nt, a.tebd_dim, a.use_tebd_bias);
    let (nin, strip_nin) = embed_inputs(d);
    let embed = vec![b.net(
        "embed".into(),
        nin,
        &d.neuron,
        (d.resnet_dt, Activation::Tanh),
        None,
    )];
    let strip = strip_nin.map(|n| {
        b.net(
            "embed_strip".into(),
            n,
            &d.neuron,
            (d.resnet_dt, Activation::Tanh),
            None,
        )
    });
    let m1 = d.m1();
    let mut frozen = Vec::new();
    let layers = (0..a.attn_layer)
        .map(|k| {
            let proj_in = b.linear(format!("attn{k}.in"), m1, 3 * a.attn);
            let proj_out = b.linear(format!("attn{k}.out"), a.attn, m1);
            let ln_w = b.alloc(format!("attn{k}.ln.w"), vec![m1]);
            let ln_b = b.alloc(format!("attn{k}.ln.b"), vec![m1]);
            if !a.trainable_ln {
                frozen.push(ln_w..ln_b + m1);
            }
            AttnLayerLayout {
                proj_in,
                proj_out,
                ln_w,
                ln_b,
            }
        })
        .collect();
    DescriptorLayout {
        embed,
        parts: std::iter::once(0..1).collect(),
        own: OwnNets::Attention(AttnLayout {
            tebd,
            strip,
            layers,
        }),
        frozen,
    }
}

/// DPA-1's embedding-net input widths: the net's (1 + 2·tebd_dim for concat, 1 + tebd_dim with
/// type_one_side, 1 for strip) and strip's type net's (2·tebd_dim, tebd_dim with type_one_side;
/// `None` for concat).
fn embed_inputs(d: &DescriptorSpec) -> (usize, Option<usize>) {
    let a = d.attn().expect("a DPA-1 spec has its attention keys");
    let types = if d.type_one_side {
        a.tebd_dim
    } else {
        2 * a.tebd_dim
    };
    match a.tebd_input_mode {
        TebdInputMode::Concat => (1 + types, None),
        TebdInputMode::Strip => (1, Some(types)),
    }
}

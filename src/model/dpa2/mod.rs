//! DPA-2 (`"type": "dpa2"`): its keys (DeePMD-kit 3.2.0's `descrpt_dpa2_args`,
//! `dpa2_repinit_args`, `dpa2_repformer_args`, docs/deepmd-spec.md §20.1) and where its tensors
//! live in the parameter vector, named as tests/reference/dpa2's `grad.*` arrays. The math is
//! `backend/cpu/repformer.rs`.

mod args;
pub(crate) mod input;
pub(super) mod yaml;

pub use args::RepinitShared;

use serde::{Deserialize, Serialize};

use super::dpa3::UpdateStyle;
use super::layout::{untrained, Builder, DescriptorLayout, Layer, Net, OwnNets, TebdLayout};
use super::se_e3_tebd::three_body_nets;
use super::Activation;
use super::DescriptorSpec;
use super::TebdInputMode;

/// Its keys for the log.
pub(super) fn describe(d: &DescriptorSpec, head: String) -> String {
    let c = d.own.dpa2().expect("DPA-2 has its keys");
    let r = &c.repformer;
    format!(
        "{head} axis {} tebd_dim {}{}; repformer rcut {} nsel {} {} layers g1 {} g2 {} {}",
        d.axis_neuron,
        c.repinit.tebd_dim,
        if c.repinit.use_three_body {
            ", three-body"
        } else {
            ""
        },
        r.rcut,
        r.nsel,
        r.nlayers,
        r.g1_dim,
        r.g2_dim,
        r.update_style.as_str(),
    )
}

/// [`Dpa2Config::dim`].
pub(super) fn dim(d: &DescriptorSpec) -> usize {
    d.own.dpa2().expect("DPA-2 has its keys").dim()
}

/// Its repinit's, repformer's and (with use_three_body) three-body block's statistics, each on
/// its own list (spec §20.8).
pub(super) fn stat_parts(d: &DescriptorSpec) -> Vec<DescriptorSpec> {
    let c = d.own.dpa2().expect("DPA-2 has its keys");
    let block = |rcut, rcut_smth, sel, set_davg_zero| DescriptorSpec {
        rcut,
        rcut_smth,
        sel: vec![sel],
        set_davg_zero,
        ..d.clone()
    };
    let (r, i) = (&c.repformer, &c.repinit);
    let mut v = vec![
        d.clone(),
        block(r.rcut, r.rcut_smth, r.nsel, r.set_davg_zero),
    ];
    if i.use_three_body {
        let (rc, rs) = (i.three_body_rcut, i.three_body_rcut_smth);
        v.push(block(rc, rs, i.three_body_sel, d.set_davg_zero));
    }
    v
}

/// Its layout: its blocks' tensors ([`Dpa2Layout`]), held fixed where it is not `trainable`.
pub(super) fn layout(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout {
    let c = d.own.dpa2().expect("DPA-2 has its keys");
    let start = b.len();
    let l = Dpa2Layout::new(
        c,
        &d.neuron,
        d.axis_neuron,
        d.type_one_side,
        d.resnet_dt,
        nt,
        b,
    );
    let frozen = untrained(c.trainable, start, b);
    DescriptorLayout::own(OwnNets::Dpa2(Box::new(l)), frozen)
}

/// The repinit keys that [`super::DescriptorSpec`] does not hold (it holds rcut, rcut_smth,
/// nsel as its one sel, neuron, axis_neuron, type_one_side, resnet_dt and set_davg_zero).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepinitConfig {
    pub tebd_dim: usize,
    pub tebd_input_mode: TebdInputMode,
    pub activation: Activation,
    pub use_three_body: bool,
    pub three_body_neuron: Vec<usize>,
    pub three_body_rcut: f64,
    pub three_body_rcut_smth: f64,
    pub three_body_sel: usize,
}

/// The repformer's keys (spec §20.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepformerConfig {
    pub rcut: f64,
    pub rcut_smth: f64,
    pub nsel: usize,
    pub nlayers: usize,
    pub g1_dim: usize,
    pub g2_dim: usize,
    pub axis_neuron: usize,
    pub direct_dist: bool,
    pub update_g1_has_conv: bool,
    pub update_g1_has_drrd: bool,
    pub update_g1_has_grrg: bool,
    pub update_g1_has_attn: bool,
    pub update_g2_has_g1g1: bool,
    pub update_g2_has_attn: bool,
    pub use_sqrt_nnei: bool,
    pub g1_out_conv: bool,
    pub g1_out_mlp: bool,
    pub update_h2: bool,
    pub attn1_hidden: usize,
    pub attn1_nhead: usize,
    pub attn2_hidden: usize,
    pub attn2_nhead: usize,
    pub attn2_has_gate: bool,
    pub activation: Activation,
    pub update_style: UpdateStyle,
    pub update_residual: f64,
    /// `update_residual_init`: "norm" (true) or "const".
    pub residual_norm: bool,
    pub set_davg_zero: bool,
    /// Without effect in `dp train` (spec §20.11): kept for the files.
    pub trainable_ln: bool,
    pub ln_eps: f64,
}

/// DPA-2's keys beside the shared ones of [`super::DescriptorSpec`] (the repinit's list and
/// embedding net).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dpa2Config {
    pub repinit: RepinitConfig,
    pub repformer: RepformerConfig,
    pub concat_output_tebd: bool,
    pub smooth: bool,
    /// Pairs of types whose pairs are removed (both orders), in every block.
    pub exclude_types: Vec<[usize; 2]>,
    pub add_tebd_to_repinit_out: bool,
    pub use_tebd_bias: bool,
    pub trainable: bool,
}

/// Which terms a layer has (spec §20.6-20.7): the last layer updates g1 alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerTerms {
    pub g1_mlp: bool,
    /// conv as its own term (g1_out_conv) or inside linear1.
    pub conv_term: bool,
    pub conv_in: bool,
    pub grrg: bool,
    pub drrd: bool,
    pub g1_attn: bool,
    /// `update_chnnl_2`: the g2 and h2 updates exist.
    pub chnnl_2: bool,
    pub g1g1: bool,
    pub g2_attn: bool,
    pub h2: bool,
}

impl LayerTerms {
    /// linear1's input width: [g1 (without the self-MLP), conv (without g1_out_conv), G(g2),
    /// G(gg1)].
    pub fn linear1_in(&self, r: &RepformerConfig) -> usize {
        let (g1, g2, a) = (r.g1_dim, r.g2_dim, r.axis_neuron);
        usize::from(!self.g1_mlp) * g1
            + usize::from(self.conv_in) * g2
            + usize::from(self.grrg) * a * g2
            + usize::from(self.drrd) * a * g1
    }

    /// The g1 terms: self-MLP, conv, linear1, local attention.
    pub fn g1_terms(&self) -> usize {
        usize::from(self.g1_mlp) + usize::from(self.conv_term) + 1 + usize::from(self.g1_attn)
    }

    /// The g2 terms: linear2, g1 ⊗ g1, attention (none in the last layer).
    pub fn g2_terms(&self) -> usize {
        if self.chnnl_2 {
            1 + usize::from(self.g1g1) + usize::from(self.g2_attn)
        } else {
            0
        }
    }

    /// Whether the layer has the g2 attention map (for the g2 attention or the h2 update).
    pub fn attn_map(&self) -> bool {
        self.g2_attn || self.h2
    }
}

impl RepformerConfig {
    /// Layer l's terms.
    pub fn terms(&self, l: usize) -> LayerTerms {
        let chnnl_2 = l + 1 < self.nlayers;
        LayerTerms {
            g1_mlp: self.g1_out_mlp,
            conv_term: self.update_g1_has_conv && self.g1_out_conv,
            conv_in: self.update_g1_has_conv && !self.g1_out_conv,
            grrg: self.update_g1_has_grrg,
            drrd: self.update_g1_has_drrd,
            g1_attn: self.update_g1_has_attn,
            chnnl_2,
            g1g1: chnnl_2 && self.update_g2_has_g1g1,
            g2_attn: chnnl_2 && self.update_g2_has_attn,
            h2: chnnl_2 && self.update_h2,
        }
    }
}

impl Dpa2Config {
    /// Whether (t_i, t_j) is excluded.
    pub fn excludes(&self, ti: usize, tj: usize) -> bool {
        super::pair_excluded(&self.exclude_types, ti, tj)
    }

    /// D's width: G1, then T with concat_output_tebd.
    pub fn dim(&self) -> usize {
        self.repformer.g1_dim
            + if self.concat_output_tebd {
                self.repinit.tebd_dim
            } else {
                0
            }
    }

    /// The repinit's output width M1·A1 (+ M3 with the three-body block).
    pub fn repinit_out(&self, m1: usize, a1: usize) -> usize {
        m1 * a1
            + if self.repinit.use_three_body {
                *self.repinit.three_body_neuron.last().unwrap_or(&0)
            } else {
                0
            }
    }

    /// DeePMD-kit's constraints (spec §20.1), given the repinit's rcut, nsel, neuron's last
    /// width and axis_neuron.
    pub fn check(&self, rcut: f64, nsel: usize, m1: usize, a1: usize) -> Result<(), String> {
        self.check_widths(rcut, m1, a1)?;
        self.check_lists(rcut, nsel)
    }

    /// The constraints on the lists' sizes, given the repinit's rcut and nsel (all known: an
    /// input's "auto" ones are checked once counted).
    pub fn check_lists(&self, rcut: f64, nsel: usize) -> Result<(), String> {
        let (r, i) = (&self.repformer, &self.repinit);
        let mut lists = vec![(rcut, nsel, "repinit"), (r.rcut, r.nsel, "repformer")];
        if i.use_three_body {
            lists.push((i.three_body_rcut, i.three_body_sel, "three-body"));
        }
        lists.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ordered = lists.windows(2).all(|w| w[0].1 <= w[1].1);
        first_failed([
            (
                nsel > r.nsel,
                format!("repinit nsel {nsel} must exceed the repformer's {}", r.nsel),
            ),
            (
                ordered,
                "rcut and sel are not in the same order: a larger cut-off needs a sel at least \
                 as large"
                    .to_string(),
            ),
        ])
    }

    /// The other constraints: cut-offs and widths, given the repinit's rcut, neuron's last width
    /// and axis_neuron.
    pub fn check_widths(&self, rcut: f64, m1: usize, a1: usize) -> Result<(), String> {
        let (r, i) = (&self.repformer, &self.repinit);
        first_failed([
            (
                rcut > r.rcut,
                format!("repinit rcut {rcut} must exceed the repformer's {}", r.rcut),
            ),
            (
                a1 <= m1,
                format!("repinit axis_neuron {a1} exceeds its neuron's last width {m1}"),
            ),
            (
                r.axis_neuron <= r.g1_dim.min(r.g2_dim),
                format!(
                    "repformer axis_neuron {} exceeds g1_dim {} or g2_dim {}",
                    r.axis_neuron, r.g1_dim, r.g2_dim
                ),
            ),
            (
                r.nlayers > 0 && r.g1_dim > 0 && r.g2_dim > 0 && i.tebd_dim > 0,
                "nlayers, g1_dim, g2_dim and tebd_dim must be positive".to_string(),
            ),
            (
                r.attn1_nhead > 0 && r.attn2_nhead > 0 && r.attn1_hidden > 0 && r.attn2_hidden > 0,
                "attn1_hidden, attn1_nhead, attn2_hidden and attn2_nhead must be positive"
                    .to_string(),
            ),
            (
                !i.use_three_body || !i.three_body_neuron.is_empty(),
                "three_body_neuron must not be empty".to_string(),
            ),
        ])
    }
}

/// The message of the first check that fails.
fn first_failed<const N: usize>(checks: [(bool, String); N]) -> Result<(), String> {
    match checks.into_iter().find(|(ok, _)| !ok) {
        Some((_, why)) => Err(why),
        None => Ok(()),
    }
}

/// Where DPA-2's tensors live (spec §20.9; names as tests/reference/dpa2's README).
#[derive(Clone, Debug, PartialEq)]
pub struct Dpa2Layout {
    pub tebd: TebdLayout,
    /// The repinit's embedding net (`repinit`, input 1 + 2T, 1 + T with type_one_side, 1 with
    /// strip) and strip's type net (`repinit_strip`, 2T or T).
    pub repinit: Net,
    pub repinit_strip: Option<Net>,
    /// The three-body block's nets (`three_body`, 1 + 2T or 1; `three_body_strip`, 2T).
    pub three_body: Option<Net>,
    pub three_body_strip: Option<Net>,
    /// `g1_shape_tranform.w` `[repinit out][G1]` (absent where the widths are equal) and
    /// `tebd_transform.w` `[T][G1]` (add_tebd_to_repinit_out): offsets of bias-free weights.
    pub shape_transform: Option<usize>,
    pub tebd_transform: Option<usize>,
    /// `[1][G2]` with bias.
    pub g2_embd: Layer,
    pub layers: Vec<RepformerLayerLayout>,
    /// How a fresh model's residual vectors start (update_residual, drawn where true).
    pub residual_init: (f64, bool),
}

/// One RepformerLayer's tensors (linears as `Layer`s with bias; `usize` the offset of a
/// bias-free weight) and residual vectors.
#[derive(Clone, Debug, PartialEq)]
pub struct RepformerLayerLayout {
    pub terms: LayerTerms,
    pub linear1: Layer,
    pub linear2: Option<Layer>,
    pub g1_self_mlp: Option<Layer>,
    /// `[G2][G1]` with g1_out_conv, `[G1][G2]` without.
    pub proj_g1g2: Option<usize>,
    pub proj_g1g1g2: Option<usize>,
    pub mapqk: Option<usize>,
    /// The g2 attention: mapv, head_map, and the layer norm's scale and shift `[G2]`.
    pub mapv: Option<usize>,
    pub attn2_head_map: Option<Layer>,
    pub attn2_lm: Option<(usize, usize)>,
    /// The h2 update's head weights `[N2][1]`.
    pub ev_head_map: Option<usize>,
    /// The g1 local attention: mapq, mapkv, head_map.
    pub loc_mapq: Option<usize>,
    pub loc_mapkv: Option<usize>,
    pub loc_head_map: Option<Layer>,
    pub g1_residual: Vec<usize>,
    pub g2_residual: Vec<usize>,
    pub h2_residual: Vec<usize>,
}

impl Dpa2Layout {
    /// The tensors; `neuron`, `a1`, `type_one_side`, `resnet_dt` are the repinit's (held by
    /// the descriptor spec), `nt` the number of types.
    pub(super) fn new(
        c: &Dpa2Config,
        neuron: &[usize],
        a1: usize,
        type_one_side: bool,
        resnet_dt: bool,
        nt: usize,
        b: &mut Builder,
    ) -> Self {
        let (i, r) = (&c.repinit, &c.repformer);
        let t = i.tebd_dim;
        let tebd = b.tebd(nt, t, c.use_tebd_bias);
        let types = if type_one_side { t } else { 2 * t };
        let strip = i.tebd_input_mode == TebdInputMode::Strip;
        let (nin, strip_nin) = if strip { (1, types) } else { (1 + types, 0) };
        // The host block applies repinit's activation itself; the layers say which it is.
        let dt_act = (resnet_dt, i.activation);
        let repinit = b.net("repinit".into(), nin, neuron, dt_act, None);
        let repinit_strip =
            strip.then(|| b.net("repinit_strip".into(), strip_nin, neuron, dt_act, None));
        let (three_body, three_body_strip) = if i.use_three_body {
            let mode = (t, i.tebd_input_mode);
            let (main, s) = three_body_nets(b, "three_body", mode, &i.three_body_neuron, dt_act);
            (Some(main), s)
        } else {
            (None, None)
        };
        let m1 = *neuron.last().expect("neuron is never empty");
        let out = c.repinit_out(m1, a1);
        let (g1, g2) = (r.g1_dim, r.g2_dim);
        let shape_transform =
            (out != g1).then(|| b.alloc("g1_shape_tranform.w".into(), vec![out, g1]));
        let tebd_transform = c
            .add_tebd_to_repinit_out
            .then(|| b.alloc("tebd_transform.w".into(), vec![t, g1]));
        let g2_embd = b.linear("g2_embd".into(), 1, g2);
        let (h1, n1, h2, n2) = (r.attn1_hidden, r.attn1_nhead, r.attn2_hidden, r.attn2_nhead);
        let layers = (0..r.nlayers)
            .map(|l| {
                let k = r.terms(l);
                let name = |x: &str| format!("layer{l}.{x}");
                let linear1 = b.linear(name("linear1"), k.linear1_in(r), g1);
                let linear2 = k.chnnl_2.then(|| b.linear(name("linear2"), g2, g2));
                let g1_self_mlp = k.g1_mlp.then(|| b.linear(name("g1_self_mlp"), g1, g1));
                let proj_g1g2 = match (k.conv_term, k.conv_in) {
                    (true, _) => Some(b.alloc(name("proj_g1g2.w"), vec![g2, g1])),
                    (_, true) => Some(b.alloc(name("proj_g1g2.w"), vec![g1, g2])),
                    _ => None,
                };
                let proj_g1g1g2 = k.g1g1.then(|| b.alloc(name("proj_g1g1g2.w"), vec![g1, g2]));
                let mapqk = k
                    .attn_map()
                    .then(|| b.alloc(name("attn2g_map.mapqk.w"), vec![g2, 2 * h2 * n2]));
                let mapv = k
                    .g2_attn
                    .then(|| b.alloc(name("attn2_mh_apply.mapv.w"), vec![g2, g2 * n2]));
                let attn2_head_map = k
                    .g2_attn
                    .then(|| b.linear(name("attn2_mh_apply.head_map"), g2 * n2, g2));
                let attn2_lm = k.g2_attn.then(|| {
                    let w = b.alloc(name("attn2_lm.w"), vec![g2]);
                    (w, b.alloc(name("attn2_lm.b"), vec![g2]))
                });
                let ev_head_map =
                    k.h2.then(|| b.alloc(name("attn2_ev_apply.head_map.w"), vec![n2, 1]));
                let loc_mapq = k
                    .g1_attn
                    .then(|| b.alloc(name("loc_attn.mapq.w"), vec![g1, h1 * n1]));
                let loc_mapkv = k
                    .g1_attn
                    .then(|| b.alloc(name("loc_attn.mapkv.w"), vec![g1, (h1 + g1) * n1]));
                let loc_head_map = k
                    .g1_attn
                    .then(|| b.linear(name("loc_attn.head_map"), g1 * n1, g1));
                let residual = r.update_style == UpdateStyle::ResResidual;
                let mut rows = |x: &str, n: usize, w: usize| -> Vec<usize> {
                    (0..if residual { n } else { 0 })
                        .map(|i| b.alloc(name(&format!("{x}.{i}")), vec![w]))
                        .collect()
                };
                let g1_residual = rows("g1_residual", k.g1_terms(), g1);
                let g2_residual = rows("g2_residual", k.g2_terms(), g2);
                let h2_residual = rows("h2_residual", usize::from(k.h2), 1);
                RepformerLayerLayout {
                    terms: k,
                    linear1,
                    linear2,
                    g1_self_mlp,
                    proj_g1g2,
                    proj_g1g1g2,
                    mapqk,
                    mapv,
                    attn2_head_map,
                    attn2_lm,
                    ev_head_map,
                    loc_mapq,
                    loc_mapkv,
                    loc_head_map,
                    g1_residual,
                    g2_residual,
                    h2_residual,
                }
            })
            .collect();
        Dpa2Layout {
            tebd,
            repinit,
            repinit_strip,
            three_body,
            three_body_strip,
            shape_transform,
            tebd_transform,
            g2_embd,
            layers,
            residual_init: (r.update_residual, r.residual_norm),
        }
    }
}

//! DPA-3 (`"type": "dpa3"`): its keys (DeePMD-kit 3.2.0's `descrpt_dpa3_args` and
//! `dpa3_repflow_args`, docs/deepmd-spec.md §18.1) and where its tensors live in the parameter
//! vector. The math is `backend/cpu/repflow.rs`.

pub(crate) mod input;
pub(super) mod yaml;

use serde::{Deserialize, Serialize};

use super::layout::{Builder, DescriptorLayout, Layer, OwnNets, TebdLayout};
use super::Activation;
use super::DescriptorSpec;

/// Its keys for the log.
pub(super) fn describe(d: &DescriptorSpec, head: String) -> String {
    let c = d.own.dpa3().expect("DPA-3 has its keys");
    format!(
        "{head} e_dim {} a_dim {} nlayers {} a_rcut {} a_sel {} {}{}",
        c.e_dim,
        c.a_dim,
        c.nlayers,
        c.a_rcut,
        c.a_sel,
        c.update_style.as_str(),
        if c.update_angle {
            ""
        } else {
            ", no angle update"
        },
    )
}

/// The node width, twice with `concat_output_tebd`.
pub(super) fn dim(d: &DescriptorSpec) -> usize {
    let c = d.own.dpa3().expect("DPA-3 has its keys");
    d.m1() * if c.concat_output_tebd { 2 } else { 1 }
}

/// Its layout: its block's tensors (tensor order in [`Dpa3Layout`]).
pub(super) fn layout(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout {
    let c = d.own.dpa3().expect("DPA-3 has its keys");
    DescriptorLayout::own(OwnNets::Dpa3(Dpa3Layout::new(c, d.m1(), nt, b)), vec![])
}

/// How a layer adds its updates (`update_style`, docs/deepmd-spec.md §18.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateStyle {
    ResAvg,
    ResIncr,
    ResResidual,
}

impl UpdateStyle {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "res_avg" => Some(UpdateStyle::ResAvg),
            "res_incr" => Some(UpdateStyle::ResIncr),
            "res_residual" => Some(UpdateStyle::ResResidual),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UpdateStyle::ResAvg => "res_avg",
            UpdateStyle::ResIncr => "res_incr",
            UpdateStyle::ResResidual => "res_residual",
        }
    }
}

/// DPA-3's keys beside the shared ones of [`super::DescriptorSpec`] (which holds e_rcut,
/// e_rcut_smth, e_sel as rcut, rcut_smth and its one sel, n_dim as its one neuron, and
/// env_protection).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dpa3Config {
    pub e_dim: usize,
    pub a_dim: usize,
    pub nlayers: usize,
    pub a_rcut: f64,
    pub a_rcut_smth: f64,
    pub a_sel: usize,
    pub a_compress_rate: usize,
    pub a_compress_e_rate: usize,
    pub a_compress_use_split: bool,
    pub n_multi_edge_message: usize,
    pub axis_neuron: usize,
    pub fix_stat_std: f64,
    pub update_angle: bool,
    pub update_style: UpdateStyle,
    pub update_residual: f64,
    /// `update_residual_init`: "norm" (true) or "const".
    pub residual_norm: bool,
    pub optim_update: bool,
    pub smooth_edge_update: bool,
    pub edge_init_use_dist: bool,
    pub use_exp_switch: bool,
    pub use_dynamic_sel: bool,
    pub sel_reduce_factor: f64,
    pub sequential_update: bool,
    pub concat_output_tebd: bool,
    pub activation: Activation,
    pub use_tebd_bias: bool,
    pub use_loc_mapping: bool,
    /// Pairs of types whose edges are removed (both orders).
    pub exclude_types: Vec<[usize; 2]>,
}

impl Dpa3Config {
    /// N_c and E_c, the widths of the node and edge inside the angle messages.
    pub fn compressed(&self, n: usize) -> (usize, usize) {
        match self.a_compress_rate {
            0 => (n, self.e_dim),
            c => (
                self.a_dim / c,
                self.a_dim / (2 * c) * self.a_compress_e_rate,
            ),
        }
    }

    /// The width of an angle message's input: a, ñ, ẽ_k, ẽ_j.
    pub fn angle_info(&self, n: usize) -> usize {
        let (nc, ec) = self.compressed(n);
        self.a_dim + nc + 2 * ec
    }

    /// Whether (t_i, t_j) is excluded.
    pub fn excludes(&self, ti: usize, tj: usize) -> bool {
        (self.exclude_types.iter()).any(|&[a, b]| (a, b) == (ti, tj) || (b, a) == (ti, tj))
    }

    /// DeePMD-kit's constraints on the keys (spec §18.1), given n_dim, e_rcut and e_sel.
    pub fn check(&self, n: usize, e_rcut: f64, e_sel: usize) -> Result<(), String> {
        let (m, c) = (self.axis_neuron, self.a_compress_rate);
        let checks = [
            (
                e_rcut >= self.a_rcut,
                format!("a_rcut {} exceeds e_rcut {e_rcut}", self.a_rcut),
            ),
            (
                e_sel >= self.a_sel,
                format!("a_sel {} exceeds e_sel {e_sel}", self.a_sel),
            ),
            (
                m <= n.min(self.e_dim),
                format!("axis_neuron {m} exceeds n_dim {n} or e_dim {}", self.e_dim),
            ),
            (
                c == 0
                    || ((self.a_dim * self.a_compress_e_rate).is_multiple_of(2 * c)
                        && (self.a_dim / c).is_multiple_of(2)),
                format!(
                    "a_compress_rate {c} with a_dim {} and a_compress_e_rate {} gives widths \
                     that do not fit",
                    self.a_dim, self.a_compress_e_rate
                ),
            ),
            (
                !self.use_dynamic_sel || self.smooth_edge_update,
                "use_dynamic_sel needs smooth_edge_update true".to_string(),
            ),
            (
                !self.sequential_update
                    || (self.update_style == UpdateStyle::ResResidual && self.update_angle),
                "sequential_update needs update_style res_residual and update_angle".to_string(),
            ),
            (
                self.sel_reduce_factor > 0.0,
                format!(
                    "sel_reduce_factor {} is not positive",
                    self.sel_reduce_factor
                ),
            ),
            (
                self.nlayers > 0 && n > 0 && self.e_dim > 0 && self.a_dim > 0,
                "nlayers, n_dim, e_dim and a_dim must be positive".to_string(),
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(why),
            None => Ok(()),
        }
    }
}

/// Where DPA-3's tensors live (docs/deepmd-spec.md §18.9, named as tests/reference/dpa3's
/// `grad.*` arrays): the type embedding `tebd.layer0`, `edge_embd`, `angle_embd` (no bias),
/// then each layer's linears and residual vectors.
#[derive(Clone, Debug, PartialEq)]
pub struct Dpa3Layout {
    pub tebd: TebdLayout,
    /// `[1][E]` with bias.
    pub edge_embd: Layer,
    /// `[1][A_d]`, no bias: the offset of its w.
    pub angle_embd: usize,
    pub layers: Vec<RepflowLayerLayout>,
    /// How a fresh model's residual vectors start: update_residual itself, or drawn from
    /// N(0, update_residual²) where `residual_norm`.
    pub residual_init: (f64, bool),
}

/// One RepFlowLayer's linears (`Layer`s with `act: Linear`, no skip, no idt) and residual
/// vectors (offsets of `[N]`, `[E]`, `[A_d]` rows; empty unless res_residual).
#[derive(Clone, Debug, PartialEq)]
pub struct RepflowLayerLayout {
    /// Where the layer's tensors are, all together.
    pub params: std::ops::Range<usize>,
    pub node_self: Layer,
    pub node_sym: Layer,
    pub node_edge: Layer,
    pub edge_self: Layer,
    pub angle: Option<AngleLayout>,
    pub n_residual: Vec<usize>,
    pub e_residual: Vec<usize>,
    pub a_residual: Vec<usize>,
}

/// A layer's angle branch (update_angle): the edge's angle message (linear1 over the angle
/// info, linear2 over its reduction), the angle's own update, and the bias-free compressions
/// (offsets of their w) where a_compress_rate ≠ 0 without split.
#[derive(Clone, Debug, PartialEq)]
pub struct AngleLayout {
    pub edge_angle1: Layer,
    pub edge_angle2: Layer,
    pub angle_self: Layer,
    pub compress_n: Option<usize>,
    pub compress_e: Option<usize>,
}

impl Dpa3Layout {
    /// The tensors in DeePMD-kit's order; `n` is n_dim, `nt` the number of types.
    pub(super) fn new(c: &Dpa3Config, n: usize, nt: usize, b: &mut Builder) -> Self {
        let tebd = b.tebd(nt, n, c.use_tebd_bias);
        let (e, ad, h) = (c.e_dim, c.a_dim, c.n_multi_edge_message);
        let edge_embd = b.linear("edge_embd".into(), 1, e);
        let angle_embd = b.alloc("angle_embd.w".into(), vec![1, ad]);
        let (nc, ec) = c.compressed(n);
        let da = c.angle_info(n);
        let layers = (0..c.nlayers)
            .map(|l| {
                let name = |x: &str| format!("layer{l}.{x}");
                let start = b.len();
                let node_self = b.linear(name("node_self_mlp"), n, n);
                let node_sym = b.linear(name("node_sym_linear"), c.axis_neuron * (n + e), n);
                let node_edge = b.linear(name("node_edge_linear"), 2 * n + e, h * n);
                let edge_self = b.linear(name("edge_self_linear"), 2 * n + e, e);
                let angle = c.update_angle.then(|| {
                    let linear_compress = c.a_compress_rate != 0 && !c.a_compress_use_split;
                    let compress_n = linear_compress
                        .then(|| b.alloc(name("a_compress_n_linear.w"), vec![n, nc]));
                    let compress_e = linear_compress
                        .then(|| b.alloc(name("a_compress_e_linear.w"), vec![e, ec]));
                    AngleLayout {
                        edge_angle1: b.linear(name("edge_angle_linear1"), da, e),
                        edge_angle2: b.linear(name("edge_angle_linear2"), e, e),
                        angle_self: b.linear(name("angle_self_linear"), da, ad),
                        compress_n,
                        compress_e,
                    }
                });
                let residual = c.update_style == UpdateStyle::ResResidual;
                let mut rows = |x: &str, k: usize, w: usize| -> Vec<usize> {
                    (0..if residual { k } else { 0 })
                        .map(|i| b.alloc(name(&format!("{x}.{i}")), vec![w]))
                        .collect()
                };
                let n_residual = rows("n_residual", 2 + h, n);
                let e_residual = rows("e_residual", if c.update_angle { 2 } else { 1 }, e);
                let a_residual = rows("a_residual", usize::from(c.update_angle), ad);
                RepflowLayerLayout {
                    params: start..b.len(),
                    node_self,
                    node_sym,
                    node_edge,
                    edge_self,
                    angle,
                    n_residual,
                    e_residual,
                    a_residual,
                }
            })
            .collect();
        Dpa3Layout {
            tebd,
            edge_embd,
            angle_embd,
            layers,
            residual_init: (c.update_residual, c.residual_norm),
        }
    }
}

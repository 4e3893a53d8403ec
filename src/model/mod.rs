//! The model (a descriptor and a fitting net): hyper-parameters, the flat parameter
//! vector and its layout, statistics (davg/dstd, energy bias) and file formats.

pub mod activation;
mod check;
pub mod dpa2;
pub mod dpa3;
pub mod file;
mod hybrid;
mod init;
mod layout;
pub mod linear;
mod own_keys;
pub mod pairtab;
pub mod pt;
pub mod registry;
mod se;
mod se_atten;
pub mod se_e3_tebd;
mod source;
mod type_map;
mod yaml;
mod yaml_block;

pub use activation::Activation;
pub use check::MAX_NNEI;
pub use init::init_params;
pub use layout::{
    embed_net_index, pair_types, DescriptorLayout, FittingLayout, Layer, Net, OwnNets, ParamLayout,
    Skip, TebdLayout, TensorInfo,
};
pub use own_keys::OwnKeys;
pub use se_atten::{AttentionConfig, AttnLayerLayout, AttnLayout};
pub use source::{read_model, read_model_head, read_model_to_train, ModelFile};
pub use type_map::new_elements;
pub use yaml::{read_deepmd_yaml, write_deepmd_yaml, YamlModel};

use serde::{Deserialize, Serialize};

pub use crate::fitting::output::FitOutput;
use crate::geometry::EnvParams;

/// Which descriptor a [`DescriptorSpec`] describes: DeePMD-kit's `type`, in its canonical name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DescriptorType {
    /// The smooth two-body embedding of the full relative coordinates.
    #[default]
    #[serde(rename = "se_e2_a")]
    SeE2A,
    /// Its radial-only sibling: D_i = (1/5)(1/nnei) Σ_j G(ŝ_ij) (docs/design.md §10).
    #[serde(rename = "se_e2_r")]
    SeE2R,
    /// The three-body embedding of the angles between neighbour pairs:
    /// D_i = Σ_{ti≤tj} 1/(sel_ti·sel_tj) Σ_{j∈ti, k∈tj} e_jk G(e_jk), e_jk = r̃_j·r̃_k
    /// (docs/design.md §10).
    #[serde(rename = "se_e3")]
    SeE3,
    /// Several descriptors side by side: D_i the concatenation of theirs, in `list` order, each
    /// on its own neighbour list cut from one list of the largest rcut and sel (docs/design.md
    /// §10).
    #[serde(rename = "hybrid")]
    Hybrid,
    /// DPA-1: a type embedding, one mixed-type neighbour list, the embedding of (ŝ, type
    /// embeddings) concatenated (or stripped, `tebd_input_mode: strip`), attention layers over
    /// the neighbours, then se_e2_a's contraction (docs/design.md §11).
    #[serde(rename = "se_atten")]
    SeAtten,
    /// DPA-1 with the stripped type embedding: G = G_s(ŝ)·(1 + sw·G_t(type embeddings)) and
    /// smooth attention (docs/design.md §11).
    #[serde(rename = "se_atten_v2")]
    SeAttenV2,
    /// DPA-3: a type embedding, one mixed-type list of edges and the angles among its nearest,
    /// and RepFlow layers passing messages between nodes, edges and angles
    /// (docs/deepmd-spec.md §18).
    #[serde(rename = "dpa3")]
    Dpa3,
    /// DPA-2: a type embedding, the repinit (DPA-1's embedding without attention, and a
    /// three-body block) on one mixed-type list, and repformer layers passing messages over
    /// a shorter sub-list (docs/deepmd-spec.md §20).
    #[serde(rename = "dpa2")]
    Dpa2,
    /// DPA-2's three-body block alone: a type embedding, one mixed-type list, the embedding of
    /// every pair of neighbours' (e_jk, type embeddings) weighted by e_jk and averaged
    /// (docs/deepmd-spec.md §20.12).
    #[serde(rename = "se_e3_tebd")]
    SeE3Tebd,
}

impl DescriptorType {
    /// DPA-1 (se_atten, se_atten_v2): one mixed-type neighbour list and a type embedding.
    pub fn is_attention(self) -> bool {
        matches!(self, DescriptorType::SeAtten | DescriptorType::SeAttenV2)
    }

    /// One mixed-type neighbour list and one fitting net for every type (DPA-1, DPA-2, DPA-3,
    /// se_e3_tebd).
    pub fn is_mixed(self) -> bool {
        self.registered().mixed
    }

    /// Reads the slots' r_ij itself rather than R̂ (DPA-2, DPA-3, se_e3_tebd): its training
    /// seed is ṙ_ij.
    pub fn reads_rij(self) -> bool {
        self.registered().reads_rij
    }

    /// se_e2_a: files written before descriptors had a type read as it, and it is written
    /// without one, so its checkpoints stay as they were.
    fn is_se_e2_a(&self) -> bool {
        *self == DescriptorType::SeE2A
    }
}

/// How DPA-1 feeds the type embeddings into the embedding net (`tebd_input_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TebdInputMode {
    /// One net on [ŝ, T(neighbour), T(centre)] (T(centre) left out with type_one_side).
    Concat,
    /// G = G_s(ŝ)·(1 + σ·G_t(T(neighbour), T(centre))), σ the switch when smooth (else 1):
    /// se_atten_v2's, or se_atten's `tebd_input_mode: "strip"` (`stripped_type_embedding: true`).
    Strip,
}

impl TebdInputMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TebdInputMode::Concat => "concat",
            TebdInputMode::Strip => "strip",
        }
    }
}

/// Hyper-parameters of the descriptor (docs/deepmd-spec.md §3–§6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SpecFile", into = "SpecFile")]
pub struct DescriptorSpec {
    pub kind: DescriptorType,
    pub rcut: f64,
    pub rcut_smth: f64,
    pub sel: Vec<usize>,
    pub neuron: Vec<usize>,
    /// se_e2_a's M2; 1 for se_e2_r and se_e3, whose descriptors are one row of M1.
    pub axis_neuron: usize,
    pub resnet_dt: bool,
    /// One embedding net per neighbour type (true) or per (centre, neighbour) type pair; se_e3
    /// has neither (one net per pair of neighbour types) and keeps false.
    pub type_one_side: bool,
    pub env_protection: f64,
    pub set_davg_zero: bool,
    /// The keys of its kind alone. A DPA-1 spec's `sel` is one number, nnei (DeePMD-kit sums
    /// a list sel): one mixed-type section.
    pub own: OwnKeys<DescriptorSpec>,
}

/// A [`DescriptorSpec`] as checkpoints hold it: each kind's own keys under its name, written
/// only where present, so that the older descriptors' files stay as they were.
#[derive(Clone, Serialize, Deserialize)]
struct SpecFile {
    #[serde(default, skip_serializing_if = "DescriptorType::is_se_e2_a")]
    kind: DescriptorType,
    rcut: f64,
    rcut_smth: f64,
    sel: Vec<usize>,
    neuron: Vec<usize>,
    axis_neuron: usize,
    resnet_dt: bool,
    type_one_side: bool,
    env_protection: f64,
    set_davg_zero: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    list: Vec<DescriptorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attention: Option<AttentionConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dpa3: Option<dpa3::Dpa3Config>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dpa2: Option<dpa2::Dpa2Config>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    se_e3_tebd: Option<se_e3_tebd::SeE3TebdConfig>,
}

impl From<DescriptorSpec> for SpecFile {
    fn from(d: DescriptorSpec) -> Self {
        let (mut list, mut attention, mut dpa3, mut dpa2, mut se_e3_tebd) =
            (vec![], None, None, None, None);
        match d.own {
            OwnKeys::Se => {}
            OwnKeys::Attention(a) => attention = Some(a),
            OwnKeys::Dpa3(c) => dpa3 = Some(c),
            OwnKeys::Dpa2(c) => dpa2 = Some(c),
            OwnKeys::SeE3Tebd(c) => se_e3_tebd = Some(c),
            OwnKeys::Hybrid(l) => list = l,
        }
        SpecFile {
            kind: d.kind,
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            sel: d.sel,
            neuron: d.neuron,
            axis_neuron: d.axis_neuron,
            resnet_dt: d.resnet_dt,
            type_one_side: d.type_one_side,
            env_protection: d.env_protection,
            set_davg_zero: d.set_davg_zero,
            list,
            attention,
            dpa3,
            dpa2,
            se_e3_tebd,
        }
    }
}

impl TryFrom<SpecFile> for DescriptorSpec {
    type Error = String;

    fn try_from(f: SpecFile) -> Result<Self, String> {
        let kind = f.kind;
        let name = kind.as_str();
        let present = [
            (!f.list.is_empty()).then_some("list"),
            f.attention.is_some().then_some("attention"),
            f.dpa3.is_some().then_some("dpa3"),
            f.dpa2.is_some().then_some("dpa2"),
            f.se_e3_tebd.is_some().then_some("se_e3_tebd"),
        ];
        let present: Vec<&str> = present.into_iter().flatten().collect();
        if present.len() > 1 {
            return Err(format!(
                "a {name} descriptor has {} together",
                present.join(", ")
            ));
        }
        let own = match (f.list, f.attention, f.dpa3, f.dpa2, f.se_e3_tebd) {
            (l, None, None, None, None) if !l.is_empty() => OwnKeys::Hybrid(l),
            (_, Some(a), ..) => OwnKeys::Attention(a),
            (_, _, Some(c), ..) => OwnKeys::Dpa3(c),
            (_, _, _, Some(c), _) => OwnKeys::Dpa2(c),
            (_, _, _, _, Some(c)) => OwnKeys::SeE3Tebd(c),
            _ if kind == DescriptorType::Hybrid => OwnKeys::Hybrid(vec![]),
            _ => OwnKeys::Se,
        };
        if !own.fit(kind) {
            return Err(match present.first() {
                Some(k) => format!("a {name} descriptor has no {k} keys"),
                None => format!(
                    "a {name} descriptor needs its {} keys",
                    own_keys::file_key(kind)
                ),
            });
        }
        Ok(DescriptorSpec {
            kind,
            rcut: f.rcut,
            rcut_smth: f.rcut_smth,
            sel: f.sel,
            neuron: f.neuron,
            axis_neuron: f.axis_neuron,
            resnet_dt: f.resnet_dt,
            type_one_side: f.type_one_side,
            env_protection: f.env_protection,
            set_davg_zero: f.set_davg_zero,
            own,
        })
    }
}

/// [`DescriptorSpec::stat_parts`] where each of its [`DescriptorSpec::parts`] keeps statistics
/// of its own (the descriptor itself, or each part of a hybrid).
fn each_part(d: &DescriptorSpec) -> Vec<DescriptorSpec> {
    d.parts().to_vec()
}

impl DescriptorSpec {
    /// The hybrid of `list`: DeePMD-kit's one neighbour list has the largest rcut and, per type,
    /// the largest sel of the sub-descriptors. The keys a hybrid does not have (neuron,
    /// axis_neuron, ...) are empty or zero.
    pub fn hybrid(list: Vec<DescriptorSpec>) -> Self {
        let nt = list.first().map_or(0, |d| d.sel.len());
        DescriptorSpec {
            kind: DescriptorType::Hybrid,
            rcut: list.iter().map(|d| d.rcut).fold(0.0, f64::max),
            rcut_smth: list
                .iter()
                .map(|d| d.rcut_smth)
                .fold(f64::INFINITY, f64::min),
            sel: (0..nt)
                .map(|t| {
                    list.iter()
                        .map(|d| d.sel.get(t).copied().unwrap_or(0))
                        .max()
                        .unwrap_or(0)
                })
                .collect(),
            neuron: vec![],
            axis_neuron: 0,
            resnet_dt: false,
            type_one_side: false,
            env_protection: 0.0,
            set_davg_zero: false,
            own: OwnKeys::Hybrid(list),
        }
    }

    /// The environment matrix's switch and protection.
    pub fn env(&self) -> EnvParams {
        EnvParams {
            rcut: self.rcut,
            rcut_smth: self.rcut_smth,
            protection: self.env_protection,
        }
    }

    /// DPA-1 (se_atten, se_atten_v2) and DPA-3: one mixed-type neighbour list of `nnei()`
    /// slots per centre, all neighbour types together (`sel` has one entry), and one fitting
    /// net for every type.
    pub fn is_mixed(&self) -> bool {
        self.kind.is_mixed()
    }

    /// The blocks that keep statistics of their own, in the order of the model's davg/dstd: a
    /// hybrid's parts; DPA-2's repinit, repformer and three-body block, each on its own list
    /// (spec §20.8); else the descriptor itself.
    pub fn stat_parts(&self) -> Vec<DescriptorSpec> {
        (self.kind.registered().stat_parts)(self)
    }

    /// Whether pairs of types ti, tj are left out of the environment (DPA-2's and
    /// se_e3_tebd's exclude_types; their slots are zero rows of the statistics).
    pub fn excludes(&self, ti: usize, tj: usize) -> bool {
        match &self.own {
            OwnKeys::Dpa2(c) => c.excludes(ti, tj),
            OwnKeys::SeE3Tebd(c) => c.excludes(ti, tj),
            _ => false,
        }
    }

    /// DPA-1's attention keys (`None` for every other descriptor).
    pub fn attn(&self) -> Option<&AttentionConfig> {
        self.own.attention()
    }

    /// The descriptors that compute: the sub-descriptors of a hybrid, else this one.
    pub fn parts(&self) -> &[DescriptorSpec] {
        match &self.own {
            OwnKeys::Hybrid(list) => list,
            _ => std::slice::from_ref(self),
        }
    }

    /// Its keys for the log: those it has (se_e3 has neither axis_neuron nor type_one_side; a
    /// hybrid only its list).
    pub fn describe(&self) -> String {
        let head = format!(
            "{} sel {:?} rcut {} neuron {:?}",
            self.kind.as_str(),
            self.sel,
            self.rcut,
            self.neuron
        );
        (self.kind.registered().describe)(self, head)
    }

    /// Width of the descriptor of one atom (a hybrid's: the sum of its parts'): M1·axis_neuron,
    /// and for DPA-1 with `concat_output_tebd` the centre's type embedding (tebd_dim) after it.
    pub fn dim(&self) -> usize {
        (self.kind.registered().dim)(self)
    }

    /// The `[ntypes][4]` blocks of davg/dstd rows: one per part of a hybrid, DPA-2's repinit,
    /// repformer and (with use_three_body) three-body block in that order, else one.
    pub fn stat_blocks(&self) -> usize {
        self.stat_parts().len()
    }

    /// DeePMD-kit's `dim_descrpt`: [`DescriptorSpec::dim`].
    pub fn dim_descrpt(&self) -> usize {
        self.dim()
    }

    /// The neighbour slots per section of a batch's slot layout (`backend::Dims`): the
    /// sel (DPA-1: one section of nnei), or for a hybrid every part's slots of a type one after
    /// the other (part 0's `sel[t]`, then part 1's, ...).
    pub fn slot_sel(&self) -> Vec<usize> {
        (0..self.sel.len())
            .map(|t| self.parts().iter().map(|d| d.sel[t]).sum())
            .collect()
    }

    /// The widths a batch layout carries (`Dims::m1`, `Dims::m2`): M1 and axis_neuron, or for a
    /// hybrid its output width and 1.
    pub fn slot_widths(&self) -> (usize, usize) {
        match self.kind {
            DescriptorType::Hybrid => (self.dim(), 1),
            _ => (self.m1(), self.axis_neuron),
        }
    }

    pub fn nnei(&self) -> usize {
        self.sel.iter().sum()
    }
    /// M of the rotation matrix `[M][3]` per atom it gives a dipole or polar fitting (DeePMD-kit's
    /// `get_dim_emb`), where its kind gives one.
    pub fn rot_width(&self) -> Option<usize> {
        (self.kind.registered().gives_rot).then(|| self.own.rot_width(&self.neuron))
    }
    /// Width of the embedding output (M1).
    pub fn m1(&self) -> usize {
        *self.neuron.last().expect("neuron is never empty")
    }
    /// Start of each neighbour-type section within a centre's slots, plus the total at the end
    /// (DPA-1: `[0, nnei]`, its one mixed section).
    pub fn sections(&self) -> Vec<usize> {
        let mut s = vec![0];
        for &n in &self.sel {
            s.push(s.last().unwrap() + n);
        }
        s
    }
}

/// Whether the pair (t_i, t_j) is one of `pairs`, in either order (an `exclude_types`).
fn pair_excluded(pairs: &[[usize; 2]], ti: usize, tj: usize) -> bool {
    (pairs.iter()).any(|&[a, b]| (a, b) == (ti, tj) || (b, a) == (ti, tj))
}

/// Hyper-parameters of the fitting net (docs/deepmd-spec.md §7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FittingSpec {
    /// What it predicts; `ener` is not written, so that energy models' files stay as they were.
    #[serde(default, skip_serializing_if = "FitOutput::is_ener")]
    pub output: FitOutput,
    pub neuron: Vec<usize>,
    pub resnet_dt: bool,
    /// The hidden layers' φ; tanh is not written, so that the files of tanh models stay as
    /// they were.
    #[serde(default = "tanh", skip_serializing_if = "Activation::is_tanh")]
    pub activation: Activation,
    /// Frame parameters (`fparam.npy`, `[nframes][numb_fparam]`) and atomic parameters
    /// (`aparam.npy`, `[nframes][natoms][numb_aparam]`): the net's input is DeePMD-kit's
    /// `[D_i, fparam, aparam]`, each parameter normalised by its statistics
    /// ([`Model::fit_input_avg`]). Written only where set, so that the files of a model
    /// without them are those of earlier versions, which they read as 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub numb_fparam: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub numb_aparam: usize,
    /// The frame parameters of a system without `fparam.npy` (`None`: each needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_fparam: Option<Vec<f64>>,
    /// The width of DeePMD-kit's case embedding, the net's last input columns
    /// ([`Model::case_embd`]): which task of a multi-task run a shared fitting net is fitting.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dim_case_embd: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn tanh() -> Activation {
    Activation::Tanh
}

impl FittingSpec {
    /// An `ener` fitting of these widths, without frame or atomic parameters.
    pub fn new(neuron: Vec<usize>, resnet_dt: bool) -> Self {
        FittingSpec {
            output: FitOutput::Ener,
            neuron,
            resnet_dt,
            activation: Activation::Tanh,
            numb_fparam: 0,
            numb_aparam: 0,
            default_fparam: None,
            dim_case_embd: 0,
        }
    }

    /// The values per atom the net puts out ([`crate::fitting::traits::FittingType::dim`]).
    pub fn dim_out(&self) -> usize {
        self.output.fitting().dim()
    }

    /// The columns the net takes beside the descriptor: the parameters, then the case
    /// embedding.
    pub fn extra_inputs(&self) -> usize {
        self.param_inputs() + self.dim_case_embd
    }

    /// The columns read from the data and normalised by statistics: numb_fparam + numb_aparam.
    pub fn param_inputs(&self) -> usize {
        self.numb_fparam + self.numb_aparam
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub type_map: Vec<String>,
    pub descriptor: DescriptorSpec,
    pub fitting: FittingSpec,
    /// A pair table mixed into the energy (`use_srtab`, `linear_ener`); `None` for a plain
    /// DP model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_range: Option<pairtab::ShortRange>,
    /// A `linear_ener` model's other DP models and the weights (`model::linear`); `None` for
    /// one DP model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear: Option<linear::Linear>,
}

impl ModelSpec {
    pub fn ntypes(&self) -> usize {
        self.type_map.len()
    }
    pub fn dim_descrpt(&self) -> usize {
        self.descriptor.dim()
    }
    /// The width of a fitting net's input: the descriptor, then the frame and atomic parameters.
    pub fn fitting_input(&self) -> usize {
        self.dim_descrpt() + self.fitting.extra_inputs()
    }
}

/// A complete model: hyper-parameters, trainable parameters (always stored in f64; backends
/// convert to their precision) and the non-trainable statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub spec: ModelSpec,
    pub params: Vec<f64>,
    /// davg row per centre type, `[ntypes][4]` (DeePMD stores `[ntypes][nnei][4]` with equal rows);
    /// a hybrid's, `[part][ntypes][4]`; DPA-2's, `[block][ntypes][4]`
    /// ([`DescriptorSpec::stat_blocks`]).
    pub davg: Vec<f64>,
    /// dstd row per centre type, `[ntypes][4]` (hybrid: `[part][ntypes][4]`; DPA-2:
    /// `[block][ntypes][4]`).
    pub dstd: Vec<f64>,
    /// Added to every atom of a type: DeePMD's `out_bias + bias_atom_e`, `[ntypes][dim_out]`
    /// (the energy bias, or a property's output bias).
    pub bias: Vec<f64>,
    /// A property's output std per type, `[ntypes][task_dim]`, which scales the net's output;
    /// empty for `ener` and `dos` (which DeePMD-kit does not scale).
    #[serde(default)]
    pub out_std: Vec<f64>,
    /// The fitting's input statistics, `[numb_fparam + numb_aparam]`: DeePMD-kit's
    /// `fparam_avg` then `aparam_avg`, and their `*_inv_std`. Empty without such parameters.
    #[serde(default)]
    pub fit_input_avg: Vec<f64>,
    #[serde(default)]
    pub fit_input_inv_std: Vec<f64>,
    /// DeePMD-kit's `case_embd`, `[dim_case_embd]`, taken as it is after the parameters: the
    /// one-hot row of the task among a multi-task run's tasks sorted by name, zeros in a
    /// single-task model.
    #[serde(default)]
    pub case_embd: Vec<f64>,
}

impl Model {
    pub fn layout(&self) -> ParamLayout {
        ParamLayout::new(&self.spec)
    }

    /// A model with freshly initialised parameters, zero mean and unit std statistics, zero bias.
    pub fn new(spec: ModelSpec, seed: u64) -> Self {
        let layout = ParamLayout::new(&spec);
        let nt = spec.ntypes();
        let np = spec.descriptor.stat_blocks();
        let params = init_params(&layout, seed);
        let nx = spec.fitting.param_inputs();
        let no = spec.fitting.dim_out();
        let nb = spec.fitting.output.fitting().label_width();
        let scaled = spec.fitting.output.fitting().keeps_out_std();
        let case_embd = vec![0.0; spec.fitting.dim_case_embd];
        Model {
            spec,
            params,
            davg: vec![0.0; np * nt * 4],
            dstd: vec![1.0; np * nt * 4],
            bias: vec![0.0; nt * nb],
            out_std: if scaled { vec![1.0; nt * no] } else { vec![] },
            fit_input_avg: vec![0.0; nx],
            fit_input_inv_std: vec![1.0; nx],
            case_embd,
        }
    }
}

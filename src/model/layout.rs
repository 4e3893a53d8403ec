//! Where every trainable tensor lives in the flat parameter vector. Names follow the reference
//! export of DeePMD-kit (`embed.t1.layer0.w`, `fit.t0.layer3.b`, ...), so tests can compare by name.
//!
//! DPA-1 (se_atten, se_atten_v2; tests/reference/dpa1/README.md) has, in this order:
//! `tebd.layer0.{w,b}` (the type embedding), `embed.layer{l}.{w,b,idt}` (its one embedding
//! net, [`DescriptorLayout::embed`]`[0]`), `embed_strip.layer{l}.*` (strip's type net),
//! `attn{k}.{in,out,ln}.{w,b}` (the attention layers), then `fit.layer{l}.*` (one fitting net
//! for every type): all but the embedding and fitting nets in [`DescriptorLayout::own`]
//! ([`OwnNets::Attention`]).

use std::ops::Range;

use super::dpa2::Dpa2Layout;
use super::dpa3::Dpa3Layout;
use super::se_atten::AttnLayout;
use super::se_e3_tebd::SeE3TebdLayout;
use super::{Activation, DescriptorSpec, ModelSpec};

/// The skip connection of a layer, decided by its widths alone (docs/deepmd-spec.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    None,
    /// `y = h + x` (n_out == n_in)
    Identity,
    /// `y = h + [x, x]` (n_out == 2 n_in)
    Double,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub nin: usize,
    pub nout: usize,
    /// φ of the hidden layers (tanh for the embedding nets, the fitting's activation_function);
    /// Linear for the fitting net's output layer and the blocks' linears. What the layer keeps
    /// of each output for its passes, h or z, is [`Activation::keeps_output`]'s.
    pub act: Activation,
    pub skip: Skip,
    /// Offsets into the parameter vector: `w` is `[nin][nout]` row-major, `b` and `idt` `[nout]`.
    pub w: usize,
    pub b: usize,
    pub idt: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Net {
    pub name: String,
    pub layers: Vec<Layer>,
}

impl Net {
    pub fn nout(&self) -> usize {
        self.layers.last().map_or(0, |l| l.nout)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl TensorInfo {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The whole parameter vector: the descriptor's tensors, then the fitting's.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamLayout {
    pub descriptor: DescriptorLayout,
    pub fitting: FittingLayout,
    pub tensors: Vec<TensorInfo>,
    pub len: usize,
}

/// The descriptor's nets (offsets into the whole parameter vector).
#[derive(Clone, Debug, PartialEq)]
pub struct DescriptorLayout {
    /// Embedding nets, indexed by [`embed_net_index`] (se_e3: by pair type, [`pair_types`]);
    /// DPA-1: its one net, `embed[0]`, named `embed`.
    pub embed: Vec<Net>,
    /// The embedding nets of each part of the descriptor ([`super::DescriptorSpec::parts`]):
    /// `embed[parts[k]]`, one range covering them all but for a hybrid.
    pub parts: Vec<Range<usize>>,
    /// The tensors of its family beside `embed`.
    pub own: OwnNets,
    /// Parameter ranges that training holds fixed (no gradient, no update): DPA-1's layer norm
    /// scale and shift (`attn{k}.ln.*`) when `trainable_ln` is false, as DeePMD-kit's `dp train`
    /// builds them with `requires_grad = False`; DPA-2's and se_e3_tebd's whole descriptor when
    /// its `trainable` is false. They stay in the layout and the files. Empty for every other
    /// model.
    pub frozen: Vec<Range<usize>>,
}

/// The fitting's nets: one per atom type, or one (`fit`) for every type after a mixed-type
/// descriptor (DPA-1); ask [`FittingLayout::net`] for a type's.
#[derive(Clone, Debug, PartialEq)]
pub struct FittingLayout {
    pub nets: Vec<Net>,
}

/// The type embedding `tebd.layer0`: `w` `[ntypes][dim]`, `b` `[dim]` (with use_tebd_bias),
/// linear, the skip decided by the widths as any DeePMD-kit layer (`I` when dim == ntypes,
/// `[I, I]` when dim == 2·ntypes), no timestep.
#[derive(Clone, Debug, PartialEq)]
pub struct TebdLayout {
    pub ntypes: usize,
    pub dim: usize,
    pub skip: Skip,
    pub w: usize,
    pub b: Option<usize>,
}

impl TebdLayout {
    /// One past its last parameter.
    pub fn end(&self) -> usize {
        self.b
            .map_or(self.w + self.ntypes * self.dim, |b| b + self.dim)
    }

    /// `T[t] = skip(e_t) + W[t] (+ b)`: row t of the type embedding, from the model's parameters.
    pub fn row<T: num_traits::Float>(&self, params: &[T], ty: usize) -> Vec<T> {
        (0..self.dim)
            .map(|c| {
                let skip = match self.skip {
                    Skip::None => false,
                    Skip::Identity => c == ty,
                    Skip::Double => c % self.ntypes == ty,
                };
                let mut v = params[self.w + ty * self.dim + c];
                if let Some(b) = self.b {
                    v = v + params[b + c];
                }
                if skip {
                    v = v + T::one();
                }
                v
            })
            .collect()
    }
}

/// The embedding net used for a (centre type, neighbour type) pair: one net per neighbour type
/// when `type_one_side`, else DeePMD's flat index `ti + tj * ntypes` (docs/deepmd-spec.md §5).
pub fn embed_net_index(type_one_side: bool, ntypes: usize, ti: usize, tj: usize) -> usize {
    if type_one_side {
        tj
    } else {
        ti + tj * ntypes
    }
}

/// se_e3's pairs of neighbour types (ti, tj), ti ≤ tj, in the order of DeePMD-kit's
/// `NetworkCollection` (flat index ti + tj·ntypes ascending): `embed[p]` is the net of pair p.
pub fn pair_types(ntypes: usize) -> Vec<(usize, usize)> {
    (0..ntypes)
        .flat_map(|tj| (0..=tj).map(move |ti| (ti, tj)))
        .collect()
}

impl ParamLayout {
    /// The descriptor's tensors first, then the fitting's, in DeePMD-kit's order.
    pub fn new(spec: &ModelSpec) -> Self {
        let mut b = Builder::default();
        let descriptor = DescriptorLayout::new(&spec.descriptor, spec.ntypes(), &mut b);
        let fitting = FittingLayout::new(spec, &mut b);
        ParamLayout {
            descriptor,
            fitting,
            tensors: b.tensors,
            len: b.len,
        }
    }

    /// Whether parameter `i` is held fixed in training ([`DescriptorLayout::frozen`]).
    pub fn is_frozen(&self, i: usize) -> bool {
        self.descriptor.frozen.iter().any(|r| r.contains(&i))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Where the fitting's tensors begin: the descriptor's are the parameters before.
    pub fn descriptor_len(&self) -> usize {
        (self.fitting.nets.iter().flat_map(|n| &n.layers))
            .flat_map(|l| [Some(l.w), Some(l.b), l.idt])
            .flatten()
            .min()
            .unwrap_or(self.len)
    }
}

/// A descriptor's tensors beside its embedding nets, by family (as [`super::OwnKeys`] its keys).
#[derive(Clone, Debug, PartialEq)]
pub enum OwnNets {
    /// se_e2_a, se_e2_r, se_e3 and their hybrids: the embedding nets are all.
    Embed,
    /// DPA-1's nets beside `embed` (type embedding, strip's type net, attention layers).
    Attention(AttnLayout),
    /// DPA-3's tensors (its nets are not embedding nets: `embed` is empty).
    Dpa3(Dpa3Layout),
    /// DPA-2's tensors (its repinit and three-body nets among them: `embed` is empty).
    Dpa2(Box<Dpa2Layout>),
    /// se_e3_tebd's tensors (`embed` is empty).
    SeE3Tebd(SeE3TebdLayout),
}

impl OwnNets {
    pub fn attn(&self) -> Option<&AttnLayout> {
        match self {
            OwnNets::Attention(a) => Some(a),
            _ => None,
        }
    }

    pub fn dpa3(&self) -> Option<&Dpa3Layout> {
        match self {
            OwnNets::Dpa3(l) => Some(l),
            _ => None,
        }
    }

    pub fn dpa2(&self) -> Option<&Dpa2Layout> {
        match self {
            OwnNets::Dpa2(l) => Some(l),
            _ => None,
        }
    }

    pub fn se_e3_tebd(&self) -> Option<&SeE3TebdLayout> {
        match self {
            OwnNets::SeE3Tebd(l) => Some(l),
            _ => None,
        }
    }
}

impl DescriptorLayout {
    /// The type embedding's layout, where the descriptor has one (DPA-1, DPA-2, se_e3_tebd,
    /// DPA-3).
    pub fn tebd(&self) -> Option<&TebdLayout> {
        match &self.own {
            OwnNets::Embed => None,
            OwnNets::Attention(a) => Some(&a.tebd),
            OwnNets::Dpa3(l) => Some(&l.tebd),
            OwnNets::Dpa2(l) => Some(&l.tebd),
            OwnNets::SeE3Tebd(l) => Some(&l.tebd),
        }
    }

    /// Its descriptor's layout, built by its folder ([`super::registry::Registered::layout`]).
    fn new(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> Self {
        (d.kind.registered().layout)(d, nt, b)
    }

    /// A layout of the descriptor's own tensors alone, `frozen` where its `trainable` is false.
    pub(super) fn own(own: OwnNets, frozen: Vec<Range<usize>>) -> Self {
        DescriptorLayout {
            embed: vec![],
            parts: std::iter::once(0..0).collect(),
            own,
            frozen,
        }
    }

    /// Part k's embedding nets as a layout of their own (offsets still into the whole parameter
    /// vector): what a hybrid's sub-descriptor computes with.
    pub fn part(&self, k: usize) -> DescriptorLayout {
        let nets = self.embed[self.parts[k].clone()].to_vec();
        DescriptorLayout {
            parts: std::iter::once(0..nets.len()).collect(),
            embed: nets,
            own: OwnNets::Embed,
            frozen: vec![],
        }
    }
}

/// The tensors allocated since `start`, held fixed where the descriptor's `trainable` is false.
pub(super) fn untrained(trainable: bool, start: usize, b: &Builder) -> Vec<Range<usize>> {
    (!trainable).then_some(start..b.len()).into_iter().collect()
}

impl FittingLayout {
    /// The fitting: a net from the descriptor to the atomic output (one energy, or `task_dim`
    /// values of a property), per centre type (`fit.t{t}`), or one net (`fit`) for every type
    /// after a mixed-type descriptor.
    fn new(spec: &ModelSpec, b: &mut Builder) -> Self {
        let f = &spec.fitting;
        let dim = spec.fitting_input();
        let out = Some(f.dim_out());
        let nets = if spec.descriptor.is_mixed() {
            vec![b.net(
                "fit".into(),
                dim,
                &f.neuron,
                (f.resnet_dt, f.activation),
                out,
            )]
        } else {
            (0..spec.ntypes())
                .map(|t| {
                    b.net(
                        format!("fit.t{t}"),
                        dim,
                        &f.neuron,
                        (f.resnet_dt, f.activation),
                        out,
                    )
                })
                .collect()
        };
        FittingLayout { nets }
    }

    /// The fitting net of centre type t: `nets[t]`, or the one net of a mixed-type descriptor
    /// (DPA-1), which serves every type.
    pub fn net(&self, t: usize) -> &Net {
        if self.nets.len() == 1 {
            &self.nets[0]
        } else {
            &self.nets[t]
        }
    }
}

/// DeePMD-kit's skip of a layer by its widths (docs/deepmd-spec.md §5).
fn skip_of(nin: usize, nout: usize) -> Skip {
    if nout == nin {
        Skip::Identity
    } else if nout == 2 * nin {
        Skip::Double
    } else {
        Skip::None
    }
}

#[derive(Default)]
pub(super) struct Builder {
    tensors: Vec<TensorInfo>,
    len: usize,
}

impl Builder {
    /// The parameters allocated so far.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn alloc(&mut self, name: String, shape: Vec<usize>) -> usize {
        let offset = self.len;
        self.len += shape.iter().product::<usize>();
        self.tensors.push(TensorInfo {
            name,
            shape,
            offset,
        });
        offset
    }

    /// Hidden layers follow the width-decided skip rules and take `act`; a fitting net (`out`:
    /// its output width) ends in a linear `n_last -> out` layer without skip or timestep.
    pub(super) fn net(
        &mut self,
        name: String,
        nin: usize,
        neuron: &[usize],
        (resnet_dt, act): (bool, Activation),
        out: Option<usize>,
    ) -> Net {
        let mut layers = Vec::new();
        let mut widths: Vec<usize> = neuron.to_vec();
        let linear_out = out.is_some();
        widths.extend(out);
        let mut n_in = nin;
        for (l, &n_out) in widths.iter().enumerate() {
            let is_out = linear_out && l == widths.len() - 1;
            let skip = if is_out {
                Skip::None
            } else {
                skip_of(n_in, n_out)
            };
            let w = self.alloc(format!("{name}.layer{l}.w"), vec![n_in, n_out]);
            let b = self.alloc(format!("{name}.layer{l}.b"), vec![n_out]);
            let idt = (resnet_dt && skip != Skip::None)
                .then(|| self.alloc(format!("{name}.layer{l}.idt"), vec![n_out]));
            layers.push(Layer {
                nin: n_in,
                nout: n_out,
                act: if is_out { Activation::Linear } else { act },
                skip,
                w,
                b,
                idt,
            });
            n_in = n_out;
        }
        Net { name, layers }
    }

    /// The type embedding `tebd.layer0` of `nt` types, `dim` wide.
    pub(super) fn tebd(&mut self, nt: usize, dim: usize, bias: bool) -> TebdLayout {
        let w = self.alloc("tebd.layer0.w".into(), vec![nt, dim]);
        let b = bias.then(|| self.alloc("tebd.layer0.b".into(), vec![dim]));
        TebdLayout {
            ntypes: nt,
            dim,
            skip: skip_of(nt, dim),
            w,
            b,
        }
    }

    /// A linear layer with bias, no skip, no timestep (`{name}.w` `[nin][nout]`, `{name}.b`).
    pub(super) fn linear(&mut self, name: String, nin: usize, nout: usize) -> Layer {
        let w = self.alloc(format!("{name}.w"), vec![nin, nout]);
        let b = self.alloc(format!("{name}.b"), vec![nout]);
        Layer {
            nin,
            nout,
            act: Activation::Linear,
            skip: Skip::None,
            w,
            b,
            idt: None,
        }
    }
}

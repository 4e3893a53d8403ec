//! Where every trainable tensor lives in the flat parameter vector. Names follow the reference
//! export of DeePMD-kit (`embed.t1.layer0.w`, `fit.t0.layer3.b`, ...), so tests can compare by name.

use super::{DescriptorType, ModelSpec};

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
    /// tanh when true, identity (the fitting net's output layer) when false.
    pub tanh: bool,
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

#[derive(Clone, Debug, PartialEq)]
pub struct ParamLayout {
    /// Embedding nets, indexed by [`embed_net_index`] (se_e3: by pair type, [`pair_types`]).
    pub embed: Vec<Net>,
    /// Fitting net of each atom type.
    pub fit: Vec<Net>,
    pub tensors: Vec<TensorInfo>,
    pub len: usize,
    /// The embedding nets of each part of the descriptor ([`super::DescriptorSpec::parts`]):
    /// `embed[parts[k]]`, one range covering them all but for a hybrid.
    pub parts: Vec<std::ops::Range<usize>>,
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
    pub fn new(spec: &ModelSpec) -> Self {
        let nt = spec.ntypes();
        let mut b = Builder::default();
        let hybrid = spec.descriptor.kind == DescriptorType::Hybrid;
        let mut embed = Vec::new();
        let mut parts = Vec::new();
        for (k, d) in spec.descriptor.parts().iter().enumerate() {
            // A hybrid's sub-descriptor k has its nets under `d{k}.`.
            let prefix = if hybrid {
                format!("d{k}.")
            } else {
                String::new()
            };
            let names: Vec<String> = if d.kind == DescriptorType::SeE3 {
                (pair_types(nt).iter())
                    .map(|(ti, tj)| format!("embed.t{ti}_t{tj}"))
                    .collect()
            } else if d.type_one_side {
                (0..nt).map(|k| format!("embed.t{k}")).collect()
            } else {
                (0..nt * nt)
                    .map(|k| format!("embed.c{}_n{}", k % nt, k / nt))
                    .collect()
            };
            let start = embed.len();
            embed
                .extend((names.into_iter()).map(|name| {
                    b.net(format!("{prefix}{name}"), 1, &d.neuron, d.resnet_dt, false)
                }));
            parts.push(start..embed.len());
        }
        let fit = (0..nt)
            .map(|t| {
                let f = &spec.fitting;
                b.net(
                    format!("fit.t{t}"),
                    spec.dim_descrpt(),
                    &f.neuron,
                    f.resnet_dt,
                    true,
                )
            })
            .collect();
        ParamLayout {
            embed,
            fit,
            tensors: b.tensors,
            len: b.len,
            parts,
        }
    }

    /// Part k's embedding nets as a layout of their own (offsets still into the whole parameter
    /// vector; no fitting nets, no tensor list): what a hybrid's sub-descriptor computes with.
    pub fn part(&self, k: usize) -> ParamLayout {
        let nets = self.embed[self.parts[k].clone()].to_vec();
        ParamLayout {
            parts: std::iter::once(0..nets.len()).collect(),
            embed: nets,
            fit: vec![],
            tensors: vec![],
            len: self.len,
        }
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

#[derive(Default)]
struct Builder {
    tensors: Vec<TensorInfo>,
    len: usize,
}

impl Builder {
    fn alloc(&mut self, name: String, shape: Vec<usize>) -> usize {
        let offset = self.len;
        self.len += shape.iter().product::<usize>();
        self.tensors.push(TensorInfo {
            name,
            shape,
            offset,
        });
        offset
    }

    /// Hidden layers follow the width-decided skip rules; the fitting net ends in a linear
    /// `n_last -> 1` layer without skip or timestep.
    fn net(
        &mut self,
        name: String,
        nin: usize,
        neuron: &[usize],
        resnet_dt: bool,
        linear_out: bool,
    ) -> Net {
        let mut layers = Vec::new();
        let mut widths: Vec<usize> = neuron.to_vec();
        if linear_out {
            widths.push(1);
        }
        let mut n_in = nin;
        for (l, &n_out) in widths.iter().enumerate() {
            let is_out = linear_out && l == widths.len() - 1;
            let skip = if is_out {
                Skip::None
            } else if n_out == n_in {
                Skip::Identity
            } else if n_out == 2 * n_in {
                Skip::Double
            } else {
                Skip::None
            };
            let w = self.alloc(format!("{name}.layer{l}.w"), vec![n_in, n_out]);
            let b = self.alloc(format!("{name}.layer{l}.b"), vec![n_out]);
            let idt = (resnet_dt && skip != Skip::None)
                .then(|| self.alloc(format!("{name}.layer{l}.idt"), vec![n_out]));
            layers.push(Layer {
                nin: n_in,
                nout: n_out,
                tanh: !is_out,
                skip,
                w,
                b,
                idt,
            });
            n_in = n_out;
        }
        Net { name, layers }
    }
}

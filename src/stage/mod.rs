//! The model as stages (docs/design.md §10): environment → descriptor → fitting, each with its
//! forward, backward, tangent and dual passes over the backend's ops; `train::step` composes
//! them with the loss.

pub mod descriptor;
pub mod embed;
pub mod env;
pub mod fit_input;
pub mod fitting;
pub mod head;
pub mod linear;
pub mod net;
pub mod pairtab;

use crate::backend::{Backend, BlockOpts, HostBlock, Real};
use crate::geometry::EnvParams;
use crate::model::pairtab::Mix;
use crate::model::{AttentionConfig, DescriptorLayout, DescriptorType, Model, Net};

use embed::Nets;
pub use head::HostHead;

/// Model state on the device: parameters in the backend's precision, statistics, Adam moments.
pub struct DeviceModel<T: Real, B: Backend<T>> {
    /// The model's descriptor (for a hybrid, the whole: its layout holds every part's nets).
    pub desc: DescState<T, B>,
    pub params: B::Buf,
    pub bias: B::Buf,
    pub grad: B::Buf,
    pub m: B::Buf,
    pub v: B::Buf,
    /// A hybrid's sub-descriptors, in `list` order; empty for the others.
    pub parts: Vec<Part<T, B>>,
    /// The fitting net of each centre type (a mixed-type descriptor's one net, for every type).
    pub fitting: Vec<Net>,
    /// The length of the parameter vector (and of `grad`, `m`, `v`).
    pub nparams: usize,
    /// The fitting's input statistics of the frame and atomic parameters
    /// ([`Model::fit_input_avg`]); empty without them.
    pub fit_input_avg: Vec<f64>,
    pub fit_input_inv_std: Vec<f64>,
    /// The case embedding the net takes after them ([`Model::case_embd`]).
    pub case_embd: Vec<f64>,
    /// The fitting's head where it runs on the host; `None` for `ener`.
    pub head: Option<HostHead>,
    /// How a pair table is mixed into the energy (its terms come with each batch); `None`
    /// without one.
    pub pair_table: Option<Mix>,
    /// This DP model's weight in a linear model's energy (1 alone).
    pub weight: f64,
    /// A linear model's other DP models, each a model of its own on the device (this one,
    /// the first, holds the linear model's bias); empty for one DP model.
    pub more: Vec<DeviceModel<T, B>>,
}

/// One descriptor on the device: its nets (offsets into the model's parameter vector),
/// environment settings and statistics.
pub struct DescState<T: Real, B: Backend<T>> {
    pub kind: DescriptorType,
    pub layout: DescriptorLayout,
    pub env: EnvParams,
    pub type_one_side: bool,
    /// DPA-1's attention and type-embedding keys (its nets: `layout.own`); `None` otherwise.
    pub attention: Option<AttentionConfig>,
    /// A message-passing block's constants (DPA-3, DPA-2; its tensors are `layout`'s); `None`
    /// otherwise.
    pub block: Option<BlockOpts>,
    pub davg: B::Buf,
    pub dstd: B::Buf,
}

impl<T: Real, B: Backend<T>> DescState<T, B> {
    fn view<'a>(&'a self, params: &'a B::Buf) -> DescModel<'a, T, B> {
        DescModel {
            kind: self.kind,
            layout: &self.layout,
            env: self.env,
            type_one_side: self.type_one_side,
            attention: self.attention.as_ref(),
            block: self.block.as_ref().map(|b| b.host(&self.layout)),
            davg: &self.davg,
            dstd: &self.dstd,
            params,
        }
    }
}

/// One sub-descriptor of a hybrid on the device, with its neighbour slots per type and its D's
/// shape (M1, M2).
pub struct Part<T: Real, B: Backend<T>> {
    pub state: DescState<T, B>,
    pub sel: Vec<usize>,
    pub m1: usize,
    pub m2: usize,
}

/// What one descriptor's passes read of the model: its nets and statistics over the model's
/// parameters (for a hybrid, one sub-descriptor's).
pub struct DescModel<'a, T: Real, B: Backend<T>> {
    pub kind: DescriptorType,
    pub layout: &'a DescriptorLayout,
    pub env: EnvParams,
    pub type_one_side: bool,
    /// DPA-1's attention and type-embedding keys (its nets: `layout.own`); `None` otherwise.
    pub attention: Option<&'a AttentionConfig>,
    /// A message-passing block with its tensors; `None` otherwise.
    pub block: Option<HostBlock<'a>>,
    pub davg: &'a B::Buf,
    pub dstd: &'a B::Buf,
    pub params: &'a B::Buf,
}

impl<T: Real, B: Backend<T>> DescModel<'_, T, B> {
    /// The embedding nets and which serves each block.
    pub fn nets(&self) -> Nets<'_> {
        Nets {
            layout: self.layout,
            type_one_side: self.type_one_side,
        }
    }
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

impl<T: Real, B: Backend<T>> DeviceModel<T, B> {
    /// The model on the device: a linear model as its DP models, each with its weight, the
    /// first with the linear model's bias.
    pub fn new(b: &B, model: &Model) -> Self {
        if model.spec.linear.is_none() {
            return Self::one(b, model);
        }
        let weights = model.spec.member_weights();
        let members = model.members();
        let mut members = (members.iter().zip(weights)).map(|(m, w)| Self {
            weight: w,
            ..Self::one(b, m)
        });
        let mut first = members.next().expect("a linear model has a DP model");
        first.bias = b.upload(&to_t(&model.bias));
        first.more = members.collect();
        first
    }

    fn one(b: &B, model: &Model) -> Self {
        let layout = model.layout();
        let d = &model.spec.descriptor;
        let n = layout.len;
        let nstat = 4 * model.spec.ntypes();
        let parts = (d.own.list().iter().enumerate())
            .map(|(k, p)| Part {
                state: DescState {
                    kind: p.kind,
                    layout: layout.descriptor.part(k),
                    env: p.env(),
                    type_one_side: p.type_one_side,
                    attention: None,
                    block: None,
                    davg: b.upload(&to_t(&model.davg[k * nstat..(k + 1) * nstat])),
                    dstd: b.upload(&to_t(&model.dstd[k * nstat..(k + 1) * nstat])),
                },
                sel: p.sel.clone(),
                m1: p.m1(),
                m2: p.axis_neuron,
            })
            .collect();
        DeviceModel {
            parts,
            fitting: (0..model.spec.ntypes())
                .map(|t| layout.fitting.net(t).clone())
                .collect(),
            nparams: n,
            fit_input_avg: model.fit_input_avg.clone(),
            fit_input_inv_std: model.fit_input_inv_std.clone(),
            case_embd: model.case_embd.clone(),
            head: HostHead::new(&model.spec.fitting.output, &model.bias, &model.out_std),
            pair_table: (model.spec.short_range.as_ref()).map(|sr| sr.mix.clone()),
            desc: DescState {
                kind: d.kind,
                env: d.env(),
                type_one_side: d.type_one_side,
                attention: d.own.attention().cloned(),
                block: BlockOpts::of(
                    d,
                    model.spec.ntypes(),
                    model.spec.fitting.output.reads_rot(),
                ),
                // Read by the host bodies and tape records of the message-passing blocks.
                davg: b.upload_kept(to_t(&model.davg)),
                dstd: b.upload_kept(to_t(&model.dstd)),
                layout: layout.descriptor,
            },
            params: b.upload(&to_t(&model.params)),
            bias: b.upload(&to_t(&model.bias)),
            grad: b.zeros(n),
            m: b.zeros(n),
            v: b.zeros(n),
            weight: 1.0,
            more: vec![],
        }
    }

    /// Every DP model: this one, then a linear model's others.
    pub fn all(&self) -> impl Iterator<Item = &DeviceModel<T, B>> {
        std::iter::once(self).chain(&self.more)
    }

    /// `f` on every DP model in turn (each without the list of the others).
    pub fn each_mut(&mut self, mut f: impl FnMut(&mut DeviceModel<T, B>)) {
        let mut more = std::mem::take(&mut self.more);
        f(self);
        more.iter_mut().for_each(&mut f);
        self.more = more;
    }

    /// The parameters as f64, for checkpoints and model files (a linear model's, its DP
    /// models' one after the other).
    pub fn params_f64(&self, b: &B) -> Vec<f64> {
        self.concat(b, |m| &m.params)
    }

    pub fn grad_f64(&self, b: &B) -> Vec<f64> {
        self.concat(b, |m| &m.grad)
    }

    /// One vector of every DP model's, concatenated, as f64.
    pub fn concat(&self, b: &B, f: impl Fn(&Self) -> &B::Buf) -> Vec<f64> {
        (self.all())
            .flat_map(|m| b.download(f(m)))
            .map(|x| x.f64())
            .collect()
    }

    /// What the descriptor's passes read: one view, or one per sub-descriptor of a hybrid.
    pub fn views(&self) -> Vec<DescModel<'_, T, B>> {
        views_of(&self.desc, &self.parts, &self.params)
    }

    /// [`DeviceModel::views`], and the gradient to add to.
    pub fn views_grad(&mut self) -> (Vec<DescModel<'_, T, B>>, &mut B::Buf) {
        (
            views_of(&self.desc, &self.parts, &self.params),
            &mut self.grad,
        )
    }
}

fn views_of<'a, T: Real, B: Backend<T>>(
    desc: &'a DescState<T, B>,
    parts: &'a [Part<T, B>],
    params: &'a B::Buf,
) -> Vec<DescModel<'a, T, B>> {
    if parts.is_empty() {
        vec![desc.view(params)]
    } else {
        parts.iter().map(|p| p.state.view(params)).collect()
    }
}

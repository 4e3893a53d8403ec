//! One evaluation or training step over the [`Backend`] trait: forward with G', forces and
//! virial, then (training) the loss residuals, the tangent pass and the dual reverse pass that
//! give the parameter gradient of the full loss, energy + force + virial (docs/design.md §3).
//! A property or DOS model's step is the forward alone, its loss on the host, then the dual
//! reverse with a zero tangent: the plain gradient (docs/design.md §12).

use crate::backend::{Backend, Dims, LossSums, Real};
pub use crate::fitting::head::StepLoss;
use crate::fitting::head::{HeadInputs, HeadLabels};
use crate::fitting::Centres;
use crate::mem::OutOfMemory;
use crate::stage::descriptor::Descriptor;
use crate::stage::env::Env;
use crate::stage::fitting::Fitting;
use crate::stage::linear;
use crate::stage::pairtab::PairTerms;
pub use crate::stage::DeviceModel;

use super::batch::{centre_atoms, HostBatch};
use super::budget::{batch_knob, batch_what, check_workspace};

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

/// Every buffer of a step for one batch shape: the plan of the step. It is made once per shape;
/// each batch is written into it ([`Workspace::load`]), so no buffer changes address from one
/// step to the next.
pub struct Workspace<T: Real, B: Backend<T>> {
    pub dims: Dims,
    env: Env<T, B>,
    labels: [B::Buf; 3],
    descriptor: Descriptor<T, B>,
    fitting: Fitting<T, B>,
    /// The pair table's terms of the batch, for a model with one.
    pair: Option<PairTerms<T, B>>,
    pub e_atom: B::Buf,
    pub energy: B::Buf,
    pub force: B::Buf,
    pub virial: B::Buf,
    q: B::Buf,
    ebar: B::Buf,
    fres: B::Buf,
    vres: B::Buf,
    sums: B::Buf,
    /// A host head's labels of the loaded batch (its loss runs on the host).
    head_labels: HeadLabels,
    /// Every centre's type and frame, for a property's head.
    centre_type: Vec<usize>,
    centre_frame: Vec<usize>,
    /// A linear model's other DP models' workspaces, on their own lists; empty for one DP
    /// model.
    more: Vec<Workspace<T, B>>,
}

impl<T: Real, B: Backend<T>> Workspace<T, B> {
    /// The buffers of batch shape `dims`; the big ones are asked for fallibly, and a failure
    /// names the batch and what makes it smaller.
    /// The model must have one DP model ([`Workspace::for_batch`] serves a linear one).
    pub fn new(b: &B, m: &DeviceModel<T, B>, dims: &Dims) -> anyhow::Result<Self> {
        assert!(
            m.more.is_empty(),
            "a linear model's workspace is made for a batch (Workspace::for_batch)"
        );
        Self::one(b, m, dims)
    }

    /// The buffers of one DP model's passes.
    fn one(b: &B, m: &DeviceModel<T, B>, dims: &Dims) -> anyhow::Result<Self> {
        let (ns, nc, na, nf) = (
            dims.nslots(),
            dims.ncentres(),
            dims.nbatch_atoms(),
            dims.nframes,
        );
        check_workspace(b, m, dims)?;
        let zeros = |n: usize| {
            b.try_zeros(n).map_err(|limit| OutOfMemory {
                what: format!("{}, one of its arrays", batch_what(dims)),
                bytes: n.saturating_mul(size_of::<T>()),
                limit,
                knob: batch_knob(dims),
            })
        };
        let centre_atom = centre_atoms(dims);
        let (no, nsums) = match &m.head {
            Some(h) => (h.dim(), h.nsums()),
            None => (1, LossSums::LEN),
        };
        let mut centre_type = vec![0; nc];
        for t in 0..dims.ntypes {
            centre_type[dims.centres(t)].fill(t);
        }
        Ok(Workspace {
            dims: dims.clone(),
            env: Env::new(
                b,
                dims,
                &zeros,
                &centre_atom,
                // The pair table's weight reads r_ij itself: its seed is a tangent of them.
                (
                    m.desc.kind.is_mixed(),
                    m.desc.kind.reads_rij() || m.pair_table.is_some(),
                ),
            )?,
            labels: [zeros(nf)?, zeros(3 * na)?, zeros(9 * nf)?],
            descriptor: Descriptor::new(b, m, dims, &zeros, &centre_atom)?,
            fitting: Fitting::new(b, m, dims, &zeros)?,
            pair: match &m.pair_table {
                Some(mix) => Some(PairTerms::new(dims, &zeros, mix)?),
                None => None,
            },
            e_atom: zeros(nc)?,
            energy: zeros(nf)?,
            force: zeros(3 * na)?,
            virial: zeros(9 * nf)?,
            q: zeros(3 * ns)?,
            ebar: zeros(nc * no)?,
            fres: zeros(3 * na)?,
            vres: zeros(9 * nf)?,
            sums: zeros(nsums)?,
            head_labels: HeadLabels::default(),
            centre_type,
            centre_frame: (0..nc).map(|c| dims.centre_frame(c)).collect(),
            more: vec![],
        })
    }

    /// The buffers of `batch`'s shape: for a linear model, each DP model's on its list, each
    /// with its weight as the seed of its fitting's passes.
    pub fn for_batch(b: &B, m: &DeviceModel<T, B>, batch: &HostBatch) -> anyhow::Result<Self> {
        let mut w = Self::one(b, m, &batch.dims)?;
        w.more = (m.more.iter().zip(&batch.more))
            .map(|(k, kb)| Self::one(b, k, &kb.dims))
            .collect::<anyhow::Result<_>>()?;
        w.weigh(b, m.weight);
        for (wk, k) in w.more.iter_mut().zip(&m.more) {
            wk.weigh(b, k.weight);
        }
        Ok(w)
    }

    /// A DP model's weight in a linear model, as the seed of its fitting's passes.
    fn weigh(&mut self, b: &B, weight: f64) {
        if weight != 1.0 {
            let seed = b.upload(&vec![T::of(weight); self.dims.ncentres()]);
            self.fitting.load_seed(b, &seed);
        }
    }

    /// Whether the workspace is made for `batch`'s shape.
    pub fn fits(&self, batch: &HostBatch) -> bool {
        self.dims == batch.dims
            && (self.more.iter().map(|w| &w.dims)).eq(batch.more.iter().map(|b| &b.dims))
    }

    /// R̂ of every slot, `[nslots][4]` in the block order of [`Dims`].
    pub fn rhat(&self) -> &B::Buf {
        &self.env.rhat
    }

    /// The descriptor of every centre, `[ncentres][M1·M2]`.
    pub fn descriptor(&self) -> &B::Buf {
        self.descriptor.desc()
    }

    /// The loss sums of the last [`gradient`], on the device.
    pub fn sums(&self) -> &B::Buf {
        &self.sums
    }

    /// The loss sums of the last [`gradient`], for the data-parallel all-reduce.
    pub fn sums_mut(&mut self) -> &mut B::Buf {
        &mut self.sums
    }

    /// The loss sums of the last [`gradient`] (a read-back).
    pub fn loss_sums(&self, b: &B) -> Vec<f64> {
        b.download(&self.sums).iter().map(|x| x.f64()).collect()
    }

    /// What a host head reads of the last [`forward`] (read-backs).
    pub fn head_inputs(&self, b: &B) -> HeadInputs {
        let read = |x: &&B::Buf| b.download(x).iter().map(|x| x.f64()).collect();
        HeadInputs::from_reads(self.head_bufs().iter().map(read).collect())
    }

    /// The buffers of [`Workspace::head_inputs`] (the nets' outputs, then a tensor's A), for
    /// reads by the run's driver.
    pub fn head_bufs(&self) -> Vec<&B::Buf> {
        let mut v = vec![self.fitting.e_fit()];
        v.extend(self.descriptor.rot());
        v
    }

    /// Where each centre is, for a property's head.
    pub fn centres(&self) -> Centres<'_> {
        Centres {
            types: &self.centre_type,
            frames: &self.centre_frame,
            nframes: self.dims.nframes,
            natoms: self.dims.natoms,
        }
    }

    /// Writes a batch's geometry and labels into the workspace's buffers. (The centre table
    /// is a function of the shape, written once by [`Workspace::new`].)
    pub fn load(&mut self, b: &B, batch: &HostBatch) {
        assert_eq!(
            batch.dims, self.dims,
            "workspace built for another batch shape"
        );
        debug_assert_eq!(batch.centre_atom, centre_atoms(&self.dims));
        b.write(&mut self.env.rij, &to_t(&batch.rij));
        b.write_idx(&mut self.env.owner, &batch.owner);
        if let Some(t) = &mut self.env.nei_type {
            b.write_idx(t, &batch.nei_type);
        }
        let [e, f, v] = &mut self.labels;
        b.write(e, &to_t(&batch.energy));
        b.write(f, &to_t(&batch.force));
        b.write(v, &to_t(&batch.virial));
        self.head_labels.clone_from(&batch.head_labels);
        self.fitting.load(b, &batch.fit_input);
        if let Some(p) = &mut self.pair {
            let x = (batch.short_range.as_ref()).expect("a batch of a model with a pair table");
            p.load(b, x);
            self.fitting.load_seed(b, &p.weight);
        }
        for (w, batch) in self.more.iter_mut().zip(&batch.more) {
            w.load(b, batch);
        }
    }

    /// The buffers a batch is loaded into: r_ij, owners and labels (energy, force, virial),
    /// for gathering a batch on the device (`train::resident`).
    pub(super) fn inputs_mut(&mut self) -> (&mut B::Buf, &mut B::Idx, &mut [B::Buf; 3]) {
        (&mut self.env.rij, &mut self.env.owner, &mut self.labels)
    }

    /// The per-slot neighbour types of a mixed-type descriptor (DPA-1), for gathering a batch
    /// on the device (`train::resident`); `None` for the others.
    pub(super) fn nei_type_mut(&mut self) -> Option<&mut B::Idx> {
        self.env.nei_type.as_mut()
    }

    /// The identities ([`Device::buf_id`](crate::backend::Device::buf_id)) of every buffer of the plan, in a fixed order.
    pub fn buffer_ids(&self, b: &B) -> Vec<u64> {
        let mut bufs: Vec<&B::Buf> = self.env.buffers().to_vec();
        bufs.extend(&self.labels);
        bufs.extend(self.descriptor.buffers());
        bufs.extend(self.fitting.buffers());
        bufs.extend(self.pair.iter().flat_map(PairTerms::buffers));
        bufs.extend([
            &self.e_atom,
            &self.energy,
            &self.force,
            &self.virial,
            &self.q,
            &self.ebar,
            &self.fres,
            &self.vres,
            &self.sums,
        ]);
        let mut ids: Vec<u64> = bufs.into_iter().map(|x| b.buf_id(x)).collect();
        ids.extend([b.idx_id(&self.env.owner), b.idx_id(&self.env.centre_atom)]);
        ids.extend(self.env.nei_type.iter().map(|t| b.idx_id(t)));
        ids.extend(self.more.iter().flat_map(|w| w.buffer_ids(b)));
        ids
    }
}

/// Energy, forces and virial of the loaded batch (the forward and first-derivative passes);
/// for a property model, the nets' outputs alone ([`Workspace::head_inputs`]).
pub fn forward<T: Real, B: Backend<T>>(b: &B, m: &DeviceModel<T, B>, w: &mut Workspace<T, B>) {
    if !m.more.is_empty() {
        return forward_linear(b, m, w);
    }
    let d = &w.dims;
    w.descriptor.forward(b, m, d, &mut w.env);
    w.fitting
        .forward(b, m, d, w.descriptor.desc(), m.head.is_none());
    if m.head.is_some() {
        return;
    }
    match &w.pair {
        None => b.energy(d, w.fitting.e_fit(), &m.bias, &mut w.e_atom, &mut w.energy),
        Some(p) => b.mix_energy(
            d,
            w.fitting.e_fit(),
            &m.bias,
            &p.weight,
            &p.pair_e,
            &mut w.e_atom,
            &mut w.energy,
        ),
    }
    let (dbar, _) = w.fitting.adjoints();
    w.descriptor.backward(b, m, d, &w.env, dbar, &mut w.q);
    if let Some(p) = w.pair.as_ref().filter(|p| p.moving_weight) {
        b.mix_force(d, w.fitting.e_fit(), &p.dweight, &mut w.q);
    }
    b.force_virial(
        d,
        &w.q,
        &w.env.rij,
        &w.env.owner,
        &w.env.centre_atom,
        &mut w.force,
        &mut w.virial,
    );
    if let Some(p) = &w.pair {
        b.mix_table(
            d,
            &p.pair_force,
            &p.pair_virial,
            &mut w.force,
            &mut w.virial,
        );
    }
}

/// A DP model's energies (the nets' outputs) and, its weight seeding the fitting's backward,
/// its weighted forces and virial into the workspace's `force` and `virial`.
fn forward_member<T: Real, B: Backend<T>>(b: &B, m: &DeviceModel<T, B>, w: &mut Workspace<T, B>) {
    let d = &w.dims;
    w.descriptor.forward(b, m, d, &mut w.env);
    w.fitting.forward(b, m, d, w.descriptor.desc(), true);
    let (dbar, _) = w.fitting.adjoints();
    w.descriptor.backward(b, m, d, &w.env, dbar, &mut w.q);
    b.force_virial(
        d,
        &w.q,
        &w.env.rij,
        &w.env.owner,
        &w.env.centre_atom,
        &mut w.force,
        &mut w.virial,
    );
}

/// [`forward`] of a linear model: each DP model's, then their weighted sum with the linear
/// model's bias.
fn forward_linear<T: Real, B: Backend<T>>(b: &B, m: &DeviceModel<T, B>, w: &mut Workspace<T, B>) {
    forward_member(b, m, w);
    for (wk, k) in w.more.iter_mut().zip(&m.more) {
        forward_member(b, k, wk);
    }
    let mut e_fit = vec![(w.fitting.e_fit(), m.weight)];
    e_fit.extend((w.more.iter().zip(&m.more)).map(|(wk, k)| (wk.fitting.e_fit(), k.weight)));
    linear::energy(b, &w.dims, &e_fit, &m.bias, &mut w.e_atom, &mut w.energy);
    for wk in &w.more {
        linear::add(b, &wk.force, &mut w.force);
        linear::add(b, &wk.virial, &mut w.virial);
    }
}

/// After [`forward`]: the loss of the batch and its gradient with respect to every parameter,
/// left in `m.grad`; the loss sums stay on the device ([`Workspace::loss_sums`]).
pub fn gradient<'l, T: Real, B: Backend<T>>(
    b: &B,
    m: &mut DeviceModel<T, B>,
    w: &mut Workspace<T, B>,
    loss: impl Into<StepLoss<'l>>,
) {
    let d = &w.dims;
    match loss.into() {
        StepLoss::Ener(pref) => b.loss(
            d,
            pref,
            [&w.energy, &w.force, &w.virial],
            [&w.labels[0], &w.labels[1], &w.labels[2]],
            &mut w.ebar,
            &mut w.fres,
            &mut w.vres,
            &mut w.sums,
        ),
        loss => {
            // The head and loss on the host; fres and vres stay 0, so the tangent is 0 and the
            // dual reverse below is the plain reverse pass.
            let head = m
                .head
                .as_ref()
                .expect("a host head's loss trains its model");
            let x = w.head_inputs(b);
            let l = head.loss(loss, &w.centres(), &x, &w.head_labels);
            b.write(&mut w.sums, &to_t(&l.sums));
            b.write(&mut w.ebar, &to_t(&l.ybar));
            if let Some(rot_bar) = w.descriptor.rot_bar_mut() {
                b.write(rot_bar, &to_t(&l.abar));
            }
        }
    }
    // A linear model: each other DP model's passes on its share of the energies' adjoint (the
    // force and virial seeds are the same for all: their weights seed the fittings).
    for (wk, k) in w.more.iter_mut().zip(&mut m.more) {
        b.copy(&w.ebar, &mut wk.ebar, 0);
        linear::scale(b, &mut wk.ebar, k.weight);
        dual_passes(b, k, wk, (&w.fres, &w.vres));
    }
    if m.weight != 1.0 {
        linear::scale(b, &mut w.ebar, m.weight);
    }
    w.descriptor
        .tangent(b, m, d, &mut w.env, (&w.fres, &w.vres));
    if let Some(p) = &w.pair {
        let rijdot = (w.env.rijdot.as_ref()).expect("a pair table's model has ṙ_ij");
        b.mix_seed(d, &p.weight, &p.dweight, rijdot, &mut w.ebar);
    }
    reverse(b, m, w);
}

/// A linear model's other DP model's tangent and dual reverse passes from the loss's seeds: its
/// gradient into its `grad`.
fn dual_passes<T: Real, B: Backend<T>>(
    b: &B,
    m: &mut DeviceModel<T, B>,
    w: &mut Workspace<T, B>,
    seeds: (&B::Buf, &B::Buf),
) {
    let d = &w.dims;
    w.descriptor.tangent(b, m, d, &mut w.env, seeds);
    reverse(b, m, w);
}

/// The dual reverse pass after the tangent: the gradient of one DP model into its `grad`.
fn reverse<T: Real, B: Backend<T>>(b: &B, m: &mut DeviceModel<T, B>, w: &mut Workspace<T, B>) {
    let d = &w.dims;
    b.fill(&mut m.grad, T::zero());
    let desc = (w.descriptor.desc(), w.descriptor.ddot());
    w.fitting.dual(b, m, d, desc, &w.ebar);
    w.descriptor.dual(b, m, d, &w.env, w.fitting.adjoints());
}

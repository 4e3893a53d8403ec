//! One evaluation or training step over the [`Backend`] trait: forward with G', forces and
//! virial, then (training) the loss residuals, the tangent pass and the dual reverse pass that
//! give the parameter gradient of the full loss, energy + force + virial (docs/design.md §3).
//! A property or DOS model's step is the forward alone, its loss on the host, then the dual
//! reverse with a zero tangent: the plain gradient (docs/design.md §12).

use crate::backend::{Backend, Dims, Real};
pub use crate::fitting::head::StepLoss;
use crate::fitting::head::{HeadInputs, HeadLabels};
use crate::fitting::Centres;
use crate::mem::OutOfMemory;
use crate::stage::descriptor::Descriptor;
use crate::stage::env::Env;
use crate::stage::fitting::Fitting;
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
}

impl<T: Real, B: Backend<T>> Workspace<T, B> {
    /// The buffers of batch shape `dims`; the big ones are asked for fallibly, and a failure
    /// names the batch and what makes it smaller.
    pub fn new(b: &B, m: &DeviceModel<T, B>, dims: &Dims) -> anyhow::Result<Self> {
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
            None => (1, 3),
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
        })
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
        ids
    }
}

/// Energy, forces and virial of the loaded batch (the forward and first-derivative passes);
/// for a property model, the nets' outputs alone ([`Workspace::head_inputs`]).
pub fn forward<T: Real, B: Backend<T>>(b: &B, m: &DeviceModel<T, B>, w: &mut Workspace<T, B>) {
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
    w.descriptor
        .tangent(b, m, d, &mut w.env, (&w.fres, &w.vres));
    if let Some(p) = &w.pair {
        let rijdot = (w.env.rijdot.as_ref()).expect("a pair table's model has ṙ_ij");
        b.mix_seed(d, &p.weight, &p.dweight, rijdot, &mut w.ebar);
    }
    b.fill(&mut m.grad, T::zero());
    let desc = (w.descriptor.desc(), w.descriptor.ddot());
    w.fitting.dual(b, m, d, desc, &w.ebar);
    w.descriptor.dual(b, m, d, &w.env, w.fitting.adjoints());
}

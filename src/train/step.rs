//! One evaluation or training step over the [`Backend`] trait: forward with G', forces and
//! virial, then (training) the loss residuals, the tangent pass and the dual reverse pass that
//! give the parameter gradient of the full loss, energy + force + virial (docs/design.md §3).

use std::ops::Range;

use crate::backend::{Backend, ContractDual, DenseIo, Dims, LossSums, Prefactors, Real};
use crate::geometry::EnvParams;
use crate::mem::OutOfMemory;
use crate::model::{embed_net_index, Model, Net, ParamLayout};

use super::batch::{centre_atoms, HostBatch};

/// Model state on the device: parameters in the backend's precision, statistics, Adam moments.
pub struct DeviceModel<T: Real, B: Backend<T>> {
    pub layout: ParamLayout,
    pub env: EnvParams,
    pub type_one_side: bool,
    pub params: B::Buf,
    pub davg: B::Buf,
    pub dstd: B::Buf,
    pub bias: B::Buf,
    pub grad: B::Buf,
    pub m: B::Buf,
    pub v: B::Buf,
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

impl<T: Real, B: Backend<T>> DeviceModel<T, B> {
    pub fn new(b: &B, model: &Model) -> Self {
        let layout = model.layout();
        let d = &model.spec.descriptor;
        let n = layout.len;
        DeviceModel {
            env: EnvParams {
                rcut: d.rcut,
                rcut_smth: d.rcut_smth,
                protection: d.env_protection,
            },
            type_one_side: d.type_one_side,
            params: b.upload(&to_t(&model.params)),
            davg: b.upload(&to_t(&model.davg)),
            dstd: b.upload(&to_t(&model.dstd)),
            bias: b.upload(&to_t(&model.bias)),
            grad: b.zeros(n),
            m: b.zeros(n),
            v: b.zeros(n),
            layout,
        }
    }

    /// The parameters as f64, for checkpoints and model files.
    pub fn params_f64(&self, b: &B) -> Vec<f64> {
        b.download(&self.params).iter().map(|x| x.f64()).collect()
    }

    pub fn grad_f64(&self, b: &B) -> Vec<f64> {
        b.download(&self.grad).iter().map(|x| x.f64()).collect()
    }

    fn embed_net(&self, d: &Dims, ti: usize, tj: usize) -> &Net {
        &self.layout.embed[embed_net_index(self.type_one_side, d.ntypes, ti, tj)]
    }
}

/// Per-layer buffers of one net over its rows: input-side tangents and adjoints are per layer
/// too, since layer widths differ.
struct NetCache<Buf> {
    h: Vec<Buf>,
    y: Vec<Buf>,
    zdot: Vec<Buf>,
    ydot: Vec<Buf>,
    xbar: Vec<Buf>,
    xdotbar: Vec<Buf>,
}

impl<Buf> NetCache<Buf> {
    fn all(&self) -> impl Iterator<Item = &Buf> {
        [
            &self.h,
            &self.y,
            &self.zdot,
            &self.ydot,
            &self.xbar,
            &self.xdotbar,
        ]
        .into_iter()
        .flatten()
    }

    fn new(
        zeros: &impl Fn(usize) -> Result<Buf, OutOfMemory>,
        net: &Net,
        rows: usize,
    ) -> Result<Self, OutOfMemory> {
        let out = |f: &dyn Fn(&crate::model::Layer) -> usize| {
            net.layers
                .iter()
                .map(|l| zeros(rows * f(l)))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(NetCache {
            h: out(&|l| l.nout)?,
            y: out(&|l| l.nout)?,
            zdot: out(&|l| l.nout)?,
            ydot: out(&|l| l.nout)?,
            xbar: out(&|l| l.nin)?,
            xdotbar: out(&|l| l.nin)?,
        })
    }
}

/// Embedding values: G and G' alone when the backend fuses the nets, else every layer's.
enum Embed<Buf> {
    Fused { g: Buf, gp: Buf },
    Layered(NetCache<Buf>),
}

impl<Buf> Embed<Buf> {
    fn g_gp(&self) -> (&Buf, &Buf) {
        match self {
            Embed::Fused { g, gp } => (g, gp),
            Embed::Layered(c) => (c.y.last().unwrap(), c.ydot.last().unwrap()),
        }
    }
}

/// Every buffer of a step for one batch shape: the plan of the step. It is made once per shape;
/// each batch is written into it ([`Workspace::load`]), so no buffer changes address from one
/// step to the next.
pub struct Workspace<T: Real, B: Backend<T>> {
    pub dims: Dims,
    rij: B::Buf,
    owner: B::Idx,
    centre_atom: B::Idx,
    labels: [B::Buf; 3],
    rhat: B::Buf,
    jac: B::Buf,
    s: B::Buf,
    ones_s: B::Buf,
    ones_c: B::Buf,
    embed: Embed<B::Buf>,
    a: B::Buf,
    desc: B::Buf,
    fit: NetCache<B::Buf>,
    pub e_atom: B::Buf,
    pub energy: B::Buf,
    pub force: B::Buf,
    pub virial: B::Buf,
    abar: B::Buf,
    q: B::Buf,
    ebar: B::Buf,
    fres: B::Buf,
    vres: B::Buf,
    sums: B::Buf,
    rdot: B::Buf,
    sdot: B::Buf,
    adot: B::Buf,
    ddot: B::Buf,
    gbar: B::Buf,
    gdotbar: B::Buf,
}

impl<T: Real, B: Backend<T>> Workspace<T, B> {
    /// The buffers of batch shape `dims`; the big ones are asked for fallibly, and a failure
    /// names the batch and what makes it smaller.
    pub fn new(b: &B, layout: &ParamLayout, dims: &Dims) -> Result<Self, OutOfMemory> {
        let (ns, nc, na) = (dims.nslots(), dims.ncentres(), dims.nframes * dims.natoms);
        let (m1, m2, nf) = (dims.m1, dims.m2, dims.nframes);
        let ones = |n| b.upload(&vec![T::one(); n]);
        let zeros = |n: usize| {
            b.try_zeros(n).ok_or_else(|| OutOfMemory {
                what: format!(
                    "the workspace of a batch of {} frame{} of {} atoms ({ns} neighbour slots), \
                     one of its arrays",
                    dims.nframes,
                    if dims.nframes == 1 { "" } else { "s" },
                    dims.natoms,
                ),
                bytes: n.saturating_mul(size_of::<T>()),
                knob: if dims.nframes > 1 {
                    "a smaller batch_size (training_data, validation_data) lowers it".into()
                } else {
                    "one frame is the smallest batch: a smaller descriptor sel or neuron lowers it"
                        .into()
                },
            })
        };
        // Ḡ, Ġ̄ of every slot, unless the backend's fused stage never writes them.
        let slot_adjoints = if b.fused_embedding() && b.fuses_contract_dual() {
            0
        } else {
            m1 * ns
        };
        Ok(Workspace {
            dims: dims.clone(),
            rij: zeros(3 * ns)?,
            owner: b.upload_idx(&vec![-1; ns]),
            centre_atom: b.upload_idx(&centre_atoms(dims)),
            labels: [zeros(nf)?, zeros(3 * na)?, zeros(9 * nf)?],
            rhat: zeros(4 * ns)?,
            jac: zeros(12 * ns)?,
            s: zeros(ns)?,
            ones_s: ones(ns),
            ones_c: ones(nc),
            embed: if b.fused_embedding() {
                Embed::Fused {
                    g: zeros(ns * m1)?,
                    gp: zeros(ns * m1)?,
                }
            } else {
                Embed::Layered(NetCache::new(&zeros, &layout.embed[0], ns)?)
            },
            a: zeros(4 * m1 * nc)?,
            desc: zeros(m1 * m2 * nc)?,
            fit: NetCache::new(&zeros, &layout.fit[0], nc)?,
            e_atom: zeros(nc)?,
            energy: zeros(nf)?,
            force: zeros(3 * na)?,
            virial: zeros(9 * nf)?,
            abar: zeros(4 * m1 * nc)?,
            q: zeros(3 * ns)?,
            ebar: zeros(nc)?,
            fres: zeros(3 * na)?,
            vres: zeros(9 * nf)?,
            sums: zeros(3)?,
            rdot: zeros(4 * ns)?,
            sdot: zeros(ns)?,
            adot: zeros(4 * m1 * nc)?,
            ddot: zeros(m1 * m2 * nc)?,
            gbar: zeros(slot_adjoints)?,
            gdotbar: zeros(slot_adjoints)?,
        })
    }

    /// R̂ of every slot, `[nslots][4]` in the block order of [`Dims`].
    pub fn rhat(&self) -> &B::Buf {
        &self.rhat
    }

    /// The descriptor of every centre, `[ncentres][M1·M2]`.
    pub fn descriptor(&self) -> &B::Buf {
        &self.desc
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
    pub fn loss_sums(&self, b: &B) -> LossSums {
        LossSums::from_values(&b.download(&self.sums))
    }

    /// Writes a batch's geometry and labels into the workspace's buffers. (The centre table
    /// is a function of the shape, written once by [`Workspace::new`].)
    pub fn load(&mut self, b: &B, batch: &HostBatch) {
        assert_eq!(
            batch.dims, self.dims,
            "workspace built for another batch shape"
        );
        debug_assert_eq!(batch.centre_atom, centre_atoms(&self.dims));
        b.write(&mut self.rij, &to_t(&batch.rij));
        b.write_idx(&mut self.owner, &batch.owner);
        let [e, f, v] = &mut self.labels;
        b.write(e, &to_t(&batch.energy));
        b.write(f, &to_t(&batch.force));
        b.write(v, &to_t(&batch.virial));
    }

    /// The buffers a batch is loaded into: r_ij, owners and labels (energy, force, virial),
    /// for gathering a batch on the device (`train::resident`).
    pub(super) fn inputs_mut(&mut self) -> (&mut B::Buf, &mut B::Idx, &mut [B::Buf; 3]) {
        (&mut self.rij, &mut self.owner, &mut self.labels)
    }

    /// The identities ([`Backend::buf_id`]) of every buffer of the plan, in a fixed order.
    pub fn buffer_ids(&self, b: &B) -> Vec<u64> {
        let mut bufs: Vec<&B::Buf> = vec![&self.rij];
        bufs.extend(&self.labels);
        bufs.extend([&self.rhat, &self.jac, &self.s, &self.ones_s, &self.ones_c]);
        match &self.embed {
            Embed::Fused { g, gp } => bufs.extend([g, gp]),
            Embed::Layered(c) => bufs.extend(c.all()),
        }
        bufs.extend([&self.a, &self.desc]);
        bufs.extend(self.fit.all());
        bufs.extend([
            &self.e_atom,
            &self.energy,
            &self.force,
            &self.virial,
            &self.abar,
            &self.q,
            &self.ebar,
            &self.fres,
            &self.vres,
            &self.sums,
            &self.rdot,
            &self.sdot,
            &self.adot,
            &self.ddot,
            &self.gbar,
            &self.gdotbar,
        ]);
        let mut ids: Vec<u64> = bufs.into_iter().map(|x| b.buf_id(x)).collect();
        ids.extend([b.idx_id(&self.owner), b.idx_id(&self.centre_atom)]);
        ids
    }
}

/// Energy, forces and virial of the loaded batch (the forward and first-derivative passes).
pub fn forward<T: Real, B: Backend<T>>(b: &B, m: &DeviceModel<T, B>, w: &mut Workspace<T, B>) {
    let d = w.dims.clone();
    b.env_mat(
        &d,
        m.env,
        &w.rij,
        &w.owner,
        &m.davg,
        &m.dstd,
        &mut w.rhat,
        &mut w.jac,
        &mut w.s,
    );
    let nets = embed_nets(&m.layout, m.type_one_side, &d);
    match &mut w.embed {
        Embed::Fused { g, gp } => b.embed_forward(&d, &nets, &m.params, &w.s, &w.owner, g, gp),
        Embed::Layered(c) => embed_forward_layered(b, m, &d, &w.s, &w.ones_s, c),
    }
    let (g, gp) = w.embed.g_gp();
    b.contract_forward(&d, g, &w.rhat, &mut w.a, &mut w.desc);
    // Fitting nets, forward then back to g = ∂E_i/∂D_i.
    for t in 0..d.ntypes {
        let net = &m.layout.fit[t];
        let rows = d.centres(t);
        let c = &mut w.fit;
        for (l, layer) in net.layers.iter().enumerate() {
            let (head, tail) = c.y.split_at_mut(l);
            let x = if l == 0 { &w.desc } else { &head[l - 1] };
            b.dense_forward(layer, &m.params, rows.clone(), x, &mut c.h[l], &mut tail[0]);
        }
        for (l, layer) in net.layers.iter().enumerate().rev() {
            let (head, tail) = c.xbar.split_at_mut(l + 1);
            let ybar = if l + 1 == net.layers.len() {
                &w.ones_c
            } else {
                &tail[0]
            };
            b.dense_backward(layer, &m.params, rows.clone(), &c.h[l], ybar, &mut head[l]);
        }
    }
    let e_fit = w.fit.y.last().unwrap();
    b.energy(&d, e_fit, &m.bias, &mut w.e_atom, &mut w.energy);
    b.contract_backward(&d, &w.a, &w.fit.xbar[0], &mut w.abar);
    b.slot_backward(&d, &w.abar, g, gp, &w.rhat, &w.jac, &mut w.q);
    b.force_virial(
        &d,
        &w.q,
        &w.rij,
        &w.owner,
        &w.centre_atom,
        &mut w.force,
        &mut w.virial,
    );
}

/// After [`forward`]: the loss of the batch and its gradient with respect to every parameter,
/// left in `m.grad`; the loss sums stay on the device ([`Workspace::loss_sums`]).
pub fn gradient<T: Real, B: Backend<T>>(
    b: &B,
    m: &mut DeviceModel<T, B>,
    w: &mut Workspace<T, B>,
    pref: Prefactors,
) {
    let d = w.dims.clone();
    b.loss(
        &d,
        pref,
        [&w.energy, &w.force, &w.virial],
        [&w.labels[0], &w.labels[1], &w.labels[2]],
        &mut w.ebar,
        &mut w.fres,
        &mut w.vres,
        &mut w.sums,
    );
    b.virtual_tangent(
        &d,
        &w.fres,
        &w.vres,
        &w.jac,
        &w.rij,
        &w.owner,
        &w.centre_atom,
        &mut w.rdot,
        &mut w.sdot,
    );
    let (g, gp) = w.embed.g_gp();
    b.contract_tangent(&d, g, gp, &w.rhat, &w.rdot, &w.a, &mut w.adot, &mut w.ddot);
    b.fill(&mut m.grad, T::zero());
    // Fitting nets: tangent forward from Ḋ, then the dual reverse seeded with (∂L/∂E, 1).
    for t in 0..d.ntypes {
        let net = &m.layout.fit[t];
        let rows = d.centres(t);
        let c = &mut w.fit;
        for (l, layer) in net.layers.iter().enumerate() {
            let (head, tail) = c.ydot.split_at_mut(l);
            let xdot = if l == 0 { &w.ddot } else { &head[l - 1] };
            b.dense_tangent(
                layer,
                &m.params,
                rows.clone(),
                &c.h[l],
                xdot,
                &mut c.zdot[l],
                &mut tail[0],
            );
        }
        let dual = NetDual {
            input: (&w.desc, &w.ddot),
            seed: (&w.ebar, &w.ones_c),
            scale: None,
            input_adjoint: true,
        };
        net_dual_backward(b, &m.params, &mut m.grad, net, rows, c, dual);
    }
    // Embedding nets: dual reverse with input tangent ṡ; nothing flows into R̂ (coordinates
    // are data), so no input adjoint leaves layer 0.
    let nets = embed_nets(&m.layout, m.type_one_side, &d);
    let contract = ContractDual {
        a: &w.a,
        adot: &w.adot,
        dbar: &w.fit.xbar[0],
        ddotbar: &w.fit.xdotbar[0],
        rhat: &w.rhat,
        rdot: &w.rdot,
    };
    match &mut w.embed {
        Embed::Fused { .. } => b.contract_embed_dual(
            &d,
            &nets,
            &m.params,
            &w.s,
            &w.owner,
            &w.sdot,
            contract,
            &mut w.gbar,
            &mut w.gdotbar,
            &mut m.grad,
        ),
        Embed::Layered(c) => {
            contract.run(b, &d, &mut w.gbar, &mut w.gdotbar);
            embed_dual_layered(b, m, &d, &w.s, &w.ones_s, &w.sdot, &w.gbar, &w.gdotbar, c)
        }
    }
}

/// G and G' layer by layer through the dense ops, keeping every layer for the dual pass.
fn embed_forward_layered<T: Real, B: Backend<T>>(
    b: &B,
    m: &DeviceModel<T, B>,
    d: &Dims,
    s: &B::Buf,
    ones: &B::Buf,
    c: &mut NetCache<B::Buf>,
) {
    for ti in 0..d.ntypes {
        for tj in 0..d.ntypes {
            let rows = d.block(ti, tj);
            let net = m.embed_net(d, ti, tj);
            for (l, layer) in net.layers.iter().enumerate() {
                let (head_y, tail_y) = c.y.split_at_mut(l);
                let (head_yd, tail_yd) = c.ydot.split_at_mut(l);
                let (x, xdot) = if l == 0 {
                    (s, ones)
                } else {
                    (&head_y[l - 1], &head_yd[l - 1])
                };
                b.dense_forward(
                    layer,
                    &m.params,
                    rows.clone(),
                    x,
                    &mut c.h[l],
                    &mut tail_y[0],
                );
                b.dense_tangent(
                    layer,
                    &m.params,
                    rows.clone(),
                    &c.h[l],
                    xdot,
                    &mut c.zdot[l],
                    &mut tail_yd[0],
                );
            }
        }
    }
}

/// The embedding dual reverse layer by layer, the stored unit tangents scaled by ṡ.
#[allow(clippy::too_many_arguments)]
fn embed_dual_layered<T: Real, B: Backend<T>>(
    b: &B,
    m: &mut DeviceModel<T, B>,
    d: &Dims,
    s: &B::Buf,
    ones: &B::Buf,
    sdot: &B::Buf,
    gbar: &B::Buf,
    gdotbar: &B::Buf,
    c: &mut NetCache<B::Buf>,
) {
    for ti in 0..d.ntypes {
        for tj in 0..d.ntypes {
            let net = &m.layout.embed[embed_net_index(m.type_one_side, d.ntypes, ti, tj)];
            let dual = NetDual {
                input: (s, ones),
                seed: (gbar, gdotbar),
                scale: Some(sdot),
                input_adjoint: false,
            };
            net_dual_backward(b, &m.params, &mut m.grad, net, d.block(ti, tj), c, dual);
        }
    }
}

/// What one net's dual reverse starts from: its input (value, tangent), the adjoints of its
/// output (ȳ, ẏ̄), the per-row tangent scale of [`Backend::dense_dual_backward`], and
/// whether the adjoints of the input are wanted (they are `c.xbar[0]`, `c.xdotbar[0]`).
struct NetDual<'a, Buf> {
    input: (&'a Buf, &'a Buf),
    seed: (&'a Buf, &'a Buf),
    scale: Option<&'a Buf>,
    input_adjoint: bool,
}

/// The dual reverse through the layers of `net` on `rows`, accumulating into `grad`.
fn net_dual_backward<T: Real, B: Backend<T>>(
    b: &B,
    params: &B::Buf,
    grad: &mut B::Buf,
    net: &Net,
    rows: Range<usize>,
    c: &mut NetCache<B::Buf>,
    dual: NetDual<B::Buf>,
) {
    for (l, layer) in net.layers.iter().enumerate().rev() {
        let (xb_head, xb_tail) = c.xbar.split_at_mut(l + 1);
        let (xdb_head, xdb_tail) = c.xdotbar.split_at_mut(l + 1);
        let (ybar, ydotbar) = if l + 1 == net.layers.len() {
            dual.seed
        } else {
            (&xb_tail[0], &xdb_tail[0])
        };
        let (x, xdot) = if l == 0 {
            dual.input
        } else {
            (&c.y[l - 1], &c.ydot[l - 1])
        };
        let xbar = (l > 0 || dual.input_adjoint).then(|| (&mut xb_head[l], &mut xdb_head[l]));
        b.dense_dual_backward(
            layer,
            params,
            rows.clone(),
            DenseIo { x, h: &c.h[l] },
            xdot,
            &c.zdot[l],
            dual.scale,
            ybar,
            ydotbar,
            grad,
            xbar,
        );
    }
}

/// The embedding net of every block, `[ti·ntypes + tj]`.
fn embed_nets<'a>(layout: &'a ParamLayout, type_one_side: bool, d: &Dims) -> Vec<&'a Net> {
    let nt = d.ntypes;
    (0..nt * nt)
        .map(|k| &layout.embed[embed_net_index(type_one_side, nt, k / nt, k % nt)])
        .collect()
}

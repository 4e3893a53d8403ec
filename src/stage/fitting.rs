//! The fitting stage: one net per centre type (one net for every type with a mixed-type
//! descriptor, DPA-1: [`super::DeviceModel::fitting`]) from D_i to the atomic output y_i (the
//! energy E_i, or a property's task_dim values), back to D̄_i = ∂E_i/∂D_i (ener), and in training
//! its tangent and dual reverse (docs/design.md §3).

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;

use super::fit_input::FitInput;
use super::net::{net_dual_backward, NetCache, NetDual, Zeros};
use super::DeviceModel;

pub struct Fitting<T: Real, B: Backend<T>> {
    cache: NetCache<B::Buf>,
    /// The seed of the tangent output in the dual reverse, `[ncentres][dim_out]`: ones for
    /// `ener` (dE_i/dE_i, also the backward pass's seed, since the forces are E's
    /// derivatives), zeros for a property (whose loss reads no derivative).
    tangent_seed: B::Buf,
    /// The net's input beside D, with frame or atomic parameters.
    input: Option<FitInput<T, B>>,
}

impl<T: Real, B: Backend<T>> Fitting<T, B> {
    pub fn new(
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Self, OutOfMemory> {
        let nc = d.ncentres();
        let dim = m.fitting[0].layers[0].nin - m.fit_input_avg.len() - m.case_embd.len();
        let seed = match m.head {
            None => T::one(),
            Some(_) => T::zero(),
        };
        let nout = m.fitting[0].layers.last().expect("a net has layers").nout;
        Ok(Fitting {
            cache: NetCache::new(zeros, &m.fitting[0], nc)?,
            tangent_seed: b.upload(&vec![seed; nc * nout]),
            input: FitInput::new(
                b,
                (&m.fit_input_avg, &m.fit_input_inv_std),
                &m.case_embd,
                d,
                dim,
                zeros,
            )?,
        })
    }

    /// A batch's frame and atomic parameters ([`crate::train::batch::HostBatch::fit_input`]).
    pub fn load(&mut self, b: &B, fit_input: &[f64]) {
        if let Some(inp) = &mut self.input {
            inp.load(b, fit_input);
        }
    }

    /// Each centre's seed of the backward pass (and of the tangent in the dual reverse): its
    /// energy's weight in the model's (a pair table's mix), in place of 1.
    pub fn load_seed(&mut self, b: &B, weight: &B::Buf) {
        b.copy(weight, &mut self.tangent_seed, 0);
    }

    /// The nets' outputs (the atomic energies without bias) of the last [`Fitting::forward`].
    pub fn e_fit(&self) -> &B::Buf {
        self.cache.y.last().unwrap()
    }

    /// D̄ = ∂E_i/∂D_i of the last [`Fitting::forward`], and after [`Fitting::dual`] the
    /// adjoints (D̄, Ḋ̄) of the loss's dual reverse.
    pub fn adjoints(&self) -> (&B::Buf, &B::Buf) {
        match &self.input {
            Some(inp) => (&inp.dbar, &inp.ddotbar),
            None => (&self.cache.xbar[0], &self.cache.xdotbar[0]),
        }
    }

    pub fn buffers(&self) -> Vec<&B::Buf> {
        let mut v: Vec<&B::Buf> = self.cache.all().collect();
        v.push(&self.tangent_seed);
        v.extend(self.input.iter().flat_map(FitInput::buffers));
        v
    }

    /// The nets forward from D; with `backward` (an energy's: the forces are its derivatives)
    /// each type's net then back to D̄ = ∂E_i/∂D_i while its rows are at hand.
    pub fn forward(
        &mut self,
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        desc: &B::Buf,
        backward: bool,
    ) {
        let desc = match &mut self.input {
            Some(inp) => {
                inp.join(b, desc);
                &inp.x
            }
            None => desc,
        };
        for t in 0..d.ntypes {
            let net = &m.fitting[t];
            let rows = d.centres(t);
            let c = &mut self.cache;
            for (l, layer) in net.layers.iter().enumerate() {
                let (head, tail) = c.y.split_at_mut(l);
                let x = if l == 0 { desc } else { &head[l - 1] };
                b.dense_forward(layer, &m.params, rows.clone(), x, &mut c.h[l], &mut tail[0]);
            }
            if !backward {
                continue;
            }
            for (l, layer) in net.layers.iter().enumerate().rev() {
                let (head, tail) = c.xbar.split_at_mut(l + 1);
                let ybar = if l + 1 == net.layers.len() {
                    &self.tangent_seed
                } else {
                    &tail[0]
                };
                b.dense_backward(layer, &m.params, rows.clone(), &c.h[l], ybar, &mut head[l]);
            }
        }
        if let (true, Some(inp)) = (backward, &mut self.input) {
            inp.split(b, &self.cache.xbar[0], None);
        }
    }

    /// Tangent forward from Ḋ, then the dual reverse seeded with (∂L/∂y, the tangent seed),
    /// into `m.grad` and the adjoints (D̄, Ḋ̄).
    pub fn dual(
        &mut self,
        b: &B,
        m: &mut DeviceModel<T, B>,
        d: &Dims,
        (desc, ddot): (&B::Buf, &B::Buf),
        ebar: &B::Buf,
    ) {
        let (desc, ddot) = match &mut self.input {
            Some(inp) => {
                inp.join_tangent(b, ddot);
                (&inp.x, &inp.xdot)
            }
            None => (desc, ddot),
        };
        for t in 0..d.ntypes {
            let net = &m.fitting[t];
            let rows = d.centres(t);
            let c = &mut self.cache;
            for (l, layer) in net.layers.iter().enumerate() {
                let (head, tail) = c.ydot.split_at_mut(l);
                let xdot = if l == 0 { ddot } else { &head[l - 1] };
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
                input: (desc, ddot),
                seed: (ebar, &self.tangent_seed),
                scale: None,
                input_adjoint: true,
            };
            net_dual_backward(b, &m.params, &mut m.grad, net, rows, c, dual);
        }
        if let Some(inp) = &mut self.input {
            let c = &self.cache;
            inp.split(b, &c.xbar[0], Some(&c.xdotbar[0]));
        }
    }
}

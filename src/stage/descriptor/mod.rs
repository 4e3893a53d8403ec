//! The descriptor stage: r_ij → D_i and its three derivative passes, one module per DeePMD-kit
//! descriptor `type` (docs/design.md §10). Between the descriptor and the rest of the step only
//! per-centre rows (D, Ḋ, and their adjoints D̄, Ḋ̄: `[ncentres][dim]`) and per-slot vectors
//! (q = ∂E/∂r_ij) pass, so the step knows no descriptor by name: it calls [`Descriptor`].

mod hybrid;
mod se_atten;
mod se_e2_a;
mod se_e2_r;
mod se_e3;

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;
use crate::model::{DescriptorType, ParamLayout};

use super::env::Env;
use super::net::Zeros;
use super::{DescModel, DeviceModel};

use hybrid::Hybrid;
use se_atten::SeAtten;
use se_e2_a::SeE2A;
use se_e2_r::SeE2R;
use se_e3::SeE3;

/// The buffers of one descriptor for one batch shape, and its passes.
pub enum Descriptor<T: Real, B: Backend<T>> {
    SeE2A(SeE2A<T, B>),
    SeE2R(SeE2R<T, B>),
    SeE3(SeE3<T, B>),
    SeAtten(SeAtten<T, B>),
    Hybrid(Hybrid<T, B>),
}

/// Forwards a call to the descriptor's own module (a hybrid's are its own, [`Hybrid`]).
macro_rules! each {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            Descriptor::SeE2A($d) => $e,
            Descriptor::SeE2R($d) => $e,
            Descriptor::SeE3($d) => $e,
            Descriptor::SeAtten($d) => $e,
            Descriptor::Hybrid(_) => unreachable!("a hybrid's passes are its own"),
        }
    };
}

impl<T: Real, B: Backend<T>> Descriptor<T, B> {
    /// The buffers of the model's descriptor for batch shape `d`; `centre_atom` is the batch
    /// atom of every centre. An error where memory runs out or the descriptor's options are
    /// not built.
    pub fn new(
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        centre_atom: &[i32],
    ) -> anyhow::Result<Self> {
        Ok(match m.desc.kind {
            DescriptorType::Hybrid => {
                Descriptor::Hybrid(Hybrid::new(b, &m.parts, d, zeros, centre_atom)?)
            }
            DescriptorType::SeAtten | DescriptorType::SeAttenV2 => {
                Descriptor::SeAtten(SeAtten::new(b, &m.views()[0], d, zeros)?)
            }
            kind => Self::single(b, kind, &m.desc.layout, d, zeros)?,
        })
    }

    /// One descriptor that is not a hybrid.
    fn single(
        b: &B,
        kind: DescriptorType,
        layout: &ParamLayout,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Self, OutOfMemory> {
        Ok(match kind {
            DescriptorType::SeE2A => Descriptor::SeE2A(SeE2A::new(b, layout, d, zeros)?),
            DescriptorType::SeE2R => Descriptor::SeE2R(SeE2R::new(b, layout, d, zeros)?),
            DescriptorType::SeE3 => Descriptor::SeE3(SeE3::new(b, layout, d, zeros)?),
            DescriptorType::Hybrid => unreachable!("a hybrid inside hybrid is refused"),
            DescriptorType::SeAtten | DescriptorType::SeAttenV2 => {
                unreachable!("DPA-1 is not a part of a hybrid (refused when the input is read)")
            }
        })
    }

    /// D of every centre, `[ncentres][dim]`, after [`Descriptor::forward`].
    pub fn desc(&self) -> &B::Buf {
        match self {
            Descriptor::Hybrid(h) => h.desc(),
            _ => each!(self, x => x.desc()),
        }
    }

    /// Ḋ of every centre, after [`Descriptor::tangent`].
    pub fn ddot(&self) -> &B::Buf {
        match self {
            Descriptor::Hybrid(h) => h.ddot(),
            _ => each!(self, x => x.ddot()),
        }
    }

    /// Every buffer, in a fixed order.
    pub fn buffers(&self) -> Vec<&B::Buf> {
        match self {
            Descriptor::Hybrid(h) => h.buffers(),
            _ => each!(self, x => x.buffers()),
        }
    }

    /// The environment of the loaded batch (R̂ and its Jacobian), then D from it.
    pub fn forward(&mut self, b: &B, m: &DeviceModel<T, B>, d: &Dims, env: &mut Env<T, B>) {
        match self {
            Descriptor::Hybrid(h) => h.forward(b, &m.views(), d, env),
            _ => self.forward_one(b, &m.views()[0], d, env),
        }
    }

    fn forward_one(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &mut Env<T, B>) {
        env.forward(b, m, d);
        each!(self, x => x.forward(b, m, d, env))
    }

    /// q = ∂E/∂r_ij of every slot from D̄ = ∂E/∂D.
    pub fn backward(
        &mut self,
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        match self {
            Descriptor::Hybrid(h) => h.backward(b, &m.views(), d, dbar, q),
            _ => self.backward_one(b, &m.views()[0], d, env, dbar, q),
        }
    }

    fn backward_one(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        each!(self, x => x.backward(b, m, d, env, dbar, q))
    }

    /// The environment's tangent Ṙ, ṡ from the loss residuals ∂L/∂F, ∂L/∂W, then Ḋ from it.
    pub fn tangent(
        &mut self,
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        env: &mut Env<T, B>,
        (fres, vres): (&B::Buf, &B::Buf),
    ) {
        match self {
            Descriptor::Hybrid(h) => h.tangent(b, &m.views(), d, fres, vres),
            _ => self.tangent_one(b, &m.views()[0], d, env, (fres, vres)),
        }
    }

    fn tangent_one(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &mut Env<T, B>,
        (fres, vres): (&B::Buf, &B::Buf),
    ) {
        env.tangent(b, d, fres, vres);
        each!(self, x => x.tangent(b, m, d, env))
    }

    /// The dual reverse from (D̄, Ḋ̄): the descriptor's parameter gradient, added to `m.grad`.
    pub fn dual(
        &mut self,
        b: &B,
        m: &mut DeviceModel<T, B>,
        d: &Dims,
        env: &Env<T, B>,
        adjoints: (&B::Buf, &B::Buf),
    ) {
        let (views, grad) = m.views_grad();
        match self {
            Descriptor::Hybrid(h) => h.dual(b, &views, grad, d, adjoints),
            _ => self.dual_one(b, &views[0], grad, d, env, adjoints),
        }
    }

    fn dual_one(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        env: &Env<T, B>,
        adjoints: (&B::Buf, &B::Buf),
    ) {
        each!(self, x => x.dual(b, m, grad, d, env, adjoints))
    }
}

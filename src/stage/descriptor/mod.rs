//! The descriptor stage: r_ij → D_i and its three derivative passes, one module per DeePMD-kit
//! descriptor `type` (docs/design.md §10). Between the descriptor and the rest of the step only
//! per-centre rows (D, Ḋ, and their adjoints D̄, Ḋ̄: `[ncentres][dim]`) and per-slot vectors
//! (q = ∂E/∂r_ij) pass, so the step knows no descriptor by name: it calls [`Descriptor`].

mod se_e2_a;
mod se_e2_r;
mod se_e3;

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;
use crate::model::DescriptorType;

use super::env::Env;
use super::net::Zeros;
use super::DeviceModel;

use se_e2_a::SeE2A;
use se_e2_r::SeE2R;
use se_e3::SeE3;

/// The buffers of one descriptor for one batch shape, and its passes.
pub enum Descriptor<T: Real, B: Backend<T>> {
    SeE2A(SeE2A<T, B>),
    SeE2R(SeE2R<T, B>),
    SeE3(SeE3<T, B>),
}

/// Forwards a call to the descriptor's own module.
macro_rules! each {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            Descriptor::SeE2A($d) => $e,
            Descriptor::SeE2R($d) => $e,
            Descriptor::SeE3($d) => $e,
        }
    };
}

impl<T: Real, B: Backend<T>> Descriptor<T, B> {
    /// The buffers of the model's descriptor for batch shape `d`.
    pub fn new(
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Self, OutOfMemory> {
        Ok(match m.kind {
            DescriptorType::SeE2A => Descriptor::SeE2A(SeE2A::new(b, m, d, zeros)?),
            DescriptorType::SeE2R => Descriptor::SeE2R(SeE2R::new(b, m, d, zeros)?),
            DescriptorType::SeE3 => Descriptor::SeE3(SeE3::new(b, m, d, zeros)?),
        })
    }

    /// D of every centre, `[ncentres][dim]`, after [`Descriptor::forward`].
    pub fn desc(&self) -> &B::Buf {
        each!(self, x => x.desc())
    }

    /// Ḋ of every centre, after [`Descriptor::tangent`].
    pub fn ddot(&self) -> &B::Buf {
        each!(self, x => x.ddot())
    }

    /// Every buffer, in a fixed order.
    pub fn buffers(&self) -> Vec<&B::Buf> {
        each!(self, x => x.buffers())
    }

    /// D from the environment.
    pub fn forward(&mut self, b: &B, m: &DeviceModel<T, B>, d: &Dims, env: &Env<T, B>) {
        each!(self, x => x.forward(b, m, d, env))
    }

    /// q = ∂E/∂r_ij of every slot from D̄ = ∂E/∂D.
    pub fn backward(&mut self, b: &B, d: &Dims, env: &Env<T, B>, dbar: &B::Buf, q: &mut B::Buf) {
        each!(self, x => x.backward(b, d, env, dbar, q))
    }

    /// Ḋ from the environment's tangent Ṙ, ṡ.
    pub fn tangent(&mut self, b: &B, d: &Dims, env: &Env<T, B>) {
        each!(self, x => x.tangent(b, d, env))
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
        each!(self, x => x.dual(b, m, d, env, adjoints))
    }
}

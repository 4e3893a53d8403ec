//! The descriptor stage: r_ij → D_i and its three derivative passes, one module per DeePMD-kit
//! descriptor `type` (docs/design.md §10). Between the descriptor and the rest of the step only
//! per-centre rows (D, Ḋ, and their adjoints D̄, Ḋ̄: `[ncentres][dim]`) and per-slot vectors
//! (q = ∂E/∂r_ij) pass, so the step knows no descriptor by name: it calls [`Descriptor`].

mod block;
mod hybrid;
mod se_atten;
mod se_e2_a;
mod se_e2_r;
mod se_e3;

use crate::backend::{Backend, Dims, Real};
use crate::model::DescriptorType;

use super::env::Env;
use super::net::Zeros;
use super::{DescModel, DeviceModel};

use block::Block;
use hybrid::Hybrid;
use se_atten::SeAtten;
use se_e2_a::SeE2A;
use se_e2_r::SeE2R;
use se_e3::SeE3;

/// One descriptor's buffers for one batch shape and its four passes over an environment: what
/// every descriptor module implements (a hybrid's parts are each one, on an environment of
/// their own). Between it and the rest of the step pass only per-centre rows and per-slot q.
pub trait Stage<T: Real, B: Backend<T>> {
    /// D of every centre, `[ncentres][dim]`, after [`Stage::forward`].
    fn desc(&self) -> &B::Buf;
    /// Ḋ of every centre, after [`Stage::tangent`].
    fn ddot(&self) -> &B::Buf;
    /// Every buffer, in a fixed order.
    fn buffers(&self) -> Vec<&B::Buf>;
    /// D from the environment (R̂ and its Jacobian).
    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>);
    /// q = ∂E/∂r_ij of every slot from D̄ = ∂E/∂D.
    fn backward(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    );
    /// Ḋ from the environment's tangent (Ṙ, ṡ).
    fn tangent(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>);
    /// A `[ncentres][4][M1]` after [`Stage::forward`], whose rows 1..3 are DeePMD-kit's rotation
    /// matrix `gr` (what a dipole or polar fitting reads); `None` unless the stage was made for
    /// one ([`Descriptor::new`]'s `rot`).
    fn rot(&self) -> Option<&B::Buf> {
        None
    }
    /// Where a tensor fitting leaves ∂L/∂A (A-shaped) for [`Stage::dual`]: `Some` where the
    /// stage was made to take one ([`Descriptor::new`]'s `rot`).
    fn rot_bar_mut(&mut self) -> Option<&mut B::Buf> {
        None
    }
    /// The dual reverse from (D̄, Ḋ̄) and, where it takes one, ∂L/∂A: the parameter gradient,
    /// added to `grad`.
    fn dual(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        env: &Env<T, B>,
        adjoints: (&B::Buf, &B::Buf),
    );
}

/// A boxed [`Stage`]: the step holds its descriptor without naming its kind.
pub type BoxedStage<T, B> = Box<dyn Stage<T, B>>;

/// The stage of descriptor `m.kind` for batch shape `d`, keeping A for a tensor fitting where
/// `rot` (for the kinds that give it: [`Descriptor::new`] refuses the others): the one place a
/// descriptor's kind picks its module. An error where memory runs out or an option is not
/// built.
fn stage<T: Real, B: Backend<T>>(
    b: &B,
    m: &DescModel<'_, T, B>,
    d: &Dims,
    zeros: &Zeros<B::Buf>,
    rot: bool,
) -> anyhow::Result<BoxedStage<T, B>> {
    Ok(match m.kind {
        DescriptorType::SeE2A => Box::new(SeE2A::new(b, m.layout, d, zeros, rot)?),
        DescriptorType::SeE2R => Box::new(SeE2R::new(b, m.layout, d, zeros)?),
        DescriptorType::SeE3 => Box::new(SeE3::new(b, m.layout, d, zeros)?),
        DescriptorType::SeAtten | DescriptorType::SeAttenV2 => {
            Box::new(SeAtten::new(b, m, d, zeros, rot)?)
        }
        DescriptorType::Dpa3 | DescriptorType::Dpa2 | DescriptorType::SeE3Tebd => {
            Box::new(Block::new(m, d, zeros, rot)?)
        }
        DescriptorType::Hybrid => unreachable!("a hybrid is a composition of stages, not one"),
    })
}

/// A stage and the environment passes it runs on.
fn forward_on<T: Real, B: Backend<T>>(
    s: &mut dyn Stage<T, B>,
    b: &B,
    m: &DescModel<'_, T, B>,
    d: &Dims,
    env: &mut Env<T, B>,
) {
    env.forward(b, m, d);
    s.forward(b, m, d, env)
}

fn tangent_on<T: Real, B: Backend<T>>(
    s: &mut dyn Stage<T, B>,
    b: &B,
    m: &DescModel<'_, T, B>,
    d: &Dims,
    env: &mut Env<T, B>,
    (fres, vres): (&B::Buf, &B::Buf),
) {
    env.tangent(b, d, fres, vres);
    s.tangent(b, m, d, env)
}

/// The model's descriptor for one batch shape: one stage on the batch's environment, or a
/// hybrid's stages side by side.
pub enum Descriptor<T: Real, B: Backend<T>> {
    One(BoxedStage<T, B>),
    Hybrid(Hybrid<T, B>),
}

impl<T: Real, B: Backend<T>> Descriptor<T, B> {
    /// The buffers of the model's descriptor for batch shape `d`; `centre_atom` is the batch
    /// atom of every centre. An error where memory runs out or the descriptor's options are
    /// not built (the rotation matrix a tensor fitting reads, too).
    pub fn new(
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        centre_atom: &[i32],
    ) -> anyhow::Result<Self> {
        let rot = m.head.as_ref().is_some_and(|h| h.output.reads_rot());
        if rot && !m.desc.kind.registered().gives_rot {
            anyhow::bail!(crate::fitting::tensor::needs_rot(m.desc.kind.as_str()));
        }
        Ok(if m.desc.kind == DescriptorType::Hybrid {
            Descriptor::Hybrid(Hybrid::new(b, &m.parts, &m.views(), d, zeros, centre_atom)?)
        } else {
            Descriptor::One(stage(b, &m.views()[0], d, zeros, rot)?)
        })
    }

    /// A `[ncentres][4][M1]`, whose rows 1..3 are the rotation matrix ([`Stage::rot`]).
    pub fn rot(&self) -> Option<&B::Buf> {
        match self {
            Descriptor::Hybrid(_) => None,
            Descriptor::One(s) => s.rot(),
        }
    }

    /// Where ∂L/∂A goes before [`Descriptor::dual`] ([`Stage::rot_bar_mut`]).
    pub fn rot_bar_mut(&mut self) -> Option<&mut B::Buf> {
        match self {
            Descriptor::Hybrid(_) => None,
            Descriptor::One(s) => s.rot_bar_mut(),
        }
    }

    /// D of every centre, `[ncentres][dim]`, after [`Descriptor::forward`].
    pub fn desc(&self) -> &B::Buf {
        match self {
            Descriptor::Hybrid(h) => h.desc(),
            Descriptor::One(s) => s.desc(),
        }
    }

    /// Ḋ of every centre, after [`Descriptor::tangent`].
    pub fn ddot(&self) -> &B::Buf {
        match self {
            Descriptor::Hybrid(h) => h.ddot(),
            Descriptor::One(s) => s.ddot(),
        }
    }

    /// Every buffer, in a fixed order.
    pub fn buffers(&self) -> Vec<&B::Buf> {
        match self {
            Descriptor::Hybrid(h) => h.buffers(),
            Descriptor::One(s) => s.buffers(),
        }
    }

    /// The environment of the loaded batch (R̂ and its Jacobian), then D from it.
    pub fn forward(&mut self, b: &B, m: &DeviceModel<T, B>, d: &Dims, env: &mut Env<T, B>) {
        match self {
            Descriptor::Hybrid(h) => h.forward(b, &m.views(), d, env),
            Descriptor::One(s) => forward_on(s.as_mut(), b, &m.views()[0], d, env),
        }
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
            Descriptor::One(s) => s.backward(b, &m.views()[0], d, env, dbar, q),
        }
    }

    /// The environment's tangent Ṙ, ṡ from the loss residuals ∂L/∂F, ∂L/∂W, then Ḋ from it.
    pub fn tangent(
        &mut self,
        b: &B,
        m: &DeviceModel<T, B>,
        d: &Dims,
        env: &mut Env<T, B>,
        residuals: (&B::Buf, &B::Buf),
    ) {
        match self {
            Descriptor::Hybrid(h) => h.tangent(b, &m.views(), d, residuals),
            Descriptor::One(s) => tangent_on(s.as_mut(), b, &m.views()[0], d, env, residuals),
        }
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
            Descriptor::One(s) => s.dual(b, &views[0], grad, d, env, adjoints),
        }
    }
}

//! The message-passing descriptors (DPA-3, docs/deepmd-spec.md §18; DPA-2, §20) and se_e3_tebd
//! (§20.12): one op family (`block_*`) computes D from the slots' r_ij and its passes, the
//! tangent and dual reverse derived (`backend/cpu/repflow.rs`, `backend/cpu/repformer.rs`,
//! `backend/cpu/three_body.rs`). The stage holds D and Ḋ; the environment holds r_ij, the
//! neighbours' owners and types, and ṙ_ij in training.

use crate::backend::keep::Keep;
use crate::backend::{Backend, BlockArgs, Dims, Real};
use crate::mem::OutOfMemory;

use super::super::env::Env;
use super::super::net::Zeros;
use super::super::DescModel;
use super::Stage;

pub struct Block<B: ?Sized + Backend<T>, T: Real> {
    /// D, Ḋ: `[nc][width]`.
    desc: B::Buf,
    ddot: B::Buf,
    /// The forward's state for the backward, the tangent's for the dual reverse.
    keep: Keep,
}

fn args<'a, T: Real, B: Backend<T>>(
    m: &'a DescModel<'_, T, B>,
    env: &'a Env<T, B>,
    keep: &'a Keep,
) -> BlockArgs<'a, B::Buf, B::Idx> {
    BlockArgs {
        block: m.block.expect("a message-passing model has its block"),
        params: m.params,
        davg: m.davg,
        dstd: m.dstd,
        rij: &env.rij,
        owner: &env.owner,
        nei_type: (env.nei_type.as_ref()).expect("a mixed-type batch has its neighbour types"),
        centre_atom: &env.centre_atom,
        keep,
    }
}

fn rijdot<T: Real, B: Backend<T>>(env: &Env<T, B>) -> &B::Buf {
    (env.rijdot.as_ref()).expect("a message-passing environment keeps ṙ_ij")
}

impl<T: Real, B: Backend<T>> Block<B, T> {
    pub fn new(
        m: &DescModel<'_, T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Self, OutOfMemory> {
        let o = m.block.expect("a message-passing model has its block");
        let n = d.ncentres() * o.width();
        Ok(Block {
            desc: zeros(n)?,
            ddot: zeros(n)?,
            keep: Keep::default(),
        })
    }
}

impl<T: Real, B: Backend<T>> Stage<T, B> for Block<B, T> {
    fn desc(&self) -> &B::Buf {
        &self.desc
    }

    fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    fn buffers(&self) -> Vec<&B::Buf> {
        vec![&self.desc, &self.ddot]
    }

    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        b.block_forward(d, &args(m, env, &self.keep), &mut self.desc);
    }

    fn backward(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        b.block_backward(d, &args(m, env, &self.keep), dbar, q);
    }

    fn tangent(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        b.block_tangent(d, &args(m, env, &self.keep), rijdot(env), &mut self.ddot);
    }

    fn dual(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        env: &Env<T, B>,
        adjoints: (&B::Buf, &B::Buf),
    ) {
        b.block_dual(d, &args(m, env, &self.keep), rijdot(env), adjoints, grad);
    }
}

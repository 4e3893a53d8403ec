//! The message-passing descriptors (DPA-3, docs/deepmd-spec.md §18; DPA-2, §20) and se_e3_tebd
//! (§20.12): one op family (`block_*`) computes D from the slots' r_ij and its passes, the
//! tangent and dual reverse derived (`backend/cpu/repflow.rs`, `backend/cpu/repformer.rs`,
//! `backend/cpu/three_body.rs`). The stage holds D and Ḋ; the environment holds r_ij, the
//! neighbours' owners and types, and ṙ_ij in training.

use crate::backend::keep::Keep;
use crate::backend::{Backend, BlockArgs, Dims, Real, Span};
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
    /// Where a tensor fitting reads the rotation matrix.
    rot: Option<Rot<B::Buf>>,
}

/// A block that gives the rotation matrix: its ops' one output is D's values then A's
/// (`HostBlock::out_len`), which the stage splits, and their adjoints are put together here.
struct Rot<Buf> {
    /// D and A, Ḋ and Ȧ, of the block's ops.
    out: Buf,
    outdot: Buf,
    /// A `[nc][4][M]` (row 0 zero, rows 1..3 DeePMD-kit's `rot_mat` transposed) and ∂L/∂A.
    a: Buf,
    abar: Buf,
    /// The adjoints of the ops' output: (D̄, Ā) and (Ḋ̄, 0), whose A part stays 0 (the loss
    /// reads no Ȧ; the backward of forces reads none of A).
    seed: Buf,
    seeddot: Buf,
    /// D's values (where A begins) and A's.
    at: usize,
    a_len: usize,
}

impl<Buf> Rot<Buf> {
    /// D's values and A's in the ops' output.
    fn spans(&self) -> ([Span; 1], [Span; 1]) {
        let d = Span {
            src: 0,
            dst: 0,
            len: self.at,
        };
        let a = Span {
            src: self.at,
            dst: 0,
            len: self.a_len,
        };
        ([d], [a])
    }
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
    /// With `rot`, the block gives the rotation matrix (its opts say so: `BlockOpts::of`).
    pub fn new(
        m: &DescModel<'_, T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        rot: bool,
    ) -> Result<Self, OutOfMemory> {
        let o = m.block.expect("a message-passing model has its block");
        let nc = d.ncentres();
        let n = nc * o.width();
        assert_eq!(rot, o.rot_width().is_some(), "the block's rotation matrix");
        let rot = match o.rot_width() {
            Some(w) => {
                let len = o.out_len(nc);
                Some(Rot {
                    out: zeros(len)?,
                    outdot: zeros(len)?,
                    a: zeros(nc * 4 * w)?,
                    abar: zeros(nc * 4 * w)?,
                    seed: zeros(len)?,
                    seeddot: zeros(len)?,
                    at: n,
                    a_len: nc * 4 * w,
                })
            }
            None => None,
        };
        Ok(Block {
            desc: zeros(n)?,
            ddot: zeros(n)?,
            keep: Keep::default(),
            rot,
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

    fn rot(&self) -> Option<&B::Buf> {
        self.rot.as_ref().map(|r| &r.a)
    }

    fn rot_bar_mut(&mut self) -> Option<&mut B::Buf> {
        self.rot.as_mut().map(|r| &mut r.abar)
    }

    fn buffers(&self) -> Vec<&B::Buf> {
        let mut v = vec![&self.desc, &self.ddot];
        if let Some(r) = &self.rot {
            v.extend([&r.out, &r.outdot, &r.a, &r.abar, &r.seed, &r.seeddot]);
        }
        v
    }

    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let args = args(m, env, &self.keep);
        let Some(r) = &mut self.rot else {
            return b.block_forward(d, &args, &mut self.desc);
        };
        b.block_forward(d, &args, &mut r.out);
        let (ds, a) = r.spans();
        b.gather(&r.out, &mut self.desc, &ds);
        b.gather(&r.out, &mut r.a, &a);
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
        let args = args(m, env, &self.keep);
        let Some(r) = &mut self.rot else {
            return b.block_backward(d, &args, dbar, q);
        };
        b.copy(dbar, &mut r.seeddot, 0);
        b.block_backward(d, &args, &r.seeddot, q);
    }

    fn tangent(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let args = args(m, env, &self.keep);
        let Some(r) = &mut self.rot else {
            return b.block_tangent(d, &args, rijdot(env), &mut self.ddot);
        };
        b.block_tangent(d, &args, rijdot(env), &mut r.outdot);
        b.gather(&r.outdot, &mut self.ddot, &r.spans().0);
    }

    fn dual(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        env: &Env<T, B>,
        (dbar, ddotbar): (&B::Buf, &B::Buf),
    ) {
        let args = args(m, env, &self.keep);
        let Some(r) = &mut self.rot else {
            return b.block_dual(d, &args, rijdot(env), (dbar, ddotbar), grad);
        };
        b.copy(dbar, &mut r.seed, 0);
        b.copy(&r.abar, &mut r.seed, r.at);
        b.copy(ddotbar, &mut r.seeddot, 0);
        b.block_dual(d, &args, rijdot(env), (&r.seed, &r.seeddot), grad);
    }
}

//! The environment stage every descriptor starts from: a batch's geometry (r_ij, owners), the
//! normalised environment rows R̂ of every slot with their Jacobian, and, in training, the
//! force/virial seed as a tangent of them (docs/design.md §3.2).

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;

use super::net::Zeros;
use super::DescModel;

pub struct Env<T: Real, B: Backend<T>> {
    pub rij: B::Buf,
    pub owner: B::Idx,
    /// A mixed-type descriptor's (DPA-1's) neighbour type of every slot, `[nslots]`
    /// ([`crate::train::batch::HostBatch::nei_type`]: padding slots hold the lowest type of the
    /// frame); `None` for the other descriptors.
    pub nei_type: Option<B::Idx>,
    pub centre_atom: B::Idx,
    /// R̂ `[nslots][4]`, ∂R̂/∂r_ij `[nslots][4][3]`, s = `R̂[0]` `[nslots]`.
    pub rhat: B::Buf,
    pub jac: B::Buf,
    pub s: B::Buf,
    /// Ones over the slots: the unit input tangent of the embedding nets.
    pub ones_s: B::Buf,
    /// Ṙ and ṡ = `Ṙ[0]` of the training seed.
    pub rdot: B::Buf,
    pub sdot: B::Buf,
    /// ṙ_ij `[nslots][3]` of the training seed, for a descriptor that reads r_ij itself
    /// (DPA-3); `None` for the others.
    pub rijdot: Option<B::Buf>,
}

impl<T: Real, B: Backend<T>> Env<T, B> {
    /// `mixed`: the descriptor has a mixed-type list (DPA-1, DPA-3), whose slots' neighbour
    /// types get a buffer of their own; `reads_rij`: it reads r_ij itself (DPA-3), whose
    /// tangent gets one.
    pub fn new(
        b: &B,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        centre_atom: &[i32],
        (mixed, reads_rij): (bool, bool),
    ) -> Result<Self, OutOfMemory> {
        let ns = d.nslots();
        Ok(Env {
            // What reads r_ij itself reads it on the host too (a block's host bodies, its
            // tape's record): the host keeps the values it writes.
            rij: if reads_rij {
                b.upload_kept(vec![T::zero(); 3 * ns])
            } else {
                zeros(3 * ns)?
            },
            owner: b.upload_idx(&vec![-1; ns]),
            nei_type: mixed.then(|| b.upload_idx(&vec![0; ns])),
            centre_atom: b.upload_idx(centre_atom),
            rhat: zeros(4 * ns)?,
            jac: zeros(12 * ns)?,
            s: zeros(ns)?,
            ones_s: b.upload(&vec![T::one(); ns]),
            rdot: zeros(4 * ns)?,
            sdot: zeros(ns)?,
            rijdot: if reads_rij {
                Some(zeros(3 * ns)?)
            } else {
                None
            },
        })
    }

    /// R̂, its Jacobian and s of the loaded batch.
    pub fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims) {
        b.env_mat(
            d,
            m.env,
            &self.rij,
            &self.owner,
            m.davg,
            m.dstd,
            &mut self.rhat,
            &mut self.jac,
            &mut self.s,
        );
    }

    /// Ṙ, ṡ from the loss residuals ∂L/∂F, ∂L/∂W.
    pub fn tangent(&mut self, b: &B, d: &Dims, fres: &B::Buf, vres: &B::Buf) {
        b.virtual_tangent(
            d,
            fres,
            vres,
            &self.jac,
            &self.rij,
            &self.owner,
            &self.centre_atom,
            &mut self.rdot,
            &mut self.sdot,
        );
        if let Some(rijdot) = &mut self.rijdot {
            b.rij_tangent(
                d,
                fres,
                vres,
                &self.rij,
                &self.owner,
                &self.centre_atom,
                rijdot,
            );
        }
    }

    pub fn buffers(&self) -> Vec<&B::Buf> {
        let mut v = vec![
            &self.rij,
            &self.rhat,
            &self.jac,
            &self.s,
            &self.ones_s,
            &self.rdot,
            &self.sdot,
        ];
        v.extend(&self.rijdot);
        v
    }
}

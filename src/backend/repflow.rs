//! The arguments of DPA-3's ops (docs/deepmd-spec.md §18), shared by every backend, and their
//! host bodies: the op table's default for each (`ops.rs`), so a device runs DPA-3 through them
//! (its inputs downloaded, the block computed on the host, the outputs written back) until it
//! has kernels of its own; the CPU backend runs the same bodies on its buffers in place.

use std::borrow::Cow;

use super::cpu::repflow::{self as host, RepflowIn};
use super::{Device, Dims, Real};
use crate::model::dpa3::Dpa3Layout;

pub use host::RepflowOpts;

/// What every pass of the block reads: the model's layout, constants, parameters and statistics,
/// and the batch's slots (r_ij, owners, neighbour types) and centres' atoms.
pub struct RepflowArgs<'a, B, I> {
    pub opts: &'a RepflowOpts,
    pub layout: &'a Dpa3Layout,
    pub params: &'a B,
    pub davg: &'a B,
    pub dstd: &'a B,
    pub rij: &'a B,
    pub owner: &'a I,
    pub nei_type: &'a I,
    pub centre_atom: &'a I,
}

/// [`RepflowArgs`] on the host: downloaded, or borrowed where the buffers are host vectors.
struct Host<'h, T: Clone> {
    params: Cow<'h, [T]>,
    davg: Cow<'h, [T]>,
    dstd: Cow<'h, [T]>,
    rij: Cow<'h, [T]>,
    owner: Cow<'h, [i32]>,
    nei_type: Cow<'h, [i32]>,
    centre_atom: Cow<'h, [i32]>,
}

impl<B, I> RepflowArgs<'_, B, I> {
    fn run<T: Real, R>(&self, h: &Host<'_, T>, f: impl FnOnce(&RepflowIn<'_, T>) -> R) -> R {
        f(&RepflowIn {
            o: self.opts,
            l: self.layout,
            params: &h.params,
            davg: &h.davg,
            dstd: &h.dstd,
            rij: &h.rij,
            owner: &h.owner,
            nei_type: &h.nei_type,
            centre_atom: &h.centre_atom,
        })
    }

    /// Runs `f` on the host view of the arguments.
    fn with<T: Real, K: Device<T, Buf = B, Idx = I> + ?Sized, R>(
        &self,
        b: &K,
        f: impl FnOnce(&RepflowIn<'_, T>) -> R,
    ) -> R {
        let h = Host {
            params: b.download(self.params).into(),
            davg: b.download(self.davg).into(),
            dstd: b.download(self.dstd).into(),
            rij: b.download(self.rij).into(),
            owner: b.download_idx(self.owner).into(),
            nei_type: b.download_idx(self.nei_type).into(),
            centre_atom: b.download_idx(self.centre_atom).into(),
        };
        self.run(&h, f)
    }
}

impl<T: Real> RepflowArgs<'_, Vec<T>, Vec<i32>> {
    /// Runs `f` on the arguments where they are: the cpu backend's bodies, which need no copy.
    pub fn in_place<R>(&self, f: impl FnOnce(&RepflowIn<'_, T>) -> R) -> R {
        let h = Host {
            params: self.params.into(),
            davg: self.davg.into(),
            dstd: self.dstd.into(),
            rij: self.rij.into(),
            owner: self.owner.into(),
            nei_type: self.nei_type.into(),
            centre_atom: self.centre_atom.into(),
        };
        self.run(&h, f)
    }
}

pub fn repflow_forward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &RepflowArgs<B::Buf, B::Idx>,
    desc: &mut B::Buf,
) {
    let mut out = vec![T::zero(); d.ncentres() * a.opts.width()];
    a.with(b, |x| host::forward(d, x, &mut out));
    b.write(desc, &out);
}

pub fn repflow_backward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &RepflowArgs<B::Buf, B::Idx>,
    dbar: &B::Buf,
    q: &mut B::Buf,
) {
    let dbar = b.download(dbar);
    let mut out = vec![T::zero(); 3 * d.nslots()];
    a.with(b, |x| host::backward(d, x, &dbar, &mut out));
    b.write(q, &out);
}

pub fn repflow_tangent<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &RepflowArgs<B::Buf, B::Idx>,
    rijdot: &B::Buf,
    ddot: &mut B::Buf,
) {
    let rijdot = b.download(rijdot);
    let mut out = vec![T::zero(); d.ncentres() * a.opts.width()];
    a.with(b, |x| host::tangent(d, x, &rijdot, &mut out));
    b.write(ddot, &out);
}

pub fn repflow_dual<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &RepflowArgs<B::Buf, B::Idx>,
    rijdot: &B::Buf,
    (dbar, ddotbar): (&B::Buf, &B::Buf),
    grad: &mut B::Buf,
) {
    let (rijdot, dbar, ddotbar) = (b.download(rijdot), b.download(dbar), b.download(ddotbar));
    let mut g = b.download(grad);
    a.with(b, |x| host::dual(d, x, &rijdot, &dbar, &ddotbar, &mut g));
    b.write(grad, &g);
}

/// ṙ_ij = fres_i − fres_owner(j) − vres·r_ij of every slot (0 for padding): the force/virial
/// seed as a tangent of the slots' vectors themselves, for a descriptor that reads r_ij rather
/// than R̂ (DPA-3).
#[allow(clippy::too_many_arguments)]
pub fn rij_tangent<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    fres: &B::Buf,
    vres: &B::Buf,
    rij: &B::Buf,
    owner: &B::Idx,
    centre_atom: &B::Idx,
    rijdot: &mut B::Buf,
) {
    let (fres, vres, rij) = (b.download(fres), b.download(vres), b.download(rij));
    let (owner, centre_atom) = (b.download_idx(owner), b.download_idx(centre_atom));
    let mut out = vec![T::zero(); 3 * d.nslots()];
    super::cpu::rij_tangent(d, &fres, &vres, &rij, &owner, &centre_atom, &mut out);
    b.write(rijdot, &out);
}

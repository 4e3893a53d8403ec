//! The arguments of the message-passing descriptors' ops (DPA-3's RepFlow block, spec §18;
//! DPA-2's repinit and repformers, §20; se_e3_tebd's three-body block, §20.12), shared by every
//! backend, and their host bodies: the op table's default for each (`ops.rs`), so a device runs
//! them through these (its inputs downloaded, the block computed on the host, the outputs
//! written back) until it has kernels of its own; the CPU backend runs the same bodies on its
//! buffers in place.

use std::borrow::Cow;

use super::cpu::block_in::BlockIn;
use super::cpu::repflow::{self, RepflowIn};
use super::cpu::repformer::Dpa2In;
use super::cpu::tape_block::{self, Recorded, TapeBlock};
use super::cpu::three_body::SeE3TebdIn;
use super::keep::{Keep, Key};
use super::{Device, Dims, Real};
use crate::model::dpa2::Dpa2Layout;
use crate::model::dpa3::Dpa3Layout;
use crate::model::se_e3_tebd::SeE3TebdLayout;
use crate::model::DescriptorLayout;
use crate::model::{DescriptorSpec, DescriptorType};

pub use super::cpu::repformer::Dpa2Opts;
pub use super::cpu::three_body::SeE3TebdOpts;
pub use repflow::RepflowOpts;

/// Which block, with its constants and tensors.
#[derive(Clone, Copy)]
pub enum HostBlock<'a> {
    Repflow(&'a RepflowOpts, &'a Dpa3Layout),
    Repformer(&'a Dpa2Opts, &'a Dpa2Layout),
    SeE3Tebd(&'a SeE3TebdOpts, &'a SeE3TebdLayout),
}

/// A block's constants, kept with the model (its tensors are the layout's).
#[derive(Clone, Debug, PartialEq)]
pub enum BlockOpts {
    Repflow(RepflowOpts),
    Repformer(Dpa2Opts),
    SeE3Tebd(SeE3TebdOpts),
}

impl BlockOpts {
    /// The block of a message-passing descriptor (DPA-3, DPA-2) or se_e3_tebd; `None` for the
    /// others. With `rot`, a message-passing block gives the rotation matrix after D.
    pub fn of(d: &DescriptorSpec, nt: usize, rot: bool) -> Option<Self> {
        match d.kind {
            DescriptorType::Dpa3 => Some(BlockOpts::Repflow(RepflowOpts::new(d, nt, rot))),
            DescriptorType::Dpa2 => Some(BlockOpts::Repformer(Dpa2Opts::new(d, nt, rot))),
            DescriptorType::SeE3Tebd => Some(BlockOpts::SeE3Tebd(SeE3TebdOpts::new(d, nt))),
            _ => None,
        }
    }

    /// With the layout's tensors.
    pub fn host<'a>(&'a self, l: &'a DescriptorLayout) -> HostBlock<'a> {
        match self {
            BlockOpts::Repflow(o) => HostBlock::Repflow(o, l.own.dpa3().expect("a DPA-3 layout")),
            BlockOpts::Repformer(o) => {
                HostBlock::Repformer(o, l.own.dpa2().expect("a DPA-2 layout"))
            }
            BlockOpts::SeE3Tebd(o) => {
                HostBlock::SeE3Tebd(o, (l.own.se_e3_tebd()).expect("an se_e3_tebd layout"))
            }
        }
    }
}

impl HostBlock<'_> {
    /// D's width.
    pub fn width(&self) -> usize {
        match self {
            HostBlock::Repflow(o, _) => o.width(),
            HostBlock::Repformer(o, _) => o.width(),
            HostBlock::SeE3Tebd(o, _) => o.width(),
        }
    }

    /// M of the rotation matrix A `[4][M]` per centre the block gives after D, where it gives
    /// one.
    pub fn rot_width(&self) -> Option<usize> {
        match self {
            HostBlock::Repflow(o, _) => o.rot_width(),
            HostBlock::Repformer(o, _) => o.rot_width(),
            HostBlock::SeE3Tebd(o, _) => o.rot_width(),
        }
    }

    /// The values of the block's output (and of its adjoint) for `nc` centres: D's, then A's
    /// where it gives A (`tape_block::output`).
    pub fn out_len(&self, nc: usize) -> usize {
        nc * tape_block::out_width(self.width(), self.rot_width())
    }
}

/// What every pass of the block reads: the model's block, parameters and statistics, and the
/// batch's slots (r_ij, owners, neighbour types) and centres' atoms.
pub struct BlockArgs<'a, B, I> {
    pub block: HostBlock<'a>,
    pub params: &'a B,
    pub davg: &'a B,
    pub dstd: &'a B,
    pub rij: &'a B,
    pub owner: &'a I,
    pub nei_type: &'a I,
    pub centre_atom: &'a I,
    /// The stage's slot for a pass's state, which the next pass on the same inputs takes.
    pub keep: &'a Keep,
}

/// A block's host bodies with their inputs and the stage's [`Keep`].
pub enum Body<'a, T> {
    Repflow(&'a RepflowIn<'a, T>, &'a Keep),
    Repformer(&'a Dpa2In<'a, T>, &'a Keep),
    SeE3Tebd(&'a SeE3TebdIn<'a, T>, &'a Keep),
}

impl<T: Real> Body<'_, T> {
    /// The block's tape recorded for a device to run (`backend/device_tape`): DPA-3's is
    /// repflow_tape.rs's, which the cpu backend leaves for repflow.rs's hand-written passes
    /// (twice as fast there), on the slots `Cut::on_device` keeps. `None` would leave a block
    /// to its host bodies on a device.
    pub fn record(&self, d: &Dims) -> Option<Recorded<T>> {
        match self {
            Body::Repflow(x, _) => Some(match Cut::on_device(d, x) {
                None => tape_block::record(*x, d),
                Some(c) => {
                    let slot: Vec<u32> = c.slot.iter().map(|&s| s as u32).collect();
                    tape_block::record_on(&c.input(x).of(&c), &c.dims, d.nslots(), &slot)
                }
            }),
            Body::Repformer(x, _) => Some(tape_block::record(*x, d)),
            Body::SeE3Tebd(x, _) => Some(tape_block::record(*x, d)),
        }
    }

    /// Leaves a device's `state` of these inputs in the stage's keep, with `bufs`, the ids of
    /// the device buffers it read that the host view does not hold (the parameters, a
    /// tangent): the parameters change only after a step's passes, so their buffer stands for
    /// them.
    pub fn put_device<S: Send + 'static>(&self, d: &Dims, bufs: [u64; 2], state: S) {
        match self {
            Body::Repflow(x, k) => k.put((x.key(d, None), bufs), state),
            Body::Repformer(x, k) => k.put((x.key(d, None), bufs), state),
            Body::SeE3Tebd(x, k) => k.put((x.key(d, None), bufs), state),
        }
    }

    /// The device state [`Body::put_device`] left for these inputs, if any.
    pub fn take_device<S: Send + 'static>(&self, d: &Dims, bufs: [u64; 2]) -> Option<S> {
        fn mine<'a, O: Clone + PartialEq, L, T: bytemuck::Pod>(
            x: &'a BlockIn<'_, O, L, T>,
            d: &'a Dims,
            bufs: [u64; 2],
        ) -> impl FnOnce(&(Key<T, O>, [u64; 2])) -> bool + 'a {
            move |k| k.1 == bufs && x.made(&k.0, d, None)
        }
        match self {
            Body::Repflow(x, k) => k.take(mine(x, d, bufs)),
            Body::Repformer(x, k) => k.take(mine(x, d, bufs)),
            Body::SeE3Tebd(x, k) => k.take(mine(x, d, bufs)),
        }
    }

    pub fn forward(&self, d: &Dims, desc: &mut [T]) {
        match self {
            Body::Repflow(x, k) => match Cut::of(d, x) {
                None => repflow::forward(d, x, k, desc),
                Some(c) => repflow::forward(&c.dims, &c.input(x).of(&c), k, desc),
            },
            Body::Repformer(x, k) => tape_block::forward(d, *x, k, desc),
            Body::SeE3Tebd(x, k) => tape_block::forward(d, *x, k, desc),
        }
    }

    pub fn backward(&self, d: &Dims, dbar: &[T], q: &mut [T]) {
        match self {
            Body::Repflow(x, k) => match Cut::of(d, x) {
                None => repflow::backward(d, x, k, dbar, q),
                Some(c) => {
                    let mut qc = vec![T::zero(); 3 * c.slot.len()];
                    repflow::backward(&c.dims, &c.input(x).of(&c), k, dbar, &mut qc);
                    c.scatter(&qc, 3, q);
                }
            },
            Body::Repformer(x, k) => tape_block::backward(d, *x, k, dbar, q),
            Body::SeE3Tebd(x, k) => tape_block::backward(d, *x, k, dbar, q),
        }
    }

    pub fn tangent(&self, d: &Dims, rdot: &[T], ddot: &mut [T]) {
        match self {
            Body::Repflow(x, k) => match Cut::of(d, x) {
                None => repflow::tangent(d, x, k, rdot, ddot),
                Some(c) => {
                    let rdot = c.gather(rdot, 3);
                    repflow::tangent(&c.dims, &c.input(x).of(&c), k, &rdot, ddot)
                }
            },
            Body::Repformer(x, k) => tape_block::tangent(d, *x, k, rdot, ddot),
            Body::SeE3Tebd(x, k) => tape_block::tangent(d, *x, k, rdot, ddot),
        }
    }

    pub fn dual(&self, d: &Dims, rdot: &[T], dbar: &[T], ddotbar: &[T], grad: &mut [T]) {
        match self {
            Body::Repflow(x, k) => match Cut::of(d, x) {
                None => repflow::dual(d, x, k, rdot, dbar, ddotbar, grad),
                Some(c) => {
                    let (rdot, xc) = (c.gather(rdot, 3), c.input(x));
                    repflow::dual(&c.dims, &xc.of(&c), k, &rdot, dbar, ddotbar, grad)
                }
            },
            Body::Repformer(x, k) => tape_block::dual(d, *x, k, rdot, dbar, ddotbar, grad),
            Body::SeE3Tebd(x, k) => tape_block::dual(d, *x, k, rdot, dbar, ddotbar, grad),
        }
    }
}

/// DPA-3's block on the batch's slots cut to the widest real list. A slot past a centre's last
/// real neighbour is padding, masked everywhere in the block, whose sums are scaled by e_sel
/// and a_sel themselves (or their dynamic-sel fractions), not by the slots they run over
/// ([`RepflowOpts`]'s scales): so S' = the most slots a centre's real neighbours reach and A' =
/// the most its angle list does give the same numbers at (S'/S)·(A'/A)² of the work and memory.
/// (DeePMD-kit's water/dpa3 dynamic-sel example, e_sel 1200 and a_sel 300 for about 100 and 30
/// neighbours, held 24 GB for one step on the full width.)
struct Cut {
    dims: Dims,
    opts: RepflowOpts,
    /// The batch's slot of each cut slot.
    slot: Vec<usize>,
}

/// A cut batch's per-slot inputs.
struct CutInput<'a, T> {
    x: &'a RepflowIn<'a, T>,
    rij: Vec<T>,
    owner: Vec<i32>,
    nei_type: Vec<i32>,
}

impl<'a, T> CutInput<'a, T> {
    fn of<'c>(&'c self, c: &'c Cut) -> RepflowIn<'c, T> {
        RepflowIn {
            o: &c.opts,
            rij: &self.rij,
            owner: &self.owner,
            nei_type: &self.nei_type,
            ..*self.x
        }
    }
}

impl Cut {
    /// None where no slot can go (or the list is not one mixed section).
    fn of<T: Real>(d: &Dims, x: &RepflowIn<'_, T>) -> Option<Cut> {
        let (s1, a1) = Cut::widths(d, x)?;
        Cut::to(d, x.o, s1, a1)
    }

    /// The cut a device's tape is recorded on: the widths rounded up (to 16 slots and 8 angle
    /// slots), so that a run's batches make few shapes and a step's bind groups are the last
    /// step's, and none where it would not halve the work, as for a model whose sel is near
    /// its neighbour counts (the shape then is the model's, whatever the geometry). The
    /// padding slots it keeps are masked as any, so the numbers are the cut's.
    fn on_device<T: Real>(d: &Dims, x: &RepflowIn<'_, T>) -> Option<Cut> {
        let o = x.o;
        let (s1, a1) = Cut::widths(d, x)?;
        let s1 = s1.next_multiple_of(16).min(o.s);
        let a1 = a1.next_multiple_of(8).min(o.a).min(s1);
        let work = |s: usize, a: usize| (s * a * a) as f64;
        if 2.0 * work(s1, a1) > work(o.s, o.a) {
            return None;
        }
        Cut::to(d, o, s1, a1)
    }

    /// The most slots a centre's real neighbours reach and the most its angle list does; none
    /// where the list is not one mixed section.
    fn widths<T: Real>(d: &Dims, x: &RepflowIn<'_, T>) -> Option<(usize, usize)> {
        if d.nsec != 1 {
            return None;
        }
        let o = x.o;
        let a_rcut = T::of(o.a_rcut);
        let (mut s1, mut a1) = (1, 1);
        for c in 0..d.ncentres() {
            for (j, s) in d.mixed_slots(c).enumerate() {
                if x.owner[s] < 0 {
                    continue;
                }
                s1 = s1.max(j + 1);
                let r = &x.rij[3 * s..3 * s + 3];
                // The block's own test of the angle list (an excluded pair only widens A').
                if j < o.a && (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt() < a_rcut {
                    a1 = a1.max(j + 1);
                }
            }
        }
        Some((s1.min(o.s), a1.min(o.a)))
    }

    /// The batch's slots cut to `s1` (angle lists to `a1`); none where that is all of them.
    fn to(d: &Dims, o: &RepflowOpts, s1: usize, a1: usize) -> Option<Cut> {
        if (s1, a1) == (o.s, o.a) {
            return None;
        }
        let dims = d.with_mixed_sel(s1);
        let slot = (0..d.ncentres())
            .flat_map(|c| {
                let s0 = d.mixed_slots(c).start;
                (0..s1).map(move |j| s0 + j)
            })
            .collect();
        Some(Cut {
            dims,
            opts: RepflowOpts {
                s: s1,
                a: a1,
                ..o.clone()
            },
            slot,
        })
    }

    /// `w` values per slot of the batch's, on the cut slots.
    fn gather<V: Copy>(&self, v: &[V], w: usize) -> Vec<V> {
        (self.slot.iter())
            .flat_map(|&s| v[w * s..w * s + w].iter().copied())
            .collect()
    }

    /// The cut slots' `w` values each into the batch's, its padding 0.
    fn scatter<T: Real>(&self, v: &[T], w: usize, out: &mut [T]) {
        out.fill(T::zero());
        for (k, &s) in self.slot.iter().enumerate() {
            out[w * s..w * s + w].copy_from_slice(&v[w * k..w * k + w]);
        }
    }

    fn input<'a, T: Copy>(&self, x: &'a RepflowIn<'a, T>) -> CutInput<'a, T> {
        CutInput {
            x,
            rij: self.gather(x.rij, 3),
            owner: self.gather(x.owner, 1),
            nei_type: self.gather(x.nei_type, 1),
        }
    }
}

/// [`BlockArgs`] on the host: downloaded, or borrowed where the buffers are host vectors.
struct Host<'h, T: Clone> {
    params: Cow<'h, [T]>,
    davg: Cow<'h, [T]>,
    dstd: Cow<'h, [T]>,
    rij: Cow<'h, [T]>,
    owner: Cow<'h, [i32]>,
    nei_type: Cow<'h, [i32]>,
    centre_atom: Cow<'h, [i32]>,
}

impl<T: Clone> Host<'_, T> {
    fn view<'v, O, L>(&'v self, o: &'v O, l: &'v L) -> BlockIn<'v, O, L, T> {
        BlockIn {
            o,
            l,
            params: &self.params,
            davg: &self.davg,
            dstd: &self.dstd,
            rij: &self.rij,
            owner: &self.owner,
            nei_type: &self.nei_type,
            centre_atom: &self.centre_atom,
        }
    }
}

impl<B, I> BlockArgs<'_, B, I> {
    fn run<T: Real, R>(&self, h: &Host<'_, T>, f: impl FnOnce(Body<'_, T>) -> R) -> R {
        match self.block {
            HostBlock::Repflow(o, l) => f(Body::Repflow(&h.view(o, l), self.keep)),
            HostBlock::Repformer(o, l) => f(Body::Repformer(&h.view(o, l), self.keep)),
            HostBlock::SeE3Tebd(o, l) => f(Body::SeE3Tebd(&h.view(o, l), self.keep)),
        }
    }

    /// Runs `f` on the host view of the arguments.
    fn with<T: Real, K: Device<T, Buf = B, Idx = I> + ?Sized, R>(
        &self,
        b: &K,
        f: impl FnOnce(Body<'_, T>) -> R,
    ) -> R {
        self.host(b, true, f)
    }

    /// Runs `f` on the host view of the arguments, the parameters left out (empty) unless
    /// `params`: what recording the block's tape reads.
    pub fn host<T: Real, K: Device<T, Buf = B, Idx = I> + ?Sized, R>(
        &self,
        b: &K,
        params: bool,
        f: impl FnOnce(Body<'_, T>) -> R,
    ) -> R {
        // The statistics and r_ij are inputs the host keeps on a device that can
        // (`Device::upload_kept`): no read-back.
        let read = |x: &B| b.host_copy(x).unwrap_or_else(|| b.download(x));
        let h = Host {
            params: if params {
                b.download(self.params)
            } else {
                Vec::new()
            }
            .into(),
            davg: read(self.davg).into(),
            dstd: read(self.dstd).into(),
            rij: read(self.rij).into(),
            owner: b.download_idx(self.owner).into(),
            nei_type: b.download_idx(self.nei_type).into(),
            centre_atom: b.download_idx(self.centre_atom).into(),
        };
        self.run(&h, f)
    }
}

impl<T: Real> BlockArgs<'_, Vec<T>, Vec<i32>> {
    /// Runs `f` on the arguments where they are: the cpu backend's bodies, which need no copy.
    pub fn in_place<R>(&self, f: impl FnOnce(Body<'_, T>) -> R) -> R {
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

pub fn block_forward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &BlockArgs<B::Buf, B::Idx>,
    desc: &mut B::Buf,
) {
    let mut out = vec![T::zero(); a.block.out_len(d.ncentres())];
    a.with(b, |x| x.forward(d, &mut out));
    b.write(desc, &out);
}

pub fn block_backward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &BlockArgs<B::Buf, B::Idx>,
    dbar: &B::Buf,
    q: &mut B::Buf,
) {
    let dbar = b.download(dbar);
    let mut out = vec![T::zero(); 3 * d.nslots()];
    a.with(b, |x| x.backward(d, &dbar, &mut out));
    b.write(q, &out);
}

pub fn block_tangent<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &BlockArgs<B::Buf, B::Idx>,
    rijdot: &B::Buf,
    ddot: &mut B::Buf,
) {
    let rijdot = b.download(rijdot);
    let mut out = vec![T::zero(); a.block.out_len(d.ncentres())];
    a.with(b, |x| x.tangent(d, &rijdot, &mut out));
    b.write(ddot, &out);
}

pub fn block_dual<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &BlockArgs<B::Buf, B::Idx>,
    rijdot: &B::Buf,
    (dbar, ddotbar): (&B::Buf, &B::Buf),
    grad: &mut B::Buf,
) {
    let (rijdot, dbar, ddotbar) = (b.download(rijdot), b.download(dbar), b.download(ddotbar));
    let mut g = b.download(grad);
    a.with(b, |x| x.dual(d, &rijdot, &dbar, &ddotbar, &mut g));
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

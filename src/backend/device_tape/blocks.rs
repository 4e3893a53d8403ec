//! A block's four passes through its tape on a device: the host records each batch's tape from
//! its r_ij, statistics and lists, without the parameters, once for the step's four passes,
//! and keeps it with the forward's run in the stage's keep. Each returns false where the block
//! has no tape, for the caller to run the family's host bodies.

use super::{backward, forward, Pool, Prepared, Run, TapeDevice};
use crate::backend::block::{BlockArgs, Body};
use crate::backend::{Dims, Real};

type Args<'a, T, D> =
    BlockArgs<'a, <D as crate::backend::Device<T>>::Buf, <D as crate::backend::Device<T>>::Idx>;

pub(crate) fn block_forward<T: Real, D: TapeDevice<T>>(
    dev: &D,
    d: &Dims,
    a: &Args<'_, T, D>,
    desc: &mut D::Buf,
) -> bool {
    pass(dev, d, a, None, |prep| {
        forward(dev, pool(a), prep, (a.rij, None), a.params, desc)
    })
}

pub(crate) fn block_backward<T: Real, D: TapeDevice<T>>(
    dev: &D,
    d: &Dims,
    a: &Args<'_, T, D>,
    dbar: &D::Buf,
    q: &mut D::Buf,
) -> bool {
    back(dev, d, a, None, |prep, run| {
        backward(dev, prep, run, a.params, (dbar, None), Some(q), None)
    })
}

pub(crate) fn block_tangent<T: Real, D: TapeDevice<T>>(
    dev: &D,
    d: &Dims,
    a: &Args<'_, T, D>,
    rijdot: &D::Buf,
    ddot: &mut D::Buf,
) -> bool {
    pass(dev, d, a, Some(rijdot), |prep| {
        forward(dev, pool(a), prep, (a.rij, Some(rijdot)), a.params, ddot)
    })
}

pub(crate) fn block_dual<T: Real, D: TapeDevice<T>>(
    dev: &D,
    d: &Dims,
    a: &Args<'_, T, D>,
    rijdot: &D::Buf,
    (dbar, ddotbar): (&D::Buf, &D::Buf),
    grad: &mut D::Buf,
) -> bool {
    back(dev, d, a, Some(rijdot), |prep, run| {
        let seed = (ddotbar, Some(dbar));
        backward(dev, prep, run, a.params, seed, None, Some(grad))
    })
}

/// The buffers of the stage a block's runs belong to, kept in its keep.
fn pool<R: Clone + Send + 'static, B, I>(a: &BlockArgs<B, I>) -> Pool<R> {
    a.keep.resources()
}

/// The block's tape of this batch, for the device: none where the block has none, or where a
/// buffer of its runs would be larger than the device's largest (DeePMD-kit's dynamic-sel
/// DPA-3 on a 128 MiB storage binding): the host bodies then run it, in the host's memory.
/// The bound is the dual runs', so that a block runs all four passes one way.
fn recorded<T: Real, D: TapeDevice<T>>(
    dev: &D,
    body: &Body<'_, T>,
    d: &Dims,
) -> Option<Prepared<T>> {
    let prep = Prepared::new(body.record(d)?);
    let largest = dev.memory_limits().largest.map_or(u64::MAX, |(l, _)| l);
    (prep.largest_buffer() as u64 <= largest).then_some(prep)
}

/// What a batch's tape is kept under between passes: it reads no parameter and no tangent.
const BATCH: [u64; 2] = [0, 0];

/// Runs `run` (a forward, with the tangent `rdot`) on the block's tape of this batch, the one
/// the last pass left or one recorded now, and keeps the run for the next pass.
fn pass<T: Real, D: TapeDevice<T>>(
    dev: &D,
    d: &Dims,
    a: &Args<'_, T, D>,
    rdot: Option<&D::Buf>,
    run: impl FnOnce(&Prepared<T>) -> Run<D::Raw>,
) -> bool {
    let bufs = [dev.buf_id(a.params), rdot.map_or(0, |r| dev.buf_id(r))];
    a.host(dev, false, |body| {
        let Some(prep) = (body.take_device(d, BATCH)).or_else(|| recorded(dev, &body, d)) else {
            return false;
        };
        let run = run(&prep);
        body.put_device(d, bufs, (prep, run));
        true
    })
}

/// Runs `back` on the run a forward (with the tangent `rdot`) kept for these inputs, or on
/// one made now, and leaves the batch's tape for the next pass.
fn back<T: Real, D: TapeDevice<T>>(
    dev: &D,
    d: &Dims,
    a: &Args<'_, T, D>,
    rdot: Option<&D::Buf>,
    back: impl FnOnce(&Prepared<T>, Run<D::Raw>),
) -> bool {
    let bufs = [dev.buf_id(a.params), rdot.map_or(0, |r| dev.buf_id(r))];
    a.host(dev, false, |body| {
        let (prep, run) = match body.take_device::<(Prepared<T>, Run<D::Raw>)>(d, bufs) {
            Some(kept) => kept,
            None => {
                let Some(prep) = recorded(dev, &body, d) else {
                    return false;
                };
                let mut out = dev.zeros(a.block.out_len(d.ncentres()));
                let run = forward(dev, pool(a), &prep, (a.rij, rdot), a.params, &mut out);
                (prep, run)
            }
        };
        back(&prep, run);
        body.put_device(d, BATCH, prep);
        true
    })
}

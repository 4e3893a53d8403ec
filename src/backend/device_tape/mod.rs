//! The tape (`backend/cpu/tape.rs`) run on a device: a block recorded once as its forward
//! (DPA-2's, se_e3_tebd's, DPA-3's) runs op by op through the device's tape kernels (shaders/tape.wgsl
//! on wgpu, kernels/tape.cu on cuda: one source each, built on reals and on duals), as the
//! cpu's tape runs it. The forward on reals is the forward and its backward the backward; the
//! same walk on duals is the tangent and the dual reverse: no pass of a block is written for a
//! device by hand, as none is for the cpu.
//!
//! Everything here is the devices' in common: the plan (`plan`), the walk over the ops and the
//! kernels it launches (`walk`), and the block passes on top (`blocks`). A device gives the
//! walk its buffers and launches through [`TapeDevice`].

mod blocks;
mod plan;
mod walk;

pub(crate) use blocks::{block_backward, block_dual, block_forward, block_tangent};
pub(crate) use plan::{Pool, Prepared, Slot};
pub(crate) use walk::{backward, forward, Run};

use crate::backend::gpu_layout::TapeParams;
use crate::backend::{Device, Real};

/// The tape's kernels, each of one name on every device (shaders/tape.wgsl, kernels/tape.cu
/// say what each computes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kern {
    Linear,
    LinearX,
    LinearW,
    LinearWParts,
    SumParts,
    Bmm,
    Map,
    Zip,
    Reduce,
    Gather,
    Scatter,
    SumRows,
    SpreadRows,
    Softmax,
    SoftmaxBack,
    CopyCols,
    Param,
    ParamGrad,
    Pair,
    Part,
}

impl Kern {
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) const ALL: [Kern; 20] = [
        Kern::Linear,
        Kern::LinearX,
        Kern::LinearW,
        Kern::LinearWParts,
        Kern::SumParts,
        Kern::Bmm,
        Kern::Map,
        Kern::Zip,
        Kern::Reduce,
        Kern::Gather,
        Kern::Scatter,
        Kern::SumRows,
        Kern::SpreadRows,
        Kern::Softmax,
        Kern::SoftmaxBack,
        Kern::CopyCols,
        Kern::Param,
        Kern::ParamGrad,
        Kern::Pair,
        Kern::Part,
    ];

    /// The kernel's name in the sources.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kern::Linear => "tape_linear",
            Kern::LinearX => "tape_linear_x",
            Kern::LinearW => "tape_linear_w",
            Kern::LinearWParts => "tape_linear_w_parts",
            Kern::SumParts => "tape_sum_parts",
            Kern::Bmm => "tape_bmm",
            Kern::Map => "tape_map",
            Kern::Zip => "tape_zip",
            Kern::Reduce => "tape_reduce",
            Kern::Gather => "tape_gather",
            Kern::Scatter => "tape_scatter",
            Kern::SumRows => "tape_sum_rows",
            Kern::SpreadRows => "tape_spread_rows",
            Kern::Softmax => "tape_softmax",
            Kern::SoftmaxBack => "tape_softmax_back",
            Kern::CopyCols => "tape_copy_cols",
            Kern::Param => "tape_param",
            Kern::ParamGrad => "tape_param_grad",
            Kern::Pair => "tape_pair",
            Kern::Part => "tape_part",
        }
    }
}

/// What every launch of one run binds besides its tensors: the run's constants and indices,
/// the model's parameters, and whether its numbers are duals.
pub(crate) struct Bound<'a, R> {
    pub(crate) pool: &'a Pool<R>,
    pub(crate) dual: bool,
    pub(crate) cst: &'a R,
    pub(crate) idx: &'a R,
    pub(crate) params: &'a R,
}

/// What a device gives the walk: buffers kept from run to run, and launches of the tape's
/// kernels. Every kernel binds, in this order, the run's constants, the parameters, `a`, `b`,
/// the indices, `y` and `y2` (those it reads or writes; shaders/tape.wgsl).
pub(crate) trait TapeDevice<T: Real>: Device<T> {
    /// A buffer as a kernel binds it (a handle or an address).
    type Raw: Clone + Send + 'static;

    /// The buffer of a device vector.
    fn raw(&self, b: &Self::Buf) -> Self::Raw;

    /// A device vector's length.
    fn len_of(b: &Self::Buf) -> usize;

    /// Buffer `slot` of a stage's runs (its `pool`), of at least `bytes`: the one the last
    /// run used where it is large enough.
    fn slot(&self, pool: &Pool<Self::Raw>, slot: Slot, bytes: u64) -> Self::Raw;

    /// [`TapeDevice::slot`] holding `bytes` (written in order with the launches).
    fn slot_with(&self, pool: &Pool<Self::Raw>, slot: Slot, bytes: &[u8]) -> Self::Raw;

    /// `bytes` bytes of `src` from byte `from` to the start of `dst`.
    fn copy_bytes(&self, src: &Self::Raw, from: u64, dst: &Self::Raw, bytes: u64);

    /// Zeros a device vector.
    fn zero(&self, b: &mut Self::Buf);

    /// Runs `k` (on duals where `at.dual`) over `threads` threads with `u` and the buffers
    /// `[a, b, y, y2]`.
    fn launch(
        &self,
        at: &Bound<'_, Self::Raw>,
        k: Kern,
        u: &TapeParams,
        bufs: [Option<&Self::Raw>; 4],
        threads: usize,
    );

    /// Runs one pass of the walk (on wgpu with the device held, so that no other op's work
    /// interleaves with it).
    fn pass<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
    }
}

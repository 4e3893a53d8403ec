//! The op-level Backend traits: a [`Device`] and the op families over it (`ops.rs`). The
//! training step (`crate::train::step`) calls only these ops, so a backend is a folder
//! implementing them and nothing else changes. Ops are named alike in
//! `src/backend/cpu/`, `shaders/` and `kernels/`.
//!
//! Shapes (see [`Dims`]): C centres, S slots, per slot `rhat[4]`, `jac[4][3]` (∂R̂/∂r_ij),
//! `rij[3]`; per centre `desc[M1][M2]` and the A-shaped buffers (`a`, `abar`, `adot`: 4·M1
//! values each, laid out as the backend's contraction ops like, since only they read them). Dense-layer ops work on a row range of
//! row-major matrices, so one call serves the atoms of one type or the slots of one block.
//!
//! The compute ops are declared in one table, `ops.rs`, from which the family traits, the
//! profiler's forwarders ([`timed::Timed`]) and each backend's concrete impls are made.

#[macro_use]
mod ops;
#[macro_use]
mod monomorphic;

pub mod attn;
pub mod block;
pub mod counts;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod device_tape;
mod dims;
pub mod gpu_layout;
pub mod keep;
pub mod loss;
pub mod pairtab;
mod real;
pub mod timed;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use crate::config::WeightDecay;
pub use attn::{AttnArgs, AttnOpts, BlockPass, StripArgs};
pub use block::{BlockArgs, BlockOpts, Dpa2Opts, HostBlock, RepflowOpts};
pub use dims::{Dims, Pairs};
pub use loss::{LossSums, Prefactors};
pub use real::Real;

use std::ops::Range;

use crate::geometry::EnvParams;
use crate::model::{Layer, Net, TebdLayout};

/// One piece of a [`Device::gather`]: `len` values from `src` in the source to `dst` in the
/// destination. How a batch is put together on the device from frames resident there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

/// [`Device::gather`] on host slices: the CPU backend's op, and how GPU backends keep the host
/// copies of their index buffers.
pub fn gather_slices<X: Copy>(src: &[X], dst: &mut [X], spans: &[Span]) {
    assert_eq!(
        spans.iter().map(|s| s.len).sum::<usize>(),
        dst.len(),
        "gather: the spans must tile the destination"
    );
    for s in spans {
        dst[s.dst..s.dst + s.len].copy_from_slice(&src[s.src..s.src + s.len]);
    }
}

/// Where the source window starts when the spans of a gather copy one contiguous window of the
/// source (every span shifted alike): the gather of a one-frame batch from a table of frames.
pub fn window_start(spans: &[Span]) -> Option<usize> {
    let at = spans.first().map_or(0, |s| s.src);
    spans
        .iter()
        .all(|s| s.src >= s.dst && s.src - s.dst == at)
        .then_some(at)
}

/// The k of se_e2_r's descriptor D_c = k Σ_slots G_s: DeePMD-kit's mean over the `nnei` slots
/// times its fixed `res_rescale` 1/5 (docs/design.md §10).
pub fn radial_scale(d: &Dims) -> f64 {
    1.0 / (5.0 * d.nnei as f64)
}

/// Adam hyper-parameters for one update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// 1-based step count for the bias corrections.
    pub t: u64,
    /// Parameters counted with steps of their own (a multi-task head's parts that are not
    /// stepped at every step of the run).
    pub tail: Option<AdamTail>,
    pub decay: WeightDecay,
}

/// The parts of the parameter vector whose Adam steps are counted apart ([`AdamStep::tail`]):
/// torch's Adam counts steps per tensor, and a head's tensors have no gradient (are not
/// stepped) at the other tasks' steps. Entries `from..fit_from` are counted with `t` (a head's
/// own part of a descriptor shared at level 1: its task's steps), entries from `fit_from` on
/// with `fit_t` (its fitting net: the steps of the tasks that have it); those before `from`
/// with the run's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamTail {
    pub from: usize,
    pub t: u64,
    pub fit_from: usize,
    pub fit_t: u64,
}

impl AdamStep {
    /// The factor p takes before the update and the λ of the L2 term, in f64 on the host (as
    /// torch makes 1 − lr·λ); (1, 0) without decay, which leaves every number as it was.
    pub fn decay_factors(&self) -> (f64, f64) {
        match self.decay {
            WeightDecay::None => (1.0, 0.0),
            WeightDecay::L2(l) => (1.0, l),
            WeightDecay::Decoupled(l) => (1.0 - self.lr * l, 0.0),
        }
    }

    /// `lr / (1 − β1^t)` and `sqrt(1 − β2^t)` of step count `t`, in f64 on the host, as every
    /// backend takes them.
    pub fn corrections(&self, t: u64) -> (f64, f64) {
        let bc1 = 1.0 - self.beta1.powi(t as i32);
        let bc2_sqrt = (1.0 - self.beta2.powi(t as i32)).sqrt();
        (self.lr / bc1, bc2_sqrt)
    }

    /// Where each of the tail's two parts begins and its corrections (the vector's length and
    /// the run's where there is none).
    pub fn tail_corrections(&self, n: usize) -> [(usize, (f64, f64)); 2] {
        match self.tail {
            Some(t) => [
                (t.from.min(n), self.corrections(t.t)),
                (t.fit_from.min(n), self.corrections(t.fit_t)),
            ],
            None => [(n, self.corrections(self.t)); 2],
        }
    }
}

/// Buffers of one dense layer, for the rows of one op call.
pub struct DenseIo<'a, B> {
    /// Input `[rows][nin]`.
    pub x: &'a B,
    /// What the layer keeps of its outputs (`Activation::keeps_output`): tanh(z), else z,
    /// `[rows][nout]`.
    pub h: &'a B,
}

/// The inputs of [`ContractOps::contract_dual`], for the fused stage that starts with it.
pub struct ContractDual<'a, B> {
    pub a: &'a B,
    pub adot: &'a B,
    /// D̄ and Ḋ̄: the fitting nets' input adjoints.
    pub dbar: &'a B,
    pub ddotbar: &'a B,
    pub rhat: &'a B,
    pub rdot: &'a B,
}

impl<Buf> ContractDual<'_, Buf> {
    /// [`ContractOps::contract_dual`] on these inputs, into (Ḡ, Ġ̄).
    pub fn run<T: Real, B: Backend<T, Buf = Buf> + ?Sized>(
        self,
        b: &B,
        d: &Dims,
        gbar: &mut Buf,
        gdotbar: &mut Buf,
    ) {
        let ContractDual {
            a,
            adot,
            dbar,
            ddotbar,
            rhat,
            rdot,
        } = self;
        b.contract_dual(d, a, adot, dbar, ddotbar, rhat, rdot, gbar, gdotbar);
    }
}

/// What [`Device::memory_limits`] says: bytes, each with what the limit is, for messages.
#[derive(Clone, Debug, Default)]
pub struct MemoryLimits {
    /// Memory free for a workspace.
    pub available: Option<(u64, String)>,
    /// Largest single buffer.
    pub largest: Option<(u64, String)>,
}

/// A backend's memory and schedule: its buffers, moving values in and out of them, waiting, and
/// what it offers beyond the ops. The compute ops are the op families over it (`ops.rs`); [`Backend`] is
/// all of them together.
pub trait Device<T: Real>: Sync {
    /// A device vector of T.
    type Buf: Send + Sync;
    /// A device vector of i32.
    type Idx: Send + Sync;

    fn name(&self) -> String;

    fn upload(&self, x: &[T]) -> Self::Buf;
    fn upload_idx(&self, x: &[i32]) -> Self::Idx;
    fn download(&self, b: &Self::Buf) -> Vec<T>;
    fn download_idx(&self, b: &Self::Idx) -> Vec<i32>;
    /// [`Device::upload`] of an input no kernel writes (r_ij, the statistics), whose values
    /// the host keeps beside the device's, following [`Device::write`], [`Device::fill`] and
    /// [`Device::gather`]: reading it ([`Device::host_copy`]) is then no read-back. The
    /// default keeps none.
    fn upload_kept(&self, x: Vec<T>) -> Self::Buf {
        self.upload(&x)
    }
    /// The host's copy of a buffer made by [`Device::upload_kept`]; `None` where it keeps
    /// none.
    fn host_copy(&self, _b: &Self::Buf) -> Option<Vec<T>> {
        None
    }
    fn zeros(&self, n: usize) -> Self::Buf;
    /// [`Device::zeros`] that fails where the memory is not there (`Err("")`) or the buffer
    /// would break one of the backend's limits (`Err`: which, e.g. a largest binding), for the
    /// big buffers of a batch. Host memory can be asked for fallibly; the GPU backends check
    /// their limits, then allocate as `zeros` does.
    fn try_zeros(&self, n: usize) -> Result<Self::Buf, String> {
        Ok(self.zeros(n))
    }
    /// The memory a batch's workspace may take and its largest buffer, where this device can
    /// tell (`None`: it cannot): a workspace estimated beyond either is refused before anything
    /// of it is allocated. Host memory by default (the cpu backend's).
    fn memory_limits(&self) -> MemoryLimits {
        MemoryLimits {
            available: crate::mem::host_available()
                .map(|b| (b, "memory available (MemAvailable)".into())),
            largest: None,
        }
    }
    fn fill(&self, b: &mut Self::Buf, v: T);

    /// Overwrites a buffer of `x.len()` values in place, in order with the ops issued before:
    /// a plan keeps its allocations (and so its addresses) from one batch to the next.
    fn write(&self, b: &mut Self::Buf, x: &[T]);
    /// [`Device::write`] for an index buffer.
    fn write_idx(&self, b: &mut Self::Idx, x: &[i32]);
    /// The identity of a buffer's allocation (its device address or id): equal for as long as
    /// the allocation lives, whatever is written into it.
    fn buf_id(&self, b: &Self::Buf) -> u64;
    /// [`Device::buf_id`] for an index buffer.
    fn idx_id(&self, b: &Self::Idx) -> u64;
    /// `dst[at..at + src.len]` = `src`, on the device: how per-step results (the loss sums) are
    /// logged for reading at a display step.
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, at: usize);
    /// `dst[sp.dst..sp.dst + sp.len]` = `src[sp.src..sp.src + sp.len]` for every span, on the
    /// device, in order with the ops issued before. The spans tile `dst` (every value is
    /// overwritten), so its contents follow from `src` and the spans alone.
    fn gather(&self, src: &Self::Buf, dst: &mut Self::Buf, spans: &[Span]);
    /// [`Device::gather`] for an index buffer. A backend that derives tables from an index
    /// buffer's contents (the force gather lists) may derive them from the source's.
    fn gather_idx(&self, src: &Self::Idx, dst: &mut Self::Idx, spans: &[Span]);
    /// Called once for `owner`, the owner tables of resident frames of one-frame shape `d`, one
    /// after the other, with the centre table of that shape: a backend that derives tables from
    /// an owner table (the force gather lists) derives them for every frame now, so that a
    /// batch of one of those frames, gathered by [`Device::gather_idx`], costs no upload.
    fn prepare_frames(&self, _d: &Dims, _owner: &Self::Idx, _centre_atom: &Self::Idx) {}
    /// The plan (`train::step::Workspace`) of batch shape `d` was dropped: what a backend
    /// keeps for a shape, or for its buffers, may go (without this, a run meeting many shapes
    /// — many compositions, `"mixed:N"` batches — would keep every dropped plan's buffers alive).
    fn forget_shape(&self, _d: &Dims) {}
    /// Bytes of training frames the trainer may keep on this device for the whole run
    /// (`train::resident`), unless `DPW_RESIDENT_MB` says otherwise.
    fn resident_budget(&self) -> usize {
        0
    }
    /// Runs `f`, the part of a training step that enqueues the same ops on the same buffers
    /// step after step (forward + gradient on a workspace, after its batch is loaded): a
    /// backend whose launches cost more host time than the work may record it once and replay
    /// it (the CUDA backend, unless `DPW_CUDA_GRAPH=0`). `f` may then run more than once per call
    /// (dry runs that enqueue nothing), so it must act only through this backend's ops and keep
    /// no other state. The default just runs it.
    fn replayable(&self, f: &mut dyn FnMut()) {
        f()
    }
    /// Returns when every op issued so far has finished (GPU backends only queue them), so
    /// that the wall time around a step or an op is its time.
    fn wait(&self) {}

    /// The fused embedding stage, where this backend has one; `None` (the default) makes the
    /// step run the nets layer by layer through [`DenseOps`].
    fn fused_embedding(&self) -> Option<&dyn FusedEmbedding<T, Buf = Self::Buf, Idx = Self::Idx>> {
        None
    }
}

// The op families, one trait each: src/backend/ops.rs.
compute_ops!(declare_ops);

/// `Backend` from its list of families, written once: the trait and its blanket impl.
macro_rules! backend_of {
    ($($family:ident),*) => {
        /// What a training step runs on: a [`Device`] with every op family. Every backend has it
        /// (the families it has no kernels for take their default bodies).
        /// `'static`: a step holds its stages as trait objects (`stage::descriptor::Stage`).
        pub trait Backend<T: Real>: Device<T> + 'static $(+ $family<T>)* {}

        impl<T: Real, B: Device<T> + 'static $(+ $family<T>)*> Backend<T> for B {}
    };
}

backend_of!(
    EnvOps,
    DenseOps,
    ContractOps,
    RadialOps,
    AngleOps,
    AttnOps,
    BlockOps,
    PairOps,
    TrainOps
);

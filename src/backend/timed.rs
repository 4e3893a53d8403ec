//! `Timed<B>`: a backend that forwards every op to an inner backend and adds the wall time of
//! each call to a per-op table, with the op's floating-point work counted from its shapes.
//! `dpw bench --profile` runs training on it and reports, per op, the time per step, its share
//! and the achieved GFLOP/s.
//!
//! Steps are delimited by [`Backend::adam`], the last op of a training step: the calls from the
//! end of one `adam` to the end of the next are one step's record. Whether a time stamp can be
//! taken right after a call is the inner backend's business ([`Backend::wait`]): a GPU backend
//! queues its ops and must wait for them, the CPU runs them synchronously.
//!
//! FLOP counts (a multiply-add is 2) are of the work the algorithm needs, not of what an
//! implementation happens to do: GEMMs and per-slot contractions, the embedding nets on real
//! (non-padded) slots only. Elementwise work (tanh, the loss, Adam) is counted roughly, per
//! element. The formulas are next to each op below.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use super::counts::{Counters, Counts};
use super::{AdamStep, Backend, ContractDual, DenseIo, Dims, Prefactors, Real, Span};
use crate::geometry::EnvParams;
use crate::model::{Layer, Net};

/// What profiling needs from a backend beyond its ops.
pub trait Timeable<T: Real>: Backend<T> {
    /// The number of real (non-padded, `owner >= 0`) slots, for the FLOP counts of the
    /// embedding ops. Called outside the timed spans.
    fn count_real(&self, owner: &Self::Idx) -> usize;
    /// The number of values in a buffer, for FLOP and byte counts.
    fn len(&self, b: &Self::Buf) -> usize;
    /// The backend's own running totals of launches, transfers and created objects, where it
    /// keeps them (GPU backends); otherwise they are counted here at the trait's level.
    fn counts(&self) -> Option<Counts> {
        None
    }
}

impl<T: Real> Timeable<T> for super::cpu::Cpu {
    fn count_real(&self, owner: &Vec<i32>) -> usize {
        owner.iter().filter(|&&o| o >= 0).count()
    }
    fn len(&self, b: &Vec<T>) -> usize {
        b.len()
    }
}

macro_rules! ops {
    ($($v:ident $name:literal),* $(,)?) => {
        /// Every op of the [`Backend`] trait, as a row of the profile.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($v),* }
        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$v),*];
            pub fn name(self) -> &'static str {
                match self { $(Op::$v => $name),* }
            }
        }
    };
}

ops! {
    Upload "upload",
    Download "download",
    Zeros "zeros",
    Fill "fill",
    Write "write",
    Copy "copy",
    Gather "gather",
    ClipGradNorm "clip_grad_norm",
    EnvMat "env_mat",
    DenseForward "dense_forward",
    DenseBackward "dense_backward",
    DenseTangent "dense_tangent",
    DenseDualBackward "dense_dual_backward",
    EmbedForward "embed_forward",
    EmbedDualBackward "embed_dual_backward",
    ContractForward "contract_forward",
    ContractBackward "contract_backward",
    SlotBackward "slot_backward",
    ContractTangent "contract_tangent",
    ContractDual "contract_dual",
    ContractEmbedDual "contract_embed_dual",
    RadialForward "radial_forward",
    RadialTangent "radial_tangent",
    RadialBackward "radial_backward",
    RadialDual "radial_dual",
    AngleValues "angle_values",
    AngleValuesTangent "angle_values_tangent",
    AngleForward "angle_forward",
    AngleTangent "angle_tangent",
    AngleBackward "angle_backward",
    AngleDual "angle_dual",
    Energy "energy",
    ForceVirial "force_virial",
    Loss "loss",
    VirtualTangent "virtual_tangent",
    Adam "adam",
}

const NOPS: usize = Op::ALL.len();

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    calls: u64,
    seconds: f64,
    flops: f64,
}

type StepTable = [Tally; NOPS];

#[derive(Default)]
struct Record {
    current: Option<StepTable>,
    steps: Vec<StepTable>,
    /// Launches, transfers and created objects of each completed step.
    counts: Vec<Counts>,
    /// The totals at the end of the last completed step.
    counted: Counts,
}

/// One op's line of a profile, averaged over the profiled steps.
#[derive(Clone, Debug)]
pub struct OpProfile {
    pub op: Op,
    pub calls_per_step: f64,
    pub s_per_step: f64,
    pub flops_per_step: f64,
}

impl OpProfile {
    /// Achieved GFLOP/s (0 for an op that took no time).
    pub fn gflops(&self) -> f64 {
        if self.s_per_step > 0.0 {
            self.flops_per_step / self.s_per_step * 1e-9
        } else {
            0.0
        }
    }
}

/// Mean per-op figures over a range of steps.
#[derive(Clone, Debug)]
pub struct Profile {
    pub steps: usize,
    /// Ops called at least once, in trait order.
    pub ops: Vec<OpProfile>,
    /// Mean launches, transfers and created objects per step ([`Counts::entries`] order).
    pub counts: Vec<(&'static str, f64)>,
}

impl Profile {
    pub fn s_per_step(&self) -> f64 {
        self.ops.iter().map(|o| o.s_per_step).sum()
    }
    pub fn flops_per_step(&self) -> f64 {
        self.ops.iter().map(|o| o.flops_per_step).sum()
    }
}

/// The profiling decorator; see the module documentation.
pub struct Timed<B> {
    inner: B,
    record: Mutex<Record>,
    /// Counted at the trait's level, for backends that keep no counts of their own.
    counters: Counters,
}

impl<B> Timed<B> {
    pub fn new(inner: B) -> Self {
        Timed {
            inner,
            record: Mutex::new(Record::default()),
            counters: Counters::default(),
        }
    }

    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Steps completed (calls of `adam`) so far.
    pub fn steps(&self) -> usize {
        self.record.lock().unwrap().steps.len()
    }

    /// The mean profile of the completed steps after the first `skip` (the warm-up).
    pub fn profile(&self, skip: usize) -> Profile {
        let rec = self.record.lock().unwrap();
        let steps = &rec.steps[skip.min(rec.steps.len())..];
        let n = steps.len().max(1) as f64;
        let ops = Op::ALL
            .iter()
            .enumerate()
            .map(|(i, &op)| OpProfile {
                op,
                calls_per_step: steps.iter().map(|s| s[i].calls as f64).sum::<f64>() / n,
                s_per_step: steps.iter().map(|s| s[i].seconds).sum::<f64>() / n,
                flops_per_step: steps.iter().map(|s| s[i].flops).sum::<f64>() / n,
            })
            .filter(|o| o.calls_per_step > 0.0)
            .collect();
        let counted = &rec.counts[skip.min(rec.counts.len())..];
        let counts = Counts::default()
            .entries()
            .iter()
            .enumerate()
            .map(|(i, &(name, _))| {
                let total: u64 = counted.iter().map(|c| c.entries()[i].1).sum();
                (name, total as f64 / n)
            })
            .collect();
        Profile {
            steps: steps.len(),
            ops,
            counts,
        }
    }
}

impl<B> Timed<B> {
    fn add<T: Real>(&self, op: Op, seconds: f64, flops: f64)
    where
        B: Timeable<T>,
    {
        let mut rec = self.record.lock().unwrap();
        let t = &mut rec.current.get_or_insert_with(|| [Tally::default(); NOPS])[op as usize];
        t.calls += 1;
        t.seconds += seconds;
        t.flops += flops;
        if op == Op::Adam {
            let done = rec.current.take().unwrap();
            rec.steps.push(done);
            let now = self.inner.counts().unwrap_or_else(|| self.counters.get());
            let step = now.since(&rec.counted);
            rec.counts.push(step);
            rec.counted = now;
        }
    }

    /// Runs `f` (one call of the inner backend) between two waits and books its time; an op
    /// that computes counts as one launch.
    fn time<T: Real, R>(&self, op: Op, flops: f64, f: impl FnOnce(&B) -> R) -> R
    where
        B: Timeable<T>,
    {
        if !matches!(op, Op::Upload | Op::Download | Op::Zeros | Op::Write) {
            self.counters.launch();
        }
        self.inner.wait();
        let t0 = Instant::now();
        let r = f(&self.inner);
        self.inner.wait();
        self.add::<T>(op, t0.elapsed().as_secs_f64(), flops);
        r
    }
}

/// Multiply-adds of one evaluation of a net's layers (x·W per layer).
fn net_macs(net: &Net) -> f64 {
    net.layers.iter().map(|l| (l.nin * l.nout) as f64).sum()
}

/// Multiply-adds of x̄ = z̄Wᵀ through every layer but the first (no input adjoint leaves it).
fn net_macs_input_adjoint(net: &Net) -> f64 {
    net.layers
        .iter()
        .skip(1)
        .map(|l| (l.nin * l.nout) as f64)
        .sum()
}

/// Σ over blocks (ti, tj) of f(net of the block) × slots of the block, scaled by the real
/// fraction of the slots.
fn embed_flops(d: &Dims, nets: &[&Net], real: usize, f: impl Fn(&Net) -> f64) -> f64 {
    let ns = d.nslots().max(1) as f64;
    let frac = real as f64 / ns;
    let mut total = 0.0;
    for ti in 0..d.ntypes {
        for tj in 0..d.ntypes {
            total += f(nets[ti * d.ntypes + tj]) * d.block(ti, tj).len() as f64 * frac;
        }
    }
    total
}

/// [`Backend::contract_dual`]'s work: Ā, Ǡ, three adjoints of D = AA<ᵀ per centre
/// (3·8·M1·M2); Ḡ, Ġ̄, 12·M1 per slot.
fn contract_dual_flops(d: &Dims) -> f64 {
    2.0 * (12 * d.m1 * d.nslots() + 24 * d.m1 * d.m2 * d.ncentres()) as f64
}

/// [`Backend::embed_dual_backward`]'s work: W̄ (value and tangent) through every layer, x̄ and
/// ẋ̄ through all but the first; recomputing the forward values, where a backend does, is not
/// counted.
fn embed_dual_flops(d: &Dims, nets: &[&Net], real: usize) -> f64 {
    2.0 * 2.0 * embed_flops(d, nets, real, |n| net_macs(n) + net_macs_input_adjoint(n))
}

fn dense_macs(l: &Layer, rows: &Range<usize>) -> f64 {
    (rows.len() * l.nin * l.nout) as f64
}

impl<T: Real, B: Timeable<T>> Backend<T> for Timed<B> {
    type Buf = B::Buf;
    type Idx = B::Idx;

    fn name(&self) -> String {
        format!("{} (timed)", self.inner.name())
    }

    fn upload(&self, x: &[T]) -> Self::Buf {
        self.counters.buffer();
        self.counters.upload(size_of_val(x));
        self.time::<T, _>(Op::Upload, 0.0, |b| b.upload(x))
    }
    fn upload_idx(&self, x: &[i32]) -> Self::Idx {
        self.counters.buffer();
        self.counters.upload(size_of_val(x));
        self.time::<T, _>(Op::Upload, 0.0, |b| b.upload_idx(x))
    }
    fn download(&self, buf: &Self::Buf) -> Vec<T> {
        self.counters.readback(self.inner.len(buf) * size_of::<T>());
        self.time::<T, _>(Op::Download, 0.0, |b| b.download(buf))
    }
    fn zeros(&self, n: usize) -> Self::Buf {
        self.counters.buffer();
        self.time::<T, _>(Op::Zeros, 0.0, |b| b.zeros(n))
    }
    fn try_zeros(&self, n: usize) -> Option<Self::Buf> {
        self.counters.buffer();
        self.time::<T, _>(Op::Zeros, 0.0, |b| b.try_zeros(n))
    }
    fn fill(&self, buf: &mut Self::Buf, v: T) {
        self.time::<T, _>(Op::Fill, 0.0, |b| b.fill(buf, v))
    }
    fn write(&self, buf: &mut Self::Buf, x: &[T]) {
        self.counters.upload(size_of_val(x));
        self.time::<T, _>(Op::Write, 0.0, |b| b.write(buf, x))
    }
    fn write_idx(&self, buf: &mut Self::Idx, x: &[i32]) {
        self.counters.upload(size_of_val(x));
        self.time::<T, _>(Op::Write, 0.0, |b| b.write_idx(buf, x))
    }
    fn buf_id(&self, buf: &Self::Buf) -> u64 {
        self.inner.buf_id(buf)
    }
    fn idx_id(&self, buf: &Self::Idx) -> u64 {
        Backend::<T>::idx_id(&self.inner, buf)
    }
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, at: usize) {
        self.time::<T, _>(Op::Copy, 0.0, |b| b.copy(src, dst, at))
    }
    fn gather(&self, src: &Self::Buf, dst: &mut Self::Buf, spans: &[Span]) {
        self.time::<T, _>(Op::Gather, 0.0, |b| b.gather(src, dst, spans))
    }
    fn gather_idx(&self, src: &Self::Idx, dst: &mut Self::Idx, spans: &[Span]) {
        self.time::<T, _>(Op::Gather, 0.0, |b| b.gather_idx(src, dst, spans))
    }
    fn resident_budget(&self) -> usize {
        self.inner.resident_budget()
    }
    fn prepare_frames(&self, d: &Dims, owner: &Self::Idx, centre_atom: &Self::Idx) {
        self.inner.prepare_frames(d, owner, centre_atom)
    }
    fn replayable(&self, f: &mut dyn FnMut()) {
        // Not the inner backend's: a graph would hide the per-op times measured here.
        f()
    }
    fn wait(&self) {
        self.inner.wait()
    }
    fn clip_grad_norm(&self, grad: &mut Self::Buf, max: f64, norm: &mut Self::Buf, at: usize) {
        // A square and an add per value, then a multiply.
        let flops = 3.0 * self.inner.len(grad) as f64;
        self.time::<T, _>(Op::ClipGradNorm, flops, |b| {
            b.clip_grad_norm(grad, max, norm, at)
        })
    }

    fn env_mat(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &Self::Buf,
        owner: &Self::Idx,
        davg: &Self::Buf,
        dstd: &Self::Buf,
        rhat: &mut Self::Buf,
        jac: &mut Self::Buf,
        s: &mut Self::Buf,
    ) {
        // ~60 FLOPs per real slot: the distance, the switch polynomial, R and its 4×3 Jacobian.
        let real = self.inner.count_real(owner);
        self.time::<T, _>(Op::EnvMat, 60.0 * real as f64, |b| {
            b.env_mat(d, env, rij, owner, davg, dstd, rhat, jac, s)
        })
    }

    fn dense_forward(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        x: &Self::Buf,
        h: &mut Self::Buf,
        y: &mut Self::Buf,
    ) {
        let flops = 2.0 * dense_macs(layer, &rows);
        self.time::<T, _>(Op::DenseForward, flops, |b| {
            b.dense_forward(layer, params, rows, x, h, y)
        })
    }

    fn dense_backward(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        h: &Self::Buf,
        ybar: &Self::Buf,
        xbar: &mut Self::Buf,
    ) {
        let flops = 2.0 * dense_macs(layer, &rows);
        self.time::<T, _>(Op::DenseBackward, flops, |b| {
            b.dense_backward(layer, params, rows, h, ybar, xbar)
        })
    }

    fn dense_tangent(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        h: &Self::Buf,
        xdot: &Self::Buf,
        zdot: &mut Self::Buf,
        ydot: &mut Self::Buf,
    ) {
        let flops = 2.0 * dense_macs(layer, &rows);
        self.time::<T, _>(Op::DenseTangent, flops, |b| {
            b.dense_tangent(layer, params, rows, h, xdot, zdot, ydot)
        })
    }

    fn dense_dual_backward(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        io: DenseIo<Self::Buf>,
        xdot: &Self::Buf,
        zdot: &Self::Buf,
        scale: Option<&Self::Buf>,
        ybar: &Self::Buf,
        ydotbar: &Self::Buf,
        grad: &mut Self::Buf,
        xbar: Option<(&mut Self::Buf, &mut Self::Buf)>,
    ) {
        // W̄ from the value and the tangent pair, and x̄, ẋ̄ when asked.
        let gemms = if xbar.is_some() { 4.0 } else { 2.0 };
        let flops = 2.0 * gemms * dense_macs(layer, &rows);
        self.time::<T, _>(Op::DenseDualBackward, flops, |b| {
            b.dense_dual_backward(
                layer, params, rows, io, xdot, zdot, scale, ybar, ydotbar, grad, xbar,
            )
        })
    }

    fn fused_embedding(&self) -> bool {
        self.inner.fused_embedding()
    }

    fn embed_forward(
        &self,
        d: &Dims,
        nets: &[&Net],
        params: &Self::Buf,
        s: &Self::Buf,
        owner: &Self::Idx,
        g: &mut Self::Buf,
        gp: &mut Self::Buf,
    ) {
        // Values and s-derivatives: two GEMMs per layer on the real slots.
        let real = self.inner.count_real(owner);
        let flops = 2.0 * 2.0 * embed_flops(d, nets, real, net_macs);
        self.time::<T, _>(Op::EmbedForward, flops, |b| {
            b.embed_forward(d, nets, params, s, owner, g, gp)
        })
    }

    fn embed_dual_backward(
        &self,
        d: &Dims,
        nets: &[&Net],
        params: &Self::Buf,
        s: &Self::Buf,
        owner: &Self::Idx,
        sdot: &Self::Buf,
        gbar: &Self::Buf,
        gdotbar: &Self::Buf,
        grad: &mut Self::Buf,
    ) {
        let flops = embed_dual_flops(d, nets, self.inner.count_real(owner));
        self.time::<T, _>(Op::EmbedDualBackward, flops, |b| {
            b.embed_dual_backward(d, nets, params, s, owner, sdot, gbar, gdotbar, grad)
        })
    }

    fn contract_embed_dual(
        &self,
        d: &Dims,
        nets: &[&Net],
        params: &Self::Buf,
        s: &Self::Buf,
        owner: &Self::Idx,
        sdot: &Self::Buf,
        contract: ContractDual<Self::Buf>,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
        grad: &mut Self::Buf,
    ) {
        // The two stages' work: the fused stage does what they do.
        let flops =
            contract_dual_flops(d) + embed_dual_flops(d, nets, self.inner.count_real(owner));
        self.time::<T, _>(Op::ContractEmbedDual, flops, |b| {
            b.contract_embed_dual(
                d, nets, params, s, owner, sdot, contract, gbar, gdotbar, grad,
            )
        })
    }

    fn fuses_contract_dual(&self) -> bool {
        self.inner.fuses_contract_dual()
    }

    fn contract_forward(
        &self,
        d: &Dims,
        g: &Self::Buf,
        rhat: &Self::Buf,
        a: &mut Self::Buf,
        desc: &mut Self::Buf,
    ) {
        // A: 4·M1 per slot; D: M1·M2·4 per centre.
        let flops = 2.0 * (4 * d.m1 * d.nslots() + 4 * d.m1 * d.m2 * d.ncentres()) as f64;
        self.time::<T, _>(Op::ContractForward, flops, |b| {
            b.contract_forward(d, g, rhat, a, desc)
        })
    }

    fn contract_backward(&self, d: &Dims, a: &Self::Buf, dbar: &Self::Buf, abar: &mut Self::Buf) {
        // Two products of D̄ with A: 2·4·M1·M2 per centre.
        let flops = 2.0 * (8 * d.m1 * d.m2 * d.ncentres()) as f64;
        self.time::<T, _>(Op::ContractBackward, flops, |b| {
            b.contract_backward(d, a, dbar, abar)
        })
    }

    fn slot_backward(
        &self,
        d: &Dims,
        abar: &Self::Buf,
        g: &Self::Buf,
        gp: &Self::Buf,
        rhat: &Self::Buf,
        jac: &Self::Buf,
        q: &mut Self::Buf,
    ) {
        // Ā·G and Ā·G' (8 dots of length M1) per slot.
        let flops = 2.0 * (8 * d.m1 * d.nslots()) as f64;
        self.time::<T, _>(Op::SlotBackward, flops, |b| {
            b.slot_backward(d, abar, g, gp, rhat, jac, q)
        })
    }

    fn contract_tangent(
        &self,
        d: &Dims,
        g: &Self::Buf,
        gp: &Self::Buf,
        rhat: &Self::Buf,
        rdot: &Self::Buf,
        a: &Self::Buf,
        adot: &mut Self::Buf,
        ddot: &mut Self::Buf,
    ) {
        // Ȧ: 8·M1 per slot; Ḋ: two M1×M2×4 products per centre.
        let flops = 2.0 * (8 * d.m1 * d.nslots() + 8 * d.m1 * d.m2 * d.ncentres()) as f64;
        self.time::<T, _>(Op::ContractTangent, flops, |b| {
            b.contract_tangent(d, g, gp, rhat, rdot, a, adot, ddot)
        })
    }

    fn contract_dual(
        &self,
        d: &Dims,
        a: &Self::Buf,
        adot: &Self::Buf,
        dbar: &Self::Buf,
        ddotbar: &Self::Buf,
        rhat: &Self::Buf,
        rdot: &Self::Buf,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
    ) {
        let flops = contract_dual_flops(d);
        self.time::<T, _>(Op::ContractDual, flops, |b| {
            b.contract_dual(d, a, adot, dbar, ddotbar, rhat, rdot, gbar, gdotbar)
        })
    }

    fn radial_forward(&self, d: &Dims, g: &Self::Buf, desc: &mut Self::Buf) {
        // M1 per slot.
        let flops = (d.m1 * d.nslots()) as f64;
        self.time::<T, _>(Op::RadialForward, flops, |b| b.radial_forward(d, g, desc))
    }

    fn radial_tangent(&self, d: &Dims, gp: &Self::Buf, sdot: &Self::Buf, ddot: &mut Self::Buf) {
        // A multiply-add of M1 per slot.
        let flops = 2.0 * (d.m1 * d.nslots()) as f64;
        self.time::<T, _>(Op::RadialTangent, flops, |b| {
            b.radial_tangent(d, gp, sdot, ddot)
        })
    }

    fn radial_backward(
        &self,
        d: &Dims,
        dbar: &Self::Buf,
        gp: &Self::Buf,
        jac: &Self::Buf,
        q: &mut Self::Buf,
    ) {
        // G'·D̄ (a dot of length M1) per slot.
        let flops = 2.0 * (d.m1 * d.nslots()) as f64;
        self.time::<T, _>(Op::RadialBackward, flops, |b| {
            b.radial_backward(d, dbar, gp, jac, q)
        })
    }

    fn radial_dual(
        &self,
        d: &Dims,
        dbar: &Self::Buf,
        ddotbar: &Self::Buf,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
    ) {
        // Two scaled copies of M1 per slot.
        let flops = 2.0 * (d.m1 * d.nslots()) as f64;
        self.time::<T, _>(Op::RadialDual, flops, |b| {
            b.radial_dual(d, dbar, ddotbar, gbar, gdotbar)
        })
    }

    fn angle_values(&self, d: &Dims, rhat: &Self::Buf, e: &mut Self::Buf) {
        // A dot of three per pair.
        let flops = 5.0 * d.pairs().len() as f64;
        self.time::<T, _>(Op::AngleValues, flops, |b| b.angle_values(d, rhat, e))
    }

    fn angle_values_tangent(
        &self,
        d: &Dims,
        rhat: &Self::Buf,
        rdot: &Self::Buf,
        edot: &mut Self::Buf,
    ) {
        // Two dots of three and their sum per pair.
        let flops = 11.0 * d.pairs().len() as f64;
        self.time::<T, _>(Op::AngleValuesTangent, flops, |b| {
            b.angle_values_tangent(d, rhat, rdot, edot)
        })
    }

    fn angle_forward(&self, d: &Dims, e: &Self::Buf, g: &Self::Buf, desc: &mut Self::Buf) {
        // A multiply-add of M1 per pair.
        let flops = 2.0 * (d.m1 * d.pairs().len()) as f64;
        self.time::<T, _>(Op::AngleForward, flops, |b| b.angle_forward(d, e, g, desc))
    }

    fn angle_tangent(
        &self,
        d: &Dims,
        e: &Self::Buf,
        edot: &Self::Buf,
        g: &Self::Buf,
        gp: &Self::Buf,
        ddot: &mut Self::Buf,
    ) {
        // G + e G', scaled and added: four per element of M1, per pair.
        let flops = 4.0 * (d.m1 * d.pairs().len()) as f64;
        self.time::<T, _>(Op::AngleTangent, flops, |b| {
            b.angle_tangent(d, e, edot, g, gp, ddot)
        })
    }

    fn angle_backward(
        &self,
        d: &Dims,
        rhat: &Self::Buf,
        jac: &Self::Buf,
        e: &Self::Buf,
        g: &Self::Buf,
        gp: &Self::Buf,
        dbar: &Self::Buf,
        q: &mut Self::Buf,
    ) {
        // Two dots of M1 and two 3-vector multiply-adds per pair, a 3×3 product per slot.
        let flops = ((4 * d.m1 + 12) * d.pairs().len() + 18 * d.nslots()) as f64;
        self.time::<T, _>(Op::AngleBackward, flops, |b| {
            b.angle_backward(d, rhat, jac, e, g, gp, dbar, q)
        })
    }

    fn angle_dual(
        &self,
        d: &Dims,
        e: &Self::Buf,
        edot: &Self::Buf,
        dbar: &Self::Buf,
        ddotbar: &Self::Buf,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
    ) {
        // Ḡ: two scaled rows summed; Ġ̄: one scaled row; of M1 per pair.
        let flops = 4.0 * (d.m1 * d.pairs().len()) as f64;
        self.time::<T, _>(Op::AngleDual, flops, |b| {
            b.angle_dual(d, e, edot, dbar, ddotbar, gbar, gdotbar)
        })
    }

    fn energy(
        &self,
        d: &Dims,
        e_fit: &Self::Buf,
        bias: &Self::Buf,
        e_atom: &mut Self::Buf,
        energy: &mut Self::Buf,
    ) {
        let flops = 2.0 * d.ncentres() as f64;
        self.time::<T, _>(Op::Energy, flops, |b| {
            b.energy(d, e_fit, bias, e_atom, energy)
        })
    }

    fn force_virial(
        &self,
        d: &Dims,
        q: &Self::Buf,
        rij: &Self::Buf,
        owner: &Self::Idx,
        centre_atom: &Self::Idx,
        force: &mut Self::Buf,
        virial: &mut Self::Buf,
    ) {
        // Two 3-vector sums and the 3×3 outer product per slot.
        let flops = (6 + 18) as f64 * d.nslots() as f64;
        self.time::<T, _>(Op::ForceVirial, flops, |b| {
            b.force_virial(d, q, rij, owner, centre_atom, force, virial)
        })
    }

    fn loss(
        &self,
        d: &Dims,
        pref: Prefactors,
        pred: [&Self::Buf; 3],
        label: [&Self::Buf; 3],
        ebar: &mut Self::Buf,
        fres: &mut Self::Buf,
        vres: &mut Self::Buf,
        sums: &mut Self::Buf,
    ) {
        let flops = 4.0 * (d.nframes * (d.natoms * 3 + 10)) as f64;
        self.time::<T, _>(Op::Loss, flops, |b| {
            b.loss(d, pref, pred, label, ebar, fres, vres, sums)
        })
    }

    fn virtual_tangent(
        &self,
        d: &Dims,
        fres: &Self::Buf,
        vres: &Self::Buf,
        jac: &Self::Buf,
        rij: &Self::Buf,
        owner: &Self::Idx,
        centre_atom: &Self::Idx,
        rdot: &mut Self::Buf,
        sdot: &mut Self::Buf,
    ) {
        // u = Δ − W r (3 + 9 multiply-adds), Ṙ = J u (12) per slot.
        let flops = 2.0 * (3 + 9 + 12) as f64 * d.nslots() as f64;
        self.time::<T, _>(Op::VirtualTangent, flops, |b| {
            b.virtual_tangent(d, fres, vres, jac, rij, owner, centre_atom, rdot, sdot)
        })
    }

    fn adam(
        &self,
        s: AdamStep,
        params: &mut Self::Buf,
        grad: &Self::Buf,
        m: &mut Self::Buf,
        v: &mut Self::Buf,
    ) {
        // ~12 FLOPs per parameter (two moments, the bias-corrected step).
        let flops = 12.0 * self.inner.len(params) as f64;
        self.time::<T, _>(Op::Adam, flops, |b| b.adam(s, params, grad, m, v))
    }
}

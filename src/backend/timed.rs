//! `Timed<B>`: a backend that forwards every op to an inner backend and adds the wall time of
//! each call to a per-op table, with the op's floating-point work counted from its shapes.
//! `dpw bench --profile` runs training on it and reports, per op, the time per step, its share
//! and the achieved GFLOP/s.
//!
//! Steps are delimited by [`TrainOps::adam`], the last op of a training step: the calls from the
//! end of one `adam` to the end of the next are one step's record. Whether a time stamp can be
//! taken right after a call is the inner backend's business ([`Device::wait`]): a GPU backend
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
use super::{
    AdamStep, AngleOps, AttnArgs, AttnOps, Backend, BlockArgs, BlockOps, ContractDual, ContractOps,
    DenseIo, DenseOps, Device, Dims, EnvOps, FusedEmbedding, HostBlock, PairOps, Prefactors,
    RadialOps, Real, Span, StripArgs, TrainOps,
};
use crate::geometry::EnvParams;
use crate::model::{Layer, Net, TebdLayout};

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

impl<T: Real> Timeable<T> for super::cpu::Cpu
where
    super::cpu::Cpu: Backend<T, Buf = Vec<T>, Idx = Vec<i32>>,
{
    fn count_real(&self, owner: &Vec<i32>) -> usize {
        owner.iter().filter(|&&o| o >= 0).count()
    }
    fn len(&self, b: &Vec<T>) -> usize {
        b.len()
    }
}

/// The profile's rows: the data movement ops, then every compute op of the table (ops.rs), in
/// the trait's order.
macro_rules! op_rows {
    ([] $($family:ident [$(#[$fm:meta])*] [$({
        $name:ident, $op:ident, [$(#[$m:meta])*], $slf:ident, [$($arg:ident: $ty:ty),*],
        $inner:tt, $flops:block, [$($body:block)?]
    })*])*) => {
        /// Every op of the [`Backend`] trait, as a row of the profile.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op {
            Upload,
            Download,
            Zeros,
            Fill,
            Write,
            Copy,
            Gather,
            $($($op,)*)*
        }
        impl Op {
            pub const ALL: &'static [Op] = &[
                Op::Upload,
                Op::Download,
                Op::Zeros,
                Op::Fill,
                Op::Write,
                Op::Copy,
                Op::Gather,
                $($(Op::$op,)*)*
            ];
            pub fn name(self) -> &'static str {
                match self {
                    Op::Upload => "upload",
                    Op::Download => "download",
                    Op::Zeros => "zeros",
                    Op::Fill => "fill",
                    Op::Write => "write",
                    Op::Copy => "copy",
                    Op::Gather => "gather",
                    $($(Op::$op => stringify!($name),)*)*
                }
            }
        }
    };
}

compute_ops!(op_rows);

/// [`Timed`]'s op families from the table: each op's FLOPs from its shapes, then the inner
/// backend's op (for [`FusedEmbedding`], its fused object's) between two waits.
macro_rules! timed_ops {
    ([] $($family:ident [$(#[$fm:meta])*] [$($entry:tt)*])*) => {
        $(timed_ops!(@family $family $($entry)*);)*
    };
    (@family $family:ident $({
        $name:ident, $op:ident, [$(#[$m:meta])*], $slf:ident, [$($arg:ident: $ty:ty),*],
        $inner:tt, $flops:block, [$($body:block)?]
    })*) => {
        impl<T: Real, B: Timeable<T>> $family<T> for Timed<B> {
            $(
                fn $name(&$slf, $($arg: $ty),*) {
                    let flops: f64 = {
                        let $inner = &$slf.inner;
                        $flops
                    };
                    $slf.time::<T, _>(Op::$op, flops, |b| timed_ops!(@ops $family b).$name($($arg),*))
                }
            )*
        }
    };
    (@ops FusedEmbedding $b:ident) => {
        $b.fused_embedding().expect("Timed offers the fused stage only where its inner backend does")
    };
    (@ops $family:ident $b:ident) => {
        $b
    };
}

compute_ops!(timed_ops);

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
        for tj in d.sections() {
            total += f(nets[ti * d.nsec + tj]) * d.block(ti, tj).len() as f64 * frac;
        }
    }
    total
}

/// [`ContractOps::contract_dual`]'s work: Ā, Ǡ, three adjoints of D = AA<ᵀ per centre
/// (3·8·M1·M2); Ḡ, Ġ̄, 12·M1 per slot.
/// The attention block's forward work (docs/design.md §11.1): per centre and layer the two
/// projections, the n² logits and weighted sums, then the contraction.
fn attn_flops<B, I>(d: &Dims, a: &AttnArgs<B, I>) -> f64 {
    let (n, m, h) = (d.nnei, a.opts.m1, a.opts.h);
    let layer = 2 * n * m * 3 * h + 2 * n * h * m + 4 * n * n * h;
    let contract = 8 * n * m + 8 * m * a.opts.m2;
    ((a.layout.layers.len() * layer + contract) * d.ncentres()) as f64
}

/// A message-passing block's forward work: for RepFlow, per centre and layer, the per-edge
/// linears and the per-angle-pair ones (the rest is smaller); for the repformer, per centre the
/// repinit's embedding net over its slots and per layer the per-slot linears and attention;
/// for se_e3_tebd, its embedding net over every pair of slots of a centre.
fn block_flops<B, I>(d: &Dims, a: &BlockArgs<B, I>) -> f64 {
    match a.block {
        HostBlock::Repflow(o, l) => {
            let edge = (2 * o.n + o.e) * (o.h * o.n + o.e) + 2 * o.e * o.e;
            let da = o.ad + o.nc + 2 * o.ec;
            let angle = if o.update_angle { da * (o.e + o.ad) } else { 0 };
            let layer = o.s * edge + o.a * o.a * angle;
            2.0 * (l.layers.len() * layer * d.ncentres()) as f64
        }
        HostBlock::Repformer(o, l) => {
            let r = &o.c.repformer;
            let (s, g1, g2) = (r.nsel, r.g1_dim, r.g2_dim);
            let embed: usize = (l.repinit.layers.iter()).map(|x| x.nin * x.nout).sum();
            let attn =
                2 * r.attn2_nhead * s * r.attn2_hidden + r.attn1_nhead * (r.attn1_hidden + g1);
            let layer = s * (3 * g1 * g2 + g2 * g2 + attn) + g1 * g1;
            2.0 * ((o.si * embed + l.layers.len() * layer) * d.ncentres()) as f64
        }
        HostBlock::SeE3Tebd(o, l) => {
            let nets = [Some(&l.embed), l.embed_strip.as_ref()]
                .into_iter()
                .flatten();
            let embed: usize = (nets.flat_map(|n| &n.layers)).map(|x| x.nin * x.nout).sum();
            2.0 * (o.sel * o.sel * embed * d.ncentres()) as f64
        }
    }
}

fn contract_dual_flops(d: &Dims) -> f64 {
    2.0 * (12 * d.m1 * d.nslots() + 24 * d.m1 * d.m2 * d.ncentres()) as f64
}

/// [`FusedEmbedding::embed_dual_backward`]'s work: W̄ (value and tangent) through every layer, x̄ and
/// ẋ̄ through all but the first; recomputing the forward values, where a backend does, is not
/// counted.
fn embed_dual_flops(d: &Dims, nets: &[&Net], real: usize) -> f64 {
    2.0 * 2.0 * embed_flops(d, nets, real, |n| net_macs(n) + net_macs_input_adjoint(n))
}

fn dense_macs(l: &Layer, rows: &Range<usize>) -> f64 {
    (rows.len() * l.nin * l.nout) as f64
}

impl<T: Real, B: Timeable<T>> Device<T> for Timed<B> {
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
    fn download_idx(&self, b: &Self::Idx) -> Vec<i32> {
        self.inner.download_idx(b)
    }
    fn download(&self, buf: &Self::Buf) -> Vec<T> {
        self.counters.readback(self.inner.len(buf) * size_of::<T>());
        self.time::<T, _>(Op::Download, 0.0, |b| b.download(buf))
    }
    fn upload_kept(&self, x: Vec<T>) -> Self::Buf {
        self.counters.buffer();
        self.counters.upload(size_of_val(&x[..]));
        self.time::<T, _>(Op::Upload, 0.0, |b| b.upload_kept(x))
    }
    fn host_copy(&self, buf: &Self::Buf) -> Option<Vec<T>> {
        self.inner.host_copy(buf)
    }
    fn zeros(&self, n: usize) -> Self::Buf {
        self.counters.buffer();
        self.time::<T, _>(Op::Zeros, 0.0, |b| b.zeros(n))
    }
    fn try_zeros(&self, n: usize) -> Result<Self::Buf, String> {
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
        Device::<T>::idx_id(&self.inner, buf)
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
    fn memory_limits(&self) -> super::MemoryLimits {
        self.inner.memory_limits()
    }
    fn prepare_frames(&self, d: &Dims, owner: &Self::Idx, centre_atom: &Self::Idx) {
        self.inner.prepare_frames(d, owner, centre_atom)
    }
    fn forget_shape(&self, d: &Dims) {
        self.inner.forget_shape(d)
    }
    fn replayable(&self, f: &mut dyn FnMut()) {
        // Not the inner backend's: a graph would hide the per-op times measured here.
        f()
    }
    fn wait(&self) {
        self.inner.wait()
    }
    fn fused_embedding(&self) -> Option<&dyn FusedEmbedding<T, Buf = B::Buf, Idx = B::Idx>> {
        let fused: &dyn FusedEmbedding<T, Buf = B::Buf, Idx = B::Idx> = self;
        self.inner.fused_embedding().map(|_| fused)
    }
}

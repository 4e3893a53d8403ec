//! The tape (`backend/cpu/tape.rs`) run on the device: a block recorded once as its forward
//! (DPA-2's, se_e3_tebd's, DPA-3's) runs here op by op through shaders/tape.wgsl, as the cpu's
//! tape runs it. The forward on reals is the forward and its backward the backward; the same
//! walk on duals (the `(dual)` build of the same shader) is the tangent and the dual reverse: no
//! pass of a block is written for the device by hand, as none is for the cpu.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::shaders::{TapeKernels, TAPE, TAPE_DUAL};
use super::{Buf, GpuReal, Idx, Wgpu};
use crate::backend::block::{self, BlockArgs};
use crate::backend::cpu::tape::{Elem, Op, Tape, NONE, V};
use crate::backend::cpu::tape_block::Recorded;
use crate::backend::gpu_layout::{count, TapeParams};
use crate::backend::monomorphic::Generic;
use crate::backend::{BlockOps, Dims};
use crate::model::Activation;

/// A buffer of a tape's runs: a tensor's value, slope or adjoint, the run's indices or constant
/// tensors, or the parts of its long sums (by bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Slot {
    Val(usize),
    Slope(usize),
    Adj(usize),
    Cst,
    Idx,
    Leaves,
    Parts(u64),
}

/// The buffers of a stage's tape runs by slot, each as large as the largest run needed (a
/// stage has one run live at a time: its keep holds one), kept in the stage's [`Keep`] so that
/// they go with it.
///
/// [`Keep`]: crate::backend::keep::Keep
#[derive(Clone, Default)]
pub(crate) struct Pool(Arc<Mutex<HashMap<Slot, wgpu::Buffer>>>);

/// A forward's values on the device, kept for its backward.
pub(crate) struct Run {
    /// Whether the numbers are duals (the tangent's run).
    dual: bool,
    /// The stage's buffers.
    pool: Pool,
    /// Each op's value; none for a reshape, which reads its source's (`src`).
    vals: Vec<Option<wgpu::Buffer>>,
    src: Vec<usize>,
    /// The map ops' slopes.
    slopes: Vec<Option<wgpu::Buffer>>,
    /// The plan's constants and indices on the device.
    cst: wgpu::Buffer,
    idx: wgpu::Buffer,
}

/// A block's tape recorded from one batch, with its plan: what every pass on that batch
/// shares (the forward's run and the tangent's alike), so made once a batch.
pub(crate) struct Prepared<T: GpuReal> {
    rec: Recorded<T>,
    plan: Plan,
}

impl<T: GpuReal> Prepared<T> {
    pub(crate) fn new(rec: Recorded<T>) -> Self {
        let plan = plan(&rec.0, rec.1);
        Prepared { rec, plan }
    }
}

/// The constants and indices of one tape, and which ops' adjoints are wanted.
struct Plan {
    /// Where each op's constants (in `cst`) and indices (in `idx`) begin: a gather's indices
    /// and then its adjoint's CSR, a softmax's mask.
    ci: Vec<u32>,
    ix: Vec<Ix>,
    cst: Vec<f64>,
    idx: Vec<u32>,
    /// Whether an op's adjoint is wanted: it reads r_ij or a parameter, itself or through
    /// what it reads.
    wanted: Vec<bool>,
}

/// Where an op's indices begin in the run's index buffer: a gather's, and its adjoint's CSR
/// with the most units one source unit is read into; a softmax's mask.
#[derive(Clone, Copy, Default)]
struct Ix {
    at: u32,
    csr: u32,
    longest: usize,
}

/// cst[0] and cst[1]: the scales of a plain copy and of a negated one.
const ONE: u32 = 0;
const MINUS_ONE: u32 = 1;

fn elem_id(f: Elem) -> (u32, Vec<f64>) {
    match f {
        Elem::Sqrt => (0, vec![]),
        Elem::Switch { rs, rc } => (1, vec![rs, rc]),
        Elem::Recip(p) => (2, vec![p]),
        Elem::Rsqrt(e) => (3, vec![e]),
        Elem::Act(Activation::Tanh) => (4, vec![]),
        Elem::Act(Activation::Silu) => (5, vec![]),
        Elem::Act(Activation::Silut(c)) => {
            // As Activation::eval3 takes them, in f64.
            let sig = 1.0 / (1.0 + (-c).exp());
            (6, vec![c, sig + c * sig * (1.0 - sig), c * sig])
        }
        Elem::Act(Activation::Linear) => (7, vec![]),
        Elem::ExpSwitch { rs, rc } => (8, vec![rs, rc]),
    }
}

/// A gather's adjoint as a CSR over the `n` units of its source: starts `[n + 1]`, then the
/// units reading each, in order, in room for all of `idx`: a tape's index layout is then its
/// shapes' alone, and so are its kernels' uniforms and bind groups, whatever the batch.
fn csr(idx: &[u32], n: usize) -> Vec<u32> {
    let mut start = vec![0u32; n + 1];
    for &i in idx.iter().filter(|&&i| i != NONE) {
        start[i as usize + 1] += 1;
    }
    for k in 0..n {
        start[k + 1] += start[k];
    }
    let mut at = start.clone();
    let mut list = vec![0u32; idx.len()];
    for (e, &i) in idx.iter().enumerate().filter(|(_, &i)| i != NONE) {
        list[at[i as usize] as usize] = e as u32;
        at[i as usize] += 1;
    }
    start.extend(list);
    start
}

fn plan<T: GpuReal>(t: &Tape<'_, T, T>, input: V) -> Plan {
    let n = t.ops().len();
    let mut p = Plan {
        ci: vec![ONE; n],
        ix: vec![Ix::default(); n],
        cst: vec![1.0, -1.0],
        idx: Vec::new(),
        wanted: vec![false; n],
    };
    for (i, (op, _)) in t.ops().enumerate() {
        let constants = match op {
            Op::Scale(_, s) => vec![s.f64()],
            Op::Map(_, f, _) => elem_id(*f).1,
            _ => vec![],
        };
        if !constants.is_empty() {
            p.ci[i] = count(p.cst.len());
            p.cst.extend(constants);
        }
        match op {
            Op::Gather { x, idx: g, w } => {
                let (r, c) = t.shape(*x);
                let units = r * c / w;
                let at = count(p.idx.len());
                p.idx.extend_from_slice(g);
                let back = p.idx.len();
                p.idx.extend(csr(g, units));
                let starts = &p.idx[back..back + units + 1];
                let longest = starts.windows(2).map(|w| (w[1] - w[0]) as usize).max();
                p.ix[i] = Ix {
                    at,
                    csr: count(back),
                    // Rounded up, so that batches share the number of parts of the adjoint's
                    // sums (and their uniforms): the parts past a row's terms add nothing.
                    longest: longest.unwrap_or(0).next_power_of_two(),
                };
            }
            Op::Softmax(_, Some(mask)) => {
                p.ix[i].at = count(p.idx.len());
                p.idx.extend(mask.iter().map(|&m| m as u32));
            }
            _ => {}
        }
        p.wanted[i] = match op {
            Op::Param(_) | Op::Linear { .. } => true,
            Op::Leaf => i == input.index(),
            _ => args(op).iter().any(|a| p.wanted[a.index()]),
        };
    }
    p
}

/// The tensors an op reads.
fn args<T, N>(op: &Op<T, N>) -> Vec<V> {
    match op {
        Op::Leaf | Op::Param(_) => vec![],
        Op::Linear { x, .. } => vec![*x],
        Op::Bmm { a, b, .. } => vec![*a, *b],
        Op::Add(a, b) | Op::Sub(a, b) | Op::Mul(a, b) => vec![*a, *b],
        Op::Map(x, ..)
        | Op::Scale(x, _)
        | Op::Gather { x, .. }
        | Op::SumRows(x, _)
        | Op::RowSum(x)
        | Op::Softmax(x, _)
        | Op::Reshape(x) => vec![*x],
        Op::Concat(xs) => xs.clone(),
    }
}

/// Launch shape: rows and columns of the tensor written (the kernel's thread count is theirs,
/// or as the kernel says).
fn shape(rows: usize, cols: usize) -> TapeParams {
    TapeParams {
        rows: count(rows),
        cols: count(cols),
        ..Default::default()
    }
}

/// The buffers of one run's dispatches: its kernels, constants, indices and the model's
/// parameters.
struct Launch<'a, T> {
    w: &'a Wgpu,
    pool: &'a Pool,
    k: &'static TapeKernels,
    ns: usize,
    cst: &'a wgpu::Buffer,
    idx: &'a wgpu::Buffer,
    params: &'a wgpu::Buffer,
    _t: std::marker::PhantomData<T>,
}

impl<T: GpuReal> Launch<'_, T> {
    /// Runs kernel `kern` over `threads` threads with buffers in binding order: cst, params,
    /// a, b, idx, y, y2 (those it lists).
    fn go(
        &self,
        kern: &super::shaders::Kernel,
        u: &TapeParams,
        bufs: [Option<&wgpu::Buffer>; 4],
        threads: usize,
    ) {
        let [a, b, y, y2] = bufs;
        let by_binding = |b_: u32| -> &wgpu::Buffer {
            match b_ {
                1 => self.cst,
                2 => self.params,
                3 => a.expect("a"),
                4 => b.expect("b"),
                5 => self.idx,
                6 => y.expect("y"),
                _ => y2.expect("y2"),
            }
        };
        let list: Vec<&wgpu::Buffer> = kern
            .bindings
            .iter()
            .map(|&(b_, _)| by_binding(b_))
            .collect();
        self.w.go::<T>(kern, u, &list, super::ops::grid1(threads));
    }

    fn bytes(&self, entries: usize) -> u64 {
        (entries * self.ns * size_of::<T>()) as u64
    }

    /// A long sum's kernel `kern` (see shaders/tape.wgsl's `stretch`): `nout` entries of
    /// `terms` terms, each term `work` iterations, into `y` (`[a, b, y, y2]`) in one part
    /// where they are few, else in parts `finish` adds in order.
    #[allow(clippy::too_many_arguments)]
    fn summed(
        &self,
        (kern, finish): (&super::shaders::Kernel, &super::shaders::Kernel),
        u: TapeParams,
        [a, b, y, y2]: [Option<&wgpu::Buffer>; 4],
        nout: usize,
        terms: usize,
        work: usize,
    ) {
        let chunk = (SUM_CHUNK / work.max(1)).max(1);
        let nparts = terms.div_ceil(chunk).max(1);
        let u = TapeParams {
            nout: count(nout),
            nparts: count(nparts),
            chunk: count(chunk),
            ..u
        };
        if nparts == 1 {
            return self.go(kern, &u, [a, b, y, y2], nout);
        }
        let bytes = self.bytes(nparts * nout).next_power_of_two();
        let parts = self.w.tape_buf(self.pool, Slot::Parts(bytes), bytes);
        self.go(kern, &u, [a, b, Some(&parts), y2], nparts * nout);
        self.go(finish, &u, [Some(&parts), None, y, y2], nout);
    }
}

/// Terms per part of a long sum: a thread's work, within lavapipe's 65535 loop iterations.
const SUM_CHUNK: usize = 1024;

impl Wgpu {
    /// Buffer `slot` of a stage's runs, of at least `bytes`: the one the last run used where
    /// it is large enough.
    fn tape_buf(&self, pool: &Pool, slot: Slot, bytes: u64) -> wgpu::Buffer {
        let mut slots = pool.0.lock().unwrap();
        match slots.get(&slot) {
            Some(b) if b.size() >= bytes => b.clone(),
            _ => {
                let b = self.zeros_raw(bytes);
                slots.insert(slot, b.clone());
                b
            }
        }
    }

    /// The forward of tape `t` on the device: on reals, or with the tangent `rdot` of r_ij on
    /// duals; r_ij (`input`) from `rij`, parameters from `params`. Writes the output's value
    /// (or its tangent) to `out`; the run is kept for the backward. Runs of one stage share
    /// its `pool`: one is live at a time.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tape_forward<T: GpuReal>(
        &self,
        pool: Pool,
        prep: &Prepared<T>,
        rij: &Buf<T>,
        rdot: Option<&Buf<T>>,
        params: &Buf<T>,
        out: &mut Buf<T>,
    ) -> Run {
        let _op = self.exclusive();
        let (t, input, output) = &prep.rec;
        let p = &prep.plan;
        let dual = rdot.is_some();
        let (cst, idx) = self.tape_consts::<T>(p, &pool);
        let l = Launch::<T> {
            w: self,
            pool: &pool,
            k: if dual { &TAPE_DUAL } else { &TAPE },
            ns: if dual { 2 } else { 1 },
            cst: &cst,
            idx: &idx,
            params: &params.buf,
            _t: Default::default(),
        };
        let n = t.ops().len();
        let (mut vals, mut slopes): (Vec<Option<wgpu::Buffer>>, Vec<Option<wgpu::Buffer>>) = (
            (0..n).map(|_| None).collect(),
            (0..n).map(|_| None).collect(),
        );
        let (leaf_at, leaves) = self.tape_leaves(t, *input, &l);
        let mut src: Vec<usize> = (0..n).collect();
        for (i, (o, (rows, cols))) in t.ops().enumerate() {
            let len = rows * cols;
            if let Op::Reshape(x) = o {
                src[i] = src[x.index()];
                continue;
            }
            let y = self.tape_buf(&pool, Slot::Val(i), l.bytes(len));
            let v = |x: &V| vals[src[x.index()]].as_ref().expect("a value");
            let mut u = shape(rows, cols);
            match o {
                Op::Leaf if i == input.index() => {
                    u.has_b = rdot.is_some() as u32;
                    let b = rdot.unwrap_or(rij);
                    l.go(
                        &l.k.pair,
                        &u,
                        [Some(&rij.buf), Some(&b.buf), Some(&y), None],
                        len,
                    );
                }
                Op::Leaf => self.copy_region(&leaves, leaf_at[i], &y, 0, l.bytes(len)),
                Op::Param(at) => {
                    u.w = count(*at);
                    l.go(&l.k.param, &u, [None, None, Some(&y), None], len);
                }
                Op::Linear { x, w, b } => {
                    let (_, nin) = t.shape(*x);
                    u.cols = count(nin);
                    u.nn = count(cols);
                    u.w = count(*w);
                    u.has_b = b.is_some() as u32;
                    u.b = count(b.unwrap_or(0));
                    l.go(&l.k.linear, &u, [Some(v(x)), None, Some(&y), None], len);
                }
                &Op::Bmm {
                    a,
                    b,
                    m,
                    k,
                    n,
                    ta,
                    tb,
                } => {
                    let u = bmm(rows / m.max(1), (m, k, n), (ta, tb));
                    l.go(
                        &l.k.bmm,
                        &u,
                        [Some(v(&a)), Some(v(&b)), Some(&y), None],
                        len,
                    );
                }
                Op::Map(x, f, _) => {
                    let s = self.tape_buf(&pool, Slot::Slope(i), l.bytes(len));
                    u.op = elem_id(*f).0;
                    u.ci = p.ci[i];
                    l.go(&l.k.map, &u, [Some(v(x)), None, Some(&y), Some(&s)], len);
                    slopes[i] = Some(s);
                }
                Op::Add(a, b) | Op::Sub(a, b) | Op::Mul(a, b) => {
                    (u.br, u.bc) = shape_u32(t.shape(*b));
                    u.op = match o {
                        Op::Add(..) => 0,
                        Op::Sub(..) => 1,
                        _ => 2,
                    };
                    l.go(&l.k.zip, &u, [Some(v(a)), Some(v(b)), Some(&y), None], len);
                }
                Op::Scale(x, _) => {
                    (u.op, u.ci, (u.br, u.bc)) = (3, p.ci[i], (count(rows), count(cols)));
                    l.go(&l.k.zip, &u, [Some(v(x)), Some(v(x)), Some(&y), None], len);
                }
                Op::Gather { x, w, .. } => {
                    (u.ix, u.k) = (p.ix[i].at, count(*w));
                    l.go(&l.k.gather, &u, [Some(v(x)), None, Some(&y), None], len);
                }
                Op::SumRows(x, k) => {
                    u.k = count(*k);
                    let kerns = (&l.k.sum_rows, &l.k.sum_parts);
                    l.summed(kerns, u, [Some(v(x)), None, Some(&y), None], len, *k, 1);
                }
                Op::RowSum(x) => {
                    let (xr, xc) = t.shape(*x);
                    let mut u = shape(xr, xc);
                    (u.br, u.bc, u.op, u.ci) = (count(rows), 1, 0, ONE);
                    let kerns = (&l.k.reduce, &l.k.sum_parts);
                    l.summed(
                        kerns,
                        u,
                        [Some(v(x)), Some(v(x)), Some(&y), None],
                        len,
                        1,
                        xc,
                    );
                }
                Op::Softmax(x, mask) => {
                    (u.has_b, u.ix) = (mask.is_some() as u32, p.ix[i].at);
                    l.go(&l.k.softmax, &u, [Some(v(x)), None, Some(&y), None], rows);
                }
                Op::Concat(xs) => {
                    let mut at = 0;
                    for x in xs {
                        let w = t.shape(*x).1;
                        let u = copy_cols(rows, (w, 0), (cols, at), w, false);
                        l.go(
                            &l.k.copy_cols,
                            &u,
                            [Some(v(x)), None, Some(&y), None],
                            rows * w,
                        );
                        at += w;
                    }
                }
                Op::Reshape(_) => unreachable!("aliased above"),
            }
            vals[i] = Some(y);
        }
        let u = TapeParams {
            op: dual as u32,
            ..shape(out.len, 1)
        };
        let y = vals[src[output.index()]].as_ref().expect("the output");
        l.go(
            &l.k.part,
            &u,
            [Some(y), None, Some(&out.buf), None],
            out.len,
        );
        Run {
            dual,
            pool,
            vals,
            src,
            slopes,
            cst,
            idx,
        }
    }

    /// The run's constants (rounded to T) and indices on the device.
    /// Each tape's own (not one buffer for every tape, as `Wgpu::consts` keeps an op's: a run's
    /// backward reads the constants of its forward while other stages' tapes run between).
    fn tape_consts<T: GpuReal>(&self, p: &Plan, pool: &Pool) -> (wgpu::Buffer, wgpu::Buffer) {
        let cst: Vec<T> = p.cst.iter().map(|&c| T::of(c)).collect();
        let buf = self.tape_buf(pool, Slot::Cst, size_of_val(&cst[..]) as u64);
        self.write_bytes(&buf, bytemuck::cast_slice(&cst));
        let cst = buf;
        let idx = self.tape_buf(pool, Slot::Idx, (4 * p.idx.len().max(1)) as u64);
        self.write_bytes(&idx, bytemuck::cast_slice(&p.idx));
        (cst, idx)
    }

    /// Every constant leaf's numbers (`ns` reals each) in one upload: where each op's begin
    /// (bytes), and the buffer.
    fn tape_leaves<T: GpuReal>(
        &self,
        t: &Tape<'_, T, T>,
        input: V,
        l: &Launch<'_, T>,
    ) -> (Vec<u64>, wgpu::Buffer) {
        let mut host: Vec<T> = Vec::new();
        let mut at = Vec::with_capacity(t.ops().len());
        for (i, (o, _)) in t.ops().enumerate() {
            at.push((host.len() * size_of::<T>()) as u64);
            if matches!(o, Op::Leaf) && i != input.index() {
                for &x in t.val(V::at(i)) {
                    host.push(x);
                    if l.ns == 2 {
                        host.push(T::zero());
                    }
                }
            }
        }
        let bytes = (host.len().max(1) * size_of::<T>()) as u64;
        let buf = self.tape_buf(l.pool, Slot::Leaves, bytes);
        self.write_bytes(&buf, bytemuck::cast_slice(&host));
        (at, buf)
    }

    /// The backward of a forward's run from the adjoint `seed` of its output (with `seed_eps`,
    /// its ε part, on duals): r_ij's adjoint into `q` where given, the parameters' (their ε
    /// parts on duals) added to `grad` where given. The run's buffers go back to the pool.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tape_backward<T: GpuReal>(
        &self,
        prep: &Prepared<T>,
        run: Run,
        params: &Buf<T>,
        (seed, seed_eps): (&Buf<T>, Option<&Buf<T>>),
        q: Option<&mut Buf<T>>,
        grad: Option<&mut Buf<T>>,
    ) {
        let _op = self.exclusive();
        let (t, input, output) = &prep.rec;
        let p = &prep.plan;
        let l = Launch::<T> {
            w: self,
            pool: &run.pool,
            k: if run.dual { &TAPE_DUAL } else { &TAPE },
            ns: if run.dual { 2 } else { 1 },
            cst: &run.cst,
            idx: &run.idx,
            params: &params.buf,
            _t: Default::default(),
        };
        let n = t.ops().len();
        let mut adj: Vec<Option<wgpu::Buffer>> = (0..n).map(|_| None).collect();
        let grad = grad.map(|g| &g.buf);
        let val = |x: V| run.vals[run.src[x.index()]].as_ref().expect("a value");
        // Adds to x's adjoint through `f(acc, y)`, making it on first use.
        let to = |adj: &mut Vec<Option<wgpu::Buffer>>, x: V, f: &dyn Fn(u32, &wgpu::Buffer)| {
            if !p.wanted[x.index()] {
                return;
            }
            let acc = adj[x.index()].is_some();
            let y = adj[x.index()]
                .get_or_insert_with(|| {
                    self.tape_buf(&run.pool, Slot::Adj(x.index()), l.bytes(t.len(x)))
                })
                .clone();
            f(acc as u32, &y);
        };
        {
            let (rows, cols) = t.shape(*output);
            let mut u = shape(rows, cols);
            u.has_b = seed_eps.is_some() as u32;
            let eps = seed_eps.unwrap_or(seed);
            to(&mut adj, *output, &|acc, y| {
                let u = TapeParams { acc, ..u };
                l.go(
                    &l.k.pair,
                    &u,
                    [Some(&seed.buf), Some(&eps.buf), Some(y), None],
                    rows * cols,
                );
            });
        }
        for (i, (o, (rows, cols))) in t.ops().enumerate().rev() {
            let Some(ybar) = adj[i].take() else { continue };
            let len = rows * cols;
            let base = shape(rows, cols);
            match o {
                Op::Leaf => {
                    adj[i] = Some(ybar);
                    continue;
                }
                Op::Param(at) => {
                    if let Some(g) = grad {
                        let u = TapeParams {
                            w: count(*at),
                            ..base
                        };
                        l.go(&l.k.param_grad, &u, [Some(&ybar), None, None, Some(g)], len);
                    }
                }
                Op::Linear { x, w, b } => {
                    let (_, nin) = t.shape(*x);
                    let u = TapeParams {
                        cols: count(nin),
                        nn: count(cols),
                        w: count(*w),
                        has_b: b.is_some() as u32,
                        b: count(b.unwrap_or(0)),
                        ..base
                    };
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams { acc, ..u };
                        l.go(
                            &l.k.linear_x,
                            &u,
                            [Some(&ybar), None, Some(y), None],
                            rows * nin,
                        );
                    });
                    if let Some(g) = grad {
                        // y, bound for the parts, is not written in one part.
                        let bufs = [Some(val(*x)), Some(&ybar), Some(&run.cst), Some(g)];
                        let nout = (nin + b.is_some() as usize) * cols;
                        let kerns = (&l.k.linear_w, &l.k.linear_w_parts);
                        l.summed(kerns, u, bufs, nout, rows, 1);
                    }
                }
                &Op::Bmm {
                    a,
                    b,
                    m,
                    k,
                    n,
                    ta,
                    tb,
                } => {
                    let batch = rows / m.max(1);
                    // Ā = C̄·op(B)ᵀ (stored transposed with ta: op(B)·C̄ᵀ); B̄ = op(A)ᵀ·C̄
                    // (with tb: C̄ᵀ·op(A)), as the cpu's tape.
                    to(&mut adj, a, &|acc, y| {
                        let (u, x1, x2) = if ta {
                            (bmm(batch, (k, n, m), (tb, true)), val(b), &ybar)
                        } else {
                            (bmm(batch, (m, n, k), (false, !tb)), &ybar, val(b))
                        };
                        let u = TapeParams { acc, ..u };
                        l.go(
                            &l.k.bmm,
                            &u,
                            [Some(x1), Some(x2), Some(y), None],
                            batch * m * k,
                        );
                    });
                    to(&mut adj, b, &|acc, y| {
                        let (u, x1, x2) = if tb {
                            (bmm(batch, (n, m, k), (true, ta)), &ybar, val(a))
                        } else {
                            (bmm(batch, (k, m, n), (!ta, false)), val(a), &ybar)
                        };
                        let u = TapeParams { acc, ..u };
                        l.go(
                            &l.k.bmm,
                            &u,
                            [Some(x1), Some(x2), Some(y), None],
                            batch * k * n,
                        );
                    });
                }
                Op::Map(x, ..) => {
                    let s = run.slopes[i].as_ref().expect("a slope");
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams {
                            acc,
                            op: 2,
                            br: count(rows),
                            bc: count(cols),
                            ..base
                        };
                        l.go(&l.k.zip, &u, [Some(&ybar), Some(s), Some(y), None], len);
                    });
                }
                Op::Add(a, b) | Op::Sub(a, b) | Op::Mul(a, b) => {
                    let (br, bc) = shape_u32(t.shape(*b));
                    let mul = matches!(o, Op::Mul(..));
                    let sign = if matches!(o, Op::Sub(..)) {
                        MINUS_ONE
                    } else {
                        ONE
                    };
                    to(&mut adj, *a, &|acc, y| {
                        let (op, other) = if mul { (2, val(*b)) } else { (3, &ybar) };
                        let u = TapeParams {
                            acc,
                            op,
                            br: if mul { br } else { count(rows) },
                            bc: if mul { bc } else { count(cols) },
                            ..base
                        };
                        l.go(&l.k.zip, &u, [Some(&ybar), Some(other), Some(y), None], len);
                    });
                    to(&mut adj, *b, &|acc, y| {
                        let other = if mul { val(*a) } else { &ybar };
                        let u = TapeParams {
                            acc,
                            op: if mul { 2 } else { 0 },
                            br,
                            bc,
                            ci: sign,
                            ..base
                        };
                        let (n, bufs) = (
                            (br * bc) as usize,
                            [Some(&ybar), Some(other), Some(y), None],
                        );
                        let kerns = (&l.k.reduce, &l.k.sum_parts);
                        let (terms, work) = match (br, bc) {
                            (1, 1) => (rows, cols),
                            (1, _) => (rows, 1),
                            _ => (1, if bc == 1 { cols } else { 1 }),
                        };
                        l.summed(kerns, u, bufs, n, terms, work);
                    });
                }
                Op::Scale(x, _) => {
                    to(&mut adj, *x, &|acc, y| {
                        let (br, bc) = (count(rows), count(cols));
                        let u = TapeParams {
                            acc,
                            op: 3,
                            ci: p.ci[i],
                            br,
                            bc,
                            ..base
                        };
                        l.go(&l.k.zip, &u, [Some(&ybar), Some(&ybar), Some(y), None], len);
                    });
                }
                Op::Gather { x, w, .. } => {
                    let (xr, xc) = t.shape(*x);
                    let ix = p.ix[i];
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams {
                            acc,
                            ix: ix.csr,
                            k: count(*w),
                            ..shape(xr, xc)
                        };
                        let kerns = (&l.k.scatter, &l.k.sum_parts);
                        let bufs = [Some(&ybar), None, Some(y), None];
                        l.summed(kerns, u, bufs, xr * xc, ix.longest, 1);
                    });
                }
                Op::SumRows(x, k) => {
                    let xr = t.shape(*x).0;
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams {
                            acc,
                            k: count(*k),
                            ..shape(xr, cols)
                        };
                        l.go(
                            &l.k.spread_rows,
                            &u,
                            [Some(&ybar), None, Some(y), None],
                            xr * cols,
                        );
                    });
                }
                Op::RowSum(x) => {
                    let xc = t.shape(*x).1;
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams {
                            acc,
                            op: 4,
                            br: count(rows),
                            bc: 1,
                            ..shape(rows, xc)
                        };
                        l.go(
                            &l.k.zip,
                            &u,
                            [Some(&ybar), Some(&ybar), Some(y), None],
                            rows * xc,
                        );
                    });
                }
                Op::Softmax(x, _) => {
                    let yv = val(V::at(i));
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams { acc, ..base };
                        l.go(
                            &l.k.softmax_back,
                            &u,
                            [Some(yv), Some(&ybar), Some(y), None],
                            rows,
                        );
                    });
                }
                Op::Concat(xs) => {
                    let mut at = 0;
                    for x in xs {
                        let w = t.shape(*x).1;
                        to(&mut adj, *x, &|acc, y| {
                            let u = copy_cols(rows, (cols, at), (w, 0), w, acc != 0);
                            l.go(
                                &l.k.copy_cols,
                                &u,
                                [Some(&ybar), None, Some(y), None],
                                rows * w,
                            );
                        });
                        at += w;
                    }
                }
                Op::Reshape(x) => {
                    if p.wanted[x.index()] && adj[x.index()].is_none() {
                        adj[x.index()] = Some(ybar);
                        continue;
                    }
                    to(&mut adj, *x, &|acc, y| {
                        let u = TapeParams {
                            acc,
                            op: 3,
                            br: count(rows),
                            bc: count(cols),
                            ..base
                        };
                        l.go(&l.k.zip, &u, [Some(&ybar), Some(&ybar), Some(y), None], len);
                    });
                }
            }
        }
        if let Some(q) = q {
            match adj[input.index()].as_ref() {
                Some(a) => {
                    let u = shape(q.len, 1);
                    l.go(&l.k.part, &u, [Some(a), None, Some(&q.buf), None], q.len);
                }
                None => self.clear(&q.buf),
            }
        }
    }
}

fn shape_u32((r, c): (usize, usize)) -> (u32, u32) {
    (count(r), count(c))
}

/// A batched product's scalars: `batch` products of `[m][k]`·`[k][n]`, transposes (ta, tb).
fn bmm(batch: usize, (m, k, n): (usize, usize, usize), (ta, tb): (bool, bool)) -> TapeParams {
    TapeParams {
        rows: count(batch),
        m: count(m),
        k: count(k),
        nn: count(n),
        ta: ta as u32,
        tb: tb as u32,
        ..Default::default()
    }
}

/// Copying w columns of `rows` rows from column `from.1` of rows `from.0` wide to column `to.1`
/// of rows `to.0` wide.
fn copy_cols(
    rows: usize,
    from: (usize, usize),
    to: (usize, usize),
    w: usize,
    acc: bool,
) -> TapeParams {
    TapeParams {
        rows: count(rows),
        cols: count(from.0),
        m: count(from.1),
        br: count(to.0),
        k: count(to.1),
        nn: count(w),
        acc: acc as u32,
        ..Default::default()
    }
}

/// DPA-2's, se_e3_tebd's and DPA-3's blocks run on the device through their tapes (the host
/// records each batch's tape from its r_ij, statistics and lists, without the parameters, once
/// for the step's four passes); a block without one through the family's host bodies.
impl<T: GpuReal> BlockOps<T> for Generic<'_, Wgpu> {
    fn block_forward(&self, d: &Dims, a: &BlockArgs<Buf<T>, Idx>, desc: &mut Buf<T>) {
        let run = |w: &Wgpu, prep: &Prepared<T>| {
            w.tape_forward(pool(a), prep, a.rij, None, a.params, desc)
        };
        if !self.tape_pass(d, a, None, run) {
            block::block_forward(self, d, a, desc)
        }
    }

    fn block_backward(&self, d: &Dims, a: &BlockArgs<Buf<T>, Idx>, dbar: &Buf<T>, q: &mut Buf<T>) {
        let back = |w: &Wgpu, prep: &Prepared<T>, run: Run| {
            w.tape_backward(prep, run, a.params, (dbar, None), Some(q), None)
        };
        if !self.tape_back(d, a, None, back) {
            block::block_backward(self, d, a, dbar, q)
        }
    }

    fn block_tangent(
        &self,
        d: &Dims,
        a: &BlockArgs<Buf<T>, Idx>,
        rijdot: &Buf<T>,
        ddot: &mut Buf<T>,
    ) {
        let run = |w: &Wgpu, prep: &Prepared<T>| {
            w.tape_forward(pool(a), prep, a.rij, Some(rijdot), a.params, ddot)
        };
        if !self.tape_pass(d, a, Some(rijdot), run) {
            block::block_tangent(self, d, a, rijdot, ddot)
        }
    }

    fn block_dual(
        &self,
        d: &Dims,
        a: &BlockArgs<Buf<T>, Idx>,
        rijdot: &Buf<T>,
        (dbar, ddotbar): (&Buf<T>, &Buf<T>),
        grad: &mut Buf<T>,
    ) {
        let back = |w: &Wgpu, prep: &Prepared<T>, run: Run| {
            let seed = (ddotbar, Some(dbar));
            w.tape_backward(prep, run, a.params, seed, None, Some(grad))
        };
        if !self.tape_back(d, a, Some(rijdot), back) {
            block::block_dual(self, d, a, rijdot, (dbar, ddotbar), grad)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rij_tangent(
        &self,
        d: &Dims,
        fres: &Buf<T>,
        vres: &Buf<T>,
        rij: &Buf<T>,
        owner: &Idx,
        centre_atom: &Idx,
        rijdot: &mut Buf<T>,
    ) {
        self.rij_seed(d, (fres, vres), rij, (owner, centre_atom), rijdot);
    }
}

/// The buffers of the stage a block's runs belong to, kept in its keep.
fn pool<B, I>(a: &BlockArgs<B, I>) -> Pool {
    a.keep.resources()
}

/// What a batch's tape is kept under between passes: it reads no parameter and no tangent.
const BATCH: [u64; 2] = [0, 0];

impl Wgpu {
    /// Runs `forward` (with the tangent `rdot`) on the block's tape of this batch, the one
    /// the last pass left or one recorded now, and keeps the run for the next pass; false
    /// where the block has no tape.
    fn tape_pass<T: GpuReal>(
        &self,
        d: &Dims,
        a: &BlockArgs<Buf<T>, Idx>,
        rdot: Option<&Buf<T>>,
        forward: impl FnOnce(&Wgpu, &Prepared<T>) -> Run,
    ) -> bool {
        let bufs = [a.params.id, rdot.map_or(0, |r| r.id)];
        a.host(&Generic(self), false, |body| {
            let Some(prep) =
                (body.take_device(d, BATCH)).or_else(|| body.record(d).map(Prepared::new))
            else {
                return false;
            };
            let run = forward(self, &prep);
            body.put_device(d, bufs, (prep, run));
            true
        })
    }

    /// Runs `back` on the run a forward (with the tangent `rdot`) kept for these inputs, or
    /// on one made now, and leaves the batch's tape for the next pass; false where the block
    /// has no tape.
    fn tape_back<T: GpuReal>(
        &self,
        d: &Dims,
        a: &BlockArgs<Buf<T>, Idx>,
        rdot: Option<&Buf<T>>,
        back: impl FnOnce(&Wgpu, &Prepared<T>, Run),
    ) -> bool {
        let bufs = [a.params.id, rdot.map_or(0, |r| r.id)];
        a.host(&Generic(self), false, |body| {
            let (prep, run) = match body.take_device::<(Prepared<T>, Run)>(d, bufs) {
                Some(kept) => kept,
                None => {
                    let Some(rec) = body.record(d) else {
                        return false;
                    };
                    let prep = Prepared::new(rec);
                    let mut out = self.zeros_real(d.ncentres() * a.block.width());
                    let run = self.tape_forward(pool(a), &prep, a.rij, rdot, a.params, &mut out);
                    (prep, run)
                }
            };
            back(self, &prep, run);
            body.put_device(d, BATCH, prep);
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::tape::{graph, GraphPasses};
    use crate::backend::Device;

    fn close(what: &str, a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-11 * scale,
                "{what}[{i}]: {x} vs the cpu's {y}"
            );
        }
    }

    /// Every op's four passes on the device (lavapipe in CI) equal the cpu tape's: the forward
    /// and backward on reals, the tangent and dual reverse on duals.
    #[test]
    fn the_tape_runs_on_the_device_as_on_the_cpu() {
        let w = match Wgpu::new_f64(wgpu::PowerPreference::default()) {
            Ok(w) => w,
            Err(e) if std::env::var("DPW_REQUIRE_WGPU").is_err() => {
                return eprintln!("skipped: no float64 wgpu adapter ({e})");
            }
            Err(e) => panic!("no float64 wgpu adapter: {e}"),
        };
        let b = Generic(&w);
        let x: Vec<f64> = (0..8).map(|i| 0.3 * (i as f64) - 1.1).collect();
        let xdot: Vec<f64> = (0..8).map(|i| 0.7 - 0.2 * i as f64).collect();
        let params: Vec<f64> = (0..12).map(|i| 0.1 * (i as f64).sin() + 0.2).collect();
        let mut t = Tape::<f64, f64>::record();
        let xv = t.leaf(Vec::new(), 4, 2);
        // x·1 (the same numbers): a constant the other tape below has other values of.
        let x1 = t.scale(xv, 1.0);
        let o = graph(&mut t, x1);
        let ny = t.len(o);
        let ybar: Vec<f64> = (0..ny).map(|i| 1.0 + i as f64).collect();
        let ydotbar: Vec<f64> = (0..ny).map(|i| 0.5 - 0.25 * i as f64).collect();
        let cpu = GraphPasses::on_cpu(&x, &xdot, &params, &ybar, &ydotbar);
        let rec = Prepared::new((t, xv, o));
        let (xb, xdb, pb) = (b.upload(&x), b.upload(&xdot), b.upload(&params));
        let (yb, ydb) = (b.upload(&ybar), b.upload(&ydotbar));
        let mut out = b.zeros(ny);
        let mine = Pool::default();
        let run = w.tape_forward(mine.clone(), &rec, &xb, None, &pb, &mut out);
        // Every tensor of the forward, so that a failure names the op.
        let mut eager = Tape::<f64, f64>::new(&params);
        let xe = eager.leaf(x.clone(), 4, 2);
        let x1 = eager.scale(xe, 1.0);
        graph(&mut eager, x1);
        for (i, (op, (r, c))) in rec.rec.0.ops().enumerate() {
            let buf = run.vals[run.src[i]].as_ref().unwrap();
            let bytes = w.read_bytes(buf, (r * c * 8) as u64);
            let dev: Vec<f64> = bytemuck::pod_collect_to_vec(&bytes);
            let kind = format!("{:?}", std::mem::discriminant(op));
            close(&format!("op {i} {kind}"), &dev, eager.val(V::at(i)));
        }
        close("y", &b.download(&out), &cpu.y);
        // Another stage's tape, of the same ops with other constants, runs between the forward
        // and its backward, as in training several models (or tests) on one device.
        let mut other = Tape::<f64, f64>::record();
        let xo = other.leaf(Vec::new(), 4, 2);
        let x2 = other.scale(xo, 2.0);
        let y = graph(&mut other, x2);
        let mut scratch = b.zeros(ny);
        w.tape_forward(
            Pool::default(),
            &Prepared::new((other, xo, y)),
            &xb,
            None,
            &pb,
            &mut scratch,
        );
        let mut q = b.zeros(8);
        w.tape_backward(&rec, run, &pb, (&yb, None), Some(&mut q), None);
        close("x̄", &b.download(&q), &cpu.xbar);
        let run = w.tape_forward(mine.clone(), &rec, &xb, Some(&xdb), &pb, &mut out);
        close("ẏ", &b.download(&out), &cpu.ydot);
        let mut g = b.zeros(params.len());
        w.tape_backward(&rec, run, &pb, (&ydb, Some(&yb)), None, Some(&mut g));
        close("gradient", &b.download(&g), &cpu.grad);
    }
}

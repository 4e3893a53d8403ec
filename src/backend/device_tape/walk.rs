//! The walk over a recorded tape's ops: the forward, op by op in order, and the backward, in
//! reverse, each op one or two of the tape's kernels. Every tensor of a run (its value, a map's
//! slope, its adjoint) is a buffer of its own, kept in the stage's pool for its next run (grown
//! to the largest): a training step creates none once the first has run. A run's constants,
//! indices and constant tensors go up in three uploads.

use super::plan::{
    bmm, copy_cols, elem_id, shape, shape_u32, Plan, Pool, Prepared, Slot, MINUS_ONE, ONE,
};
use super::{Bound, Kern, TapeDevice};
use crate::backend::cpu::tape::{Op, Tape, V};
use crate::backend::gpu_layout::{count, TapeParams};
use crate::backend::Real;

/// A forward's values on the device, kept for its backward.
pub(crate) struct Run<R> {
    /// Whether the numbers are duals (the tangent's run).
    dual: bool,
    /// The stage's buffers.
    pool: Pool<R>,
    /// Each op's value; none for a reshape, which reads its source's (`src`).
    pub(crate) vals: Vec<Option<R>>,
    pub(crate) src: Vec<usize>,
    /// The map ops' slopes.
    slopes: Vec<Option<R>>,
    /// The plan's constants and indices on the device.
    cst: R,
    idx: R,
}

/// The launches of one run: its device and bindings.
struct Launch<'a, T: Real, D: TapeDevice<T>> {
    dev: &'a D,
    at: Bound<'a, D::Raw>,
    ns: usize,
    _t: std::marker::PhantomData<T>,
}

/// Terms per part of a long sum: a thread's work (within lavapipe's 65535 loop iterations).
const SUM_CHUNK: usize = 1024;

impl<T: Real, D: TapeDevice<T>> Launch<'_, T, D> {
    fn go(&self, k: Kern, u: &TapeParams, bufs: [Option<&D::Raw>; 4], threads: usize) {
        self.dev.launch(&self.at, k, u, bufs, threads);
    }

    fn bytes(&self, entries: usize) -> u64 {
        (entries * self.ns * size_of::<T>()) as u64
    }

    /// A long sum's kernel `kern` (see shaders/tape.wgsl's `stretch`): `nout` entries of
    /// `terms` terms, each term `work` iterations, into `y` (`[a, b, y, y2]`) in one part
    /// where they are few, else in parts `finish` adds in order.
    fn summed(
        &self,
        (kern, finish): (Kern, Kern),
        u: TapeParams,
        [a, b, y, y2]: [Option<&D::Raw>; 4],
        nout: usize,
        (terms, work): (usize, usize),
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
        let parts = self.dev.slot(self.at.pool, Slot::Parts(bytes), bytes);
        self.go(kern, &u, [a, b, Some(&parts), y2], nparts * nout);
        self.go(finish, &u, [Some(&parts), None, y, y2], nout);
    }
}

/// The forward of the prepared tape on device `dev`: on reals, or with the tangent `rdot` of
/// r_ij on duals; r_ij (the tape's input) from `rij`, parameters from `params`. Writes the
/// output's value (or its tangent) to `out`; the run is kept for the backward. The runs of
/// one stage share its `pool`: one is live at a time.
pub(crate) fn forward<T: Real, D: TapeDevice<T>>(
    dev: &D,
    pool: Pool<D::Raw>,
    prep: &Prepared<T>,
    (rij, rdot): (&D::Buf, Option<&D::Buf>),
    params: &D::Buf,
    out: &mut D::Buf,
) -> Run<D::Raw> {
    dev.pass(|| {
        let (t, input, output) = &prep.rec;
        let p = &prep.plan;
        let dual = rdot.is_some();
        let (cst, idx) = consts::<T, D>(dev, p, &pool);
        let params = dev.raw(params);
        let l = Launch::<T, D> {
            dev,
            at: Bound {
                pool: &pool,
                dual,
                cst: &cst,
                idx: &idx,
                params: &params,
            },
            ns: if dual { 2 } else { 1 },
            _t: Default::default(),
        };
        let (vals, slopes, src) = forward_ops(&l, t, *input, p, (rij, rdot));
        let len = D::len_of(out);
        let u = TapeParams {
            op: dual as u32,
            ..shape(len, 1)
        };
        let y = vals[src[output.index()]].as_ref().expect("the output");
        l.go(
            Kern::Part,
            &u,
            [Some(y), None, Some(&dev.raw(out)), None],
            len,
        );
        Run {
            dual,
            pool: pool.clone(),
            vals,
            src,
            slopes,
            cst,
            idx,
        }
    })
}

/// Each op's value (a reshape's its source's, `src`) and each map's slope.
type Values<R> = (Vec<Option<R>>, Vec<Option<R>>, Vec<usize>);

fn forward_ops<T: Real, D: TapeDevice<T>>(
    l: &Launch<'_, T, D>,
    t: &Tape<'_, T, T>,
    input: V,
    p: &Plan,
    (rij, rdot): (&D::Buf, Option<&D::Buf>),
) -> Values<D::Raw> {
    let (dev, pool) = (l.dev, l.at.pool);
    let n = t.ops().len();
    let mut vals: Vec<Option<D::Raw>> = (0..n).map(|_| None).collect();
    let mut slopes = vals.clone();
    let (leaf_at, leaves) = self::leaves(l, t, input);
    let mut src: Vec<usize> = (0..n).collect();
    for (i, (o, (rows, cols))) in t.ops().enumerate() {
        let len = rows * cols;
        if let Op::Reshape(x) = o {
            src[i] = src[x.index()];
            continue;
        }
        let y = dev.slot(pool, Slot::Val(i), l.bytes(len));
        let v = |x: &V| vals[src[x.index()]].as_ref().expect("a value");
        let mut u = shape(rows, cols);
        match o {
            Op::Leaf if i == input.index() => {
                u.has_b = rdot.is_some() as u32;
                let b = dev.raw(rdot.unwrap_or(rij));
                let a = dev.raw(rij);
                l.go(Kern::Pair, &u, [Some(&a), Some(&b), Some(&y), None], len);
            }
            Op::Leaf => dev.copy_bytes(&leaves, leaf_at[i], &y, l.bytes(len)),
            Op::Param(at) => {
                u.w = count(*at);
                l.go(Kern::Param, &u, [None, None, Some(&y), None], len);
            }
            Op::Linear { x, w, b } => {
                let (_, nin) = t.shape(*x);
                u.cols = count(nin);
                u.nn = count(cols);
                u.w = count(*w);
                u.has_b = b.is_some() as u32;
                u.b = count(b.unwrap_or(0));
                l.go(Kern::Linear, &u, [Some(v(x)), None, Some(&y), None], len);
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
                    Kern::Bmm,
                    &u,
                    [Some(v(&a)), Some(v(&b)), Some(&y), None],
                    len,
                );
            }
            Op::Map(x, f, _) => {
                let s = dev.slot(pool, Slot::Slope(i), l.bytes(len));
                u.op = elem_id(*f).0;
                u.ci = p.ci[i];
                l.go(Kern::Map, &u, [Some(v(x)), None, Some(&y), Some(&s)], len);
                slopes[i] = Some(s);
            }
            Op::Add(a, b) | Op::Sub(a, b) | Op::Mul(a, b) => {
                (u.br, u.bc) = shape_u32(t.shape(*b));
                u.op = match o {
                    Op::Add(..) => 0,
                    Op::Sub(..) => 1,
                    _ => 2,
                };
                l.go(Kern::Zip, &u, [Some(v(a)), Some(v(b)), Some(&y), None], len);
            }
            Op::Scale(x, _) => {
                (u.op, u.ci, (u.br, u.bc)) = (3, p.ci[i], (count(rows), count(cols)));
                l.go(Kern::Zip, &u, [Some(v(x)), Some(v(x)), Some(&y), None], len);
            }
            Op::Gather { x, w, .. } => {
                (u.ix, u.k) = (p.ix[i].at, count(*w));
                l.go(Kern::Gather, &u, [Some(v(x)), None, Some(&y), None], len);
            }
            Op::SumRows(x, k) => {
                u.k = count(*k);
                let kerns = (Kern::SumRows, Kern::SumParts);
                l.summed(kerns, u, [Some(v(x)), None, Some(&y), None], len, (*k, 1));
            }
            Op::RowSum(x) => {
                let (xr, xc) = t.shape(*x);
                let mut u = shape(xr, xc);
                (u.br, u.bc, u.op, u.ci) = (count(rows), 1, 0, ONE);
                let kerns = (Kern::Reduce, Kern::SumParts);
                let bufs = [Some(v(x)), Some(v(x)), Some(&y), None];
                l.summed(kerns, u, bufs, len, (1, xc));
            }
            Op::Softmax(x, mask) => {
                (u.has_b, u.ix) = (mask.is_some() as u32, p.ix[i].at);
                l.go(Kern::Softmax, &u, [Some(v(x)), None, Some(&y), None], rows);
            }
            Op::Concat(xs) => {
                let mut at = 0;
                for x in xs {
                    let w = t.shape(*x).1;
                    let u = copy_cols(rows, (w, 0), (cols, at), w, false);
                    let bufs = [Some(v(x)), None, Some(&y), None];
                    l.go(Kern::CopyCols, &u, bufs, rows * w);
                    at += w;
                }
            }
            Op::Reshape(_) => unreachable!("aliased above"),
        }
        vals[i] = Some(y);
    }
    (vals, slopes, src)
}

/// The run's constants (rounded to T) and indices on the device: each tape's own (not one
/// buffer for every tape: a run's backward reads the constants of its forward while other
/// stages' tapes run between).
fn consts<T: Real, D: TapeDevice<T>>(dev: &D, p: &Plan, pool: &Pool<D::Raw>) -> (D::Raw, D::Raw) {
    let cst: Vec<T> = p.cst.iter().map(|&c| T::of(c)).collect();
    let cst = dev.slot_with(pool, Slot::Cst, bytemuck::cast_slice(&cst));
    let idx = dev.slot_with(pool, Slot::Idx, bytemuck::cast_slice(&p.idx));
    (cst, idx)
}

/// Every constant leaf's numbers (`ns` reals each) in one upload: where each op's begin
/// (bytes), and the buffer.
fn leaves<T: Real, D: TapeDevice<T>>(
    l: &Launch<'_, T, D>,
    t: &Tape<'_, T, T>,
    input: V,
) -> (Vec<u64>, D::Raw) {
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
    let buf = l
        .dev
        .slot_with(l.at.pool, Slot::Leaves, bytemuck::cast_slice(&host));
    (at, buf)
}

/// The backward of a forward's run from the adjoint `seed` of its output (with `seed_eps`,
/// its ε part, on duals): r_ij's adjoint into `q` where given, the parameters' (their ε
/// parts on duals) added to `grad` where given.
pub(crate) fn backward<T: Real, D: TapeDevice<T>>(
    dev: &D,
    prep: &Prepared<T>,
    run: Run<D::Raw>,
    params: &D::Buf,
    (seed, seed_eps): (&D::Buf, Option<&D::Buf>),
    q: Option<&mut D::Buf>,
    grad: Option<&mut D::Buf>,
) {
    dev.pass(|| {
        let (t, input, output) = &prep.rec;
        let p = &prep.plan;
        let params = dev.raw(params);
        let l = Launch::<T, D> {
            dev,
            at: Bound {
                pool: &run.pool,
                dual: run.dual,
                cst: &run.cst,
                idx: &run.idx,
                params: &params,
            },
            ns: if run.dual { 2 } else { 1 },
            _t: Default::default(),
        };
        let grad = grad.map(|g| dev.raw(g));
        let mut adj = Adjoints {
            l: &l,
            t,
            p,
            adj: (0..t.ops().len()).map(|_| None).collect(),
        };
        {
            let (rows, cols) = t.shape(*output);
            let mut u = shape(rows, cols);
            u.has_b = seed_eps.is_some() as u32;
            let (a, b) = (dev.raw(seed), dev.raw(seed_eps.unwrap_or(seed)));
            adj.to(*output, &|acc, y| {
                let u = TapeParams { acc, ..u };
                l.go(
                    Kern::Pair,
                    &u,
                    [Some(&a), Some(&b), Some(y), None],
                    rows * cols,
                );
            });
        }
        let ops: Vec<_> = t.ops().collect();
        for (i, &(o, shape)) in ops.iter().enumerate().rev() {
            let Some(ybar) = adj.adj[i].take() else {
                continue;
            };
            backward_op(&mut adj, &run, (i, o, shape), ybar, grad.as_ref());
        }
        if let Some(q) = q {
            match adj.adj[input.index()].as_ref() {
                Some(a) => {
                    let len = D::len_of(q);
                    let u = shape(len, 1);
                    l.go(
                        Kern::Part,
                        &u,
                        [Some(a), None, Some(&dev.raw(q)), None],
                        len,
                    );
                }
                None => dev.zero(q),
            }
        }
    })
}

/// The adjoints of a backward: each op's, made on first use.
struct Adjoints<'a, T: Real, D: TapeDevice<T>> {
    l: &'a Launch<'a, T, D>,
    t: &'a Tape<'a, T, T>,
    p: &'a Plan,
    adj: Vec<Option<D::Raw>>,
}

impl<T: Real, D: TapeDevice<T>> Adjoints<'_, T, D> {
    /// Adds c·ȳ (`[rows][cols]`) to x's adjoint, c the run's constant at `ci`: a zip of ȳ with
    /// itself (a scale's adjoint, and a reshape's, ci = [`ONE`]).
    fn scaled(&mut self, x: V, ybar: &D::Raw, ci: u32, (rows, cols): (usize, usize)) {
        let l = self.l;
        self.to(x, &|acc, y| {
            let u = TapeParams {
                acc,
                op: 3,
                ci,
                br: count(rows),
                bc: count(cols),
                ..shape(rows, cols)
            };
            l.go(
                Kern::Zip,
                &u,
                [Some(ybar), Some(ybar), Some(y), None],
                rows * cols,
            );
        });
    }

    /// Adds to x's adjoint through `f(acc, y)`, making it on first use.
    fn to(&mut self, x: V, f: &dyn Fn(u32, &D::Raw)) {
        if !self.p.wanted[x.index()] {
            return;
        }
        let acc = self.adj[x.index()].is_some();
        let (l, t) = (self.l, self.t);
        let y = self.adj[x.index()]
            .get_or_insert_with(|| {
                l.dev
                    .slot(l.at.pool, Slot::Adj(x.index()), l.bytes(t.len(x)))
            })
            .clone();
        f(acc as u32, &y);
    }
}

/// Op i's adjoint `ybar` taken back to what it reads (to the gradient for a parameter).
fn backward_op<T: Real, D: TapeDevice<T>>(
    adj: &mut Adjoints<'_, T, D>,
    run: &Run<D::Raw>,
    (i, o, (rows, cols)): (usize, &Op<T, T>, (usize, usize)),
    ybar: D::Raw,
    grad: Option<&D::Raw>,
) {
    let (l, t, p) = (adj.l, adj.t, adj.p);
    let len = rows * cols;
    let base = shape(rows, cols);
    let val = |x: V| run.vals[run.src[x.index()]].as_ref().expect("a value");
    match o {
        Op::Leaf => adj.adj[i] = Some(ybar),
        Op::Param(at) => {
            if let Some(g) = grad {
                let u = TapeParams {
                    w: count(*at),
                    ..base
                };
                l.go(Kern::ParamGrad, &u, [Some(&ybar), None, None, Some(g)], len);
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
            adj.to(*x, &|acc, y| {
                let u = TapeParams { acc, ..u };
                let bufs = [Some(&ybar), None, Some(y), None];
                l.go(Kern::LinearX, &u, bufs, rows * nin);
            });
            if let Some(g) = grad {
                // y, bound for the parts, is not written in one part.
                let bufs = [Some(val(*x)), Some(&ybar), Some(&run.cst), Some(g)];
                let nout = (nin + b.is_some() as usize) * cols;
                let kerns = (Kern::LinearW, Kern::LinearWParts);
                l.summed(kerns, u, bufs, nout, (rows, 1));
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
            adj.to(a, &|acc, y| {
                let (u, x1, x2) = if ta {
                    (bmm(batch, (k, n, m), (tb, true)), val(b), &ybar)
                } else {
                    (bmm(batch, (m, n, k), (false, !tb)), &ybar, val(b))
                };
                let u = TapeParams { acc, ..u };
                let bufs = [Some(x1), Some(x2), Some(y), None];
                l.go(Kern::Bmm, &u, bufs, batch * m * k);
            });
            adj.to(b, &|acc, y| {
                let (u, x1, x2) = if tb {
                    (bmm(batch, (n, m, k), (true, ta)), &ybar, val(a))
                } else {
                    (bmm(batch, (k, m, n), (!ta, false)), val(a), &ybar)
                };
                let u = TapeParams { acc, ..u };
                let bufs = [Some(x1), Some(x2), Some(y), None];
                l.go(Kern::Bmm, &u, bufs, batch * k * n);
            });
        }
        Op::Map(x, ..) => {
            let s = run.slopes[i].as_ref().expect("a slope");
            adj.to(*x, &|acc, y| {
                let u = TapeParams {
                    acc,
                    op: 2,
                    br: count(rows),
                    bc: count(cols),
                    ..base
                };
                l.go(Kern::Zip, &u, [Some(&ybar), Some(s), Some(y), None], len);
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
            adj.to(*a, &|acc, y| {
                let (op, other) = if mul { (2, val(*b)) } else { (3, &ybar) };
                let u = TapeParams {
                    acc,
                    op,
                    br: if mul { br } else { count(rows) },
                    bc: if mul { bc } else { count(cols) },
                    ..base
                };
                l.go(
                    Kern::Zip,
                    &u,
                    [Some(&ybar), Some(other), Some(y), None],
                    len,
                );
            });
            adj.to(*b, &|acc, y| {
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
                let kerns = (Kern::Reduce, Kern::SumParts);
                let split = match (br, bc) {
                    (1, 1) => (rows, cols),
                    (1, _) => (rows, 1),
                    _ => (1, if bc == 1 { cols } else { 1 }),
                };
                l.summed(kerns, u, bufs, n, split);
            });
        }
        Op::Scale(x, _) => adj.scaled(*x, &ybar, p.ci[i], (rows, cols)),
        Op::Gather { x, w, .. } => {
            let (xr, xc) = t.shape(*x);
            let ix = p.ix[i];
            adj.to(*x, &|acc, y| {
                let u = TapeParams {
                    acc,
                    ix: ix.csr,
                    k: count(*w),
                    ..shape(xr, xc)
                };
                let kerns = (Kern::Scatter, Kern::SumParts);
                let bufs = [Some(&ybar), None, Some(y), None];
                l.summed(kerns, u, bufs, xr * xc, (ix.longest, 1));
            });
        }
        Op::SumRows(x, k) => {
            let xr = t.shape(*x).0;
            adj.to(*x, &|acc, y| {
                let u = TapeParams {
                    acc,
                    k: count(*k),
                    ..shape(xr, cols)
                };
                let bufs = [Some(&ybar), None, Some(y), None];
                l.go(Kern::SpreadRows, &u, bufs, xr * cols);
            });
        }
        Op::RowSum(x) => {
            let xc = t.shape(*x).1;
            adj.to(*x, &|acc, y| {
                let u = TapeParams {
                    acc,
                    op: 4,
                    br: count(rows),
                    bc: 1,
                    ..shape(rows, xc)
                };
                let bufs = [Some(&ybar), Some(&ybar), Some(y), None];
                l.go(Kern::Zip, &u, bufs, rows * xc);
            });
        }
        Op::Softmax(x, _) => {
            let yv = val(V::at(i));
            adj.to(*x, &|acc, y| {
                let u = TapeParams { acc, ..base };
                let bufs = [Some(yv), Some(&ybar), Some(y), None];
                l.go(Kern::SoftmaxBack, &u, bufs, rows);
            });
        }
        Op::Concat(xs) => {
            let mut at = 0;
            for x in xs {
                let w = t.shape(*x).1;
                adj.to(*x, &|acc, y| {
                    let u = copy_cols(rows, (cols, at), (w, 0), w, acc != 0);
                    let bufs = [Some(&ybar), None, Some(y), None];
                    l.go(Kern::CopyCols, &u, bufs, rows * w);
                });
                at += w;
            }
        }
        Op::Reshape(x) => {
            if p.wanted[x.index()] && adj.adj[x.index()].is_none() {
                adj.adj[x.index()] = Some(ybar);
                return;
            }
            adj.scaled(*x, &ybar, ONE, (rows, cols));
        }
    }
}

//! A reverse-mode tape over small dense tensors of numbers (`Num`): a block written once as its
//! forward (DPA-2's, `repformer.rs`; se_e3_tebd's, `three_body.rs`; the passes in
//! `tape_block.rs`) gets its backward from the tape, its tangent by running the forward on
//! duals, and its dual reverse by running the tape's backward on duals (dual.rs): no pass of the
//! block is written by hand.
//!
//! Tensors are row-major `[rows][cols]`; batched products read them as `[batch][m][k]`. A
//! parameter's adjoint goes to a gradient vector laid out as the parameters (an empty one when
//! no gradient is wanted). Every backward sum runs in a fixed order, so results do not depend
//! on the thread count.

use std::borrow::Cow;
use std::sync::Arc;

use rayon::prelude::*;

use super::dual::Num;
use super::gemm::{Mat, Prod};
use super::repflow::switch3;
use super::tanh::tanh_in_place;
use super::zeroed::{zeroed_pair, zeroed_with, zeros};
use crate::backend::Real;
use crate::model::Activation;

/// A tensor on the tape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V(usize);

impl V {
    /// Its place in the tape's order.
    pub fn index(self) -> usize {
        self.0
    }

    /// The tensor at place `i` of the tape's order.
    pub fn at(i: usize) -> V {
        V(i)
    }
}

/// An elementwise function of the tape, as data rather than a closure so that a device runs
/// the same tape (`backend/device_tape`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Elem {
    /// √x.
    Sqrt,
    /// DeePMD-kit's quintic switch from `rs` to `rc` (spec §3).
    Switch {
        rs: f64,
        rc: f64,
    },
    /// DeePMD-kit's exponential switch centred at `rs`, constant past 0 and `rc` (spec §18.2).
    ExpSwitch {
        rs: f64,
        rc: f64,
    },
    /// 1 / (x + p).
    Recip(f64),
    /// 1 / √(x + e).
    Rsqrt(f64),
    Act(Activation),
}

impl Elem {
    /// The switch from `rs` to `rc`: the exponential one where `exp`, else the quintic.
    pub fn switch(exp: bool, rs: f64, rc: f64) -> Elem {
        if exp {
            Elem::ExpSwitch { rs, rc }
        } else {
            Elem::Switch { rs, rc }
        }
    }

    /// f(x) as (f, f', f'') at a real x: the value and slope of the op, and the slope's own
    /// slope for the dual reverse.
    pub fn eval3<T: Real>(self, v: T) -> (T, T, T) {
        let (one, two) = (T::one(), T::one() + T::one());
        match self {
            Elem::Sqrt => {
                let s = v.sqrt();
                (s, one / (two * s), -one / (two * two * v * s))
            }
            Elem::Switch { rs, rc } => switch3(false, rs, rc, v),
            Elem::ExpSwitch { rs, rc } => switch3(true, rs, rc, v),
            Elem::Recip(p) => {
                let i = one / (v + T::of(p));
                (i, -i * i, two * i * i * i)
            }
            Elem::Rsqrt(e) => {
                let ve = v + T::of(e);
                let i = one / ve.sqrt();
                (i, -i / (two * ve), T::of(3.0) * i / (two * two * ve * ve))
            }
            Elem::Act(a) => a.eval3(v),
        }
    }
}

/// An index of [`Tape::gather`] that reads 0.
pub const NONE: u32 = u32::MAX;

pub(crate) enum Op<T, N> {
    Leaf,
    /// params[at..at + len] as a tensor.
    Param(usize),
    /// x·W (+ b), W `[x.cols][out]` real at an offset of the parameters.
    Linear {
        x: V,
        w: usize,
        b: Option<usize>,
    },
    /// `[batch]` products op(A)·op(B), op the transpose where asked.
    Bmm {
        a: V,
        b: V,
        m: usize,
        k: usize,
        n: usize,
        ta: bool,
        tb: bool,
    },
    /// f of each entry of x, with each entry's slope f'(x) (as a number: on duals its tangent
    /// is f''·ẋ) kept from the forward for the backward, so f is evaluated once per pass.
    Map(V, Elem, Vec<N>),
    /// a ∘ b with b broadcast over rows and/or columns where its extent is 1.
    Add(V, V),
    Sub(V, V),
    Mul(V, V),
    Scale(V, T),
    /// y's unit u (of `w` consecutive entries) = x's unit idx[u], 0 for [`NONE`]: single
    /// entries (w = 1), or whole rows, whose indices are a row's rather than each entry's.
    Gather {
        x: V,
        idx: Arc<Vec<u32>>,
        w: usize,
    },
    /// Sums of `k` consecutive rows.
    SumRows(V, usize),
    /// Each row's sum.
    RowSum(V),
    /// Softmax over each row's columns (masked-out entries are 0 and leave the sum, so the
    /// backward needs no mask).
    Softmax(V, Option<Arc<Vec<bool>>>),
    Concat(Vec<V>),
    Reshape(V),
}

struct Node<T, N> {
    val: Vec<N>,
    rows: usize,
    cols: usize,
    op: Op<T, N>,
}

pub struct Tape<'p, T: Real, N: Num<T>> {
    params: Cow<'p, [T]>,
    nodes: Vec<Node<T, N>>,
    /// Whether the ops are evaluated as they are recorded; a tape only recorded
    /// ([`Tape::record`]) holds its leaves' values alone, for a device to run.
    eager: bool,
}

/// Rows per parallel task of the elementwise and row-wise ops.
const CHUNK: usize = 256;

impl<'p, T: Real, N: Num<T>> Tape<'p, T, N> {
    pub fn new(params: &'p [T]) -> Self {
        Tape {
            params: Cow::Borrowed(params),
            nodes: Vec::new(),
            eager: true,
        }
    }

    /// A tape that records its ops without evaluating them (its parameters are read where it
    /// runs): the graph a device runs.
    pub fn record() -> Self {
        Tape {
            params: Cow::Owned(Vec::new()),
            nodes: Vec::new(),
            eager: false,
        }
    }

    /// The tape with its own copy of the parameters, to be kept past their borrow.
    pub fn owned(self) -> Tape<'static, T, N> {
        Tape {
            params: Cow::Owned(self.params.into_owned()),
            nodes: self.nodes,
            eager: self.eager,
        }
    }

    fn push(&mut self, val: Vec<N>, rows: usize, cols: usize, op: Op<T, N>) -> V {
        debug_assert!(val.len() == rows * cols || !self.eager);
        self.nodes.push(Node {
            val,
            rows,
            cols,
            op,
        });
        V(self.nodes.len() - 1)
    }

    /// Records op with its value `eval()` where the tape evaluates.
    fn node(
        &mut self,
        (rows, cols): (usize, usize),
        op: Op<T, N>,
        eval: impl FnOnce(&Self) -> Vec<N>,
    ) -> V {
        let val = if self.eager { eval(self) } else { Vec::new() };
        self.push(val, rows, cols, op)
    }

    pub fn val(&self, v: V) -> &[N] {
        &self.nodes[v.0].val
    }

    pub fn shape(&self, v: V) -> (usize, usize) {
        (self.nodes[v.0].rows, self.nodes[v.0].cols)
    }

    /// An input or a constant: its adjoint is [`Grads::of`] after the backward.
    pub fn leaf(&mut self, val: Vec<N>, rows: usize, cols: usize) -> V {
        self.push(val, rows, cols, Op::Leaf)
    }

    /// A constant of reals.
    pub fn consts(&mut self, val: &[T], rows: usize, cols: usize) -> V {
        self.leaf(val.iter().map(|&x| N::of(x)).collect(), rows, cols)
    }

    /// The parameters `[at..at + rows·cols]` as a `[rows][cols]` tensor.
    pub fn param(&mut self, at: usize, rows: usize, cols: usize) -> V {
        self.node((rows, cols), Op::Param(at), |t| {
            let p = &t.params[at..at + rows * cols];
            p.iter().map(|&x| N::of(x)).collect()
        })
    }

    /// x·W (+ b) for W `[cols(x)][out]` at offset `w`, b `[out]` at `b`.
    pub fn linear(&mut self, x: V, w: usize, b: Option<usize>, out: usize) -> V {
        let (rows, nin) = self.shape(x);
        self.node((rows, out), Op::Linear { x, w, b }, |t| {
            let wv = &t.params[w..w + nin * out];
            let xv = &t.nodes[x.0].val;
            zeroed_with(rows * out, CHUNK * out, Vec::new, |work, k, yc| {
                if let Some(b) = b {
                    let bv = &t.params[b..b + out];
                    for row in yc.chunks_mut(out) {
                        for (y, &b) in row.iter_mut().zip(bv) {
                            *y = N::of(b);
                        }
                    }
                }
                let xc = &xv[k * CHUNK * nin..][..yc.len() / out.max(1) * nin];
                let m = xc.len() / nin.max(1);
                let p = prod(m, nin, out, b.is_some());
                N::gemm_r(p, mat(xc, nin), wv, yc, work);
            })
        })
    }

    /// `[batch]` products op(A)·op(B) → `[batch][m][n]`: A is `[batch][m][k]` (`[k][m]` with
    /// `ta`), B `[batch][k][n]` (`[n][k]` with `tb`).
    #[allow(clippy::too_many_arguments)]
    pub fn bmm(
        &mut self,
        a: V,
        b: V,
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
        ta: bool,
        tb: bool,
    ) -> V {
        assert_eq!(self.len(a), batch * m * k, "bmm: A's size");
        assert_eq!(self.len(b), batch * k * n, "bmm: B's size");
        let op = Op::Bmm {
            a,
            b,
            m,
            k,
            n,
            ta,
            tb,
        };
        self.node((batch * m, n), op, |t| {
            let (av, bv) = (t.val(a), t.val(b));
            zeroed_with(batch * m * n, m * n, Vec::new, |work, i, cb| {
                let ab = &av[i * m * k..(i + 1) * m * k];
                let bb = &bv[i * k * n..(i + 1) * k * n];
                matmul(m, k, n, (ab, ta), (bb, tb), cb, false, work);
            })
        })
    }

    /// f of each entry.
    pub fn map(&mut self, x: V, f: Elem) -> V {
        let (rows, cols) = self.shape(x);
        if !self.eager {
            return self.push(Vec::new(), rows, cols, Op::Map(x, f, Vec::new()));
        }
        let (y, slope): (Vec<N>, Vec<N>) = (self.val(x).par_iter())
            .map(|&v| {
                let (y, dy, ddy) = f.eval3(v.re());
                (v.apply(|_| (y, dy)), v.apply(|_| (dy, ddy)))
            })
            .unzip();
        self.push(y, rows, cols, Op::Map(x, f, slope))
    }

    /// The activation `a` of each entry of x: [`Tape::map`] of [`Activation::eval3`], evaluated
    /// a chunk at a time (the values, slopes and the slopes' slopes in the chunk's own buffers,
    /// nothing zeroed or copied over the whole tensor): tanh through `tanh.rs` (within 2 ulp of
    /// libm's in float32, 3 in float64, as the dense layers take it; libm's, through expm1, was
    /// a fifth of DPA-2's float32 step and a tenth of its float64 one on an Intel Xeon), the
    /// others through [`super::act::eval3_slice`].
    pub fn act(&mut self, x: V, a: Activation) -> V {
        let (rows, cols) = self.shape(x);
        if !self.eager {
            return self.push(Vec::new(), rows, cols, Op::Map(x, Elem::Act(a), Vec::new()));
        }
        let xv = self.val(x);
        let (val, slope) = zeroed_pair(xv.len(), CHUNK, |k, yc, sc| {
            let xc = &xv[k * CHUNK..][..yc.len()];
            let f = act_chunk(a, xc);
            for (((y, s), &v), &[f, df, d2f]) in yc.iter_mut().zip(sc).zip(xc).zip(&f) {
                (*y, *s) = (v.apply(|_| (f, df)), v.apply(|_| (df, d2f)));
            }
        });
        self.push(val, rows, cols, Op::Map(x, Elem::Act(a), slope))
    }

    fn binary(&mut self, a: V, b: V, f: impl Fn(N, N) -> N + Sync, op: Op<T, N>) -> V {
        let (rows, cols) = self.shape(a);
        let (br, bc) = self.shape(b);
        assert!(
            (br == rows || br == 1) && (bc == cols || bc == 1),
            "broadcast of [{br}][{bc}] onto [{rows}][{cols}]"
        );
        self.node((rows, cols), op, |t| {
            zip_bcast(t.val(a), t.val(b), ((rows, cols), (br, bc)), f)
        })
    }

    pub fn add(&mut self, a: V, b: V) -> V {
        self.binary(a, b, |x, y| x + y, Op::Add(a, b))
    }

    pub fn sub(&mut self, a: V, b: V) -> V {
        self.binary(a, b, |x, y| x - y, Op::Sub(a, b))
    }

    pub fn mul(&mut self, a: V, b: V) -> V {
        self.binary(a, b, |x, y| x * y, Op::Mul(a, b))
    }

    pub fn scale(&mut self, x: V, s: T) -> V {
        self.node(self.shape(x), Op::Scale(x, s), |t| {
            t.val(x).iter().map(|&v| v.scale(s)).collect()
        })
    }

    /// y[e] = x[idx[e]] (0 where idx is [`NONE`]), `[rows][cols]`.
    pub fn gather(&mut self, x: V, idx: Arc<Vec<u32>>, rows: usize, cols: usize) -> V {
        assert_eq!(idx.len(), rows * cols, "gather: index count");
        self.gather_units(x, idx, 1, (rows, cols))
    }

    /// Units of `w` entries of x, unit u of y being unit idx[u] of x.
    fn gather_units(&mut self, x: V, idx: Arc<Vec<u32>>, w: usize, shape: (usize, usize)) -> V {
        let op = Op::Gather {
            x,
            idx: idx.clone(),
            w,
        };
        self.node(shape, op, |t| {
            let xv = t.val(x);
            zeroed_with(
                shape.0 * shape.1,
                CHUNK * w,
                || (),
                |_, k, yc| {
                    for (yu, &i) in yc.chunks_mut(w.max(1)).zip(&idx[k * CHUNK..]) {
                        if i != NONE {
                            yu.copy_from_slice(&xv[i as usize * w..][..w]);
                        }
                    }
                },
            )
        })
    }

    /// Columns `cols` of every row.
    pub fn cols(&mut self, x: V, cols: std::ops::Range<usize>) -> V {
        let (rows, w) = self.shape(x);
        let mut idx = Vec::with_capacity(rows * cols.len());
        for i in 0..rows {
            idx.extend(cols.clone().map(|j| (i * w + j) as u32));
        }
        self.gather(x, Arc::new(idx), rows, cols.len())
    }

    /// Rows `idx` (a [`NONE`] row reads 0).
    pub fn rows(&mut self, x: V, idx: &[u32]) -> V {
        let w = self.shape(x).1;
        self.gather_units(x, Arc::new(idx.to_vec()), w, (idx.len(), w))
    }

    /// Sums of `k` consecutive rows: `[g·k][c]` → `[g][c]`.
    pub fn sum_rows(&mut self, x: V, k: usize) -> V {
        let (rows, cols) = self.shape(x);
        assert_eq!(rows % k, 0, "sum_rows: {rows} rows in groups of {k}");
        self.node((rows / k, cols), Op::SumRows(x, k), |t| {
            let xv = t.val(x);
            zeroed_with(
                rows / k * cols,
                cols,
                || (),
                |_, g, yr| {
                    for r in 0..k {
                        for (o, &v) in yr.iter_mut().zip(&xv[(g * k + r) * cols..][..cols]) {
                            *o += v;
                        }
                    }
                },
            )
        })
    }

    /// Each row's sum, `[rows][1]`.
    pub fn row_sum(&mut self, x: V) -> V {
        let (rows, cols) = self.shape(x);
        self.node((rows, 1), Op::RowSum(x), |t| {
            (t.val(x).par_chunks(cols.max(1)))
                .map(|r| r.iter().fold(N::zero(), |a, &v| a + v))
                .collect()
        })
    }

    /// Softmax over each row (entries where `mask` is false are 0 and leave the sum).
    pub fn softmax(&mut self, x: V, mask: Option<Arc<Vec<bool>>>) -> V {
        let (rows, cols) = self.shape(x);
        let op = Op::Softmax(x, mask.clone());
        self.node((rows, cols), op, |t| {
            let mut y = t.val(x).to_vec();
            y.par_chunks_mut(cols.max(1))
                .enumerate()
                .for_each(|(i, r)| {
                    let keep = |j: usize| mask.as_ref().is_none_or(|m| m[i * cols + j]);
                    if !(0..cols).any(keep) {
                        r.fill(N::zero());
                        return;
                    }
                    let mx = (0..cols)
                        .filter(|&j| keep(j))
                        .map(|j| r[j].re())
                        .fold(T::neg_infinity(), T::max);
                    for (j, v) in r.iter_mut().enumerate() {
                        *v = if keep(j) {
                            *v - N::of(mx)
                        } else {
                            N::of(T::neg_infinity())
                        };
                    }
                    N::exp_nonpos(r);
                    let s = r.iter().fold(N::zero(), |a, &v| a + v);
                    for v in r.iter_mut() {
                        *v = *v / s;
                    }
                });
            y
        })
    }

    /// The tensors side by side, `[rows][Σ cols]`.
    pub fn concat(&mut self, xs: &[V]) -> V {
        let rows = self.shape(xs[0]).0;
        let widths: Vec<usize> = xs.iter().map(|&x| self.shape(x).1).collect();
        for &x in xs {
            assert_eq!(self.shape(x).0, rows, "concat: row counts");
        }
        let total: usize = widths.iter().sum();
        self.node((rows, total), Op::Concat(xs.to_vec()), |t| {
            zeroed_with(
                rows * total,
                CHUNK * total,
                || (),
                |_, c, yc| {
                    let mut at = 0;
                    for (&x, &w) in xs.iter().zip(&widths) {
                        let xc = &t.val(x)[c * CHUNK * w..];
                        for (yr, xr) in yc.chunks_mut(total).zip(xc.chunks(w.max(1))) {
                            yr[at..at + w].copy_from_slice(xr);
                        }
                        at += w;
                    }
                },
            )
        })
    }

    /// The same numbers as `[rows][cols]`.
    pub fn reshape(&mut self, x: V, rows: usize, cols: usize) -> V {
        assert_eq!(self.len(x), rows * cols, "reshape: size");
        self.node((rows, cols), Op::Reshape(x), |t| t.val(x).to_vec())
    }

    /// The ops in the order recorded, each with its shape: the graph a device runs.
    pub(crate) fn ops(
        &self,
    ) -> impl ExactSizeIterator<Item = (&Op<T, N>, (usize, usize))> + DoubleEndedIterator {
        self.nodes.iter().map(|n| (&n.op, (n.rows, n.cols)))
    }

    /// The number of entries of v.
    pub fn len(&self, v: V) -> usize {
        self.nodes[v.0].rows * self.nodes[v.0].cols
    }

    /// The backward from the adjoints `seeds` of some tensors: every tensor's adjoint (read
    /// the leaves' with [`Grads::of`]), and the parameters' added to `grad` (laid out as the
    /// parameters; empty for none).
    pub fn backward(&self, seeds: Vec<(V, Vec<N>)>, grad: &mut [N]) -> Grads<N> {
        let mut adj: Vec<Option<Vec<N>>> = (0..self.nodes.len()).map(|_| None).collect();
        for (v, s) in seeds {
            acc(&mut adj, v, &self.nodes, |a| add_into(a, &s));
        }
        let want_grad = !grad.is_empty();
        for i in (0..self.nodes.len()).rev() {
            let Some(ybar) = adj[i].take() else { continue };
            let node = &self.nodes[i];
            let (rows, cols) = (node.rows, node.cols);
            match &node.op {
                Op::Leaf => {
                    adj[i] = Some(ybar);
                    continue;
                }
                Op::Param(at) => {
                    if want_grad {
                        add_into(&mut grad[*at..*at + ybar.len()], &ybar);
                    }
                }
                &Op::Linear { x, w, b } => {
                    let nin = self.nodes[x.0].cols;
                    let wv = &self.params[w..w + nin * cols];
                    let mut wt = vec![T::zero(); nin * cols];
                    for p in 0..nin {
                        for q in 0..cols {
                            wt[q * nin + p] = wv[p * cols + q];
                        }
                    }
                    acc(&mut adj, x, &self.nodes, |xbar| {
                        xbar.par_chunks_mut(CHUNK * nin)
                            .zip(ybar.par_chunks(CHUNK * cols))
                            .for_each_init(Vec::new, |work, (xc, yc)| {
                                let m = yc.len() / cols.max(1);
                                N::gemm_r(prod(m, cols, nin, true), mat(yc, cols), &wt, xc, work);
                            });
                    });
                    if want_grad {
                        let xv = &self.nodes[x.0].val;
                        weight_grad(nin, xv, &ybar, &mut grad[w..w + nin * cols]);
                        if let Some(b) = b {
                            for r in ybar.chunks(cols) {
                                add_into(&mut grad[b..b + cols], r);
                            }
                        }
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
                    let (av, bv) = (&self.nodes[a.0].val, &self.nodes[b.0].val);
                    // Ā = C̄·op(B)ᵀ (stored transposed with ta: op(B)·C̄ᵀ); B̄ = op(A)ᵀ·C̄
                    // (with tb: C̄ᵀ·op(A)).
                    acc(&mut adj, a, &self.nodes, |abar| {
                        abar.par_chunks_mut((m * k).max(1))
                            .enumerate()
                            .for_each_init(Vec::new, |work, (i, ab)| {
                                let cb = &ybar[i * m * n..(i + 1) * m * n];
                                let bb = &bv[i * k * n..(i + 1) * k * n];
                                if ta {
                                    matmul(k, n, m, (bb, tb), (cb, true), ab, true, work);
                                } else {
                                    matmul(m, n, k, (cb, false), (bb, !tb), ab, true, work);
                                }
                            });
                    });
                    acc(&mut adj, b, &self.nodes, |bbar| {
                        bbar.par_chunks_mut((k * n).max(1))
                            .enumerate()
                            .for_each_init(Vec::new, |work, (i, bb)| {
                                let cb = &ybar[i * m * n..(i + 1) * m * n];
                                let ab = &av[i * m * k..(i + 1) * m * k];
                                if tb {
                                    matmul(n, m, k, (cb, true), (ab, ta), bb, true, work);
                                } else {
                                    matmul(k, m, n, (ab, !ta), (cb, false), bb, true, work);
                                }
                            });
                    });
                }
                Op::Map(x, _, slope) => put_with(&mut adj, *x, ybar.len(), |e| ybar[e] * slope[e]),
                &Op::Add(a, b) | &Op::Sub(a, b) => {
                    let neg = matches!(node.op, Op::Sub(..));
                    let sign = |v: N| if neg { -v } else { v };
                    put_reduced(&mut adj, &self.nodes, b, (rows, cols), |e| sign(ybar[e]));
                    // a's adjoint is ybar itself where nothing reached a yet.
                    put(&mut adj, a, ybar);
                }
                &Op::Mul(a, b) => {
                    let (br, bc) = (self.nodes[b.0].rows, self.nodes[b.0].cols);
                    let (av, bv) = (&self.nodes[a.0].val, &self.nodes[b.0].val);
                    let shapes = ((rows, cols), (br, bc));
                    match &mut adj[a.0] {
                        Some(abar) => bcast_rows(abar, &ybar, bv, shapes, |o, yb, b| *o += yb * b),
                        none => *none = Some(zip_bcast(&ybar, bv, shapes, |yb, b| yb * b)),
                    }
                    put_reduced(&mut adj, &self.nodes, b, (rows, cols), |e| ybar[e] * av[e]);
                }
                &Op::Scale(x, s) => {
                    put_with(&mut adj, x, ybar.len(), |e| ybar[e].scale(s));
                }
                Op::Gather { x, idx, w } => {
                    acc(&mut adj, *x, &self.nodes, |xbar| {
                        for (&i, yu) in idx.iter().zip(ybar.chunks(*w)) {
                            if i != NONE {
                                add_into(&mut xbar[i as usize * w..][..*w], yu);
                            }
                        }
                    });
                }
                &Op::SumRows(x, k) => {
                    acc(&mut adj, x, &self.nodes, |xbar| {
                        xbar.par_chunks_mut(cols.max(1))
                            .enumerate()
                            .for_each(|(r, xr)| {
                                add_into(xr, &ybar[r / k * cols..][..cols]);
                            });
                    });
                }
                &Op::RowSum(x) => {
                    let w = self.nodes[x.0].cols;
                    acc(&mut adj, x, &self.nodes, |xbar| {
                        xbar.par_chunks_mut(w.max(1))
                            .zip(ybar.par_iter())
                            .for_each(|(xr, &yb)| {
                                for o in xr {
                                    *o += yb;
                                }
                            });
                    });
                }
                Op::Softmax(x, _) => {
                    let y = &node.val;
                    acc(&mut adj, *x, &self.nodes, |xbar| {
                        xbar.par_chunks_mut(cols.max(1))
                            .zip(y.par_chunks(cols.max(1)).zip(ybar.par_chunks(cols.max(1))))
                            .for_each(|(xr, (yr, br))| {
                                let dot =
                                    yr.iter().zip(br).fold(N::zero(), |a, (&p, &b)| a + p * b);
                                for ((o, &p), &b) in xr.iter_mut().zip(yr).zip(br) {
                                    *o += p * (b - dot);
                                }
                            });
                    });
                }
                Op::Concat(xs) => {
                    let mut at = 0;
                    for &x in xs {
                        let w = self.nodes[x.0].cols;
                        let xbar = zeroed_with(
                            rows * w,
                            CHUNK * w,
                            || (),
                            |_, c, xc| {
                                let yc = &ybar[c * CHUNK * cols..];
                                for (xr, yr) in xc.chunks_mut(w.max(1)).zip(yc.chunks(cols)) {
                                    xr.copy_from_slice(&yr[at..at + w]);
                                }
                            },
                        );
                        put(&mut adj, x, xbar);
                        at += w;
                    }
                }
                &Op::Reshape(x) => put(&mut adj, x, ybar),
            }
        }
        Grads { adj }
    }
}

/// The adjoints after [`Tape::backward`].
pub struct Grads<N> {
    adj: Vec<Option<Vec<N>>>,
}

impl<N: Copy> Grads<N> {
    /// A leaf's adjoint (`None` where nothing reached it).
    pub fn of(&self, v: V) -> Option<&[N]> {
        self.adj[v.0].as_deref()
    }
}

/// Runs `f` on v's adjoint, made (zero) on first use.
fn acc<T, N: Copy + Default + Send + Sync>(
    adj: &mut [Option<Vec<N>>],
    v: V,
    nodes: &[Node<T, N>],
    f: impl FnOnce(&mut [N]),
) {
    let a = adj[v.0].get_or_insert_with(|| zeros(nodes[v.0].val.len()));
    f(a);
}

/// (f, f', f'') of activation `a` at each of (up to [`CHUNK`]) numbers' real parts.
fn act_chunk<T: Real, N: Num<T>>(a: Activation, xc: &[N]) -> [[T; 3]; CHUNK] {
    let n = xc.len();
    let mut x = [T::zero(); CHUNK];
    for (x, v) in x.iter_mut().zip(xc) {
        *x = v.re();
    }
    let (mut y, mut dy, mut d2y) = ([T::zero(); CHUNK], [T::zero(); CHUNK], [T::zero(); CHUNK]);
    if a == Activation::Tanh {
        y[..n].copy_from_slice(&x[..n]);
        tanh_in_place(&mut y[..n]);
        let two = T::one() + T::one();
        for ((&t, d1), d2) in y[..n].iter().zip(&mut dy).zip(&mut d2y) {
            *d1 = T::one() - t * t;
            *d2 = -two * t * (T::one() - t * t);
        }
    } else {
        super::act::eval3_slice(a, &x[..n], &mut y[..n], &mut dy[..n], &mut d2y[..n]);
    }
    std::array::from_fn(|e| [y[e], dy[e], d2y[e]])
}

/// Adds `g` to v's adjoint, or makes it v's adjoint where nothing reached v yet: no zeroed
/// adjoint is written and read again (the zeroing was a tenth of DPA-2's float32 step).
fn put<N: Copy + std::ops::AddAssign + Send + Sync>(adj: &mut [Option<Vec<N>>], v: V, g: Vec<N>) {
    match &mut adj[v.0] {
        Some(a) => add_into(a, &g),
        none => *none = Some(g),
    }
}

fn add_into<N: Copy + std::ops::AddAssign + Send + Sync>(y: &mut [N], x: &[N]) {
    let add = |(y, x): (&mut [N], &[N])| {
        for (o, &v) in y.iter_mut().zip(x) {
            *o += v;
        }
    };
    if y.len() < 16 * CHUNK {
        add((y, x));
    } else {
        (y.par_chunks_mut(16 * CHUNK).zip(x.par_chunks(16 * CHUNK))).for_each(add);
    }
}

/// Adds g(e) for each entry e to v's adjoint in place, or collects the g(e) as v's adjoint
/// where nothing reached v yet: no second tensor beside an adjoint at the backward's peak.
fn put_with<N: Copy + std::ops::AddAssign + Send + Sync>(
    adj: &mut [Option<Vec<N>>],
    v: V,
    len: usize,
    g: impl Fn(usize) -> N + Sync + Send,
) {
    match &mut adj[v.0] {
        Some(a) => a.par_iter_mut().enumerate().for_each(|(e, o)| *o += g(e)),
        none => *none = Some((0..len).into_par_iter().map(g).collect()),
    }
}

/// [`put_with`] of g over a `[rows][cols]` tensor into b's adjoint, summed over b's broadcast
/// extents.
fn put_reduced<T, N: Copy + Default + std::ops::AddAssign + Send + Sync>(
    adj: &mut [Option<Vec<N>>],
    nodes: &[Node<T, N>],
    b: V,
    (rows, cols): (usize, usize),
    g: impl Fn(usize) -> N + Sync + Send,
) {
    let (br, bc) = (nodes[b.0].rows, nodes[b.0].cols);
    if (br, bc) == (rows, cols) {
        return put_with(adj, b, rows * cols, g);
    }
    // Each of b's entries takes its terms in the order of the rows and columns, as one loop
    // over the tensor would add them: a row's sum per task for a column b, a block of columns
    // per task (over every row) for a row b.
    acc(adj, b, nodes, |bbar| {
        if bc == 1 && br == rows {
            bbar.par_iter_mut().enumerate().for_each(|(i, o)| {
                for j in 0..cols {
                    *o += g(i * cols + j);
                }
            });
        } else if br == 1 && bc == cols {
            let block = cols.div_ceil(rayon::current_num_threads()).max(1);
            bbar.par_chunks_mut(block).enumerate().for_each(|(k, ob)| {
                for i in 0..rows {
                    for (j, o) in ob.iter_mut().enumerate() {
                        *o += g(i * cols + k * block + j);
                    }
                }
            });
        } else {
            for e in 0..rows * cols {
                bbar[0] += g(e);
            }
        }
    });
}

/// A tensor's `[rows][cols]` and the `[br][bc]` broadcast onto it.
type Shapes = ((usize, usize), (usize, usize));

/// f(a, b) of a `[rows][cols]` and b `[br][bc]` broadcast onto it.
fn zip_bcast<N: Copy + Default + Send + Sync>(
    av: &[N],
    bv: &[N],
    shapes: Shapes,
    f: impl Fn(N, N) -> N + Sync,
) -> Vec<N> {
    let ((rows, cols), b) = shapes;
    if b == (rows, cols) {
        return (av.par_iter().zip(bv.par_iter()))
            .map(|(&x, &y)| f(x, y))
            .collect();
    }
    let mut y = zeros(rows * cols);
    bcast_rows(&mut y, av, bv, shapes, |o, x, b| *o = f(x, b));
    y
}

/// `op(out, a, b)` at each entry of a `[rows][cols]` with b `[br][bc]` broadcast onto it, a
/// row at a time: an entry's row and column by division cost more than the op.
fn bcast_rows<N: Copy + Send + Sync>(
    out: &mut [N],
    av: &[N],
    bv: &[N],
    ((_, cols), (br, bc)): Shapes,
    op: impl Fn(&mut N, N, N) + Sync,
) {
    (out.par_chunks_mut(cols.max(1))
        .zip(av.par_chunks(cols.max(1))))
    .enumerate()
    .for_each(|(i, (or, ar))| {
        for (j, (o, &x)) in or.iter_mut().zip(ar).enumerate() {
            op(o, x, bv[bcast(i, j, br, bc)]);
        }
    });
}

/// Where b `[br][bc]` is read for entry (i, j) of its broadcast.
fn bcast(i: usize, j: usize, br: usize, bc: usize) -> usize {
    (if br == 1 { 0 } else { i }) * bc + if bc == 1 { 0 } else { j }
}

/// Rows of a block of [`weight_grad`].
const GRAD_ROWS: usize = 4096;

/// W̄ += xᵀ·ȳ for x `[rows][nin]`, ȳ `[rows][nout]`: blocks of [`GRAD_ROWS`] rows in parallel,
/// their products added in the blocks' order (the same sums whatever the threads).
fn weight_grad<T: Real, N: Num<T>>(nin: usize, xv: &[N], ybar: &[N], wbar: &mut [N]) {
    let nout = wbar.len() / nin.max(1);
    let rows = ybar.len() / nout.max(1);
    let xt = |r0: usize| Mat {
        v: &xv[r0 * nin..],
        rs: 1,
        cs: nin,
    };
    if rows <= GRAD_ROWS {
        return N::gemm_grad(
            prod(nin, rows, nout, true),
            xt(0),
            ybar,
            wbar,
            &mut Vec::new(),
        );
    }
    let blocks: Vec<Vec<N>> = (0..rows.div_ceil(GRAD_ROWS))
        .into_par_iter()
        .map_init(Vec::new, |work, k| {
            let (r0, r1) = (k * GRAD_ROWS, ((k + 1) * GRAD_ROWS).min(rows));
            let mut part = vec![N::zero(); nin * nout];
            let yb = &ybar[r0 * nout..r1 * nout];
            N::gemm_grad(prod(nin, r1 - r0, nout, false), xt(r0), yb, &mut part, work);
            part
        })
        .collect();
    for part in &blocks {
        add_into(wbar, part);
    }
}

fn prod(m: usize, k: usize, n: usize, acc: bool) -> Prod {
    Prod {
        m,
        k,
        n,
        b_rs: n,
        c_rs: n,
        acc,
    }
}

fn mat<N>(v: &[N], k: usize) -> Mat<'_, N> {
    Mat { v, rs: k, cs: 1 }
}

/// C (+)= op(A)·op(B), C `[m][n]`: A `[m][k]` (`[k][m]` transposed), B `[k][n]` (`[n][k]`
/// transposed, copied into row-major for the kernel).
#[allow(clippy::too_many_arguments)]
fn matmul<T: Real, N: Num<T>>(
    m: usize,
    k: usize,
    n: usize,
    (a, ta): (&[N], bool),
    (b, tb): (&[N], bool),
    c: &mut [N],
    accumulate: bool,
    work: &mut Vec<T>,
) {
    if m * n == 0 {
        return;
    }
    let am = if ta {
        Mat { v: a, rs: 1, cs: m }
    } else {
        Mat { v: a, rs: k, cs: 1 }
    };
    let bt: Vec<N>;
    let bm = if tb {
        bt = (0..k * n).map(|e| b[(e % n) * k + e / n]).collect();
        &bt[..]
    } else {
        b
    };
    N::gemm(prod(m, k, n, accumulate), am, bm, c, work);
}

#[cfg(test)]
/// A small graph of every op, on an input x `[4][2]` and 12 parameters: the tape's tests (its
/// backward against central differences, its dual reverse against the backward's own tangent)
/// and the devices' (`backend/device_tape`).
pub(crate) fn graph<N: Num<f64>>(t: &mut Tape<'_, f64, N>, x: V) -> V {
    let l = t.linear(x, 0, Some(6), 3); // [4][2] · [2][3]
    let h = t.map(l, Elem::Act(Activation::Tanh));
    let p = t.param(9, 1, 3);
    let hp = t.mul(h, p);
    let g = t.gather(hp, Arc::new(vec![0, 4, NONE, 7, 11, 2]), 2, 3);
    let dots = t.bmm(g, g, 2, 1, 3, 1, false, true);
    let sm = t.softmax(hp, Some(Arc::new((0..12).map(|e| e % 5 != 3).collect())));
    let r = t.sum_rows(sm, 2);
    let rs = t.row_sum(hp);
    let c = t.concat(&[r, g]);
    let c2 = t.reshape(c, 3, 4);
    let k = t.bmm(c2, c2, 1, 3, 4, 3, false, true);
    let kt = t.bmm(c2, c2, 1, 3, 4, 3, false, true);
    let kk = t.scale(k, 0.5);
    let ktk = t.bmm(kt, c2, 1, 3, 3, 4, true, false);
    let centred = t.sub(hp, rs);
    let parts = [t.row_sum(centred), t.sum_rows(dots, 2)];
    let a = t.sum_rows(parts[0], 4);
    let kk = t.add(kk, a);
    let kk = t.add(kk, parts[1]);
    let w = t.row_sum(ktk);
    // A product over many rows (the three-body block's are 10⁵-10⁶ rows): its sums too.
    let many: Vec<u32> = (0..70_001).map(|i| (i % 4) as u32).collect();
    let big = t.rows(x, &many);
    let big = t.linear(big, 0, Some(6), 3);
    let big = t.act(big, Activation::Tanh);
    let big = t.sum_rows(big, 70_001);
    let big = t.scale(big, 1e-6);
    let kk = t.add(kk, big);
    t.mul(kk, w)
}

/// [`graph`]'s four passes on the cpu: its value at x, x's adjoint for the seed ȳ, its tangent
/// along ẋ, and the parameters' gradient from the dual reverse seeded with Ẏ̄ + εȲ.
#[cfg(test)]
pub(crate) struct GraphPasses {
    pub y: Vec<f64>,
    pub xbar: Vec<f64>,
    pub ydot: Vec<f64>,
    pub grad: Vec<f64>,
}

#[cfg(test)]
impl GraphPasses {
    pub fn on_cpu(x: &[f64], xdot: &[f64], params: &[f64], ybar: &[f64], ydotbar: &[f64]) -> Self {
        use super::dual::Dual;
        let mut t = Tape::<f64, f64>::new(params);
        let xv = t.leaf(x.to_vec(), 4, 2);
        let o = graph(&mut t, xv);
        let y = t.val(o).to_vec();
        let xbar = t.backward(vec![(o, ybar.to_vec())], &mut []);
        let xbar = xbar.of(xv).unwrap().to_vec();
        let mut t = Tape::<f64, Dual<f64>>::new(params);
        let xd = x.iter().zip(xdot).map(|(&a, &b)| Dual::new(a, b)).collect();
        let xv = t.leaf(xd, 4, 2);
        let o = graph(&mut t, xv);
        let ydot = t.val(o).iter().map(|v| v.d).collect();
        let seed = ydotbar
            .iter()
            .zip(ybar)
            .map(|(&a, &b)| Dual::new(a, b))
            .collect();
        let mut g = vec![Dual::default(); params.len()];
        t.backward(vec![(o, seed)], &mut g);
        let grad = g.iter().map(|v| v.d).collect();
        GraphPasses {
            y,
            xbar,
            ydot,
            grad,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::dual::Dual;
    use super::*;

    fn loss(x: &[f64], params: &[f64]) -> f64 {
        let mut t = Tape::<f64, f64>::new(params);
        let xv = t.leaf(x.to_vec(), 4, 2);
        let o = graph(&mut t, xv);
        t.val(o)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1.0 + i as f64))
            .sum()
    }

    #[test]
    fn backward_matches_finite_differences_and_dual_reverse_its_tangent() {
        let x: Vec<f64> = (0..8).map(|i| 0.3 * (i as f64) - 1.1).collect();
        let params: Vec<f64> = (0..12).map(|i| 0.1 * (i as f64).sin() + 0.2).collect();
        let mut t = Tape::<f64, f64>::new(&params);
        let xv = t.leaf(x.clone(), 4, 2);
        let o = graph(&mut t, xv);
        let seed: Vec<f64> = (0..t.val(o).len()).map(|i| 1.0 + i as f64).collect();
        let mut grad = vec![0.0; params.len()];
        let g = t.backward(vec![(o, seed.clone())], &mut grad);
        let xbar = g.of(xv).unwrap().to_vec();
        let h = 1e-6;
        for i in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += h;
            xm[i] -= h;
            let fd = (loss(&xp, &params) - loss(&xm, &params)) / (2.0 * h);
            assert!(
                (fd - xbar[i]).abs() < 1e-7 * (1.0 + fd.abs()),
                "x{i}: {fd} {}",
                xbar[i]
            );
        }
        for i in 0..params.len() {
            let (mut pp, mut pm) = (params.clone(), params.clone());
            pp[i] += h;
            pm[i] -= h;
            let fd = (loss(&x, &pp) - loss(&x, &pm)) / (2.0 * h);
            assert!(
                (fd - grad[i]).abs() < 1e-7 * (1.0 + fd.abs()),
                "p{i}: {fd} {}",
                grad[i]
            );
        }
        // Dual reverse: forward on x + εẋ, backward with cotangent 0 + ε·seed gives, in its
        // real part, d/dε of x̄ along ẋ: compare with differences of the backward.
        let xdot: Vec<f64> = (0..8).map(|i| 0.7 - 0.2 * i as f64).collect();
        let xbar_at = |s: f64| {
            let xs: Vec<f64> = x.iter().zip(&xdot).map(|(a, b)| a + s * b).collect();
            let mut t = Tape::<f64, f64>::new(&params);
            let xv = t.leaf(xs, 4, 2);
            let o = graph(&mut t, xv);
            let mut gr = vec![0.0; params.len()];
            let g = t.backward(vec![(o, seed.clone())], &mut gr);
            (g.of(xv).unwrap().to_vec(), gr)
        };
        let mut t = Tape::<f64, Dual<f64>>::new(&params);
        let xd = x
            .iter()
            .zip(&xdot)
            .map(|(&a, &b)| Dual::new(a, b))
            .collect();
        let xv = t.leaf(xd, 4, 2);
        let o = graph(&mut t, xv);
        let s: Vec<Dual<f64>> = seed.iter().map(|&v| Dual::new(v, 0.0)).collect();
        let mut gd = vec![Dual::default(); params.len()];
        let g = t.backward(vec![(o, s)], &mut gd);
        let (xp, gp) = xbar_at(h);
        let (xm, gm) = xbar_at(-h);
        for (i, d) in g.of(xv).unwrap().iter().enumerate() {
            let fd = (xp[i] - xm[i]) / (2.0 * h);
            assert!(
                (fd - d.d).abs() < 1e-6 * (1.0 + fd.abs()),
                "ẋ̄{i}: {fd} {}",
                d.d
            );
            assert!((d.v - xbar[i]).abs() < 1e-12 * (1.0 + xbar[i].abs()));
        }
        for (i, d) in gd.iter().enumerate() {
            let fd = (gp[i] - gm[i]) / (2.0 * h);
            assert!(
                (fd - d.d).abs() < 1e-6 * (1.0 + fd.abs()),
                "θ̄̇{i}: {fd} {}",
                d.d
            );
        }
    }
}

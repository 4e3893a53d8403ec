//! DPA-1's block per centre (docs/design.md §11.1 steps 5–6): from the embedding G⁰ of the
//! centre's nnei slots through the attention layers to the contraction and D = A A<ᵀ.
//!
//! One generic forward and one generic backward over `Num`: on reals they are the forward and
//! the force pass (D̄ → q); on `Dual` numbers the forward is the tangent pass (Ḋ) and the
//! backward the dual reverse (θ̄, Ḡ⁰, Ġ̄⁰), so the second derivatives of the softmax, the
//! normalisations and the layer norm come from the same code as the first. The products (the
//! projections, the logits q̂k̂ᵀ, the weighted sum A v̂ and their adjoints) are matrix products
//! through `Num::gemm`, which a dual does as real GEMMs; only the element-wise steps between
//! them are loops over numbers. Everything a pass needs is recomputed per centre from G⁰
//! (nothing nnei² is kept between passes), in buffers each thread reuses centre after centre.

use std::ops::Range;

use rayon::prelude::*;

use super::dual::{Dual, Num};
use super::gemm::{transpose, Mat, Prod};
use crate::backend::{AttnOpts, Dims, Real};

/// Shift of the smooth attention's logits (DeePMD-kit's `attnw_shift`).
const SHIFT: f64 = 20.0;
/// Floor of the norms in DeePMD-kit's normalisations (`torch.nn.functional.normalize`'s eps).
const NORM_FLOOR: f64 = 1e-12;

/// One attention layer's parameters: in_proj `[M1][3H]` + `[3H]`, out_proj `[H][M1]` + `[M1]`,
/// the layer norm's scale and shift `[M1]`, in this order when packed (gradients).
#[derive(Clone, Copy)]
pub struct LayerParams<'a, R> {
    pub w_in: &'a [R],
    pub b_in: &'a [R],
    pub w_out: &'a [R],
    pub b_out: &'a [R],
    pub gamma: &'a [R],
    pub beta: &'a [R],
}

/// A layer's packed gradient, split as [`LayerParams`].
struct LayerGrad<'a, N> {
    w_in: &'a mut [N],
    b_in: &'a mut [N],
    w_out: &'a mut [N],
    b_out: &'a mut [N],
    gamma: &'a mut [N],
    beta: &'a mut [N],
}

impl<'a, R> LayerParams<'a, R> {
    /// One layer's parameters from their packed form ([`AttnOpts::layer_parts`]).
    pub fn packed(o: &AttnOpts, p: &'a [R]) -> Self {
        let [n0, n1, n2, n3, n4, _] = o.layer_parts();
        let (w_in, p) = p.split_at(n0);
        let (b_in, p) = p.split_at(n1);
        let (w_out, p) = p.split_at(n2);
        let (b_out, p) = p.split_at(n3);
        let (gamma, beta) = p.split_at(n4);
        LayerParams {
            w_in,
            b_in,
            w_out,
            b_out,
            gamma,
            beta,
        }
    }
}

fn split_grad<'a, N>(o: &AttnOpts, g: &'a mut [N]) -> LayerGrad<'a, N> {
    let [n0, n1, n2, n3, n4, _] = o.layer_parts();
    let (w_in, g) = g.split_at_mut(n0);
    let (b_in, g) = g.split_at_mut(n1);
    let (w_out, g) = g.split_at_mut(n2);
    let (b_out, g) = g.split_at_mut(n3);
    let (gamma, beta) = g.split_at_mut(n4);
    LayerGrad {
        w_in,
        b_in,
        w_out,
        b_out,
        gamma,
        beta,
    }
}

/// A layer's weights transposed, W_in `[3H][M1]` and W_out `[M1][H]`: the backward's x̄ = ȳWᵀ
/// is a GEMM that reads B's rows in place.
struct Transposed<R> {
    w_in: Vec<R>,
    w_out: Vec<R>,
}

/// One thread's buffers for one centre's passes, reused centre after centre (n slots each):
/// what the forward keeps for the backward, and the scratch of both.
struct Work<N, R> {
    /// Per layer: its input G `[n][M1]` (one more: the last layer's output), q̂k̂v̂ `[n][3H]`
    /// and their norms `[n][3]`, the logits L, softmax P and weights A `[n][n]`, the attention
    /// output O `[n][H]`, the layer norm's x̂ `[n][M1]` and 1/s `[n]`.
    g: Vec<Vec<N>>,
    qkv: Vec<Vec<N>>,
    nrm: Vec<Vec<N>>,
    logit: Vec<Vec<N>>,
    p: Vec<Vec<N>>,
    w: Vec<Vec<N>>,
    o: Vec<Vec<N>>,
    xhat: Vec<Vec<N>>,
    sinv: Vec<Vec<N>>,
    /// r̂ `[n][3]`, C_jk = r̂_j·r̂_k `[n][n]` (attn_dotr only), A `[4][M1]`, D `[M1][M2]`.
    rdir: Vec<N>,
    dotr: Vec<N>,
    a: Vec<N>,
    desc: Vec<N>,
    /// The backward's seed D̄ `[M1][M2]` (the caller's) and results: Ḡ⁰ `[n][M1]`, R̄ `[n][4]`,
    /// σ̄ `[n]`.
    dbar: Vec<N>,
    gbar: Vec<N>,
    rbar: Vec<N>,
    swbar: Vec<N>,
    /// Scratch: k̂ or v̂ transposed `[H][n]`, an n × n adjoint, the softmax's shares of r̂̄ and
    /// σ̄ `[n][n]` (attn_dotr and smooth only), z and z̄ `[n][M1]`, Ō `[n][H]`, q̂k̂v̂̄ `[n][3H]`,
    /// r̂̄ `[n][3]`, Ā `[4][M1]`, and the GEMMs' (a dual's parts).
    vt: Vec<N>,
    nn: Vec<N>,
    cbar: Vec<N>,
    ebar: Vec<N>,
    z: Vec<N>,
    obar: Vec<N>,
    qkvbar: Vec<N>,
    rdbar: Vec<N>,
    abar: Vec<N>,
    /// ∂L/∂A `[4][M1]` of a tensor fitting, which the backward adds to Ā (0 but in its dual
    /// reverse).
    abar_in: Vec<N>,
    gemm: Vec<R>,
}

impl<R: Real, N: Num<R>> Work<N, R> {
    /// Buffers for up to `n` slots, sized for `n`.
    fn new(o: &AttnOpts, n: usize, nlayers: usize) -> Self {
        let (m, z) = (o.m1, N::zero());
        let mut t = Work {
            g: vec![Vec::new(); nlayers + 1],
            qkv: vec![Vec::new(); nlayers],
            nrm: vec![Vec::new(); nlayers],
            logit: vec![Vec::new(); nlayers],
            p: vec![Vec::new(); nlayers],
            w: vec![Vec::new(); nlayers],
            o: vec![Vec::new(); nlayers],
            xhat: vec![Vec::new(); nlayers],
            sinv: vec![Vec::new(); nlayers],
            rdir: Vec::new(),
            dotr: Vec::new(),
            a: vec![z; 4 * m],
            desc: vec![z; m * o.m2],
            dbar: vec![z; m * o.m2],
            gbar: Vec::new(),
            rbar: Vec::new(),
            swbar: Vec::new(),
            vt: Vec::new(),
            nn: Vec::new(),
            cbar: Vec::new(),
            ebar: Vec::new(),
            z: Vec::new(),
            obar: Vec::new(),
            qkvbar: Vec::new(),
            rdbar: Vec::new(),
            abar: vec![z; 4 * m],
            abar_in: vec![z; 4 * m],
            gemm: Vec::new(),
        };
        t.fit(o, n);
        t
    }

    /// Sizes the per-slot buffers for a centre of n slots: within the capacity of the largest
    /// size so far, so centre after centre allocates nothing.
    fn fit(&mut self, o: &AttnOpts, n: usize) {
        let z = N::zero();
        let (m, h) = (o.m1, o.h);
        let nn = |on: bool| if on { n * n } else { 0 };
        self.g.iter_mut().for_each(|v| v.resize(n * m, z));
        let per = [
            (&mut self.qkv, 3 * h),
            (&mut self.nrm, 3),
            (&mut self.logit, n),
            (&mut self.p, n),
            (&mut self.w, n),
            (&mut self.o, h),
            (&mut self.xhat, m),
            (&mut self.sinv, 1),
        ];
        for (layers, w) in per {
            layers.iter_mut().for_each(|v| v.resize(n * w, z));
        }
        let one = [
            (&mut self.rdir, 3 * n),
            (&mut self.dotr, nn(o.dotr)),
            (&mut self.gbar, n * m),
            (&mut self.rbar, 4 * n),
            (&mut self.swbar, n),
            (&mut self.vt, h * n),
            (&mut self.nn, n * n),
            (&mut self.cbar, nn(o.dotr)),
            (&mut self.ebar, nn(o.smooth)),
            (&mut self.z, n * m),
            (&mut self.obar, n * h),
            (&mut self.qkvbar, n * 3 * h),
            (&mut self.rdbar, 3 * n),
        ];
        for (v, len) in one {
            v.resize(len, z);
        }
    }
}

/// One centre's inputs: G⁰ `[n][M1]`, R̂ `[n][4]`, switch σ `[n]` and whether each slot holds
/// a neighbour, for its first n slots: up to the last neighbour and one slot of the padding
/// after it, which stands for all of that padding.
///
/// The padding after the last neighbour is nnei − n + 1 copies of one slot (the same G⁰, R̂
/// and σ = 0), and the block treats each the same: σ = 0 makes its weights σ_j σ_k P_jk zero
/// both ways, so no other row reads its q̂k̂v̂ and it reads none, and smooth attention's logits
/// of it are the constant −shift. Each copy's row only passes through the layer norms and the
/// out projection's bias into A (R̂'s first entry, −davg/dstd, is not 0), and back. So one copy
/// is computed, and where the dense block sums over rows or columns — A, the softmax's sums,
/// the layer norms' and the biases' gradients — it is added once per copy, in the same order;
/// every other sum only lost terms that were exactly zero. The results are the dense block's
/// to the bit. DeePMD-kit's sel is set above the most neighbours any atom has (the alloy
/// example: 44 on average in 100 slots), and the block's cost goes with n² and n.
struct Centre<N> {
    g0: Vec<N>,
    rhat: Vec<N>,
    sw: Vec<N>,
    real: Vec<bool>,
    /// The copies of the last slot left out (nnei − n).
    extra: usize,
    /// 1/nnei: A's mean is over all slots.
    inv_nnei: f64,
}

impl<N> Centre<N> {
    fn new() -> Self {
        Centre {
            g0: Vec::new(),
            rhat: Vec::new(),
            sw: Vec::new(),
            real: Vec::new(),
            extra: 0,
            inv_nnei: 0.0,
        }
    }

    /// The slots taken (n).
    fn len(&self) -> usize {
        self.sw.len()
    }

    /// How many of the nnei slots slot j stands for.
    fn copies(&self, j: usize) -> usize {
        if j + 1 == self.len() {
            1 + self.extra
        } else {
            1
        }
    }

    /// The slot taken that slot j of all nnei is (itself, or the copy it was left out for).
    fn taken(&self, j: usize) -> usize {
        j.min(self.len() - 1)
    }

    /// Takes the centre's slots `s` of the batch (up to one past the last neighbour where the
    /// padding after it is copies of one slot, else all) and sizes the thread's buffers `t` for
    /// them: G⁰ + ε G⁰'ṡ, R̂ + ε Ṙ, σ + ε σ'ṡ for the tangent Ṙ of R̂ (`rdot`, `[nslots][4]`)
    /// where the pass has one.
    fn load<T: Real>(
        &mut self,
        x: &AttnIn<'_, T>,
        t: &mut Work<N, T>,
        s: Range<usize>,
        rdot: Option<&[T]>,
    ) where
        N: Num<T>,
    {
        let nnei = s.len();
        let first_pad = x.owner[s.clone()]
            .iter()
            .rposition(|&o| o >= 0)
            .map_or(0, |j| j + 1);
        let n = if first_pad < nnei && x.copies(s.start + first_pad, s.end, rdot) {
            first_pad + 1
        } else {
            nnei
        };
        let s = s.start..s.start + n;
        self.extra = nnei - n;
        self.inv_nnei = 1.0 / nnei as f64;
        let m = x.opts.m1;
        let tan = |i: usize| rdot.map_or(T::zero(), |r| r[i]);
        self.g0.clear();
        self.g0.extend(
            (s.start * m..s.end * m).map(|i| N::pair(x.g0[i], x.g0p[i] * tan(4 * (i / m)))),
        );
        self.rhat.clear();
        self.rhat
            .extend((4 * s.start..4 * s.end).map(|i| N::pair(x.rhat[i], tan(i))));
        self.sw.clear();
        self.sw
            .extend(s.clone().map(|j| N::pair(x.sw[j], x.dsw[j] * tan(4 * j))));
        self.real.clear();
        self.real.extend(x.owner[s].iter().map(|&o| o >= 0));
        t.fit(&x.opts, n);
    }
}

/// out = x W + b: x `[n][k]`, W `[k][c]`.
fn linear<R: Real, N: Num<R>>(
    x: &[N],
    w: &[R],
    b: &[R],
    k: usize,
    out: &mut [N],
    work: &mut Vec<R>,
) {
    let c = b.len();
    for oi in out.chunks_mut(c) {
        for (o, &bv) in oi.iter_mut().zip(b) {
            *o = N::of(bv);
        }
    }
    let p = Prod {
        m: x.len() / k,
        k,
        n: c,
        b_rs: c,
        c_rs: c,
        acc: true,
    };
    N::gemm_r(p, Mat { v: x, rs: k, cs: 1 }, w, out, work);
}

/// Adjoint of [`linear`] from Wᵀ `[c][k]`: x̄ = ȳ Wᵀ (added to x̄ with `acc`); W̄ += xᵀȳ and
/// b̄ += Σ ȳ when asked, row i of ȳ counted `copies(i)` times (the slots it stands for; the
/// left-out copies' terms of W̄ are 0, see Centre).
#[allow(clippy::too_many_arguments)]
fn linear_backward<R: Real, N: Num<R>>(
    x: &[N],
    wt: &[R],
    k: usize,
    ybar: &[N],
    copies: impl Fn(usize) -> usize,
    (xbar, acc): (&mut [N], bool),
    wb: Option<(&mut [N], &mut [N])>,
    work: &mut Vec<R>,
) {
    let (n, c) = (x.len() / k, wt.len() / k);
    let p = Prod {
        m: n,
        k: c,
        n: k,
        b_rs: k,
        c_rs: k,
        acc,
    };
    N::gemm_r(
        p,
        Mat {
            v: ybar,
            rs: c,
            cs: 1,
        },
        wt,
        xbar,
        work,
    );
    if let Some((wbar, bbar)) = wb {
        let p = Prod {
            m: k,
            k: n,
            n: c,
            b_rs: c,
            c_rs: c,
            acc: true,
        };
        N::gemm_grad(p, Mat { v: x, rs: 1, cs: k }, ybar, wbar, work);
        for (i, yi) in ybar.chunks(c).enumerate() {
            for _ in 0..copies(i) {
                for (bv, &y) in bbar.iter_mut().zip(yi) {
                    *bv += y;
                }
            }
        }
    }
}

/// x / max(|x|, floor) in place; returns the divisor.
fn normalize<R: Real, N: Num<R>>(x: &mut [N]) -> N {
    let sq = x.iter().fold(N::zero(), |s, &v| s + v * v);
    let n = sq.sqrt();
    let n = if n.re() < R::of(NORM_FLOOR) {
        N::of(R::of(NORM_FLOOR))
    } else {
        n
    };
    for v in x.iter_mut() {
        *v = *v / n;
    }
    n
}

/// Adjoint of [`normalize`] from its output y and divisor n: x̄ = (ȳ − y⟨y, ȳ⟩)/n, or ȳ/n where
/// the floor held (then n is a constant).
fn normalize_backward<R: Real, N: Num<R>>(y: &[N], n: N, ybar: &mut [N]) {
    let floor = n.re() == R::of(NORM_FLOOR);
    let yy = if floor {
        N::zero()
    } else {
        y.iter()
            .zip(ybar.iter())
            .fold(N::zero(), |s, (&a, &b)| s + a * b)
    };
    for (v, &yv) in ybar.iter_mut().zip(y) {
        *v = (*v - yv * yy) / n;
    }
}

fn dot<R: Real, N: Num<R>>(x: &[N], y: &[N]) -> N {
    x.iter().zip(y).fold(N::zero(), |s, (&a, &b)| s + a * b)
}

impl AttnOpts {
    /// Whether row j attends at all (not smooth: padding rows are zero).
    fn row_on<N>(&self, x: &Centre<N>, j: usize) -> bool {
        self.smooth || x.real[j]
    }

    /// Whether slot k enters row j's softmax (not smooth: only neighbours).
    fn col_on<N>(&self, x: &Centre<N>, k: usize) -> bool {
        self.smooth || x.real[k]
    }

    /// The largest value of the slots in row's softmax, in four independent chains (a max is
    /// exact, so their order cannot change it).
    fn row_max<R: Real, N: Num<R>>(&self, x: &Centre<N>, row: &[N]) -> R {
        let mut mx = [R::neg_infinity(); 4];
        for (k, v) in row.iter().enumerate() {
            if self.col_on(x, k) {
                mx[k % 4] = mx[k % 4].max(v.re());
            }
        }
        mx[0].max(mx[1]).max(mx[2].max(mx[3]))
    }

    /// Layer l's attention weights (DeePMD-kit's GatedAttentionLayer) from q̂_j·k̂_k in its
    /// logits, which keep L = α q̂_j·k̂_k: the softmax P and the weights A, zero where a row or
    /// a slot takes no part.
    fn softmax<R: Real, N: Num<R>>(&self, x: &Centre<N>, t: &mut Work<N, R>, l: usize) {
        let n = x.len();
        let alpha = R::of(self.alpha);
        let shift = N::of(R::of(SHIFT));
        let rows = t.logit[l]
            .chunks_mut(n)
            .zip(t.p[l].chunks_mut(n))
            .zip(t.w[l].chunks_mut(n));
        for (j, ((lr, pr), wr)) in rows.enumerate() {
            if !self.row_on(x, j) {
                pr.fill(N::zero());
                wr.fill(N::zero());
                continue;
            }
            let sj = x.sw[j];
            for (k, (lv, pv)) in lr.iter_mut().zip(pr.iter_mut()).enumerate() {
                if !self.col_on(x, k) {
                    continue;
                }
                let l = lv.scale(alpha);
                *lv = l;
                *pv = if self.smooth {
                    (l + shift) * sj * x.sw[k] - shift
                } else {
                    l
                };
            }
            let mx = self.row_max(x, pr);
            for (k, pv) in pr.iter_mut().enumerate() {
                *pv = if self.col_on(x, k) {
                    *pv - N::of(mx)
                } else {
                    N::zero()
                };
            }
            N::exp_nonpos(pr);
            let mut sum = N::zero();
            for (k, pv) in pr.iter_mut().enumerate() {
                if !self.col_on(x, k) {
                    *pv = N::zero();
                }
                sum += *pv;
            }
            // The copies of the last slot left out (see Centre).
            if self.smooth {
                for _ in 0..x.extra {
                    sum += pr[n - 1];
                }
            }
            let inv = N::of(R::one()) / sum;
            let cj = &t.dotr[if self.dotr { j * n..(j + 1) * n } else { 0..0 }];
            for (k, (pv, wv)) in pr.iter_mut().zip(wr.iter_mut()).enumerate() {
                *pv *= inv;
                let m = if self.smooth { *pv * sj * x.sw[k] } else { *pv };
                *wv = if self.dotr { m * cj[k] } else { m };
            }
        }
    }

    /// Adjoint of [`AttnOpts::softmax`]: from Ā `[n][n]` in `t.nn`, through C, the switches,
    /// the softmax and the smoothing, to L̄·α, the adjoint of q̂_j·k̂_k, in place; r̂̄ and σ̄
    /// added. Each element's share of r̂̄ (C̄_jk, through C_jk = r̂_j·r̂_k) and of σ̄ (Ē_jk, through
    /// the factor σ_j σ_k) is kept in an n × n matrix, and the sums over the row and the column
    /// are then products with r̂ and σ, so that the loops over elements scatter nothing.
    fn softmax_backward<R: Real, N: Num<R>>(&self, x: &Centre<N>, t: &mut Work<N, R>, l: usize) {
        let n = x.len();
        let alpha = R::of(self.alpha);
        let shift = N::of(R::of(SHIFT));
        let Work {
            p,
            logit,
            dotr,
            rdir,
            rdbar,
            swbar,
            nn,
            cbar,
            ebar,
            gemm,
            ..
        } = t;
        let rows = nn.chunks_mut(n).zip(p[l].chunks(n)).zip(logit[l].chunks(n));
        for (j, ((br, pr), lr)) in rows.enumerate() {
            let cb = &mut cbar[if self.dotr { j * n..(j + 1) * n } else { 0..0 }];
            let eb = &mut ebar[if self.smooth {
                j * n..(j + 1) * n
            } else {
                0..0
            }];
            if !self.row_on(x, j) {
                br.fill(N::zero());
                cb.fill(N::zero());
                continue;
            }
            let sj = x.sw[j];
            let cj = &dotr[if self.dotr { j * n..(j + 1) * n } else { 0..0 }];
            let mut pdot = N::zero();
            for (k, (bv, &pk)) in br.iter_mut().zip(pr).enumerate() {
                if !self.col_on(x, k) {
                    *bv = N::zero();
                    if self.dotr {
                        cb[k] = N::zero();
                    }
                    continue;
                }
                let ab = *bv;
                let mbar = if self.dotr {
                    let m_jk = if self.smooth { pk * sj * x.sw[k] } else { pk };
                    cb[k] = ab * m_jk;
                    ab * cj[k]
                } else {
                    ab
                };
                *bv = if self.smooth {
                    eb[k] = mbar * pk;
                    mbar * sj * x.sw[k]
                } else {
                    mbar
                };
                pdot += pk * *bv;
            }
            for (k, ((bv, &pk), &lk)) in br.iter_mut().zip(pr).zip(lr).enumerate() {
                if !self.col_on(x, k) {
                    continue;
                }
                let lpbar = pk * (*bv - pdot);
                *bv = if self.smooth {
                    eb[k] += lpbar * (lk + shift);
                    lpbar * sj * x.sw[k]
                } else {
                    lpbar
                }
                .scale(alpha);
            }
        }
        // r̂̄_j += Σ_k (C̄_jk + C̄_kj) r̂_k, σ̄_j += Σ_k (Ē_jk + Ē_kj) σ_k.
        let sums = [
            (self.dotr, &cbar[..], &rdir[..], &mut rdbar[..], 3),
            (self.smooth, &ebar[..], &x.sw[..], &mut swbar[..], 1),
        ];
        for (on, e, v, out, w) in sums {
            if !on {
                continue;
            }
            let prod = Prod {
                m: n,
                k: n,
                n: w,
                b_rs: w,
                c_rs: w,
                acc: true,
            };
            for (rs, cs) in [(n, 1), (1, n)] {
                N::gemm(prod, Mat { v: e, rs, cs }, v, out, gemm);
            }
        }
    }

    /// One centre's forward; leaves D `[M1][M2]` in `t.desc` and everything else in `t`.
    fn forward<R: Real, N: Num<R>>(
        &self,
        layers: &[LayerParams<'_, R>],
        x: &Centre<N>,
        t: &mut Work<N, R>,
    ) {
        let (m, h, n) = (self.m1, self.h, x.len());
        for (j, rd) in t.rdir.chunks_mut(3).enumerate() {
            rd.copy_from_slice(&x.rhat[4 * j + 1..4 * j + 4]);
            normalize(rd);
        }
        if self.dotr {
            // C is symmetric to the bit (r̂_j·r̂_k and r̂_k·r̂_j multiply the same pairs), so the
            // lower triangle is the upper's mirror.
            let r = &t.rdir;
            for j in 0..n {
                let rj = &r[3 * j..3 * j + 3];
                for k in j..n {
                    let c = dot(rj, &r[3 * k..3 * k + 3]);
                    t.dotr[j * n + k] = c;
                    t.dotr[k * n + j] = c;
                }
            }
        }
        t.g[0].copy_from_slice(&x.g0);
        for (l, p) in layers.iter().enumerate() {
            let qkv = &mut t.qkv[l];
            linear(&t.g[l], p.w_in, p.b_in, m, qkv, &mut t.gemm);
            if self.normalize {
                for (row, nr) in qkv.chunks_mut(3 * h).zip(t.nrm[l].chunks_mut(3)) {
                    for (part, nv) in row.chunks_mut(h).zip(nr.iter_mut()) {
                        *nv = normalize(part);
                    }
                }
            }
            // q̂_j·k̂_k for all j, k, k̂ transposed for the GEMM.
            transpose(&qkv[h..], n, h, 3 * h, &mut t.vt);
            let qk = Prod {
                m: n,
                k: h,
                n,
                b_rs: n,
                c_rs: n,
                acc: false,
            };
            let q = Mat {
                v: &qkv[..],
                rs: 3 * h,
                cs: 1,
            };
            N::gemm(qk, q, &t.vt, &mut t.logit[l], &mut t.gemm);
            self.softmax(x, t, l);
            let av = Prod {
                m: n,
                k: n,
                n: h,
                b_rs: 3 * h,
                c_rs: h,
                acc: false,
            };
            let a = Mat {
                v: &t.w[l][..],
                rs: n,
                cs: 1,
            };
            N::gemm(av, a, &t.qkv[l][2 * h..], &mut t.o[l], &mut t.gemm);
            linear(&t.o[l], p.w_out, p.b_out, h, &mut t.z, &mut t.gemm);
            let (gin, gout) = t.g.split_at_mut(l + 1);
            let rows = gout[0]
                .chunks_mut(m)
                .zip(gin[l].chunks(m))
                .zip(t.z.chunks(m))
                .zip(t.xhat[l].chunks_mut(m));
            let inv_m = R::of(1.0 / m as f64);
            for (i, (((go, gi), zi), xh)) in rows.enumerate() {
                let mut mu = N::zero();
                for (xv, (&gv, &zv)) in xh.iter_mut().zip(gi.iter().zip(zi)) {
                    *xv = gv + zv;
                    mu += *xv;
                }
                let mu = mu.scale(inv_m);
                let mut var = N::zero();
                for xv in xh.iter_mut() {
                    *xv -= mu;
                    var += *xv * *xv;
                }
                let s = (var.scale(inv_m) + N::of(R::of(self.ln_eps))).sqrt();
                let sinv = N::of(R::one()) / s;
                t.sinv[l][i] = sinv;
                for (c, (gv, xv)) in go.iter_mut().zip(xh.iter_mut()).enumerate() {
                    *xv *= sinv;
                    *gv = xv.scale(p.gamma[c]) + N::of(p.beta[c]);
                }
            }
        }
        // A[k][c] = (1/nnei) Σ_j G[j][c] R̂[j][k]; D[c][b] = Σ_k A[k][c] A[k][b], b < M2.
        let g = &t.g[layers.len()];
        let inv_n = R::of(x.inv_nnei);
        t.a.fill(N::zero());
        for j in (0..n).flat_map(|j| std::iter::repeat_n(j, x.copies(j))) {
            for k in 0..4 {
                let r = x.rhat[4 * j + k].scale(inv_n);
                for (av, &gv) in t.a[k * m..(k + 1) * m]
                    .iter_mut()
                    .zip(&g[j * m..(j + 1) * m])
                {
                    *av += gv * r;
                }
            }
        }
        for c in 0..m {
            for b in 0..self.m2 {
                t.desc[c * self.m2 + b] =
                    (0..4).fold(N::zero(), |s, k| s + t.a[k * m + c] * t.a[k * m + b]);
            }
        }
    }

    /// One centre's backward from D̄ `[M1][M2]` in `t.dbar` after [`AttnOpts::forward`] on the
    /// same inputs: leaves Ḡ⁰, R̄ and σ̄ in `t`, and adds the packed parameter gradient when
    /// asked.
    fn backward<R: Real, N: Num<R>>(
        &self,
        layers: &[LayerParams<'_, R>],
        wt: &[Transposed<R>],
        x: &Centre<N>,
        t: &mut Work<N, R>,
        mut grad: Option<&mut [N]>,
    ) {
        let (m, h, n) = (self.m1, self.h, x.len());
        let m2 = self.m2;
        // Ā[k][c] = Σ_b D̄[c][b] A[k][b] + [c < M2] Σ_c' D̄[c'][c] A[k][c'], + a tensor
        // fitting's ∂L/∂A.
        for k in 0..4 {
            let ak = &t.a[k * m..(k + 1) * m];
            for c in 0..m {
                let row_d = &t.dbar[c * m2..(c + 1) * m2];
                let mut s = dot(row_d, &ak[..m2]);
                if c < m2 {
                    for (cp, &av) in ak.iter().enumerate() {
                        s += t.dbar[cp * m2 + c] * av;
                    }
                }
                t.abar[k * m + c] = s + t.abar_in[k * m + c];
            }
        }
        let inv_n = R::of(x.inv_nnei);
        let gl = &t.g[layers.len()];
        t.gbar.fill(N::zero());
        t.swbar.fill(N::zero());
        t.rdbar.fill(N::zero());
        for j in 0..n {
            let gj = &gl[j * m..(j + 1) * m];
            for k in 0..4 {
                let ab = &t.abar[k * m..(k + 1) * m];
                t.rbar[4 * j + k] = dot(ab, gj).scale(inv_n);
                let r = x.rhat[4 * j + k].scale(inv_n);
                for (gv, &av) in t.gbar[j * m..(j + 1) * m].iter_mut().zip(ab) {
                    *gv += av * r;
                }
            }
        }
        for (l, p) in layers.iter().enumerate().rev() {
            let mut lg = grad.as_deref_mut().map(|g| {
                let len = self.layer_len();
                split_grad(self, &mut g[l * len..(l + 1) * len])
            });
            // Layer norm: x̄ = (w − mean(w) − x̂ mean(x̂ w))/s, w = γ ȳ; the residual passes x̄ on.
            let inv_m = R::of(1.0 / m as f64);
            for (i, (gb, zb)) in t.gbar.chunks_mut(m).zip(t.z.chunks_mut(m)).enumerate() {
                let xh = &t.xhat[l][i * m..(i + 1) * m];
                if let Some(lg) = lg.as_mut() {
                    for _ in 0..x.copies(i) {
                        for c in 0..m {
                            lg.gamma[c] += gb[c] * xh[c];
                            lg.beta[c] += gb[c];
                        }
                    }
                }
                let mut mw = N::zero();
                let mut mxw = N::zero();
                for c in 0..m {
                    let w = gb[c].scale(p.gamma[c]);
                    zb[c] = w;
                    mw += w;
                    mxw += xh[c] * w;
                }
                let (mw, mxw) = (mw.scale(inv_m), mxw.scale(inv_m));
                let sinv = t.sinv[l][i];
                for c in 0..m {
                    zb[c] = (zb[c] - mw - xh[c] * mxw) * sinv;
                    gb[c] = zb[c];
                }
            }
            // z = O W_out + b_out.
            linear_backward(
                &t.o[l],
                &wt[l].w_out,
                h,
                &t.z,
                |i| x.copies(i),
                (&mut t.obar, false),
                lg.as_mut().map(|lg| (&mut *lg.w_out, &mut *lg.b_out)),
                &mut t.gemm,
            );
            // O = A v̂: Ā = Ō v̂ᵀ (v̂ transposed for the GEMM), v̂̄ = Aᵀ Ō.
            let qkv = &t.qkv[l];
            transpose(&qkv[2 * h..], n, h, 3 * h, &mut t.vt);
            let ov = Prod {
                m: n,
                k: h,
                n,
                b_rs: n,
                c_rs: n,
                acc: false,
            };
            let ob = Mat {
                v: &t.obar[..],
                rs: h,
                cs: 1,
            };
            N::gemm(ov, ob, &t.vt, &mut t.nn, &mut t.gemm);
            let to_qkv = |b_rs| Prod {
                m: n,
                k: n,
                n: h,
                b_rs,
                c_rs: 3 * h,
                acc: false,
            };
            let at = Mat {
                v: &t.w[l][..],
                rs: 1,
                cs: n,
            };
            N::gemm(to_qkv(h), at, &t.obar, &mut t.qkvbar[2 * h..], &mut t.gemm);
            self.softmax_backward(x, t, l);
            // q̂_j·k̂_k: q̂̄ = L̄ k̂, k̂̄ = L̄ᵀ q̂.
            let qkv = &t.qkv[l];
            let lb = |rs, cs| Mat {
                v: &t.nn[..],
                rs,
                cs,
            };
            N::gemm(
                to_qkv(3 * h),
                lb(n, 1),
                &qkv[h..],
                &mut t.qkvbar,
                &mut t.gemm,
            );
            N::gemm(
                to_qkv(3 * h),
                lb(1, n),
                qkv,
                &mut t.qkvbar[h..],
                &mut t.gemm,
            );
            if self.normalize {
                let parts = t.qkvbar.chunks_mut(h).zip(qkv.chunks(h));
                for ((yb, y), nr) in parts.zip(t.nrm[l].iter()) {
                    normalize_backward(y, *nr, yb);
                }
            }
            // [q k v] = G W_in + b_in; the residual's x̄ is already in Ḡ.
            linear_backward(
                &t.g[l],
                &wt[l].w_in,
                m,
                &t.qkvbar,
                |i| x.copies(i),
                (&mut t.gbar, true),
                lg.as_mut().map(|lg| (&mut *lg.w_in, &mut *lg.b_in)),
                &mut t.gemm,
            );
        }
        // r̂ = R̂[1:4] / max(|R̂[1:4]|, floor).
        for j in 0..n {
            let rv = &x.rhat[4 * j + 1..4 * j + 4];
            let nr = rv.iter().fold(N::zero(), |s, &v| s + v * v).sqrt();
            let nr = if nr.re() < R::of(NORM_FLOOR) {
                N::of(R::of(NORM_FLOOR))
            } else {
                nr
            };
            let rb = &mut t.rdbar[3 * j..3 * j + 3];
            normalize_backward(&t.rdir[3 * j..3 * j + 3], nr, rb);
            for (rv, &b) in t.rbar[4 * j + 1..4 * j + 4].iter_mut().zip(rb.iter()) {
                *rv += b;
            }
        }
    }
}

/// What every pass reads of the model and the batch.
pub struct AttnIn<'a, T> {
    pub opts: AttnOpts,
    pub layers: &'a [LayerParams<'a, T>],
    /// G⁰ and G⁰' = ∂G⁰/∂ŝ per slot `[nslots][M1]`.
    pub g0: &'a [T],
    pub g0p: &'a [T],
    /// R̂ `[nslots][4]`; σ and dσ/dŝ per slot (0 for padding).
    pub rhat: &'a [T],
    pub sw: &'a [T],
    pub dsw: &'a [T],
    pub owner: &'a [i32],
    /// ∂L/∂A `[ncentres][4][M1]` of a tensor fitting, for the dual reverse.
    pub abar: Option<&'a [T]>,
}

impl<T: Real> AttnIn<'_, T> {
    /// Whether slots `first..end` are padding and copies of slot `first` in everything the
    /// block reads (the tangent `rdot` included).
    fn copies(&self, first: usize, end: usize, rdot: Option<&[T]>) -> bool {
        let m = self.opts.m1;
        let rows: [(&[T], usize); 4] = [
            (self.g0, m),
            (self.g0p, m),
            (self.rhat, 4),
            (rdot.unwrap_or(&[]), 4),
        ];
        let same = |v: &[T], w: usize, j: usize| {
            v.is_empty() || v[j * w..(j + 1) * w] == v[first * w..(first + 1) * w]
        };
        (first + 1..end).all(|j| {
            self.owner[j] < 0
                && self.sw[j] == self.sw[first]
                && self.dsw[j] == self.dsw[first]
                && rows.iter().all(|&(v, w)| same(v, w, j))
        })
    }

    /// A thread's buffers for the passes on numbers N.
    fn work<N: Num<T>>(&self, d: &Dims) -> (Centre<N>, Work<N, T>) {
        (
            Centre::new(),
            Work::new(&self.opts, d.nnei, self.layers.len()),
        )
    }

    /// Each layer's weights transposed, for the backward.
    fn transposed(&self) -> Vec<Transposed<T>> {
        let (m, h3) = (self.opts.m1, 3 * self.opts.h);
        self.layers
            .iter()
            .map(|p| {
                let mut w_in = vec![T::zero(); m * h3];
                transpose(p.w_in, m, h3, h3, &mut w_in);
                let mut w_out = vec![T::zero(); m * self.opts.h];
                transpose(p.w_out, self.opts.h, m, m, &mut w_out);
                Transposed { w_in, w_out }
            })
            .collect()
    }
}

/// Runs `f(buffers, centre, slots, out_row)` for every centre in parallel, `out` holding `width`
/// values per centre, each thread with its own buffers for numbers N.
fn per_centre<T: Real, N: Num<T>>(
    d: &Dims,
    x: &AttnIn<'_, T>,
    out: &mut [T],
    width: usize,
    f: impl Fn(&mut (Centre<N>, Work<N, T>), usize, Range<usize>, &mut [T]) + Sync,
) {
    // A job of at least GRAD_GROUP centres: the buffers are made once per job.
    out.par_chunks_mut(width)
        .enumerate()
        .with_min_len(GRAD_GROUP)
        .for_each_init(|| x.work(d), |w, (c, o)| f(w, c, d.mixed_slots(c), o));
}

/// D `[ncentres][stride]` (its first M1·M2 columns) of every centre, and where asked A
/// `[ncentres][4][M1]`, whose rows 1..3 are the rotation matrix (DeePMD-kit's `gr[..., 1:]`).
pub fn forward<T: Real>(
    d: &Dims,
    x: &AttnIn<'_, T>,
    desc: &mut [T],
    stride: usize,
    rot: Option<&mut [T]>,
) {
    let o = &x.opts;
    let (dw, aw) = (o.m1 * o.m2, 4 * o.m1);
    // With A, a row of D's values and A's each, then split.
    let with_a = rot.is_some();
    let mut both = with_a.then(|| vec![T::zero(); d.ncentres() * (dw + aw)]);
    let (out, width) = match &mut both {
        Some(v) => (&mut v[..], dw + aw),
        None => (&mut desc[..], stride),
    };
    per_centre(d, x, out, width, |(cx, t), _, s, row| {
        cx.load(x, t, s, None);
        o.forward(x.layers, cx, t);
        row[..dw].copy_from_slice(&t.desc);
        if with_a {
            row[dw..].copy_from_slice(&t.a);
        }
    });
    if let (Some(both), Some(rot)) = (both, rot) {
        let rows = both.chunks(dw + aw).zip(desc.chunks_mut(stride));
        for ((row, dc), ra) in rows.zip(rot.chunks_mut(aw)) {
            dc[..dw].copy_from_slice(&row[..dw]);
            ra.copy_from_slice(&row[dw..]);
        }
    }
}

/// Ḋ `[ncentres][stride]` (first M1·M2 columns) for the tangent Ṙ `[nslots][4]` of R̂.
pub fn tangent<T: Real>(d: &Dims, x: &AttnIn<'_, T>, rdot: &[T], ddot: &mut [T], stride: usize) {
    let o = &x.opts;
    per_centre(
        d,
        x,
        ddot,
        stride,
        |(cx, t): &mut (_, Work<Dual<T>, T>), _, s, dc| {
            cx.load(x, t, s, Some(rdot));
            o.forward(x.layers, cx, t);
            for (v, dv) in dc.iter_mut().zip(&t.desc) {
                *v = dv.d;
            }
        },
    );
}

/// q = ∂E/∂r_ij `[nslots][3]` from D̄ `[ncentres][stride]`: the block's R̄ and σ̄, and ŝ̄ through
/// G⁰, back through the environment's Jacobian `jac` `[nslots][4][3]`.
pub fn backward<T: Real>(
    d: &Dims,
    x: &AttnIn<'_, T>,
    jac: &[T],
    dbar: &[T],
    stride: usize,
    q: &mut [T],
) {
    let o = &x.opts;
    let m = o.m1;
    let wt = x.transposed();
    // A centre's slots are the nnei in a row from c·nnei (one mixed section), so q's rows of
    // them are its chunk.
    per_centre(
        d,
        x,
        q,
        3 * d.nnei,
        |(cx, t): &mut (_, Work<T, T>), c, s, qc| {
            debug_assert_eq!(s.start, c * d.nnei, "centre {c}'s slots");
            cx.load(x, t, s.clone(), None);
            o.forward(x.layers, cx, t);
            t.dbar
                .copy_from_slice(&dbar[c * stride..c * stride + m * o.m2]);
            o.backward(x.layers, &wt, cx, t, None);
            // The slots left out are copies of the last slot taken (see Centre).
            for (j, slot) in s.enumerate() {
                let r = cx.taken(j);
                let mut rbar: [T; 4] = std::array::from_fn(|k| t.rbar[4 * r + k]);
                let gp = &x.g0p[slot * m..(slot + 1) * m];
                rbar[0] += dot(&t.gbar[r * m..(r + 1) * m], gp) + t.swbar[r] * x.dsw[slot];
                for a in 0..3 {
                    qc[3 * j + a] = (0..4).fold(T::zero(), |acc, k| {
                        acc + jac[12 * slot + 3 * k + a] * rbar[k]
                    });
                }
            }
        },
    );
}

/// Centres per piece of the parameter gradient's sum: fixed, so the sum's order does not
/// depend on the thread count.
const GRAD_GROUP: usize = 8;

/// The dual reverse from (D̄, Ḋ̄) `[ncentres][stride]` for the tangent Ṙ: Ḡ⁰ and Ġ̄⁰
/// `[nslots][M1]` (written) and the attention layers' packed gradient (returned, in the order of
/// [`LayerParams`], layer after layer).
#[allow(clippy::too_many_arguments)]
pub fn dual<T: Real>(
    d: &Dims,
    x: &AttnIn<'_, T>,
    rdot: &[T],
    dbar: &[T],
    ddotbar: &[T],
    stride: usize,
    g0bar: &mut [T],
    g0dotbar: &mut [T],
) -> Vec<T> {
    let o = &x.opts;
    let m = o.m1;
    let plen = o.layer_len() * x.layers.len();
    let nc = d.ncentres();
    let wt = x.transposed();
    // A group's slots are GRAD_GROUP·nnei in a row (see backward), so Ḡ⁰'s and Ġ̄⁰'s rows of
    // them are its chunks.
    let rows = GRAD_GROUP * d.nnei * m;
    let pieces: Vec<Vec<Dual<T>>> = g0bar
        .par_chunks_mut(rows)
        .zip(g0dotbar.par_chunks_mut(rows))
        .enumerate()
        .map_init(
            || x.work::<Dual<T>>(d),
            |(cx, t), (gi, (gb, gdb))| {
                let mut acc = vec![Dual::default(); plen];
                let first = gi * GRAD_GROUP * d.nnei;
                for c in gi * GRAD_GROUP..((gi + 1) * GRAD_GROUP).min(nc) {
                    let s = d.mixed_slots(c);
                    debug_assert_eq!(s.start, c * d.nnei, "centre {c}'s slots");
                    cx.load(x, t, s.clone(), Some(rdot));
                    o.forward(x.layers, cx, t);
                    // Cotangent Ḋ̄ + ε D̄: the real part of the result is the tangents' adjoint,
                    // the ε part the values' (dual.rs).
                    for (sd, i) in t.dbar.iter_mut().zip(c * stride..) {
                        *sd = Dual::new(ddotbar[i], dbar[i]);
                    }
                    if let Some(ab) = x.abar {
                        let am = 4 * m;
                        for (sa, &v) in t.abar_in.iter_mut().zip(&ab[c * am..(c + 1) * am]) {
                            *sa = Dual::new(T::zero(), v);
                        }
                    }
                    o.backward(x.layers, &wt, cx, t, Some(&mut acc));
                    // The slots left out are copies of the last slot taken (see Centre).
                    let at = (s.start - first) * m..(s.end - first) * m;
                    let rows = gb[at.clone()].chunks_mut(m).zip(gdb[at].chunks_mut(m));
                    for (j, (b, db)) in rows.enumerate() {
                        let v = &t.gbar[cx.taken(j) * m..][..m];
                        for ((b, db), v) in b.iter_mut().zip(db).zip(v) {
                            *b = v.d;
                            *db = v.v;
                        }
                    }
                }
                acc
            },
        )
        .collect();
    let mut grad = vec![T::zero(); plen];
    for acc in pieces {
        for (g, a) in grad.iter_mut().zip(acc) {
            *g += a.d;
        }
    }
    grad
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small random instance: 3 centres of 6 slots, M1 4, M2 2, H 3, two layers. Padding:
    /// centre 0's last three slots (copies of one, as the batch has them: the block leaves two
    /// out), centre 1's second and last, all of centre 2's.
    struct Case {
        d: Dims,
        opts: AttnOpts,
        params: Vec<f64>,
        g0: Vec<f64>,
        g0p: Vec<f64>,
        rhat: Vec<f64>,
        sw: Vec<f64>,
        dsw: Vec<f64>,
        owner: Vec<i32>,
        jac: Vec<f64>,
        u: Vec<f64>,
        dbar: Vec<f64>,
        ddotbar: Vec<f64>,
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
            (0..n).map(|_| scale * self.next()).collect()
        }
    }

    const LAYERS: usize = 2;
    /// The padding slots that are copies of the one before them.
    const COPIES: [usize; 7] = [4, 5, 13, 14, 15, 16, 17];

    fn case(smooth: bool, normalize: bool, dotr: bool) -> Case {
        let (nc, n, m1, m2, h) = (3, 6, 4, 2, 3);
        let d = Dims::new(1, &[nc], &[n], m1, m2);
        let opts = AttnOpts {
            m1,
            m2,
            h,
            alpha: 0.7,
            normalize,
            smooth,
            dotr,
            ln_eps: 1e-3,
            trainable_ln: true,
        };
        let mut r = Rng(7);
        let ns = nc * n;
        let owner: Vec<i32> = (0..ns)
            .map(|s| {
                if matches!(s, 3..=5 | 7 | 11 | 12..) {
                    -1
                } else {
                    0
                }
            })
            .collect();
        let real = |s: usize| owner[s] >= 0;
        let mut params = r.vec(opts.layer_len() * LAYERS, 0.6);
        // γ near 1.
        for l in 0..LAYERS {
            let at = l * opts.layer_len() + opts.layer_len() - 2 * m1;
            for v in &mut params[at..at + m1] {
                *v += 1.0;
            }
        }
        let mut rhat = r.vec(4 * ns, 0.8);
        let mut sw: Vec<f64> = (0..ns).map(|_| 0.5 + 0.4 * r.next()).collect();
        let mut dsw = r.vec(ns, 0.5);
        let mut jac = r.vec(12 * ns, 0.5);
        for s in (0..ns).filter(|&s| !real(s)) {
            rhat[4 * s..4 * s + 4].copy_from_slice(&[-0.3, 0.0, 0.0, 0.0]);
            sw[s] = 0.0;
            dsw[s] = 0.0;
            jac[12 * s..12 * s + 12].fill(0.0);
        }
        let (mut g0, mut g0p) = (r.vec(ns * m1, 0.9), r.vec(ns * m1, 0.9));
        for s in COPIES {
            for g in [&mut g0, &mut g0p] {
                g.copy_within((s - 1) * m1..s * m1, s * m1);
            }
        }
        Case {
            params,
            g0,
            g0p,
            rhat,
            sw,
            dsw,
            jac,
            u: r.vec(3 * ns, 1.0),
            dbar: r.vec(nc * m1 * m2, 1.0),
            ddotbar: r.vec(nc * m1 * m2, 1.0),
            owner,
            d,
            opts,
        }
    }

    fn layers<'a>(o: &AttnOpts, p: &'a [f64]) -> Vec<LayerParams<'a, f64>> {
        p.chunks(o.layer_len())
            .map(|l| LayerParams::packed(o, l))
            .collect()
    }

    impl Case {
        fn input<'a>(&'a self, l: &'a [LayerParams<'a, f64>]) -> AttnIn<'a, f64> {
            AttnIn {
                opts: self.opts,
                layers: l,
                g0: &self.g0,
                g0p: &self.g0p,
                rhat: &self.rhat,
                sw: &self.sw,
                dsw: &self.dsw,
                owner: &self.owner,
                abar: None,
            }
        }

        fn width(&self) -> usize {
            self.opts.m1 * self.opts.m2
        }

        fn desc(&self) -> Vec<f64> {
            let l = layers(&self.opts, &self.params);
            let mut out = vec![0.0; self.d.ncentres() * self.width()];
            forward(&self.d, &self.input(&l), &mut out, self.width(), None);
            out
        }

        /// Ṙ = J u per slot.
        fn rdot(&self) -> Vec<f64> {
            (0..self.d.nslots())
                .flat_map(|s| {
                    (0..4).map(move |k| {
                        (0..3)
                            .map(|a| self.jac[12 * s + 3 * k + a] * self.u[3 * s + a])
                            .sum::<f64>()
                    })
                })
                .collect()
        }

        fn ddot(&self) -> Vec<f64> {
            let l = layers(&self.opts, &self.params);
            let mut out = vec![0.0; self.d.ncentres() * self.width()];
            tangent(
                &self.d,
                &self.input(&l),
                &self.rdot(),
                &mut out,
                self.width(),
            );
            out
        }

        /// The inputs moved by h along the tangent (each depends linearly on it).
        fn moved(&self, h: f64) -> Case {
            let rdot = self.rdot();
            let m = self.opts.m1;
            let mut c = case(self.opts.smooth, self.opts.normalize, self.opts.dotr);
            c.params = self.params.clone();
            for i in 0..c.g0.len() {
                c.g0[i] += h * self.g0p[i] * rdot[4 * (i / m)];
            }
            for (r, rd) in c.rhat.iter_mut().zip(&rdot) {
                *r += h * rd;
            }
            for j in 0..c.sw.len() {
                c.sw[j] += h * self.dsw[j] * rdot[4 * j];
            }
            c
        }

        /// ⟨D̄, D⟩ + ⟨Ḋ̄, Ḋ⟩: what the dual differentiates.
        fn objective(&self) -> f64 {
            dotf(&self.dbar, &self.desc()) + dotf(&self.ddotbar, &self.ddot())
        }
    }

    fn dotf(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn close(a: f64, b: f64, scale: f64, what: &str) {
        assert!(
            (a - b).abs() <= 1e-7 * scale.max(1.0),
            "{what}: {a} vs {b} (diff {:e})",
            (a - b).abs()
        );
    }

    fn options() -> Vec<(bool, bool, bool)> {
        vec![
            (true, true, true),
            (false, true, true),
            (true, false, false),
            (false, false, true),
        ]
    }

    /// Every pass's results with the padding's copies left out, and with them in (a copy that
    /// differs in dσ/dŝ, which the padding's zero tangent never reads), to the bit.
    #[test]
    fn padding_left_out_changes_no_bit() {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let passes = |c: &Case| {
            let l = layers(&c.opts, &c.params);
            let ns = c.d.nslots();
            let mut q = vec![0.0; 3 * ns];
            backward(&c.d, &c.input(&l), &c.jac, &c.dbar, c.width(), &mut q);
            let (mut gb, mut gdb) = (vec![0.0; ns * c.opts.m1], vec![0.0; ns * c.opts.m1]);
            let x = c.input(&l);
            let (rdot, w) = (c.rdot(), c.width());
            let grad = dual(&c.d, &x, &rdot, &c.dbar, &c.ddotbar, w, &mut gb, &mut gdb);
            [c.desc(), c.ddot(), q, gb, gdb, grad].map(|v| bits(&v))
        };
        for (smooth, normalize, dotr) in options() {
            let c = case(smooth, normalize, dotr);
            let mut dense = case(smooth, normalize, dotr);
            for s in [5, 17] {
                dense.dsw[s] = 0.25;
            }
            assert_eq!(passes(&c), passes(&dense));
        }
    }

    #[test]
    fn tangent_is_the_derivative_of_forward() {
        for (smooth, normalize, dotr) in options() {
            let c = case(smooth, normalize, dotr);
            let h = 1e-5;
            let (p, m) = (c.moved(h).desc(), c.moved(-h).desc());
            let t = c.ddot();
            for i in 0..t.len() {
                close(t[i], (p[i] - m[i]) / (2.0 * h), 1.0, "Ḋ");
            }
            assert!(t.iter().any(|v| v.abs() > 1e-3));
        }
    }

    #[test]
    fn backward_is_the_adjoint_of_tangent() {
        for (smooth, normalize, dotr) in options() {
            let c = case(smooth, normalize, dotr);
            let l = layers(&c.opts, &c.params);
            let mut q = vec![0.0; 3 * c.d.nslots()];
            backward(&c.d, &c.input(&l), &c.jac, &c.dbar, c.width(), &mut q);
            let lhs = dotf(&q, &c.u);
            let rhs = dotf(&c.dbar, &c.ddot());
            close(lhs, rhs, rhs.abs(), "⟨q, u⟩ vs ⟨D̄, Ḋ⟩");
        }
    }

    #[test]
    fn dual_is_the_gradient_of_the_pair() {
        for (smooth, normalize, dotr) in options() {
            let c = case(smooth, normalize, dotr);
            let l = layers(&c.opts, &c.params);
            let ns = c.d.nslots();
            let m = c.opts.m1;
            let (mut gb, mut gdb) = (vec![0.0; ns * m], vec![0.0; ns * m]);
            let grad = dual(
                &c.d,
                &c.input(&l),
                &c.rdot(),
                &c.dbar,
                &c.ddotbar,
                c.width(),
                &mut gb,
                &mut gdb,
            );
            let h = 1e-5;
            let fd = |f: &dyn Fn(&mut Case, f64)| {
                let (mut p, mut q) = (case(smooth, normalize, dotr), case(smooth, normalize, dotr));
                f(&mut p, h);
                f(&mut q, -h);
                (p.objective() - q.objective()) / (2.0 * h)
            };
            for (i, &g) in grad.iter().enumerate() {
                let want = fd(&|c, h| c.params[i] += h);
                close(g, want, 1.0, &format!("θ̄[{i}]"));
            }
            let rdot = c.rdot();
            for i in 0..ns * m {
                let want = fd(&|c, h| c.g0[i] += h);
                close(gb[i], want, 1.0, &format!("Ḡ⁰[{i}]"));
                let sdot = rdot[4 * (i / m)];
                if sdot.abs() > 1e-3 {
                    let want = fd(&|c, h| c.g0p[i] += h) / sdot;
                    close(gdb[i], want, 1.0 / sdot.abs(), &format!("Ġ̄⁰[{i}]"));
                }
            }
            assert!(grad.iter().any(|v| v.abs() > 1e-3));
        }
    }
}

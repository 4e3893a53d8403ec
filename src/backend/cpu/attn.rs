//! DPA-1's block per centre (docs/design.md §11.1 steps 5–6): from the embedding G⁰ of the
//! centre's nnei slots through the attention layers to the contraction and D = A A<ᵀ.
//!
//! One generic forward and one generic backward over [`Num`]: on reals they are the forward and
//! the force pass (D̄ → q); on [`Dual`] numbers the forward is the tangent pass (Ḋ) and the
//! backward the dual reverse (θ̄, Ḡ⁰, Ġ̄⁰), so the second derivatives of the softmax, the
//! normalisations and the layer norm come from the same code as the first. Everything a pass
//! needs is recomputed per centre from G⁰ (nothing nnei² is kept between passes).

use std::ops::Range;

use rayon::prelude::*;

use super::dual::{Dual, Num};
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

/// What one centre's forward keeps for its backward.
struct Tape<N> {
    /// Per layer: its input G `[n][M1]`, q̂k̂v̂ `[n][3H]` and their norms `[n][3]`, the attention
    /// output O `[n][H]`, the layer norm's x̂ `[n][M1]` and 1/s `[n]`.
    g: Vec<Vec<N>>,
    qkv: Vec<Vec<N>>,
    nrm: Vec<Vec<N>>,
    o: Vec<Vec<N>>,
    xhat: Vec<Vec<N>>,
    sinv: Vec<Vec<N>>,
    /// The last layer's output, r̂ `[n][3]`, A `[4][M1]`.
    gl: Vec<N>,
    rdir: Vec<N>,
    a: Vec<N>,
    /// Scratch for one row of the attention weights.
    row: Row<N>,
}

impl<N: Copy> Tape<N> {
    fn new(o: &AttnOpts, n: usize, nlayers: usize, zero: N) -> Self {
        let per = |w: usize| vec![vec![zero; n * w]; nlayers];
        Tape {
            g: per(o.m1),
            qkv: per(3 * o.h),
            nrm: per(3),
            o: per(o.h),
            xhat: per(o.m1),
            sinv: per(1),
            gl: vec![zero; n * o.m1],
            rdir: vec![zero; 3 * n],
            a: vec![zero; 4 * o.m1],
            row: Row::new(n, zero),
        }
    }
}

/// One centre's inputs: its n slots' G⁰ `[n][M1]`, R̂ `[n][4]`, switch σ `[n]` and whether each
/// slot holds a neighbour.
struct Centre<'a, N> {
    g0: &'a [N],
    rhat: &'a [N],
    sw: &'a [N],
    real: &'a [bool],
}

/// out = x W (+ b): x `[n][k]`, W `[k][c]`.
fn linear<R: Real, N: Num<R>>(x: &[N], w: &[R], b: &[R], k: usize, out: &mut [N]) {
    let c = b.len();
    for (xi, oi) in x.chunks(k).zip(out.chunks_mut(c)) {
        for (o, &bv) in oi.iter_mut().zip(b) {
            *o = N::of(bv);
        }
        for (kk, &xv) in xi.iter().enumerate() {
            for (o, &wv) in oi.iter_mut().zip(&w[kk * c..(kk + 1) * c]) {
                *o += xv.scale(wv);
            }
        }
    }
}

/// Adjoint of [`linear`]: x̄ += ȳ Wᵀ; W̄ += xᵀȳ and b̄ += Σ ȳ when asked.
fn linear_backward<R: Real, N: Num<R>>(
    x: &[N],
    w: &[R],
    k: usize,
    ybar: &[N],
    xbar: &mut [N],
    wb: Option<(&mut [N], &mut [N])>,
) {
    let c = ybar.len() / (x.len() / k);
    for (yi, xi) in ybar.chunks(c).zip(xbar.chunks_mut(k)) {
        for (kk, xv) in xi.iter_mut().enumerate() {
            for (&y, &wv) in yi.iter().zip(&w[kk * c..(kk + 1) * c]) {
                *xv += y.scale(wv);
            }
        }
    }
    if let Some((wbar, bbar)) = wb {
        for (yi, xi) in ybar.chunks(c).zip(x.chunks(k)) {
            for (kk, &xv) in xi.iter().enumerate() {
                for (wv, &y) in wbar[kk * c..(kk + 1) * c].iter_mut().zip(yi) {
                    *wv += xv * y;
                }
            }
            for (bv, &y) in bbar.iter_mut().zip(yi) {
                *bv += y;
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

/// Row j of the attention weights: the logits L_jk, the softmax P_jk and the weights A_jk of
/// every slot k (zero where k takes no part), C_jk = r̂_j·r̂_k when attn_dotr.
struct Row<N> {
    l: Vec<N>,
    p: Vec<N>,
    c: Vec<N>,
    a: Vec<N>,
}

impl<N: Copy> Row<N> {
    fn new(n: usize, zero: N) -> Self {
        Row {
            l: vec![zero; n],
            p: vec![zero; n],
            c: vec![zero; n],
            a: vec![zero; n],
        }
    }
}

impl AttnOpts {
    /// Whether row j attends at all (not smooth: padding rows are zero).
    fn row_on(&self, x: &Centre<'_, impl Copy>, j: usize) -> bool {
        self.smooth || x.real[j]
    }

    /// Whether slot k enters row j's softmax (not smooth: only neighbours).
    fn col_on(&self, x: &Centre<'_, impl Copy>, k: usize) -> bool {
        self.smooth || x.real[k]
    }

    /// Fills `r` for row j from q̂k̂ `[n][3H]` (DeePMD-kit's GatedAttentionLayer).
    fn row<R: Real, N: Num<R>>(
        &self,
        x: &Centre<'_, N>,
        qkv: &[N],
        rdir: &[N],
        j: usize,
        r: &mut Row<N>,
    ) {
        let (h, n) = (self.h, x.sw.len());
        let q = &qkv[3 * h * j..3 * h * j + h];
        let alpha = R::of(self.alpha);
        let shift = N::of(R::of(SHIFT));
        let mut mx = R::neg_infinity();
        for k in 0..n {
            if !self.col_on(x, k) {
                continue;
            }
            let kk = &qkv[3 * h * k + h..3 * h * k + 2 * h];
            let l = dot(q, kk).scale(alpha);
            r.l[k] = l;
            let lp = if self.smooth {
                (l + shift) * x.sw[j] * x.sw[k] - shift
            } else {
                l
            };
            r.p[k] = lp;
            mx = mx.max(lp.re());
        }
        let mut sum = N::zero();
        for k in 0..n {
            if self.col_on(x, k) {
                r.p[k] = (r.p[k] - N::of(mx)).exp();
                sum += r.p[k];
            } else {
                r.p[k] = N::zero();
            }
        }
        for k in 0..n {
            r.p[k] = r.p[k] / sum;
            let m = if self.smooth {
                r.p[k] * x.sw[j] * x.sw[k]
            } else {
                r.p[k]
            };
            r.a[k] = if self.dotr {
                r.c[k] = dot(&rdir[3 * j..3 * j + 3], &rdir[3 * k..3 * k + 3]);
                m * r.c[k]
            } else {
                m
            };
        }
    }

    /// One centre's forward; leaves D `[M1][M2]` in `desc` and everything else on the tape.
    fn forward<R: Real, N: Num<R>>(
        &self,
        layers: &[LayerParams<'_, R>],
        x: &Centre<'_, N>,
        t: &mut Tape<N>,
        desc: &mut [N],
    ) {
        let (m, h, n) = (self.m1, self.h, x.sw.len());
        for j in 0..n {
            let rd = &mut t.rdir[3 * j..3 * j + 3];
            rd.copy_from_slice(&x.rhat[4 * j + 1..4 * j + 4]);
            normalize(rd);
        }
        let mut g = x.g0.to_vec();
        for (l, p) in layers.iter().enumerate() {
            t.g[l].copy_from_slice(&g);
            let qkv = &mut t.qkv[l];
            linear(&g, p.w_in, p.b_in, m, qkv);
            if self.normalize {
                for (row, nr) in qkv.chunks_mut(3 * h).zip(t.nrm[l].chunks_mut(3)) {
                    for (part, nv) in row.chunks_mut(h).zip(nr.iter_mut()) {
                        *nv = normalize(part);
                    }
                }
            }
            let o = &mut t.o[l];
            o.fill(N::zero());
            for j in 0..n {
                if !self.row_on(x, j) {
                    continue;
                }
                self.row(x, qkv, &t.rdir, j, &mut t.row);
                let oj = &mut o[h * j..h * (j + 1)];
                for k in 0..n {
                    let a = t.row.a[k];
                    for (ov, &v) in oj.iter_mut().zip(&qkv[3 * h * k + 2 * h..3 * h * (k + 1)]) {
                        *ov += a * v;
                    }
                }
            }
            let mut z = vec![N::zero(); n * m];
            linear(o, p.w_out, p.b_out, h, &mut z);
            for (i, ((gi, zi), xh)) in g
                .chunks_mut(m)
                .zip(z.chunks(m))
                .zip(t.xhat[l].chunks_mut(m))
                .enumerate()
            {
                let inv_m = R::of(1.0 / m as f64);
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
                for (c, (gv, xv)) in gi.iter_mut().zip(xh.iter_mut()).enumerate() {
                    *xv *= sinv;
                    *gv = xv.scale(p.gamma[c]) + N::of(p.beta[c]);
                }
            }
        }
        t.gl.copy_from_slice(&g);
        // A[k][c] = (1/n) Σ_j G[j][c] R̂[j][k]; D[c][b] = Σ_k A[k][c] A[k][b], b < M2.
        let inv_n = R::of(1.0 / n as f64);
        t.a.fill(N::zero());
        for j in 0..n {
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
                desc[c * self.m2 + b] =
                    (0..4).fold(N::zero(), |s, k| s + t.a[k * m + c] * t.a[k * m + b]);
            }
        }
    }

    /// One centre's backward from D̄ `[M1][M2]` after [`AttnOpts::forward`] on the same inputs:
    /// Ḡ⁰ `[n][M1]`, R̄ `[n][4]` and σ̄ `[n]` (written), the packed parameter gradient (added)
    /// when asked.
    fn backward<R: Real, N: Num<R>>(
        &self,
        layers: &[LayerParams<'_, R>],
        x: &Centre<'_, N>,
        t: &mut Tape<N>,
        dbar: &[N],
        (g0bar, rbar, swbar): (&mut [N], &mut [N], &mut [N]),
        mut grad: Option<&mut [N]>,
    ) {
        let (m, h, n) = (self.m1, self.h, x.sw.len());
        let m2 = self.m2;
        // Ā[k][c] = Σ_b D̄[c][b] A[k][b] + [c < M2] Σ_c' D̄[c'][c] A[k][c'].
        let mut abar = vec![N::zero(); 4 * m];
        for k in 0..4 {
            let ak = &t.a[k * m..(k + 1) * m];
            for c in 0..m {
                let row_d = &dbar[c * m2..(c + 1) * m2];
                let mut s = dot(row_d, &ak[..m2]);
                if c < m2 {
                    for (cp, &av) in ak.iter().enumerate() {
                        s += dbar[cp * m2 + c] * av;
                    }
                }
                abar[k * m + c] = s;
            }
        }
        let inv_n = R::of(1.0 / n as f64);
        let mut gbar = vec![N::zero(); n * m];
        rbar.fill(N::zero());
        swbar.fill(N::zero());
        for j in 0..n {
            let gj = &t.gl[j * m..(j + 1) * m];
            for k in 0..4 {
                let ab = &abar[k * m..(k + 1) * m];
                rbar[4 * j + k] = dot(ab, gj).scale(inv_n);
                let r = x.rhat[4 * j + k].scale(inv_n);
                for (gv, &av) in gbar[j * m..(j + 1) * m].iter_mut().zip(ab) {
                    *gv += av * r;
                }
            }
        }
        let mut rdbar = vec![N::zero(); 3 * n];
        for (l, p) in layers.iter().enumerate().rev() {
            let mut lg = grad.as_deref_mut().map(|g| {
                let len = self.layer_len();
                split_grad(self, &mut g[l * len..(l + 1) * len])
            });
            // Layer norm: x̄ = (w − mean(w) − x̂ mean(x̂ w))/s, w = γ ȳ; the residual passes x̄ on.
            let inv_m = R::of(1.0 / m as f64);
            let mut zbar = vec![N::zero(); n * m];
            for (i, (gb, zb)) in gbar.chunks_mut(m).zip(zbar.chunks_mut(m)).enumerate() {
                let xh = &t.xhat[l][i * m..(i + 1) * m];
                if let Some(lg) = lg.as_mut() {
                    for c in 0..m {
                        lg.gamma[c] += gb[c] * xh[c];
                        lg.beta[c] += gb[c];
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
            let o = &t.o[l];
            let mut obar = vec![N::zero(); n * h];
            linear_backward(
                o,
                p.w_out,
                h,
                &zbar,
                &mut obar,
                lg.as_mut().map(|lg| (&mut *lg.w_out, &mut *lg.b_out)),
            );
            // The attention weights, row by row.
            let qkv = &t.qkv[l];
            let mut qkvbar = vec![N::zero(); n * 3 * h];
            let alpha = R::of(self.alpha);
            let shift = N::of(R::of(SHIFT));
            for j in 0..n {
                if !self.row_on(x, j) {
                    continue;
                }
                self.row(x, qkv, &t.rdir, j, &mut t.row);
                let ob = &obar[h * j..h * (j + 1)];
                // Ā_jk = ō_j·v̂_k, v̂̄_k += A_jk ō_j, then through C, S, the softmax, the logits.
                let mut pdot = N::zero();
                let mut pbar = vec![N::zero(); n];
                for k in 0..n {
                    if !self.col_on(x, k) {
                        continue;
                    }
                    let vk = &qkv[3 * h * k + 2 * h..3 * h * (k + 1)];
                    let ab = dot(ob, vk);
                    for (vb, &ov) in qkvbar[3 * h * k + 2 * h..3 * h * (k + 1)]
                        .iter_mut()
                        .zip(ob)
                    {
                        *vb += t.row.a[k] * ov;
                    }
                    let mbar = if self.dotr {
                        let m_jk = if self.smooth {
                            t.row.p[k] * x.sw[j] * x.sw[k]
                        } else {
                            t.row.p[k]
                        };
                        let cbar = ab * m_jk;
                        for a in 0..3 {
                            rdbar[3 * j + a] += cbar * t.rdir[3 * k + a];
                            rdbar[3 * k + a] += cbar * t.rdir[3 * j + a];
                        }
                        ab * t.row.c[k]
                    } else {
                        ab
                    };
                    pbar[k] = if self.smooth {
                        let mp = mbar * t.row.p[k];
                        swbar[j] += mp * x.sw[k];
                        swbar[k] += mp * x.sw[j];
                        mbar * x.sw[j] * x.sw[k]
                    } else {
                        mbar
                    };
                    pdot += t.row.p[k] * pbar[k];
                }
                let q = 3 * h * j;
                for k in 0..n {
                    if !self.col_on(x, k) {
                        continue;
                    }
                    let lpbar = t.row.p[k] * (pbar[k] - pdot);
                    let lbar = if self.smooth {
                        let e = lpbar * (t.row.l[k] + shift);
                        swbar[j] += e * x.sw[k];
                        swbar[k] += e * x.sw[j];
                        lpbar * x.sw[j] * x.sw[k]
                    } else {
                        lpbar
                    }
                    .scale(alpha);
                    for c in 0..h {
                        let (qv, kv) = (qkv[q + c], qkv[3 * h * k + h + c]);
                        qkvbar[q + c] += lbar * kv;
                        qkvbar[3 * h * k + h + c] += lbar * qv;
                    }
                }
            }
            if self.normalize {
                for ((yb, y), nr) in qkvbar.chunks_mut(h).zip(qkv.chunks(h)).zip(t.nrm[l].iter()) {
                    normalize_backward(y, *nr, yb);
                }
            }
            // [q k v] = G W_in + b_in; the residual's x̄ is already in Ḡ.
            linear_backward(
                &t.g[l],
                p.w_in,
                m,
                &qkvbar,
                &mut gbar,
                lg.as_mut().map(|lg| (&mut *lg.w_in, &mut *lg.b_in)),
            );
        }
        g0bar.copy_from_slice(&gbar);
        // r̂ = R̂[1:4] / max(|R̂[1:4]|, floor).
        for j in 0..n {
            let rv = &x.rhat[4 * j + 1..4 * j + 4];
            let nr = rv.iter().fold(N::zero(), |s, &v| s + v * v).sqrt();
            let nr = if nr.re() < R::of(NORM_FLOOR) {
                N::of(R::of(NORM_FLOOR))
            } else {
                nr
            };
            let rb = &mut rdbar[3 * j..3 * j + 3];
            normalize_backward(&t.rdir[3 * j..3 * j + 3], nr, rb);
            for a in 0..3 {
                rbar[4 * j + 1 + a] += rb[a];
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
}

/// Runs `f(c, slots, out_rows)` for every centre in parallel, `out` holding `width` values per
/// centre.
fn per_centre<T: Send>(
    d: &Dims,
    out: &mut [T],
    width: usize,
    f: impl Fn(usize, Range<usize>, &mut [T]) + Sync,
) {
    out.par_chunks_mut(width)
        .enumerate()
        .for_each(|(c, o)| f(c, d.mixed_slots(c), o));
}

impl<T: Real> AttnIn<'_, T> {
    fn real(&self, s: Range<usize>) -> Vec<bool> {
        self.owner[s].iter().map(|&o| o >= 0).collect()
    }
}

/// D `[ncentres][stride]` (its first M1·M2 columns) of every centre.
pub fn forward<T: Real>(d: &Dims, x: &AttnIn<'_, T>, desc: &mut [T], stride: usize) {
    let o = &x.opts;
    per_centre(d, desc, stride, |_, s, dc| {
        let n = s.len();
        let real = x.real(s.clone());
        let cx = Centre {
            g0: &x.g0[s.start * o.m1..s.end * o.m1],
            rhat: &x.rhat[4 * s.start..4 * s.end],
            sw: &x.sw[s.clone()],
            real: &real,
        };
        let mut t = Tape::new(o, n, x.layers.len(), T::zero());
        o.forward(x.layers, &cx, &mut t, &mut dc[..o.m1 * o.m2]);
    });
}

/// The inputs of centre c's slots `s` as dual numbers: G⁰ + ε G⁰'ṡ, R̂ + ε Ṙ, σ + ε σ'ṡ.
fn dual_inputs<T: Real>(x: &AttnIn<'_, T>, s: Range<usize>, rdot: &[T]) -> DualInputs<T> {
    let m = x.opts.m1;
    let g0 = (s.start * m..s.end * m)
        .map(|i| Dual::new(x.g0[i], x.g0p[i] * rdot[4 * (i / m)]))
        .collect();
    let rhat = (4 * s.start..4 * s.end)
        .map(|i| Dual::new(x.rhat[i], rdot[i]))
        .collect();
    let sw = s
        .clone()
        .map(|j| Dual::new(x.sw[j], x.dsw[j] * rdot[4 * j]))
        .collect();
    DualInputs { g0, rhat, sw }
}

/// One centre's G⁰, R̂ and σ as dual numbers.
struct DualInputs<T> {
    g0: Vec<Dual<T>>,
    rhat: Vec<Dual<T>>,
    sw: Vec<Dual<T>>,
}

/// Ḋ `[ncentres][stride]` (first M1·M2 columns) for the tangent Ṙ `[nslots][4]` of R̂.
pub fn tangent<T: Real>(d: &Dims, x: &AttnIn<'_, T>, rdot: &[T], ddot: &mut [T], stride: usize) {
    let o = &x.opts;
    per_centre(d, ddot, stride, |_, s, dc| {
        let n = s.len();
        let real = x.real(s.clone());
        let di = dual_inputs(x, s, rdot);
        let cx = Centre {
            g0: &di.g0,
            rhat: &di.rhat,
            sw: &di.sw,
            real: &real,
        };
        let z = Dual::default();
        let mut t = Tape::new(o, n, x.layers.len(), z);
        let mut out = vec![z; o.m1 * o.m2];
        o.forward(x.layers, &cx, &mut t, &mut out);
        for (v, dv) in dc.iter_mut().zip(&out) {
            *v = dv.d;
        }
    });
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
    let per: Vec<(Range<usize>, Vec<T>)> = (0..d.ncentres())
        .into_par_iter()
        .map(|c| {
            let s = d.mixed_slots(c);
            let n = s.len();
            let real = x.real(s.clone());
            let cx = Centre {
                g0: &x.g0[s.start * m..s.end * m],
                rhat: &x.rhat[4 * s.start..4 * s.end],
                sw: &x.sw[s.clone()],
                real: &real,
            };
            let mut t = Tape::new(o, n, x.layers.len(), T::zero());
            let mut dc = vec![T::zero(); m * o.m2];
            o.forward(x.layers, &cx, &mut t, &mut dc);
            let (mut g0bar, mut rbar, mut swbar) = (
                vec![T::zero(); n * m],
                vec![T::zero(); 4 * n],
                vec![T::zero(); n],
            );
            let seed = &dbar[c * stride..c * stride + m * o.m2];
            let bars = (&mut g0bar[..], &mut rbar[..], &mut swbar[..]);
            o.backward(x.layers, &cx, &mut t, seed, bars, None);
            let mut qc = vec![T::zero(); 3 * n];
            for (j, slot) in s.clone().enumerate() {
                let gp = &x.g0p[slot * m..(slot + 1) * m];
                rbar[4 * j] += dot(&g0bar[j * m..(j + 1) * m], gp) + swbar[j] * x.dsw[slot];
                for a in 0..3 {
                    qc[3 * j + a] = (0..4).fold(T::zero(), |acc, k| {
                        acc + jac[12 * slot + 3 * k + a] * rbar[4 * j + k]
                    });
                }
            }
            (s, qc)
        })
        .collect();
    for (s, qc) in per {
        q[3 * s.start..3 * s.end].copy_from_slice(&qc);
    }
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
    type Piece<T> = (Vec<Dual<T>>, Vec<(Range<usize>, Vec<Dual<T>>)>);
    let pieces: Vec<Piece<T>> = (0..nc.div_ceil(GRAD_GROUP))
        .into_par_iter()
        .map(|gi| {
            let z = Dual::default();
            let mut acc = vec![z; plen];
            let mut rows = Vec::new();
            for c in gi * GRAD_GROUP..((gi + 1) * GRAD_GROUP).min(nc) {
                let s = d.mixed_slots(c);
                let n = s.len();
                let real = x.real(s.clone());
                let di = dual_inputs(x, s.clone(), rdot);
                let cx = Centre {
                    g0: &di.g0,
                    rhat: &di.rhat,
                    sw: &di.sw,
                    real: &real,
                };
                let mut t = Tape::new(o, n, x.layers.len(), z);
                let mut dc = vec![z; m * o.m2];
                o.forward(x.layers, &cx, &mut t, &mut dc);
                // Cotangent Ḋ̄ + ε D̄: the real part of the result is the tangents' adjoint,
                // the ε part the values' (dual.rs).
                let seed: Vec<Dual<T>> = (c * stride..c * stride + m * o.m2)
                    .map(|i| Dual::new(ddotbar[i], dbar[i]))
                    .collect();
                let (mut gb, mut rb, mut sb) = (vec![z; n * m], vec![z; 4 * n], vec![z; n]);
                let bars = (&mut gb[..], &mut rb[..], &mut sb[..]);
                o.backward(x.layers, &cx, &mut t, &seed, bars, Some(&mut acc));
                rows.push((s, gb));
            }
            (acc, rows)
        })
        .collect();
    let mut grad = vec![T::zero(); plen];
    for (acc, rows) in pieces {
        for (g, a) in grad.iter_mut().zip(acc) {
            *g += a.d;
        }
        for (s, gb) in rows {
            for (i, v) in (s.start * m..s.end * m).zip(gb) {
                g0bar[i] = v.d;
                g0dotbar[i] = v.v;
            }
        }
    }
    grad
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small random instance: 2 centres of 5 slots (the last two of centre 0 and the last of
    /// centre 1 padding), M1 4, M2 2, H 3, two layers.
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

    fn case(smooth: bool, normalize: bool, dotr: bool) -> Case {
        let (nc, n, m1, m2, h) = (2, 5, 4, 2, 3);
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
            .map(|s| if s == 3 || s == 4 || s == 9 { -1 } else { 0 })
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
        Case {
            params,
            g0: r.vec(ns * m1, 0.9),
            g0p: r.vec(ns * m1, 0.9),
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
            }
        }

        fn width(&self) -> usize {
            self.opts.m1 * self.opts.m2
        }

        fn desc(&self) -> Vec<f64> {
            let l = layers(&self.opts, &self.params);
            let mut out = vec![0.0; self.d.ncentres() * self.width()];
            forward(&self.d, &self.input(&l), &mut out, self.width());
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

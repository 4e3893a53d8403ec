//! DPA-3's RepFlow block on the host (docs/deepmd-spec.md §18): the geometry of every slot,
//! the initial node, edge and angle features, and the layers passing messages between them,
//! written once as a forward and a backward over numbers (`Num`), so that the tangent (forward
//! on duals) and the dual reverse (backward on duals) are derived, not written (dual.rs).
//!
//! Node features live per centre (a batch's centres are its atoms); a layer reads a neighbour's
//! features from its owner's row (spec §18.7), so its backward scatters the neighbours' adjoints
//! back to their owners, in slot order (the same bits on any thread count).

use rayon::prelude::*;

use super::act::{cst, eval3_slice};
use super::block_in::BlockIn;
use super::dual::{Dual, Num};
use super::gemm::{transpose, Mat, Prod};
use super::zeroed::{zeroed_with, zeros};
use crate::backend::keep::Keep;
use crate::backend::{Dims, Real};
use crate::model::dpa3::{Dpa3Layout, RepflowLayerLayout, UpdateStyle};
use crate::model::Activation;
use crate::model::{DescriptorSpec, Layer};

/// How the angle messages narrow the node and edge (`a_compress_rate`, `a_compress_use_split`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compress {
    None,
    Linear,
    Split,
}

/// The block's widths and constants, one per model.
#[derive(Clone, Debug, PartialEq)]
pub struct RepflowOpts {
    pub nt: usize,
    /// N, E, A_d, S (e_sel), A (a_sel), M (axis_neuron), H (heads), N_c, E_c.
    pub n: usize,
    pub e: usize,
    pub ad: usize,
    pub s: usize,
    pub a: usize,
    pub m: usize,
    pub h: usize,
    pub nc: usize,
    pub ec: usize,
    pub e_rcut: f64,
    pub e_rcut_smth: f64,
    pub a_rcut: f64,
    pub a_rcut_smth: f64,
    pub protection: f64,
    pub exp_switch: bool,
    pub edge_init_use_dist: bool,
    pub update_angle: bool,
    pub smooth_edge_update: bool,
    pub concat_output_tebd: bool,
    pub compress: Compress,
    pub act: Activation,
    pub style: UpdateStyle,
    /// DeePMD-kit's `sequential_update`: each message of a layer reads the latest features.
    pub sequential: bool,
    /// G's 1/√S, the node's edge message's 1/S and the angle message's 1/√A (with dynamic sel,
    /// S/F and A/F in their place: spec §18.6).
    pub g_scale: f64,
    pub u3_scale: f64,
    pub rho_scale: f64,
    /// `[nt][nt]`: whether edges between the two types are removed.
    pub exclude: Vec<bool>,
    /// Whether the block gives the rotation matrix after D (a tensor fitting reads it).
    pub rot: bool,
}

impl RepflowOpts {
    pub fn new(d: &DescriptorSpec, nt: usize, rot: bool) -> Self {
        let c = d.own.dpa3().expect("a DPA-3 spec");
        let n = d.m1();
        let (nc, ec) = c.compressed(n);
        let f = if c.use_dynamic_sel {
            c.sel_reduce_factor
        } else {
            1.0
        };
        let (s, a) = (d.sel[0], c.a_sel);
        RepflowOpts {
            nt,
            n,
            e: c.e_dim,
            ad: c.a_dim,
            s,
            a,
            m: c.axis_neuron,
            h: c.n_multi_edge_message,
            nc,
            ec,
            e_rcut: d.rcut,
            e_rcut_smth: d.rcut_smth,
            a_rcut: c.a_rcut,
            a_rcut_smth: c.a_rcut_smth,
            protection: d.env_protection,
            exp_switch: c.use_exp_switch,
            edge_init_use_dist: c.edge_init_use_dist,
            update_angle: c.update_angle,
            smooth_edge_update: c.smooth_edge_update,
            concat_output_tebd: c.concat_output_tebd,
            compress: match (c.a_compress_rate, c.a_compress_use_split) {
                (0, _) => Compress::None,
                (_, false) => Compress::Linear,
                (_, true) => Compress::Split,
            },
            act: c.activation,
            style: c.update_style,
            sequential: c.sequential_update,
            g_scale: 1.0 / (s as f64 / f).sqrt(),
            u3_scale: f / s as f64,
            rho_scale: 1.0 / (a as f64 / f).sqrt(),
            exclude: (0..nt * nt).map(|k| c.excludes(k / nt, k % nt)).collect(),
            rot,
        }
    }

    /// D's width: N, or 2N with the type embedding appended.
    pub fn width(&self) -> usize {
        self.n * if self.concat_output_tebd { 2 } else { 1 }
    }
}

/// What every pass reads: the model and the batch (davg, dstd `[nt][4]`).
pub type RepflowIn<'a, T> = BlockIn<'a, RepflowOpts, Dpa3Layout, T>;

/// φ(x) on numbers.
fn act<T: Real, N: Num<T>>(a: Activation, x: N) -> N {
    x.apply(|v| {
        let (y, dy, _) = a.eval3(v);
        (y, dy)
    })
}

/// φ'(x) on numbers (its own tangent φ''·ẋ, for the dual reverse).
fn act_slope<T: Real, N: Num<T>>(a: Activation, x: N) -> N {
    x.apply(|v| {
        let (_, dy, d2y) = a.eval3(v);
        (dy, d2y)
    })
}

/// φ and φ' of a layer's pre-activations, evaluated once in the forward for the outputs and
/// the backward (the activation's exp was a fifth of the step when each use evaluated it).
#[derive(Default)]
struct Acts<T, N> {
    f: Vec<N>,
    s: Vec<N>,
    work: Vec<T>,
}

impl<T: Real, N: Num<T>> Acts<T, N> {
    /// Of `z`'s rows of `width` for which `live(row)`; the others' are zero. All rows in one
    /// call, the others zeroed after: the exp's vector loop wants long slices.
    fn of(&mut self, a: Activation, z: &[N], width: usize, live: impl Fn(usize) -> bool) {
        resized(&mut self.f, z.len(), N::zero());
        resized(&mut self.s, z.len(), N::zero());
        N::apply2_slice(
            z,
            &mut self.f,
            &mut self.s,
            &mut self.work,
            |x, y, dy, d2y| eval3_slice(a, x, y, dy, d2y),
        );
        let rows = self.f.chunks_mut(width).zip(self.s.chunks_mut(width));
        for (_, (f, s)) in rows.enumerate().filter(|&(r, _)| !live(r)) {
            f.fill(N::zero());
            s.fill(N::zero());
        }
    }
    fn f(&self, r: std::ops::Range<usize>) -> &[N] {
        &self.f[r]
    }
}

/// A switch's value, slope and curvature at r: the quintic between rs and rc, or the
/// exponential one centred at rs (spec §18.2).
pub(super) fn switch3<T: Real>(exp: bool, rs: f64, rc: f64, r: T) -> (T, T, T) {
    let (rs_t, rc_t, one, z) = (cst::<T>(rs), cst::<T>(rc), T::one(), T::zero());
    if exp {
        if r <= z || r >= rc_t {
            let rr = r.max(z).min(rc_t);
            let s = (-(cst::<T>(20.0) * (rr - rs_t) / rs_t).exp()).exp();
            return (s, z, z);
        }
        let k = cst::<T>(20.0) / rs_t;
        let ea = (k * (r - rs_t)).exp();
        let s = (-ea).exp();
        return (s, -k * ea * s, -k * k * ea * s * (one - ea));
    }
    if r < rs_t {
        return (one, z, z);
    }
    if r >= rc_t {
        return (z, z, z);
    }
    let w = rc_t - rs_t;
    let u = (r - rs_t) / w;
    let u2 = u * u;
    (
        u2 * u * (cst::<T>(-6.0) * u2 + cst::<T>(15.0) * u - cst::<T>(10.0)) + one,
        u2 * (cst::<T>(-30.0) * u2 + cst::<T>(60.0) * u - cst::<T>(30.0)) / w,
        u * (cst::<T>(-120.0) * u2 + cst::<T>(180.0) * u - cst::<T>(60.0)) / (w * w),
    )
}

fn switch<T: Real, N: Num<T>>(exp: bool, rs: f64, rc: f64, r: N) -> N {
    r.apply(|v| {
        let (s, ds, _) = switch3(exp, rs, rc, v);
        (s, ds)
    })
}

fn switch_slope<T: Real, N: Num<T>>(exp: bool, rs: f64, rc: f64, r: N) -> N {
    r.apply(|v| {
        let (_, ds, d2s) = switch3(exp, rs, rc, v);
        (ds, d2s)
    })
}

/// The κ = 1 − 1e-6 of the cosine and the 1e-6 of the unit vector (spec §18.2).
pub(super) const COS_SHRINK: f64 = 1.0 - 1e-6;
pub(super) const UNIT_EPS: f64 = 1e-6;

/// The geometry of every slot, from r_ij.
struct Geo<N> {
    real: Vec<bool>,
    /// In the angle list (j < A, real, r < a_rcut); per slot, false beyond A.
    am: Vec<bool>,
    /// r_ij `[nslots][3]` and r.
    rv: Vec<N>,
    r: Vec<N>,
    sw: Vec<N>,
    /// R̂[0] and R̂[1..4] `[nslots][3]`.
    x: Vec<N>,
    h: Vec<N>,
    asw: Vec<N>,
    /// û `[nslots][3]`.
    u: Vec<N>,
}

/// y = x·W (+ b), W `[x.len()][y.len()]` row-major with rows `stride` apart.
fn mv<T: Real, N: Num<T>>(x: &[N], w: &[T], stride: usize, b: Option<&[T]>, y: &mut [N]) {
    match b {
        Some(b) => y.iter_mut().zip(b).for_each(|(y, &b)| *y = N::of(b)),
        None => y.fill(N::zero()),
    }
    mv_acc(x, w, stride, y);
}

/// y += x·W.
fn mv_acc<T: Real, N: Num<T>>(x: &[N], w: &[T], stride: usize, y: &mut [N]) {
    for (i, &xi) in x.iter().enumerate() {
        let row = &w[i * stride..i * stride + y.len()];
        for (y, &wv) in y.iter_mut().zip(row) {
            *y += xi.scale(wv);
        }
    }
}

/// x̄ += ȳ·Wᵀ.
fn mtv_acc<T: Real, N: Num<T>>(ybar: &[N], w: &[T], stride: usize, xbar: &mut [N]) {
    for (i, xb) in xbar.iter_mut().enumerate() {
        let row = &w[i * stride..i * stride + ybar.len()];
        let mut acc = N::zero();
        for (&yb, &wv) in ybar.iter().zip(row) {
            acc += yb.scale(wv);
        }
        *xb += acc;
    }
}

/// G += x ⊗ ȳ (rows `stride` apart).
fn outer_acc<N: Copy + std::ops::AddAssign + std::ops::Mul<Output = N>>(
    x: &[N],
    ybar: &[N],
    stride: usize,
    g: &mut [N],
) {
    for (i, &xi) in x.iter().enumerate() {
        for (gv, &yb) in g[i * stride..i * stride + ybar.len()].iter_mut().zip(ybar) {
            *gv += xi * yb;
        }
    }
}

fn add<N: Copy + std::ops::AddAssign>(y: &mut [N], x: &[N]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += x);
}

/// A block of a layer's weights: `[k][nout]` from the start of the slice, rows `rs` apart.
type Rows<'w, T> = (&'w [T], usize);

/// Y (+)= X·W for all of Y's rows at once (gemm.rs's kernel): X `[m][k]` and Y `[m][nout]`.
/// The per-slot and per-angle linears of a centre are one product each, not m of them.
fn mm<T: Real, N: Num<T>>(
    x: &[N],
    k: usize,
    (w, rs): Rows<'_, T>,
    y: &mut [N],
    nout: usize,
    acc: bool,
    sc: &mut Scratch<T>,
) {
    let p = Prod {
        m: y.len() / nout,
        k,
        n: nout,
        b_rs: rs,
        c_rs: nout,
        acc,
    };
    N::gemm_r(p, Mat { v: x, rs: k, cs: 1 }, w, y, &mut sc.gemm);
}

/// X̄ += Ȳ·Wᵀ for all rows at once: Ȳ `[m][nout]`, X̄ `[m][k]` (Wᵀ copied out, as the kernel
/// reads B's rows in place).
fn mm_t<T: Real, N: Num<T>>(
    ybar: &[N],
    nout: usize,
    (w, rs): Rows<'_, T>,
    xbar: &mut [N],
    k: usize,
    sc: &mut Scratch<T>,
) {
    sc.wt.resize(k * nout, T::zero());
    transpose(w, k, nout, rs, &mut sc.wt);
    let p = Prod {
        m: xbar.len() / k,
        k: nout,
        n: k,
        b_rs: k,
        c_rs: k,
        acc: true,
    };
    let a = Mat {
        v: ybar,
        rs: nout,
        cs: 1,
    };
    N::gemm_r(p, a, &sc.wt, xbar, &mut sc.gemm);
}

/// Scratch of the products: a dual product's parts, and a transposed block of weights.
#[derive(Default)]
struct Scratch<T> {
    gemm: Vec<T>,
    wt: Vec<T>,
}

/// A linear layer's weights, its bias and the row stride of its weights.
fn wb<'p, T>(p: &'p [T], l: &Layer) -> (&'p [T], &'p [T]) {
    (&p[l.w..l.w + l.nin * l.nout], &p[l.b..l.b + l.nout])
}

/// The parameter gradient of one layer (offsets relative to its start) or of the initial
/// features, as numbers.
struct Grad<'g, N> {
    g: &'g mut [N],
    base: usize,
}

impl<N: Copy + std::ops::AddAssign + std::ops::Mul<Output = N>> Grad<'_, N> {
    fn at(&mut self, off: usize, len: usize) -> &mut [N] {
        &mut self.g[off - self.base..off - self.base + len]
    }
    fn outer(&mut self, l: &Layer, row0: usize, x: &[N], ybar: &[N]) {
        let w = self.at(l.w + row0 * l.nout, x.len() * l.nout);
        outer_acc(x, ybar, l.nout, w);
    }
    fn bias(&mut self, l: &Layer, ybar: &[N]) {
        add(self.at(l.b, l.nout), ybar);
    }
}

impl<N> Grad<'_, N> {
    /// The rows `row0..row0 + k` of l's weight gradient += Xᵀ·Ȳ over all rows of X `[m][k]`
    /// and Ȳ `[m][nout]`.
    fn outer_rows<T: Real>(
        &mut self,
        l: &Layer,
        row0: usize,
        (x, k): (&[N], usize),
        ybar: &[N],
        gemm: &mut Vec<T>,
    ) where
        N: Num<T>,
    {
        let p = Prod {
            m: k,
            k: ybar.len() / l.nout,
            n: l.nout,
            b_rs: l.nout,
            c_rs: l.nout,
            acc: true,
        };
        let off = l.w + row0 * l.nout - self.base;
        let g = &mut self.g[off..off + k * l.nout];
        N::gemm_grad(p, Mat { v: x, rs: 1, cs: k }, ybar, g, gemm);
    }
}

/// One centre's buffers in a layer: its inputs, the intermediates its backward reads, and
/// their adjoints.
#[derive(Default)]
struct Work<T, N> {
    sc: Scratch<T>,
    ni: Vec<N>,
    nj: Vec<N>,
    ej: Vec<N>,
    aa: Vec<N>,
    z1: Vec<N>,
    /// φ and φ' of z1 … z7.
    f1: Acts<T, N>,
    f2: Acts<T, N>,
    f3: Acts<T, N>,
    f4: Acts<T, N>,
    f5: Acts<T, N>,
    f6: Acts<T, N>,
    f7: Acts<T, N>,
    hge: Vec<N>,
    hgn: Vec<N>,
    sym: Vec<N>,
    z2: Vec<N>,
    pre3: Vec<N>,
    z3: Vec<N>,
    pre4: Vec<N>,
    z4: Vec<N>,
    nt: Vec<N>,
    et: Vec<N>,
    /// ẽ_j·W for linear1 and angle_self's j and k rows, the node's part with bias.
    pn5: Vec<N>,
    pn6: Vec<N>,
    ek5: Vec<N>,
    ej5: Vec<N>,
    ek6: Vec<N>,
    ej6: Vec<N>,
    z5: Vec<N>,
    z6: Vec<N>,
    rho: Vec<N>,
    z7: Vec<N>,
    /// The sequential update's edges after the edge's own message and after its angle
    /// message, and angles after their own message.
    es1: Vec<N>,
    eu: Vec<N>,
    au: Vec<N>,
    // Adjoints.
    bni: Vec<N>,
    bnj: Vec<N>,
    bej: Vec<N>,
    baa: Vec<N>,
    tmp: Vec<N>,
    bsym: Vec<N>,
    bhge: Vec<N>,
    bhgn: Vec<N>,
    bz3: Vec<N>,
    bz4: Vec<N>,
    bz5: Vec<N>,
    bz6: Vec<N>,
    brho: Vec<N>,
    bz7: Vec<N>,
    bnt: Vec<N>,
    bet: Vec<N>,
    beu: Vec<N>,
    bes1: Vec<N>,
    bau: Vec<N>,
    /// v̄¹ and v̄², `[2][S][E]`.
    bv: Vec<N>,
}

fn sized<N: Copy>(v: &mut Vec<N>, len: usize, zero: N) {
    v.clear();
    v.resize(len, zero);
}

/// [`sized`] without the zeroing, for a buffer the caller writes whole next (an `mv`, an `mm`
/// that does not accumulate): zeroing per-centre buffers was a tenth of a DPA-3 step.
fn resized<N: Copy>(v: &mut Vec<N>, len: usize, zero: N) {
    v.resize(len, zero);
}

/// z_jk += p + k-row_k + j-row_j (rows of `p.len()`) for the angle pairs q = j·A + k where
/// `pair(q)`; the other pairs' rows zeroed.
fn pair_sum<N: Copy + std::ops::AddAssign + std::ops::Add<Output = N> + Default>(
    z: &mut [N],
    p: &[N],
    k_rows: &[N],
    j_rows: &[N],
    a: usize,
    pair: impl Fn(usize) -> bool,
) {
    let w = p.len();
    for (q, row) in z.chunks_mut(w).enumerate() {
        if !pair(q) {
            row.fill(N::default());
            continue;
        }
        let (j, k) = (q / a, q % a);
        for (i, zv) in row.iter_mut().enumerate() {
            *zv += p[i] + k_rows[k * w + i] + j_rows[j * w + i];
        }
    }
}

/// Everything a layer reads of the batch besides the features.
struct Ctx<'a, T, N> {
    x: &'a RepflowIn<'a, T>,
    d: &'a Dims,
    geo: &'a Geo<N>,
    /// The centre owning each slot's neighbour, or −1.
    owner_c: &'a [i32],
    /// Every centre's node features through the neighbour rows of u³'s and v¹'s linears
    /// `[nc][H·N + E]` ([`RepflowIn::neighbour_parts`]): a slot reads its owner's row.
    nei: &'a [N],
}

/// The update of x by `u` (spec §18.4): res_avg, res_incr, or res_residual with the layer's
/// vectors `res`.
fn update<T: Real, N: Num<T>>(style: UpdateStyle, p: &[T], res: &[usize], x: &mut [N], u: &[&[N]]) {
    let k = u.len() as f64;
    match style {
        UpdateStyle::ResAvg => {
            let s = cst::<T>(1.0 / (k + 1.0).sqrt());
            for (i, xv) in x.iter_mut().enumerate() {
                let sum = u.iter().fold(*xv, |a, um| a + um[i]);
                *xv = sum.scale(s);
            }
        }
        UpdateStyle::ResIncr => {
            let s = cst::<T>(1.0 / k.sqrt());
            for (i, xv) in x.iter_mut().enumerate() {
                let sum = u.iter().fold(N::zero(), |a, um| a + um[i]);
                *xv += sum.scale(s);
            }
        }
        UpdateStyle::ResResidual => {
            for (m, um) in u.iter().enumerate() {
                let r = &p[res[m]..res[m] + x.len()];
                for ((xv, &uv), &rv) in x.iter_mut().zip(um.iter()).zip(r) {
                    *xv += uv.scale(rv);
                }
            }
        }
    }
}

/// The adjoints of [`update`]: x̄ (scaled in place from ȳ) and ū_m into `ubar[m]` (written);
/// the residual vectors' gradient into `g`.
#[allow(clippy::too_many_arguments)]
fn update_backward<T: Real, N: Num<T>>(
    style: UpdateStyle,
    p: &[T],
    res: &[usize],
    ybar: &[N],
    u: &[&[N]],
    ubar: &mut [&mut [N]],
    xbar: &mut [N],
    g: Option<&mut Grad<'_, N>>,
) {
    let k = u.len() as f64;
    match style {
        UpdateStyle::ResAvg => {
            let s = cst::<T>(1.0 / (k + 1.0).sqrt());
            for (i, &yb) in ybar.iter().enumerate() {
                xbar[i] += yb.scale(s);
                for um in ubar.iter_mut() {
                    um[i] = yb.scale(s);
                }
            }
        }
        UpdateStyle::ResIncr => {
            let s = cst::<T>(1.0 / k.sqrt());
            for (i, &yb) in ybar.iter().enumerate() {
                xbar[i] += yb;
                for um in ubar.iter_mut() {
                    um[i] = yb.scale(s);
                }
            }
        }
        UpdateStyle::ResResidual => {
            add(xbar, ybar);
            for (m, um) in ubar.iter_mut().enumerate() {
                let r = &p[res[m]..res[m] + ybar.len()];
                for ((ub, &yb), &rv) in um.iter_mut().zip(ybar).zip(r) {
                    *ub = yb.scale(rv);
                }
            }
            if let Some(g) = g {
                for (m, um) in u.iter().enumerate() {
                    let gr = g.at(res[m], ybar.len());
                    for ((gv, &yb), &uv) in gr.iter_mut().zip(ybar).zip(um.iter()) {
                        *gv += yb * uv;
                    }
                }
            }
        }
    }
}

impl<'a, T: Real, N: Num<T>> Ctx<'a, T, N> {
    fn o(&self) -> &RepflowOpts {
        self.x.o
    }

    /// Loads centre c's inputs of a layer into `w` and computes its intermediates. Every
    /// message reads the layer's inputs; in DeePMD-kit's sequential update each reads the
    /// latest features instead (spec §18.5): the edge's own message gives `es1`, the angle's
    /// own message `au`, the edge's angle message (read on `es1` and `au`) `eu`, and the node's
    /// messages read `eu`.
    fn forward(
        &self,
        ll: &RepflowLayerLayout,
        c: usize,
        nodes: &[N],
        edges: &[N],
        angles: &[N],
        w: &mut Work<T, N>,
    ) {
        let o = self.o();
        let p = self.x.params;
        let (n, e, s, a, ad) = (o.n, o.e, o.s, o.a, o.ad);
        let s0 = self.d.mixed_slots(c).start;
        let z = N::zero();
        w.ni.clear();
        w.ni.extend_from_slice(&nodes[c * n..(c + 1) * n]);
        resized(&mut w.nj, s * n, z);
        self.owner_rows(c, (nodes, n), 0..n, &mut w.nj);
        w.ej.clear();
        w.ej.extend_from_slice(&edges[s0 * e..(s0 + s) * e]);
        w.aa.clear();
        w.aa.extend_from_slice(&angles[c * a * a * ad..(c + 1) * a * a * ad]);
        // u¹: the node's own message.
        let (wn, bn) = wb(p, &ll.node_self);
        resized(&mut w.z1, n, z);
        mv(&w.ni, wn, n, Some(bn), &mut w.z1);
        w.f1.of(o.act, &w.z1, n, |_| true);
        if !o.sequential {
            self.node_sym(ll, c, w);
            self.node_edge(ll, c, w);
            self.edge_self(ll, c, w);
            self.angle(ll, c, w);
            return;
        }
        self.edge_self(ll, c, w);
        w.es1.clone_from(&w.ej);
        self.edge_step(c, &ll.e_residual[..1], &w.f4.f, &mut w.es1);
        self.angle(ll, c, w);
        w.eu.clone_from(&w.es1);
        self.edge_step(c, &ll.e_residual[1..], &w.f7.f, &mut w.eu);
        self.node_sym(ll, c, w);
        self.node_edge(ll, c, w);
    }

    /// x += r·v on every real slot's edge: one step of the sequential update.
    fn edge_step(&self, c: usize, res: &[usize], v: &[N], x: &mut [N]) {
        let o = self.o();
        let (e, s0) = (o.e, self.d.mixed_slots(c).start);
        for j in (0..o.s).filter(|&j| self.geo.real[s0 + j]) {
            let r = j * e..(j + 1) * e;
            update(o.style, self.x.params, res, &mut x[r.clone()], &[&v[r]]);
        }
    }

    /// u²: the symmetrisation of the edges and of the neighbours' nodes.
    fn node_sym(&self, ll: &RepflowLayerLayout, c: usize, w: &mut Work<T, N>) {
        let o = self.o();
        let (n, e, s) = (o.n, o.e, o.s);
        let s0 = self.d.mixed_slots(c).start;
        let g = self.geo;
        let z = N::zero();
        sized(&mut w.hge, 3 * e, z);
        sized(&mut w.hgn, 3 * n, z);
        let ej = if o.sequential { &w.eu } else { &w.ej };
        for j in 0..s {
            let sl = s0 + j;
            if !g.real[sl] {
                continue;
            }
            let f = g.sw[sl].scale(cst(o.g_scale));
            for k in 0..3 {
                let hf = g.h[3 * sl + k] * f;
                for (hv, &ev) in w.hge[k * e..(k + 1) * e].iter_mut().zip(&ej[j * e..]) {
                    *hv += hf * ev;
                }
                for (hv, &nv) in w.hgn[k * n..(k + 1) * n].iter_mut().zip(&w.nj[j * n..]) {
                    *hv += hf * nv;
                }
            }
        }
        resized(&mut w.sym, o.m * (e + n), z);
        let third = cst::<T>(1.0 / 3.0);
        let (ge, gn) = w.sym.split_at_mut(o.m * e);
        for (hg, width, out) in [(&w.hge, e, ge), (&w.hgn, n, gn)] {
            for mm in 0..o.m {
                for dd in 0..width {
                    let v = (0..3).fold(N::zero(), |acc, k| {
                        acc + hg[k * width + mm] * hg[k * width + dd]
                    });
                    out[mm * width + dd] = v.scale(third);
                }
            }
        }
        let (ws, bs) = wb(self.x.params, &ll.node_sym);
        resized(&mut w.z2, n, z);
        mv(&w.sym, ws, n, Some(bs), &mut w.z2);
        w.f2.of(o.act, &w.z2, n, |_| true);
    }

    /// u³'s per-edge messages over [n_i, n_j, e_ij], the centre's row once.
    fn node_edge(&self, ll: &RepflowLayerLayout, c: usize, w: &mut Work<T, N>) {
        let o = self.o();
        let (n, e, s, hn) = (o.n, o.e, o.s, o.h * o.n);
        let s0 = self.d.mixed_slots(c).start;
        let (we3, b3) = wb(self.x.params, &ll.node_edge);
        resized(&mut w.pre3, hn, N::zero());
        mv(&w.ni, we3, hn, Some(b3), &mut w.pre3);
        resized(&mut w.z3, s * hn, N::zero());
        self.owner_rows(c, (self.nei, hn + e), 0..hn, &mut w.z3);
        let ej = if o.sequential { &w.eu } else { &w.ej };
        mm(
            ej,
            e,
            (&we3[2 * n * hn..], hn),
            &mut w.z3,
            hn,
            true,
            &mut w.sc,
        );
        self.per_real_slot(c, &w.pre3, &mut w.z3);
        let real = |j: usize| self.geo.real[s0 + j];
        w.f3.of(o.act, &w.z3, hn, real);
    }

    /// v¹: the edge's own message over [n_i, n_j, e_ij].
    fn edge_self(&self, ll: &RepflowLayerLayout, c: usize, w: &mut Work<T, N>) {
        let o = self.o();
        let (n, e, s) = (o.n, o.e, o.s);
        let s0 = self.d.mixed_slots(c).start;
        let (we4, b4) = wb(self.x.params, &ll.edge_self);
        resized(&mut w.pre4, e, N::zero());
        mv(&w.ni, we4, e, Some(b4), &mut w.pre4);
        resized(&mut w.z4, s * e, N::zero());
        let hn = o.h * n;
        self.owner_rows(c, (self.nei, hn + e), hn..hn + e, &mut w.z4);
        mm(
            &w.ej,
            e,
            (&we4[2 * n * e..], e),
            &mut w.z4,
            e,
            true,
            &mut w.sc,
        );
        self.per_real_slot(c, &w.pre4, &mut w.z4);
        let real = |j: usize| self.geo.real[s0 + j];
        w.f4.of(o.act, &w.z4, e, real);
    }

    /// Each slot's row of z from its owner's columns `cols` of a per-centre array `[nc][width]`
    /// (the nodes, or the neighbour parts `nei`), zero where the slot is not real.
    fn owner_rows(
        &self,
        c: usize,
        (src, width): (&[N], usize),
        cols: std::ops::Range<usize>,
        z: &mut [N],
    ) {
        let s0 = self.d.mixed_slots(c).start;
        for (j, row) in z.chunks_mut(cols.len()).enumerate() {
            match usize::try_from(self.owner_c[s0 + j]) {
                Ok(oc) if self.geo.real[s0 + j] => {
                    row.copy_from_slice(&src[oc * width..][cols.clone()]);
                }
                _ => row.fill(N::zero()),
            }
        }
    }

    /// The centre's part `pre` added to each real slot's row of z; the others' rows zeroed.
    fn per_real_slot(&self, c: usize, pre: &[N], z: &mut [N]) {
        let s0 = self.d.mixed_slots(c).start;
        for (j, row) in z.chunks_mut(pre.len()).enumerate() {
            if self.geo.real[s0 + j] {
                add(row, pre);
            } else {
                row.fill(N::zero());
            }
        }
    }

    /// The angle branch: compressed node and edges, the angle's own message b = φ(z6) and the
    /// edge's angle message v² = φ(z7) from the angle pairs' φ(z5).
    fn angle(&self, ll: &RepflowLayerLayout, c: usize, w: &mut Work<T, N>) {
        let Some(al) = &ll.angle else { return };
        let o = self.o();
        let p = self.x.params;
        let (n, e, s, a, ad) = (o.n, o.e, o.s, o.a, o.ad);
        let s0 = self.d.mixed_slots(c).start;
        let g = self.geo;
        let z = N::zero();
        let (nc, ec) = (o.nc, o.ec);
        let edges = if o.sequential { &w.es1 } else { &w.ej };
        resized(&mut w.nt, nc, z);
        sized(&mut w.et, a * ec, z);
        match o.compress {
            Compress::None => w.nt.copy_from_slice(&w.ni),
            Compress::Split => w.nt.copy_from_slice(&w.ni[..nc]),
            Compress::Linear => {
                let cw = al.compress_n.expect("a linear compression");
                mv(&w.ni, &p[cw..cw + n * nc], nc, None, &mut w.nt);
            }
        }
        for j in 0..a {
            if !g.am[s0 + j] {
                continue;
            }
            let (src, dst) = (&edges[j * e..(j + 1) * e], &mut w.et[j * ec..(j + 1) * ec]);
            match o.compress {
                Compress::None | Compress::Split => dst.copy_from_slice(&src[..ec]),
                Compress::Linear => {
                    let cw = al.compress_e.expect("a linear compression");
                    mv(src, &p[cw..cw + e * ec], ec, None, dst);
                }
            }
        }
        let (w5, b5) = wb(p, &al.edge_angle1);
        let (w6, b6) = wb(p, &al.angle_self);
        // The rows of the info's blocks in the weights: a, ñ, ẽ_k, ẽ_j.
        let (ra, rn, rk, rj) = (0, ad, ad + nc, ad + nc + ec);
        resized(&mut w.pn5, e, z);
        mv(&w.nt, &w5[rn * e..], e, Some(b5), &mut w.pn5);
        resized(&mut w.pn6, ad, z);
        mv(&w.nt, &w6[rn * ad..], ad, Some(b6), &mut w.pn6);
        // ẽ's rows of the slots out of the angle list are zero, and so are their products.
        resized(&mut w.ek5, a * e, z);
        resized(&mut w.ej5, a * e, z);
        resized(&mut w.ek6, a * ad, z);
        resized(&mut w.ej6, a * ad, z);
        let sc = &mut w.sc;
        mm(&w.et, ec, (&w5[rk * e..], e), &mut w.ek5, e, false, sc);
        mm(&w.et, ec, (&w5[rj * e..], e), &mut w.ej5, e, false, sc);
        mm(&w.et, ec, (&w6[rk * ad..], ad), &mut w.ek6, ad, false, sc);
        mm(&w.et, ec, (&w6[rj * ad..], ad), &mut w.ej6, ad, false, sc);
        let pair = |q: usize| g.am[s0 + q / a] && g.am[s0 + q % a];
        // The angle's own message first: the sequential update's edge message reads its update.
        resized(&mut w.z6, a * a * ad, z);
        mm(&w.aa, ad, (&w6[ra * ad..], ad), &mut w.z6, ad, false, sc);
        pair_sum(&mut w.z6, &w.pn6, &w.ek6, &w.ej6, a, pair);
        w.f6.of(o.act, &w.z6, ad, pair);
        let angles = if o.sequential {
            w.au.clone_from(&w.aa);
            for q in (0..a * a).filter(|&q| pair(q)) {
                let r = q * ad..(q + 1) * ad;
                update(
                    o.style,
                    p,
                    &ll.a_residual,
                    &mut w.au[r.clone()],
                    &[w.f6.f(r)],
                );
            }
            &w.au
        } else {
            &w.aa
        };
        resized(&mut w.z5, a * a * e, z);
        mm(
            angles,
            ad,
            (&w5[ra * e..], e),
            &mut w.z5,
            e,
            false,
            &mut w.sc,
        );
        pair_sum(&mut w.z5, &w.pn5, &w.ek5, &w.ej5, a, pair);
        w.f5.of(o.act, &w.z5, e, pair);
        // ρ: the angle messages summed over k, or the edge itself where j is not an angle slot.
        sized(&mut w.rho, s * e, z);
        let rs = cst::<T>(o.rho_scale);
        for j in 0..s {
            let sl = s0 + j;
            if !g.real[sl] {
                continue;
            }
            let rho = &mut w.rho[j * e..(j + 1) * e];
            if j < a && g.am[sl] {
                for k in 0..a {
                    if !g.am[s0 + k] {
                        continue;
                    }
                    let f = (g.asw[sl] * g.asw[s0 + k]).scale(rs);
                    let q = j * a + k;
                    for (rv, &pv) in rho.iter_mut().zip(w.f5.f(q * e..(q + 1) * e)) {
                        *rv += f * pv;
                    }
                }
            } else if !o.smooth_edge_update {
                rho.copy_from_slice(&edges[j * e..(j + 1) * e]);
            }
        }
        let (w7, b7) = wb(p, &al.edge_angle2);
        resized(&mut w.z7, s * e, z);
        mm(&w.rho, e, (w7, e), &mut w.z7, e, false, &mut w.sc);
        for j in 0..s {
            let z7 = &mut w.z7[j * e..(j + 1) * e];
            if g.real[s0 + j] {
                z7.iter_mut().zip(b7).for_each(|(v, &b)| *v += N::of(b));
            } else {
                z7.fill(z);
            }
        }
        w.f7.of(o.act, &w.z7, e, |j| g.real[s0 + j]);
    }

    /// The node's messages u¹ = φ(z1), u² = φ(z2) and u³ = (Σ_j φ(z3_j)·sw_j)/S (all heads,
    /// `[H·N]`) from `w` (after [`Ctx::forward`]): the update reads them, and its backward.
    fn node_messages(&self, c: usize, w: &Work<T, N>) -> [Vec<N>; 3] {
        let o = self.o();
        let hn = o.h * o.n;
        let s0 = self.d.mixed_slots(c).start;
        let g = self.geo;
        let mut u3 = vec![N::zero(); hn];
        for j in (0..o.s).filter(|j| g.real[s0 + j]) {
            for (uv, &pv) in u3.iter_mut().zip(w.f3.f(j * hn..(j + 1) * hn)) {
                *uv += pv * g.sw[s0 + j];
            }
        }
        let u3s = cst::<T>(o.u3_scale);
        u3.iter_mut().for_each(|v| *v = v.scale(u3s));
        [w.f1.f.clone(), w.f2.f.clone(), u3]
    }

    /// Centre c's outputs of the layer from `w` (after [`Ctx::forward`]).
    fn outputs(
        &self,
        ll: &RepflowLayerLayout,
        c: usize,
        w: &Work<T, N>,
        n_out: &mut [N],
        e_out: &mut [N],
        a_out: &mut [N],
    ) {
        let o = self.o();
        let p = self.x.params;
        let (n, e, s, a, ad) = (o.n, o.e, o.s, o.a, o.ad);
        let s0 = self.d.mixed_slots(c).start;
        let g = self.geo;
        let [u1, u2, u3] = self.node_messages(c, w);
        let mut list: Vec<&[N]> = vec![&u1, &u2];
        list.extend(u3.chunks(n));
        n_out.copy_from_slice(&w.ni);
        update(o.style, p, &ll.n_residual, n_out, &list);
        e_out.copy_from_slice(&w.ej);
        for j in 0..s {
            if !g.real[s0 + j] {
                continue;
            }
            let v1 = w.f4.f(j * e..(j + 1) * e);
            let ev = &mut e_out[j * e..(j + 1) * e];
            if o.update_angle {
                let v2 = w.f7.f(j * e..(j + 1) * e);
                update(o.style, p, &ll.e_residual, ev, &[v1, v2]);
            } else {
                update(o.style, p, &ll.e_residual, ev, &[v1]);
            }
        }
        a_out.copy_from_slice(&w.aa);
        if !o.update_angle {
            return;
        }
        for j in 0..a {
            for k in 0..a {
                if !(g.am[s0 + j] && g.am[s0 + k]) {
                    continue;
                }
                let q = j * a + k;
                let b = w.f6.f(q * ad..(q + 1) * ad);
                update(
                    o.style,
                    p,
                    &ll.a_residual,
                    &mut a_out[q * ad..(q + 1) * ad],
                    &[b],
                );
            }
        }
    }

    /// The adjoints of centre c's layer inputs from those of its outputs (after
    /// [`Ctx::forward`]): n̄_i into `w.bni`, the neighbours' n̄_j `[S][N]` into `w.bnj`, ē into
    /// `w.bej`, ā into `w.baa`; h̄, s̄w, ās̄w added to the slot adjoints; the layer's parameter
    /// gradient into `g`.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        ll: &RepflowLayerLayout,
        c: usize,
        w: &mut Work<T, N>,
        bn_out: &[N],
        be_out: &[N],
        ba_out: &[N],
        slot_bar: &mut SlotBar<'_, N>,
        mut g: Option<&mut Grad<'_, N>>,
    ) {
        let o = self.o();
        let (n, e, s, a, ad) = (o.n, o.e, o.s, o.a, o.ad);
        let z = N::zero();
        sized(&mut w.bni, n, z);
        sized(&mut w.bnj, s * n, z);
        sized(&mut w.bej, s * e, z);
        sized(&mut w.baa, a * a * ad, z);
        sized(&mut w.bv, 2 * s * e, z);
        let bu3 = self.back_node_update(ll, c, w, bn_out, slot_bar, g.as_deref_mut());
        if !o.sequential {
            // v¹ and, with the angle update, v².
            let both = [&w.f4.f[..], &w.f7.f[..]];
            let v = &both[..1 + usize::from(o.update_angle)];
            let (res, ybar) = (&ll.e_residual, be_out);
            self.back_edge_step(c, res, ybar, v, &mut w.bv, &mut w.bej, g.as_deref_mut());
            self.back_u3(c, w, &bu3, slot_bar);
            self.back_linear(&ll.node_edge, true, w, g.as_deref_mut());
            self.back_edge_self(ll, c, w, g.as_deref_mut());
            self.back_angle(ll, c, w, ba_out, slot_bar, g);
            return;
        }
        // Back from the node's messages to eu = es1 + r₁·v², through the angle branch to
        // es1 = e + r₀·v¹.
        self.back_u3(c, w, &bu3, slot_bar);
        self.back_linear(&ll.node_edge, true, w, g.as_deref_mut());
        let s0 = self.d.mixed_slots(c).start;
        for j in (0..s).filter(|&j| self.geo.real[s0 + j]) {
            add(&mut w.beu[j * e..(j + 1) * e], &be_out[j * e..(j + 1) * e]);
        }
        sized(&mut w.bes1, s * e, z);
        let (res, v2bar) = (&ll.e_residual[1..], &mut w.bv[s * e..]);
        self.back_edge_step(
            c,
            res,
            &w.beu,
            &[&w.f7.f[..]],
            v2bar,
            &mut w.bes1,
            g.as_deref_mut(),
        );
        self.back_angle(ll, c, w, ba_out, slot_bar, g.as_deref_mut());
        let (res, v1bar) = (&ll.e_residual[..1], &mut w.bv[..s * e]);
        self.back_edge_step(
            c,
            res,
            &w.bes1,
            &[&w.f4.f[..]],
            v1bar,
            &mut w.bej,
            g.as_deref_mut(),
        );
        self.back_edge_self(ll, c, w, g);
    }

    /// Back through the node update, u¹ and u² (the symmetrisation): n̄_i, n̄_j, the edges'
    /// adjoints (ē, or ēu in the sequential update), h̄ and s̄w; u³'s adjoint returned.
    fn back_node_update(
        &self,
        ll: &RepflowLayerLayout,
        c: usize,
        w: &mut Work<T, N>,
        bn_out: &[N],
        slot_bar: &mut SlotBar<'_, N>,
        mut g: Option<&mut Grad<'_, N>>,
    ) -> Vec<N> {
        let o = self.o();
        let p = self.x.params;
        let (n, e, s, hn) = (o.n, o.e, o.s, o.h * o.n);
        let s0 = self.d.mixed_slots(c).start;
        let geo = self.geo;
        let z = N::zero();
        let [u1, u2, u3] = self.node_messages(c, w);
        let mut bu1 = vec![z; n];
        let mut bu2 = vec![z; n];
        let mut bu3 = vec![z; hn];
        {
            let mut list: Vec<&[N]> = vec![&u1, &u2];
            list.extend(u3.chunks(n));
            let mut blist: Vec<&mut [N]> = vec![&mut bu1, &mut bu2];
            blist.extend(bu3.chunks_mut(n));
            update_backward(
                o.style,
                p,
                &ll.n_residual,
                bn_out,
                &list,
                &mut blist,
                &mut w.bni,
                g.as_deref_mut(),
            );
        }
        // u¹.
        let (wn, _) = wb(p, &ll.node_self);
        let bz1: Vec<N> = (bu1.iter().zip(&w.f1.s)).map(|(&b, &d)| b * d).collect();
        mtv_acc(&bz1, wn, n, &mut w.bni);
        if let Some(g) = g.as_deref_mut() {
            g.outer(&ll.node_self, 0, &w.ni, &bz1);
            g.bias(&ll.node_self, &bz1);
        }
        // u²: back through the symmetrisation.
        let (ws, _) = wb(p, &ll.node_sym);
        let bz2: Vec<N> = (bu2.iter().zip(&w.f2.s)).map(|(&b, &d)| b * d).collect();
        sized(&mut w.bsym, o.m * (e + n), z);
        mtv_acc(&bz2, ws, n, &mut w.bsym);
        if let Some(g) = g {
            g.outer(&ll.node_sym, 0, &w.sym, &bz2);
            g.bias(&ll.node_sym, &bz2);
        }
        sized(&mut w.bhge, 3 * e, z);
        sized(&mut w.bhgn, 3 * n, z);
        let third = cst::<T>(1.0 / 3.0);
        for (hg, bhg, width, bsym) in [
            (&w.hge, &mut w.bhge, e, &w.bsym[..o.m * e]),
            (&w.hgn, &mut w.bhgn, n, &w.bsym[o.m * e..]),
        ] {
            for mm in 0..o.m {
                for dd in 0..width {
                    let gb = bsym[mm * width + dd].scale(third);
                    for k in 0..3 {
                        bhg[k * width + dd] += gb * hg[k * width + mm];
                        bhg[k * width + mm] += gb * hg[k * width + dd];
                    }
                }
            }
        }
        let (edges, bedges) = if o.sequential {
            sized(&mut w.beu, s * e, z);
            (&w.eu, &mut w.beu)
        } else {
            (&w.ej, &mut w.bej)
        };
        let gs = cst::<T>(o.g_scale);
        for j in 0..s {
            let sl = s0 + j;
            if !geo.real[sl] {
                continue;
            }
            let sw = geo.sw[sl];
            let mut bsw = z;
            for k in 0..3 {
                let hk = geo.h[3 * sl + k];
                let mut bh = z;
                for (width, hg_b, feat, bfeat) in [
                    (
                        e,
                        &w.bhge,
                        &edges[j * e..(j + 1) * e],
                        &mut bedges[j * e..(j + 1) * e],
                    ),
                    (
                        n,
                        &w.bhgn,
                        &w.nj[j * n..(j + 1) * n],
                        &mut w.bnj[j * n..(j + 1) * n],
                    ),
                ] {
                    let row = &hg_b[k * width..(k + 1) * width];
                    let dot = row
                        .iter()
                        .zip(feat.iter())
                        .fold(z, |acc, (&b, &f)| acc + b * f);
                    bh += dot;
                    let f = (hk * sw).scale(gs);
                    for (bf, &b) in bfeat.iter_mut().zip(row) {
                        *bf += f * b;
                    }
                }
                bsw += (hk * bh).scale(gs);
                slot_bar.h[3 * j + k] += (sw * bh).scale(gs);
            }
            slot_bar.sw[j] += bsw;
        }
        bu3
    }

    /// Back through an update x' = x + Σ_m r_m·v_m of every real slot's edge (or res_avg,
    /// res_incr): x̄ += ȳ, v̄_m into `vbar` (`[M][S][E]`), the residual vectors' gradient into
    /// `g`.
    #[allow(clippy::too_many_arguments)]
    fn back_edge_step(
        &self,
        c: usize,
        res: &[usize],
        ybar: &[N],
        v: &[&[N]],
        vbar: &mut [N],
        xbar: &mut [N],
        mut g: Option<&mut Grad<'_, N>>,
    ) {
        let o = self.o();
        let (e, s) = (o.e, o.s);
        let s0 = self.d.mixed_slots(c).start;
        let mut vj: [&[N]; 2] = [&[], &[]];
        let mut bj = [vec![N::zero(); e], vec![N::zero(); e]];
        for j in (0..s).filter(|&j| self.geo.real[s0 + j]) {
            let r = j * e..(j + 1) * e;
            for (m, vm) in v.iter().enumerate() {
                vj[m] = &vm[r.clone()];
            }
            let [b0, b1] = &mut bj;
            let mut bl: [&mut [N]; 2] = [b0, b1];
            update_backward(
                o.style,
                self.x.params,
                res,
                &ybar[r.clone()],
                &vj[..v.len()],
                &mut bl[..v.len()],
                &mut xbar[r.clone()],
                g.as_deref_mut(),
            );
            for (m, b) in bj.iter().take(v.len()).enumerate() {
                vbar[m * s * e + j * e..][..e].copy_from_slice(b);
            }
        }
    }

    /// z̄3 from u³'s adjoint; s̄w of u³'s weights.
    fn back_u3(&self, c: usize, w: &mut Work<T, N>, bu3: &[N], slot_bar: &mut SlotBar<'_, N>) {
        let o = self.o();
        let (s, hn) = (o.s, o.h * o.n);
        let s0 = self.d.mixed_slots(c).start;
        let u3s = cst::<T>(o.u3_scale);
        sized(&mut w.bz3, s * hn, N::zero());
        for j in (0..s).filter(|&j| self.geo.real[s0 + j]) {
            let sw = self.geo.sw[s0 + j];
            let mut bsw = N::zero();
            let r = j * hn..(j + 1) * hn;
            for ((b, &u), (&f, &d)) in w.bz3[r.clone()]
                .iter_mut()
                .zip(bu3)
                .zip(w.f3.f[r.clone()].iter().zip(&w.f3.s[r]))
            {
                let q = u.scale(u3s);
                bsw += q * f;
                *b = q * sw * d;
            }
            slot_bar.sw[j] += bsw;
        }
    }

    /// Back through a message's per-edge linear over [n_i, n_j, e_ij] — u³'s (`node_edge`, from
    /// z̄3; it read eu in the sequential update) or v¹'s (`edge_self`, from z̄4) — rows of the
    /// slots not real being zero: the edges' adjoints, n̄_i from z̄ summed over the edges, and
    /// the layer's gradient. n_j's part goes back per owner after all centres (z̄3 and z̄4
    /// summed over each atom's slots, then through the weights once: [`RepflowIn::back`]).
    fn back_linear(&self, l: &Layer, u3: bool, w: &mut Work<T, N>, g: Option<&mut Grad<'_, N>>) {
        let (bz, edges, bedges) = match (u3, self.o().sequential) {
            (true, true) => (&w.bz3, &w.eu, &mut w.beu),
            (true, false) => (&w.bz3, &w.ej, &mut w.bej),
            (false, _) => (&w.bz4, &w.ej, &mut w.bej),
        };
        let (wt, nout) = (wb(self.x.params, l).0, l.nout);
        let (n, e) = (self.o().n, self.o().e);
        let (sum, sc) = (&mut w.tmp, &mut w.sc);
        sized(sum, nout, N::zero());
        bz.chunks(nout).for_each(|b| add(sum, b));
        mm_t(bz, nout, (&wt[2 * n * nout..], nout), bedges, e, sc);
        mtv_acc(sum, wt, nout, &mut w.bni);
        if let Some(g) = g {
            g.outer_rows(l, 2 * n, (edges, e), bz, &mut sc.gemm);
            g.outer(l, 0, &w.ni, sum);
            g.bias(l, sum);
        }
    }

    /// Back through v¹ = φ(z4), the edge's own message, from its adjoint (the first `[S][E]` of
    /// `w.bv`): n̄_j, ē, n̄_i and the gradient.
    fn back_edge_self(
        &self,
        ll: &RepflowLayerLayout,
        c: usize,
        w: &mut Work<T, N>,
        g: Option<&mut Grad<'_, N>>,
    ) {
        let (e, s) = (self.o().e, self.o().s);
        let s0 = self.d.mixed_slots(c).start;
        sized(&mut w.bz4, s * e, N::zero());
        for j in (0..s).filter(|&j| self.geo.real[s0 + j]) {
            let r = j * e..(j + 1) * e;
            for ((b, &v), &d) in w.bz4[r.clone()]
                .iter_mut()
                .zip(&w.bv[r.clone()])
                .zip(&w.f4.s[r])
            {
                *b = v * d;
            }
        }
        self.back_linear(&ll.edge_self, false, w, g);
    }

    /// Back through the angle branch from v²'s adjoint (the second `[S][E]` of `w.bv`) and the
    /// angles' ā_out: ā, the edges' adjoints (ē, or ēs1 in the sequential update), n̄_i, ās̄w
    /// and the gradient.
    fn back_angle(
        &self,
        ll: &RepflowLayerLayout,
        c: usize,
        w: &mut Work<T, N>,
        ba_out: &[N],
        slot_bar: &mut SlotBar<'_, N>,
        mut g: Option<&mut Grad<'_, N>>,
    ) {
        let Some(al) = &ll.angle else { return };
        let o = self.o();
        let p = self.x.params;
        let (n, e, s, a, ad) = (o.n, o.e, o.s, o.a, o.ad);
        let s0 = self.d.mixed_slots(c).start;
        let geo = self.geo;
        let z = N::zero();
        let seq = o.sequential;
        if seq {
            sized(&mut w.bau, a * a * ad, z);
            w.bau.copy_from_slice(ba_out);
        }
        let (edges, bedges) = if seq {
            (&w.es1, &mut w.bes1)
        } else {
            (&w.ej, &mut w.bej)
        };
        // v² and ρ.
        let (w7, _) = wb(p, &al.edge_angle2);
        sized(&mut w.brho, s * e, z);
        sized(&mut w.bz7, s * e, z);
        sized(&mut w.bz5, a * a * e, z);
        let rs = cst::<T>(o.rho_scale);
        for j in (0..s).filter(|&j| geo.real[s0 + j]) {
            let bz7 = &mut w.bz7[j * e..(j + 1) * e];
            for ((b, &v), &d) in bz7
                .iter_mut()
                .zip(&w.bv[s * e + j * e..s * e + (j + 1) * e])
                .zip(&w.f7.s[j * e..(j + 1) * e])
            {
                *b = v * d;
            }
        }
        mm_t(&w.bz7, e, (w7, e), &mut w.brho, e, &mut w.sc);
        if let Some(g) = g.as_deref_mut() {
            g.outer_rows(&al.edge_angle2, 0, (&w.rho, e), &w.bz7, &mut w.sc.gemm);
            let mut sum7 = vec![z; e];
            w.bz7.chunks(e).for_each(|b| add(&mut sum7, b));
            g.bias(&al.edge_angle2, &sum7);
        }
        for j in 0..s {
            let sl = s0 + j;
            if !geo.real[sl] {
                continue;
            }
            let brho = &w.brho[j * e..(j + 1) * e];
            if j < a && geo.am[sl] {
                let mut basw_j = z;
                for k in 0..a {
                    if !geo.am[s0 + k] {
                        continue;
                    }
                    let q = j * a + k;
                    let r = q * e..(q + 1) * e;
                    let (f5, d5) = (&w.f5.f[r.clone()], &w.f5.s[r.clone()]);
                    let mut dot = z;
                    let fj = (geo.asw[sl] * geo.asw[s0 + k]).scale(rs);
                    for ((bz, (&f, &d)), &br) in
                        w.bz5[r].iter_mut().zip(f5.iter().zip(d5)).zip(brho.iter())
                    {
                        dot += br * f;
                        *bz = br * fj * d;
                    }
                    basw_j += (dot * geo.asw[s0 + k]).scale(rs);
                    slot_bar.asw[k] += (dot * geo.asw[sl]).scale(rs);
                }
                slot_bar.asw[j] += basw_j;
            } else if !o.smooth_edge_update {
                add(&mut bedges[j * e..(j + 1) * e], brho);
            }
        }
        let (w5, _) = wb(p, &al.edge_angle1);
        let (w6, _) = wb(p, &al.angle_self);
        if seq {
            // The edge's angle message read the updated angles.
            mm_t(&w.bz5, e, (w5, e), &mut w.bau, ad, &mut w.sc);
        }
        // The angle's own update, b = φ(z6).
        sized(&mut w.bz6, a * a * ad, z);
        let mut bb = vec![z; ad];
        let ba = if seq { &w.bau[..] } else { ba_out };
        for j in 0..a {
            for k in 0..a {
                if !(geo.am[s0 + j] && geo.am[s0 + k]) {
                    continue;
                }
                let q = j * a + k;
                let b6 = w.f6.f(q * ad..(q + 1) * ad);
                update_backward(
                    o.style,
                    p,
                    &ll.a_residual,
                    &ba[q * ad..(q + 1) * ad],
                    &[b6],
                    &mut [&mut bb],
                    &mut w.baa[q * ad..(q + 1) * ad],
                    g.as_deref_mut(),
                );
                for ((bz, &b), &d) in w.bz6[q * ad..(q + 1) * ad]
                    .iter_mut()
                    .zip(&bb)
                    .zip(&w.f6.s[q * ad..(q + 1) * ad])
                {
                    *bz = b * d;
                }
            }
        }
        // Back through the angle info [a, ñ, ẽ_k, ẽ_j] of linear1 and angle_self.
        let (nc, ec) = (o.nc, o.ec);
        let (rn, rk, rj) = (ad, ad + nc, ad + nc + ec);
        sized(&mut w.bnt, nc, z);
        sized(&mut w.bet, a * ec, z);
        let mut sum5 = vec![z; e];
        let mut sum6 = vec![z; ad];
        let mut bk5 = vec![z; a * e];
        let mut bj5 = vec![z; a * e];
        let mut bk6 = vec![z; a * ad];
        let mut bj6 = vec![z; a * ad];
        for j in 0..a {
            for k in 0..a {
                if !(geo.am[s0 + j] && geo.am[s0 + k]) {
                    continue;
                }
                let q = j * a + k;
                let (bz5, bz6) = (&w.bz5[q * e..(q + 1) * e], &w.bz6[q * ad..(q + 1) * ad]);
                add(&mut sum5, bz5);
                add(&mut sum6, bz6);
                add(&mut bk5[k * e..(k + 1) * e], bz5);
                add(&mut bj5[j * e..(j + 1) * e], bz5);
                add(&mut bk6[k * ad..(k + 1) * ad], bz6);
                add(&mut bj6[j * ad..(j + 1) * ad], bz6);
            }
        }
        // (z̄5 and z̄6 are zero on the pairs out of the angle list.)
        let sc = &mut w.sc;
        if !seq {
            mm_t(&w.bz5, e, (w5, e), &mut w.baa, ad, sc);
        }
        mm_t(&w.bz6, ad, (w6, ad), &mut w.baa, ad, sc);
        let angles = if seq { &w.au } else { &w.aa };
        if let Some(g) = g.as_deref_mut() {
            g.outer_rows(&al.edge_angle1, 0, (angles, ad), &w.bz5, &mut sc.gemm);
            g.outer_rows(&al.angle_self, 0, (&w.aa, ad), &w.bz6, &mut sc.gemm);
        }
        mtv_acc(&sum5, &w5[rn * e..], e, &mut w.bnt);
        mtv_acc(&sum6, &w6[rn * ad..], ad, &mut w.bnt);
        if let Some(g) = g.as_deref_mut() {
            g.outer(&al.edge_angle1, rn, &w.nt, &sum5);
            g.bias(&al.edge_angle1, &sum5);
            g.outer(&al.angle_self, rn, &w.nt, &sum6);
            g.bias(&al.angle_self, &sum6);
        }
        for j in 0..a {
            if !geo.am[s0 + j] {
                continue;
            }
            let bet = &mut w.bet[j * ec..(j + 1) * ec];
            mtv_acc(&bk5[j * e..(j + 1) * e], &w5[rk * e..], e, bet);
            mtv_acc(&bj5[j * e..(j + 1) * e], &w5[rj * e..], e, bet);
            mtv_acc(&bk6[j * ad..(j + 1) * ad], &w6[rk * ad..], ad, bet);
            mtv_acc(&bj6[j * ad..(j + 1) * ad], &w6[rj * ad..], ad, bet);
            if let Some(g) = g.as_deref_mut() {
                let et = &w.et[j * ec..(j + 1) * ec];
                g.outer(&al.edge_angle1, rk, et, &bk5[j * e..(j + 1) * e]);
                g.outer(&al.edge_angle1, rj, et, &bj5[j * e..(j + 1) * e]);
                g.outer(&al.angle_self, rk, et, &bk6[j * ad..(j + 1) * ad]);
                g.outer(&al.angle_self, rj, et, &bj6[j * ad..(j + 1) * ad]);
            }
            // Back through the edge's compression.
            let bej = &mut bedges[j * e..(j + 1) * e];
            match o.compress {
                Compress::None | Compress::Split => add(&mut bej[..ec], bet),
                Compress::Linear => {
                    let cw = al.compress_e.expect("a linear compression");
                    mtv_acc(bet, &p[cw..cw + e * ec], ec, bej);
                    if let Some(g) = g.as_deref_mut() {
                        outer_acc(&edges[j * e..(j + 1) * e], bet, ec, g.at(cw, e * ec));
                    }
                }
            }
        }
        match o.compress {
            Compress::None | Compress::Split => add(&mut w.bni[..nc], &w.bnt),
            Compress::Linear => {
                let cw = al.compress_n.expect("a linear compression");
                mtv_acc(&w.bnt, &p[cw..cw + n * nc], nc, &mut w.bni);
                if let Some(g) = g {
                    outer_acc(&w.ni, &w.bnt, nc, g.at(cw, n * nc));
                }
            }
        }
    }
}

/// One centre's adjoints of the slot geometry the layers read: h̄ `[S][3]`, s̄w `[S]`, ās̄w
/// `[A]`.
struct SlotBar<'a, N> {
    h: &'a mut [N],
    sw: &'a mut [N],
    asw: &'a mut [N],
}

/// Centres per piece of the parameter gradient's sum: fixed, so the sum's order does not depend
/// on the thread count.
const GRAD_GROUP: usize = 8;

/// The whole block's forward state on numbers N: the geometry and every layer's features.
struct State<N> {
    geo: Geo<N>,
    owner_c: Vec<i32>,
    /// T `[nt][N]` (before φ).
    tebd: Vec<N>,
    /// Edge inputs of e⁰ (R̂[0], or r) and their pre-activations.
    ze: Vec<N>,
    /// Per layer l ≤ L: nodes `[nc][N]` (centre order), edges `[nslots][E]`, angles
    /// `[nc][A][A][A_d]`.
    nodes: Vec<Vec<N>>,
    edges: Vec<Vec<N>>,
    angles: Vec<Vec<N>>,
}

impl<T: Real> RepflowIn<'_, T> {
    fn geometry<N: Num<T>>(&self, d: &Dims, rdot: Option<&[T]>) -> Geo<N> {
        let o = self.o;
        let ns = d.nslots();
        let z = N::zero();
        let mut g = Geo {
            real: vec![false; ns],
            am: vec![false; ns],
            rv: vec![z; 3 * ns],
            r: vec![z; ns],
            sw: vec![z; ns],
            x: vec![z; ns],
            h: vec![z; 3 * ns],
            asw: vec![z; ns],
            u: vec![z; 3 * ns],
        };
        let p = cst::<T>(o.protection);
        for cc in 0..d.ncentres() {
            let ti = d.centre_type(cc);
            let (avg, std) = (
                &self.davg[4 * ti..4 * ti + 4],
                &self.dstd[4 * ti..4 * ti + 4],
            );
            let slots = d.mixed_slots(cc);
            let s0 = slots.start;
            for s in slots {
                let tj = self.nei_type[s];
                let real = self.owner[s] >= 0 && !o.exclude[ti * o.nt + tj.max(0) as usize];
                g.real[s] = real;
                if !real {
                    g.x[s] = N::of(-avg[0] / std[0]);
                    for k in 0..3 {
                        g.h[3 * s + k] = N::of(-avg[1 + k] / std[1 + k]);
                    }
                    continue;
                }
                let rv: [N; 3] = std::array::from_fn(|k| {
                    N::pair(
                        self.rij[3 * s + k],
                        rdot.map_or(T::zero(), |rd| rd[3 * s + k]),
                    )
                });
                let r = (rv[0] * rv[0] + rv[1] * rv[1] + rv[2] * rv[2]).sqrt();
                g.rv[3 * s..3 * s + 3].copy_from_slice(&rv);
                let sw = switch(o.exp_switch, o.e_rcut_smth, o.e_rcut, r);
                let dd = r + N::of(p);
                g.r[s] = r;
                g.sw[s] = sw;
                g.x[s] = (sw / dd - N::of(avg[0])).scale(T::one() / std[0]);
                for k in 0..3 {
                    g.h[3 * s + k] =
                        (rv[k] * sw / (dd * dd) - N::of(avg[1 + k])).scale(T::one() / std[1 + k]);
                }
                if s - s0 < o.a && r.re() < cst::<T>(o.a_rcut) {
                    g.am[s] = true;
                    g.asw[s] = switch(o.exp_switch, o.a_rcut_smth, o.a_rcut, r);
                    let ru = r + N::of(cst(UNIT_EPS));
                    for (u, &x) in g.u[3 * s..3 * s + 3].iter_mut().zip(&rv) {
                        *u = x / ru;
                    }
                }
            }
        }
        g
    }

    /// The forward pass on numbers N (a tangent `rdot` `[nslots][3]` of r_ij for duals).
    fn run<N: Num<T>>(&self, d: &Dims, rdot: Option<&[T]>) -> State<N> {
        let o = self.o;
        let (n, e, a, ad) = (o.n, o.e, o.a, o.ad);
        let p = self.params;
        let nc = d.ncentres();
        let ns = d.nslots();
        let geo = self.geometry::<N>(d, rdot);
        let mut atom_centre = vec![0usize; d.nbatch_atoms()];
        for (cc, &at) in self.centre_atom.iter().enumerate() {
            atom_centre[at as usize] = cc;
        }
        let owner_c: Vec<i32> = (self.owner.iter())
            .map(|&ow| {
                if ow < 0 {
                    -1
                } else {
                    atom_centre[ow as usize] as i32
                }
            })
            .collect();
        let tebd = self.tebd::<N>();
        let mut n0 = vec![N::zero(); nc * n];
        for cc in 0..nc {
            let t = d.centre_type(cc);
            for (v, &tv) in n0[cc * n..(cc + 1) * n]
                .iter_mut()
                .zip(&tebd[t * n..(t + 1) * n])
            {
                *v = act(o.act, tv);
            }
        }
        // e⁰ = φ(x W_e + b_e), or r W_e + b_e; a⁰ = (cos/√π) W_a.
        let l = self.l;
        let (we, be) = wb(p, &l.edge_embd);
        let mut ze = vec![N::zero(); ns * e];
        let mut e0 = vec![N::zero(); ns * e];
        for s in 0..ns {
            let inp = if o.edge_init_use_dist {
                geo.r[s]
            } else {
                geo.x[s]
            };
            for k in 0..e {
                let zv = inp.scale(we[k]) + N::of(be[k]);
                ze[s * e + k] = zv;
                e0[s * e + k] = if o.edge_init_use_dist {
                    zv
                } else {
                    act(o.act, zv)
                };
            }
        }
        let wa = &p[l.angle_embd..l.angle_embd + ad];
        let pi = cst::<T>(1.0 / std::f64::consts::PI.sqrt());
        let kappa = cst::<T>(COS_SHRINK);
        let a0 = zeroed_with(
            nc * a * a * ad,
            a * a * ad,
            || (),
            |_, cc, centre| {
                let s0 = d.mixed_slots(cc).start;
                for j in 0..a {
                    for k in 0..a {
                        let cos = cosine(&geo, s0 + j, s0 + k, kappa);
                        let out = &mut centre[(j * a + k) * ad..][..ad];
                        for (v, &wv) in out.iter_mut().zip(wa) {
                            *v = cos.scale(pi * wv);
                        }
                    }
                }
            },
        );
        let mut st = State {
            geo,
            owner_c,
            tebd,
            ze,
            nodes: vec![n0],
            edges: vec![e0],
            angles: vec![a0],
        };
        for ll in &l.layers {
            let (nodes, edges, angles) = {
                let (ni, ei, ai) = (
                    st.nodes.last().unwrap(),
                    st.edges.last().unwrap(),
                    st.angles.last().unwrap(),
                );
                let nei = self.neighbour_parts(ll, ni);
                let ctx = self.ctx(d, &st, &nei);
                let mut nodes = zeros(nc * n);
                let mut edges = zeros(ns * e);
                let mut angles = zeros(nc * a * a * ad);
                let per_slot = o.s * e;
                nodes
                    .par_chunks_mut(n)
                    .zip(edges.par_chunks_mut(per_slot))
                    .zip(angles.par_chunks_mut(a * a * ad))
                    .enumerate()
                    .for_each_init(Work::default, |w, (cc, ((no, eo), ao))| {
                        ctx.forward(ll, cc, ni, ei, ai, w);
                        ctx.outputs(ll, cc, w, no, eo, ao);
                    });
                (nodes, edges, angles)
            };
            st.nodes.push(nodes);
            st.edges.push(edges);
            st.angles.push(angles);
        }
        st
    }

    /// What a layer's passes read, with its neighbour parts `nei`.
    fn ctx<'a, N>(&'a self, d: &'a Dims, st: &'a State<N>, nei: &'a [N]) -> Ctx<'a, T, N> {
        Ctx {
            x: self,
            d,
            geo: &st.geo,
            owner_c: &st.owner_c,
            nei,
        }
    }

    /// Every centre's nodes `[nc][N]` through the neighbour rows of u³'s and v¹'s linears,
    /// `[nc][H·N + E]`: once per atom, where each slot's product was once per slot (as
    /// DeePMD-kit's `optim_update`).
    fn neighbour_parts<N: Num<T>>(&self, ll: &RepflowLayerLayout, nodes: &[N]) -> Vec<N> {
        let o = self.o;
        let (n, e, hn) = (o.n, o.e, o.h * o.n);
        let nc = nodes.len() / n;
        let width = hn + e;
        let mut out = vec![N::zero(); nc * width];
        let mut work = Vec::new();
        let (w3, w4) = (
            wb(self.params, &ll.node_edge).0,
            wb(self.params, &ll.edge_self).0,
        );
        for (col, nout, w) in [(0, hn, &w3[n * hn..]), (hn, e, &w4[n * e..])] {
            let p = Prod {
                m: nc,
                k: n,
                n: nout,
                b_rs: nout,
                c_rs: width,
                acc: false,
            };
            let x = Mat {
                v: nodes,
                rs: n,
                cs: 1,
            };
            N::gemm_r(p, x, w, &mut out[col..], &mut work);
        }
        out
    }

    /// The adjoint of [`RepflowIn::neighbour_parts`] from its `bz` `[nc][H·N + E]`: added to
    /// the nodes' `bn` `[nc][N]` and to the weights' rows in `grad`.
    fn neighbour_parts_backward<N: Num<T>>(
        &self,
        ll: &RepflowLayerLayout,
        nodes: &[N],
        bz: &[N],
        bn: &mut [N],
        grad: Option<&mut [N]>,
    ) {
        let o = self.o;
        let (n, hn) = (o.n, o.h * o.n);
        let width = hn + o.e;
        let mut sc = Scratch {
            gemm: Vec::new(),
            wt: Vec::new(),
        };
        let mut g = grad.map(|g| Grad { g, base: 0 });
        for (col, l) in [(0, &ll.node_edge), (hn, &ll.edge_self)] {
            let nout = l.nout;
            // This linear's columns of bz, contiguous.
            let part: Vec<N> = (bz.chunks(width))
                .flat_map(|r| &r[col..col + nout])
                .copied()
                .collect();
            let w = wb(self.params, l).0;
            mm_t(&part, nout, (&w[n * nout..], nout), bn, n, &mut sc);
            if let Some(g) = g.as_mut() {
                g.outer_rows(l, n, (nodes, n), &part, &mut sc.gemm);
            }
        }
    }

    /// T `[nt][N]`: the one-hot rows through the type embedding's layer, with its skip.
    fn tebd<N: Num<T>>(&self) -> Vec<N> {
        let t = &self.l.tebd;
        (0..t.ntypes)
            .flat_map(|ty| t.row(self.params, ty))
            .map(N::of)
            .collect()
    }

    /// D `[nc][width]` from the last layer's nodes.
    fn desc<N: Num<T>>(&self, d: &Dims, st: &State<N>, out: &mut [N]) {
        let o = self.o;
        let (n, w) = (o.n, o.width());
        let last = st.nodes.last().unwrap();
        for cc in 0..d.ncentres() {
            let row = &mut out[cc * w..(cc + 1) * w];
            row[..n].copy_from_slice(&last[cc * n..(cc + 1) * n]);
            if o.concat_output_tebd {
                let t = d.centre_type(cc);
                row[n..].copy_from_slice(&st.tebd[t * n..(t + 1) * n]);
            }
        }
        if o.rot {
            self.rot(d, st, &mut out[d.ncentres() * w..]);
        }
    }

    /// A `[nc][4][E]` after D where the block gives the rotation matrix: rows 1..3 are
    /// Σ_j h_j·sw_j·g ⊗ e_j over the last edges (DeePMD-kit's repflows' `rot_mat` transposed,
    /// with node_sym's weights), row 0 zero.
    fn rot<N: Num<T>>(&self, d: &Dims, st: &State<N>, out: &mut [N]) {
        let o = self.o;
        let (e, s) = (o.e, o.s);
        let (edges, g) = (st.edges.last().unwrap(), &st.geo);
        let gs = cst::<T>(o.g_scale);
        for (cc, ac) in out.chunks_mut(4 * e).enumerate() {
            ac.fill(N::zero());
            let s0 = d.mixed_slots(cc).start;
            for sl in (s0..s0 + s).filter(|&sl| g.real[sl]) {
                let f = g.sw[sl].scale(gs);
                for k in 0..3 {
                    let hf = g.h[3 * sl + k] * f;
                    let row = &mut ac[(k + 1) * e..(k + 2) * e];
                    for (av, &ev) in row.iter_mut().zip(&edges[sl * e..(sl + 1) * e]) {
                        *av += hf * ev;
                    }
                }
            }
        }
    }

    /// Back through [`RepflowIn::rot`] from Ā `[nc][4][E]`: the last edges' adjoint into `be`,
    /// the slots' h and sw adjoints added to `bh`, `bsw`.
    fn rot_backward<N: Num<T>>(
        &self,
        d: &Dims,
        st: &State<N>,
        abar: &[N],
        be: &mut [N],
        (bh, bsw): (&mut [N], &mut [N]),
    ) {
        let o = self.o;
        let (e, s) = (o.e, o.s);
        let (edges, g) = (st.edges.last().unwrap(), &st.geo);
        let gs = cst::<T>(o.g_scale);
        for (cc, ab) in abar.chunks(4 * e).enumerate() {
            let s0 = d.mixed_slots(cc).start;
            for sl in (s0..s0 + s).filter(|&sl| g.real[sl]) {
                let f = g.sw[sl].scale(gs);
                let ej = &edges[sl * e..(sl + 1) * e];
                let mut dsw = N::zero();
                for k in 0..3 {
                    let row = &ab[(k + 1) * e..(k + 2) * e];
                    let hk = g.h[3 * sl + k];
                    let hf = hk * f;
                    let dot = (row.iter().zip(ej)).fold(N::zero(), |acc, (&b, &v)| acc + b * v);
                    for (bv, &b) in be[sl * e..(sl + 1) * e].iter_mut().zip(row) {
                        *bv += hf * b;
                    }
                    bh[3 * sl + k] += dot * f;
                    dsw += (hk * dot).scale(gs);
                }
                bsw[sl] += dsw;
            }
        }
    }

    /// The backward pass on numbers N from D̄ `[nc][width]`: q = ∂E/∂r_ij `[nslots][3]` where
    /// asked, and the parameter gradient (the whole vector's, written where the descriptor's
    /// tensors are) where asked.
    fn back<N: Num<T>>(
        &self,
        d: &Dims,
        st: &State<N>,
        dbar: &[N],
        q: Option<&mut [N]>,
        grad: Option<&mut [N]>,
    ) {
        let o = self.o;
        let (n, e, s, a, ad) = (o.n, o.e, o.s, o.a, o.ad);
        let p = self.params;
        let nc = d.ncentres();
        let ns = d.nslots();
        let z = N::zero();
        let want_grad = grad.is_some();
        let mut grad = grad;
        let w = o.width();
        let mut bn: Vec<N> = vec![z; nc * n];
        let mut btebd = vec![z; o.nt * n];
        for cc in 0..nc {
            bn[cc * n..(cc + 1) * n].copy_from_slice(&dbar[cc * w..cc * w + n]);
            if o.concat_output_tebd {
                let t = d.centre_type(cc);
                add(
                    &mut btebd[t * n..(t + 1) * n],
                    &dbar[cc * w + n..(cc + 1) * w],
                );
            }
        }
        let mut be: Vec<N> = zeros(ns * e);
        let mut ba: Vec<N> = zeros(nc * a * a * ad);
        // The slot geometry's adjoints, summed over the layers.
        let mut bh = vec![z; ns * 3];
        let mut bsw = vec![z; ns];
        let mut basw = vec![z; nc * a];
        if o.rot {
            self.rot_backward(d, st, &dbar[nc * w..], &mut be, (&mut bh, &mut bsw));
        }
        // The slots owned by each centre, in slot order.
        let mut owned: Vec<Vec<usize>> = vec![Vec::new(); nc];
        for (sl, &oc) in st.owner_c.iter().enumerate() {
            if oc >= 0 && st.geo.real[sl] {
                owned[oc as usize].push(sl);
            }
        }
        let (hn, pw) = (o.h * n, o.h * n + e);
        for (li, ll) in self.l.layers.iter().enumerate().rev() {
            let (ni, ei, ai) = (&st.nodes[li], &st.edges[li], &st.angles[li]);
            let nei = self.neighbour_parts(ll, ni);
            let ctx = self.ctx(d, st, &nei);
            let mut bn_own = zeros(nc * n);
            let mut bn_nei = zeros(ns * n);
            // z̄3 and z̄4 of every slot, for n_j's part of their linears.
            let mut bz_nei = zeros(ns * pw);
            let mut be_in = zeros(ns * e);
            let mut ba_in = zeros(nc * a * a * ad);
            let span = ll.params.clone();
            let groups: Vec<Vec<N>> = bn_own
                .par_chunks_mut(GRAD_GROUP * n)
                .zip(bn_nei.par_chunks_mut(GRAD_GROUP * s * n))
                .zip(be_in.par_chunks_mut(GRAD_GROUP * s * e))
                .zip(ba_in.par_chunks_mut(GRAD_GROUP * a * a * ad))
                .zip(bh.par_chunks_mut(GRAD_GROUP * s * 3))
                .zip(bsw.par_chunks_mut(GRAD_GROUP * s))
                .zip(basw.par_chunks_mut(GRAD_GROUP * a))
                .zip(bz_nei.par_chunks_mut(GRAD_GROUP * s * pw))
                .enumerate()
                .map_init(
                    Work::default,
                    |w, (gi, (((((((own, nei), bei), bai), bhg), bswg), baswg), bzg))| {
                        let mut acc = vec![z; if want_grad { span.len() } else { 0 }];
                        let first = gi * GRAD_GROUP;
                        for cc in first..(first + GRAD_GROUP).min(nc) {
                            let k = cc - first;
                            ctx.forward(ll, cc, ni, ei, ai, w);
                            let mut sb = SlotBar {
                                h: &mut bhg[k * s * 3..(k + 1) * s * 3],
                                sw: &mut bswg[k * s..(k + 1) * s],
                                asw: &mut baswg[k * a..(k + 1) * a],
                            };
                            let s0 = d.mixed_slots(cc).start;
                            let mut gr = Grad {
                                g: &mut acc,
                                base: span.start,
                            };
                            ctx.backward(
                                ll,
                                cc,
                                w,
                                &bn[cc * n..(cc + 1) * n],
                                &be[s0 * e..(s0 + s) * e],
                                &ba[cc * a * a * ad..(cc + 1) * a * a * ad],
                                &mut sb,
                                want_grad.then_some(&mut gr),
                            );
                            own[k * n..(k + 1) * n].copy_from_slice(&w.bni);
                            nei[k * s * n..(k + 1) * s * n].copy_from_slice(&w.bnj);
                            bei[k * s * e..(k + 1) * s * e].copy_from_slice(&w.bej);
                            bai[k * a * a * ad..(k + 1) * a * a * ad].copy_from_slice(&w.baa);
                            let rows = bzg[k * s * pw..(k + 1) * s * pw].chunks_mut(pw);
                            let parts = w.bz3.chunks(hn).zip(w.bz4.chunks(e));
                            for (row, (b3, b4)) in rows.zip(parts) {
                                row[..hn].copy_from_slice(b3);
                                row[hn..].copy_from_slice(b4);
                            }
                        }
                        acc
                    },
                )
                .collect();
            if let Some(g) = grad.as_deref_mut() {
                for acc in groups {
                    add(&mut g[span.clone()], &acc);
                }
            }
            // The neighbours' adjoints to their owners, in slot order; z̄3 and z̄4 likewise,
            // then through n_j's rows of the weights once per atom.
            let mut bz_own = zeros(nc * pw);
            bn.par_chunks_mut(n)
                .zip(bz_own.par_chunks_mut(pw))
                .enumerate()
                .for_each(|(cc, (row, bz))| {
                    row.copy_from_slice(&bn_own[cc * n..(cc + 1) * n]);
                    for &sl in &owned[cc] {
                        add(row, &bn_nei[sl * n..(sl + 1) * n]);
                        add(bz, &bz_nei[sl * pw..(sl + 1) * pw]);
                    }
                });
            self.neighbour_parts_backward(ll, ni, &bz_own, &mut bn, grad.as_deref_mut());
            be = be_in;
            ba = ba_in;
        }
        // n⁰ = φ(T[t]).
        for cc in 0..nc {
            let t = d.centre_type(cc);
            for k in 0..n {
                let tv = st.tebd[t * n + k];
                btebd[t * n + k] += bn[cc * n + k] * act_slope(o.act, tv);
            }
        }
        let l = self.l;
        if let Some(g) = grad.as_deref_mut() {
            let t = &l.tebd;
            for ty in 0..o.nt {
                add(
                    &mut g[t.w + ty * n..t.w + (ty + 1) * n],
                    &btebd[ty * n..(ty + 1) * n],
                );
                if let Some(b) = t.b {
                    add(&mut g[b..b + n], &btebd[ty * n..(ty + 1) * n]);
                }
            }
        }
        // e⁰ and a⁰ back to the slot geometry.
        let (we, _) = wb(p, &l.edge_embd);
        let mut bx = vec![z; ns];
        for sl in 0..ns {
            let inp = if o.edge_init_use_dist {
                st.geo.r[sl]
            } else {
                st.geo.x[sl]
            };
            let mut bin = z;
            for k in 0..e {
                let b = be[sl * e + k];
                let bz = if o.edge_init_use_dist {
                    b
                } else {
                    b * act_slope(o.act, st.ze[sl * e + k])
                };
                bin += bz.scale(we[k]);
                if let Some(g) = grad.as_deref_mut() {
                    g[l.edge_embd.w + k] += inp * bz;
                    g[l.edge_embd.b + k] += bz;
                }
            }
            bx[sl] = bin;
        }
        let wa = &p[l.angle_embd..l.angle_embd + ad];
        let pi = cst::<T>(1.0 / std::f64::consts::PI.sqrt());
        let kappa = cst::<T>(COS_SHRINK);
        let bcos = zeroed_with(
            nc * a * a,
            a * a,
            || (),
            |_, cc, row| {
                for (qc, b) in row.iter_mut().enumerate() {
                    let bav = &ba[(cc * a * a + qc) * ad..][..ad];
                    *b = (bav.iter().zip(wa))
                        .fold(z, |acc, (&b, &wv)| acc + b.scale(wv))
                        .scale(pi);
                }
            },
        );
        if let Some(g) = grad {
            let ga = &mut g[l.angle_embd..l.angle_embd + ad];
            for cc in 0..nc {
                let s0 = d.mixed_slots(cc).start;
                for j in 0..a {
                    for k in 0..a {
                        let q = (cc * a + j) * a + k;
                        let cos = cosine(&st.geo, s0 + j, s0 + k, kappa).scale(pi);
                        for (gv, &b) in ga.iter_mut().zip(&ba[q * ad..(q + 1) * ad]) {
                            *gv += cos * b;
                        }
                    }
                }
            }
        }
        let Some(q) = q else { return };
        self.geometry_backward(d, st, &bx, &bh, &bsw, &basw, &bcos, q);
    }

    /// q = ∂E/∂r_ij from the adjoints of the slot geometry.
    #[allow(clippy::too_many_arguments)]
    fn geometry_backward<N: Num<T>>(
        &self,
        d: &Dims,
        st: &State<N>,
        bx: &[N],
        bh: &[N],
        bsw: &[N],
        basw: &[N],
        bcos: &[N],
        q: &mut [N],
    ) {
        let o = self.o;
        let a = o.a;
        let g = &st.geo;
        let z = N::zero();
        let p = cst::<T>(o.protection);
        let kappa = cst::<T>(COS_SHRINK);
        q.fill(z);
        for cc in 0..d.ncentres() {
            let ti = d.centre_type(cc);
            let std = &self.dstd[4 * ti..4 * ti + 4];
            let s0 = d.mixed_slots(cc).start;
            for s in d.mixed_slots(cc) {
                if !g.real[s] {
                    continue;
                }
                let j = s - s0;
                let rv: [N; 3] = std::array::from_fn(|k| g.rv[3 * s + k]);
                let r = g.r[s];
                let sw = g.sw[s];
                let dd = r + N::of(p);
                let dd2 = dd * dd;
                let b0 = bx[s].scale(T::one() / std[0]);
                let bv: [N; 3] =
                    std::array::from_fn(|k| bh[3 * s + k].scale(T::one() / std[1 + k]));
                let dot_bv_r = (0..3).fold(z, |acc, k| acc + bv[k] * rv[k]);
                let mut bsw_tot = bsw[s] + b0 / dd + dot_bv_r / dd2;
                if o.edge_init_use_dist {
                    // x was not read: e⁰ took r itself.
                    bsw_tot = bsw[s] + dot_bv_r / dd2;
                }
                let dsw = switch_slope(o.exp_switch, o.e_rcut_smth, o.e_rcut, r);
                let mut br = bsw_tot * dsw - (dot_bv_r * sw).scale(cst(2.0)) / (dd2 * dd);
                if o.edge_init_use_dist {
                    br += bx[s];
                } else {
                    br -= b0 * sw / dd2;
                }
                let mut brv: [N; 3] = std::array::from_fn(|k| bv[k] * sw / dd2);
                if j < a && g.am[s] {
                    let dasw = switch_slope(o.exp_switch, o.a_rcut_smth, o.a_rcut, r);
                    br += basw[cc * a + j] * dasw;
                    // û_j's adjoint from the cosines of its row and column.
                    let mut bu = [z; 3];
                    for k in 0..a {
                        let sk = s0 + k;
                        if !g.am[sk] {
                            continue;
                        }
                        let f =
                            (bcos[(cc * a + j) * a + k] + bcos[(cc * a + k) * a + j]).scale(kappa);
                        for (cmp, b) in bu.iter_mut().enumerate() {
                            *b += f * g.u[3 * sk + cmp];
                        }
                    }
                    let ru = r + N::of(cst(UNIT_EPS));
                    let dot_bu_r = (0..3).fold(z, |acc, k| acc + bu[k] * rv[k]);
                    br -= dot_bu_r / (ru * ru);
                    for k in 0..3 {
                        brv[k] += bu[k] / ru;
                    }
                }
                for k in 0..3 {
                    q[3 * s + k] = br * rv[k] / r + brv[k];
                }
            }
        }
    }
}

/// κ û_j·û_k, 0 unless both are angle slots.
fn cosine<T: Real, N: Num<T>>(g: &Geo<N>, sj: usize, sk: usize, kappa: T) -> N {
    if !(g.am[sj] && g.am[sk]) {
        return N::zero();
    }
    (0..3)
        .fold(N::zero(), |acc, k| acc + g.u[3 * sj + k] * g.u[3 * sk + k])
        .scale(kappa)
}

impl<T: Real> RepflowIn<'_, T> {
    /// The state kept for these inputs, or one built now.
    fn kept<N: Num<T> + Send + 'static>(
        &self,
        d: &Dims,
        keep: &Keep,
        rdot: Option<&[T]>,
    ) -> State<N> {
        (keep.take(|k| self.made(k, d, rdot))).unwrap_or_else(|| self.run(d, rdot))
    }
}

/// D `[nc][width]` of every centre (then A where the block gives it); the state kept for the
/// backward.
pub fn forward<T: Real>(d: &Dims, x: &RepflowIn<'_, T>, keep: &Keep, desc: &mut [T]) {
    let st = x.run::<T>(d, None);
    x.desc(d, &st, desc);
    keep.put(x.key(d, None), st);
}

/// Ḋ `[nc][width]` for the tangent ṙ_ij `[nslots][3]`; the state kept for the dual reverse.
pub fn tangent<T: Real>(d: &Dims, x: &RepflowIn<'_, T>, keep: &Keep, rdot: &[T], ddot: &mut [T]) {
    let st = x.run::<Dual<T>>(d, Some(rdot));
    let mut out = vec![Dual::default(); ddot.len()];
    x.desc(d, &st, &mut out);
    for (v, o) in ddot.iter_mut().zip(out) {
        *v = o.d;
    }
    keep.put(x.key(d, Some(rdot)), st);
}

/// q = ∂E/∂r_ij `[nslots][3]` from D̄ `[nc][width]`.
pub fn backward<T: Real>(d: &Dims, x: &RepflowIn<'_, T>, keep: &Keep, dbar: &[T], q: &mut [T]) {
    let st = x.kept::<T>(d, keep, None);
    x.back(d, &st, dbar, Some(q), None);
}

/// The dual reverse from (D̄, Ḋ̄) for the tangent ṙ_ij: the parameter gradient added to `grad`
/// (the whole parameter vector's; only the descriptor's tensors are touched).
pub fn dual<T: Real>(
    d: &Dims,
    x: &RepflowIn<'_, T>,
    keep: &Keep,
    rdot: &[T],
    dbar: &[T],
    ddotbar: &[T],
    grad: &mut [T],
) {
    let st = x.kept::<Dual<T>>(d, keep, Some(rdot));
    // Cotangent Ḋ̄ + ε D̄: the ε part of the result is the parameters' adjoint (dual.rs).
    let seed: Vec<Dual<T>> = (ddotbar.iter().zip(dbar))
        .map(|(&db, &b)| Dual::new(db, b))
        .collect();
    let mut g = vec![Dual::default(); grad.len()];
    x.back(d, &st, &seed, None, Some(&mut g));
    for (gv, v) in grad.iter_mut().zip(g) {
        *gv += v.d;
    }
}

//! DPA-3's RepFlow block (docs/deepmd-spec.md §18) written once as a forward on the tape, as
//! DPA-2's is (tape_block.rs gives its passes): what a device runs (`backend/device_tape`).
//! The cpu backend runs repflow.rs's hand-written passes instead, about twice as fast there;
//! the two agree to rounding (tests/dpa3_tape.rs).
//!
//! The tape runs a centre's whole lists, e_sel and a_sel slots: a batch's shapes are then the
//! model's, and so are a device's buffers (the host bodies' cut to the widest real list,
//! block.rs's `Cut`, gives shapes that change batch by batch). A padding slot or a pair outside
//! the angle list is masked wherever a real feature reads it; its own features are left as the
//! updates make them, read by nothing real.

use super::act::cst;
use super::dual::Num;
use super::repflow::{Compress, RepflowIn, RepflowOpts, COS_SHRINK, UNIT_EPS};
use super::tape::{Elem, Tape, NONE, V};
use super::tape_block::{self, tebd, update, BlockEnv, Ctx, List, TapeBlock};
use crate::backend::keep::Keep;
use crate::backend::{Dims, Real};
use crate::model::dpa3::{AngleLayout, Dpa3Layout, RepflowLayerLayout};
use crate::model::Layer;

impl TapeBlock for RepflowOpts {
    type Layout = Dpa3Layout;

    fn nt(&self) -> usize {
        self.nt
    }

    fn nsel(&self) -> usize {
        self.s
    }

    fn protection(&self) -> f64 {
        self.protection
    }

    fn excludes(&self, ti: usize, tj: usize) -> bool {
        self.exclude[ti * self.nt + tj]
    }

    fn rot_width(&self) -> Option<usize> {
        self.rot.then_some(self.e)
    }

    fn build<T: Real, N: Num<T>>(
        ctx: &Ctx<'_, Self, T>,
        t: &mut Tape<'_, T, N>,
        rij: V,
    ) -> (V, Option<V>) {
        ctx.repflow(t, rij)
    }
}

/// The block's per-batch constants: the edge list's geometry and the angle list's.
struct Flow {
    e: BlockEnv,
    /// 1 on real slots, `[m][1]`.
    mask: V,
    /// The symmetrisation's weights h_ij·sw_ij/√S `[m][3]`.
    hw: V,
    /// Each slot's centre.
    centre: Vec<u32>,
    angle: Option<Angles>,
}

/// The angle list (a centre's first A slots that are real and within a_rcut, spec §18.2) and
/// its pairs (j, k), `[nc·A·A]` rows.
struct Angles {
    /// The slot row of each angle row c·A + j ([`NONE`] outside the list), and its centre.
    slot: Vec<u32>,
    centre: Vec<u32>,
    /// Each pair's angle rows of its j and its k.
    pj: Vec<u32>,
    pk: Vec<u32>,
    /// κ û_j·û_k `[nc·A·A][1]`, 0 off the list.
    cos: V,
    /// 1 on the list's pairs `[nc·A·A][1]`, and ρ's weights asw_j·asw_k/√A there.
    pair: V,
    wjk: V,
    /// Each slot's angle row ([`NONE`] outside the list): where ρ reads its sum.
    rho_rows: Vec<u32>,
    /// 1 where ρ is the edge itself (a real slot outside the list, without
    /// smooth_edge_update), `[m][1]`.
    copy: Option<V>,
}

/// 1 where `on`, else 0, as a `[len][1]` constant.
fn ones<T: Real, N: Num<T>>(t: &mut Tape<'_, T, N>, on: &[bool]) -> V {
    let v: Vec<T> = on
        .iter()
        .map(|&b| if b { T::one() } else { T::zero() })
        .collect();
    t.consts(&v, on.len(), 1)
}

impl<T: Real> Ctx<'_, RepflowOpts, T> {
    /// D `[nc][width]` from the r_ij leaf (spec §18): the initial node, edge and angle
    /// features, the layers, the last nodes (with T[t_i] where concat_output_tebd); and where
    /// the model asks for the rotation matrix, hg of the last edges (DeePMD-kit's repflows'
    /// `rot_mat`: the weights h·sw/√S of the node symmetrisation).
    fn repflow<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rij: V) -> (V, Option<V>) {
        let (o, l) = (self.x.o, self.x.l);
        let list = List {
            s: o.s,
            rcut: o.e_rcut,
            rcut_smth: o.e_rcut_smth,
            stats: 0,
            excluded_is_padding: true,
            exp_switch: o.exp_switch,
        };
        let e = self.env(t, rij, &list);
        let f = self.flow(t, e);
        let tt = tebd(t, &l.tebd);
        let ti = t.rows(tt, &self.centre_rows());
        let mut n = t.act(ti, o.act);
        let x = if o.edge_init_use_dist {
            f.e.r
        } else {
            t.cols(f.e.rhat, 0..1)
        };
        let z = t.linear(x, l.edge_embd.w, Some(l.edge_embd.b), o.e);
        let mut e = if o.edge_init_use_dist {
            z
        } else {
            t.act(z, o.act)
        };
        let mut a = f.angle.as_ref().map(|ang| {
            let a0 = t.linear(ang.cos, l.angle_embd, None, o.ad);
            t.scale(a0, cst::<T>(1.0 / std::f64::consts::PI.sqrt()))
        });
        for ll in &l.layers {
            (n, e, a) = self.layer(t, &f, ll, (n, e, a));
        }
        let hg = (o.rot).then(|| t.bmm(f.hw, e, self.nc, 3, f.e.s, o.e, true, false));
        let desc = if o.concat_output_tebd {
            t.concat(&[n, ti])
        } else {
            n
        };
        (desc, hg)
    }

    fn flow<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, e: BlockEnv) -> Flow {
        let o = self.x.o;
        let mask = ones(t, &e.real);
        let h = t.cols(e.rhat, 1..4);
        let swg = t.scale(e.sw, cst::<T>(o.g_scale));
        let hw = t.mul(h, swg);
        let centre = (0..self.nc * e.s).map(|r| (r / e.s) as u32).collect();
        let angle = o.update_angle.then(|| self.angles(t, &e));
        Flow {
            e,
            mask,
            hw,
            centre,
            angle,
        }
    }

    fn angles<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, e: &BlockEnv) -> Angles {
        let o = self.x.o;
        let (nc, s, a) = (self.nc, e.s, o.a);
        let a_rcut = cst::<T>(o.a_rcut);
        // repflow.rs's test of the list, on the host's r_ij.
        let slot: Vec<u32> = (0..nc * a)
            .map(|q| {
                let (c, j) = (q / a, q % a);
                let v = &self.x.rij[3 * (self.d.mixed_slots(c).start + j)..][..3];
                let r = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
                let row = c * s + j;
                if e.real[row] && r < a_rcut {
                    row as u32
                } else {
                    NONE
                }
            })
            .collect();
        let centre = (0..nc * a).map(|q| (q / a) as u32).collect();
        let (pj, pk): (Vec<u32>, Vec<u32>) = (0..nc * a * a)
            .map(|p| {
                let (c, j, k) = (p / (a * a), p / a % a, p % a);
                ((c * a + j) as u32, (c * a + k) as u32)
            })
            .unzip();
        let on: Vec<bool> = (pj.iter().zip(&pk))
            .map(|(&j, &k)| slot[j as usize] != NONE && slot[k as usize] != NONE)
            .collect();
        let pair = ones(t, &on);
        let inv = t.map(e.r, Elem::Recip(UNIT_EPS));
        let u = t.mul(e.rv, inv);
        let u = t.rows(u, &slot);
        let cos = t.bmm(u, u, nc, a, 3, a, false, true);
        let cos = t.reshape(cos, nc * a * a, 1);
        let cos = t.scale(cos, cst::<T>(COS_SHRINK));
        let asw = t.map(e.r, Elem::switch(o.exp_switch, o.a_rcut_smth, o.a_rcut));
        let asw = t.rows(asw, &slot);
        let wjk = t.bmm(asw, asw, nc, a, 1, a, false, true);
        let wjk = t.reshape(wjk, nc * a * a, 1);
        let wjk = t.scale(wjk, cst::<T>(o.rho_scale));
        let rho_rows: Vec<u32> = (0..nc * s)
            .map(|row| {
                let (c, j) = (row / s, row % s);
                let q = c * a + j;
                if j < a && slot[q] != NONE {
                    q as u32
                } else {
                    NONE
                }
            })
            .collect();
        let copy = (!o.smooth_edge_update).then(|| {
            let on: Vec<bool> = (e.real.iter().zip(&rho_rows))
                .map(|(&r, &q)| r && q == NONE)
                .collect();
            ones(t, &on)
        });
        Angles {
            slot,
            centre,
            pj,
            pk,
            cos,
            pair,
            wjk,
            rho_rows,
            copy,
        }
    }

    /// One RepFlowLayer (spec §18.4-18.5): (nodes, edges, angles) → their updates. Every
    /// message reads the layer's inputs; in the sequential update each reads the latest
    /// features instead: the angle branch the edges after their own message, the node's
    /// messages the edges after both.
    fn layer<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        f: &Flow,
        ll: &RepflowLayerLayout,
        (n, e, a): (V, V, Option<V>),
    ) -> (V, V, Option<V>) {
        let o = self.x.o;
        let nj = t.rows(n, &f.e.owner);
        let z1 = t.linear(n, ll.node_self.w, Some(ll.node_self.b), o.n);
        let u1 = t.act(z1, o.act);
        let v1 = self.edge_message(t, f, &ll.edge_self, (n, nj, e));
        let v1 = t.mul(v1, f.mask);
        let res = &ll.e_residual;
        let branch = ll.angle.as_ref().zip(f.angle.as_ref()).zip(a);
        let angle = |t: &mut Tape<'_, T, N>, edges: V| {
            let ((al, ang), a) = branch.expect("the angle branch");
            self.angle(t, f, (al, ang, &ll.a_residual), (n, edges, a))
        };
        let (e_out, a_out) = match (o.sequential, branch.is_some()) {
            (true, true) => {
                let es1 = update(t, o.style, e, &[v1], &res[..1], o.e);
                let (v2, a_out) = angle(t, es1);
                (update(t, o.style, es1, &[v2], &res[1..], o.e), Some(a_out))
            }
            (false, true) => {
                let (v2, a_out) = angle(t, e);
                (update(t, o.style, e, &[v1, v2], res, o.e), Some(a_out))
            }
            (_, false) => (update(t, o.style, e, &[v1], res, o.e), a),
        };
        let read = if o.sequential { e_out } else { e };
        let u2 = self.node_sym(t, f, &ll.node_sym, (nj, read));
        let u3 = self.edge_message(t, f, &ll.node_edge, (n, nj, read));
        let u3 = t.mul(u3, f.e.sw);
        let u3 = t.sum_rows(u3, f.e.s);
        let u3 = t.scale(u3, cst::<T>(o.u3_scale));
        let mut terms = vec![u1, u2];
        terms.extend((0..o.h).map(|h| t.cols(u3, h * o.n..(h + 1) * o.n)));
        let n_out = update(t, o.style, n, &terms, &ll.n_residual, o.n);
        (n_out, e_out, a_out)
    }

    /// φ([n_i, n_j, e_ij]·W + b) `[m][nout]` of every slot (unmasked), n_i's part once a
    /// centre.
    fn edge_message<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        f: &Flow,
        l: &Layer,
        (n, nj, e): (V, V, V),
    ) -> V {
        let (o, w) = (self.x.o, l.nout);
        let pre = t.linear(n, l.w, Some(l.b), w);
        let pre = t.rows(pre, &f.centre);
        let zj = t.linear(nj, l.w + o.n * w, None, w);
        let ze = t.linear(e, l.w + 2 * o.n * w, None, w);
        let z = t.add(zj, ze);
        let z = t.add(z, pre);
        t.act(z, o.act)
    }

    /// u²: φ(node_sym([G(e), G(n_j)])), G(x) = (hwᵀx)[:M]ᵀ(hwᵀx)/3 of each centre.
    fn node_sym<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, f: &Flow, l: &Layer, xs: (V, V)) -> V {
        let (o, nc, s) = (self.x.o, self.nc, f.e.s);
        let mut g = |x: V| {
            let w = t.shape(x).1;
            let hg = t.bmm(f.hw, x, nc, 3, s, w, true, false);
            let hga = t.cols(hg, 0..o.m);
            let gg = t.bmm(hga, hg, nc, o.m, 3, w, true, false);
            let gg = t.scale(gg, T::one() / cst::<T>(3.0));
            t.reshape(gg, nc, o.m * w)
        };
        let (ge, gn) = (g(xs.1), g(xs.0));
        let cat = t.concat(&[ge, gn]);
        let z = t.linear(cat, l.w, Some(l.b), o.n);
        t.act(z, o.act)
    }

    /// The angle branch: the edge's angle message v² `[m][E]` (masked) and the angles'
    /// update, from the nodes, the edges it reads and the angles.
    fn angle<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        f: &Flow,
        (al, ang, a_res): (&AngleLayout, &Angles, &[usize]),
        (n, e, a): (V, V, V),
    ) -> (V, V) {
        let o = self.x.o;
        let ea = t.rows(e, &ang.slot);
        let (nt, et) = match o.compress {
            Compress::None => (n, ea),
            Compress::Split => (t.cols(n, 0..o.nc), t.cols(ea, 0..o.ec)),
            Compress::Linear => {
                let (cn, ce) = (al.compress_n, al.compress_e);
                (
                    t.linear(n, cn.expect("a linear compression"), None, o.nc),
                    t.linear(ea, ce.expect("a linear compression"), None, o.ec),
                )
            }
        };
        let z6 = self.pair_linear(t, ang, &al.angle_self, (a, nt, et));
        let b = t.act(z6, o.act);
        let b = t.mul(b, ang.pair);
        let a_out = update(t, o.style, a, &[b], a_res, o.ad);
        let a_in = if o.sequential { a_out } else { a };
        let z5 = self.pair_linear(t, ang, &al.edge_angle1, (a_in, nt, et));
        let m5 = t.act(z5, o.act);
        let m5 = t.mul(m5, ang.wjk);
        let rho = t.sum_rows(m5, o.a);
        let mut rho = t.rows(rho, &ang.rho_rows);
        if let Some(copy) = ang.copy {
            let c = t.mul(e, copy);
            rho = t.add(rho, c);
        }
        let l7 = &al.edge_angle2;
        let z7 = t.linear(rho, l7.w, Some(l7.b), o.e);
        let v2 = t.act(z7, o.act);
        (t.mul(v2, f.mask), a_out)
    }

    /// [a_jk, ñ, ẽ_k, ẽ_j]·W + b `[nc·A·A][nout]` of every pair: the node's part once a
    /// centre, the edges' once a slot.
    fn pair_linear<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        ang: &Angles,
        l: &Layer,
        (a, nt, et): (V, V, V),
    ) -> V {
        let (o, w) = (self.x.o, l.nout);
        let (rn, rk, rj) = (o.ad, o.ad + o.nc, o.ad + o.nc + o.ec);
        let za = t.linear(a, l.w, None, w);
        let pn = t.linear(nt, l.w + rn * w, Some(l.b), w);
        let pn = t.rows(pn, &ang.centre);
        let pk = t.linear(et, l.w + rk * w, None, w);
        let pk = t.add(pk, pn);
        let pj = t.linear(et, l.w + rj * w, None, w);
        let zk = t.rows(pk, &ang.pk);
        let zj = t.rows(pj, &ang.pj);
        let z = t.add(za, zk);
        t.add(z, zj)
    }
}

// The block's passes on the cpu's tape, for checking the tape a device runs against
// repflow.rs's passes (tests/dpa3_tape.rs): the cpu backend runs repflow.rs's.

/// D `[nc][width]` of every centre; the tape kept for the backward.
pub fn forward<T: Real>(d: &Dims, x: &RepflowIn<'_, T>, keep: &Keep, desc: &mut [T]) {
    tape_block::forward(d, x, keep, desc)
}

/// q = ∂E/∂r_ij `[nslots][3]` from D̄ `[nc][width]`.
pub fn backward<T: Real>(d: &Dims, x: &RepflowIn<'_, T>, keep: &Keep, dbar: &[T], q: &mut [T]) {
    tape_block::backward(d, x, keep, dbar, q)
}

/// Ḋ `[nc][width]` for the tangent ṙ_ij `[nslots][3]`; the tape kept for the dual reverse.
pub fn tangent<T: Real>(d: &Dims, x: &RepflowIn<'_, T>, keep: &Keep, rdot: &[T], ddot: &mut [T]) {
    tape_block::tangent(d, x, keep, rdot, ddot)
}

/// The dual reverse from (D̄, Ḋ̄) for the tangent ṙ_ij: the parameter gradient added to `grad`.
pub fn dual<T: Real>(
    d: &Dims,
    x: &RepflowIn<'_, T>,
    keep: &Keep,
    rdot: &[T],
    (dbar, ddotbar): (&[T], &[T]),
    grad: &mut [T],
) {
    tape_block::dual(d, x, keep, rdot, dbar, ddotbar, grad)
}

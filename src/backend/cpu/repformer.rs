//! DPA-2 on the host (docs/deepmd-spec.md §20): the repinit (DPA-1's embedding without
//! attention, and the three-body block), the hand-over, and the repformer layers, written once
//! as a forward on the tape (tape_block.rs gives the passes).
//!
//! Every block reads its list from the model's (the repinit's), spec §20.2. A neighbour's g1
//! is its owner's row (ghosts read their local atom's).

use std::sync::Arc;

use super::act::cst;
use super::block_in::BlockIn;
use super::dual::Num;
use super::tape::{Elem, Tape, V};
use super::tape_block::{net, net_parts, tebd, update, BlockEnv, Ctx, List, Part, TapeBlock};
use super::three_body::ThreeBody;
use crate::backend::Real;
use crate::model::dpa2::{Dpa2Config, Dpa2Layout, RepformerLayerLayout};
use crate::model::{DescriptorSpec, TebdInputMode};

/// The block's constants, one per model.
#[derive(Clone, Debug, PartialEq)]
pub struct Dpa2Opts {
    pub nt: usize,
    pub c: Dpa2Config,
    /// The repinit's list (the model's): rcut, rcut_smth, nsel S_i; its neuron's last width
    /// M1 and axis_neuron A1; type_one_side.
    pub rcut: f64,
    pub rcut_smth: f64,
    pub si: usize,
    pub m1: usize,
    pub a1: usize,
    pub type_one_side: bool,
    pub protection: f64,
    /// Whether the block gives the rotation matrix after D (a tensor fitting reads it).
    pub rot: bool,
}

impl Dpa2Opts {
    pub fn new(d: &DescriptorSpec, nt: usize, rot: bool) -> Self {
        Dpa2Opts {
            nt,
            c: d.own.dpa2().cloned().expect("a DPA-2 spec"),
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            si: d.sel[0],
            m1: d.m1(),
            a1: d.axis_neuron,
            type_one_side: d.type_one_side,
            protection: d.env_protection,
            rot,
        }
    }

    /// D's width.
    pub fn width(&self) -> usize {
        self.c.dim()
    }

    /// A block's list; davg and dstd hold the repinit's rows, then the repformer's, then the
    /// three-body block's.
    fn list(&self, b: Block) -> List {
        let (c, excluded_is_padding) = (&self.c, matches!(b, Block::Repformer));
        let (s, rcut, rcut_smth, stats) = match b {
            Block::Repinit => (self.si, self.rcut, self.rcut_smth, 0),
            Block::Repformer => (c.repformer.nsel, c.repformer.rcut, c.repformer.rcut_smth, 1),
            Block::ThreeBody => (
                c.repinit.three_body_sel,
                c.repinit.three_body_rcut,
                c.repinit.three_body_rcut_smth,
                2,
            ),
        };
        List {
            s,
            rcut,
            rcut_smth,
            stats,
            excluded_is_padding,
            exp_switch: false,
        }
    }
}

impl TapeBlock for Dpa2Opts {
    type Layout = Dpa2Layout;

    fn nt(&self) -> usize {
        self.nt
    }

    fn nsel(&self) -> usize {
        self.si
    }

    fn protection(&self) -> f64 {
        self.protection
    }

    fn excludes(&self, ti: usize, tj: usize) -> bool {
        self.c.excludes(ti, tj)
    }

    fn rot_width(&self) -> Option<usize> {
        self.rot.then_some(self.c.repformer.g2_dim)
    }

    fn build<T: Real, N: Num<T>>(
        ctx: &Ctx<'_, Self, T>,
        t: &mut Tape<'_, T, N>,
        rij: V,
    ) -> (V, Option<V>) {
        ctx.dpa2(t, rij)
    }
}

/// What every pass reads: the model and the batch.
pub type Dpa2In<'a, T> = BlockIn<'a, Dpa2Opts, Dpa2Layout, T>;

/// Which block's list and statistics.
#[derive(Clone, Copy)]
enum Block {
    Repinit,
    Repformer,
    ThreeBody,
}

impl<T: Real> Ctx<'_, Dpa2Opts, T> {
    /// The repinit's D `[nc][M1·A1]` (spec §20.3).
    fn repinit<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rij: V, tt: V) -> V {
        let (o, l) = (self.x.o, self.x.l);
        let c = &o.c;
        let e = self.env(t, rij, &o.list(Block::Repinit));
        let (nc, s, m1, a1) = (self.nc, e.s, o.m1, o.a1);
        let shat = t.cols(e.rhat, 0..1);
        let centre: Vec<u32> = (0..nc * s).map(|r| self.ctype[r / s] as u32).collect();
        // [s_ij, T_j] or [s_ij, T_j, T_i].
        let mut parts = vec![Part::Cols(shat), Part::Rows(tt, &e.ntype)];
        if !o.type_one_side {
            parts.push(Part::Rows(tt, &centre));
        }
        let types = &parts[1..];
        let act = c.repinit.activation;
        let g = match c.repinit.tebd_input_mode {
            TebdInputMode::Concat => net_parts(t, &parts, &l.repinit, act),
            TebdInputMode::Strip => {
                let gs = net(t, shat, &l.repinit, act);
                let strip = l.repinit_strip.as_ref().expect("strip's type net");
                let mut gt = net_parts(t, types, strip, act);
                if c.smooth {
                    gt = t.mul(gt, e.sw);
                }
                let gg = t.mul(gs, gt);
                t.add(gs, gg)
            }
        };
        let gr = t.bmm(g, e.rhat, nc, m1, s, 4, true, false);
        let gr = t.scale(gr, T::one() / cst::<T>(s as f64));
        let first: Vec<u32> = (0..nc * a1)
            .map(|r| ((r / a1) * m1 + r % a1) as u32)
            .collect();
        let gra = t.rows(gr, &first);
        let dm = t.bmm(gr, gra, nc, m1, 4, a1, false, true);
        t.reshape(dm, nc, m1 * a1)
    }

    /// The whole descriptor `[nc][width]` from the r_ij leaf, and hg where the model asks for
    /// the rotation matrix ([`TapeBlock::build`]).
    fn dpa2<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rij: V) -> (V, Option<V>) {
        let (o, l) = (self.x.o, self.x.l);
        let c = &o.c;
        let tt = tebd(t, &l.tebd);
        let mut out = self.repinit(t, rij, tt);
        if let Some(net) = &l.three_body {
            let b = ThreeBody {
                list: o.list(Block::ThreeBody),
                net,
                strip: l.three_body_strip.as_ref(),
                act: c.repinit.activation,
                smooth: c.smooth,
            };
            let d3 = self.three_body(t, rij, tt, &b);
            out = t.concat(&[out, d3]);
        }
        let g1d = c.repformer.g1_dim;
        if let Some(w) = l.shape_transform {
            out = t.linear(out, w, None, g1d);
        }
        let ti = t.rows(tt, &self.centre_rows());
        if let Some(w) = l.tebd_transform {
            let add = t.linear(ti, w, None, g1d);
            out = t.add(out, add);
        }
        let g1 = t.act(out, c.repformer.activation);
        let (g1, hg) = self.repformer(t, rij, g1);
        let desc = if c.concat_output_tebd {
            t.concat(&[g1, ti])
        } else {
            g1
        };
        (desc, hg)
    }
}

/// The repformer's per-batch constants: the list, the weights of its sums.
struct Rep {
    e: BlockEnv,
    /// w_ij `[m][1]`: the switch (smooth) or the mask.
    w: V,
    /// ν_i (the conv's normalisation) and κ_i (G's), per centre.
    nu: Vec<f64>,
    kappa: Vec<f64>,
    /// Each row's centre.
    centre: Vec<u32>,
}

impl<T: Real> Ctx<'_, Dpa2Opts, T> {
    /// The repformer layers on g1, and hg of their last g2 and h2 where the model asks for it
    /// (DeePMD-kit's repformers' `rot_mat`, with their smooth and use_sqrt_nnei).
    fn repformer<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rij: V, mut g1: V) -> (V, Option<V>) {
        let o = self.x.o;
        let r = &o.c.repformer;
        let smooth = o.c.smooth;
        let e = self.env(t, rij, &o.list(Block::Repformer));
        let (nc, s) = (self.nc, e.s);
        let m = nc * s;
        let mask: Vec<T> = (e.real.iter())
            .map(|&r| if r { T::one() } else { T::zero() })
            .collect();
        let maskc = t.consts(&mask, m, 1);
        let (g2in, mut h2) = if r.direct_dist {
            let k = T::one() / cst::<T>(r.rcut);
            let rr = t.scale(e.r, k);
            let rv = t.scale(e.rv, k);
            (t.mul(rr, maskc), t.mul(rv, maskc))
        } else {
            (t.cols(e.rhat, 0..1), t.cols(e.rhat, 1..4))
        };
        let l = self.x.l;
        let z = t.linear(g2in, l.g2_embd.w, Some(l.g2_embd.b), r.g2_dim);
        let mut g2 = t.act(z, r.activation);
        let n: Vec<f64> = (0..nc)
            .map(|c| e.real[c * s..(c + 1) * s].iter().filter(|&&r| r).count() as f64)
            .collect();
        let sf = s as f64;
        let nu = n
            .iter()
            .map(|&n| if smooth { 1.0 / sf } else { 1.0 / (1e-4 + n) })
            .collect();
        let kappa = (n.iter())
            .map(|&n| match (smooth, r.use_sqrt_nnei) {
                (true, true) => 1.0 / sf.sqrt(),
                (true, false) => 1.0 / sf,
                (false, true) => 1.0 / (1e-4 + n.sqrt()),
                (false, false) => 1.0 / (1e-4 + n),
            })
            .collect();
        let w = if smooth { e.sw } else { maskc };
        let centre = (0..m).map(|row| (row / s) as u32).collect();
        let rep = Rep {
            e,
            w,
            nu,
            kappa,
            centre,
        };
        for ll in &l.layers {
            let (n1, n2, n3) = self.layer(t, &rep, ll, (g1, g2, h2));
            (g1, g2, h2) = (n1, n2, n3);
        }
        let hg = o.rot.then(|| self.hg(t, &rep, h2, g2));
        (g1, hg)
    }

    /// Per-centre constants `v` as a `[nc·k][1]` tensor (each repeated k times).
    fn per_centre<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, v: &[f64], k: usize) -> V {
        let c: Vec<T> = (0..v.len() * k).map(|i| cst::<T>(v[i / k])).collect();
        t.consts(&c, v.len() * k, 1)
    }

    /// ν_i Σ_j x_ij `[nc][cols]`.
    fn conv_sum<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rep: &Rep, x: V) -> V {
        let sum = t.sum_rows(x, rep.e.s);
        let nu = self.per_centre(t, &rep.nu, 1);
        t.mul(sum, nu)
    }

    /// κ_i Σ_j h2_ij ⊗ w_ij g_ij `[nc·3][n_g]` (DeePMD-kit's `_cal_hg`).
    fn hg<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rep: &Rep, h2: V, g: V) -> V {
        let (nc, s) = (self.nc, rep.e.s);
        let ng = t.shape(g).1;
        let gw = t.mul(g, rep.w);
        let hg = t.bmm(h2, gw, nc, 3, s, ng, true, false);
        let kappa = self.per_centre(t, &rep.kappa, 3);
        t.mul(hg, kappa)
    }

    /// G(g) `[nc][A2·n_g]` (spec §20.6's symmetrisation op).
    fn sym<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rep: &Rep, h2: V, g: V) -> V {
        let r = &self.x.o.c.repformer;
        let (nc, a2) = (self.nc, r.axis_neuron);
        let ng = t.shape(g).1;
        let hg = self.hg(t, rep, h2, g);
        let hga = t.cols(hg, 0..a2);
        let gm = t.bmm(hga, hg, nc, a2, 3, ng, true, false);
        let gm = t.scale(gm, T::one() / cst::<T>(3.0));
        t.reshape(gm, nc, a2 * ng)
    }

    /// `[batch·heads][rows][d]` from `[batch·rows][width]`, entry (b, h, r, q) read at column
    /// `q·stride + h + off` (DeePMD-kit's interleaved head layouts, spec §20.6).
    #[allow(clippy::too_many_arguments)]
    fn heads<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        x: V,
        rows: usize,
        heads: usize,
        d: usize,
        stride: usize,
        off: usize,
    ) -> V {
        let (total, width) = t.shape(x);
        let batch = total / rows;
        let mut idx = Vec::with_capacity(batch * heads * rows * d);
        for b in 0..batch {
            for h in 0..heads {
                for r in 0..rows {
                    for q in 0..d {
                        idx.push(((b * rows + r) * width + q * stride + h + off) as u32);
                    }
                }
            }
        }
        t.gather(x, Arc::new(idx), batch * heads * rows, d)
    }

    /// `[batch·rows][k]` per centre and slot spread over `heads`: entry (b, h, r, ·) of the
    /// result reads row b·rows + r.
    fn spread<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, x: V, rows: usize, heads: usize) -> V {
        let (total, _) = t.shape(x);
        let batch = total / rows;
        let idx: Vec<u32> = (0..batch * heads * rows)
            .map(|e| {
                let (b, r) = (e / (heads * rows), e % rows);
                (b * rows + r) as u32
            })
            .collect();
        t.rows(x, &idx)
    }

    /// One RepformerLayer (spec §20.6): (g1, g2, h2) → their updates.
    fn layer<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        rep: &Rep,
        ll: &RepformerLayerLayout,
        (g1, g2, h2): (V, V, V),
    ) -> (V, V, V) {
        let o = self.x.o;
        let r = &o.c.repformer;
        let k = ll.terms;
        let (g1d, g2d) = (r.g1_dim, r.g2_dim);
        let act = r.activation;
        let gg1 = t.rows(g1, &rep.e.owner);
        let mut g1_terms = Vec::new();
        if let Some(mlp) = &ll.g1_self_mlp {
            let z = t.linear(g1, mlp.w, Some(mlp.b), g1d);
            g1_terms.push(t.act(z, act));
        }
        if k.conv_term {
            let w = ll.proj_g1g2.expect("conv's projection");
            let c = t.linear(g2, w, None, g1d);
            let c = t.mul(c, gg1);
            let c = t.mul(c, rep.w);
            g1_terms.push(self.conv_sum(t, rep, c));
        }
        let mut parts = Vec::new();
        if !k.g1_mlp {
            parts.push(g1);
        }
        if k.conv_in {
            let w = ll.proj_g1g2.expect("conv's projection");
            // The projection of each atom's g1 once, then gathered: the same rows as the
            // neighbours' g1 projected slot by slot.
            let c = t.linear(g1, w, None, g2d);
            let c = t.rows(c, &rep.e.owner);
            let c = t.mul(g2, c);
            let c = t.mul(c, rep.w);
            parts.push(self.conv_sum(t, rep, c));
        }
        if k.grrg {
            parts.push(self.sym(t, rep, h2, g2));
        }
        if k.drrd {
            parts.push(self.sym(t, rep, h2, gg1));
        }
        let cat = t.concat(&parts);
        let z = t.linear(cat, ll.linear1.w, Some(ll.linear1.b), g1d);
        g1_terms.push(t.act(z, act));
        if k.g1_attn {
            g1_terms.push(self.local_atten(t, rep, ll, g1));
        }
        let new_g1 = update(t, r.update_style, g1, &g1_terms, &ll.g1_residual, g1d);
        if !k.chnnl_2 {
            return (new_g1, g2, h2);
        }
        let mut g2_terms = Vec::new();
        let l2 = ll.linear2.as_ref().expect("linear2");
        let z = t.linear(g2, l2.w, Some(l2.b), g2d);
        g2_terms.push(t.act(z, act));
        if let Some(w) = ll.proj_g1g1g2 {
            let gi = t.rows(g1, &rep.centre);
            let p = t.mul(gi, gg1);
            let p = t.mul(p, rep.w);
            g2_terms.push(t.linear(p, w, None, g2d));
        }
        let attn = k.attn_map().then(|| self.attn_map(t, rep, ll, g2, h2));
        if k.g2_attn {
            let a = attn.expect("the attention map");
            g2_terms.push(self.g2_attention(t, rep, ll, a, g2));
        }
        let new_g2 = update(t, r.update_style, g2, &g2_terms, &ll.g2_residual, g2d);
        let mut h2_terms = Vec::new();
        if let Some(w) = ll.ev_head_map {
            let a = attn.expect("the attention map");
            h2_terms.push(self.h2_update(t, rep, a, h2, w));
        }
        let new_h2 = update(t, r.update_style, h2, &h2_terms, &ll.h2_residual, 1);
        (new_g1, new_g2, new_h2)
    }

    /// LocalAtten (spec §20.6): attention of each centre's g1 over its neighbours' g1.
    fn local_atten<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        rep: &Rep,
        ll: &RepformerLayerLayout,
        g1: V,
    ) -> V {
        let o = self.x.o;
        let r = &o.c.repformer;
        let (nc, s, g1d, h1, n1) = (self.nc, rep.e.s, r.g1_dim, r.attn1_hidden, r.attn1_nhead);
        let q = t.linear(g1, ll.loc_mapq.expect("mapq"), None, h1 * n1);
        // Each atom's keys and values once, then gathered per slot (as in the conv above).
        let kv = t.linear(g1, ll.loc_mapkv.expect("mapkv"), None, (h1 + g1d) * n1);
        let kv = t.rows(kv, &rep.e.owner);
        let qh = self.heads(t, q, 1, n1, h1, n1, 0);
        let kh = self.heads(t, kv, s, n1, h1, n1, 0);
        let vh = self.heads(t, kv, s, n1, g1d, n1, h1 * n1);
        let a = t.bmm(qh, kh, nc * n1, 1, h1, s, false, true);
        let a = t.scale(a, T::one() / cst::<T>(h1 as f64).sqrt());
        let sw = self.spread(t, rep.e.sw, s, n1);
        let sw = t.reshape(sw, nc * n1, s);
        let mask: Vec<bool> = (0..nc * n1 * s)
            .map(|e| rep.e.real[(e / (n1 * s)) * s + e % s])
            .collect();
        let maskv: Vec<T> = mask
            .iter()
            .map(|&b| if b { T::one() } else { T::zero() })
            .collect();
        let maskc = t.consts(&maskv, nc * n1, s);
        let a = self.smooth_softmax(t, a, sw, maskc, Arc::new(mask));
        let ov = t.bmm(a, vh, nc * n1, 1, s, g1d, false, false);
        let ov = t.reshape(ov, nc, n1 * g1d);
        let hm = ll.loc_head_map.as_ref().expect("head_map");
        t.linear(ov, hm.w, Some(hm.b), g1d)
    }

    /// Softmax over the last axis of logits `a` with DeePMD-kit's smooth shift (sw the
    /// switches' product) or the hard mask, zeroed where not real.
    fn smooth_softmax<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        a: V,
        sw: V,
        maskc: V,
        mask: Arc<Vec<bool>>,
    ) -> V {
        if self.x.o.c.smooth {
            let shift = t.consts(&[cst::<T>(ATTNW_SHIFT)], 1, 1);
            let a = t.add(a, shift);
            let a = t.mul(a, sw);
            let a = t.sub(a, shift);
            let p = t.softmax(a, None);
            let p = t.mul(p, maskc);
            t.mul(p, sw)
        } else {
            let p = t.softmax(a, Some(mask));
            t.mul(p, maskc)
        }
    }

    /// The g2 attention map A `[nc·N2·S][S]` (spec §20.6's Atten2Map).
    fn attn_map<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        rep: &Rep,
        ll: &RepformerLayerLayout,
        g2: V,
        h2: V,
    ) -> V {
        let r = &self.x.o.c.repformer;
        let (nc, s, h, n2) = (self.nc, rep.e.s, r.attn2_hidden, r.attn2_nhead);
        let qk = t.linear(g2, ll.mapqk.expect("mapqk"), None, 2 * h * n2);
        let qh = self.heads(t, qk, s, n2, h, 2 * n2, 0);
        let kh = self.heads(t, qk, s, n2, h, 2 * n2, n2);
        let l = t.bmm(qh, kh, nc * n2, s, h, s, false, true);
        let mut l = t.scale(l, T::one() / cst::<T>(h as f64).sqrt());
        let hh = t.bmm(h2, h2, nc, s, 3, s, false, true);
        let hh = self.spread(t, hh, s, n2);
        if r.attn2_has_gate {
            l = t.mul(l, hh);
        }
        let swjk = t.bmm(rep.e.sw, rep.e.sw, nc, s, 1, s, false, true);
        let swjk = self.spread(t, swjk, s, n2);
        let real = &rep.e.real;
        let mask: Vec<bool> = (0..nc * n2 * s * s)
            .map(|e| {
                let (c, j, k) = (e / (n2 * s * s), (e / s) % s, e % s);
                real[c * s + j] && real[c * s + k]
            })
            .collect();
        let maskv: Vec<T> = mask
            .iter()
            .map(|&b| if b { T::one() } else { T::zero() })
            .collect();
        let maskc = t.consts(&maskv, nc * n2 * s, s);
        // The hard mask hides k alone; rows of a j that is not real are zeroed after.
        let kmask: Vec<bool> = (0..nc * n2 * s * s)
            .map(|e| real[(e / (n2 * s * s)) * s + e % s])
            .collect();
        let a = self.smooth_softmax(t, l, swjk, maskc, Arc::new(kmask));
        let a = t.mul(a, hh);
        t.scale(a, T::one() / cst::<T>(3.0).sqrt())
    }

    /// The g2 attention term: LN(head_map(Σ_k A v)) (spec §20.6's Atten2MultiHeadApply).
    fn g2_attention<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        rep: &Rep,
        ll: &RepformerLayerLayout,
        a: V,
        g2: V,
    ) -> V {
        let r = &self.x.o.c.repformer;
        let (nc, s, g2d, n2) = (self.nc, rep.e.s, r.g2_dim, r.attn2_nhead);
        let v = t.linear(g2, ll.mapv.expect("mapv"), None, g2d * n2);
        let vh = self.heads(t, v, s, n2, g2d, n2, 0);
        let ov = t.bmm(a, vh, nc * n2, s, s, g2d, false, false);
        // (c, j, ch·N2 + h) ← ((c·N2 + h)·S + j)·G2 + ch: channel-major.
        let idx: Vec<u32> = (0..nc * s * g2d * n2)
            .map(|e| {
                let (c, j, col) = (e / (s * g2d * n2), (e / (g2d * n2)) % s, e % (g2d * n2));
                let (ch, h) = (col / n2, col % n2);
                (((c * n2 + h) * s + j) * g2d + ch) as u32
            })
            .collect();
        let cat = t.gather(ov, Arc::new(idx), nc * s, g2d * n2);
        let hm = ll.attn2_head_map.as_ref().expect("head_map");
        let y = t.linear(cat, hm.w, Some(hm.b), g2d);
        let (lw, lb) = ll.attn2_lm.expect("attn2_lm");
        layer_norm(t, y, lw, lb, r.ln_eps)
    }

    /// The h2 term Σ_h w_h Σ_k A^h_jk h2_k (spec §20.6's Atten2EquiVarApply).
    fn h2_update<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rep: &Rep, a: V, h2: V, w: usize) -> V {
        let r = &self.x.o.c.repformer;
        let (nc, s, n2) = (self.nc, rep.e.s, r.attn2_nhead);
        let idx: Vec<u32> = (0..nc * n2 * s * 3)
            .map(|e| {
                let (c, k, q) = (e / (n2 * s * 3), (e / 3) % s, e % 3);
                ((c * s + k) * 3 + q) as u32
            })
            .collect();
        let hk = t.gather(h2, Arc::new(idx), nc * n2 * s, 3);
        let p = t.bmm(a, hk, nc * n2, s, s, 3, false, false);
        let idx: Vec<u32> = (0..nc * s * 3 * n2)
            .map(|e| {
                let (c, j, q, h) = (e / (s * 3 * n2), (e / (3 * n2)) % s, (e / n2) % 3, e % n2);
                (((c * n2 + h) * s + j) * 3 + q) as u32
            })
            .collect();
        let ph = t.gather(p, Arc::new(idx), nc * s * 3, n2);
        let y = t.linear(ph, w, None, 1);
        t.reshape(y, nc * s, 3)
    }
}

/// The attention logits' shift (DeePMD-kit's `attnw_shift`).
const ATTNW_SHIFT: f64 = 20.0;

/// (x − μ)/√(σ² + ε)·w + b over each row (population variance).
fn layer_norm<T: Real, N: Num<T>>(t: &mut Tape<'_, T, N>, y: V, w: usize, b: usize, eps: f64) -> V {
    let cols = t.shape(y).1;
    let inv_n = T::one() / cst::<T>(cols as f64);
    let mean = t.row_sum(y);
    let mean = t.scale(mean, inv_n);
    let xc = t.sub(y, mean);
    let sq = t.mul(xc, xc);
    let var = t.row_sum(sq);
    let var = t.scale(var, inv_n);
    let inv = t.map(var, Elem::Rsqrt(eps));
    let x = t.mul(xc, inv);
    let w = t.param(w, 1, cols);
    let x = t.mul(x, w);
    let b = t.param(b, 1, cols);
    t.add(x, b)
}

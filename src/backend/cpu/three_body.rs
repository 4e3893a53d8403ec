//! DeePMD-kit's three-body block (`DescrptBlockSeTTebd`, docs/deepmd-spec.md §20.4) on the
//! tape: in DPA-2's repinit on its own list (repformer.rs), and alone on the model's list as
//! the se_e3_tebd descriptor, whose constants are here.

use super::act::cst;
use super::block_in::BlockIn;
use super::dual::Num;
use super::tape::{Tape, V};
use super::tape_block::{net, net_parts, tebd, Ctx, List, Part, TapeBlock};
use crate::backend::Real;
use crate::model::se_e3_tebd::{SeE3TebdConfig, SeE3TebdLayout};
use crate::model::{Activation, DescriptorSpec, Net};

/// The block's list and nets: `net` on [e_jk, T_j, T_k] (concat), or on e_jk with `strip` on
/// [T_j, T_k].
pub(crate) struct ThreeBody<'l> {
    pub list: List,
    pub net: &'l Net,
    pub strip: Option<&'l Net>,
    pub act: Activation,
    /// The strip type net's output scaled by the switches sw_j·sw_k.
    pub smooth: bool,
}

impl<O: TapeBlock, T: Real> Ctx<'_, O, T> {
    /// D3 `[nc][M3]` (spec §20.4) from the r_ij leaf and the type embedding `tt` `[nt][T]`.
    pub(crate) fn three_body<N: Num<T>>(
        &self,
        t: &mut Tape<'_, T, N>,
        rij: V,
        tt: V,
        b: &ThreeBody,
    ) -> V {
        let e = self.env(t, rij, &b.list);
        let (nc, s) = (self.nc, e.s);
        let h = t.cols(e.rhat, 1..4);
        let ejk = t.bmm(h, h, nc, s, 3, s, false, true);
        let m3 = nc * s * s;
        let ejk = t.reshape(ejk, m3, 1);
        let (mut jt, mut kt) = (Vec::with_capacity(m3), Vec::with_capacity(m3));
        for cc in 0..nc {
            for j in 0..s {
                for k in 0..s {
                    jt.push(e.ntype[cc * s + j]);
                    kt.push(e.ntype[cc * s + k]);
                }
            }
        }
        let (tj, tk) = (Part::Rows(tt, &jt), Part::Rows(tt, &kt));
        let g = match b.strip {
            None => net_parts(t, &[Part::Cols(ejk), tj, tk], b.net, b.act),
            Some(strip) => {
                let gs = net(t, ejk, b.net, b.act);
                let mut gt = net_parts(t, &[tj, tk], strip, b.act);
                if b.smooth {
                    let swjk = t.bmm(e.sw, e.sw, nc, s, 1, s, false, true);
                    let swjk = t.reshape(swjk, m3, 1);
                    gt = t.mul(gt, swjk);
                }
                let gg = t.mul(gs, gt);
                t.add(gs, gg)
            }
        };
        let ge = t.mul(g, ejk);
        let d3 = t.sum_rows(ge, s * s);
        t.scale(d3, T::one() / cst::<T>((s * s) as f64))
    }
}

/// se_e3_tebd's constants, one per model: its list (the model's) and keys.
#[derive(Clone, Debug, PartialEq)]
pub struct SeE3TebdOpts {
    pub nt: usize,
    pub c: SeE3TebdConfig,
    pub rcut: f64,
    pub rcut_smth: f64,
    pub sel: usize,
    /// M3, the net's last width.
    pub m3: usize,
    pub protection: f64,
}

impl SeE3TebdOpts {
    pub fn new(d: &DescriptorSpec, nt: usize) -> Self {
        SeE3TebdOpts {
            nt,
            c: d.own.se_e3_tebd().cloned().expect("an se_e3_tebd spec"),
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            sel: d.sel[0],
            m3: d.m1(),
            protection: d.env_protection,
        }
    }

    /// D's width.
    pub fn width(&self) -> usize {
        self.c.dim(self.m3)
    }
}

/// What every pass reads: the model and the batch.
pub type SeE3TebdIn<'a, T> = BlockIn<'a, SeE3TebdOpts, SeE3TebdLayout, T>;

impl TapeBlock for SeE3TebdOpts {
    type Layout = SeE3TebdLayout;

    fn nt(&self) -> usize {
        self.nt
    }

    fn nsel(&self) -> usize {
        self.sel
    }

    fn protection(&self) -> f64 {
        self.protection
    }

    fn excludes(&self, ti: usize, tj: usize) -> bool {
        self.c.excludes(ti, tj)
    }

    /// se_e3_tebd gives no rotation matrix (DeePMD-kit's none).
    fn rot_width(&self) -> Option<usize> {
        None
    }

    /// D = D3, then T[t_i] with concat_output_tebd (spec §20.4).
    fn build<T: Real, N: Num<T>>(
        ctx: &Ctx<'_, Self, T>,
        t: &mut Tape<'_, T, N>,
        rij: V,
    ) -> (V, Option<V>) {
        let (o, l) = (ctx.x.o, ctx.x.l);
        let tt = tebd(t, &l.tebd);
        let b = ThreeBody {
            list: List {
                s: o.sel,
                rcut: o.rcut,
                rcut_smth: o.rcut_smth,
                stats: 0,
                excluded_is_padding: false,
                exp_switch: false,
            },
            net: &l.embed,
            strip: l.embed_strip.as_ref(),
            act: o.c.activation,
            smooth: o.c.smooth,
        };
        let d3 = ctx.three_body(t, rij, tt, &b);
        let desc = if o.c.concat_output_tebd {
            let ti = t.rows(tt, &ctx.centre_rows());
            t.concat(&[d3, ti])
        } else {
            d3
        };
        (desc, None)
    }
}

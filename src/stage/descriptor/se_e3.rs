//! se_e3: D = Σ_{ti≤tj} 1/(sel_ti·sel_tj) Σ_{j∈ti, k∈tj} e_jk G_{ti,tj}(e_jk), e_jk = r̃_j·r̃_k
//! (docs/design.md §10, tests/reference/descriptors/README.md).
//!
//! The embedding nets run over pairs, not slots: one row per (centre, j, k) in the blocks of
//! [`Pairs`], each pair type's net on its blocks through the dense ops, with a unit input
//! tangent stored and the pair's ė as the tangent scale of the dual reverse.

use crate::backend::{Backend, Dims, Pairs, Real};
use crate::mem::OutOfMemory;

use super::super::env::Env;
use super::super::net::{net_dual_backward, net_forward, NetCache, NetDual, Zeros};
use super::super::DescModel;
use super::Stage;
use crate::model::DescriptorLayout;

pub struct SeE3<T: Real, B: Backend<T>> {
    pairs: Pairs,
    /// e, ė of every pair row, and ones: the unit input tangent of the nets.
    e: B::Buf,
    edot: B::Buf,
    ones: B::Buf,
    /// Every layer of the nets over the pair rows; the last gives G and G' = dG/de.
    nets: NetCache<B::Buf>,
    /// D, Ḋ: `[nc][M1]`.
    desc: B::Buf,
    ddot: B::Buf,
    /// Ḡ, Ġ̄ of every pair row.
    gbar: B::Buf,
    gdotbar: B::Buf,
}

impl<T: Real, B: Backend<T>> SeE3<T, B> {
    pub fn new(
        b: &B,
        layout: &DescriptorLayout,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Self, OutOfMemory> {
        let pairs = d.pairs();
        let (np, nc, m1) = (pairs.len(), d.ncentres(), d.m1);
        Ok(SeE3 {
            e: zeros(np)?,
            edot: zeros(np)?,
            ones: b.upload(&vec![T::one(); np]),
            nets: NetCache::new(zeros, &layout.embed[0], np)?,
            desc: zeros(m1 * nc)?,
            ddot: zeros(m1 * nc)?,
            gbar: zeros(m1 * np)?,
            gdotbar: zeros(m1 * np)?,
            pairs,
        })
    }
}

impl<T: Real, B: Backend<T>> Stage<T, B> for SeE3<T, B> {
    fn desc(&self) -> &B::Buf {
        &self.desc
    }

    fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    fn buffers(&self) -> Vec<&B::Buf> {
        let mut v: Vec<&B::Buf> = self.nets.all().collect();
        v.extend([
            &self.e,
            &self.edot,
            &self.ones,
            &self.desc,
            &self.ddot,
            &self.gbar,
            &self.gdotbar,
        ]);
        v
    }

    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        b.angle_values(d, &env.rhat, &mut self.e);
        for (p, net) in m.layout.embed.iter().enumerate() {
            for tc in 0..d.ntypes {
                let rows = self.pairs.block(tc, p);
                net_forward(
                    b,
                    m.params,
                    net,
                    rows,
                    &mut self.nets,
                    (&self.e, &self.ones),
                );
            }
        }
        let (g, _) = self.nets.out();
        b.angle_forward(d, &self.e, g, &mut self.desc);
    }

    fn backward(
        &mut self,
        b: &B,
        _m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        let (g, gp) = self.nets.out();
        b.angle_backward(d, &env.rhat, &env.jac, &self.e, g, gp, dbar, q);
    }

    fn tangent(&mut self, b: &B, _m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        b.angle_values_tangent(d, &env.rhat, &env.rdot, &mut self.edot);
        let (g, gp) = self.nets.out();
        b.angle_tangent(d, &self.e, &self.edot, g, gp, &mut self.ddot);
    }

    fn dual(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        _env: &Env<T, B>,
        (dbar, ddotbar): (&B::Buf, &B::Buf),
    ) {
        b.angle_dual(
            d,
            &self.e,
            &self.edot,
            dbar,
            ddotbar,
            &mut self.gbar,
            &mut self.gdotbar,
        );
        for (p, net) in m.layout.embed.iter().enumerate() {
            for tc in 0..d.ntypes {
                let dual = NetDual {
                    input: (&self.e, &self.ones),
                    seed: (&self.gbar, &self.gdotbar),
                    scale: Some(&self.edot),
                    input_adjoint: false,
                };
                let rows = self.pairs.block(tc, p);
                net_dual_backward(b, m.params, grad, net, rows, &mut self.nets, dual);
            }
        }
    }
}

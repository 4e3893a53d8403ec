//! The embedding stage over slots, shared by the descriptors that embed s = `R̂[0]`: G and
//! G' = dG/ds of every slot, and the dual reverse of the nets from (Ḡ, Ġ̄).

use crate::backend::{Backend, Dims, FusedEmbedding, Real};
use crate::mem::OutOfMemory;
use crate::model::{embed_net_index, DescriptorLayout, Net};

use super::env::Env;
use super::net::{net_dual_backward, net_forward, NetCache, NetDual, Zeros};
use super::DescModel;

/// Embedding values: G and G' alone when the backend fuses the nets, else every layer's.
pub enum Embed<Buf> {
    Fused { g: Buf, gp: Buf },
    Layered(NetCache<Buf>),
}

impl<Buf: Send + Sync> Embed<Buf> {
    pub fn new<T: Real, B: Backend<T, Buf = Buf>>(
        b: &B,
        layout: &DescriptorLayout,
        d: &Dims,
        zeros: &Zeros<Buf>,
    ) -> Result<Self, OutOfMemory> {
        let (ns, m1) = (d.nslots(), d.m1);
        Ok(if b.fused_embedding().is_some() {
            Embed::Fused {
                g: zeros(ns * m1)?,
                gp: zeros(ns * m1)?,
            }
        } else {
            Embed::Layered(NetCache::new(zeros, &layout.embed[0], ns)?)
        })
    }

    /// G and G' of every slot, `[nslots][M1]`.
    pub fn g_gp(&self) -> (&Buf, &Buf) {
        match self {
            Embed::Fused { g, gp } => (g, gp),
            Embed::Layered(c) => c.out(),
        }
    }

    pub fn buffers(&self) -> Vec<&Buf> {
        match self {
            Embed::Fused { g, gp } => vec![g, gp],
            Embed::Layered(c) => c.all().collect(),
        }
    }

    pub fn forward<T: Real, B: Backend<T, Buf = Buf>>(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
    ) {
        match self {
            Embed::Fused { g, gp } => {
                let nets = m.nets().all(d);
                fused(b).embed_forward(d, &nets, m.params, &env.s, &env.owner, g, gp)
            }
            Embed::Layered(c) => forward_layered(b, m, d, env, c),
        }
    }

    /// The dual reverse of every embedding net from (Ḡ, Ġ̄) with input tangent ṡ, into
    /// `grad`; nothing flows into R̂ (coordinates are data), so no input adjoint leaves layer 0.
    #[allow(clippy::too_many_arguments)]
    pub fn dual<T: Real, B: Backend<T, Buf = Buf>>(
        &mut self,
        b: &B,
        params: &Buf,
        grad: &mut Buf,
        m: &Nets,
        d: &Dims,
        env: &Env<T, B>,
        gbar: &Buf,
        gdotbar: &Buf,
    ) {
        match self {
            Embed::Fused { .. } => {
                let nets = m.all(d);
                fused(b).embed_dual_backward(
                    d, &nets, params, &env.s, &env.owner, &env.sdot, gbar, gdotbar, grad,
                )
            }
            Embed::Layered(c) => {
                for ti in 0..d.ntypes {
                    for tj in d.sections() {
                        let dual = NetDual {
                            input: (&env.s, &env.ones_s),
                            seed: (gbar, gdotbar),
                            scale: Some(&env.sdot),
                            input_adjoint: false,
                        };
                        let net = m.net(d, ti, tj);
                        net_dual_backward(b, params, grad, net, d.block(ti, tj), c, dual);
                    }
                }
            }
        }
    }
}

/// The backend's fused embedding stage, which an [`Embed::Fused`] was made for.
pub fn fused<T: Real, B: Backend<T>>(b: &B) -> &dyn FusedEmbedding<T, Buf = B::Buf, Idx = B::Idx> {
    b.fused_embedding()
        .expect("Embed::Fused is made only for a backend with a fused embedding")
}

/// The embedding nets of a model and which serves each block (ti, tj).
pub struct Nets<'a> {
    pub layout: &'a DescriptorLayout,
    pub type_one_side: bool,
}

impl<'a> Nets<'a> {
    /// The net of block (centre type ti, neighbour section tj); a layout of one net (DPA-1's
    /// mixed list, or one type) serves every block.
    pub fn net(&self, d: &Dims, ti: usize, tj: usize) -> &'a Net {
        if self.layout.embed.len() == 1 {
            return &self.layout.embed[0];
        }
        &self.layout.embed[embed_net_index(self.type_one_side, d.ntypes, ti, tj)]
    }

    /// The net of every block, `[ti·nsec + tj]`.
    pub fn all(&self, d: &Dims) -> Vec<&'a Net> {
        let ns = d.nsec;
        (0..d.ntypes * ns)
            .map(|k| self.net(d, k / ns, k % ns))
            .collect()
    }
}

/// G and G' layer by layer through the dense ops, keeping every layer for the dual pass.
fn forward_layered<T: Real, B: Backend<T>>(
    b: &B,
    m: &DescModel<'_, T, B>,
    d: &Dims,
    env: &Env<T, B>,
    c: &mut NetCache<B::Buf>,
) {
    let nets = m.nets();
    for ti in 0..d.ntypes {
        for tj in d.sections() {
            let net = nets.net(d, ti, tj);
            net_forward(b, m.params, net, d.block(ti, tj), c, (&env.s, &env.ones_s));
        }
    }
}

//! se_e2_r: D = (1/5)(1/nnei) Σ_j G(s_j), every slot counted, padding included (docs/design.md
//! §10, tests/reference/descriptors/README.md).

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;

use super::super::embed::Embed;
use super::super::env::Env;
use super::super::net::Zeros;
use super::super::DescModel;
use super::Stage;
use crate::model::DescriptorLayout;

pub struct SeE2R<T: Real, B: Backend<T>> {
    embed: Embed<B::Buf>,
    /// D, Ḋ: `[nc][M1]`.
    desc: B::Buf,
    ddot: B::Buf,
    /// Ḡ, Ġ̄ of every slot.
    gbar: B::Buf,
    gdotbar: B::Buf,
}

impl<T: Real, B: Backend<T>> SeE2R<T, B> {
    pub fn new(
        b: &B,
        layout: &DescriptorLayout,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Self, OutOfMemory> {
        let (ns, nc, m1) = (d.nslots(), d.ncentres(), d.m1);
        Ok(SeE2R {
            embed: Embed::new(b, layout, d, zeros)?,
            desc: zeros(m1 * nc)?,
            ddot: zeros(m1 * nc)?,
            gbar: zeros(m1 * ns)?,
            gdotbar: zeros(m1 * ns)?,
        })
    }
}

impl<T: Real, B: Backend<T>> Stage<T, B> for SeE2R<T, B> {
    fn desc(&self) -> &B::Buf {
        &self.desc
    }

    fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    fn buffers(&self) -> Vec<&B::Buf> {
        let mut v = self.embed.buffers();
        v.extend([&self.desc, &self.ddot, &self.gbar, &self.gdotbar]);
        v
    }

    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        self.embed.forward(b, m, d, env);
        let (g, _) = self.embed.g_gp();
        b.radial_forward(d, g, &mut self.desc);
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
        let (_, gp) = self.embed.g_gp();
        b.radial_backward(d, dbar, gp, &env.jac, q);
    }

    fn tangent(&mut self, b: &B, _m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let (_, gp) = self.embed.g_gp();
        b.radial_tangent(d, gp, &env.sdot, &mut self.ddot);
    }

    fn dual(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        env: &Env<T, B>,
        (dbar, ddotbar): (&B::Buf, &B::Buf),
    ) {
        b.radial_dual(d, dbar, ddotbar, &mut self.gbar, &mut self.gdotbar);
        let nets = m.nets();
        self.embed
            .dual(b, m.params, grad, &nets, d, env, &self.gbar, &self.gdotbar);
    }
}

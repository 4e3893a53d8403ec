//! se_e2_a: A = (1/nnei) Σ_j G(s_j) ⊗ R̂_j, D = A A<ᵀ (docs/deepmd-spec.md §5–§6).

use crate::backend::{Backend, ContractDual, Dims, Real};
use crate::mem::OutOfMemory;

use super::super::embed::{fused, Embed};
use super::super::env::Env;
use super::super::net::Zeros;
use super::super::DescModel;
use super::Stage;
use crate::model::DescriptorLayout;

pub struct SeE2A<T: Real, B: Backend<T>> {
    embed: Embed<B::Buf>,
    /// A, Ā, Ȧ: `4·M1` per centre, laid out as the backend's contraction ops like.
    a: B::Buf,
    abar: B::Buf,
    adot: B::Buf,
    desc: B::Buf,
    ddot: B::Buf,
    /// Ḡ, Ġ̄ of every slot, empty where the backend's fused stage makes them as it goes.
    gbar: B::Buf,
    gdotbar: B::Buf,
    /// ∂L/∂A from a tensor fitting, where the model has one.
    rot_bar: Option<B::Buf>,
}

impl<T: Real, B: Backend<T>> SeE2A<T, B> {
    pub fn new(
        b: &B,
        layout: &DescriptorLayout,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        rot: bool,
    ) -> Result<Self, OutOfMemory> {
        let (ns, nc, m1, m2) = (d.nslots(), d.ncentres(), d.m1, d.m2);
        // ∂L/∂A joins Ḡ between the contraction's and the embedding's dual passes, which a
        // fused backend otherwise runs as one.
        let slot_adjoints = if b.fused_embedding().is_some() && !rot {
            0
        } else {
            m1 * ns
        };
        Ok(SeE2A {
            embed: Embed::new(b, layout, d, zeros)?,
            a: zeros(4 * m1 * nc)?,
            abar: zeros(4 * m1 * nc)?,
            adot: zeros(4 * m1 * nc)?,
            desc: zeros(m1 * m2 * nc)?,
            ddot: zeros(m1 * m2 * nc)?,
            gbar: zeros(slot_adjoints)?,
            gdotbar: zeros(slot_adjoints)?,
            rot_bar: if rot { Some(zeros(4 * m1 * nc)?) } else { None },
        })
    }
}

impl<T: Real, B: Backend<T>> Stage<T, B> for SeE2A<T, B> {
    fn desc(&self) -> &B::Buf {
        &self.desc
    }

    fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    fn rot(&self) -> Option<&B::Buf> {
        self.rot_bar.as_ref().map(|_| &self.a)
    }

    fn rot_bar_mut(&mut self) -> Option<&mut B::Buf> {
        self.rot_bar.as_mut()
    }

    fn buffers(&self) -> Vec<&B::Buf> {
        let mut v = self.embed.buffers();
        v.extend([
            &self.a,
            &self.desc,
            &self.abar,
            &self.adot,
            &self.ddot,
            &self.gbar,
            &self.gdotbar,
        ]);
        v.extend(&self.rot_bar);
        v
    }

    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        self.embed.forward(b, m, d, env);
        let (g, _) = self.embed.g_gp();
        b.contract_forward(d, g, &env.rhat, &mut self.a, &mut self.desc);
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
        let (g, gp) = self.embed.g_gp();
        b.contract_backward(d, &self.a, dbar, &mut self.abar);
        b.slot_backward(d, &self.abar, g, gp, &env.rhat, &env.jac, q);
    }

    fn tangent(&mut self, b: &B, _m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let (g, gp) = self.embed.g_gp();
        b.contract_tangent(
            d,
            g,
            gp,
            &env.rhat,
            &env.rdot,
            &self.a,
            &mut self.adot,
            &mut self.ddot,
        );
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
        let contract = ContractDual {
            a: &self.a,
            adot: &self.adot,
            dbar,
            ddotbar,
            rhat: &env.rhat,
            rdot: &env.rdot,
        };
        let nets = m.nets();
        match &mut self.embed {
            Embed::Fused { .. } if self.rot_bar.is_none() => fused(b).contract_embed_dual(
                d,
                &nets.all(d),
                m.params,
                &env.s,
                &env.owner,
                &env.sdot,
                contract,
                grad,
            ),
            embed => {
                contract.run(b, d, &mut self.gbar, &mut self.gdotbar);
                if let Some(rot_bar) = &self.rot_bar {
                    b.contract_gbar(d, rot_bar, &env.rhat, &mut self.gbar);
                }
                embed.dual(b, m.params, grad, &nets, d, env, &self.gbar, &self.gdotbar);
            }
        }
    }
}

//! DPA-1 (`se_atten`, `se_atten_v2`): a type embedding T, one embedding net over every slot of
//! one mixed-type list, attention layers over each centre's slots, then se_e2_a's contraction,
//! D_i with T[t_i] appended (docs/design.md §11).
//!
//! G⁰ = N([ŝ_j, T[t_j], T[t_i]]) (concat) runs through the dense ops with the unit input tangent
//! e₀, so the net gives G⁰ and G⁰' = ∂G⁰/∂ŝ, as the other embedding nets do; the attention block
//! is one op family (`attn_*`) whose passes read G⁰, G⁰', R̂ and the switch σ.

use crate::backend::{AttnArgs, AttnOpts, Backend, Dims, Real};
use crate::mem::OutOfMemory;
use crate::model::{AttnLayout, Net, TebdInputMode};

use super::super::env::Env;
use super::super::net::{net_dual_backward, net_forward, NetCache, NetDual, Zeros};
use super::super::DescModel;

pub struct SeAtten<T: Real, B: Backend<T>> {
    block: Block<B::Buf>,
    /// The embedding net's input width, 1 + (1 or 2)·tebd_dim, and D's row width.
    nin: usize,
    stride: usize,
    concat_output: bool,
    /// The type of each slot's centre, and of each centre.
    slot_centre_type: B::Idx,
    centre_type: B::Idx,
    /// The embedding net's input [ŝ, T[t_j], T[t_i]] and its unit tangent e₀, `[nslots][nin]`.
    x0: B::Buf,
    x0dot: B::Buf,
    /// D, Ḋ: `[nc][stride]`.
    desc: B::Buf,
    ddot: B::Buf,
    /// Ḡ⁰, Ġ̄⁰ per slot.
    g0bar: B::Buf,
    g0dotbar: B::Buf,
}

/// What the attention ops read besides the model and the environment: the embedding net's
/// layers (G⁰, G⁰' the last), σ and dσ/dŝ per slot.
struct Block<Buf> {
    opts: AttnOpts,
    nets: NetCache<Buf>,
    sw: Buf,
    dsw: Buf,
}

impl<Buf> Block<Buf> {
    fn args<'a, T: Real, B: Backend<T, Buf = Buf>>(
        &'a self,
        m: &'a DescModel<'_, T, B>,
        env: &'a Env<T, B>,
    ) -> AttnArgs<'a, Buf, B::Idx> {
        let (g0, g0p) = self.nets.out();
        AttnArgs {
            layout: attn_layout(m),
            opts: self.opts,
            params: m.params,
            g0,
            g0p,
            rhat: &env.rhat,
            sw: &self.sw,
            dsw: &self.dsw,
            owner: &env.owner,
        }
    }
}

/// The type lists of the embedding net's input: t_j, and t_i unless type_one_side.
fn input_types<'a, T: Real, B: Backend<T>>(
    m: &DescModel<'_, T, B>,
    env: &'a Env<T, B>,
    slot_centre_type: &'a B::Idx,
) -> Vec<&'a B::Idx> {
    let nei = (env.nei_type.as_ref()).expect("a mixed-type batch has its neighbour types");
    if m.type_one_side {
        vec![nei]
    } else {
        vec![nei, slot_centre_type]
    }
}

fn attn_layout<'a, T: Real, B: Backend<T>>(m: &'a DescModel<'_, T, B>) -> &'a AttnLayout {
    m.layout
        .attn
        .as_ref()
        .expect("a DPA-1 layout has its attention nets")
}

impl<T: Real, B: Backend<T>> SeAtten<T, B> {
    pub fn new(
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
    ) -> anyhow::Result<Self> {
        let cfg = m.attention.expect("a DPA-1 model has its attention keys");
        if cfg.tebd_input_mode == TebdInputMode::Strip {
            anyhow::bail!(
                "tebd_input_mode strip (se_atten_v2, or se_atten with strip) is not built in dpw \
                 yet (issue 30); se_atten with tebd_input_mode concat is"
            );
        }
        let (ns, nc, m1, m2) = (d.nslots(), d.ncentres(), d.m1, d.m2);
        let net: &Net = &m.layout.embed[0];
        let nin = net.layers[0].nin;
        let tebd_dim = attn_layout(m).tebd.dim;
        let stride = m1 * m2 + if cfg.concat_output_tebd { tebd_dim } else { 0 };
        let mut slot_type = vec![0; ns];
        let mut centre_type = vec![0; nc];
        for (c, ct) in centre_type.iter_mut().enumerate() {
            let tc = d.centre_type(c);
            *ct = tc as i32;
            let at = d.slot(tc, c, 0, 0);
            slot_type[at..at + d.nnei].fill(tc as i32);
        }
        let mut unit = vec![T::zero(); ns * nin];
        for row in unit.chunks_mut(nin) {
            row[0] = T::one();
        }
        let alloc = |n| -> Result<B::Buf, OutOfMemory> { zeros(n) };
        Ok(SeAtten {
            block: Block {
                opts: AttnOpts::new(cfg, m1, m2),
                nets: NetCache::new(zeros, net, ns)?,
                sw: alloc(ns)?,
                dsw: alloc(ns)?,
            },
            nin,
            stride,
            concat_output: cfg.concat_output_tebd,
            slot_centre_type: b.upload_idx(&slot_type),
            centre_type: b.upload_idx(&centre_type),
            x0: alloc(ns * nin)?,
            x0dot: b.upload(&unit),
            desc: alloc(nc * stride)?,
            ddot: alloc(nc * stride)?,
            g0bar: alloc(ns * m1)?,
            g0dotbar: alloc(ns * m1)?,
        })
    }

    pub fn desc(&self) -> &B::Buf {
        &self.desc
    }

    pub fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    pub fn buffers(&self) -> Vec<&B::Buf> {
        let mut v: Vec<&B::Buf> = self.block.nets.all().collect();
        v.extend([
            &self.x0,
            &self.x0dot,
            &self.block.sw,
            &self.block.dsw,
            &self.desc,
            &self.ddot,
            &self.g0bar,
            &self.g0dotbar,
        ]);
        v
    }

    pub fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let tebd = &attn_layout(m).tebd;
        let types = input_types(m, env, &self.slot_centre_type);
        b.tebd_rows(
            tebd,
            m.params,
            Some(&env.s),
            &types,
            &mut self.x0,
            self.nin,
            0,
        );
        let blk = &mut self.block;
        let net = &m.layout.embed[0];
        let input = (&self.x0, &self.x0dot);
        net_forward(b, m.params, net, 0..d.nslots(), &mut blk.nets, input);
        let dstd = m.dstd;
        b.attn_switch(
            d,
            m.env,
            &env.rij,
            &env.owner,
            dstd,
            &mut blk.sw,
            &mut blk.dsw,
        );
        b.attn_forward(d, &self.block.args(m, env), &mut self.desc, self.stride);
        if self.concat_output {
            let at = self.block.opts.m1 * self.block.opts.m2;
            let types = [&self.centre_type];
            b.tebd_rows(
                tebd,
                m.params,
                None,
                &types,
                &mut self.desc,
                self.stride,
                at,
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        b.attn_backward(d, &self.block.args(m, env), &env.jac, dbar, self.stride, q);
    }

    pub fn tangent(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let args = self.block.args(m, env);
        b.attn_tangent(d, &args, &env.rdot, &mut self.ddot, self.stride);
    }

    pub fn dual(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        grad: &mut B::Buf,
        d: &Dims,
        env: &Env<T, B>,
        (dbar, ddotbar): (&B::Buf, &B::Buf),
    ) {
        let g0_adjoints = (&mut self.g0bar, &mut self.g0dotbar);
        let args = self.block.args(m, env);
        b.attn_dual(
            d,
            &args,
            &env.rdot,
            (dbar, ddotbar),
            self.stride,
            g0_adjoints,
            grad,
        );
        let dual = NetDual {
            input: (&self.x0, &self.x0dot),
            seed: (&self.g0bar, &self.g0dotbar),
            scale: Some(&env.sdot),
            input_adjoint: true,
        };
        let net = &m.layout.embed[0];
        let nets = &mut self.block.nets;
        net_dual_backward(b, m.params, grad, net, 0..d.nslots(), nets, dual);
        let tebd = &attn_layout(m).tebd;
        let types = input_types(m, env, &self.slot_centre_type);
        let xbar = &self.block.nets.xbar[0];
        b.tebd_rows_backward(tebd, true, &types, xbar, self.nin, 0, grad);
        if self.concat_output {
            let at = self.block.opts.m1 * self.block.opts.m2;
            let types = [&self.centre_type];
            b.tebd_rows_backward(tebd, false, &types, dbar, self.stride, at, grad);
        }
    }
}

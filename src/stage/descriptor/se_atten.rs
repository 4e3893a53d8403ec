//! DPA-1 (`se_atten`, `se_atten_v2`): a type embedding T, one embedding net over every slot of
//! one mixed-type list, attention layers over each centre's slots, then se_e2_a's contraction,
//! D_i with T[t_i] appended (docs/design.md §11).
//!
//! G⁰ comes with its derivative G⁰' = ∂G⁰/∂ŝ, so the attention block's passes (one op family,
//! `attn_*`) read only G⁰, G⁰', R̂ and the switch σ: concat's G⁰ = N([ŝ_j, T[t_j], T[t_i]]) runs
//! through the dense ops with the unit input tangent e₀, as the other embedding nets do; strip's
//! G⁰ = G_s(ŝ_j) ⊙ (1 + c_j τ[t_i, t_j]) combines a slot net with the type net's table
//! (`strip_*`).

use crate::backend::{AttnArgs, AttnOpts, Backend, Dims, Real, StripArgs};
use crate::mem::OutOfMemory;
use crate::model::{AttnLayout, Net, TebdInputMode};

use super::super::embed::Embed;
use super::super::env::Env;
use super::super::net::{net_dual_backward, net_forward, NetCache, NetDual, Zeros};
use super::super::DescModel;
use super::Stage;

pub struct SeAtten<T: Real, B: Backend<T>> {
    block: Block<B::Buf>,
    input: Input<B::Buf, B::Idx>,
    /// D's row width: M1·M2, + tebd_dim with concat_output_tebd.
    stride: usize,
    concat_output: bool,
    /// The type of each slot's centre, and of each centre.
    slot_centre_type: B::Idx,
    centre_type: B::Idx,
    /// D, Ḋ: `[nc][stride]`.
    desc: B::Buf,
    ddot: B::Buf,
    /// Ḡ⁰, Ġ̄⁰ per slot.
    g0bar: B::Buf,
    g0dotbar: B::Buf,
    /// A `[nc][4][M1]` and ∂L/∂A, where a tensor fitting reads the rotation matrix.
    rot: Option<(B::Buf, B::Buf)>,
}

/// How G⁰ is made.
enum Input<Buf, Idx> {
    Concat(Concat<Buf>),
    Strip(Strip<Buf, Idx>),
}

/// concat: the embedding net's input [ŝ, T[t_j], T[t_i]] (no T[t_i] with type_one_side) and its
/// unit tangent e₀, `[nslots][nin]`, and its layers over the slots (G⁰, G⁰' the last).
struct Concat<Buf> {
    nin: usize,
    x0: Buf,
    x0dot: Buf,
    nets: NetCache<Buf>,
}

/// strip: the slot net G_s(ŝ) — se_e2_a's embedding stage, which on a backend with a fused
/// embedding evaluates the padding once per centre type —, G⁰ and G⁰', the type net N_t over
/// its table of type pairs, and the buffers of its dual.
struct Strip<Buf, Idx> {
    slot: Embed<Buf>,
    g0: Buf,
    g0p: Buf,
    /// Rows of the table: (t_i, t_j) at t_i·ntypes + t_j (t_j alone with type_one_side); the
    /// input [T[t_j], T[t_i]] and a zero tangent.
    rows: usize,
    types: Vec<Idx>,
    xt: Buf,
    xt_zero: Buf,
    nets: NetCache<Buf>,
    /// τ̄, the zero seed of its tangent, and (Ḡ_s, Ġ̄_s) per slot.
    taubar: Buf,
    tau_zero: Buf,
    gsbar: Buf,
    gsdotbar: Buf,
}

/// What the attention ops read besides the model, the environment and G⁰: σ and dσ/dŝ per
/// slot.
struct Block<Buf> {
    opts: AttnOpts,
    sw: Buf,
    dsw: Buf,
}

impl<Buf, Idx> Input<Buf, Idx> {
    /// G⁰ and G⁰' per slot.
    fn g0(&self) -> (&Buf, &Buf) {
        match self {
            Input::Concat(c) => c.nets.out(),
            Input::Strip(st) => (&st.g0, &st.g0p),
        }
    }
}

impl<Buf> Block<Buf> {
    /// The ops' arguments; `abar`, a tensor fitting's ∂L/∂A, for the dual reverse.
    fn args<'a, T: Real, B: Backend<T, Buf = Buf>>(
        &'a self,
        input: &'a Input<Buf, B::Idx>,
        m: &'a DescModel<'_, T, B>,
        env: &'a Env<T, B>,
        abar: Option<&'a Buf>,
    ) -> AttnArgs<'a, Buf, B::Idx> {
        let (g0, g0p) = input.g0();
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
            abar,
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
    (m.layout.own.attn()).expect("a DPA-1 layout has its attention nets")
}

impl<T: Real, B: Backend<T>> SeAtten<T, B> {
    pub fn new(
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        rot: bool,
    ) -> anyhow::Result<Self> {
        let cfg = m.attention.expect("a DPA-1 model has its attention keys");
        let attn = attn_layout(m);
        let (ns, nc, m1, m2, nt) = (d.nslots(), d.ncentres(), d.m1, d.m2, d.ntypes);
        let net: &Net = &m.layout.embed[0];
        let stride = m1 * m2
            + if cfg.concat_output_tebd {
                attn.tebd.dim
            } else {
                0
            };
        let mut slot_type = vec![0; ns];
        let mut centre_type = vec![0; nc];
        for (c, ct) in centre_type.iter_mut().enumerate() {
            *ct = d.centre_type(c) as i32;
            slot_type[d.mixed_slots(c)].fill(*ct);
        }
        let alloc = |n| -> Result<B::Buf, OutOfMemory> { zeros(n) };
        let input = if cfg.tebd_input_mode == TebdInputMode::Strip {
            let tnet = attn.strip.as_ref().expect("strip has its type net");
            let tnin = tnet.layers[0].nin;
            let (ti, tj): (Vec<i32>, Vec<i32>) = if m.type_one_side {
                (vec![], (0..nt as i32).collect())
            } else {
                (0..nt * nt)
                    .map(|r| ((r / nt) as i32, (r % nt) as i32))
                    .unzip()
            };
            let rows = tj.len();
            let mut types = vec![b.upload_idx(&tj)];
            if !m.type_one_side {
                types.push(b.upload_idx(&ti));
            }
            Input::Strip(Strip {
                slot: Embed::new(b, m.layout, d, zeros)?,
                g0: alloc(ns * m1)?,
                g0p: alloc(ns * m1)?,
                rows,
                types,
                xt: alloc(rows * tnin)?,
                xt_zero: alloc(rows * tnin)?,
                nets: NetCache::new(zeros, tnet, rows)?,
                taubar: alloc(rows * m1)?,
                tau_zero: alloc(rows * m1)?,
                gsbar: alloc(ns * m1)?,
                gsdotbar: alloc(ns * m1)?,
            })
        } else {
            let nin = net.layers[0].nin;
            let mut unit = vec![T::zero(); ns * nin];
            for row in unit.chunks_mut(nin) {
                row[0] = T::one();
            }
            Input::Concat(Concat {
                nin,
                x0: alloc(ns * nin)?,
                x0dot: b.upload(&unit),
                nets: NetCache::new(zeros, net, ns)?,
            })
        };
        Ok(SeAtten {
            block: Block {
                opts: AttnOpts::new(cfg, m1, m2),
                sw: alloc(ns)?,
                dsw: alloc(ns)?,
            },
            input,
            stride,
            concat_output: cfg.concat_output_tebd,
            slot_centre_type: b.upload_idx(&slot_type),
            centre_type: b.upload_idx(&centre_type),
            desc: alloc(nc * stride)?,
            ddot: alloc(nc * stride)?,
            g0bar: alloc(ns * m1)?,
            g0dotbar: alloc(ns * m1)?,
            rot: if rot {
                Some((alloc(nc * 4 * m1)?, alloc(nc * 4 * m1)?))
            } else {
                None
            },
        })
    }

    fn strip_args<'a>(
        blk: &'a Block<B::Buf>,
        (gs, gsp): (&'a B::Buf, &'a B::Buf),
        tau: &'a B::Buf,
        m: &DescModel<'_, T, B>,
        env: &'a Env<T, B>,
        slot_centre_type: &'a B::Idx,
    ) -> StripArgs<'a, B::Buf, B::Idx> {
        StripArgs {
            ntypes: attn_layout(m).tebd.ntypes,
            m1: blk.opts.m1,
            one_side: m.type_one_side,
            smooth: blk.opts.smooth,
            gs,
            gsp,
            tau,
            nei_type: (env.nei_type.as_ref()).expect("a mixed-type batch has its neighbour types"),
            centre_type: slot_centre_type,
            sw: &blk.sw,
            dsw: &blk.dsw,
        }
    }
}

impl<T: Real, B: Backend<T>> Stage<T, B> for SeAtten<T, B> {
    fn desc(&self) -> &B::Buf {
        &self.desc
    }

    fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    fn buffers(&self) -> Vec<&B::Buf> {
        let mut v: Vec<&B::Buf> = Vec::new();
        match &self.input {
            Input::Concat(c) => {
                v.extend(c.nets.all());
                v.extend([&c.x0, &c.x0dot]);
            }
            Input::Strip(s) => {
                v.extend(s.slot.buffers());
                v.extend(s.nets.all());
                v.extend([
                    &s.g0,
                    &s.g0p,
                    &s.xt,
                    &s.xt_zero,
                    &s.taubar,
                    &s.tau_zero,
                    &s.gsbar,
                    &s.gsdotbar,
                ]);
            }
        }
        v.extend([
            &self.block.sw,
            &self.block.dsw,
            &self.desc,
            &self.ddot,
            &self.g0bar,
            &self.g0dotbar,
        ]);
        v.extend(self.rot.iter().flat_map(|(a, abar)| [a, abar]));
        v
    }

    fn rot(&self) -> Option<&B::Buf> {
        self.rot.as_ref().map(|(a, _)| a)
    }

    fn rot_bar_mut(&mut self) -> Option<&mut B::Buf> {
        self.rot.as_mut().map(|(_, abar)| abar)
    }

    fn forward(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let tebd = &attn_layout(m).tebd;
        let blk = &mut self.block;
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
        match &mut self.input {
            Input::Concat(c) => {
                let types = input_types(m, env, &self.slot_centre_type);
                b.tebd_rows(tebd, m.params, Some(&env.s), &types, &mut c.x0, c.nin, 0);
                let net = &m.layout.embed[0];
                let input = (&c.x0, &c.x0dot);
                net_forward(b, m.params, net, 0..d.nslots(), &mut c.nets, input);
            }
            Input::Strip(st) => {
                let tnet = attn_layout(m)
                    .strip
                    .as_ref()
                    .expect("strip has its type net");
                let types: Vec<&B::Idx> = st.types.iter().collect();
                let tnin = tnet.layers[0].nin;
                b.tebd_rows(tebd, m.params, None, &types, &mut st.xt, tnin, 0);
                let input = (&st.xt, &st.xt_zero);
                net_forward(b, m.params, tnet, 0..st.rows, &mut st.nets, input);
                st.slot.forward(b, m, d, env);
                let tau = st.nets.out().0;
                let gs = st.slot.g_gp();
                let args = Self::strip_args(blk, gs, tau, m, env, &self.slot_centre_type);
                b.strip_forward(&args, &mut st.g0, &mut st.g0p);
            }
        }
        let args = self.block.args(&self.input, m, env, None);
        let rot = self.rot.as_mut().map(|(a, _)| a);
        b.attn_forward(d, &args, &mut self.desc, self.stride, rot);
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
    fn backward(
        &mut self,
        b: &B,
        m: &DescModel<'_, T, B>,
        d: &Dims,
        env: &Env<T, B>,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        let args = self.block.args(&self.input, m, env, None);
        b.attn_backward(d, &args, &env.jac, dbar, self.stride, q);
    }

    fn tangent(&mut self, b: &B, m: &DescModel<'_, T, B>, d: &Dims, env: &Env<T, B>) {
        let args = self.block.args(&self.input, m, env, None);
        b.attn_tangent(d, &args, &env.rdot, &mut self.ddot, self.stride);
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
        let g0_adjoints = (&mut self.g0bar, &mut self.g0dotbar);
        let abar = self.rot.as_ref().map(|(_, abar)| abar);
        let args = self.block.args(&self.input, m, env, abar);
        b.attn_dual(
            d,
            &args,
            &env.rdot,
            (dbar, ddotbar),
            self.stride,
            g0_adjoints,
            grad,
        );
        let tebd = &attn_layout(m).tebd;
        match &mut self.input {
            Input::Concat(c) => {
                let dual = NetDual {
                    input: (&c.x0, &c.x0dot),
                    seed: (&self.g0bar, &self.g0dotbar),
                    scale: Some(&env.sdot),
                    input_adjoint: true,
                };
                let net = &m.layout.embed[0];
                net_dual_backward(b, m.params, grad, net, 0..d.nslots(), &mut c.nets, dual);
                let types = input_types(m, env, &self.slot_centre_type);
                b.tebd_rows_backward(tebd, true, &types, &c.nets.xbar[0], c.nin, 0, grad);
            }
            Input::Strip(st) => {
                let tau = st.nets.out().0;
                let gs = st.slot.g_gp();
                let args = Self::strip_args(&self.block, gs, tau, m, env, &self.slot_centre_type);
                let gs_adjoints = (&mut st.gsbar, &mut st.gsdotbar);
                let g0_adjoints = (&self.g0bar, &self.g0dotbar);
                b.strip_dual(&args, &env.sdot, g0_adjoints, gs_adjoints, &mut st.taubar);
                let (gsbar, gsdotbar) = (&st.gsbar, &st.gsdotbar);
                st.slot
                    .dual(b, m.params, grad, &m.nets(), d, env, gsbar, gsdotbar);
                let tnet = attn_layout(m)
                    .strip
                    .as_ref()
                    .expect("strip has its type net");
                let dual = NetDual {
                    input: (&st.xt, &st.xt_zero),
                    seed: (&st.taubar, &st.tau_zero),
                    scale: None,
                    input_adjoint: true,
                };
                net_dual_backward(b, m.params, grad, tnet, 0..st.rows, &mut st.nets, dual);
                let types: Vec<&B::Idx> = st.types.iter().collect();
                let tnin = tnet.layers[0].nin;
                b.tebd_rows_backward(tebd, false, &types, &st.nets.xbar[0], tnin, 0, grad);
            }
        }
        if self.concat_output {
            let at = self.block.opts.m1 * self.block.opts.m2;
            let types = [&self.centre_type];
            b.tebd_rows_backward(tebd, false, &types, dbar, self.stride, at, grad);
        }
    }
}

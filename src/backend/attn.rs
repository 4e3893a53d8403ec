//! The arguments of DPA-1's ops (docs/design.md §11), shared by every backend, and their host
//! bodies: the op table's default for each (`ops.rs`), so a backend without kernels for them
//! runs DPA-1 through them (downloading its inputs, computing on the host, writing the outputs
//! back). The CPU backend runs the attention block's and the strip's bodies on its buffers in
//! place ([`AttnArgs::in_place`]; the strip's take any slices); its type-embedding ops take the
//! defaults, whose transfers are copies there. The wgpu backend has kernels for all of them
//! (`shaders/attn.wgsl`; the block's four passes from one forward and one backward over
//! numbers, `shaders/attn_block.wgsl`); so has the cuda backend (`kernels/attn.cu`,
//! `kernels/attn_block.cu`), whose block runs through these bodies unless
//! `DPW_CUDA_ATTN=kernels` until a GPU has checked its kernels.

use std::borrow::Cow;

use super::cpu::attn as host;
use super::cpu::strip;
use super::{Device, Dims, Real};
use crate::geometry::{env_switch, EnvParams};
use crate::model::{AttentionConfig, AttnLayerLayout, AttnLayout, TebdLayout};

pub use host::LayerParams;

/// The attention block's shape and settings, one per model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnOpts {
    /// M1 (the embedding width), M2 (axis_neuron), H (`attn`).
    pub m1: usize,
    pub m2: usize,
    pub h: usize,
    /// The logits' scale: `temperature`, or (H·scaling_factor)^(−1/2).
    pub alpha: f64,
    pub normalize: bool,
    /// Smooth attention (`smooth_type_embedding`; always for se_atten_v2).
    pub smooth: bool,
    pub dotr: bool,
    pub ln_eps: f64,
    /// Whether the layer norms' scale and shift get a gradient (`trainable_ln`).
    pub trainable_ln: bool,
}

impl AttnOpts {
    pub fn new(c: &AttentionConfig, m1: usize, m2: usize) -> Self {
        AttnOpts {
            m1,
            m2,
            h: c.attn,
            alpha: c
                .temperature
                .unwrap_or_else(|| (c.attn as f64 * c.scaling_factor).powf(-0.5)),
            normalize: c.normalize,
            smooth: c.smooth_type_embedding,
            dotr: c.attn_dotr,
            ln_eps: c.ln_eps,
            trainable_ln: c.trainable_ln,
        }
    }

    /// The sizes of one attention layer's tensors in the order of [`LayerParams`] (W_in, b_in,
    /// W_out, b_out, γ, β): the packed form the host bodies compute with.
    pub fn layer_parts(&self) -> [usize; 6] {
        let (m, h3) = (self.m1, 3 * self.h);
        [m * h3, h3, self.h * m, m, m, m]
    }

    /// Parameters of one attention layer.
    pub fn layer_len(&self) -> usize {
        self.layer_parts().iter().sum()
    }

    /// Where each tensor of [`AttnOpts::layer_parts`] starts in the model's parameters.
    pub(crate) fn layer_offsets(l: &AttnLayerLayout) -> [usize; 6] {
        [
            l.proj_in.w,
            l.proj_in.b,
            l.proj_out.w,
            l.proj_out.b,
            l.ln_w,
            l.ln_b,
        ]
    }

    /// Each layer's parameters as slices of the model's parameter vector.
    pub fn layers<'a, T>(&self, a: &AttnLayout, params: &'a [T]) -> Vec<LayerParams<'a, T>> {
        let parts = self.layer_parts();
        a.layers
            .iter()
            .map(|l| {
                let [w_in, b_in, w_out, b_out, gamma, beta] = std::array::from_fn(|k| {
                    let at = Self::layer_offsets(l)[k];
                    &params[at..at + parts[k]]
                });
                LayerParams {
                    w_in,
                    b_in,
                    w_out,
                    b_out,
                    gamma,
                    beta,
                }
            })
            .collect()
    }

    /// Every layer tensor of `a`, layer after layer in the order of [`LayerParams`]: where it
    /// starts in the packed form and in the model's parameters, its length, and whether it
    /// takes a gradient (the layer norms only where they are trainable).
    pub(crate) fn tensors<'a>(&'a self, a: &'a AttnLayout) -> impl Iterator<Item = Tensor> + 'a {
        a.layers.iter().enumerate().flat_map(move |(l, layer)| {
            let mut packed = l * self.layer_len();
            let parts = Self::layer_offsets(layer)
                .into_iter()
                .zip(self.layer_parts());
            parts.enumerate().map(move |(k, (at, len))| {
                packed += len;
                Tensor {
                    packed: packed - len,
                    at,
                    len,
                    trained: k < 4 || self.trainable_ln,
                }
            })
        })
    }

    /// Adds a packed gradient (layer after layer) into the model's; the layer norms' only where
    /// they are trainable.
    pub(crate) fn add_grad<T: Real>(&self, a: &AttnLayout, packed: &[T], grad: &mut [T]) {
        for t in self.tensors(a).filter(|t| t.trained) {
            let from = &packed[t.packed..t.packed + t.len];
            for (g, v) in grad[t.at..t.at + t.len].iter_mut().zip(from) {
                *g += *v;
            }
        }
    }
}

/// One attention layer tensor ([`AttnOpts::tensors`]).
pub(crate) struct Tensor {
    pub packed: usize,
    pub at: usize,
    pub len: usize,
    pub trained: bool,
}

/// What every pass of the attention block reads: the model's layers and parameters, and per
/// slot G⁰, G⁰' = ∂G⁰/∂ŝ `[nslots][M1]`, R̂ `[nslots][4]`, σ and dσ/dŝ, the owners.
pub struct AttnArgs<'a, B, I> {
    pub layout: &'a AttnLayout,
    pub opts: AttnOpts,
    pub params: &'a B,
    pub g0: &'a B,
    pub g0p: &'a B,
    pub rhat: &'a B,
    pub sw: &'a B,
    pub dsw: &'a B,
    pub owner: &'a I,
    /// ∂L/∂A `[ncentres][4][M1]` of a tensor fitting, which the dual reverse adds to the
    /// contraction's Ā (`None` but there).
    pub abar: Option<&'a B>,
}

/// [`AttnArgs`] on the host: downloaded, or borrowed where the buffers are host vectors.
struct HostArgs<'h, T: Clone> {
    params: Cow<'h, [T]>,
    g0: Cow<'h, [T]>,
    g0p: Cow<'h, [T]>,
    rhat: Cow<'h, [T]>,
    sw: Cow<'h, [T]>,
    dsw: Cow<'h, [T]>,
    owner: Cow<'h, [i32]>,
    abar: Option<Cow<'h, [T]>>,
}

impl<'a, B, I> AttnArgs<'a, B, I> {
    fn host<T: Real, K: Device<T, Buf = B, Idx = I> + ?Sized>(&self, b: &K) -> HostArgs<'_, T> {
        HostArgs {
            params: b.download(self.params).into(),
            g0: b.download(self.g0).into(),
            g0p: b.download(self.g0p).into(),
            rhat: b.download(self.rhat).into(),
            sw: b.download(self.sw).into(),
            dsw: b.download(self.dsw).into(),
            owner: b.download_idx(self.owner).into(),
            abar: self.abar.map(|a| b.download(a).into()),
        }
    }

    /// Runs `f` on the host view of the arguments.
    fn with<T: Real, K: Device<T, Buf = B, Idx = I> + ?Sized, R>(
        &self,
        b: &K,
        f: impl FnOnce(&host::AttnIn<'_, T>) -> R,
    ) -> R {
        self.run(&self.host(b), f)
    }

    fn run<T: Real, R>(&self, h: &HostArgs<'_, T>, f: impl FnOnce(&host::AttnIn<'_, T>) -> R) -> R {
        let layers = self.opts.layers(self.layout, &h.params);
        f(&host::AttnIn {
            opts: self.opts,
            layers: &layers,
            g0: &h.g0,
            g0p: &h.g0p,
            rhat: &h.rhat,
            sw: &h.sw,
            dsw: &h.dsw,
            owner: &h.owner,
            abar: h.abar.as_deref(),
        })
    }
}

impl<T: Real> AttnArgs<'_, Vec<T>, Vec<i32>> {
    /// Runs `f` on the arguments where they are: the cpu backend's bodies, which need no copy.
    pub fn in_place<R>(&self, f: impl FnOnce(&host::AttnIn<'_, T>) -> R) -> R {
        let h = HostArgs {
            params: self.params.into(),
            g0: self.g0.into(),
            g0p: self.g0p.into(),
            rhat: self.rhat.into(),
            sw: self.sw.into(),
            dsw: self.dsw.into(),
            owner: self.owner.into(),
            abar: self.abar.map(|a| a.into()),
        };
        self.run(&h, f)
    }
}

/// What one run of the attention block's kernels computes, on a backend with them (wgpu, cuda):
/// D (on duals Ḋ), and A where asked; the forces' q from D̄; the dual reverse's Ḡ⁰, Ġ̄⁰ and
/// parameter gradient from (D̄, Ḋ̄) and a tensor fitting's Ā (`AttnArgs::abar`).
pub enum BlockPass<'a, B> {
    Forward(&'a mut B, Option<&'a mut B>),
    Backward {
        jac: &'a B,
        dbar: &'a B,
        q: &'a mut B,
    },
    Dual {
        dbar: &'a B,
        ddotbar: &'a B,
        g0bar: &'a mut B,
        g0dotbar: &'a mut B,
        grad: &'a mut B,
    },
}

/// The bodies of the attention ops on any backend.
pub fn attn_forward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &AttnArgs<B::Buf, B::Idx>,
    desc: &mut B::Buf,
    stride: usize,
    rot: Option<&mut B::Buf>,
) {
    let mut out = b.download(desc);
    let mut a_out = rot.as_deref().map(|r| b.download(r));
    a.with(b, |x| {
        host::forward(d, x, &mut out, stride, a_out.as_deref_mut())
    });
    b.write(desc, &out);
    if let (Some(rot), Some(v)) = (rot, a_out) {
        b.write(rot, &v);
    }
}

pub fn attn_backward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &AttnArgs<B::Buf, B::Idx>,
    jac: &B::Buf,
    dbar: &B::Buf,
    stride: usize,
    q: &mut B::Buf,
) {
    let (jac, dbar) = (b.download(jac), b.download(dbar));
    let mut out = vec![T::zero(); 3 * d.nslots()];
    a.with(b, |x| host::backward(d, x, &jac, &dbar, stride, &mut out));
    b.write(q, &out);
}

pub fn attn_tangent<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &AttnArgs<B::Buf, B::Idx>,
    rdot: &B::Buf,
    ddot: &mut B::Buf,
    stride: usize,
) {
    let rdot = b.download(rdot);
    let mut out = b.download(ddot);
    a.with(b, |x| host::tangent(d, x, &rdot, &mut out, stride));
    b.write(ddot, &out);
}

#[allow(clippy::too_many_arguments)]
pub fn attn_dual<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    a: &AttnArgs<B::Buf, B::Idx>,
    rdot: &B::Buf,
    (dbar, ddotbar): (&B::Buf, &B::Buf),
    stride: usize,
    (g0bar, g0dotbar): (&mut B::Buf, &mut B::Buf),
    grad: &mut B::Buf,
) {
    let (rdot, dbar, ddotbar) = (b.download(rdot), b.download(dbar), b.download(ddotbar));
    let n = d.nslots() * a.opts.m1;
    let (mut gb, mut gdb) = (vec![T::zero(); n], vec![T::zero(); n]);
    let packed = a.with(b, |x| {
        host::dual(d, x, &rdot, &dbar, &ddotbar, stride, &mut gb, &mut gdb)
    });
    let mut g = b.download(grad);
    a.opts.add_grad(a.layout, &packed, &mut g);
    b.write(grad, &g);
    b.write(g0bar, &gb);
    b.write(g0dotbar, &gdb);
}

/// σ and dσ/dŝ of every slot (0 for padding): the switch and its slope against the normalised
/// radial value ŝ = (sw/(r + p) − davg₀)/dstd₀ of the centre's type.
pub fn attn_switch<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    env: EnvParams,
    rij: &B::Buf,
    owner: &B::Idx,
    dstd: &B::Buf,
    (sw, dsw): (&mut B::Buf, &mut B::Buf),
) {
    let (rij, owner, dstd) = (b.download(rij), b.download_idx(owner), b.download(dstd));
    let ns = d.nslots();
    let (mut s, mut ds) = (vec![T::zero(); ns], vec![T::zero(); ns]);
    for c in 0..d.ncentres() {
        let std0 = dstd[4 * d.centre_type(c)].f64();
        for slot in d.mixed_slots(c) {
            if owner[slot] < 0 {
                continue;
            }
            let x = [0, 1, 2].map(|a| rij[3 * slot + a].f64());
            let (v, slope) = env_switch(x, &env);
            s[slot] = T::of(v);
            ds[slot] = T::of(slope * std0);
        }
    }
    b.write(sw, &s);
    b.write(dsw, &ds);
}

/// Rows of type-embedding values: `out[r·stride + col..]` = `[lead[r], T[types[0][r]],
/// T[types[1][r]], ...]` (no lead column without `lead`), for every row r of the type lists.
#[allow(clippy::too_many_arguments)]
pub fn tebd_rows<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    t: &TebdLayout,
    params: &B::Buf,
    lead: Option<&B::Buf>,
    types: &[&B::Idx],
    out: &mut B::Buf,
    stride: usize,
    col: usize,
) {
    let params = b.download(params);
    let table: Vec<Vec<T>> = (0..t.ntypes).map(|ty| t.row(&params, ty)).collect();
    let lead = lead.map(|l| b.download(l));
    let types: Vec<Vec<i32>> = types.iter().map(|i| b.download_idx(i)).collect();
    let mut o = b.download(out);
    for r in 0..types.first().map_or(0, Vec::len) {
        let mut at = r * stride + col;
        if let Some(l) = &lead {
            o[at] = l[r];
            at += 1;
        }
        for ty in &types {
            o[at..at + t.dim].copy_from_slice(&table[ty[r] as usize]);
            at += t.dim;
        }
    }
    b.write(out, &o);
}

/// Adjoint of [`tebd_rows`]: the type columns of `xbar` summed into the type embedding's
/// gradient (`W̄[t] += T̄[t]`, `b̄ += Σ_t T̄[t]`), rows in order.
#[allow(clippy::too_many_arguments)]
pub fn tebd_rows_backward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    t: &TebdLayout,
    lead: bool,
    types: &[&B::Idx],
    xbar: &B::Buf,
    stride: usize,
    col: usize,
    grad: &mut B::Buf,
) {
    let xbar = b.download(xbar);
    let types: Vec<Vec<i32>> = types.iter().map(|i| b.download_idx(i)).collect();
    let mut tbar = vec![T::zero(); t.ntypes * t.dim];
    for r in 0..types.first().map_or(0, Vec::len) {
        let mut at = r * stride + col + usize::from(lead);
        for ty in &types {
            let row = &mut tbar[ty[r] as usize * t.dim..(ty[r] as usize + 1) * t.dim];
            for (v, &x) in row.iter_mut().zip(&xbar[at..at + t.dim]) {
                *v += x;
            }
            at += t.dim;
        }
    }
    let mut g = b.download(grad);
    for (gv, &v) in g[t.w..t.w + t.ntypes * t.dim].iter_mut().zip(&tbar) {
        *gv += v;
    }
    if let Some(bo) = t.b {
        for row in tbar.chunks(t.dim) {
            for (gv, &v) in g[bo..bo + t.dim].iter_mut().zip(row) {
                *gv += v;
            }
        }
    }
    b.write(grad, &g);
}

/// What strip's ops read (se_atten_v2; docs/design.md §11.1 step 4): per slot G_s and
/// G_s' = ∂G_s/∂ŝ `[nslots][M1]`, the type net's table τ `[pairs][M1]` (row t_i·ntypes + t_j,
/// or t_j with type_one_side), the slots' neighbour and centre types, σ and dσ/dŝ.
pub struct StripArgs<'a, B: ?Sized, I: ?Sized> {
    pub ntypes: usize,
    pub m1: usize,
    pub one_side: bool,
    /// G⁰ = G_s (1 + σ τ) when smooth, G_s (1 + τ) when not.
    pub smooth: bool,
    pub gs: &'a B,
    pub gsp: &'a B,
    pub tau: &'a B,
    pub nei_type: &'a I,
    pub centre_type: &'a I,
    pub sw: &'a B,
    pub dsw: &'a B,
}

impl<B, I> StripArgs<'_, B, I> {
    /// Runs `f` on the arguments downloaded.
    fn with<T: Real, K: Device<T, Buf = B, Idx = I> + ?Sized, R>(
        &self,
        b: &K,
        f: impl FnOnce(&StripArgs<'_, Vec<T>, Vec<i32>>) -> R,
    ) -> R {
        let (gs, gsp, tau) = (
            b.download(self.gs),
            b.download(self.gsp),
            b.download(self.tau),
        );
        let (tj, ti) = (
            b.download_idx(self.nei_type),
            b.download_idx(self.centre_type),
        );
        let (sw, dsw) = (b.download(self.sw), b.download(self.dsw));
        f(&StripArgs {
            ntypes: self.ntypes,
            m1: self.m1,
            one_side: self.one_side,
            smooth: self.smooth,
            gs: &gs,
            gsp: &gsp,
            tau: &tau,
            nei_type: &tj,
            centre_type: &ti,
            sw: &sw,
            dsw: &dsw,
        })
    }
}

/// G⁰ and G⁰' per slot ([`strip::forward`]).
pub fn strip_forward<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    a: &StripArgs<B::Buf, B::Idx>,
    g0: &mut B::Buf,
    g0p: &mut B::Buf,
) {
    let (g, gp) = a.with(b, |x| {
        let (mut g, mut gp) = (vec![T::zero(); x.gs.len()], vec![T::zero(); x.gs.len()]);
        strip::forward(x, &mut g, &mut gp);
        (g, gp)
    });
    b.write(g0, &g);
    b.write(g0p, &gp);
}

/// The strip's dual reverse ([`strip::dual`]).
#[allow(clippy::too_many_arguments)]
pub fn strip_dual<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    a: &StripArgs<B::Buf, B::Idx>,
    sdot: &B::Buf,
    (g0bar, g0dotbar): (&B::Buf, &B::Buf),
    (gsbar, gsdotbar): (&mut B::Buf, &mut B::Buf),
    taubar: &mut B::Buf,
) {
    let (sdot, gb, gdb) = (b.download(sdot), b.download(g0bar), b.download(g0dotbar));
    let (sb, sdb, tb) = a.with(b, |x| {
        let (mut sb, mut sdb) = (vec![T::zero(); x.gs.len()], vec![T::zero(); x.gs.len()]);
        let mut tb = vec![T::zero(); x.tau.len()];
        strip::dual(x, &sdot, (&gb, &gdb), (&mut sb, &mut sdb), &mut tb);
        (sb, sdb, tb)
    });
    b.write(gsbar, &sb);
    b.write(gsdotbar, &sdb);
    b.write(taubar, &tb);
}

//! The op-level Backend trait. The training step (`crate::train::step`) calls only these ops, so
//! a backend is a folder implementing them and nothing else changes. Ops are named alike in
//! `src/backend/cpu/`, `shaders/` and `kernels/`.
//!
//! Shapes (see [`Dims`]): C centres, S slots, per slot `rhat[4]`, `jac[4][3]` (∂R̂/∂r_ij),
//! `rij[3]`; per centre `desc[M1][M2]` and the A-shaped buffers (`a`, `abar`, `adot`: 4·M1
//! values each, laid out as the backend's contraction ops like, since only they read them). Dense-layer ops work on a row range of
//! row-major matrices, so one call serves the atoms of one type or the slots of one block.

pub mod counts;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod dims;
pub mod gpu_layout;
mod real;
pub mod timed;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use dims::{Dims, Pairs};
pub use real::Real;

use std::ops::Range;

use crate::geometry::EnvParams;
use crate::model::{Layer, Net};

/// Loss prefactors in effect at a step, already multiplied by the label's presence (docs/deepmd-spec.md §9).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prefactors {
    pub e: f64,
    pub f: f64,
    pub v: f64,
}

/// Per-batch sums from which the loss and the displayed RMSEs follow.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSums {
    /// Σ_frames ΔE², Σ ΔF² (all components), Σ ΔW² (all components).
    pub e2: f64,
    pub f2: f64,
    pub v2: f64,
}

impl LossSums {
    /// From the 3-value buffer the [`Backend::loss`] op writes.
    pub fn from_values<T: Real>(v: &[T]) -> Self {
        LossSums {
            e2: v[0].f64(),
            f2: v[1].f64(),
            v2: v[2].f64(),
        }
    }
}

/// One piece of a [`Backend::gather`]: `len` values from `src` in the source to `dst` in the
/// destination. How a batch is put together on the device from frames resident there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

/// [`Backend::gather`] on host slices: the CPU backend's op, and how GPU backends keep the host
/// copies of their index buffers.
pub fn gather_slices<X: Copy>(src: &[X], dst: &mut [X], spans: &[Span]) {
    assert_eq!(
        spans.iter().map(|s| s.len).sum::<usize>(),
        dst.len(),
        "gather: the spans must tile the destination"
    );
    for s in spans {
        dst[s.dst..s.dst + s.len].copy_from_slice(&src[s.src..s.src + s.len]);
    }
}

/// Where the source window starts when the spans of a gather copy one contiguous window of the
/// source (every span shifted alike): the gather of a one-frame batch from a table of frames.
pub fn window_start(spans: &[Span]) -> Option<usize> {
    let at = spans.first().map_or(0, |s| s.src);
    spans
        .iter()
        .all(|s| s.src >= s.dst && s.src - s.dst == at)
        .then_some(at)
}

/// The k of se_e2_r's descriptor D_c = k Σ_slots G_s: DeePMD-kit's mean over the `nnei` slots
/// times its fixed `res_rescale` 1/5 (docs/design.md §10).
pub fn radial_scale(d: &Dims) -> f64 {
    1.0 / (5.0 * d.nnei as f64)
}

/// Adam hyper-parameters for one update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// 1-based step count for the bias corrections.
    pub t: u64,
}

/// Buffers of one dense layer, for the rows of one op call.
pub struct DenseIo<'a, B> {
    /// Input `[rows][nin]`.
    pub x: &'a B,
    /// tanh(z) (or z for the linear layer) `[rows][nout]`.
    pub h: &'a B,
}

/// The inputs of [`Backend::contract_dual`], for the fused stage that starts with it.
pub struct ContractDual<'a, B> {
    pub a: &'a B,
    pub adot: &'a B,
    /// D̄ and Ḋ̄: the fitting nets' input adjoints.
    pub dbar: &'a B,
    pub ddotbar: &'a B,
    pub rhat: &'a B,
    pub rdot: &'a B,
}

impl<Buf> ContractDual<'_, Buf> {
    /// [`Backend::contract_dual`] on these inputs, into (Ḡ, Ġ̄).
    pub fn run<T: Real, B: Backend<T, Buf = Buf> + ?Sized>(
        self,
        b: &B,
        d: &Dims,
        gbar: &mut Buf,
        gdotbar: &mut Buf,
    ) {
        let ContractDual {
            a,
            adot,
            dbar,
            ddotbar,
            rhat,
            rdot,
        } = self;
        b.contract_dual(d, a, adot, dbar, ddotbar, rhat, rdot, gbar, gdotbar);
    }
}

pub trait Backend<T: Real>: Sync {
    /// A device vector of T.
    type Buf: Send + Sync;
    /// A device vector of i32.
    type Idx: Send + Sync;

    fn name(&self) -> String;

    fn upload(&self, x: &[T]) -> Self::Buf;
    fn upload_idx(&self, x: &[i32]) -> Self::Idx;
    fn download(&self, b: &Self::Buf) -> Vec<T>;
    fn zeros(&self, n: usize) -> Self::Buf;
    /// [`Backend::zeros`] that returns `None` where the memory is not there, for the big
    /// buffers of a batch. Host memory can be asked for fallibly; the GPU backends allocate as
    /// `zeros` does.
    fn try_zeros(&self, n: usize) -> Option<Self::Buf> {
        Some(self.zeros(n))
    }
    fn fill(&self, b: &mut Self::Buf, v: T);

    /// Overwrites a buffer of `x.len()` values in place, in order with the ops issued before:
    /// a plan keeps its allocations (and so its addresses) from one batch to the next.
    fn write(&self, b: &mut Self::Buf, x: &[T]);
    /// [`Backend::write`] for an index buffer.
    fn write_idx(&self, b: &mut Self::Idx, x: &[i32]);
    /// The identity of a buffer's allocation (its device address or id): equal for as long as
    /// the allocation lives, whatever is written into it.
    fn buf_id(&self, b: &Self::Buf) -> u64;
    /// [`Backend::buf_id`] for an index buffer.
    fn idx_id(&self, b: &Self::Idx) -> u64;
    /// `dst[at..at + src.len]` = `src`, on the device: how per-step results (the loss sums) are
    /// logged for reading at a display step.
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, at: usize);
    /// `dst[sp.dst..sp.dst + sp.len]` = `src[sp.src..sp.src + sp.len]` for every span, on the
    /// device, in order with the ops issued before. The spans tile `dst` (every value is
    /// overwritten), so its contents follow from `src` and the spans alone.
    fn gather(&self, src: &Self::Buf, dst: &mut Self::Buf, spans: &[Span]);
    /// [`Backend::gather`] for an index buffer. A backend that derives tables from an index
    /// buffer's contents (the force gather lists) may derive them from the source's.
    fn gather_idx(&self, src: &Self::Idx, dst: &mut Self::Idx, spans: &[Span]);
    /// Called once for `owner`, the owner tables of resident frames of one-frame shape `d`, one
    /// after the other, with the centre table of that shape: a backend that derives tables from
    /// an owner table (the force gather lists) derives them for every frame now, so that a
    /// batch of one of those frames, gathered by [`Backend::gather_idx`], costs no upload.
    fn prepare_frames(&self, _d: &Dims, _owner: &Self::Idx, _centre_atom: &Self::Idx) {}
    /// Bytes of training frames the trainer may keep on this device for the whole run
    /// (`train::resident`), unless `DPW_RESIDENT_MB` says otherwise.
    fn resident_budget(&self) -> usize {
        0
    }
    /// Runs `f`, the part of a training step that enqueues the same ops on the same buffers
    /// step after step (forward + gradient on a workspace, after its batch is loaded): a
    /// backend whose launches cost more host time than the work may record it once and replay
    /// it (the CUDA backend with `DPW_CUDA_GRAPH=1`). `f` may then run more than once per call
    /// (dry runs that enqueue nothing), so it must act only through this backend's ops and keep
    /// no other state. The default just runs it.
    fn replayable(&self, f: &mut dyn FnMut()) {
        f()
    }
    /// Returns when every op issued so far has finished (GPU backends only queue them), so
    /// that the wall time around a step or an op is its time.
    fn wait(&self) {}
    /// Gradient clipping on the device: `norm[at]` = ‖grad‖₂ (squares summed in f64 in index
    /// order where the device has f64), and grad ×= max/(‖grad‖ + 1e-6) when that is below 1,
    /// the factor rounded once to T. One op rather than a norm op and a scale op, so the factor
    /// comes from the norm in f64, not from its rounding to T.
    fn clip_grad_norm(&self, grad: &mut Self::Buf, max: f64, norm: &mut Self::Buf, at: usize);

    /// R̂, ∂R̂/∂r_ij and s = R̂[0] of every slot; padded slots (owner < 0) get R = 0, J = 0.
    #[allow(clippy::too_many_arguments)]
    fn env_mat(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &Self::Buf,
        owner: &Self::Idx,
        davg: &Self::Buf,
        dstd: &Self::Buf,
        rhat: &mut Self::Buf,
        jac: &mut Self::Buf,
        s: &mut Self::Buf,
    );

    /// One dense layer forward on `rows`: z = xW + b, h = tanh(z) (z if linear),
    /// y = h·idt + skip(x).
    fn dense_forward(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        x: &Self::Buf,
        h: &mut Self::Buf,
        y: &mut Self::Buf,
    );

    /// Input gradient of one layer from its output h = tanh(z) (or z):
    /// x̄ = (φ'(z)⊙(ȳ·idt))Wᵀ + skipᵀ(ȳ).
    fn dense_backward(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        h: &Self::Buf,
        ybar: &Self::Buf,
        xbar: &mut Self::Buf,
    );

    /// Forward tangent: ż = ẋW, ẏ = φ'(z)⊙ż·idt + skip(ẋ).
    #[allow(clippy::too_many_arguments)]
    fn dense_tangent(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        h: &Self::Buf,
        xdot: &Self::Buf,
        zdot: &mut Self::Buf,
        ydot: &mut Self::Buf,
    );

    /// Reverse pass on (value, tangent) pairs (docs/design.md §3.2, "dual reverse"): accumulates W̄, b̄,
    /// īdt into `grad` at the layer's offsets and, when asked, writes x̄ and ẋ̄. When `scale` is
    /// given, the stored tangents ẋ, ż of row r are multiplied by `scale[r]` (the embedding
    /// net stores its tangents for a unit input tangent).
    #[allow(clippy::too_many_arguments)]
    fn dense_dual_backward(
        &self,
        layer: &Layer,
        params: &Self::Buf,
        rows: Range<usize>,
        io: DenseIo<Self::Buf>,
        xdot: &Self::Buf,
        zdot: &Self::Buf,
        scale: Option<&Self::Buf>,
        ybar: &Self::Buf,
        ydotbar: &Self::Buf,
        grad: &mut Self::Buf,
        xbar: Option<(&mut Self::Buf, &mut Self::Buf)>,
    );

    /// Whether this backend runs the embedding nets fused ([`Backend::embed_forward`] and
    /// [`Backend::embed_dual_backward`]); otherwise the step runs the per-layer dense ops and
    /// keeps every layer's values.
    fn fused_embedding(&self) -> bool {
        false
    }

    /// Every embedding net at once (`nets[ti·ntypes + tj]` serves block (ti, tj)): G and
    /// G' = dG/ds of every slot, `[nslots][M1]`, from s. Called only when
    /// [`Backend::fused_embedding`] is true.
    #[allow(clippy::too_many_arguments)]
    fn embed_forward(
        &self,
        _d: &Dims,
        _nets: &[&Net],
        _params: &Self::Buf,
        _s: &Self::Buf,
        _owner: &Self::Idx,
        _g: &mut Self::Buf,
        _gp: &mut Self::Buf,
    ) {
        unreachable!("embed_forward is only called when fused_embedding() is true")
    }

    /// The dual reverse of every embedding net from (Ḡ, Ġ̄) with input tangent ṡ, accumulated
    /// into `grad`. Called only when [`Backend::fused_embedding`] is true.
    #[allow(clippy::too_many_arguments)]
    fn embed_dual_backward(
        &self,
        _d: &Dims,
        _nets: &[&Net],
        _params: &Self::Buf,
        _s: &Self::Buf,
        _owner: &Self::Idx,
        _sdot: &Self::Buf,
        _gbar: &Self::Buf,
        _gdotbar: &Self::Buf,
        _grad: &mut Self::Buf,
    ) {
        unreachable!("embed_dual_backward is only called when fused_embedding() is true")
    }

    /// The fused stage of the dual reverse below the descriptor: [`Backend::contract_dual`]
    /// then [`Backend::embed_dual_backward`] (the default, the layered stages). A backend that
    /// overrides it makes each slot's Ḡ, Ġ̄ where its embedding dual reads them and need not
    /// write `gbar`, `gdotbar` (they are then scratch: see [`Backend::fuses_contract_dual`]).
    /// Called only when [`Backend::fused_embedding`] is true.
    #[allow(clippy::too_many_arguments)]
    fn contract_embed_dual(
        &self,
        d: &Dims,
        nets: &[&Net],
        params: &Self::Buf,
        s: &Self::Buf,
        owner: &Self::Idx,
        sdot: &Self::Buf,
        contract: ContractDual<Self::Buf>,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
        grad: &mut Self::Buf,
    ) {
        contract.run(self, d, gbar, gdotbar);
        self.embed_dual_backward(d, nets, params, s, owner, sdot, gbar, gdotbar, grad);
    }

    /// Whether [`Backend::contract_embed_dual`] is overridden so that it never writes Ḡ, Ġ̄:
    /// the step then gives it empty buffers for them.
    fn fuses_contract_dual(&self) -> bool {
        false
    }

    /// A_c = (1/nnei) Σ_slots G ⊗ R̂ and D_c = A_c A_c<ᵀ. A-shaped buffers (A, Ā, Ȧ) are
    /// `[nc][4][M1]` on every backend, D-shaped ones `[nc][M1][M2]`, so that each op's outputs
    /// can be compared across backends.
    fn contract_forward(
        &self,
        d: &Dims,
        g: &Self::Buf,
        rhat: &Self::Buf,
        a: &mut Self::Buf,
        desc: &mut Self::Buf,
    );

    /// Ā = D̄ A< + [D̄ᵀ A] in the first M2 rows.
    fn contract_backward(&self, d: &Dims, a: &Self::Buf, dbar: &Self::Buf, abar: &mut Self::Buf);

    /// Per slot: R̄ = (1/nnei)(Āᵀ G) + e₀ (1/nnei)(G'·Ā R̂), q = Jᵀ R̄ = ∂E/∂r_ij.
    #[allow(clippy::too_many_arguments)]
    fn slot_backward(
        &self,
        d: &Dims,
        abar: &Self::Buf,
        g: &Self::Buf,
        gp: &Self::Buf,
        rhat: &Self::Buf,
        jac: &Self::Buf,
        q: &mut Self::Buf,
    );

    /// Tangent of the contraction: Ȧ = (1/nnei) Σ (G'ṡ ⊗ R̂ + G ⊗ Ṙ), Ḋ = Ȧ A<ᵀ + A Ȧ<ᵀ.
    #[allow(clippy::too_many_arguments)]
    fn contract_tangent(
        &self,
        d: &Dims,
        g: &Self::Buf,
        gp: &Self::Buf,
        rhat: &Self::Buf,
        rdot: &Self::Buf,
        a: &Self::Buf,
        adot: &mut Self::Buf,
        ddot: &mut Self::Buf,
    );

    /// Dual reverse of the contraction down to the slots: Ḡ and Ġ̄ per slot.
    #[allow(clippy::too_many_arguments)]
    fn contract_dual(
        &self,
        d: &Dims,
        a: &Self::Buf,
        adot: &Self::Buf,
        dbar: &Self::Buf,
        ddotbar: &Self::Buf,
        rhat: &Self::Buf,
        rdot: &Self::Buf,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
    );

    /// se_e2_r's descriptor: D_c = k Σ_{slots of c} G_s, `[nc][M1]`, k = [`radial_scale`].
    fn radial_forward(&self, d: &Dims, g: &Self::Buf, desc: &mut Self::Buf);

    /// Its tangent: Ḋ_c = k Σ_s G'_s ṡ_s.
    fn radial_tangent(&self, d: &Dims, gp: &Self::Buf, sdot: &Self::Buf, ddot: &mut Self::Buf);

    /// Its backward to the slots: q_s = k (G'_s·D̄_c) J_s[0] = ∂E/∂r_ij (J's radial row).
    fn radial_backward(
        &self,
        d: &Dims,
        dbar: &Self::Buf,
        gp: &Self::Buf,
        jac: &Self::Buf,
        q: &mut Self::Buf,
    );

    /// Its dual reverse down to the slots: Ḡ_s = k D̄_c, Ġ̄_s = k Ḋ̄_c.
    fn radial_dual(
        &self,
        d: &Dims,
        dbar: &Self::Buf,
        ddotbar: &Self::Buf,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
    );

    /// se_e3's pair values e_p = r̃_j·r̃_k, `[npairs]` in the rows of [`Dims::pairs`], where
    /// r̃ = R̂[1..4] of the pair's two slots.
    fn angle_values(&self, d: &Dims, rhat: &Self::Buf, e: &mut Self::Buf);

    /// Their tangent ė_p = ṙ_j·r̃_k + r̃_j·ṙ_k, ṙ = Ṙ[1..4].
    fn angle_values_tangent(
        &self,
        d: &Dims,
        rhat: &Self::Buf,
        rdot: &Self::Buf,
        edot: &mut Self::Buf,
    );

    /// se_e3's descriptor: D_c = Σ_{pairs of c} w_p e_p G_p, `[nc][M1]`, w_p =
    /// [`Dims::pair_weight`] of the pair's type.
    fn angle_forward(&self, d: &Dims, e: &Self::Buf, g: &Self::Buf, desc: &mut Self::Buf);

    /// Its tangent: Ḋ_c = Σ_p w_p ė_p (G_p + e_p G'_p).
    fn angle_tangent(
        &self,
        d: &Dims,
        e: &Self::Buf,
        edot: &Self::Buf,
        g: &Self::Buf,
        gp: &Self::Buf,
        ddot: &mut Self::Buf,
    );

    /// Its backward to the slots: ē_p = w_p D̄_c·(G_p + e_p G'_p), r̃̄_j += ē_p r̃_k,
    /// r̃̄_k += ē_p r̃_j, q_s = J_s[1..4]ᵀ r̃̄_s = ∂E/∂r_ij.
    #[allow(clippy::too_many_arguments)]
    fn angle_backward(
        &self,
        d: &Dims,
        rhat: &Self::Buf,
        jac: &Self::Buf,
        e: &Self::Buf,
        g: &Self::Buf,
        gp: &Self::Buf,
        dbar: &Self::Buf,
        q: &mut Self::Buf,
    );

    /// Its dual reverse down to the pairs (no adjoint flows into e): Ḡ_p = w_p (e_p D̄_c +
    /// ė_p Ḋ̄_c), Ġ̄_p = w_p e_p Ḋ̄_c.
    #[allow(clippy::too_many_arguments)]
    fn angle_dual(
        &self,
        d: &Dims,
        e: &Self::Buf,
        edot: &Self::Buf,
        dbar: &Self::Buf,
        ddotbar: &Self::Buf,
        gbar: &mut Self::Buf,
        gdotbar: &mut Self::Buf,
    );

    /// Per-frame energy E_f = Σ atoms (E_atom + bias[type]) and the per-centre energies with bias.
    fn energy(
        &self,
        d: &Dims,
        e_fit: &Self::Buf,
        bias: &Self::Buf,
        e_atom: &mut Self::Buf,
        energy: &mut Self::Buf,
    );

    /// F = Σ own slots q − Σ slots owned q; W = −Σ q ⊗ r_ij per frame. `centre_atom[c]` and
    /// `owner` are batch atom indices `frame·natoms + atom`.
    #[allow(clippy::too_many_arguments)]
    fn force_virial(
        &self,
        d: &Dims,
        q: &Self::Buf,
        rij: &Self::Buf,
        owner: &Self::Idx,
        centre_atom: &Self::Idx,
        force: &mut Self::Buf,
        virial: &mut Self::Buf,
    );

    /// Residuals of a batch and the seeds of the gradient pass: `ebar[c]` = ∂L/∂E of the
    /// centre's frame; `fres`, `vres` = ∂L/∂F, ∂L/∂W (the loss is a mean over frames); and
    /// `sums` = [Σ ΔE², Σ ΔF², Σ ΔW²] ([`LossSums::from_values`]). The sums stay on the device so
    /// that a step needs no read-back (a browser cannot wait for one).
    #[allow(clippy::too_many_arguments)]
    fn loss(
        &self,
        d: &Dims,
        pref: Prefactors,
        pred: [&Self::Buf; 3],
        label: [&Self::Buf; 3],
        ebar: &mut Self::Buf,
        fres: &mut Self::Buf,
        vres: &mut Self::Buf,
        sums: &mut Self::Buf,
    );

    /// The force/virial seed as a tangent of the environment: u_ij = fres_i − fres_owner(j) −
    /// vres·r_ij, Ṙ = J u.
    #[allow(clippy::too_many_arguments)]
    fn virtual_tangent(
        &self,
        d: &Dims,
        fres: &Self::Buf,
        vres: &Self::Buf,
        jac: &Self::Buf,
        rij: &Self::Buf,
        owner: &Self::Idx,
        centre_atom: &Self::Idx,
        rdot: &mut Self::Buf,
        sdot: &mut Self::Buf,
    );

    /// Adam (torch's form, bias-corrected) on the whole parameter vector.
    fn adam(
        &self,
        s: AdamStep,
        params: &mut Self::Buf,
        grad: &Self::Buf,
        m: &mut Self::Buf,
        v: &mut Self::Buf,
    );
}

//! `Backend<f32>` and `Backend<f64>` for [`Wgpu`]: uniform blocks, launch grids and the order of
//! kernels of every op. The shaders' own comments say what each kernel computes.

use std::ops::Range;

use super::device::OneOp;
use super::shaders::{self as k, Kernel};
use super::{Buf, DenseKernels, GpuReal, Idx, Wgpu};
use crate::backend::gpu_layout::{
    count, AngleParams, AttnBlockParams, AttnParams, ContractParams, DenseParams, EnvMatParams,
    GpuStruct, LossParams, ScatterParams, VectorParams,
};
use crate::backend::monomorphic::Generic;
use crate::backend::{
    radial_scale, AdamStep, AngleOps, AttnArgs, AttnOps, Backend, BlockPass, ContractOps, DenseIo,
    DenseOps, Device, Dims, EnvOps, MemoryLimits, PairOps, Prefactors, RadialOps, Span, StripArgs,
    TrainOps,
};
use crate::geometry::EnvParams;
use crate::model::{Layer, TebdLayout};

/// Threads per workgroup of the 1-D kernels (`WG` in shaders/common.wgsl).
const WG: u32 = 64;
const MAX_GROUPS: u32 = 65535;
/// Training frames kept on the device by default: 1 GiB, a fraction of any discrete GPU and of a
/// laptop's shared memory (the water example's 400 frames take 170 MB in float32).
const RESIDENT_BUDGET: usize = 1 << 30;

fn u32_of(x: usize) -> u32 {
    u32::try_from(x).expect("batch too large for 32-bit indices")
}

/// Workgroups for n threads of a 1-D kernel, spilling over y past the per-dimension limit.
pub(super) fn grid1(n: usize) -> [u32; 3] {
    let groups = u32_of(n).div_ceil(WG);
    if groups <= MAX_GROUPS {
        [groups, 1, 1]
    } else {
        [MAX_GROUPS, groups.div_ceil(MAX_GROUPS), 1]
    }
}

/// Tile edge of the tiled dense kernels (`TS` in shaders/dense_tiled.wgsl).
const TS: u32 = 16;

/// Workgroups of a 16×16-tiled kernel: columns along x, row tiles along y then z.
fn grid_tiles(cols: usize, rows: usize) -> [u32; 3] {
    let rt = u32_of(rows).div_ceil(TS);
    let (y, z) = if rt <= MAX_GROUPS {
        (rt, 1)
    } else {
        (MAX_GROUPS, rt.div_ceil(MAX_GROUPS))
    };
    [u32_of(cols).div_ceil(TS), y, z]
}

/// Calls `f(slots, sel, first centre)` for every non-empty (ti, tj) block.
fn for_blocks(d: &Dims, mut f: impl FnMut(Range<usize>, usize, usize)) {
    for ti in 0..d.ntypes {
        for tj in d.sections() {
            let b = d.block(ti, tj);
            if !b.is_empty() {
                f(b, d.sel[tj], d.centre_start[ti]);
            }
        }
    }
}

impl Wgpu {
    pub(super) fn go<T: GpuReal>(
        &self,
        kern: &Kernel,
        uniform: &impl GpuStruct,
        bufs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) {
        let words = bytemuck::cast_slice(std::slice::from_ref(uniform));
        self.run(kern, T::PRECISION, words, bufs, groups);
    }

    /// The op's constants rounded to T, in its persistent buffer ([`Wgpu::consts`]).
    fn reals<T: GpuReal>(&self, op: &OneOp, name: &'static str, x: &[f64]) -> wgpu::Buffer {
        let v: Vec<T> = x.iter().map(|&v| T::of(v)).collect();
        self.consts(op, name, &v)
    }

    /// se_e2_r's descriptor or its tangent (`kern`), k Σ_slots w_s x_s per centre; `w` is
    /// bound whether or not the kernel reads it.
    fn radial_sum<T: GpuReal>(
        &self,
        kern: &Kernel,
        d: &Dims,
        x: &Buf<T>,
        w: &Buf<T>,
        out: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let scale = self.reals::<T>(&op, "radial", &[radial_scale(d)]);
        self.go::<T>(
            kern,
            &ContractParams::new(d, 0),
            &[&self.dims_buf(d), &scale, &x.buf, &w.buf, &out.buf],
            grid1(d.ncentres() * d.m1),
        );
    }

    /// The strip kernels' uniform block, and each slot's row of τ and [c, c'] (see
    /// shaders/attn.wgsl), in scratch of the op holding `op`.
    fn strip_slots<T: GpuReal>(
        &self,
        op: &OneOp,
        a: &StripArgs<Buf<T>, Idx>,
    ) -> (AttnParams, wgpu::Buffer, wgpu::Buffer) {
        let ns = a.nei_type.len();
        let u = AttnParams::strip(ns, a.m1, a.ntypes, a.one_side, a.smooth);
        let row = self.scratch(op, "attn.strip_row", (ns * size_of::<i32>()) as u64);
        let c = self.scratch(op, "attn.strip_c", (2 * ns * size_of::<T>()) as u64);
        self.go::<T>(
            &k::STRIP_SLOTS,
            &u,
            &[
                &a.nei_type.buf,
                &a.centre_type.buf,
                &a.sw.buf,
                &a.dsw.buf,
                &row,
                &c,
            ],
            grid1(ns),
        );
        (u, row, c)
    }

    /// DPA-1's attention block (shaders/attn_block.wgsl) on every centre, in launches of as
    /// many centres as `attn_scratch` holds: its slots loaded as numbers (duals with the
    /// tangent `rdot`), then `pass` on each launch.
    fn attn_block<T: GpuReal>(
        &self,
        d: &Dims,
        a: &AttnArgs<Buf<T>, Idx>,
        rdot: Option<&Buf<T>>,
        stride: usize,
        mut pass: BlockPass<'_, Buf<T>>,
    ) {
        let dual = rdot.is_some();
        let grad = matches!(pass, BlockPass::Dual { .. });
        let ns = if dual { 2 } else { 1 };
        let (o, sz, nc) = (&a.opts, size_of::<T>(), d.ncentres());
        let op = self.exclusive();
        // The layers' tensors packed in the order the shader reads them.
        let nl = a.layout.layers.len();
        let lp = self.scratch(&op, "attn_block.layers", (nl * o.layer_len() * sz) as u64);
        let bytes = |x: usize| (x * sz) as u64;
        for t in o.tensors(a.layout) {
            self.copy_region(
                &a.params.buf,
                bytes(t.at),
                &lp,
                bytes(t.packed),
                bytes(t.len),
            );
        }
        let inv = |x: usize| 1.0 / x as f64;
        let cst = self.reals::<T>(
            &op,
            "attn_block",
            &[o.alpha, o.ln_eps, inv(d.nnei), inv(o.m1)],
        );
        let u = AttnBlockParams::new(o, nl, d.nnei, stride, grad, a.abar.is_some());
        let per_centre = u.per_centre as usize * ns * sz;
        let chunk = (self.attn_scratch / per_centre).clamp(1, nc.max(1));
        let ws = self.scratch(&op, "attn_block.ws", (chunk * per_centre) as u64);
        let kernels = |real, on_duals| if dual { on_duals } else { real };
        let grad_at = grad.then(|| {
            let mut to = vec![-1i32; nl * o.layer_len()];
            for t in o.tensors(a.layout).filter(|t| t.trained) {
                let entries = to[t.packed..t.packed + t.len].iter_mut();
                entries.zip(t.at..).for_each(|(e, i)| *e = count(i) as i32);
            }
            self.consts(&op, "attn_block.grad_at", &to)
        });
        let rd = rdot.unwrap_or(a.rhat);
        for c0 in (0..nc).step_by(chunk) {
            let n = chunk.min(nc - c0);
            let u = u.launch(c0, n);
            let inputs = [a.g0, a.g0p, a.rhat, rd, a.sw, a.dsw].map(|b| &b.buf);
            let mut bufs: Vec<&wgpu::Buffer> = inputs.to_vec();
            bufs.extend([&a.owner.buf, &ws]);
            let load = kernels(&k::ATTN_BLOCK_LOAD, &k::ATTN_BLOCK_LOAD_DUAL);
            self.go::<T>(load, &u, &bufs, grid1(n * d.nnei * u.slot_w as usize));
            let one_per_centre = grid1(n * WG as usize);
            let per_slot = grid1(n * d.nnei);
            match &mut pass {
                BlockPass::Forward(out, rot) => {
                    let kern = kernels(&k::ATTN_BLOCK_FORWARD, &k::ATTN_BLOCK_TANGENT);
                    self.go::<T>(kern, &u, &[&lp, &cst, &ws, &out.buf], one_per_centre);
                    if let Some(rot) = rot {
                        let per_entry = grid1(n * 4 * o.m1);
                        self.go::<T>(&k::ATTN_BLOCK_ROT, &u, &[&ws, &rot.buf], per_entry);
                    }
                }
                BlockPass::Backward { jac, dbar, q } => {
                    let bufs = [&lp, &cst, &ws, &dbar.buf, &dbar.buf];
                    self.go::<T>(&k::ATTN_BLOCK_BACKWARD, &u, &bufs, one_per_centre);
                    let bufs = [&ws, &a.g0p.buf, &a.dsw.buf, &jac.buf, &q.buf];
                    self.go::<T>(&k::ATTN_BLOCK_Q, &u, &bufs, per_slot);
                }
                BlockPass::Dual {
                    dbar,
                    ddotbar,
                    g0bar,
                    g0dotbar,
                    grad,
                } => {
                    if let Some(abar) = a.abar {
                        let per_entry = grid1(n * 4 * o.m1);
                        self.go::<T>(&k::ATTN_BLOCK_ABAR, &u, &[&ws, &abar.buf], per_entry);
                    }
                    let bufs = [&lp, &cst, &ws, &ddotbar.buf, &dbar.buf];
                    self.go::<T>(&k::ATTN_BLOCK_DUAL, &u, &bufs, one_per_centre);
                    let bufs = [&ws, &g0bar.buf, &g0dotbar.buf];
                    self.go::<T>(&k::ATTN_BLOCK_G0BAR, &u, &bufs, grid1(n * d.nnei * o.m1));
                    let to = grad_at.as_ref().expect("the dual's gradient map");
                    let bufs = [&ws, to, &grad.buf];
                    self.go::<T>(&k::ATTN_BLOCK_GRAD, &u, &bufs, grid1(u.plen as usize));
                }
            }
        }
    }

    /// se_e3's w_p per pair type, rounded to T as the CPU rounds them.
    fn angle_weights<T: GpuReal>(&self, op: &OneOp, d: &Dims) -> wgpu::Buffer {
        let w: Vec<f64> = d.pairs().types.iter().map(|&p| d.pair_weight(p)).collect();
        self.reals::<T>(op, "angle", &w)
    }

    /// se_e3's descriptor or its tangent (`kern`), per centre; `edot` and `gp` are bound
    /// whether or not the kernel reads them.
    #[allow(clippy::too_many_arguments)]
    fn angle_sum<T: GpuReal>(
        &self,
        kern: &Kernel,
        d: &Dims,
        e: &Buf<T>,
        edot: &Buf<T>,
        g: &Buf<T>,
        gp: &Buf<T>,
        out: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let w = self.angle_weights::<T>(&op, d);
        self.go::<T>(
            kern,
            &AngleParams::new(d),
            &[
                &self.dims_buf(d),
                &w,
                &e.buf,
                &edot.buf,
                &g.buf,
                &gp.buf,
                &out.buf,
            ],
            grid1(d.ncentres() * d.m1),
        );
    }
}

monomorphic_backend!(impl Backend<f32> for Wgpu, Buf = Buf<f32>, Idx = Idx);
monomorphic_backend!(impl Backend<f64> for Wgpu, Buf = Buf<f64>, Idx = Idx);

impl<T: GpuReal> Device<T> for Generic<'_, Wgpu> {
    type Buf = Buf<T>;
    type Idx = Idx;

    fn name(&self) -> String {
        match self.adapter().get_info().device_pci_bus_id {
            // The bus id tells apart the identical GPUs of a node (the rank's device, opened).
            bus if !bus.is_empty() => format!(
                "wgpu ({}, {}, PCI {bus})",
                self.adapter_name(),
                self.backend_name()
            ),
            _ => format!("wgpu ({}, {})", self.adapter_name(), self.backend_name()),
        }
    }

    fn upload(&self, x: &[T]) -> Buf<T> {
        self.upload_real(x)
    }

    fn upload_idx(&self, x: &[i32]) -> Idx {
        self.upload_i32(x)
    }

    fn download_idx(&self, b: &Idx) -> Vec<i32> {
        b.host.to_vec()
    }

    fn download(&self, b: &Buf<T>) -> Vec<T> {
        self.download_real(b)
    }

    fn upload_kept(&self, x: Vec<T>) -> Buf<T> {
        let mut b = self.upload_real(&x);
        b.host = Some(std::sync::Arc::new(x));
        b
    }

    fn host_copy(&self, b: &Buf<T>) -> Option<Vec<T>> {
        b.host.as_ref().map(|h| h.to_vec())
    }

    fn zeros(&self, n: usize) -> Buf<T> {
        self.zeros_real(n)
    }

    fn try_zeros(&self, n: usize) -> Result<Buf<T>, String> {
        self.check_size(n.saturating_mul(size_of::<T>()) as u64)?;
        Ok(self.zeros_real(n))
    }

    fn memory_limits(&self) -> MemoryLimits {
        // A software adapter's buffers are host memory; a GPU's free memory wgpu does not tell.
        let available = match self.is_cpu_adapter() {
            true => crate::mem::host_available().map(|b| {
                (
                    b,
                    "memory available (MemAvailable; a software adapter)".into(),
                )
            }),
            false => None,
        };
        MemoryLimits {
            available,
            largest: Some(self.binding_limit()),
        }
    }

    fn fill(&self, b: &mut Buf<T>, v: T) {
        if let Some(h) = &mut b.host {
            std::sync::Arc::make_mut(h).fill(v);
        }
        if v == T::zero() {
            self.clear(&b.buf);
        } else {
            let op = self.exclusive();
            let val = self.consts(&op, "fill", &[v]);
            self.go::<T>(
                &k::FILL,
                &VectorParams::new(b.len),
                &[&val, &b.buf],
                grid1(b.len),
            );
        }
    }

    fn write(&self, b: &mut Buf<T>, x: &[T]) {
        self.write_real(b, x);
    }

    fn write_idx(&self, b: &mut Idx, x: &[i32]) {
        self.write_i32(b, x);
    }

    fn buf_id(&self, b: &Buf<T>) -> u64 {
        b.id
    }

    fn idx_id(&self, b: &Idx) -> u64 {
        b.id
    }

    fn copy(&self, src: &Buf<T>, dst: &mut Buf<T>, at: usize) {
        assert!(at + src.len <= dst.len, "copy past the end of a buffer");
        match (&src.host, &mut dst.host) {
            (Some(s), Some(d)) => std::sync::Arc::make_mut(d)[at..at + s.len()].copy_from_slice(s),
            (None, d) => *d = None,
            _ => {}
        }
        let sz = size_of::<T>();
        self.copy_bytes(&src.buf, &dst.buf, (at * sz) as u64, (src.len * sz) as u64);
    }

    fn gather(&self, src: &Buf<T>, dst: &mut Buf<T>, spans: &[Span]) {
        assert_eq!(
            spans.iter().map(|s| s.len).sum::<usize>(),
            dst.len,
            "gather: the spans must tile the destination"
        );
        match (&src.host, &mut dst.host) {
            (Some(s), Some(d)) => {
                crate::backend::gather_slices(s, std::sync::Arc::<Vec<T>>::make_mut(d), spans)
            }
            (None, d) => *d = None,
            _ => {}
        }
        let sz = size_of::<T>() as u64;
        for s in spans {
            assert!(
                s.src + s.len <= src.len,
                "gather past the end of the source"
            );
            let (from, to, bytes) = (s.src as u64 * sz, s.dst as u64 * sz, s.len as u64 * sz);
            self.copy_region(&src.buf, from, &dst.buf, to, bytes);
        }
    }

    fn gather_idx(&self, src: &Idx, dst: &mut Idx, spans: &[Span]) {
        self.gather_i32(src, dst, spans);
    }

    fn wait(&self) {
        self.synchronize();
    }

    fn resident_budget(&self) -> usize {
        // Each resident system is one buffer per array: within the total, within the device's
        // largest buffer too (a browser's WebGPU may allow only 256 MiB).
        let max_buffer = self.device().limits().max_buffer_size;
        RESIDENT_BUDGET.min(usize::try_from(max_buffer).unwrap_or(usize::MAX))
    }

    fn prepare_frames(&self, d: &Dims, owner: &Idx, centre_atom: &Idx) {
        self.frame_lists(d, owner, centre_atom);
    }

    fn forget_shape(&self, d: &Dims) {
        self.forget(d);
    }
}

impl<T: GpuReal> EnvOps<T> for Generic<'_, Wgpu> {
    fn env_mat(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &Buf<T>,
        owner: &Idx,
        davg: &Buf<T>,
        dstd: &Buf<T>,
        rhat: &mut Buf<T>,
        jac: &mut Buf<T>,
        s: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let envp = self.reals::<T>(&op, "env_mat", &[env.rcut, env.rcut_smth, env.protection]);
        for ti in 0..d.ntypes {
            let (lo, hi) = (d.type_slots(ti).start, d.type_slots(ti).end);
            let u = EnvMatParams {
                slot0: count(lo),
                nslots: count(hi - lo),
                ti: count(ti),
                ..Default::default()
            };
            self.go::<T>(
                &k::ENV_MAT,
                &u,
                &[
                    &rij.buf, &owner.buf, &davg.buf, &dstd.buf, &envp, &rhat.buf, &jac.buf, &s.buf,
                ],
                grid1(hi - lo),
            );
        }
    }

    fn force_virial(
        &self,
        d: &Dims,
        q: &Buf<T>,
        rij: &Buf<T>,
        owner: &Idx,
        centre_atom: &Idx,
        force: &mut Buf<T>,
        virial: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let dims = self.dims_buf(d);
        let (ptr, ent) = self.force_lists(&op, d, owner, centre_atom);
        let u = ScatterParams::new(d);
        self.go::<T>(
            &k::SCATTER_GATHER_FORCE,
            &u,
            &[&ptr, &ent, &q.buf, &force.buf],
            grid1(d.nbatch_atoms()),
        );
        let wpart = self.scratch(
            &op,
            "scatter.wpart",
            (9 * d.ncentres() * size_of::<T>()) as u64,
        );
        self.go::<T>(
            &k::SCATTER_CENTRE_VIRIAL,
            &u,
            &[&dims, &q.buf, &rij.buf, &owner.buf, &wpart],
            grid1(d.ncentres()),
        );
        self.go::<T>(
            &k::SCATTER_FRAME_VIRIAL,
            &u,
            &[&dims, &wpart, &virial.buf],
            grid1(9 * d.nframes),
        );
    }

    fn virtual_tangent(
        &self,
        d: &Dims,
        fres: &Buf<T>,
        vres: &Buf<T>,
        jac: &Buf<T>,
        rij: &Buf<T>,
        owner: &Idx,
        centre_atom: &Idx,
        rdot: &mut Buf<T>,
        sdot: &mut Buf<T>,
    ) {
        for_blocks(d, |slots, sel, c0| {
            self.go::<T>(
                &k::LOSS_VIRTUAL_TANGENT,
                &LossParams::block(d, &slots, sel, c0),
                &[
                    &fres.buf,
                    &vres.buf,
                    &jac.buf,
                    &rij.buf,
                    &owner.buf,
                    &centre_atom.buf,
                    &rdot.buf,
                    &sdot.buf,
                ],
                grid1(slots.len()),
            );
        });
    }
}

impl Wgpu {
    /// ṙ_ij of every slot (shaders/loss.wgsl's `rij_tangent`), launched per block as
    /// `virtual_tangent` is.
    pub(super) fn rij_seed<T: GpuReal>(
        &self,
        d: &Dims,
        (fres, vres): (&Buf<T>, &Buf<T>),
        rij: &Buf<T>,
        (owner, centre_atom): (&Idx, &Idx),
        rijdot: &mut Buf<T>,
    ) {
        for_blocks(d, |slots, sel, c0| {
            let bufs = [
                &fres.buf,
                &vres.buf,
                &rij.buf,
                &owner.buf,
                &centre_atom.buf,
                &rijdot.buf,
            ];
            let u = LossParams::block(d, &slots, sel, c0);
            self.go::<T>(&k::LOSS_RIJ_TANGENT, &u, &bufs, grid1(slots.len()));
        });
    }
}

impl Generic<'_, Wgpu> {
    /// The flat kernel or its tiled twin, as this device runs dense layers, with its grid for
    /// `rows` × `cols` outputs.
    fn dense_kernel(
        &self,
        flat: &'static Kernel,
        tiled: &'static Kernel,
        rows: usize,
        cols: usize,
    ) -> (&'static Kernel, [u32; 3]) {
        match self.dense_kernels() {
            DenseKernels::Flat => (flat, grid1(rows * cols)),
            DenseKernels::Tiled => (tiled, grid_tiles(cols, rows)),
        }
    }
}

impl<T: GpuReal> DenseOps<T> for Generic<'_, Wgpu> {
    fn dense_forward(
        &self,
        l: &Layer,
        p: &Buf<T>,
        rows: Range<usize>,
        x: &Buf<T>,
        h: &mut Buf<T>,
        y: &mut Buf<T>,
    ) {
        let u = DenseParams::new(l, &rows, false);
        let (kern, grid) = self.dense_kernel(
            &k::DENSE_FORWARD,
            &k::DENSE_FORWARD_TILED,
            rows.len(),
            l.nout,
        );
        self.go::<T>(kern, &u, &[&p.buf, &x.buf, &h.buf, &y.buf], grid);
    }

    fn dense_backward(
        &self,
        l: &Layer,
        p: &Buf<T>,
        rows: Range<usize>,
        h: &Buf<T>,
        ybar: &Buf<T>,
        xbar: &mut Buf<T>,
    ) {
        let u = DenseParams::new(l, &rows, false);
        let (kern, grid) = self.dense_kernel(
            &k::DENSE_BACKWARD,
            &k::DENSE_BACKWARD_TILED,
            rows.len(),
            l.nin,
        );
        self.go::<T>(kern, &u, &[&p.buf, &h.buf, &ybar.buf, &xbar.buf], grid);
    }

    fn dense_tangent(
        &self,
        l: &Layer,
        p: &Buf<T>,
        rows: Range<usize>,
        h: &Buf<T>,
        xdot: &Buf<T>,
        zdot: &mut Buf<T>,
        ydot: &mut Buf<T>,
    ) {
        let u = DenseParams::new(l, &rows, false);
        let (kern, grid) = self.dense_kernel(
            &k::DENSE_TANGENT,
            &k::DENSE_TANGENT_TILED,
            rows.len(),
            l.nout,
        );
        self.go::<T>(
            kern,
            &u,
            &[&p.buf, &xdot.buf, &h.buf, &zdot.buf, &ydot.buf],
            grid,
        );
    }

    fn dense_dual_backward(
        &self,
        l: &Layer,
        p: &Buf<T>,
        rows: Range<usize>,
        io: DenseIo<Buf<T>>,
        xdot: &Buf<T>,
        zdot: &Buf<T>,
        scale: Option<&Buf<T>>,
        ybar: &Buf<T>,
        ydotbar: &Buf<T>,
        grad: &mut Buf<T>,
        xbar: Option<(&mut Buf<T>, &mut Buf<T>)>,
    ) {
        if rows.is_empty() {
            return;
        }
        let op = self.exclusive();
        let sz = size_of::<T>() as u64;
        let m = (rows.len() * l.nout) as u64;
        let u = DenseParams::new(l, &rows, scale.is_some());
        let nchunks = u.nchunks as usize;
        let scratch = self.scratch(&op, "dense.z", 3 * m * sz);
        let partial = self.scratch(
            &op,
            "dense.partial",
            (nchunks * (l.nin + 2) * l.nout) as u64 * sz,
        );
        // Without a scale the binding is never read; any buffer will do.
        let scale = scale.map_or(&io.h.buf, |s| &s.buf);
        self.go::<T>(
            &k::DENSE_DUAL_Z,
            &u,
            &[
                &p.buf,
                &io.h.buf,
                &zdot.buf,
                scale,
                &ybar.buf,
                &ydotbar.buf,
                &scratch,
            ],
            grid1(m as usize),
        );
        let tiled = self.dense_kernels() == DenseKernels::Tiled;
        let (wgrad, grid) = match tiled {
            false => (&k::DENSE_DUAL_WGRAD, grid1(nchunks * l.nin * l.nout)),
            // One more row of tiles for b̄ and īdt (dense_tiled.wgsl).
            true => (
                &k::DENSE_DUAL_WGRAD_TILED,
                [
                    u32_of(l.nout).div_ceil(TS),
                    u32_of(l.nin).div_ceil(TS) + 1,
                    u.nchunks,
                ],
            ),
        };
        self.go::<T>(
            wgrad,
            &u,
            &[&io.x.buf, &xdot.buf, scale, &scratch, &partial],
            grid,
        );
        if !tiled {
            self.go::<T>(
                &k::DENSE_DUAL_BSUM,
                &u,
                &[&scratch, &partial],
                grid1(nchunks * l.nout),
            );
        }
        self.go::<T>(
            &k::DENSE_DUAL_WSUM,
            &u,
            &[&partial, &grad.buf],
            grid1((l.nin + 2) * l.nout),
        );
        if let Some((xb, xdb)) = xbar {
            let (kern, grid) = self.dense_kernel(
                &k::DENSE_DUAL_XBAR,
                &k::DENSE_DUAL_XBAR_TILED,
                rows.len(),
                l.nin,
            );
            self.go::<T>(
                kern,
                &u,
                &[&p.buf, &scratch, &ybar.buf, &ydotbar.buf, &xb.buf, &xdb.buf],
                grid,
            );
        }
    }
}

impl<T: GpuReal> ContractOps<T> for Generic<'_, Wgpu> {
    fn contract_forward(
        &self,
        d: &Dims,
        g: &Buf<T>,
        rhat: &Buf<T>,
        a: &mut Buf<T>,
        desc: &mut Buf<T>,
    ) {
        let dims = self.dims_buf(d);
        let u = ContractParams::new(d, 0);
        let nc = d.ncentres();
        self.go::<T>(
            &k::CONTRACT_A_FORWARD,
            &u,
            &[&dims, &g.buf, &rhat.buf, &a.buf],
            grid1(nc * d.m1),
        );
        // mode 0 reads only A; the Ȧ binding is a stand-in.
        self.go::<T>(
            &k::CONTRACT_D_OUTER,
            &u,
            &[&a.buf, &a.buf, &desc.buf],
            grid1(nc * d.m1 * d.m2),
        );
    }

    fn contract_backward(&self, d: &Dims, a: &Buf<T>, dbar: &Buf<T>, abar: &mut Buf<T>) {
        let u = ContractParams::new(d, 0);
        self.go::<T>(
            &k::CONTRACT_A_BACKWARD,
            &u,
            &[&a.buf, &dbar.buf, &abar.buf],
            grid1(d.ncentres() * d.m1),
        );
    }

    fn contract_gbar(&self, d: &Dims, abar: &Buf<T>, rhat: &Buf<T>, gbar: &mut Buf<T>) {
        let u = ContractParams::new(d, 0);
        for_blocks(d, |slots, sel, c0| {
            self.go::<T>(
                &k::CONTRACT_GBAR,
                &u.block(&slots, sel, c0),
                &[&abar.buf, &rhat.buf, &gbar.buf],
                grid1(slots.len() * d.m1),
            );
        });
    }

    fn slot_backward(
        &self,
        d: &Dims,
        abar: &Buf<T>,
        g: &Buf<T>,
        gp: &Buf<T>,
        rhat: &Buf<T>,
        jac: &Buf<T>,
        q: &mut Buf<T>,
    ) {
        let u = ContractParams::new(d, 0);
        for_blocks(d, |slots, sel, c0| {
            self.go::<T>(
                &k::CONTRACT_SLOT_BACKWARD,
                &u.block(&slots, sel, c0),
                &[&abar.buf, &g.buf, &gp.buf, &rhat.buf, &jac.buf, &q.buf],
                grid1(slots.len()),
            );
        });
    }

    fn contract_tangent(
        &self,
        d: &Dims,
        g: &Buf<T>,
        gp: &Buf<T>,
        rhat: &Buf<T>,
        rdot: &Buf<T>,
        a: &Buf<T>,
        adot: &mut Buf<T>,
        ddot: &mut Buf<T>,
    ) {
        let dims = self.dims_buf(d);
        let nc = d.ncentres();
        let u = ContractParams::new(d, 1);
        self.go::<T>(
            &k::CONTRACT_A_TANGENT,
            &u,
            &[&dims, &g.buf, &gp.buf, &rhat.buf, &rdot.buf, &adot.buf],
            grid1(nc * d.m1),
        );
        self.go::<T>(
            &k::CONTRACT_D_OUTER,
            &u,
            &[&a.buf, &adot.buf, &ddot.buf],
            grid1(nc * d.m1 * d.m2),
        );
    }

    fn contract_dual(
        &self,
        d: &Dims,
        a: &Buf<T>,
        adot: &Buf<T>,
        dbar: &Buf<T>,
        ddotbar: &Buf<T>,
        rhat: &Buf<T>,
        rdot: &Buf<T>,
        gbar: &mut Buf<T>,
        gdotbar: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let nc = d.ncentres();
        let bytes = (nc * 4 * d.m1 * size_of::<T>()) as u64;
        let ab = self.scratch(&op, "contract.abar", bytes);
        let adb = self.scratch(&op, "contract.adotbar", bytes);
        let u = ContractParams::new(d, 0);
        self.go::<T>(
            &k::CONTRACT_DUAL_CENTRE,
            &u,
            &[&a.buf, &adot.buf, &dbar.buf, &ddotbar.buf, &ab, &adb],
            grid1(nc * d.m1),
        );
        for_blocks(d, |slots, sel, c0| {
            self.go::<T>(
                &k::CONTRACT_DUAL_SLOT,
                &u.block(&slots, sel, c0),
                &[&ab, &adb, &rhat.buf, &rdot.buf, &gbar.buf, &gdotbar.buf],
                grid1(slots.len() * d.m1),
            );
        });
    }
}

impl<T: GpuReal> RadialOps<T> for Generic<'_, Wgpu> {
    fn radial_forward(&self, d: &Dims, g: &Buf<T>, desc: &mut Buf<T>) {
        // The weights ṡ are not read; g is a stand-in.
        self.radial_sum(&k::RADIAL_FORWARD, d, g, g, desc);
    }

    fn radial_tangent(&self, d: &Dims, gp: &Buf<T>, sdot: &Buf<T>, ddot: &mut Buf<T>) {
        self.radial_sum(&k::RADIAL_TANGENT, d, gp, sdot, ddot);
    }

    fn radial_backward(&self, d: &Dims, dbar: &Buf<T>, gp: &Buf<T>, jac: &Buf<T>, q: &mut Buf<T>) {
        let op = self.exclusive();
        let scale = self.reals::<T>(&op, "radial", &[radial_scale(d)]);
        let u = ContractParams::new(d, 0);
        for_blocks(d, |slots, sel, c0| {
            self.go::<T>(
                &k::RADIAL_BACKWARD,
                &u.block(&slots, sel, c0),
                &[&scale, &gp.buf, &dbar.buf, &jac.buf, &q.buf],
                grid1(slots.len()),
            );
        });
    }

    fn radial_dual(
        &self,
        d: &Dims,
        dbar: &Buf<T>,
        ddotbar: &Buf<T>,
        gbar: &mut Buf<T>,
        gdotbar: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let scale = self.reals::<T>(&op, "radial", &[radial_scale(d)]);
        let u = ContractParams::new(d, 0);
        for_blocks(d, |slots, sel, c0| {
            self.go::<T>(
                &k::RADIAL_DUAL,
                &u.block(&slots, sel, c0),
                &[&scale, &dbar.buf, &ddotbar.buf, &gbar.buf, &gdotbar.buf],
                grid1(slots.len() * d.m1),
            );
        });
    }
}

impl<T: GpuReal> AngleOps<T> for Generic<'_, Wgpu> {
    fn angle_values(&self, d: &Dims, rhat: &Buf<T>, e: &mut Buf<T>) {
        let dims = self.dims_buf(d);
        for u in AngleParams::pair_blocks(d) {
            self.go::<T>(
                &k::ANGLE_VALUES,
                &u,
                &[&dims, &rhat.buf, &e.buf],
                grid1(u.nrows as usize),
            );
        }
    }

    fn angle_values_tangent(&self, d: &Dims, rhat: &Buf<T>, rdot: &Buf<T>, edot: &mut Buf<T>) {
        let dims = self.dims_buf(d);
        for u in AngleParams::pair_blocks(d) {
            self.go::<T>(
                &k::ANGLE_VALUES_TANGENT,
                &u,
                &[&dims, &rhat.buf, &rdot.buf, &edot.buf],
                grid1(u.nrows as usize),
            );
        }
    }

    fn angle_forward(&self, d: &Dims, e: &Buf<T>, g: &Buf<T>, desc: &mut Buf<T>) {
        // ė and G' are not read; e and g are stand-ins.
        self.angle_sum(&k::ANGLE_FORWARD, d, e, e, g, g, desc);
    }

    fn angle_tangent(
        &self,
        d: &Dims,
        e: &Buf<T>,
        edot: &Buf<T>,
        g: &Buf<T>,
        gp: &Buf<T>,
        ddot: &mut Buf<T>,
    ) {
        self.angle_sum(&k::ANGLE_TANGENT, d, e, edot, g, gp, ddot);
    }

    fn angle_backward(
        &self,
        d: &Dims,
        rhat: &Buf<T>,
        jac: &Buf<T>,
        e: &Buf<T>,
        g: &Buf<T>,
        gp: &Buf<T>,
        dbar: &Buf<T>,
        q: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let w = self.angle_weights::<T>(&op, d);
        let dims = self.dims_buf(d);
        let bytes = (d.pairs().len() * size_of::<T>()) as u64;
        let ebar = self.scratch(&op, "angle.ebar", bytes);
        for u in AngleParams::pair_blocks(d) {
            self.go::<T>(
                &k::ANGLE_BACKWARD_PAIRS,
                &u,
                &[&dims, &w, &e.buf, &g.buf, &gp.buf, &dbar.buf, &ebar],
                grid1(u.nrows as usize),
            );
        }
        for u in AngleParams::slot_blocks(d) {
            self.go::<T>(
                &k::ANGLE_BACKWARD_SLOTS,
                &u,
                &[&dims, &rhat.buf, &jac.buf, &ebar, &q.buf],
                grid1(u.nrows as usize),
            );
        }
    }

    fn angle_dual(
        &self,
        d: &Dims,
        e: &Buf<T>,
        edot: &Buf<T>,
        dbar: &Buf<T>,
        ddotbar: &Buf<T>,
        gbar: &mut Buf<T>,
        gdotbar: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let w = self.angle_weights::<T>(&op, d);
        let dims = self.dims_buf(d);
        for u in AngleParams::pair_blocks(d) {
            self.go::<T>(
                &k::ANGLE_DUAL,
                &u,
                &[
                    &dims,
                    &w,
                    &e.buf,
                    &edot.buf,
                    &dbar.buf,
                    &ddotbar.buf,
                    &gbar.buf,
                    &gdotbar.buf,
                ],
                grid1(u.nrows as usize * d.m1),
            );
        }
    }
}

impl<T: GpuReal> PairOps<T> for Generic<'_, Wgpu> {}

/// DPA-1's ops run as kernels: the element-wise ones (shaders/attn.wgsl) and the attention
/// block (shaders/attn_block.wgsl: one forward and one backward, on reals and on duals, give
/// its four passes).
impl<T: GpuReal> AttnOps<T> for Generic<'_, Wgpu> {
    fn attn_forward(
        &self,
        d: &Dims,
        a: &AttnArgs<Buf<T>, Idx>,
        desc: &mut Buf<T>,
        stride: usize,
        rot: Option<&mut Buf<T>>,
    ) {
        self.attn_block(d, a, None, stride, BlockPass::Forward(desc, rot));
    }

    fn attn_backward(
        &self,
        d: &Dims,
        a: &AttnArgs<Buf<T>, Idx>,
        jac: &Buf<T>,
        dbar: &Buf<T>,
        stride: usize,
        q: &mut Buf<T>,
    ) {
        self.attn_block(d, a, None, stride, BlockPass::Backward { jac, dbar, q });
    }

    fn attn_tangent(
        &self,
        d: &Dims,
        a: &AttnArgs<Buf<T>, Idx>,
        rdot: &Buf<T>,
        ddot: &mut Buf<T>,
        stride: usize,
    ) {
        self.attn_block(d, a, Some(rdot), stride, BlockPass::Forward(ddot, None));
    }

    fn attn_dual(
        &self,
        d: &Dims,
        a: &AttnArgs<Buf<T>, Idx>,
        rdot: &Buf<T>,
        (dbar, ddotbar): (&Buf<T>, &Buf<T>),
        stride: usize,
        (g0bar, g0dotbar): (&mut Buf<T>, &mut Buf<T>),
        grad: &mut Buf<T>,
    ) {
        let pass = BlockPass::Dual {
            dbar,
            ddotbar,
            g0bar,
            g0dotbar,
            grad,
        };
        self.attn_block(d, a, Some(rdot), stride, pass);
    }

    fn attn_switch(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &Buf<T>,
        owner: &Idx,
        dstd: &Buf<T>,
        sw: &mut Buf<T>,
        dsw: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let envp = self.reals::<T>(
            &op,
            "attn_switch",
            &[env.rcut, env.rcut_smth, env.protection],
        );
        for ti in 0..d.ntypes {
            let slots = d.type_slots(ti);
            self.go::<T>(
                &k::ATTN_SWITCH,
                &AttnParams::switch(&slots, ti),
                &[&envp, &rij.buf, &owner.buf, &dstd.buf, &sw.buf, &dsw.buf],
                grid1(slots.len()),
            );
        }
    }

    fn tebd_rows(
        &self,
        tebd: &TebdLayout,
        params: &Buf<T>,
        lead: Option<&Buf<T>>,
        types: &[&Idx],
        out: &mut Buf<T>,
        stride: usize,
        col: usize,
    ) {
        let nrows = types.first().map_or(0, |t| t.len());
        let first = usize::from(lead.is_some());
        let u = AttnParams::tebd(tebd, types.len(), nrows, stride, col + first);
        if let Some(lead) = lead {
            self.go::<T>(
                &k::TEBD_ROWS_LEAD,
                &AttnParams {
                    col: count(col),
                    ..u
                },
                &[&lead.buf, &out.buf],
                grid1(nrows),
            );
        }
        for (list, ty) in types.iter().enumerate() {
            self.go::<T>(
                &k::TEBD_ROWS,
                &u.list(list),
                &[&params.buf, &ty.buf, &out.buf],
                grid1(nrows * tebd.dim),
            );
        }
    }

    fn tebd_rows_backward(
        &self,
        tebd: &TebdLayout,
        lead: bool,
        types: &[&Idx],
        xbar: &Buf<T>,
        stride: usize,
        col: usize,
        grad: &mut Buf<T>,
    ) {
        let nrows = types.first().map_or(0, |t| t.len());
        let u = AttnParams::tebd(tebd, types.len(), nrows, stride, col + usize::from(lead));
        let entries = tebd.ntypes * tebd.dim;
        let op = self.exclusive();
        let bytes = (u.nparts as usize * entries * size_of::<T>()) as u64;
        let partial = self.scratch(&op, "attn.tebd_partial", bytes);
        for (list, ty) in types.iter().enumerate() {
            self.go::<T>(
                &k::TEBD_ROWS_BACKWARD_PARTS,
                &u.list(list),
                &[&ty.buf, &xbar.buf, &partial],
                grid1(u.nchunks as usize * tebd.dim),
            );
        }
        self.go::<T>(
            &k::TEBD_ROWS_BACKWARD_SUM,
            &u,
            &[&partial, &grad.buf],
            grid1(tebd.dim),
        );
    }

    fn strip_forward(&self, a: &StripArgs<Buf<T>, Idx>, g0: &mut Buf<T>, g0p: &mut Buf<T>) {
        let op = self.exclusive();
        let (u, row, c) = self.strip_slots(&op, a);
        self.go::<T>(
            &k::STRIP_FORWARD,
            &u,
            &[
                &row, &c, &a.gs.buf, &a.gsp.buf, &a.tau.buf, &g0.buf, &g0p.buf,
            ],
            grid1(a.gs.len),
        );
    }

    fn strip_dual(
        &self,
        a: &StripArgs<Buf<T>, Idx>,
        sdot: &Buf<T>,
        (g0bar, g0dotbar): (&Buf<T>, &Buf<T>),
        (gsbar, gsdotbar): (&mut Buf<T>, &mut Buf<T>),
        taubar: &mut Buf<T>,
    ) {
        let op = self.exclusive();
        let (u, row, c) = self.strip_slots(&op, a);
        self.go::<T>(
            &k::STRIP_DUAL,
            &u,
            &[
                &row,
                &c,
                &a.tau.buf,
                &sdot.buf,
                &g0bar.buf,
                &g0dotbar.buf,
                &gsbar.buf,
                &gsdotbar.buf,
            ],
            grid1(a.gs.len),
        );
        let entries = (u.table_rows * u.width) as usize;
        let bytes = (u.nparts as usize * entries * size_of::<T>()) as u64;
        let partial = self.scratch(&op, "attn.strip_partial", bytes);
        self.go::<T>(
            &k::STRIP_DUAL_PARTS,
            &u,
            &[
                &row,
                &c,
                &a.gs.buf,
                &a.gsp.buf,
                &sdot.buf,
                &g0bar.buf,
                &g0dotbar.buf,
                &partial,
            ],
            grid1((u.nchunks * u.width) as usize),
        );
        self.go::<T>(
            &k::STRIP_DUAL_SUM,
            &u,
            &[&partial, &taubar.buf],
            grid1(entries),
        );
    }
}

impl<T: GpuReal> TrainOps<T> for Generic<'_, Wgpu> {
    fn clip_grad_norm(&self, grad: &mut Buf<T>, max: f64, norm: &mut Buf<T>, at: usize) {
        assert!(at < norm.len, "clip_grad_norm: norm index past the buffer");
        // The norm goes to a scratch slot, then is copied to `at`: a uniform block without the
        // index keeps both dispatches' bind groups the same from step to step.
        let op = self.exclusive();
        let sz = size_of::<T>() as u64;
        let slot = self.scratch(&op, "clip.norm", sz);
        let u = VectorParams::new(grad.len);
        self.go::<T>(&k::GRAD_NORM, &u, &[&slot, &grad.buf], [1, 1, 1]);
        let hyper = self.reals::<T>(&op, "clip", &[max, 1e-6]);
        self.go::<T>(
            &k::CLIP_SCALE,
            &u,
            &[&hyper, &slot, &grad.buf],
            grid1(grad.len),
        );
        self.copy_bytes(&slot, &norm.buf, at as u64 * sz, sz);
    }

    fn energy(
        &self,
        d: &Dims,
        e_fit: &Buf<T>,
        bias: &Buf<T>,
        e_atom: &mut Buf<T>,
        energy: &mut Buf<T>,
    ) {
        let dims = self.dims_buf(d);
        let u = ScatterParams::new(d);
        self.go::<T>(
            &k::SCATTER_ATOM_ENERGY,
            &u,
            &[&dims, &e_fit.buf, &bias.buf, &e_atom.buf],
            grid1(d.ncentres()),
        );
        self.go::<T>(
            &k::SCATTER_FRAME_ENERGY,
            &u,
            &[&dims, &e_atom.buf, &energy.buf],
            grid1(d.nframes),
        );
    }

    fn loss(
        &self,
        d: &Dims,
        pref: Prefactors,
        pred: [&Buf<T>; 3],
        label: [&Buf<T>; 3],
        ebar: &mut Buf<T>,
        fres: &mut Buf<T>,
        vres: &mut Buf<T>,
        sums: &mut Buf<T>,
    ) {
        let (n, nf) = (d.natoms as f64, d.nframes as f64);
        let op = self.exclusive();
        let coef = self.reals::<T>(
            &op,
            "loss",
            &[
                2.0 * pref.e / (n * nf),
                2.0 * pref.f / (3.0 * n * nf),
                2.0 * pref.v / (9.0 * n * nf),
            ],
        );
        let nc = d.ncentres();
        let dims = self.dims_buf(d);
        self.go::<T>(
            &k::LOSS_ENERGY_BAR,
            &LossParams::new(d, nc, 0),
            &[&coef, &pred[0].buf, &label[0].buf, &dims, &ebar.buf],
            grid1(nc),
        );
        for (which, out) in [(1, &*fres), (2, &*vres)] {
            let len = pred[which].len;
            self.go::<T>(
                &k::LOSS_RESIDUAL,
                &LossParams::new(d, len, which),
                &[&coef, &pred[which].buf, &label[which].buf, &out.buf],
                grid1(len),
            );
        }
        for which in 0..3 {
            self.go::<T>(
                &k::LOSS_SUMSQ,
                &LossParams::new(d, pred[which].len, which),
                &[&pred[which].buf, &label[which].buf, &sums.buf],
                [1, 1, 1],
            );
        }
    }

    fn adam(
        &self,
        s: AdamStep,
        params: &mut Buf<T>,
        grad: &Buf<T>,
        m: &mut Buf<T>,
        v: &mut Buf<T>,
    ) {
        let (step, bc2_sqrt) = s.corrections(s.t);
        let [(from, (tail_step, tail_bc2)), (fit_from, (fit_step, fit_bc2))] =
            s.tail_corrections(params.len);
        let (keep, l2) = s.decay_factors();
        let op = self.exclusive();
        let hyper = self.reals::<T>(
            &op,
            "adam",
            &[
                step, s.beta1, s.beta2, s.eps, bc2_sqrt, tail_step, tail_bc2, keep, l2, fit_step,
                fit_bc2,
            ],
        );
        self.go::<T>(
            &k::ADAM,
            &VectorParams {
                tail_from: count(from),
                fit_from: count(fit_from),
                ..VectorParams::new(params.len)
            },
            &[&hyper, &grad.buf, &params.buf, &m.buf, &v.buf],
            grid1(params.len),
        );
    }
}

impl<T: GpuReal> crate::backend::timed::Timeable<T> for Wgpu
where
    Wgpu: Backend<T, Buf = Buf<T>, Idx = Idx>,
{
    fn count_real(&self, owner: &Idx) -> usize {
        owner.host.iter().filter(|&&o| o >= 0).count()
    }
    fn len(&self, b: &Buf<T>) -> usize {
        b.len
    }
    fn counts(&self) -> Option<crate::backend::counts::Counts> {
        Some(Wgpu::counts(self))
    }
}

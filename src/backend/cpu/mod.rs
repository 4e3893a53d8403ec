//! The reference backend: plain Rust on host memory, parallel with rayon.

mod act;
mod adam;
mod angle;
pub mod attn;
pub mod block_in;
mod contract;
mod dense;
mod dual;
mod embed;
mod env_mat;
mod exp;
mod gemm;
mod loss;
pub(crate) use loss::rij_tangent;
mod radial;
pub mod repflow;
pub mod repflow_tape;
pub mod repformer;
mod scatter;
mod simd;
pub mod strip;
mod tanh;
pub(crate) mod tape;
pub mod tape_block;
pub mod three_body;
mod tile;
mod zeroed;

use std::ops::Range;

use super::monomorphic::Generic;
use super::{
    gather_slices, AdamStep, AngleOps, AttnArgs, AttnOps, BlockArgs, BlockOps, ContractDual,
    ContractOps, DenseIo, DenseOps, Device, Dims, EnvOps, FusedEmbedding, PairOps, Prefactors,
    RadialOps, Real, Span, StripArgs, TrainOps,
};
use crate::geometry::EnvParams;
use crate::model::{Layer, Net};

#[derive(Clone, Copy, Debug)]
pub struct Cpu {
    /// Run the embedding nets fused (the fast path). Off, the step runs them layer by layer
    /// through the dense ops, as GPU backends do; the test suite runs both.
    pub fused: bool,
}

impl Default for Cpu {
    fn default() -> Self {
        Cpu { fused: true }
    }
}

impl Cpu {
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }
}

monomorphic_backend!(impl Backend<f32> for Cpu, Buf = Vec<f32>, Idx = Vec<i32>, fused if |c| c.fused);
monomorphic_backend!(impl Backend<f64> for Cpu, Buf = Vec<f64>, Idx = Vec<i32>, fused if |c| c.fused);

impl<T: Real> Device<T> for Generic<'_, Cpu> {
    type Buf = Vec<T>;
    type Idx = Vec<i32>;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads())
    }

    fn upload(&self, x: &[T]) -> Vec<T> {
        x.to_vec()
    }

    fn upload_idx(&self, x: &[i32]) -> Vec<i32> {
        x.to_vec()
    }

    fn download_idx(&self, b: &Vec<i32>) -> Vec<i32> {
        b.clone()
    }

    fn download(&self, b: &Vec<T>) -> Vec<T> {
        b.clone()
    }

    fn zeros(&self, n: usize) -> Vec<T> {
        vec![T::zero(); n]
    }

    fn try_zeros(&self, n: usize) -> Result<Vec<T>, String> {
        crate::mem::try_filled(n, T::zero(), String::new).map_err(|_| String::new())
    }

    fn fill(&self, b: &mut Vec<T>, v: T) {
        b.fill(v);
    }

    fn write(&self, b: &mut Vec<T>, x: &[T]) {
        b.copy_from_slice(x);
    }

    fn write_idx(&self, b: &mut Vec<i32>, x: &[i32]) {
        b.copy_from_slice(x);
    }

    fn buf_id(&self, b: &Vec<T>) -> u64 {
        b.as_ptr() as u64
    }

    fn idx_id(&self, b: &Vec<i32>) -> u64 {
        b.as_ptr() as u64
    }

    fn copy(&self, src: &Vec<T>, dst: &mut Vec<T>, at: usize) {
        dst[at..at + src.len()].copy_from_slice(src);
    }

    fn gather(&self, src: &Vec<T>, dst: &mut Vec<T>, spans: &[Span]) {
        gather_slices(src, dst, spans);
    }

    fn gather_idx(&self, src: &Vec<i32>, dst: &mut Vec<i32>, spans: &[Span]) {
        gather_slices(src, dst, spans);
    }
}

impl<T: Real> EnvOps<T> for Generic<'_, Cpu> {
    fn env_mat(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &Vec<T>,
        owner: &Vec<i32>,
        davg: &Vec<T>,
        dstd: &Vec<T>,
        rhat: &mut Vec<T>,
        jac: &mut Vec<T>,
        s: &mut Vec<T>,
    ) {
        env_mat::env_mat(d, env, rij, owner, davg, dstd, rhat, jac, s);
    }

    fn force_virial(
        &self,
        d: &Dims,
        q: &Vec<T>,
        rij: &Vec<T>,
        owner: &Vec<i32>,
        centre_atom: &Vec<i32>,
        force: &mut Vec<T>,
        virial: &mut Vec<T>,
    ) {
        scatter::force_virial(d, q, rij, owner, centre_atom, force, virial);
    }

    fn virtual_tangent(
        &self,
        d: &Dims,
        fres: &Vec<T>,
        vres: &Vec<T>,
        jac: &Vec<T>,
        rij: &Vec<T>,
        owner: &Vec<i32>,
        centre_atom: &Vec<i32>,
        rdot: &mut Vec<T>,
        sdot: &mut Vec<T>,
    ) {
        loss::virtual_tangent(d, fres, vres, jac, rij, owner, centre_atom, rdot, sdot);
    }
}

impl<T: Real> DenseOps<T> for Generic<'_, Cpu> {
    fn dense_forward(
        &self,
        l: &Layer,
        p: &Vec<T>,
        rows: Range<usize>,
        x: &Vec<T>,
        h: &mut Vec<T>,
        y: &mut Vec<T>,
    ) {
        dense::forward(l, p, rows, x, h, y);
    }

    fn dense_backward(
        &self,
        l: &Layer,
        p: &Vec<T>,
        rows: Range<usize>,
        h: &Vec<T>,
        ybar: &Vec<T>,
        xbar: &mut Vec<T>,
    ) {
        dense::backward(l, p, rows, h, ybar, xbar);
    }

    fn dense_tangent(
        &self,
        l: &Layer,
        p: &Vec<T>,
        rows: Range<usize>,
        h: &Vec<T>,
        xdot: &Vec<T>,
        zdot: &mut Vec<T>,
        ydot: &mut Vec<T>,
    ) {
        dense::tangent(l, p, rows, h, xdot, zdot, ydot);
    }

    fn dense_dual_backward(
        &self,
        l: &Layer,
        p: &Vec<T>,
        rows: Range<usize>,
        io: DenseIo<Vec<T>>,
        xdot: &Vec<T>,
        zdot: &Vec<T>,
        scale: Option<&Vec<T>>,
        ybar: &Vec<T>,
        ydotbar: &Vec<T>,
        grad: &mut Vec<T>,
        xbar: Option<(&mut Vec<T>, &mut Vec<T>)>,
    ) {
        let xbar = xbar.map(|(a, b)| (a.as_mut_slice(), b.as_mut_slice()));
        let scale = scale.map(|s| s.as_slice());
        dense::dual_backward(
            l, p, rows, io.x, io.h, xdot, zdot, scale, ybar, ydotbar, grad, xbar,
        );
    }
}

impl<T: Real> ContractOps<T> for Generic<'_, Cpu> {
    fn contract_forward(
        &self,
        d: &Dims,
        g: &Vec<T>,
        rhat: &Vec<T>,
        a: &mut Vec<T>,
        desc: &mut Vec<T>,
    ) {
        contract::forward(d, g, rhat, a, desc);
    }

    fn contract_backward(&self, d: &Dims, a: &Vec<T>, dbar: &Vec<T>, abar: &mut Vec<T>) {
        contract::backward(d, a, dbar, abar);
    }

    fn contract_gbar(&self, d: &Dims, abar: &Vec<T>, rhat: &Vec<T>, gbar: &mut Vec<T>) {
        contract::gbar(d, abar, rhat, gbar);
    }

    fn slot_backward(
        &self,
        d: &Dims,
        abar: &Vec<T>,
        g: &Vec<T>,
        gp: &Vec<T>,
        rhat: &Vec<T>,
        jac: &Vec<T>,
        q: &mut Vec<T>,
    ) {
        contract::slot_backward(d, abar, g, gp, rhat, jac, q);
    }

    fn contract_tangent(
        &self,
        d: &Dims,
        g: &Vec<T>,
        gp: &Vec<T>,
        rhat: &Vec<T>,
        rdot: &Vec<T>,
        a: &Vec<T>,
        adot: &mut Vec<T>,
        ddot: &mut Vec<T>,
    ) {
        contract::tangent(d, g, gp, rhat, rdot, a, adot, ddot);
    }

    fn contract_dual(
        &self,
        d: &Dims,
        a: &Vec<T>,
        adot: &Vec<T>,
        dbar: &Vec<T>,
        ddotbar: &Vec<T>,
        rhat: &Vec<T>,
        rdot: &Vec<T>,
        gbar: &mut Vec<T>,
        gdotbar: &mut Vec<T>,
    ) {
        contract::dual(d, a, adot, dbar, ddotbar, rhat, rdot, gbar, gdotbar);
    }
}

impl<T: Real> RadialOps<T> for Generic<'_, Cpu> {
    fn radial_forward(&self, d: &Dims, g: &Vec<T>, desc: &mut Vec<T>) {
        radial::forward(d, g, desc);
    }

    fn radial_tangent(&self, d: &Dims, gp: &Vec<T>, sdot: &Vec<T>, ddot: &mut Vec<T>) {
        radial::tangent(d, gp, sdot, ddot);
    }

    fn radial_backward(&self, d: &Dims, dbar: &Vec<T>, gp: &Vec<T>, jac: &Vec<T>, q: &mut Vec<T>) {
        radial::backward(d, dbar, gp, jac, q);
    }

    fn radial_dual(
        &self,
        d: &Dims,
        dbar: &Vec<T>,
        ddotbar: &Vec<T>,
        gbar: &mut Vec<T>,
        gdotbar: &mut Vec<T>,
    ) {
        radial::dual(d, dbar, ddotbar, gbar, gdotbar);
    }
}

impl<T: Real> AngleOps<T> for Generic<'_, Cpu> {
    fn angle_values(&self, d: &Dims, rhat: &Vec<T>, e: &mut Vec<T>) {
        angle::values(d, rhat, e);
    }

    fn angle_values_tangent(&self, d: &Dims, rhat: &Vec<T>, rdot: &Vec<T>, edot: &mut Vec<T>) {
        angle::values_tangent(d, rhat, rdot, edot);
    }

    fn angle_forward(&self, d: &Dims, e: &Vec<T>, g: &Vec<T>, desc: &mut Vec<T>) {
        angle::forward(d, e, g, desc);
    }

    fn angle_tangent(
        &self,
        d: &Dims,
        e: &Vec<T>,
        edot: &Vec<T>,
        g: &Vec<T>,
        gp: &Vec<T>,
        ddot: &mut Vec<T>,
    ) {
        angle::tangent(d, e, edot, g, gp, ddot);
    }

    fn angle_backward(
        &self,
        d: &Dims,
        rhat: &Vec<T>,
        jac: &Vec<T>,
        e: &Vec<T>,
        g: &Vec<T>,
        gp: &Vec<T>,
        dbar: &Vec<T>,
        q: &mut Vec<T>,
    ) {
        angle::backward(d, rhat, jac, e, g, gp, dbar, q);
    }

    fn angle_dual(
        &self,
        d: &Dims,
        e: &Vec<T>,
        edot: &Vec<T>,
        dbar: &Vec<T>,
        ddotbar: &Vec<T>,
        gbar: &mut Vec<T>,
        gdotbar: &mut Vec<T>,
    ) {
        angle::dual(d, e, edot, dbar, ddotbar, gbar, gdotbar);
    }
}

/// The message-passing blocks run their host bodies (`cpu/repflow.rs`, `cpu/repformer.rs`) on the buffers where they are, without
/// the defaults' copies; `rij_tangent` likewise.
impl<T: Real> PairOps<T> for Generic<'_, Cpu> {}

impl<T: Real> BlockOps<T> for Generic<'_, Cpu> {
    fn block_forward(&self, d: &Dims, a: &BlockArgs<Vec<T>, Vec<i32>>, desc: &mut Vec<T>) {
        a.in_place(|x| x.forward(d, desc));
    }

    fn block_backward(
        &self,
        d: &Dims,
        a: &BlockArgs<Vec<T>, Vec<i32>>,
        dbar: &Vec<T>,
        q: &mut Vec<T>,
    ) {
        a.in_place(|x| x.backward(d, dbar, q));
    }

    fn block_tangent(
        &self,
        d: &Dims,
        a: &BlockArgs<Vec<T>, Vec<i32>>,
        rijdot: &Vec<T>,
        ddot: &mut Vec<T>,
    ) {
        a.in_place(|x| x.tangent(d, rijdot, ddot));
    }

    fn block_dual(
        &self,
        d: &Dims,
        a: &BlockArgs<Vec<T>, Vec<i32>>,
        rijdot: &Vec<T>,
        (dbar, ddotbar): (&Vec<T>, &Vec<T>),
        grad: &mut Vec<T>,
    ) {
        a.in_place(|x| x.dual(d, rijdot, dbar, ddotbar, grad));
    }

    #[allow(clippy::too_many_arguments)]
    fn rij_tangent(
        &self,
        d: &Dims,
        fres: &Vec<T>,
        vres: &Vec<T>,
        rij: &Vec<T>,
        owner: &Vec<i32>,
        centre_atom: &Vec<i32>,
        rijdot: &mut Vec<T>,
    ) {
        loss::rij_tangent(d, fres, vres, rij, owner, centre_atom, rijdot);
    }
}

/// DPA-1's ops: the attention block's host bodies (`cpu/attn.rs`) on the buffers where they
/// are, without the copies in and out that the family's defaults make for a device, and the
/// strip's (`cpu/strip.rs`) likewise; the type embedding's are the defaults.
impl<T: Real> AttnOps<T> for Generic<'_, Cpu> {
    fn strip_forward(&self, a: &StripArgs<Vec<T>, Vec<i32>>, g0: &mut Vec<T>, g0p: &mut Vec<T>) {
        strip::forward(a, g0, g0p);
    }

    fn strip_dual(
        &self,
        a: &StripArgs<Vec<T>, Vec<i32>>,
        sdot: &Vec<T>,
        (g0bar, g0dotbar): (&Vec<T>, &Vec<T>),
        (gsbar, gsdotbar): (&mut Vec<T>, &mut Vec<T>),
        taubar: &mut Vec<T>,
    ) {
        strip::dual(a, sdot, (g0bar, g0dotbar), (gsbar, gsdotbar), taubar);
    }

    fn attn_forward(
        &self,
        d: &Dims,
        a: &AttnArgs<Vec<T>, Vec<i32>>,
        desc: &mut Vec<T>,
        stride: usize,
        rot: Option<&mut Vec<T>>,
    ) {
        a.in_place(|x| attn::forward(d, x, desc, stride, rot.map(|r| &mut r[..])));
    }

    fn attn_backward(
        &self,
        d: &Dims,
        a: &AttnArgs<Vec<T>, Vec<i32>>,
        jac: &Vec<T>,
        dbar: &Vec<T>,
        stride: usize,
        q: &mut Vec<T>,
    ) {
        a.in_place(|x| attn::backward(d, x, jac, dbar, stride, q));
    }

    fn attn_tangent(
        &self,
        d: &Dims,
        a: &AttnArgs<Vec<T>, Vec<i32>>,
        rdot: &Vec<T>,
        ddot: &mut Vec<T>,
        stride: usize,
    ) {
        a.in_place(|x| attn::tangent(d, x, rdot, ddot, stride));
    }

    fn attn_dual(
        &self,
        d: &Dims,
        a: &AttnArgs<Vec<T>, Vec<i32>>,
        rdot: &Vec<T>,
        (dbar, ddotbar): (&Vec<T>, &Vec<T>),
        stride: usize,
        (g0bar, g0dotbar): (&mut Vec<T>, &mut Vec<T>),
        grad: &mut Vec<T>,
    ) {
        let packed = a.in_place(|x| attn::dual(d, x, rdot, dbar, ddotbar, stride, g0bar, g0dotbar));
        a.opts.add_grad(a.layout, &packed, grad);
    }
}

impl<T: Real> TrainOps<T> for Generic<'_, Cpu> {
    fn clip_grad_norm(&self, grad: &mut Vec<T>, max: f64, norm: &mut Vec<T>, at: usize) {
        let n = grad.iter().map(|x| x.f64() * x.f64()).sum::<f64>().sqrt();
        norm[at] = T::of(n);
        let coef = max / (n + 1e-6);
        if coef < 1.0 {
            let c = T::of(coef);
            grad.iter_mut().for_each(|x| *x *= c);
        }
    }

    fn energy(
        &self,
        d: &Dims,
        e_fit: &Vec<T>,
        bias: &Vec<T>,
        e_atom: &mut Vec<T>,
        energy: &mut Vec<T>,
    ) {
        scatter::energy(d, e_fit, bias, e_atom, energy);
    }

    fn loss(
        &self,
        d: &Dims,
        pref: Prefactors,
        pred: [&Vec<T>; 3],
        label: [&Vec<T>; 3],
        ebar: &mut Vec<T>,
        fres: &mut Vec<T>,
        vres: &mut Vec<T>,
        sums: &mut Vec<T>,
    ) {
        let pred = pred.map(|b| b.as_slice());
        let label = label.map(|b| b.as_slice());
        let s = loss::loss(d, pref, pred, label, ebar, fres, vres);
        sums.copy_from_slice(&[T::of(s.e2), T::of(s.f2), T::of(s.v2)]);
    }

    fn adam(
        &self,
        s: AdamStep,
        params: &mut Vec<T>,
        grad: &Vec<T>,
        m: &mut Vec<T>,
        v: &mut Vec<T>,
    ) {
        adam::adam(s, params, grad, m, v);
    }
}

impl<T: Real> FusedEmbedding<T> for Generic<'_, Cpu> {
    fn embed_forward(
        &self,
        d: &Dims,
        nets: &[&Net],
        p: &Vec<T>,
        s: &Vec<T>,
        owner: &Vec<i32>,
        g: &mut Vec<T>,
        gp: &mut Vec<T>,
    ) {
        embed::forward(d, nets, p, s, owner, g, gp);
    }

    fn embed_dual_backward(
        &self,
        d: &Dims,
        nets: &[&Net],
        p: &Vec<T>,
        s: &Vec<T>,
        owner: &Vec<i32>,
        sdot: &Vec<T>,
        gbar: &Vec<T>,
        gdotbar: &Vec<T>,
        grad: &mut Vec<T>,
    ) {
        let seeds = embed::Seeds::Slots { gbar, gdotbar };
        embed::dual_backward(d, nets, p, s, owner, sdot, seeds, grad);
    }

    fn contract_embed_dual(
        &self,
        d: &Dims,
        nets: &[&Net],
        p: &Vec<T>,
        s: &Vec<T>,
        owner: &Vec<i32>,
        sdot: &Vec<T>,
        c: ContractDual<Vec<T>>,
        grad: &mut Vec<T>,
    ) {
        let adjoints = contract::centre_adjoints(d, c.a, c.adot, c.dbar, c.ddotbar);
        let seeds = embed::Seeds::Contract {
            adjoints: &adjoints,
            rhat: c.rhat,
            rdot: c.rdot,
        };
        embed::dual_backward(d, nets, p, s, owner, sdot, seeds, grad);
    }
}

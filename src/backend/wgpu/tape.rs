//! The tape run on the device (`backend/device_tape`, the walk every device shares) through
//! shaders/tape.wgsl: its real build for the forward and backward, its `(dual)` build for the
//! tangent and the dual reverse. The kept buffers of a stage's runs live in its keep
//! (`device_tape::Pool`); a dispatch finds its bind group made once a run has been seen.

use super::shaders::{TAPE, TAPE_DUAL};
use super::{Buf, GpuReal, Idx, Wgpu};
use crate::backend::block::{self, BlockArgs};
use crate::backend::device_tape::{self as dt, Bound, Kern, Pool, Slot, TapeDevice};
use crate::backend::gpu_layout::TapeParams;
use crate::backend::monomorphic::Generic;
use crate::backend::{BlockOps, Dims};

impl<T: GpuReal> TapeDevice<T> for Generic<'_, Wgpu> {
    type Raw = wgpu::Buffer;

    fn raw(&self, b: &Buf<T>) -> wgpu::Buffer {
        b.buf.clone()
    }

    fn len_of(b: &Buf<T>) -> usize {
        b.len
    }

    fn slot(&self, pool: &Pool<wgpu::Buffer>, slot: Slot, bytes: u64) -> wgpu::Buffer {
        pool.get(slot, |b| b.size() >= bytes, || self.zeros_raw(bytes))
    }

    fn slot_with(&self, pool: &Pool<wgpu::Buffer>, slot: Slot, bytes: &[u8]) -> wgpu::Buffer {
        let buf = TapeDevice::<T>::slot(self, pool, slot, (bytes.len() as u64).max(4));
        self.write_bytes(&buf, bytes);
        buf
    }

    fn copy_bytes(&self, src: &wgpu::Buffer, from: u64, dst: &wgpu::Buffer, bytes: u64) {
        self.copy_region(src, from, dst, 0, bytes);
    }

    fn zero(&self, b: &mut Buf<T>) {
        self.clear(&b.buf);
    }

    /// Binds the buffers the kernel lists, in binding order: cst, params, a, b, idx, y, y2.
    fn launch(
        &self,
        at: &Bound<'_, wgpu::Buffer>,
        k: Kern,
        u: &TapeParams,
        [a, b, y, y2]: [Option<&wgpu::Buffer>; 4],
        threads: usize,
    ) {
        let kern = if at.dual { &TAPE_DUAL } else { &TAPE }.get(k);
        let by_binding = |b_: u32| -> &wgpu::Buffer {
            match b_ {
                1 => at.cst,
                2 => at.params,
                3 => a.expect("a"),
                4 => b.expect("b"),
                5 => at.idx,
                6 => y.expect("y"),
                _ => y2.expect("y2"),
            }
        };
        let list: Vec<&wgpu::Buffer> = kern
            .bindings
            .iter()
            .map(|&(b_, _)| by_binding(b_))
            .collect();
        self.go::<T>(kern, u, &list, super::ops::grid1(threads));
    }

    fn pass<R>(&self, f: impl FnOnce() -> R) -> R {
        let _op = self.exclusive();
        f()
    }
}

/// DPA-2's, se_e3_tebd's and DPA-3's blocks run on the device through their tapes; a block
/// without one through the family's host bodies.
impl<T: GpuReal> BlockOps<T> for Generic<'_, Wgpu> {
    fn block_forward(&self, d: &Dims, a: &BlockArgs<Buf<T>, Idx>, desc: &mut Buf<T>) {
        if !dt::block_forward(self, d, a, desc) {
            block::block_forward(self, d, a, desc)
        }
    }

    fn block_backward(&self, d: &Dims, a: &BlockArgs<Buf<T>, Idx>, dbar: &Buf<T>, q: &mut Buf<T>) {
        if !dt::block_backward(self, d, a, dbar, q) {
            block::block_backward(self, d, a, dbar, q)
        }
    }

    fn block_tangent(
        &self,
        d: &Dims,
        a: &BlockArgs<Buf<T>, Idx>,
        rijdot: &Buf<T>,
        ddot: &mut Buf<T>,
    ) {
        if !dt::block_tangent(self, d, a, rijdot, ddot) {
            block::block_tangent(self, d, a, rijdot, ddot)
        }
    }

    fn block_dual(
        &self,
        d: &Dims,
        a: &BlockArgs<Buf<T>, Idx>,
        rijdot: &Buf<T>,
        adjoints: (&Buf<T>, &Buf<T>),
        grad: &mut Buf<T>,
    ) {
        if !dt::block_dual(self, d, a, rijdot, adjoints, grad) {
            block::block_dual(self, d, a, rijdot, adjoints, grad)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rij_tangent(
        &self,
        d: &Dims,
        fres: &Buf<T>,
        vres: &Buf<T>,
        rij: &Buf<T>,
        owner: &Idx,
        centre_atom: &Idx,
        rijdot: &mut Buf<T>,
    ) {
        self.rij_seed(d, (fres, vres), rij, (owner, centre_atom), rijdot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::tape::{graph, GraphPasses, Tape, V};
    use crate::backend::Device;
    use dt::Prepared;

    fn close(what: &str, a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-11 * scale,
                "{what}[{i}]: {x} vs the cpu's {y}"
            );
        }
    }

    /// Every op's four passes on the device (lavapipe in CI) equal the cpu tape's: the forward
    /// and backward on reals, the tangent and dual reverse on duals.
    #[test]
    fn the_tape_runs_on_the_device_as_on_the_cpu() {
        let w = match Wgpu::new_f64(wgpu::PowerPreference::default()) {
            Ok(w) => w,
            Err(e) if std::env::var("DPW_REQUIRE_WGPU").is_err() => {
                return eprintln!("skipped: no float64 wgpu adapter ({e})");
            }
            Err(e) => panic!("no float64 wgpu adapter: {e}"),
        };
        let b = Generic(&w);
        let x: Vec<f64> = (0..8).map(|i| 0.3 * (i as f64) - 1.1).collect();
        let xdot: Vec<f64> = (0..8).map(|i| 0.7 - 0.2 * i as f64).collect();
        let params: Vec<f64> = (0..12).map(|i| 0.1 * (i as f64).sin() + 0.2).collect();
        let mut t = Tape::<f64, f64>::record();
        let xv = t.leaf(Vec::new(), 4, 2);
        // x·1 (the same numbers): a constant the other tape below has other values of.
        let x1 = t.scale(xv, 1.0);
        let o = graph(&mut t, x1);
        let ny = t.len(o);
        let ybar: Vec<f64> = (0..ny).map(|i| 1.0 + i as f64).collect();
        let ydotbar: Vec<f64> = (0..ny).map(|i| 0.5 - 0.25 * i as f64).collect();
        let cpu = GraphPasses::on_cpu(&x, &xdot, &params, &ybar, &ydotbar);
        let rec = Prepared::new((t, xv, o));
        let (xb, xdb, pb) = (b.upload(&x), b.upload(&xdot), b.upload(&params));
        let (yb, ydb) = (b.upload(&ybar), b.upload(&ydotbar));
        let mut out = b.zeros(ny);
        let mine = Pool::default();
        let run = dt::forward(&b, mine.clone(), &rec, (&xb, None), &pb, &mut out);
        // Every tensor of the forward, so that a failure names the op.
        let mut eager = Tape::<f64, f64>::new(&params);
        let xe = eager.leaf(x.clone(), 4, 2);
        let x1 = eager.scale(xe, 1.0);
        graph(&mut eager, x1);
        for (i, (op, (r, c))) in rec.rec.0.ops().enumerate() {
            let buf = run.vals[run.src[i]].as_ref().unwrap();
            let bytes = w.read_bytes(buf, (r * c * 8) as u64);
            let dev: Vec<f64> = bytemuck::pod_collect_to_vec(&bytes);
            let kind = format!("{:?}", std::mem::discriminant(op));
            close(&format!("op {i} {kind}"), &dev, eager.val(V::at(i)));
        }
        close("y", &b.download(&out), &cpu.y);
        // Another stage's tape, of the same ops with other constants, runs between the forward
        // and its backward, as in training several models (or tests) on one device.
        let mut other = Tape::<f64, f64>::record();
        let xo = other.leaf(Vec::new(), 4, 2);
        let x2 = other.scale(xo, 2.0);
        let y = graph(&mut other, x2);
        let mut scratch = b.zeros(ny);
        let other = Prepared::new((other, xo, y));
        dt::forward(&b, Pool::default(), &other, (&xb, None), &pb, &mut scratch);
        let mut q = b.zeros(8);
        dt::backward(&b, &rec, run, &pb, (&yb, None), Some(&mut q), None);
        close("x̄", &b.download(&q), &cpu.xbar);
        let run = dt::forward(&b, mine, &rec, (&xb, Some(&xdb)), &pb, &mut out);
        close("ẏ", &b.download(&out), &cpu.ydot);
        let mut g = b.zeros(params.len());
        dt::backward(&b, &rec, run, &pb, (&ydb, Some(&yb)), None, Some(&mut g));
        close("gradient", &b.download(&g), &cpu.grad);
    }
}

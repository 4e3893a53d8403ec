//! The tape run on cuda (`backend/device_tape`, the walk every device shares) through
//! kernels/tape.cu: its real kernels for the forward and backward, its dual ones for the
//! tangent and the dual reverse. With `DPW_CUDA_TAPE=kernels` DPA-2's, se_e3_tebd's and DPA-3's
//! blocks run so; by default, and for a block without a tape, through the family's host bodies,
//! until a GPU has run the kernels' parity tests (scripts/gpu-check.sh).
//!
//! The kept buffers of a stage's runs live in its keep (`device_tape::Pool`). A run uploads its
//! constants, indices and constant tensors, so a step that runs a tape is not captured as a
//! graph (the region runs eagerly, as with the host bodies, which read back).

use std::sync::Arc;

use cudarc::driver::{result, CudaSlice, DeviceRepr};

use super::{grid, launch, Cuda, CudaBuf, CudaIdx, CudaReal, LaunchConfig, BLOCK};
use crate::backend::block::{self, BlockArgs};
use crate::backend::device_tape::{self as dt, Bound, Kern, Pool, Slot, TapeDevice};
use crate::backend::gpu_layout::TapeParams;
use crate::backend::monomorphic::Generic;
use crate::backend::{BlockOps, Device, Dims};

// SAFETY: a #[repr(C)] struct of 4-byte integers, declared to the kernels from its Rust layout
// (gpu_layout::cuda_declarations, which static_asserts the size), as DenseParams.
unsafe impl DeviceRepr for TapeParams {}

/// A buffer as the tape's kernels take it: its address, and the allocation where it is one of
/// the kept buffers (held while a run uses it).
#[derive(Clone)]
pub(crate) struct Raw {
    addr: u64,
    own: Option<Arc<CudaSlice<u8>>>,
}

impl<T: CudaReal> TapeDevice<T> for Generic<'_, Cuda> {
    type Raw = Raw;

    fn raw(&self, b: &CudaBuf<T>) -> Raw {
        Raw {
            addr: self.ptr(b),
            own: None,
        }
    }

    fn len_of(b: &CudaBuf<T>) -> usize {
        b.len
    }

    fn slot(&self, pool: &Pool<Raw>, slot: Slot, bytes: u64) -> Raw {
        let fits = |b: &Raw| b.own.as_ref().is_some_and(|o| o.len() as u64 >= bytes);
        pool.get(slot, fits, || {
            self.uncapturable("an allocation", false);
            self.counters.buffer();
            let b = (self.stream.alloc_zeros::<u8>(bytes.max(1) as usize))
                .expect("cuda: allocating a tape buffer");
            Raw {
                addr: self.addr(&b),
                own: Some(Arc::new(b)),
            }
        })
    }

    fn slot_with(&self, pool: &Pool<Raw>, slot: Slot, bytes: &[u8]) -> Raw {
        let buf = TapeDevice::<T>::slot(self, pool, slot, bytes.len() as u64);
        if !bytes.is_empty() && self.uncapturable("a host write", true) {
            self.counters.upload(bytes.len());
            // SAFETY: the buffer holds at least bytes.len() bytes; the copy from pageable
            // memory is staged before the call returns.
            unsafe { result::memcpy_htod_async(buf.addr, bytes, self.stream.cu_stream()) }
                .expect("cuda: writing a tape buffer");
        }
        buf
    }

    fn copy_bytes(&self, src: &Raw, from: u64, dst: &Raw, bytes: u64) {
        let (from, bytes) = (from as usize, bytes as usize);
        if bytes == 0 || !self.dtod(src.addr, dst.addr, from, 0, bytes, 1) {
            return;
        }
        self.counters.launch();
        let at = src.addr + from as u64;
        // SAFETY: both are live buffers of this context, large enough (the walk's sizes).
        unsafe { result::memcpy_dtod_async(dst.addr, at, bytes, self.stream.cu_stream()) }
            .expect("cuda: copying a tape buffer");
    }

    fn zero(&self, b: &mut CudaBuf<T>) {
        self.fill(b, T::zero());
    }

    fn launch(
        &self,
        at: &Bound<'_, Raw>,
        k: Kern,
        u: &TapeParams,
        [a, b, y, y2]: [Option<&Raw>; 4],
        threads: usize,
    ) {
        let dual = if at.dual { "_dual" } else { "" };
        let name = format!("{}{dual}{}", k.name(), T::SUFFIX);
        // A buffer the kernel does not bind is passed as a null address.
        let addr = |r: Option<&Raw>| r.map_or(0, |r| r.addr);
        launch!(
            self,
            &name,
            grid(threads, BLOCK),
            [
                *u,
                at.cst.addr,
                at.params.addr,
                addr(a),
                addr(b),
                at.idx.addr,
                addr(y),
                addr(y2)
            ]
        );
    }
}

/// With `DPW_CUDA_TAPE=kernels`, DPA-2's, se_e3_tebd's and DPA-3's blocks run through their
/// tapes on the device; otherwise, and a block without a tape always, through the family's host
/// bodies.
impl<T: CudaReal> BlockOps<T> for Generic<'_, Cuda> {
    fn block_forward(&self, d: &Dims, a: &BlockArgs<CudaBuf<T>, CudaIdx>, desc: &mut CudaBuf<T>) {
        if !(self.tape_kernels && dt::block_forward(self, d, a, desc)) {
            block::block_forward(self, d, a, desc)
        }
    }

    fn block_backward(
        &self,
        d: &Dims,
        a: &BlockArgs<CudaBuf<T>, CudaIdx>,
        dbar: &CudaBuf<T>,
        q: &mut CudaBuf<T>,
    ) {
        if !(self.tape_kernels && dt::block_backward(self, d, a, dbar, q)) {
            block::block_backward(self, d, a, dbar, q)
        }
    }

    fn block_tangent(
        &self,
        d: &Dims,
        a: &BlockArgs<CudaBuf<T>, CudaIdx>,
        rijdot: &CudaBuf<T>,
        ddot: &mut CudaBuf<T>,
    ) {
        if !(self.tape_kernels && dt::block_tangent(self, d, a, rijdot, ddot)) {
            block::block_tangent(self, d, a, rijdot, ddot)
        }
    }

    fn block_dual(
        &self,
        d: &Dims,
        a: &BlockArgs<CudaBuf<T>, CudaIdx>,
        rijdot: &CudaBuf<T>,
        adjoints: (&CudaBuf<T>, &CudaBuf<T>),
        grad: &mut CudaBuf<T>,
    ) {
        if !(self.tape_kernels && dt::block_dual(self, d, a, rijdot, adjoints, grad)) {
            block::block_dual(self, d, a, rijdot, adjoints, grad)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::FILES;
    use super::Kern;

    /// Every kernel the walk launches is one kernels/tape.cu defines (the NVRTC test checks
    /// that the file defines those it lists), on reals and on duals.
    #[test]
    fn the_walk_launches_only_listed_kernels() {
        let tape = FILES.iter().find(|f| f.name == "tape.cu").unwrap();
        for k in Kern::ALL {
            for name in [k.name().to_string(), format!("{}_dual", k.name())] {
                assert!(tape.kernels.contains(&name.as_str()), "{name} not listed");
            }
        }
        assert_eq!(tape.kernels.len(), 2 * Kern::ALL.len());
    }
}

//! What a collective over this backend's buffers needs (the gradient all-reduce through NCCL,
//! src/dist/nccl.rs): the stream the ops run on, the device's identity, buffer addresses, and a
//! scale on the device.

use std::any::TypeId;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{Cuda, CudaBuf, CudaReal};

/// The CUDA side of a backend's buffers of `T`.
pub trait DeviceAccess<T, Buf> {
    /// The stream every op runs on: work enqueued there is ordered with them.
    fn stream(&self) -> &Arc<CudaStream>;
    /// The device's UUID (`GPU-…`, as nvidia-smi writes it): ranks with the same one share a GPU.
    fn device_uuid(&self) -> String;
    /// The device address of `b` and its length in values.
    fn raw(&self, b: &mut Buf) -> (u64, usize);
    /// `b ×= factor` on the stream, each value multiplied once by `factor` rounded to T.
    fn scale(&self, b: &mut Buf, factor: f64);
}

impl<T: CudaReal> DeviceAccess<T, CudaBuf<T>> for Cuda {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn device_uuid(&self) -> String {
        match self.ctx.uuid() {
            Ok(u) => {
                let h: String = u
                    .bytes
                    .iter()
                    .map(|&b| format!("{:02x}", b as u8))
                    .collect();
                format!(
                    "GPU-{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            }
            // Without a UUID, the ordinal: shared GPUs on one node are still found.
            Err(_) => format!("device {}", self.ctx.ordinal()),
        }
    }

    fn raw(&self, b: &mut CudaBuf<T>) -> (u64, usize) {
        (self.ptr(b), b.len)
    }

    fn scale(&self, b: &mut CudaBuf<T>, factor: f64) {
        // × 1 changes no value: no launch.
        if b.len == 0 || factor == 1.0 || !self.uncapturable("a cuBLAS scal", true) {
            return;
        }
        let n = i32::try_from(b.len).expect("cuda: scale of more than 2^31 values");
        let x = self.ptr(b);
        let blas = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        let h = *blas.handle();
        self.counters.launch();
        // SAFETY: x is n values of T on this context; the handle runs on self.stream.
        let status = unsafe {
            if TypeId::of::<T>() == TypeId::of::<f64>() {
                cudarc::cublas::sys::cublasDscal_v2(h, n, &factor, x as *mut f64, 1)
            } else {
                let f = factor as f32;
                cudarc::cublas::sys::cublasSscal_v2(h, n, &f, x as *mut f32, 1)
            }
        };
        status.result().expect("cuBLAS: scal");
    }
}

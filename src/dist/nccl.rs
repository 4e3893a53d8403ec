//! The gradient all-reduce through NCCL on the GPUs' buffers (features `mpi` + `cuda`): cudarc's
//! NCCL bindings, the library loaded at run time like the driver, NVRTC and cuBLAS; the
//! communicator's unique id is made on rank 0 and broadcast over MPI.

use std::any::TypeId;
use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};

use super::World;
use crate::backend::cuda::DeviceAccess;
use crate::backend::Real;

/// NCCL's version, or why its library cannot be used here. cudarc loads it as `libnccl.so` (its
/// candidate names, not the runtime soname `libnccl.so.2`).
pub fn probe() -> Result<String, String> {
    // SAFETY: only tries to dlopen the library under cudarc's candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "libnccl.so not found: put the folder of NCCL's libnccl.so on \
                    LD_LIBRARY_PATH (where only libnccl.so.2 is installed, as from pip's \
                    nvidia-nccl-cu12 or Debian's libnccl2, a libnccl.so link to it)"
                .into(),
        );
    }
    result::get_nccl_version()
        .map(super::reduce_path::nccl_version)
        .map_err(|e| format!("ncclGetVersion: {}", describe(&e)))
}

/// NCCL's own words for an error.
fn describe(e: &result::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    format!("{:?}: {}", e.0, text.to_string_lossy())
}

/// One communicator over all ranks, each on its own GPU, working on the backend's stream.
pub struct Comm {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
}

impl Comm {
    /// Collective: rank 0 makes the unique id, MPI broadcasts it, every rank joins.
    pub fn new(w: &World, stream: Arc<CudaStream>) -> Result<Comm> {
        let mut id = [0u8; 128];
        let made = if w.is_root() {
            result::get_uniqueid().map(|u| {
                for (d, s) in id.iter_mut().zip(u.internal) {
                    *d = s as u8;
                }
            })
        } else {
            Ok(())
        };
        // Every rank waits for rank 0's id, so rank 0's failure must reach them first.
        w.agree(made.map_err(|e| anyhow::anyhow!("ncclGetUniqueId: {}", describe(&e))))?;
        w.broadcast_bytes(&mut id);
        let unique = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        stream.context().bind_to_thread()?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: comm is written by NCCL; the id is the one every rank received.
        unsafe { result::comm_init_rank(&mut comm, w.size() as i32, unique, w.rank() as i32) }
            .map_err(|e| anyhow::anyhow!("ncclCommInitRank: {}", describe(&e)))?;
        Ok(Comm { comm, stream })
    }

    /// `grad ×= share`, then `grad` and `sums` summed over the ranks in place, all enqueued on
    /// the stream (ordered with the step's ops; nothing waits here).
    pub fn all_reduce<T: Real, Buf>(
        &self,
        dev: &dyn DeviceAccess<T, Buf>,
        grad: &mut Buf,
        sums: &mut Buf,
        share: f64,
    ) -> Result<()> {
        let dtype = if TypeId::of::<T>() == TypeId::of::<f64>() {
            sys::ncclDataType_t::ncclFloat64
        } else if TypeId::of::<T>() == TypeId::of::<f32>() {
            sys::ncclDataType_t::ncclFloat32
        } else {
            bail!("NCCL all-reduce of {}", T::NAME)
        };
        dev.scale(grad, share);
        let bufs = [dev.raw(grad), dev.raw(sums)];
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        self.stream.context().bind_to_thread()?;
        result::group_start().map_err(|e| anyhow::anyhow!("ncclGroupStart: {}", describe(&e)))?;
        for (p, n) in bufs {
            // SAFETY: p is n values of T on this rank's device, alive until the stream has run
            // the reduction (the buffers outlive the step).
            unsafe {
                result::all_reduce(
                    p as *const _,
                    p as *mut _,
                    n,
                    dtype,
                    sys::ncclRedOp_t::ncclSum,
                    self.comm,
                    stream,
                )
            }
            .map_err(|e| anyhow::anyhow!("ncclAllReduce: {}", describe(&e)))?;
        }
        result::group_end().map_err(|e| anyhow::anyhow!("ncclGroupEnd: {}", describe(&e)))?;
        Ok(())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Every reduction has run once the stream is idle; abort then frees the communicator
        // without waiting for the other ranks (destroy may, and a failing rank never comes).
        let _ = self.stream.synchronize();
        // SAFETY: the communicator is not used again.
        let _ = unsafe { result::comm_abort(self.comm) };
    }
}

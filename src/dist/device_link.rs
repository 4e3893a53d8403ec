//! What the gradient exchange may use of a backend beyond the `Backend` trait: the CUDA stream
//! and memory behind its buffers, so that NCCL reduces them where they are. The code that opened
//! the backend knows what it is and says so here; generic code only passes the link on, and the
//! op trait knows nothing of collectives.

use std::marker::PhantomData;

#[cfg(feature = "cuda")]
use crate::backend::cuda::DeviceAccess;

/// A backend's device side, as far as the exchange can use it.
pub struct DeviceLink<'a, T, Buf> {
    #[cfg(feature = "cuda")]
    cuda: Option<&'a dyn DeviceAccess<T, Buf>>,
    _of: PhantomData<fn(&'a T, Buf)>,
}

impl<'a, T, Buf> DeviceLink<'a, T, Buf> {
    /// Buffers the exchange reads back and reduces through host MPI.
    pub fn host() -> Self {
        DeviceLink {
            #[cfg(feature = "cuda")]
            cuda: None,
            _of: PhantomData,
        }
    }

    /// Buffers in CUDA memory, reduced in place through NCCL where every rank can.
    #[cfg(feature = "cuda")]
    pub fn cuda(device: &'a dyn DeviceAccess<T, Buf>) -> Self {
        DeviceLink {
            cuda: Some(device),
            _of: PhantomData,
        }
    }

    #[cfg(feature = "cuda")]
    pub(super) fn cuda_access(&self) -> Option<&'a dyn DeviceAccess<T, Buf>> {
        self.cuda
    }
}

//! The wgpu backend: the ops of [`Backend`](super::Backend) as WGSL compute shaders
//! (`shaders/*.wgsl`), run through wgpu on Vulkan, Metal, DX12, GL or WebGPU, in float32 or
//! (with `SHADER_F64`) float64.
//!
//! Buffers live on the device. Ops only record work into a pending command encoder, which is
//! submitted when a result is read back (or every few dozen ops); no op reads the device
//! synchronously except `download` and `loss` (which returns its sums).
//!
//! Every reduction is computed by one thread in a fixed order (or as fixed chunks summed in
//! order), never with atomics, so a run is bit-for-bit repeatable on one device.
//!
//! Environment: `WGPU_BACKEND` (vulkan, metal, dx12, gl), `WGPU_ADAPTER_NAME` (part of a name),
//! `WGPU_POWER_PREF` (low, high) choose the adapter; `DPW_WGPU_DENSE` (tiled, flat) overrides
//! the dense kernels chosen for the adapter ([`DenseKernels`]); `DPW_WGPU_PASSES` (shared, each)
//! how dispatches are grouped into compute passes ([`Passes`]); `DPW_WGPU_PROFILE=1` adds up the
//! device's time per kernel, from GPU timestamps where the adapter has them
//! ([`Wgpu::profile_report`]). Without a GPU,
//! Mesa's lavapipe (Debian: `mesa-vulkan-drivers`, `libvulkan1`) is a Vulkan CPU adapter with
//! float64.

mod device;
mod force_csr;
mod ops;
mod profile;
pub mod shaders;
mod tape;

use std::marker::PhantomData;

/// The adapter preference taken by [`Wgpu::new`].
pub use ::wgpu::PowerPreference;
pub use device::{DenseKernels, Passes, Wgpu};
pub use shaders::Precision;

use super::Real;

/// The float types the shaders are built for.
pub trait GpuReal: Real {
    const PRECISION: Precision;
}

impl GpuReal for f32 {
    const PRECISION: Precision = Precision::F32;
}

impl GpuReal for f64 {
    const PRECISION: Precision = Precision::F64;
}

/// A device vector of T.
#[derive(Debug)]
pub struct Buf<T> {
    buf: wgpu::Buffer,
    len: usize,
    /// Unique per allocation ([`Device::buf_id`](super::Device::buf_id)).
    id: u64,
    /// The host's copy of an input made by [`Device::upload_kept`](super::Device::upload_kept)
    /// (no kernel writes it); `None` for the others.
    host: Option<std::sync::Arc<Vec<T>>>,
    _t: PhantomData<T>,
}

impl<T> Buf<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn raw(&self) -> &wgpu::Buffer {
        &self.buf
    }
}

/// A device vector of i32. It keeps its host copy: the force gather lists are built from the
/// owner and centre tables on the host, once per upload or write.
#[derive(Debug)]
pub struct Idx {
    buf: wgpu::Buffer,
    host: std::sync::Arc<Vec<i32>>,
    /// Unique per allocation.
    id: u64,
    /// Unique per contents (upload, write or gather), to key host-side caches derived from them.
    version: u64,
    /// Set when the last gather copied one contiguous window of another index buffer: the
    /// force gather lists of a resident frame are then copied on the device, not rebuilt.
    window: Option<Window>,
    /// The force gather lists of every frame of this buffer, when it holds the owner tables of
    /// resident frames and a window of it has been used as a batch's.
    frame_lists: std::sync::Arc<std::sync::OnceLock<device::FrameLists>>,
}

/// The values of an index buffer from `at` on, with that buffer's per-frame lists.
#[derive(Clone, Debug)]
struct Window {
    at: usize,
    lists: std::sync::Arc<std::sync::OnceLock<device::FrameLists>>,
}

impl Idx {
    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }

    pub fn raw(&self) -> &wgpu::Buffer {
        &self.buf
    }
}

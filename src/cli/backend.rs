//! Choosing a backend and a precision, and running generic work on the chosen pair.

use anyhow::{bail, Result};
use clap::ValueEnum;

use crate::backend::cpu::Cpu;
use crate::backend::{Backend, Real};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The best available: cuda, then a real (non-CPU) GPU through wgpu, then cpu.
    Auto,
    Cpu,
    /// Any GPU through Vulkan, Metal, DX12 or GL (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME` honoured).
    Wgpu,
    /// NVIDIA GPUs (needs a dpw built with `--features cuda`).
    Cuda,
}

/// Work that runs on any backend and precision.
pub trait Job {
    type Output;
    fn run<T: Real, B: Backend<T>>(self, backend: &B) -> Result<Self::Output>;
}

fn run_on<J: Job, T: Real, B: Backend<T>>(b: &B, job: J) -> Result<J::Output> {
    tracing::info!("backend: {}, precision {}", b.name(), T::NAME);
    job.run::<T, B>(b)
}

pub fn run_job<J: Job>(choice: BackendChoice, float64: bool, job: J) -> Result<J::Output> {
    macro_rules! with_precision {
        ($b:expr) => {
            if float64 {
                run_on::<J, f64, _>($b, job)
            } else {
                run_on::<J, f32, _>($b, job)
            }
        };
    }
    match choice {
        BackendChoice::Cpu => with_precision!(&Cpu::default()),
        BackendChoice::Cuda => {
            let c = open_cuda()?;
            with_precision!(&c)
        }
        BackendChoice::Wgpu => {
            let w = open_wgpu(float64, false)?;
            let out = with_precision!(&w);
            #[cfg(feature = "wgpu")]
            if let Some(report) = w.profile_report() {
                tracing::info!("{report}");
            }
            out
        }
        BackendChoice::Auto => {
            #[cfg(feature = "cuda")]
            match open_cuda() {
                Ok(c) => {
                    tracing::info!("auto backend: cuda");
                    return with_precision!(&c);
                }
                Err(e) => tracing::info!("auto backend: not cuda ({e:#})"),
            }
            #[cfg(feature = "wgpu")]
            match open_wgpu(float64, true) {
                Ok(w) => {
                    tracing::info!("auto backend: wgpu");
                    return with_precision!(&w);
                }
                Err(e) => tracing::info!("auto backend: not wgpu ({e:#})"),
            }
            tracing::info!("auto backend: cpu");
            with_precision!(&Cpu::default())
        }
    }
}

#[cfg(feature = "cuda")]
pub(super) fn open_cuda() -> Result<crate::backend::cuda::Cuda> {
    let c = crate::backend::cuda::Cuda::new(0)?;
    tracing::info!("CUDA device: {}", c.device_name());
    Ok(c)
}

#[cfg(not(feature = "cuda"))]
pub(super) fn open_cuda() -> Result<Cpu> {
    bail!("this dpw was built without the CUDA backend: build it with `cargo build --release --features cuda`")
}

/// A wgpu device able to compute in the chosen precision; with `real_gpu_only`, software
/// adapters (lavapipe, llvmpipe, SwiftShader) are refused, as `auto` would be slower than cpu.
#[cfg(feature = "wgpu")]
pub(super) fn open_wgpu(float64: bool, real_gpu_only: bool) -> Result<crate::backend::wgpu::Wgpu> {
    let w = crate::backend::wgpu::Wgpu::new(wgpu::PowerPreference::HighPerformance)?;
    tracing::info!("wgpu adapter: {} ({})", w.adapter_name(), w.backend_name());
    if real_gpu_only && w.is_cpu_adapter() {
        bail!("the only adapter, {}, is a CPU emulation", w.adapter_name());
    }
    if float64 {
        w.require::<f64>()?;
    }
    Ok(w)
}

#[cfg(not(feature = "wgpu"))]
pub(super) fn open_wgpu(_float64: bool, _real_gpu_only: bool) -> Result<Cpu> {
    bail!("this dpw was built without the wgpu backend: build it with `cargo build --release --features wgpu`")
}

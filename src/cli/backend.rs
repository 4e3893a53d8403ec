//! Choosing a backend and a precision, and running generic work on the chosen pair.

use anyhow::{bail, Result};
use clap::ValueEnum;

use crate::backend::cpu::Cpu;
use crate::backend::{Backend, Real};
use crate::dist::DeviceLink;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The best available: cuda, then a real (non-CPU) GPU through wgpu, then cpu.
    Auto,
    Cpu,
    /// Any GPU through Vulkan, Metal, DX12 or GL (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME` honoured).
    Wgpu,
    /// NVIDIA GPUs through CUDA (driver, NVRTC and cuBLAS loaded at run time).
    Cuda,
}

/// Keeps the wgpu probe quiet where no desktop session runs (ssh, batch jobs): Mesa's
/// device-select Vulkan layer then tries to reach a Wayland display to order the GPUs, and
/// libwayland prints "XDG_RUNTIME_DIR is invalid" for each probe. wgpu picks its adapter by
/// power preference and `WGPU_ADAPTER_NAME`, not by that order, so the layer is switched off
/// (its documented `NODEVICE_SELECT`) unless the user set it. Call before any thread starts.
pub fn quiet_vulkan_probe() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

/// Work that runs on any backend and precision. `link` is the backend's device side for the
/// gradient exchange, known here where the backend is opened.
pub trait Job {
    type Output;
    fn run<T: Real, B: Backend<T>>(
        self,
        backend: &B,
        link: DeviceLink<T, B::Buf>,
    ) -> Result<Self::Output>;
}

fn run_on<J: Job, T: Real, B: Backend<T>>(
    b: &B,
    link: DeviceLink<T, B::Buf>,
    job: J,
) -> Result<J::Output> {
    tracing::info!("backend: {}, precision {}", b.name(), T::NAME);
    job.run::<T, B>(b, link)
}

pub fn run_job<J: Job>(choice: BackendChoice, float64: bool, job: J) -> Result<J::Output> {
    macro_rules! with_precision {
        ($b:expr) => {
            with_precision!($b, DeviceLink::host)
        };
        ($b:expr, $link:expr) => {
            if float64 {
                run_on::<J, f64, _>($b, $link(), job)
            } else {
                run_on::<J, f32, _>($b, $link(), job)
            }
        };
    }
    match choice {
        BackendChoice::Cpu => with_precision!(&Cpu::default()),
        BackendChoice::Cuda => {
            let c = open_cuda()?;
            #[cfg(feature = "cuda")]
            return with_precision!(&c, || DeviceLink::cuda(&c));
            #[cfg(not(feature = "cuda"))]
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
                    return with_precision!(&c, || DeviceLink::cuda(&c));
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

/// This process's rank among the processes on its node, and their number: the MPI world's when
/// training is distributed, else what a launcher announces (`srun`/`mpirun` starting separate
/// processes), else (0, 1).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn local_rank() -> (usize, usize) {
    let w = crate::dist::world();
    if w.is_distributed() {
        (w.local_rank(), w.local_size())
    } else {
        (crate::dist::launcher_local_rank().unwrap_or(0), 1)
    }
}

/// Which of the `count` devices this process sees it opens, and why, in words for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePick {
    pub index: usize,
    pub why: String,
}

/// The device of local rank `local_rank` (of `local_size` on the node) among `count` visible
/// ones: ranks sharing a node take different devices, wrapping (and sharing) when they outnumber
/// them. A launcher that binds one GPU to each rank (`CUDA_VISIBLE_DEVICES` per rank) leaves
/// one visible, which every rank opens as its device 0.
pub fn pick_device(local_rank: usize, local_size: usize, count: usize) -> Result<DevicePick> {
    if count == 0 {
        bail!("no device to open");
    }
    let index = crate::dist::gpu_ordinal(local_rank, count);
    let why = if count == 1 {
        "the only one visible".to_string()
    } else if local_size > count {
        format!("local rank {local_rank} of {local_size}; {local_size} ranks share {count} devices")
    } else {
        format!("local rank {local_rank} of {local_size}")
    };
    Ok(DevicePick { index, why })
}

#[cfg(feature = "cuda")]
pub(super) fn open_cuda() -> Result<crate::backend::cuda::Cuda> {
    use crate::backend::cuda::Cuda;
    let count = Cuda::device_count()?;
    let (rank, size) = local_rank();
    let pick = pick_device(rank, size, count)
        .map_err(|_| anyhow::anyhow!("no CUDA device found; use --backend cpu or wgpu"))?;
    let c = Cuda::new(pick.index)?;
    tracing::info!(
        "CUDA device {} of {count} ({}): {}",
        pick.index,
        pick.why,
        c.device_name()
    );
    Ok(c)
}

#[cfg(not(feature = "cuda"))]
pub(super) fn open_cuda() -> Result<Cpu> {
    bail!("this dpw was built without the CUDA backend: build it with `cargo build --release --features cuda`")
}

/// A wgpu device able to compute in the chosen precision; with `real_gpu_only`, software
/// adapters (lavapipe, llvmpipe, SwiftShader) are refused, as `auto` would be slower than cpu.
///
/// Processes sharing a node (MPI ranks, or a launcher's tasks) take the adapters by their local
/// rank, among those of the graphics API wgpu prefers, software ones left out when a GPU is
/// there; `WGPU_ADAPTER_NAME` overrides the choice.
#[cfg(feature = "wgpu")]
pub(super) fn open_wgpu(float64: bool, real_gpu_only: bool) -> Result<crate::backend::wgpu::Wgpu> {
    use crate::backend::wgpu::Wgpu;
    let power = wgpu::PowerPreference::HighPerformance;
    let (rank, size) = local_rank();
    let w = if std::env::var_os("WGPU_ADAPTER_NAME").is_some() || (rank, size) == (0, 1) {
        Wgpu::new(power)?
    } else {
        let adapters = rank_adapters(pollster::block_on(Wgpu::adapters()));
        let pick = pick_device(rank, size, adapters.len())
            .map_err(|_| anyhow::anyhow!("no wgpu adapter"))?;
        let n = adapters.len();
        let adapter = adapters.into_iter().nth(pick.index).expect("picked index");
        tracing::info!("wgpu adapter {} of {n} ({})", pick.index, pick.why);
        pollster::block_on(Wgpu::on_adapter(adapter))?
    };
    tracing::info!(
        "wgpu adapter: {} ({}), dense kernels {}, passes {}",
        w.adapter_name(),
        w.backend_name(),
        w.dense_kernels().name(),
        w.passes().name()
    );
    if real_gpu_only && w.is_cpu_adapter() {
        bail!("the only adapter, {}, is a CPU emulation", w.adapter_name());
    }
    if float64 {
        w.require::<f64>()?;
    }
    Ok(w)
}

/// The adapters a rank may take, in wgpu's order: those of the first adapter's graphics API (one
/// GPU is often listed once per API), real GPUs only when there is one.
#[cfg(feature = "wgpu")]
fn rank_adapters(all: Vec<wgpu::Adapter>) -> Vec<wgpu::Adapter> {
    let Some(api) = all.first().map(|a| a.get_info().backend) else {
        return all;
    };
    let same: Vec<wgpu::Adapter> = all
        .into_iter()
        .filter(|a| a.get_info().backend == api)
        .collect();
    let is_cpu = |a: &wgpu::Adapter| a.get_info().device_type == wgpu::DeviceType::Cpu;
    if same.iter().all(is_cpu) {
        same
    } else {
        same.into_iter().filter(|a| !is_cpu(a)).collect()
    }
}

#[cfg(not(feature = "wgpu"))]
pub(super) fn open_wgpu(_float64: bool, _real_gpu_only: bool) -> Result<Cpu> {
    bail!("this dpw was built without the wgpu backend: build it with `cargo build --release --features wgpu`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_of_a_node_take_different_devices() {
        let picks: Vec<usize> = (0..4)
            .map(|r| pick_device(r, 4, 4).unwrap().index)
            .collect();
        assert_eq!(picks, [0, 1, 2, 3]);
        assert_eq!(pick_device(2, 4, 4).unwrap().why, "local rank 2 of 4");
    }

    #[test]
    fn more_ranks_than_devices_wrap_and_say_they_share() {
        let p = pick_device(3, 4, 2).unwrap();
        assert_eq!(p.index, 1);
        assert!(p.why.contains("4 ranks share 2 devices"), "{}", p.why);
    }

    #[test]
    fn one_visible_device_per_rank_is_device_zero() {
        // CUDA_VISIBLE_DEVICES set per rank by the launcher: every rank sees one GPU.
        for r in 0..8 {
            let p = pick_device(r, 8, 1).unwrap();
            assert_eq!(p.index, 0);
            assert_eq!(p.why, "the only one visible");
        }
    }

    #[test]
    fn a_serial_process_takes_the_first_and_none_is_an_error() {
        assert_eq!(pick_device(0, 1, 3).unwrap().index, 0);
        assert!(pick_device(0, 1, 0).is_err());
    }
}

//! The CUDA kernel sources (`kernels/*.cu`), the kernels each file defines, and their run-time
//! compilation with NVRTC. Public so that `tests/kernels_nvrtc.rs` can compile every file for
//! several architectures without a GPU.

use anyhow::{anyhow, Result};

/// Prepended to every file: NVRTC sees no file system, so `#include` is not used.
const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// One kernel file: its name, its source, and the base names of its kernels; each base name
/// `op` is instantiated as `op_f32` and `op_f64`.
pub struct KernelFile {
    pub name: &'static str,
    source: &'static str,
    pub kernels: &'static [&'static str],
}

impl KernelFile {
    /// The text NVRTC compiles: the layouts shared with the host, the common header, then the
    /// file.
    pub fn source(&self) -> String {
        format!(
            "{}\n// ---- common.cuh ----\n{COMMON}\n// ---- {} ----\n{}",
            crate::backend::gpu_layout::cuda_declarations(),
            self.name,
            self.source
        )
    }
}

/// The tape's kernels `tape_NAME` of each name, on reals and on duals (`tape_NAME_dual`).
macro_rules! tape_kernels {
    ($($k:literal),* $(,)?) => {
        &[$(concat!("tape_", $k), concat!("tape_", $k, "_dual")),*]
    };
}

/// Every kernel file, one per op family, named like the CPU modules.
pub const FILES: &[KernelFile] = &[
    KernelFile {
        name: "env_mat.cu",
        source: include_str!("../../../kernels/env_mat.cu"),
        kernels: &["env_mat"],
    },
    KernelFile {
        name: "dense.cu",
        source: include_str!("../../../kernels/dense.cu"),
        kernels: &[
            "dense_forward",
            "dense_zbar",
            "dense_skip_adjoint",
            "dense_tangent",
            "dense_scale_rows",
            "dense_dual_elems",
            "dense_dual_sums",
            "dense_dual_finish",
        ],
    },
    KernelFile {
        name: "contract.cu",
        source: include_str!("../../../kernels/contract.cu"),
        kernels: &[
            "contract_forward",
            "contract_backward",
            "slot_backward",
            "contract_tangent",
            "contract_dual",
            "contract_gbar",
        ],
    },
    KernelFile {
        name: "radial.cu",
        source: include_str!("../../../kernels/radial.cu"),
        kernels: &[
            "radial_forward",
            "radial_tangent",
            "radial_backward",
            "radial_dual",
        ],
    },
    KernelFile {
        name: "angle.cu",
        source: include_str!("../../../kernels/angle.cu"),
        kernels: &[
            "angle_values",
            "angle_values_tangent",
            "angle_forward",
            "angle_tangent",
            "angle_backward_pairs",
            "angle_backward_slots",
            "angle_dual",
        ],
    },
    KernelFile {
        name: "attn.cu",
        source: include_str!("../../../kernels/attn.cu"),
        kernels: &[
            "attn_switch",
            "tebd_rows",
            "tebd_rows_lead",
            "tebd_rows_backward_parts",
            "tebd_rows_backward_sum",
            "strip_forward",
            "strip_dual",
            "strip_dual_parts",
            "strip_dual_sum",
        ],
    },
    KernelFile {
        name: "attn_block.cu",
        source: include_str!("../../../kernels/attn_block.cu"),
        kernels: &[
            "attn_block_pack",
            "attn_block_load",
            "attn_block_load_dual",
            "attn_block_forward",
            "attn_block_tangent",
            "attn_block_backward",
            "attn_block_dual",
            "attn_block_q",
            "attn_block_rot",
            "attn_block_abar",
            "attn_block_g0bar",
            "attn_block_grad",
        ],
    },
    KernelFile {
        name: "tape.cu",
        source: include_str!("../../../kernels/tape.cu"),
        kernels: tape_kernels!(
            "linear",
            "linear_x",
            "linear_w",
            "linear_w_parts",
            "sum_parts",
            "bmm",
            "map",
            "zip",
            "reduce",
            "gather",
            "scatter",
            "sum_rows",
            "spread_rows",
            "softmax",
            "softmax_back",
            "copy_cols",
            "param",
            "param_grad",
            "pair",
            "part",
        ),
    },
    KernelFile {
        name: "scatter.cu",
        source: include_str!("../../../kernels/scatter.cu"),
        kernels: &[
            "energy_atoms",
            "energy_frames",
            "force_centres",
            "virial_frames",
        ],
    },
    KernelFile {
        name: "loss.cu",
        source: include_str!("../../../kernels/loss.cu"),
        kernels: &["loss_residual", "loss_ebar", "virtual_tangent"],
    },
    KernelFile {
        name: "adam.cu",
        source: include_str!("../../../kernels/adam.cu"),
        kernels: &["adam", "fill", "grad_sq", "sum_parts", "clip_scale"],
    },
];

/// The precisions every kernel is instantiated for, as kernel-name suffixes.
pub const SUFFIXES: [&str; 2] = ["_f32", "_f64"];

/// Whether the NVRTC library can be loaded (cudarc panics on first use when it cannot).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// One kernel file compiled for one architecture.
pub struct Compiled {
    /// PTX text (kept for inspection and the CI check).
    pub ptx: String,
    /// Machine code for the architecture; what the backend loads. Unlike PTX, which the driver
    /// must JIT and which a driver older than NVRTC rejects, a CUBIN also loads on older
    /// drivers of the same major CUDA version.
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings, and ptxas' register report when asked with `-Xptxas -v`).
    pub log: String,
}

/// NVRTC options: the architecture (e.g. `sm_90`), C++17, then `extra`. Precise division and
/// square root, no flush-to-zero: NVRTC's defaults, kept so results match the CPU backend.
fn options(arch: &str, extra: &[&str]) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    o.extend(extra.iter().map(|s| s.to_string()));
    o
}

fn c_text(v: Vec<std::ffi::c_char>) -> String {
    let bytes: Vec<u8> = v
        .into_iter()
        .map(|c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles one kernel file for a real architecture (`sm_80`, `sm_90`, ...) with `extra`
/// NVRTC options. The error carries NVRTC's log.
pub fn compile(file: &KernelFile, arch: &str, extra: &[&str]) -> Result<Compiled> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_present() {
        return Err(anyhow!(
            "libnvrtc not found: install NVRTC (the CUDA toolkit, or `pip install \
             nvidia-cuda-nvrtc-cu12`) and put its lib folder on LD_LIBRARY_PATH"
        ));
    }
    let src = std::ffi::CString::new(file.source()).expect("kernel source without NUL");
    let name = std::ffi::CString::new(file.name).expect("file name without NUL");
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| anyhow!("NVRTC: creating kernels/{}: {e:?}", file.name))?;
    // SAFETY: `prog` is a live program until destroy_program below, called once.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options(arch, extra));
        let log = result::get_program_log(prog)
            .map(c_text)
            .unwrap_or_default();
        let out = match compiled {
            Err(e) => Err(anyhow!(
                "NVRTC failed on kernels/{} for {arch} ({e:?}):\n{log}",
                file.name
            )),
            Ok(()) => (|| {
                let ptx = c_text(result::get_ptx(prog)?);
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
                let mut cubin = vec![0u8; size];
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result()?;
                Ok(Compiled { ptx, cubin, log })
            })()
            .map_err(|e: result::NvrtcError| {
                anyhow!("NVRTC: reading the output for kernels/{}: {e:?}", file.name)
            }),
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

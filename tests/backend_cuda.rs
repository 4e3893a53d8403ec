//! The CUDA backend: the shared backend suite (f64), parity with the CPU backend op by op and on
//! whole training steps (f64 to 1e-12, f32 to 1e-5, relative to each array's largest entry), and
//! bit-identical repeats.
//!
//! The GPU tests are ignored unless asked for (`-- --include-ignored`), so a machine without a
//! GPU counts them as ignored, not passed. Run without a CUDA device (or driver) every GPU test prints "SKIPPED: no CUDA device ..." and
//! returns; DPW_REQUIRE_CUDA=1 turns that skip into a failure (for runs on a GPU machine).
#![cfg(feature = "cuda")]

mod common;
mod suite;

use std::sync::OnceLock;

use dpw::backend::cpu::Cpu;
use dpw::backend::cuda::{Cuda, NO_DRIVER};
use dpw::backend::{Backend, Prefactors, Real};
use dpw::train::predict::loss_and_grad;
use suite::parity::{frame_of, small_cases, step};

/// The device, opened once for all tests (NVRTC compiles the kernels once).
fn cuda() -> Option<&'static Cuda> {
    static CUDA: OnceLock<Result<Cuda, String>> = OnceLock::new();
    match CUDA.get_or_init(|| Cuda::new(0).map_err(|e| format!("{e:#}"))) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("DPW_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("DPW_REQUIRE_CUDA=1 but no CUDA device: {e}");
            }
            // Straight to stderr (eprintln! is captured by the test harness): skips stay visible.
            use std::io::Write;
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: no CUDA device ({e})");
            None
        }
    }
}

/// The device, or return from the calling test after printing why it was skipped.
macro_rules! cuda_or_skip {
    () => {
        match cuda() {
            Some(c) => c,
            None => return,
        }
    };
}

// The shared suite: `&$backend` becomes `&*cuda_or_skip!()`, so each test returns early
// (skipped) without a device.
backend_suite!(
    #[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
    *cuda_or_skip!()
);

/// The suite's weight decay test in float32 (the suite runs in float64).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn reference_weight_decay_steps_f32() {
    suite::reference::weight_decay_steps::<f32, _>(cuda_or_skip!(), "float32");
}

/// The five fittings against DeePMD-kit's numbers in float32.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn reference_fittings_f32() {
    suite::fittings_f32(cuda_or_skip!());
}

#[test]
fn new_never_panics() {
    // Without a driver library this checks the error path; with one, that the device opens or
    // the error says why.
    // SAFETY: only tries to dlopen libcuda.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    match Cuda::new(0) {
        Ok(c) => eprintln!("opened {}", c.device_name()),
        Err(e) => {
            eprintln!("Cuda::new(0): {e:#}");
            if !driver {
                assert_eq!(format!("{e:#}"), NO_DRIVER);
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_ops_f64() {
    suite::parity::ops::<f64, _>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_ops_f32() {
    suite::parity::ops::<f32, _>(cuda_or_skip!(), 1e-5);
}

/// DPA-1's element-wise ops, and the same bits on a second run.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_attn_ops_f64() {
    suite::parity::attn_ops::<f64, _>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_attn_ops_f32() {
    suite::parity::attn_ops::<f32, _>(cuda_or_skip!(), 1e-5);
}

// ---------------------------------------------------------------- whole-step parity

fn water_parity<T: Real>(gpu: &Cuda, tol: f64)
where
    Cuda: Backend<T>,
    Cpu: Backend<T>,
{
    let (model, rf) = (common::model_a(), common::ref_frames());
    let frames: Vec<_> = (0..3).map(|f| rf.frame(f)).collect();
    let mut failures = Vec::new();
    step::<T, _>(
        gpu,
        "water, 3 frames",
        &model,
        &rf.atype,
        &frames,
        tol,
        &mut failures,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn small_parity<T: Real>(gpu: &Cuda, tol: f64)
where
    Cuda: Backend<T>,
    Cpu: Backend<T>,
{
    let mut failures = Vec::new();
    for (name, m, s) in small_cases() {
        let frames = [frame_of(&s)];
        step::<T, _>(gpu, name, &m, &s.atype, &frames, tol, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_water_f64() {
    water_parity::<f64>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_water_f32() {
    water_parity::<f32>(cuda_or_skip!(), 1e-5);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_small_systems_f64() {
    small_parity::<f64>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_small_systems_f32() {
    small_parity::<f32>(cuda_or_skip!(), 1e-5);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_dpa1_f64() {
    suite::parity::dpa1::<f64, _>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_dpa1_f32() {
    suite::parity::dpa1::<f32, _>(cuda_or_skip!(), 1e-5);
}

/// DPA-2's, se_e3_tebd's and DPA-3's blocks, the ones recorded on the tape: through their host
/// bodies, or with DPW_CUDA_TAPE=kernels through kernels/tape.cu (scripts/gpu-check.sh runs
/// both).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_tape_blocks_f64() {
    suite::parity::tape_blocks::<f64, _>(cuda_or_skip!(), 1e-12);
}

/// As wgpu's: float32 through the blocks' long chains of ops holds to 1e-4.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_tape_blocks_f32() {
    suite::parity::tape_blocks::<f32, _>(cuda_or_skip!(), 1e-4);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_mixed_compositions_f64() {
    suite::parity::mixed_compositions::<f64, _>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_mixed_compositions_f32() {
    suite::parity::mixed_compositions::<f32, _>(cuda_or_skip!(), 1e-5);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_mixed_sizes_f64() {
    suite::parity::mixed_sizes::<f64, _>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_mixed_sizes_f32() {
    suite::parity::mixed_sizes::<f32, _>(cuda_or_skip!(), 1e-5);
}

// ---------------------------------------------------------------- determinism

fn bits(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn repeat_identical<T: Real>(gpu: &Cuda)
where
    Cuda: Backend<T>,
{
    let (model, rf) = (common::model_a(), common::ref_frames());
    let frames: Vec<_> = (0..3).map(|f| rf.frame(f)).collect();
    let pref = Prefactors {
        e: 0.02,
        f: 1000.0,
        v: 1.0,
    };
    let run = || loss_and_grad::<T, _>(gpu, &model, &rf.atype, &frames, pref).unwrap();
    let (s1, g1, p1) = run();
    for _ in 0..3 {
        let (s2, g2, p2) = run();
        assert_eq!(bits(&g1), bits(&g2), "gradient differs between runs");
        assert_eq!(
            bits(&p1.force),
            bits(&p2.force),
            "forces differ between runs"
        );
        assert_eq!(
            bits(&p1.virial),
            bits(&p2.virial),
            "virials differ between runs"
        );
        assert_eq!(
            bits(&p1.energy),
            bits(&p2.energy),
            "energies differ between runs"
        );
        assert_eq!(
            bits(&[s1.e2, s1.f2, s1.v2]),
            bits(&[s2.e2, s2.f2, s2.v2]),
            "loss sums differ between runs"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn repeat_bit_identical_f64() {
    repeat_identical::<f64>(cuda_or_skip!());
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn repeat_bit_identical_f32() {
    repeat_identical::<f32>(cuda_or_skip!());
}

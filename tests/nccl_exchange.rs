//! The gradient exchange through NCCL (features `mpi` + `cuda`) on one GPU, as a one-rank world:
//! everything of the multi-GPU path but the other ranks (the path's choice, the library loaded
//! at run time, the communicator, the scale, the grouped reductions on the backend's stream).
//! A sum over one rank is that rank's share-weighted gradient, which must be what the host path
//! computes: bit for bit in float64, to rounding in float32; the loss sums pass unchanged.
//!
//! Ignored unless asked for (`-- --include-ignored`); without a CUDA device it prints
//! "SKIPPED: ..." and returns, and without NCCL the host path answers and the test says
//! SKIPPED; DPW_REQUIRE_CUDA=1 / DPW_REQUIRE_NCCL=1 turn those skips into failures
//! (scripts/gpu-check.sh sets both).
#![cfg(all(feature = "mpi", feature = "cuda"))]

use std::io::Write as _;

use dpw::backend::cuda::Cuda;
use dpw::backend::Device;
use dpw::dist::{DeviceLink, GradExchange, World};

fn skip(what: &str, var: &str, why: &str) {
    assert!(
        std::env::var(var).is_err(),
        "{what}: {var} is set but {why}"
    );
    // Straight to stderr (eprintln! is captured by the test harness): skips stay visible.
    let _ = writeln!(std::io::stderr(), "SKIPPED: {what}: {why}");
}

#[test]
#[ignore = "needs a GPU and NCCL (scripts/gpu-check.sh runs it)"]
fn a_one_rank_nccl_exchange_weights_like_the_host_path() {
    let what = "a_one_rank_nccl_exchange_weights_like_the_host_path";
    let cuda = match Cuda::new(0) {
        Ok(c) => c,
        Err(e) => return skip(what, "DPW_REQUIRE_CUDA", &format!("no CUDA device ({e:#})")),
    };
    let w = World::serial();
    let share = 1.0 / 3.0;
    let g: Vec<f64> = (0..1000).map(|i| (0.37 * i as f64).sin()).collect();

    let mut ex = GradExchange::<f64, _>::new(DeviceLink::cuda(&cuda));
    let mut grad = Device::<f64>::upload(&cuda, &g);
    let mut sums = Device::<f64>::upload(&cuda, &[1.5, 2.5, 3.5]);
    ex.all_reduce(&w, &cuda, &mut grad, &mut sums, share);
    let want: Vec<f64> = g.iter().map(|x| x * share).collect();
    assert_eq!(Device::<f64>::download(&cuda, &grad), want);
    assert_eq!(Device::<f64>::download(&cuda, &sums), [1.5, 2.5, 3.5]);
    if !ex.uses_nccl() {
        return skip(
            what,
            "DPW_REQUIRE_NCCL",
            "NCCL was not used (libnccl.so not loadable)",
        );
    }
    assert!(ex.summary(&w, 1.0).contains("(NCCL)"));

    let g32: Vec<f32> = g.iter().map(|&x| x as f32).collect();
    let mut ex = GradExchange::<f32, _>::new(DeviceLink::cuda(&cuda));
    let mut grad = cuda.upload(&g32);
    let mut sums = cuda.upload(&[1.5f32, 2.5, 3.5]);
    ex.all_reduce(&w, &cuda, &mut grad, &mut sums, share);
    assert!(ex.uses_nccl());
    for (i, (got, x)) in Device::<f32>::download(&cuda, &grad)
        .iter()
        .zip(&g32)
        .enumerate()
    {
        let host = (f64::from(*x) * share) as f32;
        assert!(
            (got - host).abs() <= f32::EPSILON * host.abs(),
            "value {i}: {got} (NCCL) vs {host} (host path)"
        );
    }
    assert_eq!(Device::<f32>::download(&cuda, &sums), [1.5, 2.5, 3.5]);
}

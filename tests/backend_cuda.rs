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
use dpw::backend::{AdamStep, Backend, DenseIo, EnvParams, Prefactors, Real};
use dpw::model::Model;
use dpw::train::batch::{assemble, Frame, HostBatch};
use dpw::train::predict::{loss_and_grad, predict};

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

// ---------------------------------------------------------------- comparison helpers

/// max |a − b| / max |b| (the error relative to the array's largest entry).
fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

fn check(what: &str, gpu: &[f64], cpu: &[f64], tol: f64, failures: &mut Vec<String>) {
    let e = rel_err(gpu, cpu);
    let nonfinite = gpu.iter().any(|x| !x.is_finite());
    eprintln!("  {what}: relative error {e:.2e}");
    if e.is_nan() || e > tol || nonfinite {
        failures.push(format!("{what}: relative error {e:.3e} > {tol:.0e}"));
    }
}

fn f64s<T: Real>(x: Vec<T>) -> Vec<f64> {
    x.into_iter().map(|v| v.f64()).collect()
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

/// Deterministic pseudo-random numbers in [−1, 1).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        2.0 * ((self.0 >> 11) as f64 / (1u64 << 53) as f64) - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
}

// ---------------------------------------------------------------- test systems

/// The small systems of the finite-difference suite (3 models: type_one_side on and off,
/// 2 and 3 types, periodic and not), as (name, model, atom types, frames).
fn small_cases() -> Vec<(&'static str, Model, suite::fd::Sys)> {
    suite::fd::cases()
}

fn frame_of(s: &suite::fd::Sys) -> Frame<'_> {
    Frame {
        coord: &s.coord,
        cell: s.cell.as_deref(),
        energy: s.energy,
        force: &s.force,
        virial: Some(&s.virial),
    }
}

// ---------------------------------------------------------------- op-by-op parity

/// Runs every op of the trait once on inputs made from a real batch (geometry, neighbour lists)
/// and pseudo-random values, and returns every output, named, as f64.
fn op_outputs<T: Real, B: Backend<T>>(
    b: &B,
    m: &Model,
    batch: &HostBatch,
) -> Vec<(String, Vec<f64>)> {
    let d = &batch.dims;
    let layout = m.layout();
    let (ns, nc, na, nf) = (d.nslots(), d.ncentres(), d.nframes * d.natoms, d.nframes);
    let (m1, m2) = (d.m1, d.m2);
    let mut rng = Lcg(12345);
    let up = |v: &[f64]| b.upload(&to_t::<T>(v));
    let mut out: Vec<(String, Vec<f64>)> = Vec::new();
    let mut take = |name: String, buf: &B::Buf| out.push((name, f64s(b.download(buf))));

    let desc = &m.spec.descriptor;
    let env = EnvParams {
        rcut: desc.rcut,
        rcut_smth: desc.rcut_smth,
        protection: desc.env_protection,
    };
    let rij = up(&batch.rij);
    let owner = b.upload_idx(&batch.owner);
    let centre_atom = b.upload_idx(&batch.centre_atom);
    let (davg, dstd) = (up(&m.davg), up(&m.dstd));
    let (mut rhat, mut jac, mut s) = (b.zeros(4 * ns), b.zeros(12 * ns), b.zeros(ns));
    b.env_mat(
        d, env, &rij, &owner, &davg, &dstd, &mut rhat, &mut jac, &mut s,
    );
    take("env_mat rhat".into(), &rhat);
    take("env_mat jac".into(), &jac);
    take("env_mat s".into(), &s);

    // Dense layers: every layer of the first embedding net (over slots) and of the first
    // fitting net (over centres), on all rows and on a range that does not start at 0.
    let params = up(&m.params);
    let nets = [(&layout.embed[0], ns), (&layout.fit[0], nc)];
    for (net, total) in nets {
        let ranges = [0..total, total / 3..total - total / 5];
        for (l, layer) in net.layers.iter().enumerate() {
            for (r, rows) in ranges.iter().enumerate() {
                let tag = format!("{} layer {l} rows {r}", net.name);
                let (nin, nout) = (layer.nin, layer.nout);
                let x = up(&rng.vec(total * nin));
                let (mut h, mut y) = (b.zeros(total * nout), b.zeros(total * nout));
                b.dense_forward(layer, &params, rows.clone(), &x, &mut h, &mut y);
                take(format!("dense_forward h {tag}"), &h);
                take(format!("dense_forward y {tag}"), &y);
                let ybar = up(&rng.vec(total * nout));
                let mut xbar = b.zeros(total * nin);
                b.dense_backward(layer, &params, rows.clone(), &h, &ybar, &mut xbar);
                take(format!("dense_backward xbar {tag}"), &xbar);
                let xdot = up(&rng.vec(total * nin));
                let (mut zdot, mut ydot) = (b.zeros(total * nout), b.zeros(total * nout));
                b.dense_tangent(
                    layer,
                    &params,
                    rows.clone(),
                    &h,
                    &xdot,
                    &mut zdot,
                    &mut ydot,
                );
                take(format!("dense_tangent zdot {tag}"), &zdot);
                take(format!("dense_tangent ydot {tag}"), &ydot);
                let ydotbar = up(&rng.vec(total * nout));
                let scale = up(&rng.vec(total));
                for (with_scale, with_xbar) in [(false, true), (true, false), (true, true)] {
                    let mut grad = up(&rng.vec(layout.len));
                    let (mut xb, mut xdb) = (b.zeros(total * nin), b.zeros(total * nin));
                    b.dense_dual_backward(
                        layer,
                        &params,
                        rows.clone(),
                        DenseIo { x: &x, h: &h },
                        &xdot,
                        &zdot,
                        with_scale.then_some(&scale),
                        &ybar,
                        &ydotbar,
                        &mut grad,
                        with_xbar.then_some((&mut xb, &mut xdb)),
                    );
                    let t = format!("{tag} scale {with_scale} xbar {with_xbar}");
                    take(format!("dense_dual_backward grad {t}"), &grad);
                    if with_xbar {
                        take(format!("dense_dual_backward xbar {t}"), &xb);
                        take(format!("dense_dual_backward xdotbar {t}"), &xdb);
                    }
                }
            }
        }
    }

    // The contraction and its derivatives.
    let (g, gp) = (up(&rng.vec(ns * m1)), up(&rng.vec(ns * m1)));
    let (mut a, mut dsc) = (b.zeros(4 * m1 * nc), b.zeros(m1 * m2 * nc));
    b.contract_forward(d, &g, &rhat, &mut a, &mut dsc);
    take("contract_forward a".into(), &a);
    take("contract_forward desc".into(), &dsc);
    let dbar = up(&rng.vec(m1 * m2 * nc));
    let mut abar = b.zeros(4 * m1 * nc);
    b.contract_backward(d, &a, &dbar, &mut abar);
    take("contract_backward abar".into(), &abar);
    let mut q = b.zeros(3 * ns);
    b.slot_backward(d, &abar, &g, &gp, &rhat, &jac, &mut q);
    take("slot_backward q".into(), &q);
    let rdot = up(&rng.vec(4 * ns));
    let (mut adot, mut ddot) = (b.zeros(4 * m1 * nc), b.zeros(m1 * m2 * nc));
    b.contract_tangent(d, &g, &gp, &rhat, &rdot, &a, &mut adot, &mut ddot);
    take("contract_tangent adot".into(), &adot);
    take("contract_tangent ddot".into(), &ddot);
    let ddotbar = up(&rng.vec(m1 * m2 * nc));
    let (mut gbar, mut gdotbar) = (b.zeros(m1 * ns), b.zeros(m1 * ns));
    b.contract_dual(
        d,
        &a,
        &adot,
        &dbar,
        &ddotbar,
        &rhat,
        &rdot,
        &mut gbar,
        &mut gdotbar,
    );
    take("contract_dual gbar".into(), &gbar);
    take("contract_dual gdotbar".into(), &gdotbar);

    // Energy, forces, virial, loss, the virtual tangent.
    let e_fit = up(&rng.vec(nc));
    let bias = up(&m.bias);
    let (mut e_atom, mut energy) = (b.zeros(nc), b.zeros(nf));
    b.energy(d, &e_fit, &bias, &mut e_atom, &mut energy);
    take("energy e_atom".into(), &e_atom);
    take("energy energy".into(), &energy);
    let (mut force, mut virial) = (b.zeros(3 * na), b.zeros(9 * nf));
    b.force_virial(d, &q, &rij, &owner, &centre_atom, &mut force, &mut virial);
    take("force_virial force".into(), &force);
    take("force_virial virial".into(), &virial);
    let labels = [up(&rng.vec(nf)), up(&rng.vec(3 * na)), up(&rng.vec(9 * nf))];
    let (mut ebar, mut fres, mut vres) = (b.zeros(nc), b.zeros(3 * na), b.zeros(9 * nf));
    let pref = Prefactors {
        e: 0.7,
        f: 3.0,
        v: 0.9,
    };
    let mut sums = b.zeros(3);
    b.loss(
        d,
        pref,
        [&energy, &force, &virial],
        [&labels[0], &labels[1], &labels[2]],
        &mut ebar,
        &mut fres,
        &mut vres,
        &mut sums,
    );
    let mut take = |name: String, buf: &B::Buf| out.push((name, f64s(b.download(buf))));
    take("loss sums".into(), &sums);
    take("loss ebar".into(), &ebar);
    take("loss fres".into(), &fres);
    take("loss vres".into(), &vres);
    let (mut rd, mut sd) = (b.zeros(4 * ns), b.zeros(ns));
    b.virtual_tangent(
        d,
        &fres,
        &vres,
        &jac,
        &rij,
        &owner,
        &centre_atom,
        &mut rd,
        &mut sd,
    );
    take("virtual_tangent rdot".into(), &rd);
    take("virtual_tangent sdot".into(), &sd);

    // Adam (v must be non-negative) and fill.
    let n = layout.len;
    let mut p = up(&rng.vec(n));
    let grad = up(&rng.vec(n));
    let mut mm = up(&rng.vec(n));
    let mut vv = up(&rng.vec(n).iter().map(|x| x * x).collect::<Vec<_>>());
    let step = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        t: 3,
    };
    b.adam(step, &mut p, &grad, &mut mm, &mut vv);
    take("adam params".into(), &p);
    take("adam m".into(), &mm);
    take("adam v".into(), &vv);
    let mut f = b.zeros(1000);
    b.fill(&mut f, T::of(0.25));
    take("fill".into(), &f);
    out
}

fn ops_parity<T: Real>(gpu: &Cuda, tol: f64)
where
    Cuda: Backend<T>,
{
    let mut failures = Vec::new();
    for (name, m, s) in small_cases() {
        // Two frames, so per-frame sums and centre ↔ frame maps are exercised.
        let frames = [frame_of(&s), frame_of(&s)];
        let batch = assemble(&m.spec, &s.atype, &frames).unwrap();
        eprintln!("{name} ({}):", T::NAME);
        let cpu = op_outputs::<T, _>(&Cpu::default(), &m, &batch);
        let dev = op_outputs::<T, _>(gpu, &m, &batch);
        for ((what, c), (_, g)) in cpu.iter().zip(&dev) {
            check(&format!("{name}: {what}"), g, c, tol, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_ops_f64() {
    ops_parity::<f64>(cuda_or_skip!(), 1e-12);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda --test backend_cuda -- --include-ignored"]
fn parity_ops_f32() {
    ops_parity::<f32>(cuda_or_skip!(), 1e-5);
}

// ---------------------------------------------------------------- whole-step parity

/// Predictions, loss sums and the full loss gradient on CPU and GPU.
fn step_parity<T: Real>(
    gpu: &Cuda,
    what: &str,
    m: &Model,
    atype: &[usize],
    frames: &[Frame],
    tol: f64,
    failures: &mut Vec<String>,
) where
    Cuda: Backend<T>,
{
    let pref = Prefactors {
        e: 0.02,
        f: 1000.0,
        v: 1.0,
    };
    let (cs, cg, cp) = loss_and_grad::<T, _>(&Cpu::default(), m, atype, frames, pref).unwrap();
    let (gs, gg, gp) = loss_and_grad::<T, _>(gpu, m, atype, frames, pref).unwrap();
    let w = format!("{what} ({})", T::NAME);
    check(
        &format!("{w} energy"),
        &gp.energy,
        &cp.energy,
        tol,
        failures,
    );
    check(
        &format!("{w} atom energy"),
        &gp.atom_energy,
        &cp.atom_energy,
        tol,
        failures,
    );
    check(&format!("{w} force"), &gp.force, &cp.force, tol, failures);
    check(
        &format!("{w} virial"),
        &gp.virial,
        &cp.virial,
        tol,
        failures,
    );
    check(
        &format!("{w} loss sums"),
        &[gs.e2, gs.f2, gs.v2],
        &[cs.e2, cs.f2, cs.v2],
        tol,
        failures,
    );
    check(&format!("{w} gradient"), &gg, &cg, tol, failures);
    let p = predict::<T, _>(gpu, m, atype, frames).unwrap();
    if p != gp {
        failures.push(format!(
            "{w}: predict and loss_and_grad disagree on the GPU"
        ));
    }
}

fn water_parity<T: Real>(gpu: &Cuda, tol: f64)
where
    Cuda: Backend<T>,
{
    let (Some(model), Some(rf)) = (common::model_a(), common::ref_frames()) else {
        eprintln!("SKIPPED: DeePMD-kit's reference (shared/) is absent");
        return;
    };
    let frames: Vec<_> = (0..3).map(|f| rf.frame(f)).collect();
    let mut failures = Vec::new();
    step_parity::<T>(
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
{
    let mut failures = Vec::new();
    for (name, m, s) in small_cases() {
        let frames = [frame_of(&s)];
        step_parity::<T>(gpu, name, &m, &s.atype, &frames, tol, &mut failures);
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

// ---------------------------------------------------------------- determinism

fn bits(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn repeat_identical<T: Real>(gpu: &Cuda)
where
    Cuda: Backend<T>,
{
    let (Some(model), Some(rf)) = (common::model_a(), common::ref_frames()) else {
        eprintln!("SKIPPED: DeePMD-kit's reference (shared/) is absent");
        return;
    };
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

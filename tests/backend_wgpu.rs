//! The backend suite on the wgpu backend in float64, plus parity with the CPU backend (f64 and
//! f32), run-to-run repeatability, and the f64 tanh/sqrt of the shaders.
//!
//! Without a GPU adapter (or, for the f64 tests, without SHADER_F64) every test prints that it
//! was skipped and passes, unless DPW_REQUIRE_WGPU=1, which makes that a failure. On Linux CI,
//! lavapipe (Debian: mesa-vulkan-drivers, libvulkan1) is enough: it is a Vulkan CPU adapter with
//! float64.
#![cfg(feature = "wgpu")]

mod common;
mod suite;

use dpw::backend::counts::Counts;
use dpw::backend::cpu::Cpu;
use dpw::backend::wgpu::{DenseKernels, GpuReal, Passes, PowerPreference, Wgpu};
use dpw::backend::{AdamStep, Backend, DenseOps, Device, LossSums, Prefactors, TrainOps};
use dpw::model::{Layer, Skip};
use dpw::train::batch::assemble;
use dpw::train::predict::{loss_and_grad, Prediction};
use dpw::train::step::DeviceModel;

use common::*;

/// The test binary's device, or None after printing why the test is skipped.
fn device(test: &str) -> Option<&'static Wgpu> {
    wgpu_device().map_err(|why| no_wgpu(test, why)).ok()
}

/// The backend for a test in T, or None after printing why the test is skipped.
fn wgpu_for<T: GpuReal>(test: &str) -> Option<&'static Wgpu> {
    let w = device(test)?;
    if let Err(e) = w.require::<T>() {
        no_wgpu(test, &e.to_string());
        return None;
    }
    Some(w)
}

/// The running test's name (libtest names each test's thread after it).
fn this_test() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("a backend suite test")
        .to_string()
}

macro_rules! wgpu_f64_or_skip {
    () => {
        *match wgpu_for::<f64>(&this_test()) {
            Some(w) => w,
            None => return,
        }
    };
}

backend_suite!(wgpu_f64_or_skip!());

/// max |a − b| / max |b|: a deviation relative to the size of the quantity.
fn rel_dev(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    max_abs_diff(a, b) / scale.max(1e-300)
}

struct Case {
    model: dpw::model::Model,
    rf: RefFrames,
}

fn case() -> Case {
    Case {
        model: model_a(),
        rf: ref_frames(),
    }
}

/// Prefactors that exercise all three loss terms (the virial labels of these frames are absent,
/// so the virial residual is the prediction itself).
const PREF: Prefactors = Prefactors {
    e: 0.5,
    f: 1000.0,
    v: 0.2,
};

fn run<T: GpuReal, B: Backend<T>>(
    b: &B,
    c: &Case,
    nframes: usize,
) -> (LossSums, Vec<f64>, Prediction) {
    let frames: Vec<_> = (0..nframes).map(|f| c.rf.frame(f)).collect();
    loss_and_grad::<T, B>(b, &c.model, &c.rf.atype, &frames, PREF).unwrap()
}

/// Largest relative deviation of every quantity of `got` from `want`.
fn deviations(
    got: &(LossSums, Vec<f64>, Prediction),
    want: &(LossSums, Vec<f64>, Prediction),
) -> [(&'static str, f64); 6] {
    let (gs, gg, gp) = got;
    let (ws, wg, wp) = want;
    let sums = [gs.e2, gs.f2, gs.v2];
    let wsums = [ws.e2, ws.f2, ws.v2];
    [
        ("energy", rel_dev(&gp.energy, &wp.energy)),
        ("force", rel_dev(&gp.force, &wp.force)),
        ("virial", rel_dev(&gp.virial, &wp.virial)),
        ("atom energy", rel_dev(&gp.atom_energy, &wp.atom_energy)),
        (
            "loss sums",
            (0..3)
                .map(|i| (sums[i] - wsums[i]).abs() / wsums[i].abs().max(1e-300))
                .fold(0.0, f64::max),
        ),
        ("gradient", rel_dev(gg, wg)),
    ]
}

fn parity<T: GpuReal>(test: &str, tol: f64)
where
    Cpu: Backend<T>,
    Wgpu: Backend<T>,
{
    if let Some(w) = wgpu_for::<T>(test) {
        parity_on::<T>(w, tol);
    }
}

fn parity_on<T: GpuReal>(w: &Wgpu, tol: f64)
where
    Cpu: Backend<T>,
    Wgpu: Backend<T>,
{
    let c = case();
    for nframes in [1, 3] {
        let cpu = run::<T, Cpu>(&Cpu::default(), &c, nframes);
        let gpu = run::<T, Wgpu>(w, &c, nframes);
        let dev = deviations(&gpu, &cpu);
        let line: Vec<String> = dev.iter().map(|(n, d)| format!("{n} {d:.2e}")).collect();
        eprintln!(
            "{} {nframes} frame(s), wgpu vs cpu, max relative deviation: {}",
            T::NAME,
            line.join(", ")
        );
        for (name, d) in dev {
            assert!(
                d <= tol,
                "{}: {name} deviates by {d:.3e} > {tol:.0e}",
                T::NAME
            );
        }
    }
}

#[test]
fn parity_with_cpu_f64() {
    parity::<f64>("parity_with_cpu_f64", 1e-12);
}

/// The suite's weight decay test in float32 (the suite runs in float64).
#[test]
fn reference_weight_decay_steps_f32() {
    let Some(w) = wgpu_for::<f32>("reference_weight_decay_steps_f32") else {
        return;
    };
    suite::reference::weight_decay_steps::<f32, _>(w, "float32");
}

/// The five fittings against DeePMD-kit's numbers in float32.
#[test]
fn reference_fittings_f32() {
    if let Some(w) = wgpu_for::<f32>("reference_fittings_f32") {
        suite::fittings_f32(w);
    }
}

#[test]
fn parity_with_cpu_f32() {
    parity::<f32>("parity_with_cpu_f32", 1e-5);
}

#[test]
fn parity_ops_f64() {
    if let Some(w) = wgpu_for::<f64>("parity_ops_f64") {
        suite::parity::ops::<f64, _>(w, 1e-12);
    }
}

#[test]
fn parity_ops_f32() {
    if let Some(w) = wgpu_for::<f32>("parity_ops_f32") {
        suite::parity::ops::<f32, _>(w, 1e-5);
    }
}

/// A second device on the same adapter running the variants the first does not: the other kind
/// of dense kernels (tiled on lavapipe, flat on a GPU) and the other grouping of dispatches into
/// compute passes, so every machine checks both of each.
fn other_variant<T: GpuReal>(test: &str) -> Option<&'static Wgpu> {
    static W: std::sync::OnceLock<Result<Wgpu, String>> = std::sync::OnceLock::new();
    wgpu_for::<T>(test)?;
    let second = W.get_or_init(|| {
        let mut w = Wgpu::new(PowerPreference::HighPerformance)
            .map_err(|e| format!("a second device on the adapter: {e:#}"))?;
        let dense = match w.dense_kernels() {
            DenseKernels::Tiled => DenseKernels::Flat,
            DenseKernels::Flat => DenseKernels::Tiled,
        };
        let passes = match w.passes() {
            Passes::Shared => Passes::Each,
            Passes::Each => Passes::Shared,
        };
        w.set_dense_kernels(dense);
        w.set_passes(passes);
        // A few centres per launch of the attention block, where the first device takes all.
        w.set_attn_scratch(1 << 20);
        eprintln!(
            "second device: dense kernels {}, passes {}, attention block in 1 MiB launches",
            dense.name(),
            passes.name()
        );
        Ok(w)
    });
    second.as_ref().map_err(|why| no_wgpu(test, why)).ok()
}

#[test]
fn parity_ops_other_variant_f64() {
    if let Some(w) = other_variant::<f64>("parity_ops_other_variant_f64") {
        suite::parity::ops::<f64, _>(w, 1e-12);
    }
}

#[test]
fn parity_ops_other_variant_f32() {
    if let Some(w) = other_variant::<f32>("parity_ops_other_variant_f32") {
        suite::parity::ops::<f32, _>(w, 1e-5);
    }
}

/// The other variant's kernels and passes make the same sums as the first device's, in the same
/// order: the tiled dense kernels fold dual_bsum's b̄ and īdt into dual_wgrad_tiled exactly.
#[test]
fn other_variant_same_bits_f64() {
    let test = "other_variant_same_bits_f64";
    if let (Some(w), Some(other)) = (wgpu_for::<f64>(test), other_variant::<f64>(test)) {
        suite::parity::same_bits::<f64, _>(w, other);
    }
}

#[test]
fn other_variant_same_bits_f32() {
    let test = "other_variant_same_bits_f32";
    if let (Some(w), Some(other)) = (wgpu_for::<f32>(test), other_variant::<f32>(test)) {
        suite::parity::same_bits::<f32, _>(w, other);
    }
}

#[test]
fn parity_with_cpu_other_variant_f64() {
    if let Some(w) = other_variant::<f64>("parity_with_cpu_other_variant_f64") {
        parity_on::<f64>(w, 1e-12);
    }
}

#[test]
fn parity_attn_ops_f64() {
    on_wgpu::<f64>(
        "parity_attn_ops_f64",
        1e-12,
        suite::parity::attn_ops::<f64, _>,
    );
}

#[test]
fn parity_attn_ops_f32() {
    on_wgpu::<f32>(
        "parity_attn_ops_f32",
        1e-5,
        suite::parity::attn_ops::<f32, _>,
    );
}

#[test]
fn parity_tape_blocks_f64() {
    on_wgpu::<f64>(
        "parity_tape_blocks_f64",
        1e-12,
        suite::parity::tape_blocks::<f64, _>,
    );
}

#[test]
fn parity_tape_blocks_f32() {
    on_wgpu::<f32>(
        "parity_tape_blocks_f32",
        1e-4,
        suite::parity::tape_blocks::<f32, _>,
    );
}

#[test]
fn parity_attn_ops_other_variant_f64() {
    if let Some(w) = other_variant::<f64>("parity_attn_ops_other_variant_f64") {
        suite::parity::attn_ops::<f64, _>(w, 1e-12);
    }
}

#[test]
fn parity_attn_ops_other_variant_f32() {
    if let Some(w) = other_variant::<f32>("parity_attn_ops_other_variant_f32") {
        suite::parity::attn_ops::<f32, _>(w, 1e-5);
    }
}

fn repeatable<T: GpuReal>(test: &str)
where
    Wgpu: Backend<T>,
{
    let Some(w) = wgpu_for::<T>(test) else { return };
    let c = case();
    let a = run::<T, Wgpu>(w, &c, 2);
    let b = run::<T, Wgpu>(w, &c, 2);
    let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.1), bits(&b.1), "gradient differs between runs");
    for (x, y) in [
        (&a.2.energy, &b.2.energy),
        (&a.2.force, &b.2.force),
        (&a.2.virial, &b.2.virial),
    ] {
        assert_eq!(bits(x), bits(y), "predictions differ between runs");
    }
    assert_eq!(a.0, b.0, "loss sums differ between runs");
}

/// Ops of several threads interleaved on one device: each thread's batch size gives its ops
/// other constants (the loss coefficients) and force lists, which must not leak into another
/// thread's dispatches. Every result equals the one computed alone, bit for bit.
#[test]
fn ops_from_threads_on_one_device() {
    let Some(w) = wgpu_for::<f64>("ops_from_threads_on_one_device") else {
        return;
    };
    let c = case();
    // Two threads of two runs each interleave their launches and read-backs (three of three
    // took 70 s on lavapipe).
    let sizes = [1, 3];
    let alone: Vec<_> = sizes.iter().map(|&n| run::<f64, Wgpu>(w, &c, n)).collect();
    std::thread::scope(|s| {
        for (&n, want) in sizes.iter().zip(&alone) {
            let c = &c;
            s.spawn(move || {
                for _ in 0..2 {
                    let got = run::<f64, Wgpu>(w, c, n);
                    assert_eq!(got.1, want.1, "{n} frames: the gradient differs");
                    assert_eq!(got.0, want.0, "{n} frames: the loss sums differ");
                    assert_eq!(got.2, want.2, "{n} frames: the predictions differ");
                }
            });
        }
    });
}

#[test]
fn repeatable_bit_for_bit_f64() {
    repeatable::<f64>("repeatable_bit_for_bit_f64");
}

#[test]
fn repeatable_bit_for_bit_f32() {
    repeatable::<f32>("repeatable_bit_for_bit_f32");
}

/// A 1→n tanh layer with unit weights turns the shader's tanh into an observable: compare it with
/// the host's over a wide range of arguments.
#[test]
fn f64_tanh_is_accurate() {
    let Some(w) = wgpu_for::<f64>("f64_tanh_is_accurate") else {
        return;
    };
    let xs: Vec<f64> = (-4000..=4000)
        .map(|i| i as f64 * 0.0075)
        .chain([1e-300, -1e-20, 3e-9, 19.5, -25.0, 700.0])
        .collect();
    let layer = Layer {
        nin: 1,
        nout: 1,
        act: dpw::model::Activation::Tanh,
        skip: Skip::None,
        w: 0,
        b: 1,
        idt: None,
    };
    let params = Device::<f64>::upload(w, &[1.0, 0.0]);
    let x = Device::<f64>::upload(w, &xs);
    let (mut h, mut y) = (
        Device::<f64>::zeros(w, xs.len()),
        Device::<f64>::zeros(w, xs.len()),
    );
    DenseOps::<f64>::dense_forward(w, &layer, &params, 0..xs.len(), &x, &mut h, &mut y);
    let got = Device::<f64>::download(w, &h);
    let worst = xs
        .iter()
        .zip(&got)
        .map(|(x, g)| (g - x.tanh()).abs() / x.tanh().abs().max(1e-300))
        .fold(0.0, f64::max);
    eprintln!("f64 tanh in WGSL: max relative error {worst:.2e}");
    assert!(worst < 1e-15, "tanh off by {worst:e}");
}

/// silu and silut (threshold 0.3, no f32 number) through a 1→1 layer with unit weights: the
/// layer keeps x itself and puts out φ(x), against the host's over a wide range.
fn silu_family_is_accurate<T: GpuReal>(test: &str, tol: f64)
where
    Wgpu: Backend<T>,
{
    use dpw::model::Activation;
    let Some(w) = wgpu_for::<T>(test) else {
        return;
    };
    let xs: Vec<f64> = (-3000..=3000)
        .map(|i| i as f64 * 0.01)
        .chain([0.3, 0.29999999, 1e-30, -60.0, 75.0, -100.0, 100.0])
        .collect();
    for act in [Activation::Silu, Activation::Silut(0.3)] {
        let layer = Layer {
            nin: 1,
            nout: 1,
            act,
            skip: Skip::None,
            w: 0,
            b: 1,
            idt: None,
        };
        let params = Device::<T>::upload(w, &[T::of(1.0), T::of(0.0)]);
        let x = Device::<T>::upload(w, &xs.iter().map(|&v| T::of(v)).collect::<Vec<_>>());
        let (mut h, mut y) = (
            Device::<T>::zeros(w, xs.len()),
            Device::<T>::zeros(w, xs.len()),
        );
        DenseOps::<T>::dense_forward(w, &layer, &params, 0..xs.len(), &x, &mut h, &mut y);
        let (kept, got) = (Device::<T>::download(w, &h), Device::<T>::download(w, &y));
        let mut worst = 0.0f64;
        for ((x, k), g) in xs.iter().zip(&kept).zip(&got) {
            let x = T::of(*x).f64();
            assert_eq!(k.f64(), x, "{act:?} keeps z");
            let want = act.eval3(x).0;
            worst = worst.max((g.f64() - want).abs() / want.abs().max(1e-20));
        }
        eprintln!("{act:?} in WGSL: max relative error {worst:.2e}");
        assert!(worst < tol, "{act:?} off by {worst:e}");
    }
}

#[test]
fn f64_silu_and_silut_are_accurate() {
    silu_family_is_accurate::<f64>("f64_silu_and_silut_are_accurate", 1e-14);
}

#[test]
fn f32_silu_and_silut_are_accurate() {
    // Vulkan lets f32 exp be off by 3 + 2|x| ulp.
    silu_family_is_accurate::<f32>("f32_silu_and_silut_are_accurate", 1e-5);
}

/// Adam's denominator needs sqrt; the shader builds it from an f32 seed. Against the CPU Adam
/// over gradients from 1e-150 to 1e150, so that v = 0.2 g² spans f64's normal range: Vulkan
/// lets a driver flush f64 subnormals to zero (NVIDIA's does), which would change v itself.
#[test]
fn f64_sqrt_in_adam_is_accurate() {
    let Some(w) = wgpu_for::<f64>("f64_sqrt_in_adam_is_accurate") else {
        return;
    };
    let g: Vec<f64> = (-300..=300)
        .map(|i| (if i % 2 == 0 { 1.0 } else { -1.7 }) * 10f64.powf(i as f64 * 0.5))
        .collect();
    let step = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-300,
        t: 3,
        tail: None,
        decay: Default::default(),
    };
    let p0: Vec<f64> = (0..g.len()).map(|i| 1.0 + i as f64).collect();
    let m0: Vec<f64> = g.iter().map(|x| 0.3 * x).collect();
    let v0: Vec<f64> = g.iter().map(|x| 0.2 * x * x).collect();
    let (mut pc, mut mc, mut vc) = (p0.clone(), m0.clone(), v0.clone());
    TrainOps::<f64>::adam(&Cpu::default(), step, &mut pc, &g, &mut mc, &mut vc);
    let (mut p, mut m, mut v) = (w.upload(&p0), w.upload(&m0), w.upload(&v0));
    let gb = w.upload(&g);
    TrainOps::<f64>::adam(w, step, &mut p, &gb, &mut m, &mut v);
    let dp: Vec<f64> = Device::<f64>::download(w, &p)
        .iter()
        .zip(&p0)
        .map(|(a, b)| a - b)
        .collect();
    let dpc: Vec<f64> = pc.iter().zip(&p0).map(|(a, b)| a - b).collect();
    let (at, worst) = dp
        .iter()
        .zip(&dpc)
        .map(|(a, b)| (a - b).abs() / b.abs())
        .enumerate()
        .fold((0, 0.0), |m, (i, e)| if e > m.1 { (i, e) } else { m });
    eprintln!(
        "f64 Adam step vs cpu: max relative deviation {worst:.2e} (g {:e}: step {:e} vs {:e})",
        g[at], dp[at], dpc[at]
    );
    // Parameter updates are differences of O(1) numbers: a few ulp of p.
    assert!(worst < 1e-9, "Adam off by {worst:e}");
    // A driver may fuse β·m + (1 − β)·g into one FMA (NVIDIA's Vulkan compiler does): an ulp.
    assert!(rel_dev(&Device::<f64>::download(w, &m), &mc) < 1e-15);
    assert!(rel_dev(&Device::<f64>::download(w, &v), &vc) < 1e-15);
}

/// The fill op with a value other than zero, and zeros of odd sizes.
#[test]
fn fill_and_zeros() {
    let Some(w) = wgpu_for::<f32>("fill_and_zeros") else {
        return;
    };
    let mut b = Device::<f32>::zeros(w, 7);
    assert_eq!(Device::<f32>::download(w, &b), vec![0.0; 7]);
    w.fill(&mut b, 2.5f32);
    w.synchronize();
    assert_eq!(Device::<f32>::download(w, &b), vec![2.5; 7]);
    w.fill(&mut b, 0.0f32);
    assert_eq!(Device::<f32>::download(w, &b), vec![0.0; 7]);
    let e = Device::<f32>::zeros(w, 0);
    assert!(Device::<f32>::download(w, &e).is_empty());
}

/// The awaited read-back the web page uses gives what the blocking one gives, after ops that
/// are still only recorded.
#[test]
fn awaited_download_matches_blocking() {
    let Some(w) = wgpu_for::<f32>("awaited_download_matches_blocking") else {
        return;
    };
    let mut b = Device::<f32>::upload(w, &[1.0, -2.0, 3.5]);
    w.fill(&mut b, 4.25f32);
    let got = pollster::block_on(w.download_async(&b)).unwrap();
    assert_eq!(got, vec![4.25; 3]);
    assert_eq!(got, Device::<f32>::download(w, &b));
    let e = Device::<f32>::zeros(w, 0);
    assert!(pollster::block_on(w.download_async(&e)).unwrap().is_empty());
}

#[test]
fn f64_without_shader_f64_is_a_clear_error() {
    let Some(w) = device(&this_test()) else {
        return;
    };
    assert!(w.require::<f32>().is_ok());
    match w.require::<f64>() {
        Ok(()) => assert!(w.supports_f64()),
        Err(e) => assert!(e.to_string().contains("float32"), "{e}"),
    }
}

/// Another shape of model than model_A: one embedding net per (centre, neighbour) type pair,
/// timesteps in the embedding net, M2 = 3, narrow fitting net, smaller cutoff (so padded slots),
/// env protection, and two frames.
fn other_case() -> Case {
    let rf = ref_frames();
    let base = model_a();
    let mut spec = base.spec.clone();
    spec.descriptor.rcut = 4.5;
    spec.descriptor.rcut_smth = 1.0;
    spec.descriptor.sel = vec![20, 40];
    spec.descriptor.neuron = vec![4, 8, 16];
    spec.descriptor.axis_neuron = 3;
    spec.descriptor.resnet_dt = true;
    spec.descriptor.type_one_side = false;
    spec.descriptor.env_protection = 0.01;
    spec.fitting.neuron = vec![20, 20];
    let mut model = dpw::model::Model::new(spec, 7);
    model.davg = base.davg.clone();
    model.dstd = base.dstd.clone();
    model.bias = vec![-93.5, -187.25];
    Case { model, rf }
}

fn parity_other<T: GpuReal>(test: &str, tol: f64)
where
    Cpu: Backend<T>,
    Wgpu: Backend<T>,
{
    let Some(w) = wgpu_for::<T>(test) else { return };
    let c = other_case();
    let cpu = run::<T, Cpu>(&Cpu::default(), &c, 2);
    let gpu = run::<T, Wgpu>(w, &c, 2);
    let dev = deviations(&gpu, &cpu);
    let line: Vec<String> = dev.iter().map(|(n, d)| format!("{n} {d:.2e}")).collect();
    eprintln!(
        "{} other model, 2 frames, wgpu vs cpu: {}",
        T::NAME,
        line.join(", ")
    );
    for (name, d) in dev {
        assert!(
            d <= tol,
            "{}: {name} deviates by {d:.3e} > {tol:.0e}",
            T::NAME
        );
    }
}

#[test]
fn parity_other_model_f64() {
    parity_other::<f64>("parity_other_model_f64", 1e-12);
}

#[test]
fn parity_other_model_f32() {
    parity_other::<f32>("parity_other_model_f32", 1e-5);
}

/// The exact sum of f32 values rounded once to f32 (fixed point with LSB 2^-64 in an i128).
fn exact_f32_sum(x: &[f32]) -> f32 {
    let s: i128 = x.iter().map(|&v| (v as f64 * 2f64.powi(64)) as i128).sum();
    (s as f32) * 2f32.powi(-64)
}

/// The float32 per-frame energy is the exact sum rounded once (what the CPU's f64 accumulation
/// gives unless f64 itself rounds): checked on sums with heavy cancellation and wide magnitudes.
#[test]
fn f32_frame_energy_is_the_rounded_exact_sum() {
    let Some(w) = wgpu_for::<f32>("f32_frame_energy_is_the_rounded_exact_sum") else {
        return;
    };
    let d = dpw::backend::Dims::new(3, &[50, 77], &[1, 1], 1, 1);
    let nc = d.ncentres();
    let mut x = 0x2545f4914f6cdd1du64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let cases: Vec<Vec<f32>> = vec![
        (0..nc).map(|_| (-150.0 - 40.0 * rnd()) as f32).collect(),
        (0..nc)
            .map(|_| ((rnd() - 0.5) * 10f64.powf(12.0 * rnd() - 6.0)) as f32)
            .collect(),
        (0..nc)
            .map(|i| {
                if i % 2 == 0 {
                    1.0e6 + rnd() as f32
                } else {
                    -1.0e6
                }
            })
            .collect(),
        (0..nc)
            .map(|i| [3.0e7f32, -3.0e7, 1e-3, -2.5e-9][i % 4])
            .collect(),
        (0..nc)
            .map(|i| if i % 3 == 0 { -1e-12 } else { 5e-13 })
            .collect(),
        vec![0.0; nc],
    ];
    for bias in [[0.0f32, 0.0], [-93.0625, 187.1]] {
        for (k, e_fit) in cases.iter().enumerate() {
            let (mut ea, mut en) = (vec![0.0f32; nc], vec![0.0f32; 3]);
            TrainOps::<f32>::energy(&Cpu::default(), &d, e_fit, &bias.to_vec(), &mut ea, &mut en);
            let (ef, bb) = (w.upload(e_fit), w.upload(&bias));
            let (mut ga, mut ge) = (Device::<f32>::zeros(w, nc), Device::<f32>::zeros(w, 3));
            TrainOps::<f32>::energy(w, &d, &ef, &bb, &mut ga, &mut ge);
            assert_eq!(Device::<f32>::download(w, &ga), ea);
            let exact: Vec<f32> = (0..3)
                .map(|f| {
                    let terms: Vec<f32> = (0..nc)
                        .filter(|&c| d.centre_frame(c) == f)
                        .map(|c| ea[c])
                        .collect();
                    exact_f32_sum(&terms)
                })
                .collect();
            let got = Device::<f32>::download(w, &ge);
            assert_eq!(
                got, exact,
                "case {k}: per-frame energies (cpu's f64 sum gives {en:?})"
            );
        }
    }
}

/// Launches too large for one dispatch dimension (65535 workgroups) spill over y (1-D kernels)
/// and z (tiled kernels).
#[test]
fn large_launches_spill_over() {
    let Some(w) = wgpu_for::<f32>("large_launches_spill_over") else {
        return;
    };
    let n = 65535 * 64 + 1000;
    let mut b = Device::<f32>::zeros(w, n);
    w.fill(&mut b, 1.5f32);
    let got = Device::<f32>::download(w, &b);
    assert!(got.iter().all(|&v| v == 1.5), "fill missed elements");
    let rows = 65535 * 16 + 100;
    let layer = Layer {
        nin: 1,
        nout: 1,
        act: dpw::model::Activation::Linear,
        skip: Skip::None,
        w: 0,
        b: 1,
        idt: None,
    };
    let xs: Vec<f32> = (0..rows).map(|i| (i % 1000) as f32).collect();
    let params = w.upload(&[2.0f32, 0.5]);
    let x = w.upload(&xs);
    let (mut h, mut y) = (Device::<f32>::zeros(w, rows), Device::<f32>::zeros(w, rows));
    DenseOps::<f32>::dense_forward(w, &layer, &params, 0..rows, &x, &mut h, &mut y);
    let got = Device::<f32>::download(w, &y);
    let bad = (0..rows).find(|&i| got[i] != 2.0 * xs[i] + 0.5);
    assert_eq!(bad, None, "dense forward missed rows");
}

/// A device without SHADER_F64 (as on an adapter that lacks it, e.g. Mesa's GL driver): float64
/// is refused with advice to use float32, and float32 works.
#[test]
fn adapter_without_f64_refuses_float64() {
    let Some(shared) = wgpu_for::<f32>(&this_test()) else {
        return;
    };
    let adapter = shared.adapter().clone();
    let no_f64 = wgpu::Features::all().difference(wgpu::Features::SHADER_F64);
    let w = pollster::block_on(Wgpu::on_adapter_with(adapter, no_f64)).unwrap();
    assert!(!w.supports_f64());
    let e = w.require::<f64>().unwrap_err().to_string();
    assert!(e.contains("\"precision\": \"float32\""), "{e}");
    let b = w.upload(&[1.0f32, 2.0]);
    assert_eq!(Device::<f32>::download(&w, &b), vec![1.0, 2.0]);
}

/// A training step after the first two creates no buffer and no bind group and reads nothing back;
/// it uploads only the batch and the step's few constants (learning rate, loss prefactors).
#[test]
fn steps_after_the_first_create_and_read_nothing() {
    if wgpu_for::<f32>(&this_test()).is_none() {
        return;
    }
    let model = suite::fd::small_model(2, false, vec![6, 10], 5);
    let sys = suite::fd::random_system(&[3, 5], Some([7.0, 0., 0., 0., 7.5, 0., 0., 0., 8.0]), 1);
    let batch = assemble(&model.spec, &sys.atype, &[sys.frame()]).unwrap();
    let c = ten_steps(&model, std::slice::from_ref(&batch));
    let batch_bytes = 4 * (batch.rij.len() + batch.energy.len() + batch.force.len() + 9)
        + 4 * (batch.owner.len() + batch.centre_atom.len());
    // The batch, the force gather lists rebuilt from it, and under 1 KB of constants.
    assert!(
        c.upload_bytes <= 10 * (batch_bytes + 4 * (8 + 1 + 2 * batch.owner.len()) + 1024) as u64,
        "{c:?}"
    );
}

/// The same of the blocks run through their tapes (DPA-2, se_e3_tebd, DPA-3), on batches of
/// other geometries in turn: each tape is recorded from the host's copies of r_ij and the
/// statistics, and its index layout, uniforms and bind groups are its shapes' alone.
#[test]
fn tape_steps_after_the_first_create_and_read_nothing() {
    if wgpu_for::<f32>(&this_test()).is_none() {
        return;
    }
    use dpw::model::DescriptorType;
    for (name, m, s) in suite::fd::cases() {
        if !matches!(
            m.spec.descriptor.kind,
            DescriptorType::Dpa2 | DescriptorType::SeE3Tebd | DescriptorType::Dpa3
        ) {
            continue;
        }
        let batches: Vec<_> = (0..3)
            .map(|k| {
                let mut moved = s.clone();
                for (i, x) in moved.coord.iter_mut().enumerate() {
                    *x += 0.15 * ((i * 7 + k * 3) % 5) as f64 - 0.3;
                }
                assemble(&m.spec, &moved.atype, &[moved.frame()]).unwrap()
            })
            .collect();
        let c = ten_steps(&m, &batches);
        eprintln!("{name}: {c:?}");
    }
}

/// Ten training steps of `model` on `batches` in turn after two that size the grow-only
/// buffers, on a device of its own (the counts are per device, and other tests run meanwhile):
/// their counts, checked for no buffer, bind group or read-back.
fn ten_steps(model: &dpw::model::Model, batches: &[dpw::train::batch::HostBatch]) -> Counts {
    let own = Wgpu::new(PowerPreference::HighPerformance).unwrap();
    let w = &own;
    use dpw::train::steplog::{StepInfo, StepLog};
    use dpw::train::workspaces::{adam_step, batch_gradient, Cache};
    let opt = dpw::config::OptimizerConfig::default();
    let mut dm = DeviceModel::<f32, Wgpu>::new(w, model);
    let mut cache: Cache<f32, Wgpu> = Vec::new();
    let mut log = StepLog::<f32, Wgpu>::new(w, 100, 3);
    let mut step = |t: usize| {
        let batch = &batches[t % batches.len()];
        // Prefactors that change every step, as they follow the learning rate.
        let op = Prefactors {
            e: 1.0,
            f: 100.0 * 0.9f64.powi(t as i32),
            v: 0.1,
        };
        let pf = dpw::train::loss::BatchPrefactors {
            nominal: op,
            op,
            find_v: true,
            coef: 1.0,
        };
        let sums = batch_gradient(w, &mut dm, &mut cache, batch, pf.op)
            .unwrap()
            .sums_mut();
        let info = StepInfo {
            step: t + 1,
            sys: Some(0),
            nframes: 1,
            natoms: batch.dims.natoms,
            pf,
        };
        let (rows, at) = log.record(w, sums, info);
        TrainOps::<f32>::clip_grad_norm(w, &mut dm.grad, 0.1, rows, at);
        TrainOps::<f32>::adam(
            w,
            adam_step(&opt, 1e-3, t),
            &mut dm.params,
            &dm.grad,
            &mut dm.m,
            &mut dm.v,
        );
    };
    step(0);
    step(1);
    let before = w.counts();
    for t in 2..12 {
        step(t);
    }
    let c = w.counts().since(&before);
    assert_eq!((c.buffers, c.bind_groups, c.readbacks), (0, 0, 0), "{c:?}");
    assert!(c.launches > 10, "{c:?}");
    let rows = log.drain(w);
    assert_eq!(rows.len(), 12);
    assert!(rows.iter().all(|r| r.sums[1] > 0.0 && r.grad_norm > 0.0));
    c
}

/// A whole-step parity body of the suite on wgpu, for the precision T.
fn on_wgpu<T: GpuReal>(test: &str, tol: f64, body: fn(&Wgpu, f64))
where
    Wgpu: Backend<T>,
{
    if let Some(w) = wgpu_for::<T>(test) {
        body(w, tol);
    }
}

/// DPA-1's whole step (one mixed neighbour section, its attention block on the host) against
/// the cpu backend, on the reference cases' training frames.
#[test]
fn parity_dpa1_f64() {
    on_wgpu::<f64>("parity_dpa1_f64", 1e-12, suite::parity::dpa1::<f64, _>);
}

/// In float32 too: se_atten_l2_alloy has neighbours just inside rcut, where the switch's
/// f32 cancellation once flipped its r̂ (shaders/env_mat.wgsl).
#[test]
fn parity_dpa1_f32() {
    on_wgpu::<f32>("parity_dpa1_f32", 1e-5, suite::parity::dpa1::<f32, _>);
}

/// A batch of a mixed-type system's frames of several compositions, against the cpu's numbers
/// (tests/data_mixed.rs has the cpu's against DeePMD-kit's).
#[test]
fn parity_mixed_compositions_f64() {
    on_wgpu::<f64>(
        "parity_mixed_compositions_f64",
        1e-12,
        suite::parity::mixed_compositions::<f64, _>,
    );
}

#[test]
fn parity_mixed_compositions_f32() {
    on_wgpu::<f32>(
        "parity_mixed_compositions_f32",
        1e-5,
        suite::parity::mixed_compositions::<f32, _>,
    );
}

/// A "mixed:N" batch of frames of several sizes (virtual atoms), against the cpu's numbers.
#[test]
fn parity_mixed_sizes_f64() {
    on_wgpu::<f64>(
        "parity_mixed_sizes_f64",
        1e-12,
        suite::parity::mixed_sizes::<f64, _>,
    );
}

#[test]
fn parity_mixed_sizes_f32() {
    on_wgpu::<f32>(
        "parity_mixed_sizes_f32",
        1e-5,
        suite::parity::mixed_sizes::<f32, _>,
    );
}

/// A device whose largest storage binding is below the buffers of a block's tape (as DeePMD-kit's
/// dynamic-sel DPA-3 input is on a browser's 128 MiB): the blocks run their host bodies, which
/// read the batch back, and still give DeePMD-kit's gradients. On devices of their own, as the
/// counts are per device.
#[test]
fn blocks_past_the_largest_binding_run_on_the_host() {
    if wgpu_for::<f64>(&this_test()).is_none() {
        return;
    }
    let readbacks = |case: &str, max_binding: Option<u64>| {
        let mut w = Wgpu::new(PowerPreference::HighPerformance).unwrap();
        if let Some(bytes) = max_binding {
            w.set_max_binding(bytes);
        }
        let before = w.counts();
        suite::descriptors::training_gradients(&w, case);
        w.counts().since(&before).readbacks
    };
    for case in [
        suite::descriptors::DPA3_CASES[0],
        suite::descriptors::DPA2_CASES[0],
    ] {
        let (whole, small) = (readbacks(case, None), readbacks(case, Some(SMALL_BINDING)));
        eprintln!("{case}: {whole} read-backs on the tape, {small} on the host bodies");
        assert!(
            small > whole,
            "{case}: {small} read-backs on the small device, {whole} on the whole"
        );
    }
}

/// Below the largest buffer of the reference DPA-3 and DPA-2 cases' tapes (8 MiB holds them),
/// above every other buffer of their steps (0.4 MiB).
const SMALL_BINDING: u64 = 1 << 20;

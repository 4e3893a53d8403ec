//! Parity with the cpu backend, op by op: every op of the trait on inputs made from a real batch
//! and pseudo-random values, compared output by output (f64 to 1e-12, f32 to 1e-5 of each
//! array's largest entry). A GPU backend's test file calls [`ops`] for each precision.

use dpw::backend::cpu::Cpu;
use dpw::backend::{AdamStep, AttnArgs, AttnOpts, Backend, DenseIo, Prefactors, Real, StripArgs};
use dpw::model::{Model, Skip, TebdLayout};
use dpw::train::batch::{assemble, Frame, HostBatch};
use dpw::train::predict::{loss_and_grad_batch, predict_batch};

/// max |a − b| / max |b| (the error relative to the array's largest entry).
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
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

pub fn check(what: &str, gpu: &[f64], cpu: &[f64], tol: f64, failures: &mut Vec<String>) {
    let e = rel_err(gpu, cpu);
    let nonfinite = gpu.iter().any(|x| !x.is_finite());
    eprintln!("  {what}: relative error {e:.2e}");
    if e.is_nan() || e > tol || nonfinite {
        failures.push(format!("{what}: relative error {e:.3e} > {tol:.0e}"));
    }
}

pub fn f64s<T: Real>(x: Vec<T>) -> Vec<f64> {
    x.into_iter().map(|v| v.f64()).collect()
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

/// Deterministic pseudo-random numbers in [−1, 1).
pub struct Lcg(pub u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        2.0 * ((self.0 >> 11) as f64 / (1u64 << 53) as f64) - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
}

// ---------------------------------------------------------------- test systems

/// The small systems of the finite-difference suite (3 models: type_one_side on and off,
/// 2 and 3 types, periodic and not), as (name, model, atom types, frames).
///
/// The hybrid case is left out: it has no ops of its own (its sub-descriptors' are those of the
/// other cases), and its batch's slot layout is no one descriptor's. So are the DPA-3, DPA-2 and
/// se_e3_tebd cases: no embedding net, their block one op ([`tape_blocks`] has them; their
/// predictions and gradients on each backend are the suite's `reference_dpa3_*`,
/// `reference_dpa2_*`).
pub fn small_cases() -> Vec<(&'static str, Model, super::fd::Sys)> {
    use dpw::model::DescriptorType;
    (super::fd::cases().into_iter())
        .filter(|c| {
            let kind = c.1.spec.descriptor.kind;
            kind != DescriptorType::Hybrid && !kind.reads_rij()
        })
        .collect()
}

pub fn frame_of(s: &super::fd::Sys) -> Frame<'_> {
    Frame {
        coord: &s.coord,
        cell: s.cell.as_deref(),
        energy: s.energy,
        force: &s.force,
        virial: Some(&s.virial),
        fparam: None,
        aparam: None,
        label: None,
        atom_label: None,
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
    let env = desc.env();
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
    let nets = [
        (&layout.descriptor.embed[0], ns),
        (&layout.fitting.nets[0], nc),
    ];
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
    b.contract_gbar(d, &abar, &rhat, &mut gbar);
    take("contract_gbar gbar".into(), &gbar);

    // se_e2_r's radial sum and its derivatives.
    let mut rdesc = b.zeros(m1 * nc);
    b.radial_forward(d, &g, &mut rdesc);
    take("radial_forward desc".into(), &rdesc);
    let sdot = up(&rng.vec(ns));
    let mut rddot = b.zeros(m1 * nc);
    b.radial_tangent(d, &gp, &sdot, &mut rddot);
    take("radial_tangent ddot".into(), &rddot);
    let (rdbar, rddotbar) = (up(&rng.vec(m1 * nc)), up(&rng.vec(m1 * nc)));
    let mut rq = b.zeros(3 * ns);
    b.radial_backward(d, &rdbar, &gp, &jac, &mut rq);
    take("radial_backward q".into(), &rq);
    let (mut rgbar, mut rgdotbar) = (b.zeros(m1 * ns), b.zeros(m1 * ns));
    b.radial_dual(d, &rdbar, &rddotbar, &mut rgbar, &mut rgdotbar);
    take("radial_dual gbar".into(), &rgbar);
    take("radial_dual gdotbar".into(), &rgdotbar);

    // se_e3's pair values, its descriptor and their derivatives.
    let np = d.pairs().len();
    let (mut e, mut edot) = (b.zeros(np), b.zeros(np));
    b.angle_values(d, &rhat, &mut e);
    take("angle_values e".into(), &e);
    b.angle_values_tangent(d, &rhat, &rdot, &mut edot);
    take("angle_values_tangent edot".into(), &edot);
    let (pg, pgp) = (up(&rng.vec(np * m1)), up(&rng.vec(np * m1)));
    let (mut adesc, mut addot) = (b.zeros(m1 * nc), b.zeros(m1 * nc));
    b.angle_forward(d, &e, &pg, &mut adesc);
    take("angle_forward desc".into(), &adesc);
    b.angle_tangent(d, &e, &edot, &pg, &pgp, &mut addot);
    take("angle_tangent ddot".into(), &addot);
    let mut aq = b.zeros(3 * ns);
    b.angle_backward(d, &rhat, &jac, &e, &pg, &pgp, &rdbar, &mut aq);
    take("angle_backward q".into(), &aq);
    let (mut agbar, mut agdotbar) = (b.zeros(m1 * np), b.zeros(m1 * np));
    b.angle_dual(d, &e, &edot, &rdbar, &rddotbar, &mut agbar, &mut agdotbar);
    take("angle_dual gbar".into(), &agbar);
    take("angle_dual gdotbar".into(), &agdotbar);

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
        tail: None,
        decay: Default::default(),
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

/// Every op's outputs on `dev` against the cpu backend's, on the small systems of the
/// finite-difference suite, each relative to its largest entry.
pub fn ops<T: Real, B: Backend<T>>(dev: &B, tol: f64)
where
    Cpu: Backend<T>,
{
    let mut failures = Vec::new();
    for (name, m, s) in small_cases() {
        // Two frames, so per-frame sums and centre ↔ frame maps are exercised.
        let frames = [frame_of(&s), frame_of(&s)];
        let batch = assemble(&m.spec, &s.atype, &frames).unwrap();
        eprintln!("{name} ({}):", T::NAME);
        let cpu = op_outputs::<T, _>(&Cpu::default(), &m, &batch);
        let got = op_outputs::<T, _>(dev, &m, &batch);
        for ((what, c), (_, g)) in cpu.iter().zip(&got) {
            check(&format!("{name}: {what}"), g, c, tol, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every op's outputs on two devices of one backend that run the same sums in other kernels
/// (wgpu's flat and tiled dense kernels, shared and separate passes): equal bit for bit.
pub fn same_bits<T: Real, B: Backend<T>>(a: &B, b: &B) {
    let mut failures = Vec::new();
    for (name, m, s) in small_cases() {
        let frames = [frame_of(&s), frame_of(&s)];
        let batch = assemble(&m.spec, &s.atype, &frames).unwrap();
        let x = op_outputs::<T, _>(a, &m, &batch);
        let y = op_outputs::<T, _>(b, &m, &batch);
        for ((what, u), (_, v)) in x.iter().zip(&y) {
            if let Some(k) = (0..u.len()).find(|&k| u[k].to_bits() != v[k].to_bits()) {
                failures.push(format!("{name}: {what}[{k}]: {} vs {}", u[k], v[k]));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- DPA-1's element-wise ops

/// DPA-1's element-wise ops (the switch, the type-embedding rows, strip) on a real mixed-type
/// batch, with every option their kernels branch on (the three skips, with and without a
/// bias, a lead column, one or two type lists, type_one_side, smooth), over pseudo-random
/// values; every output, named, as f64.
fn attn_outputs<T: Real, B: Backend<T>>(
    b: &B,
    m: &Model,
    batch: &HostBatch,
) -> Vec<(String, Vec<f64>)> {
    let d = &batch.dims;
    let (ns, nc, nt, m1) = (d.nslots(), d.ncentres(), d.ntypes, d.m1);
    let mut rng = Lcg(2718);
    let up = |v: &[f64]| b.upload(&to_t::<T>(v));
    let mut out: Vec<(String, Vec<f64>)> = Vec::new();
    let mut take = |name: String, buf: &B::Buf| out.push((name, f64s(b.download(buf))));

    let desc = &m.spec.descriptor;
    let env = desc.env();
    let (rij, owner, dstd) = (up(&batch.rij), b.upload_idx(&batch.owner), up(&m.dstd));
    let (mut sw, mut dsw) = (b.zeros(ns), b.zeros(ns));
    b.attn_switch(d, env, &rij, &owner, &dstd, &mut sw, &mut dsw);
    take("attn_switch sw".into(), &sw);
    take("attn_switch dsw".into(), &dsw);

    let centre_types: Vec<i32> = (0..nc).map(|c| d.centre_type(c) as i32).collect();
    let mut slot_types = vec![0; ns];
    for c in 0..nc {
        slot_types[d.mixed_slots(c)].fill(centre_types[c]);
    }
    let (nei, slot_type, centre_type) = (
        b.upload_idx(&batch.nei_type),
        b.upload_idx(&slot_types),
        b.upload_idx(&centre_types),
    );
    let s = up(&rng.vec(ns));
    for (skip, dim) in [
        (Skip::None, 5),
        (Skip::Identity, nt),
        (Skip::Double, 2 * nt),
    ] {
        for bias in [false, true] {
            let tag = format!("{skip:?} bias {bias}");
            let t = TebdLayout {
                ntypes: nt,
                dim,
                skip,
                w: 7,
                b: bias.then_some(9 + nt * dim),
            };
            let params = up(&rng.vec(12 + (nt + 1) * dim));
            // The concat net's input [ŝ, T[t_j], T[t_i]] inside wider rows, and T[t_i] per centre.
            let (wide, narrow) = (2 * dim + 4, dim + 3);
            let mut x = up(&rng.vec(ns * wide));
            b.tebd_rows(&t, &params, Some(&s), &[&nei, &slot_type], &mut x, wide, 2);
            take(format!("tebd_rows lead, 2 lists, {tag}"), &x);
            let mut y = up(&rng.vec(nc * narrow));
            b.tebd_rows(&t, &params, None, &[&centre_type], &mut y, narrow, 3);
            take(format!("tebd_rows 1 list, {tag}"), &y);
            // Adjoints ≥ 0, so that the sums over ~10⁴ rows do not cancel: with cancellation,
            // the rounding of the cpu's f32 running sum alone exceeds the f32 tolerance (and
            // the chunks' sums differ from it by that).
            let xbar: Vec<f64> = rng.vec(ns * wide).iter().map(|v| v.abs()).collect();
            let mut grad = up(&rng.vec(12 + (nt + 1) * dim));
            let lists = [&nei, &slot_type];
            b.tebd_rows_backward(&t, true, &lists, &up(&xbar), wide, 2, &mut grad);
            take(format!("tebd_rows_backward lead, 2 lists, {tag}"), &grad);
            b.tebd_rows_backward(&t, false, &[&centre_type], &y, narrow, 3, &mut grad);
            take(format!("tebd_rows_backward 1 list, {tag}"), &grad);
        }
    }

    // σ and dσ/dŝ the same on both backends (attn_switch's may differ, see attn_ops).
    let (sw, dsw) = (up(&rng.vec(ns)), up(&rng.vec(ns)));
    let (gs, gsp, sdot) = (
        up(&rng.vec(ns * m1)),
        up(&rng.vec(ns * m1)),
        up(&rng.vec(ns)),
    );
    let (g0bar, g0dotbar) = (up(&rng.vec(ns * m1)), up(&rng.vec(ns * m1)));
    for one_side in [false, true] {
        for smooth in [false, true] {
            let tag = format!("one_side {one_side} smooth {smooth}");
            let rows = if one_side { nt } else { nt * nt };
            let tau = up(&rng.vec(rows * m1));
            let a = StripArgs {
                ntypes: nt,
                m1,
                one_side,
                smooth,
                gs: &gs,
                gsp: &gsp,
                tau: &tau,
                nei_type: &nei,
                centre_type: &slot_type,
                sw: &sw,
                dsw: &dsw,
            };
            let (mut g0, mut g0p) = (b.zeros(ns * m1), b.zeros(ns * m1));
            b.strip_forward(&a, &mut g0, &mut g0p);
            take(format!("strip_forward g0 {tag}"), &g0);
            take(format!("strip_forward g0p {tag}"), &g0p);
            let (mut gsbar, mut gsdotbar) = (b.zeros(ns * m1), b.zeros(ns * m1));
            let mut taubar = b.zeros(rows * m1);
            b.strip_dual(
                &a,
                &sdot,
                (&g0bar, &g0dotbar),
                (&mut gsbar, &mut gsdotbar),
                &mut taubar,
            );
            take(format!("strip_dual gsbar {tag}"), &gsbar);
            take(format!("strip_dual gsdotbar {tag}"), &gsdotbar);
            take(format!("strip_dual taubar {tag}"), &taubar);
        }
    }

    // The attention block's forward and tangent on pseudo-random G⁰, G⁰', R̂, Ṙ (each centre's
    // padding rows copies of one, σ 0 there, as a batch has them), the model's parameters, with
    // 0 to all of its layers and each option the block branches on.
    let copies_of_pad = |v: &mut [f64], w: usize| {
        for c in 0..nc {
            let s = d.mixed_slots(c);
            if let Some(first) = s.clone().find(|&j| batch.owner[j] < 0) {
                for j in first + 1..s.end {
                    v.copy_within(first * w..(first + 1) * w, j * w);
                }
            }
        }
    };
    let mut rand_slots = |w: usize| {
        let mut v = rng.vec(ns * w);
        copies_of_pad(&mut v, w);
        v
    };
    let (g0, g0p, rhat, rdot) = (
        up(&rand_slots(m1)),
        up(&rand_slots(m1)),
        up(&rand_slots(4)),
        up(&rand_slots(4)),
    );
    let (mut swv, mut dswv) = (rng.vec(ns), rng.vec(ns));
    for j in (0..ns).filter(|&j| batch.owner[j] < 0) {
        (swv[j], dswv[j]) = (0.0, 0.0);
    }
    let (sw, dsw) = (up(&swv), up(&dswv));
    let params = up(&m.params);
    let full = m
        .layout()
        .descriptor
        .own
        .attn()
        .cloned()
        .expect("a DPA-1 model");
    let m2 = desc.axis_neuron;
    let stride = m1 * m2 + 3;
    let start = rng.vec(nc * stride);
    let (jac, dbar, ddotbar) = (
        up(&rng.vec(12 * ns)),
        up(&rng.vec(nc * stride)),
        up(&rng.vec(nc * stride)),
    );
    // Zero, so that the gradient's check is relative to the block's own largest entry.
    let grad0 = vec![0.0; m.params.len()];
    for nl in 0..=full.layers.len() {
        let mut layout = full.clone();
        layout.layers.truncate(nl);
        for (normalize, smooth, dotr) in [
            (true, true, true),
            (false, false, false),
            (true, false, true),
            (false, true, false),
        ] {
            let tag = format!("{nl} layers, normalize {normalize} smooth {smooth} dotr {dotr}");
            let a = AttnArgs {
                layout: &layout,
                opts: AttnOpts {
                    normalize,
                    smooth,
                    dotr,
                    ..AttnOpts::new(desc.attn().unwrap(), m1, m2)
                },
                params: &params,
                g0: &g0,
                g0p: &g0p,
                rhat: &rhat,
                sw: &sw,
                dsw: &dsw,
                owner: &owner,
                abar: None,
            };
            let mut x = up(&start);
            b.attn_forward(d, &a, &mut x, stride, None);
            take(format!("attn_forward {tag}"), &x);
            let mut x = up(&start);
            b.attn_tangent(d, &a, &rdot, &mut x, stride);
            take(format!("attn_tangent {tag}"), &x);
            let mut q = b.zeros(3 * ns);
            b.attn_backward(d, &a, &jac, &dbar, stride, &mut q);
            take(format!("attn_backward {tag}"), &q);
            let (mut gb, mut gdb, mut grad) = (b.zeros(ns * m1), b.zeros(ns * m1), up(&grad0));
            let seeds = (&dbar, &ddotbar);
            b.attn_dual(d, &a, &rdot, seeds, stride, (&mut gb, &mut gdb), &mut grad);
            take(format!("attn_dual g0bar {tag}"), &gb);
            take(format!("attn_dual g0dotbar {tag}"), &gdb);
            take(format!("attn_dual grad {tag}"), &grad);
        }
    }
    out
}

/// The tolerance of attn_switch's dσ/dŝ in f64. For a neighbour just inside rcut it is a ratio
/// of two vanishing quantities, and σ = 1 − (1 − σ) there (the cpu's formula) carries ~1e-15
/// of rounding, which the ratio amplifies: on these frames (a neighbour 5e-4 inside rcut) to
/// 3e-9 of the largest slope between two devices that round it differently (fused
/// multiply-adds).
const SLOPE_TOL: f64 = 1e-8;

/// DPA-1's element-wise ops on `dev` against the cpu backend's, each output relative to its
/// largest entry, on two frames of se_atten_v2_alloy (several chunks of the sums over slots),
/// and bit for bit the same on a second run.
pub fn attn_ops<T: Real, B: Backend<T>>(dev: &B, tol: f64)
where
    Cpu: Backend<T>,
{
    let (m, fr) = super::descriptors::training_inputs("se_atten_v2_alloy");
    let batch = assemble(&m.spec, &fr.atype, &fr.all()).unwrap();
    eprintln!("{} slots ({}):", batch.dims.nslots(), T::NAME);
    let cpu = attn_outputs::<T, _>(&Cpu::default(), &m, &batch);
    let got = attn_outputs::<T, _>(dev, &m, &batch);
    let again = attn_outputs::<T, _>(dev, &m, &batch);
    let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut failures = Vec::new();
    for (((what, c), (_, g)), (_, g2)) in cpu.iter().zip(&got).zip(&again) {
        let tol = if what == "attn_switch dsw" {
            tol.max(SLOPE_TOL)
        } else {
            tol
        };
        check(what, g, c, tol, &mut failures);
        if bits(g) != bits(g2) {
            failures.push(format!("{what}: differs between two runs"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- whole-step parity

/// Predictions, loss sums and the full loss gradient on the cpu backend and on `gpu`, which
/// must also predict what it computes in `loss_and_grad`.
pub fn step<T: Real, B: Backend<T>>(
    gpu: &B,
    what: &str,
    m: &Model,
    atype: &[usize],
    frames: &[Frame],
    tol: f64,
    failures: &mut Vec<String>,
) where
    Cpu: Backend<T>,
{
    let batch = assemble(&m.spec, atype, frames).unwrap();
    batch_step::<T, _>(gpu, what, m, &batch, tol, failures);
}

/// [`step`] on an assembled batch.
pub fn batch_step<T: Real, B: Backend<T>>(
    gpu: &B,
    what: &str,
    m: &Model,
    batch: &HostBatch,
    tol: f64,
    failures: &mut Vec<String>,
) where
    Cpu: Backend<T>,
{
    let pref = Prefactors {
        e: 0.02,
        f: 1000.0,
        v: 1.0,
    };
    let (cs, cg, cp) = loss_and_grad_batch::<T, _>(&Cpu::default(), m, batch, pref).unwrap();
    let (gs, gg, gp) = loss_and_grad_batch::<T, _>(gpu, m, batch, pref).unwrap();
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
    let p = predict_batch::<T, _>(gpu, m, batch).unwrap();
    if p != gp {
        failures.push(format!(
            "{w}: predict and loss_and_grad disagree on the GPU"
        ));
    }
}

/// [`step`] on two frames of each DPA-2, se_e3_tebd and DPA-3 system of the finite-difference
/// suite, and of DPA-3 on lists far longer than its neighbours: blocks a device runs through
/// their tapes (`backend/device_tape`: wgpu's, and cuda's with DPW_CUDA_TAPE=kernels).
pub fn tape_blocks<T: Real, B: Backend<T>>(gpu: &B, tol: f64)
where
    Cpu: Backend<T>,
{
    use dpw::model::DescriptorType;
    let mut failures = Vec::new();
    for (name, m, s) in super::fd::cases()
        .into_iter()
        .chain([super::fd::dpa3_wide_lists()])
    {
        let kind = m.spec.descriptor.kind;
        if matches!(
            kind,
            DescriptorType::Dpa2 | DescriptorType::SeE3Tebd | DescriptorType::Dpa3
        ) {
            let frames = [frame_of(&s), frame_of(&s)];
            step::<T, _>(gpu, name, &m, &s.atype, &frames, tol, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`step`] on the training frames of the DPA-1 reference cases.
pub fn dpa1<T: Real, B: Backend<T>>(gpu: &B, tol: f64)
where
    Cpu: Backend<T>,
{
    let mut failures = Vec::new();
    for case in super::descriptors::DPA1_CASES {
        let (m, fr) = super::descriptors::training_inputs(case);
        step::<T, _>(gpu, case, &m, &fr.atype, &fr.all(), tol, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`batch_step`] on one batch of all six frames of a mixed-type system, three compositions
/// (tests/data/mixed/alloy), with the se_atten_l2_alloy model: the GPU kernels find each
/// centre's frame and sum each frame's energy and virial from the shape table's `frame_start`.
pub fn mixed_compositions<T: Real, B: Backend<T>>(gpu: &B, tol: f64)
where
    Cpu: Backend<T>,
{
    let m = dpw::model::read_deepmd_yaml(&crate::common::repo(
        "tests/reference/dpa1/se_atten_l2_alloy/model.yaml",
    ))
    .unwrap();
    let sys = dpw::data::load_system(
        &crate::common::repo("tests/data/mixed/alloy"),
        &m.spec.type_map,
    )
    .unwrap();
    assert_eq!(sys.info().compositions.len(), 3);
    let all: Vec<usize> = (0..sys.nframes).collect();
    let batch = dpw::train::batch::assemble_frames(&m.spec, &sys, &all, "test").unwrap();
    let mut failures = Vec::new();
    batch_step::<T, _>(gpu, "mixed compositions", &m, &batch, tol, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`batch_step`] on a `"mixed:N"` batch: water frames of 192, 384 and 192 atoms (the smaller
/// ones padded with virtual atoms, which are no centre and no neighbour), with a water DPA-1
/// model (tests/mixed_batches.rs has the cpu's against each frame alone).
pub fn mixed_sizes<T: Real, B: Backend<T>>(gpu: &B, tol: f64)
where
    Cpu: Backend<T>,
{
    let m = dpw::model::read_deepmd_yaml(&crate::common::repo(
        "tests/reference/dpa1/se_atten_l2_opts_water/model.yaml",
    ))
    .unwrap();
    let load = |p: &str| dpw::data::load_system(&crate::common::repo(p), &m.spec.type_map).unwrap();
    let (small, large) = (
        load("examples/water/data_0"),
        load("tests/data/water_virial"),
    );
    let picks = [(&small, 0), (&large, 1), (&small, 2)];
    let batch = dpw::train::batch::assemble_mixed(&m.spec, &picks, "test").unwrap();
    assert_eq!(batch.dims.natoms, 384);
    let mut failures = Vec::new();
    batch_step::<T, _>(gpu, "mixed sizes", &m, &batch, tol, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

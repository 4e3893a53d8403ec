//! Finite-difference checks in f64: F = −∂E/∂r, W from a strain of the cell, and the parameter
//! gradient of the full loss (energy + force + virial terms) along a direction in every tensor
//! of every net, on periodic, triclinic and non-periodic systems.

use dpw::backend::{Backend, Prefactors};
use dpw::config::LossConfig;
use dpw::fitting::output::FitOutput;
use dpw::fitting::tensor::config::TensorLossConfig;
use dpw::fitting::tensor::{TensorFitting, TensorSpec};
use dpw::model::{
    DescriptorSpec, DescriptorType, FittingSpec, Model, ModelSpec, OwnKeys, TebdInputMode,
    TensorInfo,
};
use dpw::train::batch::Frame;
use dpw::train::predict::{loss_and_grad, predict, step_of, Prediction};
use dpw::train::step::StepLoss;

/// A small owned system.
#[derive(Clone)]
pub struct Sys {
    pub atype: Vec<usize>,
    pub coord: Vec<f64>,
    pub cell: Option<Vec<f64>>,
    pub energy: f64,
    pub force: Vec<f64>,
    pub virial: Vec<f64>,
}

impl Sys {
    pub fn frame(&self) -> Frame<'_> {
        Frame {
            coord: &self.coord,
            cell: self.cell.as_deref(),
            energy: self.energy,
            force: &self.force,
            virial: Some(&self.virial),
            fparam: None,
            aparam: None,
            label: None,
            atom_label: None,
        }
    }
}

/// Deterministic pseudo-random numbers in [0, 1).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n_per_type` atoms of each type at random positions at least 1.2 Å apart, in a triclinic
/// cell (rows a, b, c) or, without a cell, in a 6 Å cube.
pub fn random_system(n_per_type: &[usize], cell: Option<[f64; 9]>, seed: u64) -> Sys {
    let mut rng = Lcg(seed);
    let atype: Vec<usize> = n_per_type
        .iter()
        .enumerate()
        .flat_map(|(t, &n)| std::iter::repeat_n(t, n))
        .collect();
    let mut pos: Vec<[f64; 3]> = Vec::new();
    while pos.len() < atype.len() {
        let s = [rng.next(), rng.next(), rng.next()];
        let r: [f64; 3] = match cell {
            Some(c) => std::array::from_fn(|j| (0..3).map(|i| s[i] * c[3 * i + j]).sum()),
            None => s.map(|x| 6.0 * x),
        };
        // Only the non-periodic distance is checked: enough to keep atoms apart for these tests.
        if pos
            .iter()
            .all(|p| (0..3).map(|k| (p[k] - r[k]).powi(2)).sum::<f64>() > 1.44)
        {
            pos.push(r);
        }
    }
    let n = atype.len();
    Sys {
        atype,
        coord: pos.concat(),
        cell: cell.map(|c| c.to_vec()),
        energy: -3.0 * n as f64,
        force: (0..3 * n).map(|_| rng.next() - 0.5).collect(),
        virial: (0..9).map(|_| rng.next() - 0.5).collect(),
    }
}

pub fn small_model(ntypes: usize, type_one_side: bool, sel: Vec<usize>, seed: u64) -> Model {
    small_model_of(DescriptorType::SeE2A, ntypes, type_one_side, sel, seed)
}

pub fn small_model_of(
    kind: DescriptorType,
    ntypes: usize,
    type_one_side: bool,
    sel: Vec<usize>,
    seed: u64,
) -> Model {
    let spec = ModelSpec {
        short_range: None,
        linear: None,
        type_map: ["A", "B", "C"][..ntypes]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        descriptor: DescriptorSpec {
            kind,
            rcut: 4.0,
            rcut_smth: 1.0,
            sel,
            neuron: vec![4, 8, 16],
            axis_neuron: if kind == DescriptorType::SeE2A { 4 } else { 1 },
            resnet_dt: true,
            type_one_side,
            env_protection: 0.0,
            set_davg_zero: false,
            own: OwnKeys::Se,
        },
        fitting: FittingSpec::new(vec![12, 12], true),
    };
    let mut m = Model::new(spec, seed);
    for t in 0..ntypes {
        m.davg[4 * t] = 0.1 + 0.05 * t as f64;
        for k in 0..4 {
            m.dstd[4 * t + k] = 0.3 + 0.1 * k as f64;
        }
        m.bias[t] = -1.0 - t as f64;
    }
    m
}

/// A hybrid of se_e2_a (rcut 4), se_e2_r (rcut 3) and se_e3 (rcut 3.5), each with its own
/// statistics, on two types.
pub fn hybrid_model(seed: u64) -> Model {
    let part = |kind, rcut: f64, sel: Vec<usize>, tos: bool| {
        let mut d = small_model_of(kind, 2, tos, sel, seed).spec.descriptor;
        d.rcut = rcut;
        d
    };
    let list = vec![
        part(DescriptorType::SeE2A, 4.0, vec![30, 30], false),
        part(DescriptorType::SeE2R, 3.0, vec![14, 16], true),
        part(DescriptorType::SeE3, 3.5, vec![18, 20], false),
    ];
    let mut spec = small_model_of(DescriptorType::SeE2A, 2, false, vec![30, 30], seed).spec;
    spec.descriptor = DescriptorSpec::hybrid(list);
    let mut m = Model::new(spec, seed);
    for k in 0..3 {
        for t in 0..2 {
            let at = 8 * k + 4 * t;
            m.davg[at] = 0.1 + 0.05 * t as f64 + 0.02 * k as f64;
            for c in 0..4 {
                m.dstd[at + c] = 0.3 + 0.1 * c as f64 + 0.05 * k as f64;
            }
        }
    }
    m.bias = vec![-1.0, -2.0];
    m
}

/// A model DeePMD-kit made (tests/reference/<case>: DPA-3, DPA-2, se_e3_tebd), without its
/// energy bias: its
/// −93 eV an atom would make the loss ~1e6 on these labels, and the loss's rounding then
/// swamps the parameter FD (ε·L/h ≈ 1e-6 at h = 1e-4).
fn deepmd_model(case: &str) -> Model {
    let path = crate::common::repo(&format!("tests/reference/{case}/model.yaml"));
    let mut m = dpw::model::read_deepmd_yaml(&path).unwrap_or_else(|e| panic!("{case}: {e:#}"));
    m.bias.iter_mut().for_each(|b| *b = 0.0);
    m
}

/// se_e3_tebd in strip mode, H–H pairs excluded and davg ≠ 0, freshly drawn: what DeePMD-kit's
/// reference (concat) does not reach.
fn se_e3_tebd_strip() -> Model {
    let mut spec = deepmd_model("dpa2/se_e3_tebd_water").spec;
    let OwnKeys::SeE3Tebd(t) = &mut spec.descriptor.own else {
        unreachable!("an se_e3_tebd model")
    };
    t.tebd_input_mode = TebdInputMode::Strip;
    t.exclude_types = vec![[1, 1]];
    let mut m = Model::new(spec, 9);
    for t in 0..2 {
        m.davg[4 * t] = 0.1 + 0.05 * t as f64;
        for k in 0..4 {
            m.dstd[4 * t + k] = 0.3 + 0.1 * k as f64;
        }
    }
    m
}

/// DPA-3 on lists four times as long as the water model's (e_sel 96, a_sel 56) on ten atoms
/// with no image: a device runs its tape on the slots its neighbours reach, a few of the
/// batch's (`Cut::on_device`), the cpu on exactly those.
pub fn dpa3_wide_lists() -> (&'static str, Model, Sys) {
    let mut spec = deepmd_model("dpa3/water").spec;
    spec.descriptor.sel.iter_mut().for_each(|s| *s *= 4);
    let OwnKeys::Dpa3(c) = &mut spec.descriptor.own else {
        unreachable!("a DPA-3 model")
    };
    c.a_sel *= 4;
    let m = Model::new(spec, 31);
    ("dpa3 wide lists", m, random_system(&[4, 6], None, 19))
}

pub fn cases() -> Vec<(&'static str, Model, Sys)> {
    vec![
        (
            // Message passing across periodic images, the angle branch and dynamic sel's
            // scales (smooth_edge_update true: the energy is smooth where a pair crosses
            // a_rcut).
            "dpa3 periodic triclinic",
            deepmd_model("dpa3/alloy_dynamic_sel"),
            random_system(
                &[3, 3, 3],
                Some([5.0, 0.0, 0.0, 1.2, 5.2, 0.0, -0.9, 0.8, 5.5]),
                18,
            ),
        ),
        (
            "dpa3 non-periodic",
            deepmd_model("dpa3/water"),
            random_system(&[4, 6], None, 19),
        ),
        (
            // Each message reads the features the one before updated.
            "dpa3 sequential update, periodic",
            deepmd_model("dpa3/water_sequential"),
            random_system(
                &[4, 6],
                Some([5.2, 0.0, 0.0, 0.3, 5.6, 0.0, -0.4, 0.5, 5.9]),
                29,
            ),
        ),
        (
            // Every attention of the repformer, on periodic images.
            "dpa2 periodic attention",
            deepmd_model("dpa2/water_attn"),
            random_system(
                &[4, 6],
                Some([5.5, 0.0, 0.0, 0.4, 5.8, 0.0, -0.3, 0.6, 6.1]),
                23,
            ),
        ),
        (
            // The three-body block on its own list, strip mode, non-periodic.
            "dpa2 non-periodic strip",
            deepmd_model("dpa2/water_strip"),
            random_system(&[4, 6], None, 24),
        ),
        (
            // The three-body block alone, on periodic images.
            "se_e3_tebd periodic triclinic",
            deepmd_model("dpa2/se_e3_tebd_water"),
            random_system(
                &[4, 6],
                Some([5.2, 0.0, 0.0, 0.6, 5.6, 0.0, -0.4, 0.5, 5.9]),
                25,
            ),
        ),
        (
            "se_e3_tebd non-periodic strip",
            se_e3_tebd_strip(),
            random_system(&[4, 6], None, 26),
        ),
        (
            "periodic orthorhombic",
            small_model(2, true, vec![20, 30], 1),
            random_system(
                &[6, 10],
                Some([7.0, 0.0, 0.0, 0.0, 7.5, 0.0, 0.0, 0.0, 8.0]),
                11,
            ),
        ),
        (
            // A cell smaller than 2·rcut along every direction: several images per atom.
            "periodic triclinic",
            small_model(2, false, vec![40, 40], 2),
            random_system(
                &[4, 5],
                Some([5.0, 0.0, 0.0, 1.2, 5.2, 0.0, -0.9, 0.8, 5.5]),
                12,
            ),
        ),
        (
            "non-periodic",
            small_model(3, false, vec![6, 8, 6], 3),
            random_system(&[3, 6, 4], None, 13),
        ),
        (
            // A type of the model with no atoms in the system: its ops run over empty ranges.
            "absent middle type",
            small_model(3, false, vec![10, 10, 10], 4),
            random_system(
                &[4, 0, 5],
                Some([6.5, 0.0, 0.0, 0.0, 7.0, 0.0, 0.0, 0.0, 6.8]),
                14,
            ),
        ),
        (
            "se_e2_r periodic triclinic",
            small_model_of(DescriptorType::SeE2R, 2, true, vec![30, 30], 5),
            random_system(
                &[4, 5],
                Some([5.0, 0.0, 0.0, 1.2, 5.2, 0.0, -0.9, 0.8, 5.5]),
                15,
            ),
        ),
        (
            "se_e3 periodic triclinic",
            small_model_of(DescriptorType::SeE3, 2, false, vec![30, 30], 6),
            random_system(
                &[4, 5],
                Some([5.0, 0.0, 0.0, 1.2, 5.2, 0.0, -0.9, 0.8, 5.5]),
                16,
            ),
        ),
        (
            "hybrid periodic triclinic",
            hybrid_model(7),
            random_system(
                &[4, 5],
                Some([5.0, 0.0, 0.0, 1.2, 5.2, 0.0, -0.9, 0.8, 5.5]),
                17,
            ),
        ),
    ]
}

fn energy_of<B: Backend<f64>>(b: &B, m: &Model, s: &Sys) -> f64 {
    predict(b, m, &s.atype, &[s.frame()]).unwrap().energy[0]
}

pub fn forces<B: Backend<f64>>(b: &B) {
    for (name, m, s) in cases() {
        let p = predict(b, &m, &s.atype, &[s.frame()]).unwrap();
        let h = 1e-5;
        let mut worst = 0.0f64;
        for k in 0..s.coord.len() {
            let mut sp = Sys {
                coord: s.coord.clone(),
                cell: s.cell.clone(),
                ..s.clone_labels()
            };
            sp.coord[k] += h;
            let ep = energy_of(b, &m, &sp);
            sp.coord[k] -= 2.0 * h;
            let em = energy_of(b, &m, &sp);
            let fd = -(ep - em) / (2.0 * h);
            worst = worst.max((fd - p.force[k]).abs());
        }
        let scale = p.force.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        eprintln!("{name}: max |F − FD| = {worst:.2e} (max |F| {scale:.2e})");
        assert!(
            worst < 1e-7 * scale.max(1.0),
            "{name}: force vs FD off by {worst}"
        );
    }
}

impl Sys {
    fn clone_labels(&self) -> Sys {
        Sys {
            atype: self.atype.clone(),
            coord: vec![],
            cell: None,
            energy: self.energy,
            force: self.force.clone(),
            virial: self.virial.clone(),
        }
    }

    /// The system under a homogeneous deformation r → r(I + ε) of atoms and cell.
    fn strained(&self, eps: &[f64; 9]) -> Sys {
        let map = |v: &[f64]| -> Vec<f64> {
            v.chunks(3)
                .flat_map(|r| {
                    (0..3).map(move |b| {
                        (0..3)
                            .map(|a| r[a] * (f64::from(u8::from(a == b)) + eps[3 * a + b]))
                            .sum::<f64>()
                    })
                })
                .collect()
        };
        Sys {
            coord: map(&self.coord),
            cell: self.cell.as_deref().map(map),
            ..self.clone_labels()
        }
    }
}

pub fn virial<B: Backend<f64>>(b: &B) {
    for (name, m, s) in cases().into_iter().filter(|c| c.2.cell.is_some()) {
        let p = predict(b, &m, &s.atype, &[s.frame()]).unwrap();
        let h = 1e-6;
        let mut worst = 0.0f64;
        for ab in 0..9 {
            let mut e = [0.0; 9];
            e[ab] = h;
            let ep = energy_of(b, &m, &s.strained(&e));
            e[ab] = -h;
            let em = energy_of(b, &m, &s.strained(&e));
            // W[a][b] = −∂E/∂ε[b][a]
            let (a, bb) = (ab / 3, ab % 3);
            let fd = -(ep - em) / (2.0 * h);
            worst = worst.max((fd - p.virial[3 * bb + a]).abs());
        }
        let scale = p.virial.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        eprintln!("{name}: max |W − FD| = {worst:.2e} (max |W| {scale:.2e})");
        assert!(
            worst < 1e-6 * scale.max(1.0),
            "{name}: virial vs FD off by {worst}"
        );
    }
}

/// The loss as DeePMD-kit defines it (docs/deepmd-spec.md §9), mean over frames.
pub fn loss_of(p: &Prediction, frames: &[Frame], pref: Prefactors, natoms: usize) -> f64 {
    let n = natoms as f64;
    let mut l = 0.0;
    for (f, fr) in frames.iter().enumerate() {
        let de = p.energy[f] - fr.energy;
        let df: f64 = (0..3 * natoms)
            .map(|k| (p.force[3 * natoms * f + k] - fr.force[k]).powi(2))
            .sum();
        let dv: f64 = (0..9)
            .map(|k| (p.virial[9 * f + k] - fr.virial.unwrap()[k]).powi(2))
            .sum();
        l += pref.e * de * de / n + pref.f * df / (3.0 * n) + pref.v * dv / (9.0 * n);
    }
    l / frames.len() as f64
}

/// Which directions [`loss_gradient_along`] checks ∂L/∂θ along.
#[derive(Clone, Copy, PartialEq)]
pub enum Directions {
    /// One per tensor: every tensor's gradient on its own (the CPU backend).
    PerTensor,
    /// One per net, all its layers' tensors moved together: about a tenth of the predictions,
    /// for backends whose predictions are slow (lavapipe's float64 took 19 minutes of CI per
    /// tensor). A wrong tensor still shows: its share of the net's derivative is far above the
    /// bound; the per-op parity tests then say which op.
    PerNet,
}

pub fn loss_gradient<B: Backend<f64>>(b: &B) {
    loss_gradient_along(b, Directions::PerNet);
}

pub fn loss_gradient_along<B: Backend<f64>>(b: &B, directions: Directions) {
    let pref = Prefactors {
        e: 0.7,
        f: 3.0,
        v: 0.9,
    };
    for (name, m, s) in cases() {
        // Two frames (the second displaced), so the mean over frames is exercised too.
        let mut s2 = Sys {
            coord: s.coord.clone(),
            cell: s.cell.clone(),
            ..s.clone_labels()
        };
        s2.coord
            .iter_mut()
            .enumerate()
            .for_each(|(k, x)| *x += 0.05 * ((k as f64) * 0.7).sin());
        s2.energy += 0.8;
        let frames = [s.frame(), s2.frame()];
        let n = s.atype.len();
        let (_, grad, _) = loss_and_grad(b, &m, &s.atype, &frames, pref).unwrap();
        let loss_at = |p: &[f64]| {
            let mut mm = m.clone();
            mm.params.copy_from_slice(p);
            loss_of(
                &predict(b, &mm, &s.atype, &frames).unwrap(),
                &frames,
                pref,
                n,
            )
        };
        let (worst, checked) = worst_along(&m, &grad, directions, loss_at, name);
        eprintln!("{name}: {checked} directions, worst relative |∂L/∂θ·v − FD| = {worst:.2e}");
        assert!(worst < 1e-6, "{name}: loss gradient vs FD off by {worst}");
    }
}

/// The worst relative difference between the gradient `grad` of `m`'s loss along each
/// direction of `directions` and finite differences of `loss_at` (the loss at given
/// parameters) along it, and how many directions.
fn worst_along(
    m: &Model,
    grad: &[f64],
    directions: Directions,
    loss_at: impl Fn(&[f64]) -> f64,
    name: &str,
) -> (f64, usize) {
    // The five-point stencil (error O(h⁴)) at a step where the loss's rounding, ε·L/h, is
    // about 1e-10: the two-point one at h = 1e-6 carried rounding noise of ~1e-8, near this
    // test's bound for small gradients.
    let h = 1e-4;
    let mut worst = 0.0f64;
    let layout = m.layout();
    let groups = group_tensors(&layout.tensors, directions);
    for (group, tensors) in &groups {
        // Every entry of the group moved, by an irregular weight in [−1, 1]: ∂L/∂θ·v against
        // the loss along v, four predictions a direction (per-entry checks took three entries
        // a tensor at twelve).
        let v: Vec<(usize, f64)> = (tensors.iter())
            .flat_map(|&(ti, t)| {
                (0..t.len()).map(move |k| {
                    let vk = ((k as f64 + 1.0) * 12.9898 + ti as f64 * 78.233).sin();
                    (t.offset + k, vk)
                })
            })
            .collect();
        let along = |dx: f64| {
            let mut p = m.params.clone();
            v.iter().for_each(|&(at, vk)| p[at] += dx * vk);
            loss_at(&p)
        };
        let fd = (8.0 * (along(h) - along(-h)) - (along(2.0 * h) - along(-2.0 * h))) / (12.0 * h);
        let g: f64 = v.iter().map(|&(at, vk)| grad[at] * vk).sum();
        let err = (fd - g).abs() / (fd.abs() + g.abs()).max(1e-3);
        if err > 1e-6 {
            eprintln!("  {name} {group}: analytic {g} vs FD {fd} along v");
        }
        worst = worst.max(err);
    }
    (worst, groups.len())
}

/// The tensors (with their index in the layout) that move together, by name: a net's tensors
/// are `<net>.layer<l>.<w|b|idt>`.
fn group_tensors(
    tensors: &[TensorInfo],
    directions: Directions,
) -> Vec<(String, Vec<(usize, &TensorInfo)>)> {
    let mut groups: Vec<(String, Vec<(usize, &TensorInfo)>)> = Vec::new();
    for (ti, t) in tensors.iter().enumerate() {
        let key = match directions {
            Directions::PerTensor => t.name.as_str(),
            Directions::PerNet => t.name.split(".layer").next().unwrap_or(&t.name),
        };
        match groups.last_mut() {
            Some((k, members)) if k == key => members.push((ti, t)),
            _ => groups.push((key.to_string(), vec![(ti, t)])),
        }
    }
    groups
}

/// A dipole or polar fitting (nets [12, 12]) in place of `m`'s: the model's descriptor and
/// statistics, its nets drawn anew.
fn with_tensor_fitting(m: &Model, polar: bool, seed: u64) -> Model {
    let mut spec = m.spec.clone();
    let t = TensorSpec {
        embedding_width: (spec.descriptor.rot_width())
            .expect("a descriptor with a rotation matrix"),
        fit_diag: false,
        scale: vec![],
        shift_diag: false,
        exclude_types: vec![],
    };
    spec.fitting = FittingSpec::new(vec![12, 12], true);
    spec.fitting.output = if polar {
        FitOutput::Polar(TensorFitting::new(t))
    } else {
        FitOutput::Dipole(TensorFitting::new(t))
    };
    let mut out = Model::new(spec, seed);
    out.davg.clone_from(&m.davg);
    out.dstd.clone_from(&m.dstd);
    out
}

/// The tensor loss's parameter gradient against finite differences of the loss, one direction
/// per net, for a dipole or polar fitting on each descriptor that gives the rotation matrix:
/// ∂L/∂A reaching every descriptor net through its backward (se_e2_a's contraction, DPA-1's
/// attention block, DPA-2's repformers and DPA-3's RepFlow layers through their tapes).
pub fn tensor_loss_gradient<B: Backend<f64>>(b: &B) {
    let water = |seed| random_system(&[4, 6], None, seed);
    let cell = Some([5.4, 0.0, 0.0, 0.4, 5.7, 0.0, -0.3, 0.5, 6.0]);
    let cases = [
        (
            "se_e2_a dipole",
            small_model(2, true, vec![10, 12], 8),
            false,
            water(31),
        ),
        (
            "dpa1 (se_atten_v2) dipole",
            deepmd_model("dpa1/se_atten_v2_alloy"),
            false,
            random_system(&[3, 3, 3], None, 32),
        ),
        (
            "dpa1 polar, periodic",
            deepmd_model("dpa1/se_atten_l2_alloy"),
            true,
            random_system(&[3, 3, 3], cell, 33),
        ),
        (
            "dpa2 dipole, periodic",
            deepmd_model("dpa2/water_attn"),
            false,
            random_system(&[4, 6], cell, 34),
        ),
        ("dpa3 polar", deepmd_model("dpa3/water"), true, water(35)),
        (
            "dpa3 dipole, dynamic sel",
            deepmd_model("dpa3/alloy_dynamic_sel"),
            false,
            random_system(&[3, 3, 3], cell, 36),
        ),
    ];
    let loss = LossConfig::Tensor(TensorLossConfig {
        pref_atomic: 0.7,
        pref: 1.3,
    });
    let step = || StepLoss::Host {
        loss: &loss,
        coef: 1.0,
    };
    for (k, (name, m, polar, s)) in cases.into_iter().enumerate() {
        let m = with_tensor_fitting(&m, polar, 40 + k as u64);
        let size = if polar { 9 } else { 3 };
        let n = s.atype.len();
        let mut rng = Lcg(50 + k as u64);
        let label: Vec<f64> = (0..size).map(|_| 4.0 * (rng.next() - 0.5)).collect();
        let atom_label: Vec<f64> = (0..n * size).map(|_| rng.next() - 0.5).collect();
        let frame = Frame {
            label: Some(&label),
            atom_label: Some(&atom_label),
            ..s.frame()
        };
        let frames = [frame];
        let (_, grad, _) = step_of(b, &m, &s.atype, &frames, step()).unwrap();
        let loss_at = |p: &[f64]| {
            let mut mm = m.clone();
            mm.params.copy_from_slice(p);
            step_of(b, &mm, &s.atype, &frames, step()).unwrap().0[0]
        };
        let (worst, checked) = worst_along(&m, &grad, Directions::PerNet, loss_at, name);
        eprintln!("{name}: {checked} directions, worst relative |∂L/∂θ·v − FD| = {worst:.2e}");
        assert!(
            worst < 1e-6,
            "{name}: tensor loss gradient vs FD off by {worst}"
        );
    }
}

//! Helpers shared by the integration tests: DeePMD-kit's reference model and frames.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::{NpzReader, ReadNpyExt};

use dpw::model::{read_model, write_deepmd_yaml, DescriptorSpec, FittingSpec, Model, ModelSpec};
use dpw::train::batch::Frame;

/// A path inside the repository: the tests read only data it ships, so a missing file fails them.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A wgpu test that cannot run here (no adapter, or none with float64 where it needs it): a
/// failure when DPW_REQUIRE_WGPU=1 (CI, where lavapipe is the adapter), else a visible skip.
pub fn no_wgpu(test: &str, why: &str) {
    if std::env::var("DPW_REQUIRE_WGPU").is_ok_and(|v| v == "1") {
        panic!("DPW_REQUIRE_WGPU=1 but {test} cannot run: {why}");
    }
    eprintln!("SKIPPED: {test}: {why}");
}

/// The test binary's wgpu device, opened on first use (its adapter printed: the GPU kit reads the
/// line) and kept for the binary's life, or why there is none. Kept, not dropped: two test threads
/// opening and dropping Vulkan devices at once crashed a test binary (SIGSEGV) in 2 of 3 runs on
/// an NVIDIA H200 (driver 580.159.04).
#[cfg(feature = "wgpu")]
pub fn wgpu_device() -> Result<&'static dpw::backend::wgpu::Wgpu, &'static str> {
    use dpw::backend::wgpu::Wgpu;
    static W: std::sync::OnceLock<Result<Wgpu, String>> = std::sync::OnceLock::new();
    W.get_or_init(|| {
        let w = Wgpu::new(wgpu::PowerPreference::HighPerformance).map_err(|e| format!("{e:#}"))?;
        eprintln!(
            "wgpu adapter: {} ({}, cpu adapter: {}, f64: {})",
            w.adapter_name(),
            w.backend_name(),
            w.is_cpu_adapter(),
            w.supports_f64()
        );
        Ok(w)
    })
    .as_ref()
    .map_err(String::as_str)
}

/// Whether this machine has a wgpu adapter with float64, for tests whose runs are `dpw`
/// processes of their own; if not, reports it through [`no_wgpu`].
#[cfg(feature = "wgpu")]
pub fn wgpu_f64_present(test: &str) -> bool {
    let why = match wgpu_device() {
        Ok(w) => match w.require::<f64>() {
            Ok(()) => return true,
            Err(e) => format!("no wgpu adapter with float64 ({e:#})"),
        },
        Err(e) => e.to_string(),
    };
    no_wgpu(test, &why);
    false
}

/// DeePMD-kit 3.2.0's numbers for model_A (`tests/reference/deepmd-3.2.0/README.md`).
/// The shipped water example (examples/water).
pub fn water() -> PathBuf {
    repo("examples/water")
}

/// A copy of `src` (a data system, a folder tree) at `dst`.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// A copy of the water example's system data_0 at `dir/name`, to be changed by a test.
pub fn water_system(dir: &Path, name: &str) -> PathBuf {
    let sys = dir.join(name);
    copy_dir(&water().join("data_0"), &sys);
    sys
}

pub fn model_a_dir() -> PathBuf {
    repo("tests/reference/deepmd-3.2.0/model_A")
}

pub fn read_npy(path: &Path) -> ArrayD<f64> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ArrayD::<f64>::read_npy(f).unwrap()
}

pub fn npz(path: &Path) -> NpzReader<std::fs::File> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    NpzReader::new(f).unwrap()
}

pub fn npz_array(z: &mut NpzReader<std::fs::File>, name: &str) -> ArrayD<f64> {
    z.by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every tensor of `m`'s layout is a `grad.*` array of the train step in `train_step`, by name
/// and shape, and the other way round, and the tensors tile the parameter vector; returns how
/// many tensors there are.
pub fn assert_layout_is_train_steps(m: &Model, train_step: &Path, case: &str) -> usize {
    let layout = m.layout();
    let mut z = npz(train_step);
    let mut want = std::collections::BTreeMap::new();
    for n in z.names().unwrap().iter().filter(|n| n.starts_with("grad.")) {
        let n = n.trim_end_matches(".npy");
        let shape = npz_array(&mut z, n).shape().to_vec();
        want.insert(n["grad.".len()..].to_string(), shape);
    }
    let ours: std::collections::BTreeMap<String, Vec<usize>> = (layout.tensors.iter())
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    assert_eq!(ours, want, "{case}");
    let mut at = 0;
    for t in &layout.tensors {
        assert_eq!(t.offset, at, "{case}: {}", t.name);
        at += t.len();
    }
    assert_eq!(at, layout.len, "{case}");
    want.len()
}

pub fn npz_i64(z: &mut NpzReader<std::fs::File>, name: &str) -> ArrayD<i64> {
    z.by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn flat(a: &ArrayD<f64>) -> Vec<f64> {
    a.iter().copied().collect()
}

/// Fills a model's parameters from a folder of `<tensor name>.npy` files.
pub fn load_params(model: &mut Model, dir: &Path) {
    for t in model.layout().tensors {
        let a = read_npy(&dir.join(format!("{}.npy", t.name)));
        assert_eq!(a.len(), t.len(), "{}", t.name);
        model.params[t.offset..t.offset + t.len()].copy_from_slice(&flat(&a));
    }
}

/// The water example's descriptor (rcut 6, sel [46, 92], embedding [25, 50, 100], axis 16).
pub fn water_descriptor() -> DescriptorSpec {
    DescriptorSpec {
        kind: Default::default(),
        rcut: 6.0,
        rcut_smth: 0.5,
        sel: vec![46, 92],
        neuron: vec![25, 50, 100],
        axis_neuron: 16,
        resnet_dt: false,
        type_one_side: true,
        env_protection: 0.0,
        set_davg_zero: false,
        own: dpw::model::OwnKeys::Se,
    }
}

/// input.json of a tiny se_e2_a model on the water data (rcut 4, a few ms per step) training
/// on `systems` for `steps` steps, without validation data.
pub fn tiny_water_input(systems: serde_json::Value, steps: usize) -> serde_json::Value {
    serde_json::json!({
        "model": {
            "type_map": ["O", "H"],
            "descriptor": {"type": "se_e2_a", "sel": [20, 28], "rcut_smth": 0.5, "rcut": 4.0,
                           "neuron": [4, 8], "axis_neuron": 4, "type_one_side": true, "seed": 1},
            "fitting_net": {"neuron": [8, 8], "resnet_dt": true, "seed": 1},
            "data_stat_nbatch": 3
        },
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
        "loss": {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1,
                 "start_pref_f": 1000, "limit_pref_f": 1, "start_pref_v": 0, "limit_pref_v": 0},
        "training": {
            "training_data": {"systems": systems, "batch_size": "auto"},
            "numb_steps": steps, "seed": 10, "disp_freq": 1, "save_freq": 1000
        }
    })
}

/// `dpw train input.json --backend cpu` in `dir`, `input` written there first; it must succeed
/// without a panic.
pub fn train_cpu(dir: &Path, input: &serde_json::Value) -> std::process::Output {
    std::fs::write(
        dir.join("input.json"),
        serde_json::to_string_pretty(input).unwrap(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(dir)
        .args(["train", "input.json", "--backend", "cpu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    out
}

/// model_A from its per-tensor npy export (independent of dpw's YAML reader).
pub fn model_a() -> Model {
    let dir = model_a_dir();
    let spec = ModelSpec {
        short_range: None,
        linear: None,
        type_map: vec!["O".into(), "H".into()],
        descriptor: DescriptorSpec {
            kind: Default::default(),
            neuron: vec![8, 16, 32],
            axis_neuron: 4,
            ..water_descriptor()
        },
        fitting: FittingSpec::new(vec![32, 32, 32], true),
    };
    let mut m = Model::new(spec, 0);
    load_params(&mut m, &dir.join("npy"));
    let davg = read_npy(&dir.join("npy/descrpt.davg.npy"));
    let dstd = read_npy(&dir.join("npy/descrpt.dstd.npy"));
    for t in 0..2 {
        for k in 0..4 {
            m.davg[4 * t + k] = davg[[t, 0, k]];
            m.dstd[4 * t + k] = dstd[[t, 0, k]];
        }
    }
    let ob = read_npy(&dir.join("npy/out_bias.npy"));
    let be = read_npy(&dir.join("npy/fit.bias_atom_e.npy"));
    for t in 0..2 {
        m.bias[t] = ob[[0, t, 0]] + be[[t, 0]];
    }
    m
}

/// Reference frames, with atoms sorted by type (stable) as dpw requires.
pub struct RefFrames {
    pub atype: Vec<usize>,
    /// `perm[i]` = original index of sorted atom i.
    pub perm: Vec<usize>,
    pub coord: Vec<Vec<f64>>,
    pub cell: Vec<Vec<f64>>,
    pub energy_label: Vec<f64>,
    pub force_label: Vec<Vec<f64>>,
    pub z: NpzReader<std::fs::File>,
}

impl RefFrames {
    pub fn frame(&self, f: usize) -> Frame<'_> {
        Frame {
            coord: &self.coord[f],
            cell: Some(&self.cell[f]),
            energy: self.energy_label[f],
            force: &self.force_label[f],
            virial: None,
            fparam: None,
            aparam: None,
            label: None,
            atom_label: None,
        }
    }

    /// A per-atom reference array `[nframes][natoms][k]` permuted to sorted order, frame f.
    pub fn sorted(&self, a: &ArrayD<f64>, f: usize) -> Vec<f64> {
        let k = a.len() / (a.shape()[0] * self.perm.len());
        let a = a
            .to_shape(IxDyn(&[a.shape()[0], self.perm.len(), k]))
            .unwrap();
        self.perm
            .iter()
            .flat_map(|&i| (0..k).map(move |c| (i, c)))
            .map(|(i, c)| a[[f, i, c]])
            .collect()
    }
}

pub fn ref_frames() -> RefFrames {
    let dir = model_a_dir();
    let mut z = npz(&dir.join("eval_3frames.npz"));
    let atype_raw = npz_i64(&mut z, "atype");
    let atype_raw: Vec<usize> = atype_raw.iter().map(|&t| t as usize).collect();
    let mut perm: Vec<usize> = (0..atype_raw.len()).collect();
    perm.sort_by_key(|&i| atype_raw[i]);
    let atype = perm.iter().map(|&i| atype_raw[i]).collect();
    let coord = npz_array(&mut z, "coord");
    let cell = npz_array(&mut z, "box");
    let e = npz_array(&mut z, "energy_label");
    let fl = npz_array(&mut z, "force_label");
    let mut rf = RefFrames {
        atype,
        perm,
        coord: vec![],
        cell: vec![],
        energy_label: e.iter().copied().collect(),
        force_label: vec![],
        z,
    };
    for f in 0..3 {
        rf.coord.push(rf.sorted(&coord, f));
        rf.force_label.push(rf.sorted(&fl, f));
        rf.cell.push(
            cell.index_axis(ndarray::Axis(0), f)
                .iter()
                .copied()
                .collect(),
        );
    }
    rf
}

/// The eval frames of a reference case (its `eval.npz`, periodic): atom types, coordinates
/// `[nframes][natoms·3]`, boxes.
pub struct EvalFrames {
    pub atype: Vec<usize>,
    pub coord: Vec<Vec<f64>>,
    pub cell: Vec<Vec<f64>>,
}

impl EvalFrames {
    /// The frames without labels (energy 0, the forces `force`: empty where only the batch's
    /// layout is wanted, zeros for a prediction).
    pub fn unlabelled<'a>(&'a self, force: &'a [f64]) -> Vec<Frame<'a>> {
        (self.coord.iter().zip(&self.cell))
            .map(|(coord, cell)| Frame {
                coord,
                cell: Some(cell),
                energy: 0.0,
                force,
                virial: None,
                fparam: None,
                aparam: None,
                label: None,
                atom_label: None,
            })
            .collect()
    }
}

pub fn eval_frames(case_dir: &Path) -> EvalFrames {
    let mut z = npz(&case_dir.join("eval.npz"));
    let coord = npz_array(&mut z, "coord");
    let cell = npz_array(&mut z, "box");
    let atype = npz_i64(&mut z, "atype");
    let nf = coord.shape()[0];
    let rows = |a: &ArrayD<f64>| -> Vec<Vec<f64>> {
        (0..nf)
            .map(|f| a.index_axis(ndarray::Axis(0), f).iter().copied().collect())
            .collect()
    };
    EvalFrames {
        atype: atype.iter().map(|&t| t as usize).collect(),
        coord: rows(&coord),
        cell: rows(&cell),
    }
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A start DeePMD-kit made (a fine-tuned or resumed head) against dpw's: the same spec, every
/// parameter and statistic to 1e-15, the bias to 1e-8 eV (DeePMD-kit's DPA-1 re-fits carry
/// ~1e-10 of neighbour-list noise).
pub fn assert_deepmd_start(mine: &Model, theirs: &Model, what: &str) {
    assert_eq!(mine.spec, theirs.spec, "{what}");
    let p = max_abs_diff(&mine.params, &theirs.params);
    let s = max_abs_diff(&mine.davg, &theirs.davg).max(max_abs_diff(&mine.dstd, &theirs.dstd));
    let b = max_abs_diff(&mine.bias, &theirs.bias);
    eprintln!("{what}: parameters {p:.1e}, statistics {s:.1e}, bias {b:.1e} eV");
    assert!(p <= 1e-15 && s <= 1e-15 && b <= 1e-8, "{what}: {p} {s} {b}");
}

/// A JSON array of strings (a type map in a reference file).
pub fn json_strings(v: &serde_json::Value) -> Vec<String> {
    let items = v.as_array().expect("a JSON array");
    items.iter().map(|s| s.as_str().unwrap().into()).collect()
}

/// `dpw args` in `dir`: whether it succeeded, and its stdout and stderr (never a panic).
pub fn dpw_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("panicked"), "{args:?}: {text}");
    (out.status.success(), text)
}

/// `dpw train input.json --backend cpu` in `dir` with `input` written there first.
pub fn dpw_train(dir: &Path, input: &serde_json::Value) -> (bool, String) {
    std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
    dpw_in(dir, &["train", "input.json", "--backend", "cpu"])
}

/// A reference npz's frames written as a deepmd/npy system: `type.raw`, `type_map.raw`,
/// `set.000/coord.npy` and `box.npy` (or `nopbc` where `pbc` is false) by [`npz_system`]; the
/// caller writes its labels with [`NpzSystem::write`].
pub struct NpzSystem {
    pub z: NpzReader<std::fs::File>,
    pub dir: PathBuf,
    pub set: PathBuf,
    pub atype: Vec<i64>,
}

pub fn npz_system(npz_path: &Path, dir: &Path, type_map: &[&str], pbc: bool) -> NpzSystem {
    let mut z = npz(npz_path);
    let set = dir.join("set.000");
    std::fs::create_dir_all(&set).unwrap();
    let atype: Vec<i64> = npz_i64(&mut z, "atype").iter().copied().collect();
    let types: Vec<String> = atype.iter().map(|t| t.to_string()).collect();
    std::fs::write(dir.join("type.raw"), types.join("\n")).unwrap();
    std::fs::write(dir.join("type_map.raw"), type_map.join("\n")).unwrap();
    let mut sys = NpzSystem {
        z,
        dir: dir.to_path_buf(),
        set,
        atype,
    };
    sys.write("coord", "coord.npy");
    if pbc {
        sys.write("box", "box.npy");
    } else {
        std::fs::write(dir.join("nopbc"), "").unwrap();
    }
    sys
}

impl NpzSystem {
    /// The npz array `key` as `[nframes][rest]`.
    pub fn rows(&mut self, key: &str) -> ndarray::Array2<f64> {
        let a = npz_array(&mut self.z, key);
        let nf = a.shape()[0];
        let v: Vec<f64> = a.iter().copied().collect();
        ndarray::Array2::from_shape_vec((nf, v.len() / nf), v).unwrap()
    }

    /// The npz array `key` written as `set.000/{file}`, `[nframes][rest]`.
    pub fn write(&mut self, key: &str, file: &str) {
        let a = self.rows(key);
        ndarray_npy::write_npy(self.set.join(file), &a).unwrap();
    }
}

/// Trains one step of `input` in `dir`, checks its output bias against `want` (≤ 1e-12
/// relative to the largest) and that the model goes through DeePMD-kit's `.yaml` unchanged.
pub fn one_step_bias_is(
    dir: &Path,
    input: &serde_json::Value,
    want: &serde_json::Value,
    what: &str,
) {
    let (ok, log) = dpw_train(dir, input);
    assert!(ok, "{what}: {log}");
    let m = dpw::model::read_model_to_train(&dir.join("model.ckpt-1")).unwrap();
    let r = rel_to_max(&m.bias, &json_numbers(want));
    eprintln!("{what}: output bias vs DeePMD-kit's: {r:.1e}");
    assert!(r < 1e-12, "{what}: {:?}", m.bias);
    let yaml = dir.join("frozen.yaml");
    dpw::model::write_deepmd_yaml(&m, &yaml).unwrap();
    assert_eq!(dpw::model::read_deepmd_yaml(&yaml).unwrap(), m, "{what}");
}

/// A JSON file.
pub fn json_file(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every number of a JSON value (nested lists flattened), in order.
pub fn json_numbers(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(json_numbers).collect(),
        x => vec![x.as_f64().unwrap()],
    }
}

/// max |a − b| / max |b|.
pub fn rel_to_max(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    max_abs_diff(a, b) / scale
}

/// Runs `script` with DeePMD-kit's Python (`DPW_DEEPMD_PYTHON`) as `python -c script root tmp
/// cases…`; it prints a line `case max-abs-difference` per case, each asserted ≤ 1e-10. Without
/// the variable the test `test` is a visible skip, or a failure under `DPW_REQUIRE_DEEPMD=1`
/// (the convention of `DPW_REQUIRE_WGPU`).
pub fn deepmd_agrees(test: &str, script: &str, root: &Path, tmp: &Path, cases: &[&str]) {
    let Ok(python) = std::env::var("DPW_DEEPMD_PYTHON") else {
        let why = "DPW_DEEPMD_PYTHON (a Python with deepmd-kit 3.2.0) is not set";
        if std::env::var("DPW_REQUIRE_DEEPMD").is_ok_and(|v| v == "1") {
            panic!("DPW_REQUIRE_DEEPMD=1 but {why}");
        }
        eprintln!("SKIPPED: {test}: {why}");
        return;
    };
    let out = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(root)
        .arg(tmp)
        .args(cases)
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = (stdout.lines())
        .filter(|l| cases.iter().any(|c| l.starts_with(&format!("{c} "))))
        .collect();
    assert_eq!(lines.len(), cases.len(), "{stdout}");
    for l in lines {
        let (case, diff) = l.split_once(' ').unwrap();
        let diff: f64 = diff.trim().parse().unwrap_or(f64::NAN);
        eprintln!("{case}: DeePMD-kit on dpw's file differs by {diff:.1e}");
        assert!(
            diff <= 1e-10,
            "{case}: DeePMD-kit on dpw's file differs by {diff}"
        );
    }
}

/// `dpw change-bias -m change` of `model` on the C4H3O1 molecule (every frame, as the
/// fine-tune's re-fit sees them), written to `dir`.
pub fn rebias_on_molecule(dir: &Path, model: &Model, name: &str) -> Model {
    let start = dir.join(format!("{name}.yaml"));
    let out = dir.join(format!("{name}_rebiased.yaml"));
    write_deepmd_yaml(model, &start).unwrap();
    let (ok, log) = dpw_in(
        dir,
        &[
            "change-bias",
            start.to_str().unwrap(),
            "-s",
            "tests/data/nopbc/C4H3O1",
            "-m",
            "change",
            "--backend",
            "cpu",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{log}");
    read_model(&out).unwrap()
}

/// Issue 56's "on every backend": `model` (dpw's fine-tuned start or change-bias result of
/// multi-task reference case `case`, head `head` or `None`) predicts the energies DeePMD-kit's own
/// model of that case predicts for the frames of its `eval[_<head>].npz`, through `dpw test` on
/// the cpu and, where this machine's wgpu has float64, on wgpu: within 1e-8 eV and the noise of
/// DeePMD-kit's own bias re-fit of a DPA-1 model, ~1e-10 eV per atom (its README: a pair at the
/// cut-off moves its neighbour list), which ft_mt_water_ho's 192 atoms show (1.8e-8 eV).
pub fn predicts_deepmd_energies(test: &str, model: &Model, case: &str, head: Option<&str>) {
    let dir = repo(&format!("tests/reference/multitask/{case}"));
    let meta = json_file(&dir.join("bias.json"));
    let (type_map, npz_name) = match head {
        Some(h) => (&meta["heads"][h]["type_map"], format!("eval_{h}.npz")),
        None if meta.get("heads").is_some() => {
            (&meta["heads"]["Default"]["type_map"], "eval.npz".into())
        }
        None => (&meta["type_map"], "eval.npz".into()),
    };
    let type_map = json_strings(type_map);
    let tm: Vec<&str> = type_map.iter().map(String::as_str).collect();
    let tmp = tempfile::tempdir().unwrap();
    let sys_dir = tmp.path().join("frames");
    let mut sys = npz_system(&dir.join(&npz_name), &sys_dir, &tm, true);
    sys.write("energy", "energy.npy");
    sys.write("force", "force.npy");
    let want: Vec<f64> = sys.rows("energy").iter().copied().collect();
    let yaml = tmp.path().join("model.yaml");
    write_deepmd_yaml(model, &yaml).unwrap();
    let mut backends = vec!["cpu"];
    #[cfg(feature = "wgpu")]
    if wgpu_f64_present(test) {
        backends.push("wgpu");
    }
    for backend in backends {
        let detail = tmp.path().join(backend);
        let (ok, log) = dpw_in(
            tmp.path(),
            &[
                "test",
                "-m",
                yaml.to_str().unwrap(),
                "-s",
                sys_dir.to_str().unwrap(),
                "-d",
                detail.to_str().unwrap(),
                "--backend",
                backend,
            ],
        );
        assert!(ok, "{case} on {backend}: {log}");
        let text = std::fs::read_to_string(format!("{}.e.out", detail.display())).unwrap();
        let got: Vec<f64> = (text.lines().filter(|l| !l.starts_with('#')))
            .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect();
        let d = max_abs_diff(&got, &want);
        eprintln!("{case} {head:?} on {backend}: energies off DeePMD-kit's by {d:.1e} eV");
        let tol = 1e-8 + 1e-10 * sys.atype.len() as f64;
        assert!(d <= tol, "{case} {head:?} on {backend}: {d:e}");
    }
}

//! `dpw test`: errors of a model on labelled systems, reported like `dp test`, with dp test's
//! detail files. As dp test, it reports the errors the labels allow (energy without
//! `energy.npy`, force without `force.npy`, virial without `virial.npy` left out).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::backend::Job;
use crate::backend::{Backend, Real};
use crate::data::{find_systems, load_system, load_system_with, Disk, System};
use crate::dist::DeviceLink;
use crate::fitting::traits::{HeadType, TestErr};
use crate::fmt::sci;
use crate::mem::OutOfMemory;
use crate::model::file::write_atomic;
use crate::model::{Model, ModelSpec};
use crate::train::batch::assemble_frames;
use crate::train::predict::{predict_batch, Prediction};

pub struct TestJob {
    pub model: Model,
    /// System folders, or folders searched for systems (as `dpw train` does).
    pub systems: Vec<PathBuf>,
    /// Frames tested per system, the first ones; 0: all (as in DeePMD-kit 3).
    pub nframes: usize,
    pub detail: Option<PathBuf>,
}

/// MAE and RMSE of one quantity, with the number of values they cover.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Err {
    pub mae: f64,
    pub rmse: f64,
    pub size: usize,
}

impl Err {
    fn of(pred: &[f64], label: &[f64], scale: f64) -> Err {
        let n = pred.len().max(1) as f64;
        let d = pred.iter().zip(label).map(|(p, l)| (p - l) * scale);
        Err {
            mae: d.clone().map(f64::abs).sum::<f64>() / n,
            rmse: root_mean_square(d.map(|x| (x, 1.0)), n),
            size: pred.len(),
        }
    }

    /// dp test's weighted average over systems (weights: number of values).
    fn average(errs: &[Err]) -> Err {
        let n: usize = errs.iter().map(|e| e.size).sum();
        Err {
            mae: errs.iter().map(|e| e.mae * e.size as f64).sum::<f64>() / n.max(1) as f64,
            rmse: root_mean_square(
                errs.iter().map(|e| (e.rmse, e.size as f64)),
                n.max(1) as f64,
            ),
            size: n,
        }
    }
}

/// √(Σ wᵢ·xᵢ² / n) of the pairs (xᵢ, wᵢ). The plain sum is taken first, so that the numbers are
/// those of `dp test` bit for bit; where it overflows (errors of 1e160 and more: labels in the
/// wrong unit, say), it is taken again over xᵢ / max|x| and scaled back, as LAPACK's nrm2 does,
/// which cannot overflow: the error is then reported as the huge number it is, not as inf.
fn root_mean_square(xw: impl Iterator<Item = (f64, f64)> + Clone, n: f64) -> f64 {
    let plain: f64 = xw.clone().map(|(x, w)| x * x * w).sum();
    if plain.is_finite() {
        return (plain / n).sqrt();
    }
    let big = xw.clone().map(|(x, _)| x.abs()).fold(0.0, f64::max);
    if !big.is_finite() {
        return big;
    }
    let scaled: f64 = xw.map(|(x, w)| (x / big) * (x / big) * w).sum();
    big * (scaled / n).sqrt()
}

/// Errors of one system: energy, energy per atom, force, virial and per atom, each where the
/// system has its label (dp test's `find_energy`, `find_force`, `find_virial`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemErrors {
    pub nframes: usize,
    pub e: Option<Err>,
    pub e_atom: Option<Err>,
    pub f: Option<Err>,
    pub v: Option<(Err, Err)>,
}

fn report(out: &mut String, s: &SystemErrors) {
    let line = |out: &mut String, name: &str, e: f64, unit: &str| {
        let _ = writeln!(out, "{name:<19}: {} {unit}", sci(e, 6, 0));
    };
    if let (Some(e), Some(ea)) = (&s.e, &s.e_atom) {
        line(out, "Energy MAE", e.mae, "eV");
        line(out, "Energy RMSE", e.rmse, "eV");
        line(out, "Energy MAE/Natoms", ea.mae, "eV");
        line(out, "Energy RMSE/Natoms", ea.rmse, "eV");
    }
    if let Some(f) = &s.f {
        line(out, "Force  MAE", f.mae, "eV/A");
        line(out, "Force  RMSE", f.rmse, "eV/A");
    }
    if let Some((v, va)) = &s.v {
        line(out, "Virial MAE", v.mae, "eV");
        line(out, "Virial RMSE", v.rmse, "eV");
        line(out, "Virial MAE/Natoms", va.mae, "eV");
        line(out, "Virial RMSE/Natoms", va.rmse, "eV");
    }
}

/// Appends rows to a dp test detail file: `# header` for each system, then `%.18e` columns.
fn detail_rows(buf: &mut String, header: &str, rows: impl Iterator<Item = Vec<f64>>) {
    let _ = writeln!(buf, "# {header}");
    for r in rows {
        let cols: Vec<String> = r.iter().map(|&x| sci(x, 18, 0)).collect();
        let _ = writeln!(buf, "{}", cols.join(" "));
    }
}

/// Neighbour slots (frames × atoms × the sum of sel) evaluated per call: the workspace holds
/// every embedding layer's output for each slot, so this bounds the memory `dpw test` needs
/// whatever the number of frames (about 120 MB in float64 for the water example's model).
const SLOTS_PER_CALL: usize = 1 << 15;

/// Frames per call for systems of `natoms` atoms (at least one).
fn frames_per_call(natoms: usize, nnei: usize) -> usize {
    (SLOTS_PER_CALL / (natoms * nnei).max(1)).max(1)
}

/// The end of the call that evaluates frames `start..end` of `sys`, or fewer: a model whose
/// neighbour list is per type takes frames of one composition at a time, so on mixed-type data
/// (frames of their own compositions) a call ends where the composition changes.
fn call_end(spec: &ModelSpec, sys: &System, start: usize, end: usize) -> usize {
    if !sys.mixed || spec.descriptor.is_mixed() {
        return end;
    }
    let first = sys.frame_atype(start);
    (start + 1..end)
        .find(|&f| sys.frame_atype(f) != first)
        .unwrap_or(end)
}

impl Job for TestJob {
    type Output = (Vec<SystemErrors>, String);

    fn run<T: Real, B: Backend<T>>(self, b: &B, _: DeviceLink<T, B::Buf>) -> Result<Self::Output> {
        let mut out = String::new();
        let mut all = Vec::new();
        let mut detail = [
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ];
        if !self.model.spec.fitting.output.is_ener() {
            return self.run_head(b);
        }
        let nnei: usize = self.model.spec.descriptor.slot_sel().iter().sum();
        for path in &find_systems(&Disk, &self.systems, "test")? {
            let sys = load_system(path, &self.model.spec.type_map)?;
            let nf = match self.nframes {
                0 => sys.nframes,
                n => sys.nframes.min(n),
            };
            let n = sys.natoms;
            let (mut e, mut f, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for p in self.predictions(b, path, &sys, nf, nnei)? {
                e.extend(p.energy);
                f.extend(p.force);
                v.extend(p.virial);
            }
            let (le, lf) = (&sys.energy[..nf], &sys.force[..3 * n * nf]);
            let inv_n = 1.0 / n as f64;
            let errs = SystemErrors {
                nframes: nf,
                e: sys.has_energy.then(|| Err::of(&e, le, 1.0)),
                e_atom: sys.has_energy.then(|| Err::of(&e, le, inv_n)),
                f: sys.has_force.then(|| Err::of(&f, lf, 1.0)),
                v: sys.virial.as_ref().map(|lv| {
                    (
                        Err::of(&v, &lv[..9 * nf], 1.0),
                        Err::of(&v, &lv[..9 * nf], inv_n),
                    )
                }),
            };
            let name = path.display();
            if errs.e.is_none() && errs.f.is_none() && errs.v.is_none() {
                tracing::warn!(
                    "{name} has no energy, force or virial labels (energy.npy, force.npy, \
                     virial.npy): its predictions are compared with nothing (-d writes them)"
                );
            }
            let _ = writeln!(out, "# ---------------output of dpw test---------------");
            let _ = writeln!(out, "# testing system : {name}");
            let _ = writeln!(out, "# number of test data : {nf}");
            report(&mut out, &errs);
            let _ = writeln!(out, "# -----------------------------------------------");
            if self.detail.is_some() {
                detail_rows(
                    &mut detail[0],
                    &format!("{name}: data_e pred_e"),
                    (0..nf).map(|i| vec![le[i], e[i]]),
                );
                detail_rows(
                    &mut detail[1],
                    &format!("{name}: data_e pred_e"),
                    (0..nf).map(|i| vec![le[i] * inv_n, e[i] * inv_n]),
                );
                detail_rows(
                    &mut detail[2],
                    &format!("{name}: data_fx data_fy data_fz pred_fx pred_fy pred_fz"),
                    (0..n * nf).map(|k| [&lf[3 * k..3 * k + 3], &f[3 * k..3 * k + 3]].concat()),
                );
                // Without virial labels dp test still writes the predictions, next to zeros.
                let zeros = vec![0.0; 9 * nf];
                let lv = sys.virial.as_deref().unwrap_or(&zeros);
                let cols = ["xx", "xy", "xz", "yx", "yy", "yz", "zx", "zy", "zz"];
                let head = |p: &str| {
                    cols.iter()
                        .map(|c| format!("{p}_v{c}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let h = format!("{name}: {} {}", head("data"), head("pred"));
                let v = v.as_slice();
                let rows = move |s: f64| {
                    (0..nf).map(move |i| {
                        [&lv[9 * i..9 * i + 9], &v[9 * i..9 * i + 9]]
                            .concat()
                            .iter()
                            .map(|x| x * s)
                            .collect()
                    })
                };
                detail_rows(&mut detail[3], &h, rows(1.0));
                detail_rows(&mut detail[4], &h, rows(inv_n));
            }
            all.push(errs);
        }
        if !all.is_empty() {
            // Each over the systems that have its label, as dp test's merge_weighted_errors.
            let avg = |f: &dyn Fn(&SystemErrors) -> Option<Err>| {
                let errs: Vec<Err> = all.iter().filter_map(f).collect();
                (!errs.is_empty()).then(|| Err::average(&errs))
            };
            let mean = SystemErrors {
                nframes: all.iter().map(|s| s.nframes).sum(),
                e: avg(&|s| s.e),
                e_atom: avg(&|s| s.e_atom),
                f: avg(&|s| s.f),
                v: avg(&|s| s.v.map(|v| v.0)).zip(avg(&|s| s.v.map(|v| v.1))),
            };
            let _ = writeln!(out, "# ----------weighted average of errors-----------");
            let _ = writeln!(out, "# number of systems : {}", all.len());
            report(&mut out, &mean);
            let _ = writeln!(out, "# -----------------------------------------------");
        }
        if let Some(prefix) = &self.detail {
            for (suffix, body) in ["e", "e_peratom", "f", "v", "v_peratom"]
                .iter()
                .zip(&detail)
            {
                if !body.is_empty() {
                    write_atomic(
                        &detail_path(prefix, &format!("{suffix}.out")),
                        body.as_bytes(),
                    )?;
                }
            }
        }
        Ok((all, out))
    }
}

impl TestJob {
    /// The predictions for the first `nf` frames of `sys`, a call at a time.
    pub(super) fn predictions<T: Real, B: Backend<T>>(
        &self,
        b: &B,
        path: &Path,
        sys: &System,
        nf: usize,
        nnei: usize,
    ) -> Result<Vec<Prediction>> {
        let mut out = Vec::new();
        let mut per_call = frames_per_call(sys.natoms, nnei);
        let mut start = 0;
        while start < nf {
            let end = call_end(&self.model.spec, sys, start, (start + per_call).min(nf));
            let frames: Vec<usize> = (start..end).collect();
            let batch = assemble_frames(&self.model.spec, sys, &frames, "test")?;
            match predict_batch(b, &self.model, &batch) {
                Ok(p) => {
                    out.push(p);
                    start = end;
                }
                // More frames than the device holds at once: fewer a call, as `dp test`
                // evaluates in pieces; each frame's numbers are its own whatever the call.
                Err(err) if frames.len() > 1 && err.is::<OutOfMemory>() => {
                    per_call = frames.len() / 2;
                    tracing::info!("{err:#}: evaluating {per_call} frames a call");
                }
                Err(err) => {
                    return Err(err.context(format!("system {}", path.display())));
                }
            }
        }
        Ok(out)
    }

    /// `dp test` of a property, DOS or tensor model: the frame output's errors per system and
    /// weighted over them (a DOS's and a tensor's per atom too), and with `-d` one
    /// `{prefix}.{property,dos}.out[.{system}].{frame}` file per frame (DeePMD-kit's
    /// `PropertyTester`, `DosTester`), or a tensor's one `{prefix}.out` of a row per frame
    /// (`DipoleTester`, `PolarTester`).
    fn run_head<T: Real, B: Backend<T>>(self, b: &B) -> Result<(Vec<SystemErrors>, String)> {
        let spec = &self.model.spec;
        let output = &spec.fitting.output;
        let fitting = output.fitting();
        let head = fitting.head().expect("a fitting with a host head");
        let (what, file) = head.test_label();
        let k = fitting.label_width();
        let labels = fitting.labels(None, false);
        let mut tensor_detail = String::new();
        let nnei: usize = spec.descriptor.slot_sel().iter().sum();
        let mut out = String::new();
        let (mut all, mut errs) = (Vec::new(), Vec::new());
        let mut files = Vec::new();
        for (s, path) in find_systems(&Disk, &self.systems, "test")?
            .iter()
            .enumerate()
        {
            let sys = load_system_with(path, &spec.type_map, &labels)?;
            let nf = match self.nframes {
                0 => sys.nframes,
                n => sys.nframes.min(n),
            };
            let pred: Vec<f64> = (self.predictions(b, path, &sys, nf, nnei)?)
                .into_iter()
                .flat_map(|p| p.property)
                .collect();
            let name = path.display();
            let _ = writeln!(out, "# ---------------output of dpw test---------------");
            let _ = writeln!(out, "# testing system : {name}");
            let _ = writeln!(out, "# number of test data : {nf}");
            let Some(label) = &sys.label else {
                tracing::warn!(
                    "{name} has no {file}: its predictions are compared with nothing (-d \
                     writes them)"
                );
                let _ = writeln!(out, "# -----------------------------------------------");
                continue;
            };
            let label = &label.values[..nf * k];
            let err = Err::of(&pred, label, 1.0);
            let natoms = head.test_natoms(&sys.atype[..sys.natoms]);
            head_report(&mut out, head, &err, natoms);
            let _ = writeln!(out, "# -----------------------------------------------");
            if let (Some(_), Some(names)) = (&self.detail, head.detail_columns()) {
                let header = (["data", "pred"].iter())
                    .flat_map(|p| names.iter().map(move |n| format!("{p}_{n}")))
                    .collect::<Vec<_>>()
                    .join(" ");
                let rows = (0..nf)
                    .map(|f| [&label[f * k..(f + 1) * k], &pred[f * k..(f + 1) * k]].concat());
                detail_rows(&mut tensor_detail, &header, rows);
            } else if let Some(prefix) = &self.detail {
                let group = if s == 0 {
                    String::new()
                } else {
                    format!(".{s}")
                };
                for f in 0..nf {
                    let mut body = String::new();
                    detail_rows(
                        &mut body,
                        &format!("{name} - {f}: data_{what} pred_{what}"),
                        (0..k).map(|j| vec![label[f * k + j], pred[f * k + j]]),
                    );
                    files.push((detail_path(prefix, &format!("{what}.out{group}.{f}")), body));
                }
            }
            errs.push((err, natoms));
            all.push(SystemErrors {
                nframes: nf,
                ..SystemErrors::default()
            });
        }
        if !errs.is_empty() {
            let _ = writeln!(out, "# ----------weighted average of errors-----------");
            let _ = writeln!(out, "# number of systems : {}", errs.len());
            let merged: Vec<Err> = errs.iter().map(|e| e.0).collect();
            // DeePMD-kit merges the per-atom errors of each system as they are (its weights are
            // the values' counts), so the /Natoms lines average the systems' own.
            let per_atom: Vec<Err> = (errs.iter())
                .map(|(e, n)| Err {
                    mae: e.mae / *n as f64,
                    rmse: e.rmse / *n as f64,
                    size: e.size,
                })
                .collect();
            let (e, per_atom) = (Err::average(&merged), Err::average(&per_atom));
            head.test_report(&mut out, &e.into(), &per_atom.into(), None);
            let _ = writeln!(out, "# -----------------------------------------------");
        }
        if let (Some(prefix), false) = (&self.detail, tensor_detail.is_empty()) {
            files.push((detail_path(prefix, "out"), tensor_detail));
        }
        for (path, body) in files {
            write_atomic(&path, body.as_bytes())?;
        }
        Ok((all, out))
    }
}

/// `dp test`'s lines for a host head's errors `e` over one system of `natoms` atoms.
fn head_report(out: &mut String, head: &dyn HeadType, e: &Err, natoms: usize) {
    let n = natoms as f64;
    let per_atom = TestErr {
        mae: e.mae / n,
        rmse: e.rmse / n,
    };
    head.test_report(out, &(*e).into(), &per_atom, Some(n.sqrt()));
}

impl From<Err> for TestErr {
    fn from(e: Err) -> Self {
        TestErr {
            mae: e.mae,
            rmse: e.rmse,
        }
    }
}

fn detail_path(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!(".{suffix}"));
    PathBuf::from(s)
}

/// Checks, before anything is evaluated, that the folder the detail files of `prefix` (`-d`) go
/// to exists.
pub fn check_detail_prefix(prefix: &Path) -> Result<()> {
    let first = detail_path(prefix, "e.out");
    let dir = first
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        anyhow::bail!(
            "-d/--detail-file {}: the folder {} does not exist; create it first",
            prefix.display(),
            dir.display()
        );
    }
    Ok(())
}

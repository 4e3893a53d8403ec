//! `lcurve.out` exactly as DeePMD-kit's PT trainer writes it (`print_header` /
//! `print_on_training`): Python's `%` formatting reproduced byte for byte.

use std::fmt::Write as _;

use crate::fmt::sci;

/// The most metrics a loss shows.
const MAX: usize = 5;

/// The displayed metrics of a batch (or an average of batches): those of its loss's `names`
/// that are present (an absent one: the loss term is not active, so the column is absent; NaN =
/// active but without reference data).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metrics {
    /// Every metric the loss can show, sorted alphabetically as DeePMD-kit sorts them.
    names: &'static [&'static str],
    /// Bit i: `names[i]` is shown.
    present: u8,
    values: [f64; MAX],
}

/// The `ener` loss's metrics: the loss's root, then each active term's RMSE.
pub use crate::fitting::ener::METRICS as ENER_METRICS;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::ener(0.0, None, None, None)
    }
}

impl Metrics {
    /// The metrics `names` (sorted; at most 5) with `values[i]` where given, absent where `None`.
    pub fn new(names: &'static [&'static str], values: &[Option<f64>]) -> Self {
        assert!(names.len() <= MAX && values.len() == names.len());
        let mut m = Metrics {
            names,
            present: 0,
            values: [0.0; MAX],
        };
        for (i, v) in values.iter().enumerate() {
            if let Some(v) = v {
                m.present |= 1 << i;
                m.values[i] = *v;
            }
        }
        m
    }

    /// The `ener` loss's: `rmse` = √loss and the active terms' RMSEs.
    pub fn ener(rmse: f64, e: Option<f64>, f: Option<f64>, v: Option<f64>) -> Self {
        Metrics::new(ENER_METRICS, &[Some(rmse), e, f, v])
    }

    /// The value of metric `name`, if shown.
    pub fn get(&self, name: &str) -> Option<f64> {
        let i = self.names.iter().position(|n| *n == name)?;
        (self.present & (1 << i) != 0).then_some(self.values[i])
    }

    /// `(key, value)` of every present metric, keys sorted alphabetically as DeePMD-kit sorts them.
    pub fn entries(&self) -> Vec<(&'static str, f64)> {
        (self.names.iter().enumerate())
            .filter(|(i, _)| self.present & (1 << i) != 0)
            .map(|(i, n)| (*n, self.values[i]))
            .collect()
    }

    /// Every slot's value (0 where absent), for a checkpoint's running sums.
    pub fn slots(&self) -> &[f64] {
        &self.values[..self.names.len()]
    }

    /// The metrics of this shape with the slots' values `v` ([`Metrics::slots`]).
    pub fn with_slots(&self, v: &[f64]) -> Self {
        let mut m = *self;
        m.values[..v.len()].copy_from_slice(v);
        m
    }

    /// `Σ w·m` accumulation (validation's atom-weighted average, `disp_avg`'s running sum).
    pub fn add_scaled(&mut self, other: &Metrics, w: f64) {
        for i in 0..self.names.len() {
            if other.present & (1 << i) != 0 {
                self.values[i] = if self.present & (1 << i) != 0 {
                    self.values[i] + w * other.values[i]
                } else {
                    w * other.values[i]
                };
                self.present |= 1 << i;
            }
        }
    }

    pub fn scaled(&self, s: f64) -> Metrics {
        let mut m = *self;
        m.values.iter_mut().for_each(|x| *x *= s);
        m
    }
}

/// The two header lines (`has_val`: validation columns present).
pub fn header(keys: &[&str], has_val: bool) -> String {
    header_of(&[("", keys, has_val)])
}

/// One data line: `step` is the 1-based display step.
pub fn line(step: usize, lr: f64, trn: &Metrics, val: Option<&Metrics>) -> String {
    line_of(step, lr, &[(trn, val)])
}

/// One task's columns in a multi-task lcurve.out: its metrics, suffixed `_<task>` in the
/// header as DeePMD-kit's (`rmse_e_val_water rmse_e_trn_water`), tasks in `model_dict` order.
pub struct TaskColumns<'a> {
    pub task: &'a str,
    pub trn: &'a Metrics,
    pub val: Option<&'a Metrics>,
}

/// The header of a multi-task lcurve.out.
pub fn task_header(cols: &[TaskColumns]) -> String {
    let keys: Vec<Vec<&str>> = (cols.iter())
        .map(|c| c.trn.entries().iter().map(|e| e.0).collect())
        .collect();
    let suffixes: Vec<String> = cols.iter().map(|c| format!("_{}", c.task)).collect();
    let parts: Vec<(&str, &[&str], bool)> = (cols.iter().zip(&keys).zip(&suffixes))
        .map(|((c, k), s)| (s.as_str(), k.as_slice(), c.val.is_some()))
        .collect();
    header_of(&parts)
}

/// A data line of a multi-task lcurve.out.
pub fn task_line(step: usize, lr: f64, cols: &[TaskColumns]) -> String {
    let parts: Vec<(&Metrics, Option<&Metrics>)> = cols.iter().map(|c| (c.trn, c.val)).collect();
    line_of(step, lr, &parts)
}

/// Header lines of column groups `(suffix, metric keys, has validation)`.
fn header_of(parts: &[(&str, &[&str], bool)]) -> String {
    let mut s = format!("# {:<5}", "step");
    for (suffix, keys, has_val) in parts {
        for k in *keys {
            if *has_val {
                let _ = write!(
                    s,
                    "   {:>11} {:>11}",
                    format!("{k}_val{suffix}"),
                    format!("{k}_trn{suffix}")
                );
            } else {
                let _ = write!(s, "   {:>11}", format!("{k}_trn{suffix}"));
            }
        }
    }
    let _ = writeln!(s, "   {:<8}", "lr");
    s.push_str("# If there is no available reference data, rmse_*_{val,trn} will print nan\n");
    s
}

/// A data line of column groups `(training, validation)`.
fn line_of(step: usize, lr: f64, parts: &[(&Metrics, Option<&Metrics>)]) -> String {
    let mut s = format!("{step:7}");
    for (trn, val) in parts {
        let t = trn.entries();
        match val {
            Some(v) => {
                for ((_, tv), (_, vv)) in t.iter().zip(v.entries()) {
                    let _ = write!(s, "   {} {}", sci(vv, 2, 11), sci(*tv, 2, 11));
                }
            }
            None => {
                for (_, tv) in &t {
                    let _ = write!(s, "   {}", sci(*tv, 2, 11));
                }
            }
        }
    }
    let _ = writeln!(s, "   {}", sci(lr, 1, 8));
    s
}

/// The step of an lcurve.out data line (`None` for comments and blank lines).
pub fn line_step(l: &str) -> Option<usize> {
    if l.trim_start().starts_with('#') {
        return None;
    }
    l.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_e_format_of_lcurve_fields() {
        // Values checked against CPython's "%11.2e" / "%8.1e".
        assert_eq!(sci(0.012345, 2, 11), "   1.23e-02");
        assert_eq!(sci(1234.5, 2, 11), "   1.23e+03");
        assert_eq!(sci(0.0, 2, 11), "   0.00e+00");
        assert_eq!(sci(-0.5, 2, 11), "  -5.00e-01");
        assert_eq!(sci(1e-100, 2, 11), "  1.00e-100");
        assert_eq!(sci(f64::NAN, 2, 11), "        nan");
        assert_eq!(sci(1e-3, 1, 8), " 1.0e-03");
        assert_eq!(sci(9.96e-4, 1, 8), " 1.0e-03");
        assert_eq!(sci(3.51e-8, 1, 8), " 3.5e-08");
        assert_eq!(sci(9.999, 2, 11), "   1.00e+01");
    }

    #[test]
    fn header_and_line() {
        let keys = ["rmse", "rmse_e", "rmse_f"];
        assert_eq!(
            header(&keys, true),
            "# step       rmse_val    rmse_trn    rmse_e_val  rmse_e_trn    rmse_f_val  rmse_f_trn   lr      \n\
             # If there is no available reference data, rmse_*_{val,trn} will print nan\n"
        );
        assert_eq!(
            header(&keys[..1], false),
            "# step       rmse_trn   lr      \n\
             # If there is no available reference data, rmse_*_{val,trn} will print nan\n"
        );
        let m = Metrics::ener(12.5, Some(0.0123), Some(0.4), None);
        assert_eq!(
            line(100, 1e-3, &m, Some(&m.scaled(2.0))),
            "    100      2.50e+01    1.25e+01      2.46e-02    1.23e-02      8.00e-01    4.00e-01    1.0e-03\n"
        );
        assert_eq!(line_step("    100      2.50e+01"), Some(100));
        // DeePMD-kit 3.2.0's multi-task lcurve.out (tests/reference/multitask/pre_mt): each
        // task's columns suffixed with its name, a task without validation data with none.
        let water = Metrics::ener(26.6, Some(1.6), Some(0.836), None);
        let alloy = Metrics::ener(22.0, Some(0.193), Some(0.691), Some(0.343));
        let cols = [
            TaskColumns {
                task: "water",
                trn: &water,
                val: None,
            },
            TaskColumns {
                task: "alloy",
                trn: &alloy,
                val: Some(&alloy),
            },
        ];
        let theirs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/reference/multitask/pre_mt/lcurve.out"
        ))
        .unwrap();
        let head: String = theirs.split_inclusive('\n').take(2).collect();
        assert_eq!(task_header(&cols), head);
        assert!(task_line(1, 1e-3, &cols).starts_with(
            "      1      2.66e+01      1.60e+00      8.36e-01      2.20e+01    2.20e+01"
        ));
        assert_eq!(line_step("# step"), None);
    }
}

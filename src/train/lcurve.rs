//! `lcurve.out` exactly as DeePMD-kit's PT trainer writes it (`print_header` /
//! `print_on_training`): Python's `%` formatting reproduced byte for byte.

use std::fmt::Write as _;

use crate::fmt::sci;

/// The displayed metrics of a batch (or an average of batches): `None` = the loss term is not
/// active, so the column is absent; NaN = active but without reference data.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metrics {
    pub rmse: f64,
    pub rmse_e: Option<f64>,
    pub rmse_f: Option<f64>,
    pub rmse_v: Option<f64>,
}

impl Metrics {
    /// `(key, value)` of every present metric, keys sorted alphabetically as DeePMD-kit sorts them.
    pub fn entries(&self) -> Vec<(&'static str, f64)> {
        let mut v = vec![("rmse", self.rmse)];
        for (k, x) in [
            ("rmse_e", self.rmse_e),
            ("rmse_f", self.rmse_f),
            ("rmse_v", self.rmse_v),
        ] {
            if let Some(x) = x {
                v.push((k, x));
            }
        }
        v
    }

    /// `Σ w·m` accumulation (validation's atom-weighted average, `disp_avg`'s running sum).
    pub fn add_scaled(&mut self, other: &Metrics, w: f64) {
        self.rmse += w * other.rmse;
        let add = |a: &mut Option<f64>, b: Option<f64>| {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0.0) + w * b);
            }
        };
        add(&mut self.rmse_e, other.rmse_e);
        add(&mut self.rmse_f, other.rmse_f);
        add(&mut self.rmse_v, other.rmse_v);
    }

    pub fn scaled(&self, s: f64) -> Metrics {
        Metrics {
            rmse: self.rmse * s,
            rmse_e: self.rmse_e.map(|x| x * s),
            rmse_f: self.rmse_f.map(|x| x * s),
            rmse_v: self.rmse_v.map(|x| x * s),
        }
    }
}

/// The two header lines (`has_val`: validation columns present).
pub fn header(keys: &[&str], has_val: bool) -> String {
    let mut s = format!("# {:<5}", "step");
    for k in keys {
        if has_val {
            let _ = write!(
                s,
                "   {:>11} {:>11}",
                format!("{k}_val"),
                format!("{k}_trn")
            );
        } else {
            let _ = write!(s, "   {:>11}", format!("{k}_trn"));
        }
    }
    let _ = writeln!(s, "   {:<8}", "lr");
    s.push_str("# If there is no available reference data, rmse_*_{val,trn} will print nan\n");
    s
}

/// One data line: `step` is the 1-based display step.
pub fn line(step: usize, lr: f64, trn: &Metrics, val: Option<&Metrics>) -> String {
    let mut s = format!("{step:7}");
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
        let m = Metrics {
            rmse: 12.5,
            rmse_e: Some(0.0123),
            rmse_f: Some(0.4),
            rmse_v: None,
        };
        assert_eq!(
            line(100, 1e-3, &m, Some(&m.scaled(2.0))),
            "    100      2.50e+01    1.25e+01      2.46e-02    1.23e-02      8.00e-01    4.00e-01    1.0e-03\n"
        );
        assert_eq!(line_step("    100      2.50e+01"), Some(100));
        assert_eq!(line_step("# step"), None);
    }
}

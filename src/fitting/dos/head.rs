//! The DOS head on the host: the nets' outputs y_i (`numb_dos` per centre) to atomic and frame
//! DOS, and DeePMD-kit's `DOSLoss` with its seed ∂L/∂y_i (docs/deepmd-spec.md §16).

use super::config::TERMS;
use crate::fitting::head::HeadLabels;

/// The loss sums one batch leaves for the metrics: the loss, then the mean squared error of each
/// term in [`TERMS`] order (atomic DOS, atomic CDF, frame DOS, frame CDF).
pub const NSUMS: usize = 5;

/// The metrics the DOS loss can show, sorted as DeePMD-kit sorts lcurve.out's columns, and the
/// term of [`TERMS`] each is the root of.
pub const METRICS: &[&str] = &[
    "rmse_global_cdf",
    "rmse_global_dos",
    "rmse_local_cdf",
    "rmse_local_dos",
];
const METRIC_TERM: [usize; 4] = [3, 2, 1, 0];

/// Cumulative sums along each row of `k` values.
fn cumsum(x: &[f64], k: usize) -> Vec<f64> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(k) {
        for j in 1..k {
            row[j] += row[j - 1];
        }
    }
    out
}

/// The mean squared difference of `pred` and `label` (cumulative sums along rows of `k` where
/// `cdf`), and its gradient in `pred` scaled by `pref`, added to `grad`.
fn term(pred: &[f64], label: &[f64], k: usize, cdf: bool, pref: f64, grad: &mut [f64]) -> f64 {
    let (p, l) = match cdf {
        true => (cumsum(pred, k), cumsum(label, k)),
        false => (pred.to_vec(), label.to_vec()),
    };
    let n = p.len() as f64;
    let mse = p
        .iter()
        .zip(&l)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        / n;
    let mut g: Vec<f64> = p
        .iter()
        .zip(&l)
        .map(|(a, b)| pref * 2.0 * (a - b) / n)
        .collect();
    if cdf {
        // The adjoint of a cumulative sum is the reversed one.
        for row in g.chunks_exact_mut(k) {
            for j in (0..k - 1).rev() {
                row[j] += row[j + 1];
            }
        }
    }
    grad.iter_mut().zip(&g).for_each(|(a, b)| *a += b);
    mse
}

/// DeePMD-kit's `DOSLoss` of the atomic DOS `atomic` (`[nframes·natoms][k]`, batch-atom order)
/// and frame DOS `frame` (`[nframes][k]`) against `labels`, at prefactors `pref` ([`TERMS`]
/// order, 0 for an inactive term): the loss sums ([`NSUMS`]; a term without labels NaN) and
/// ∂L/∂atomic, ∂L/∂frame.
pub fn loss(
    pref: [f64; 4],
    k: usize,
    atomic: &[f64],
    frame: &[f64],
    labels: &HeadLabels,
) -> ([f64; NSUMS], Vec<f64>, Vec<f64>) {
    let mut sums = [0.0; NSUMS];
    let (mut da, mut df) = (vec![0.0; atomic.len()], vec![0.0; frame.len()]);
    for (t, name) in TERMS.iter().enumerate() {
        let cdf = name.ends_with("cdf");
        let (pred, label, grad) = match t {
            0 | 1 => (atomic, labels.atomic.as_deref(), &mut da),
            _ => (frame, labels.frame.as_deref(), &mut df),
        };
        sums[1 + t] = match label {
            Some(l) => {
                let mse = term(pred, l, k, cdf, pref[t], grad);
                sums[0] += pref[t] * mse;
                mse
            }
            None => f64::NAN,
        };
    }
    (sums, da, df)
}

/// The metrics of loss sums `sums` of a batch of frames of `natoms` atoms: for each of
/// [`METRICS`], its root (the frame terms per atom), where its term is `active`.
pub fn metric_values(active: [bool; 4], sums: &[f64], natoms: usize) -> [Option<f64>; 4] {
    std::array::from_fn(|m| {
        let t = METRIC_TERM[m];
        let per = if t >= 2 { 1.0 / natoms as f64 } else { 1.0 };
        active[t].then(|| sums[1 + t].sqrt() * per)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ∂L/∂atomic and ∂L/∂frame against central differences of the loss, every term active.
    #[test]
    fn loss_gradient_matches_finite_differences() {
        let k = 3;
        let atomic = [
            0.3, 1.2, -0.5, 2.0, 0.1, 0.7, -1.1, 0.4, 0.9, 1.5, -0.2, 0.6,
        ];
        let frame = [2.1, -0.3, 1.7, 0.2, 1.1, -0.8];
        let la = [0.1, 1.0, -0.2, 1.0, 0.4, 0.2, -1.0, 0.0, 1.2, 1.1, 0.3, 0.1];
        let lf = [1.9, 0.1, 1.0, 0.5, 0.7, -0.6];
        let labels = HeadLabels {
            frame: Some(lf.to_vec()),
            atomic: Some(la.to_vec()),
        };
        let pref = [3.0, 0.2, 1.5, 0.4];
        let (_, da, df) = loss(pref, k, &atomic, &frame, &labels);
        let h = 1e-6;
        for (i, g) in da.iter().enumerate() {
            let at = |s: f64| {
                let mut a = atomic;
                a[i] += s;
                loss(pref, k, &a, &frame, &labels).0[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!((fd - g).abs() < 1e-7, "atomic {i}: {g} vs {fd}");
        }
        for (i, g) in df.iter().enumerate() {
            let at = |s: f64| {
                let mut f = frame;
                f[i] += s;
                loss(pref, k, &atomic, &f, &labels).0[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!((fd - g).abs() < 1e-7, "frame {i}: {g} vs {fd}");
        }
    }
}

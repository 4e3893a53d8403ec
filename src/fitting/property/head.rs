//! The property head on the host: the nets' outputs y_i (`task_dim` per centre) to atomic and
//! frame properties, and DeePMD-kit's `PropertyLoss` with its seed ∂L/∂y_i for the nets'
//! reverse pass (docs/deepmd-spec.md §15).

use super::config::{LossFunc, PropertyLossConfig};
use super::PropertySpec;
use crate::fitting::OutStat;

/// The loss sums one batch leaves for the metrics: the loss, then Σ smooth_l1, Σ|Δ|, ΣΔ²,
/// Σ|Δ/(label + 10⁻³)| over frames and components (Δ = label − prediction, each per atom where
/// the property is extensive, as DeePMD-kit compares them).
pub const NSUMS: usize = 5;

/// `smooth_l1(d)` of PyTorch, and its derivative in d.
fn smooth_l1(d: f64, beta: f64) -> (f64, f64) {
    if d.abs() < beta {
        (0.5 * d * d / beta, d / beta)
    } else {
        (d.abs() - 0.5 * beta, sign(d))
    }
}

/// PyTorch's sign: 0 at 0.
fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// DeePMD-kit's `PropertyLoss` of frame predictions `pred` against `label` (`[nframes][k]`):
/// the loss sums ([`NSUMS`]) and ∂L/∂pred. The comparison is per atom where the property is
/// extensive, and the loss's terms are normalised by the output bias and std of type 0, as
/// DeePMD-kit's (`out_bias[0][0]`, `out_std[0][0]`).
pub fn loss(
    cfg: &PropertyLossConfig,
    p: &PropertySpec,
    stat: &OutStat,
    natoms: usize,
    pred: &[f64],
    label: &[f64],
) -> ([f64; NSUMS], Vec<f64>) {
    let k = p.task_dim;
    let per = if p.intensive {
        1.0
    } else {
        1.0 / natoms as f64
    };
    let n = pred.len() as f64;
    let mut sums = [0.0; NSUMS];
    let mut grad = vec![0.0; pred.len()];
    // The rmse loss is the root of a mean: its gradient needs the sum first.
    let mut sq = 0.0;
    for (i, (&pv, &lv)) in pred.iter().zip(label).enumerate() {
        let (pn, ln) = (pv * per, lv * per);
        let (ob, os) = (stat.bias[i % k], stat.std[i % k]);
        let d = (ln - ob) / os - (pn - ob) / os;
        sq += d * d;
        // ∂L/∂pn of this element (the rmse loss's after the loop).
        let (term, dpn) = match cfg.loss_func {
            LossFunc::SmoothMae => {
                let (v, dv) = smooth_l1(d, cfg.beta);
                (v, -dv / os)
            }
            LossFunc::Mae => (d.abs(), -sign(d) / os),
            LossFunc::Mse => (d * d, -2.0 * d / os),
            LossFunc::Rmse => (0.0, -2.0 * d / os),
            LossFunc::Mape => {
                let r = (ln - pn) / (ln + 1e-3);
                (r.abs() / n, -sign(r) / (ln + 1e-3) / n)
            }
        };
        sums[0] += term;
        grad[i] = dpn * per;
        let delta = ln - pn;
        sums[1] += smooth_l1(delta, cfg.beta).0;
        sums[2] += delta.abs();
        sums[3] += delta * delta;
        sums[4] += (delta / (ln + 1e-3)).abs();
    }
    if cfg.loss_func == LossFunc::Rmse {
        let rmse = (sq / n).sqrt();
        sums[0] = rmse;
        let s = if rmse > 0.0 {
            1.0 / (2.0 * rmse * n)
        } else {
            0.0
        };
        grad.iter_mut().for_each(|g| *g *= s);
    }
    (sums, grad)
}

/// The metrics `cfg.metric` asks for from the summed [`NSUMS`] of `nvalues` frame components:
/// `(name, value)` in DeePMD-kit's names.
pub fn metric_values(cfg: &PropertyLossConfig, sums: &[f64], nvalues: usize) -> [Option<f64>; 5] {
    let n = nvalues as f64;
    let value = |f: LossFunc| match f {
        LossFunc::SmoothMae => sums[1] / n,
        LossFunc::Mae => sums[2] / n,
        LossFunc::Mse => sums[3] / n,
        LossFunc::Rmse => (sums[3] / n).sqrt(),
        LossFunc::Mape => sums[4] / n,
    };
    // In the order of METRICS.
    [
        LossFunc::Mae,
        LossFunc::Mape,
        LossFunc::Mse,
        LossFunc::Rmse,
        LossFunc::SmoothMae,
    ]
    .map(|f| cfg.metric.contains(&f).then(|| value(f)))
}

/// The metrics a property loss can show, sorted as DeePMD-kit sorts lcurve.out's columns.
pub const METRICS: &[&str] = &["mae", "mape", "mse", "rmse", "smooth_mae"];

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(f: LossFunc) -> PropertyLossConfig {
        PropertyLossConfig {
            loss_func: f,
            metric: vec![LossFunc::Mae],
            beta: 0.7,
        }
    }

    /// ∂L/∂pred of every loss function against central differences of its loss.
    #[test]
    fn loss_gradient_matches_finite_differences() {
        for intensive in [false, true] {
            let p = PropertySpec {
                property_name: "x".into(),
                task_dim: 2,
                intensive,
                distinguish_types: true,
            };
            let stat = OutStat {
                bias: &[0.3, -1.0],
                std: &[2.0, 0.5],
            };
            let pred = [1.0, 2.5, -0.4, 7.0];
            let label = [1.2, 1.0, -0.41, 3.0];
            for f in LossFunc::ALL.map(|(f, _)| f) {
                let c = cfg(f);
                let (_, g) = loss(&c, &p, &stat, 3, &pred, &label);
                for i in 0..pred.len() {
                    let h = 1e-6;
                    let at = |s: f64| {
                        let mut q = pred;
                        q[i] += s;
                        loss(&c, &p, &stat, 3, &q, &label).0[0]
                    };
                    let fd = (at(h) - at(-h)) / (2.0 * h);
                    assert!(
                        (fd - g[i]).abs() < 1e-7 * (1.0 + fd.abs()),
                        "{f:?} intensive {intensive}: element {i}: {} vs {fd}",
                        g[i]
                    );
                }
            }
        }
    }

    #[test]
    fn smooth_l1_is_pytorch_s() {
        // torch.nn.functional.smooth_l1_loss(x, 0, beta=0.7) at x = 0.35 and 2.0.
        assert_eq!(smooth_l1(0.35, 0.7).0, 0.5 * 0.35 * 0.35 / 0.7);
        assert_eq!(smooth_l1(2.0, 0.7).0, 2.0 - 0.35);
    }
}

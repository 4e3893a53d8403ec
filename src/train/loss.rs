//! DeePMD-kit's `ener` loss around the backend's residual op (docs/deepmd-spec.md §9): prefactor interpolation,
//! the loss value and the displayed RMSEs, from the per-batch sums of squared errors.

use crate::backend::{LossSums, Prefactors};
use crate::config::LossConfig;

use super::lcurve::Metrics;

#[derive(Clone, Debug, PartialEq)]
pub struct Loss {
    pub cfg: LossConfig,
    pub start_lr: f64,
}

/// Prefactors of one batch: as DeePMD-kit defines them, and as the backend's loss op takes them
/// (which divides energy and virial by N itself; `intensive_ener_virial` asks for N²).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchPrefactors {
    pub nominal: Prefactors,
    pub op: Prefactors,
    /// The batch has virial labels.
    pub find_v: bool,
}

impl Loss {
    pub fn new(cfg: &LossConfig, start_lr: f64) -> Self {
        Loss {
            cfg: cfg.clone(),
            start_lr,
        }
    }

    /// `pref = limit + (start − limit)·lr/start_lr` for active terms, 0 otherwise; the virial
    /// one times `find_virial`.
    pub fn prefactors(&self, pref_lr: f64, natoms: usize, find_v: bool) -> BatchPrefactors {
        let c = &self.cfg;
        let coef = pref_lr / self.start_lr;
        let interp = |on: bool, start: f64, limit: f64| {
            if on {
                limit + (start - limit) * coef
            } else {
                0.0
            }
        };
        let nominal = Prefactors {
            e: interp(c.has_e(), c.start_pref_e, c.limit_pref_e),
            f: interp(c.has_f(), c.start_pref_f, c.limit_pref_f),
            v: interp(c.has_v(), c.start_pref_v, c.limit_pref_v) * f64::from(u8::from(find_v)),
        };
        let extra = if c.intensive_ener_virial {
            1.0 / natoms as f64
        } else {
            1.0
        };
        BatchPrefactors {
            nominal,
            op: Prefactors {
                e: nominal.e * extra,
                f: nominal.f,
                v: nominal.v * extra,
            },
            find_v,
        }
    }

    /// The loss and displayed metrics of a batch of `nframes` frames of `natoms` atoms.
    pub fn metrics(
        &self,
        sums: &LossSums,
        nframes: usize,
        natoms: usize,
        p: &BatchPrefactors,
    ) -> Metrics {
        let (nf, n) = (nframes as f64, natoms as f64);
        let l_e = sums.e2 / nf;
        let l_f = sums.f2 / (3.0 * n * nf);
        let l_v = sums.v2 / (9.0 * nf);
        let loss = p.op.e * l_e / n + p.op.f * l_f + p.op.v * l_v / n;
        Metrics {
            rmse: loss.sqrt(),
            rmse_e: self.cfg.has_e().then(|| l_e.sqrt() / n),
            rmse_f: self.cfg.has_f().then(|| l_f.sqrt()),
            rmse_v: self
                .cfg
                .has_v()
                .then(|| if p.find_v { l_v.sqrt() / n } else { f64::NAN }),
        }
    }

    /// Which metrics are shown, with zero values (the shape of [`Metrics`] for this loss).
    pub fn zero_metrics(&self) -> Metrics {
        Metrics {
            rmse: 0.0,
            rmse_e: self.cfg.has_e().then_some(0.0),
            rmse_f: self.cfg.has_f().then_some(0.0),
            rmse_v: self.cfg.has_v().then_some(0.0),
        }
    }
}

/// Squared-error sums of a prediction against labels (host side, for validation).
pub fn host_sums(
    pred: (&[f64], &[f64], &[f64]),
    label: (&[f64], &[f64], Option<&[f64]>),
) -> LossSums {
    let sq = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    LossSums {
        e2: sq(pred.0, label.0),
        f2: sq(pred.1, label.1),
        v2: label.2.map_or(0.0, |lv| sq(pred.2, lv)),
    }
}

//! The loss of a training step as the host sees it: DeePMD-kit's `ener` loss around the
//! backend's residual op (docs/deepmd-spec.md §9: prefactor interpolation, the loss value and
//! the displayed RMSEs, from the per-batch sums of squared errors), or a host head's
//! ([`crate::fitting::traits::LossType`]).

use crate::backend::{LossSums, Prefactors};
use crate::config::{EnerLossConfig, LossConfig, LossKind};
use crate::model::FitOutput;

use super::lcurve::Metrics;
use super::step::StepLoss;

#[derive(Clone, Debug, PartialEq)]
pub struct Loss {
    pub cfg: LossConfig,
    pub start_lr: f64,
    /// The fitting's values per atom (a property's task_dim; 1 for an energy).
    pub dim_out: usize,
    /// The metrics of the model's fitting, lcurve.out's columns of a host head's loss.
    pub fit_metrics: &'static [&'static str],
    /// The loss sums a step leaves on the device: the backend's three of `ener`, a head's own.
    nsums: usize,
}

/// Prefactors of one batch: as DeePMD-kit defines them, and as the backend's loss op takes them
/// (which divides energy and virial by N itself; `intensive_ener_virial` asks for N²).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchPrefactors {
    pub nominal: Prefactors,
    pub op: Prefactors,
    /// The batch has virial labels.
    pub find_v: bool,
    /// lr/start_lr, which a host head's prefactors follow.
    pub coef: f64,
}

impl Loss {
    /// The loss `cfg` of a model of fitting `output`.
    pub fn new(cfg: &LossConfig, start_lr: f64, output: &FitOutput) -> Self {
        let fitting = output.fitting();
        Loss {
            cfg: cfg.clone(),
            start_lr,
            dim_out: fitting.dim(),
            fit_metrics: fitting.metrics(),
            nsums: fitting.head().map_or(LossSums::LEN, |h| h.nsums()),
        }
    }

    /// The loss sums a step leaves on the device.
    pub fn nsums(&self) -> usize {
        self.nsums
    }

    /// What the step needs of the loss, at prefactors `p`.
    pub fn step_loss(&self, p: &BatchPrefactors) -> StepLoss<'_> {
        match &self.cfg {
            LossConfig::Ener(_) => StepLoss::Ener(p.op),
            loss => StepLoss::Host { loss, coef: p.coef },
        }
    }

    /// `pref = limit + (start − limit)·lr/start_lr` for active terms, 0 otherwise; the virial
    /// one times `find_virial`. A host head's loss has none here (all 0): it reads `coef`.
    pub fn prefactors(&self, pref_lr: f64, natoms: usize, find_v: bool) -> BatchPrefactors {
        let coef = pref_lr / self.start_lr;
        let LossConfig::Ener(c) = &self.cfg else {
            let zero = Prefactors {
                e: 0.0,
                f: 0.0,
                v: 0.0,
            };
            return BatchPrefactors {
                nominal: zero,
                op: zero,
                find_v,
                coef,
            };
        };
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
            coef,
        }
    }

    /// The loss and displayed metrics of a batch of `nframes` frames of `natoms` atoms, from its
    /// loss sums ([`Loss::nsums`]).
    pub fn metrics(
        &self,
        sums: &[f64],
        nframes: usize,
        natoms: usize,
        p: &BatchPrefactors,
    ) -> Metrics {
        let c = match self.cfg.kind() {
            LossKind::Ener(c) => c,
            LossKind::Host(host) => {
                let v = host.metric_values(sums, nframes * self.dim_out, natoms);
                return Metrics::new(self.fit_metrics, &v);
            }
        };
        let sums = LossSums::from_values(sums);
        let (nf, n) = (nframes as f64, natoms as f64);
        let l_e = sums.e2 / nf;
        let l_f = sums.f2 / (3.0 * n * nf);
        let l_v = sums.v2 / (9.0 * nf);
        let loss = p.op.e * l_e / n + p.op.f * l_f + p.op.v * l_v / n;
        Metrics::ener(
            loss.sqrt(),
            c.has_e().then(|| l_e.sqrt() / n),
            c.has_f().then(|| l_f.sqrt()),
            (c.has_v()).then(|| if p.find_v { l_v.sqrt() / n } else { f64::NAN }),
        )
    }

    /// Whether a batch's loss is finite: the `ener` loss's root (its `rmse`), a host head's loss
    /// (whose metrics may be NaN where a batch lacks a term's labels).
    pub fn is_finite(&self, sums: &[f64], m: &Metrics) -> bool {
        match self.cfg.kind() {
            LossKind::Ener(_) => m.get("rmse").is_some_and(f64::is_finite),
            LossKind::Host(_) => sums[0].is_finite(),
        }
    }

    /// Which metrics are shown, with zero values (the shape of [`Metrics`] for this loss).
    pub fn zero_metrics(&self) -> Metrics {
        match self.cfg.kind() {
            LossKind::Ener(c) => ener_zero(c),
            LossKind::Host(host) => {
                // The values of empty sums may be 0/0: only which are shown matters.
                let shown = host.metric_values(&vec![0.0; self.nsums], 1, 1);
                let v: Vec<_> = shown.iter().map(|v| v.map(|_| 0.0)).collect();
                Metrics::new(self.fit_metrics, &v)
            }
        }
    }
}

fn ener_zero(c: &EnerLossConfig) -> Metrics {
    Metrics::ener(
        0.0,
        c.has_e().then_some(0.0),
        c.has_f().then_some(0.0),
        c.has_v().then_some(0.0),
    )
}

/// Squared-error sums of a prediction against labels (host side, for validation).
pub fn host_sums(
    pred: (&[f64], &[f64], &[f64]),
    label: (&[f64], &[f64], Option<&[f64]>),
) -> [f64; 3] {
    let sq = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    [
        sq(pred.0, label.0),
        sq(pred.1, label.1),
        label.2.map_or(0.0, |lv| sq(pred.2, lv)),
    ]
}

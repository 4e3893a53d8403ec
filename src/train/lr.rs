//! DeePMD-kit's exponential learning-rate schedule (docs/deepmd-spec.md §10, `dpmodel/utils/learning_rate.py`),
//! with its optional linear warmup.
//!
//! ```text
//! T = numb_steps − warmup_steps
//! decay_steps ← 100 if T/10 > 100 else T/100 + 1     when decay_rate is not given and decay_steps ≥ T
//! decay_rate  = exp(ln(max(stop_lr, 1e-10)/start_lr) / (T/decay_steps))   unless given
//! lr(t)       = f0·start_lr + (1 − f0)·start_lr·t/warmup_steps             for t < warmup_steps
//! lr(t)       = max(start_lr · decay_rate^k, stop_lr),  k = ⌊τ/decay_steps⌋ (τ/decay_steps if smooth),
//!               τ = t − warmup_steps
//! ```

use crate::config::LearningRateConfig;

#[derive(Clone, Debug, PartialEq)]
pub struct LrSchedule {
    pub start_lr: f64,
    pub stop_lr: f64,
    /// Effective decay period (after the shrink for short runs).
    pub decay_steps: usize,
    pub decay_rate: f64,
    pub smooth: bool,
    pub warmup_steps: usize,
    pub warmup_start_factor: f64,
    /// Steps of the decay phase, `numb_steps − warmup_steps`.
    pub decay_phase: usize,
}

impl LrSchedule {
    /// The schedule of a run of `numb_steps` steps.
    pub fn new(cfg: &LearningRateConfig, numb_steps: usize) -> Self {
        let start_lr = cfg.start_lr;
        let stop_lr = cfg.final_lr();
        let warmup_steps = cfg.warmup_steps_for(numb_steps).min(numb_steps);
        let t = numb_steps - warmup_steps;
        let mut decay_steps = cfg.decay_steps;
        if cfg.decay_rate.is_none() && decay_steps >= t {
            decay_steps = if t / 10 > 100 { 100 } else { t / 100 + 1 };
        }
        let decay_rate = cfg.decay_rate.unwrap_or_else(|| {
            if t == 0 {
                // Nothing to decay over (no steps, or all warmup).
                1.0
            } else {
                ((stop_lr.max(1e-10) / start_lr).ln() / (t as f64 / decay_steps as f64)).exp()
            }
        });
        LrSchedule {
            start_lr,
            stop_lr,
            decay_steps,
            decay_rate,
            smooth: cfg.smooth,
            warmup_steps,
            warmup_start_factor: cfg.warmup_start_factor,
            decay_phase: t,
        }
    }

    /// The learning rate of (0-based) step `step`.
    pub fn value(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            let f0 = self.warmup_start_factor * self.start_lr;
            return f0 + (self.start_lr - f0) * step as f64 / self.warmup_steps as f64;
        }
        let tau = step - self.warmup_steps;
        let k = if self.smooth {
            tau as f64 / self.decay_steps as f64
        } else {
            (tau / self.decay_steps) as f64
        };
        (self.start_lr * self.decay_rate.powf(k)).max(self.stop_lr)
    }

    /// The lr that sets the loss prefactors at `step`: DeePMD-kit's PT trainer uses `start_lr`
    /// during warmup (so the prefactors stay at their start values), the step's lr afterwards.
    pub fn pref_lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            self.start_lr
        } else {
            self.value(step)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: serde_json::Value) -> LearningRateConfig {
        let full = json!({
            "model": {"type_map": ["O", "H"], "descriptor": {"type": "se_e2_a", "sel": [4, 4]}},
            "learning_rate": v,
            "training": {"training_data": {"systems": ["x"]}, "numb_steps": 1},
        });
        crate::config::Config::from_value(&full, std::path::Path::new("."))
            .unwrap()
            .learning_rate
    }

    #[test]
    fn water_example_1000_steps_shrinks_decay_steps() {
        let c = cfg(json!({"start_lr": 1e-3, "stop_lr": 3.51e-8, "decay_steps": 5000}));
        let s = LrSchedule::new(&c, 1000);
        assert_eq!(s.decay_steps, 11);
        assert!((s.decay_rate - 0.8934).abs() < 1e-4, "{}", s.decay_rate);
        assert_eq!(s.value(0), 1e-3);
        assert_eq!(s.value(10), 1e-3);
        assert_eq!(s.value(11), 1e-3 * s.decay_rate);
        // 999/11 = 90 decays: still above stop_lr (91 would reach it).
        assert!(s.value(999) > 3.51e-8);
    }

    #[test]
    fn long_run_rate_and_clip() {
        let c = cfg(json!({"start_lr": 1e-3, "stop_lr": 3.51e-8, "decay_steps": 5000}));
        let s = LrSchedule::new(&c, 1_000_000);
        assert_eq!(s.decay_steps, 5000);
        assert!((s.decay_rate - 0.9500).abs() < 1e-4);
        assert_eq!(s.value(2_000_000), 3.51e-8);
    }

    #[test]
    fn explicit_rate_keeps_decay_steps_and_clips_at_stop_lr() {
        let c =
            cfg(json!({"start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 200, "decay_rate": 0.5}));
        let s = LrSchedule::new(&c, 100);
        assert_eq!((s.decay_steps, s.decay_rate), (200, 0.5));
        assert_eq!(s.value(199), 1e-3);
        assert_eq!(s.value(200), 5e-4);
        assert_eq!(s.value(20000), 1e-5);
    }

    #[test]
    fn smooth_and_warmup() {
        let c = cfg(json!({"start_lr": 1e-3, "stop_lr": 1e-6, "decay_steps": 10,
                           "decay_rate": 0.5, "smooth": true, "warmup_steps": 4,
                           "warmup_start_factor": 0.5}));
        let s = LrSchedule::new(&c, 100);
        assert_eq!(s.value(0), 5e-4);
        assert_eq!(s.value(2), 7.5e-4);
        assert_eq!(s.pref_lr(2), 1e-3);
        assert_eq!(s.value(4), 1e-3);
        assert_eq!(s.value(9), 1e-3 * 0.5f64.powf(0.5));
        assert_eq!(s.pref_lr(9), s.value(9));
    }

    #[test]
    fn warmup_ratio_shortens_the_decay_phase() {
        let c = cfg(json!({"start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 10,
                           "warmup_ratio": 0.5}));
        let s = LrSchedule::new(&c, 200);
        assert_eq!((s.warmup_steps, s.decay_phase), (100, 100));
        // 1e-3 → 1e-5 over 100 steps in stairs of 10.
        assert!((s.decay_rate - 0.01f64.powf(0.1)).abs() < 1e-15);
        assert_eq!(s.value(0), 0.0);
        assert!((s.value(199) - 1e-3 * s.decay_rate.powi(9)).abs() < 1e-18);
    }

    #[test]
    fn zero_steps_is_constant() {
        let c = cfg(json!({"start_lr": 1e-3, "stop_lr": 1e-8}));
        let s = LrSchedule::new(&c, 0);
        assert_eq!(s.value(0), 1e-3);
    }
}

//! The `learning_rate` section (type `exp`); the schedule itself lives in the trainer.

use serde_json::{json, Value};

use super::error::ConfigError;
use super::keys::{non_negative, positive, Schema, Section};

type Result<T> = std::result::Result<T, ConfigError>;

/// DeePMD-kit's default `stop_lr` when neither `stop_lr` nor `stop_lr_ratio` is given.
pub const DEFAULT_STOP_LR: f64 = 1e-8;

#[derive(Debug, Clone, PartialEq)]
pub struct LearningRateConfig {
    pub start_lr: f64,
    /// Exactly one of `stop_lr` / `stop_lr_ratio` is `Some` (DeePMD-kit rejects both); use
    /// [`LearningRateConfig::final_lr`].
    pub stop_lr: Option<f64>,
    pub stop_lr_ratio: Option<f64>,
    pub decay_steps: usize,
    /// `None`: derived from start_lr, stop_lr and numb_steps.
    pub decay_rate: Option<f64>,
    /// true: decay every step (`t / decay_steps`), not in stairs.
    pub smooth: bool,
    /// At most one of `warmup_steps` (non-zero) / `warmup_ratio` is set; use
    /// [`LearningRateConfig::warmup_steps_for`].
    pub warmup_steps: usize,
    pub warmup_ratio: Option<f64>,
    pub warmup_start_factor: f64,
    pub scale_by_worker: ScaleByWorker,
}

/// How DeePMD-kit's TF backend scales the lr with the number of workers (PT ignores it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleByWorker {
    Linear,
    Sqrt,
    None,
}

impl ScaleByWorker {
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleByWorker::Linear => "linear",
            ScaleByWorker::Sqrt => "sqrt",
            ScaleByWorker::None => "none",
        }
    }
}

impl LearningRateConfig {
    /// The lr at the end of training: `stop_lr`, or `start_lr * stop_lr_ratio`.
    pub fn final_lr(&self) -> f64 {
        match (self.stop_lr, self.stop_lr_ratio) {
            (_, Some(ratio)) => self.start_lr * ratio,
            (Some(stop), None) => stop,
            (None, None) => DEFAULT_STOP_LR,
        }
    }

    /// `warmup_steps`, or `int(warmup_ratio * numb_steps)` as DeePMD-kit computes it.
    pub fn warmup_steps_for(&self, numb_steps: usize) -> usize {
        match self.warmup_ratio {
            Some(r) => (r * numb_steps as f64) as usize,
            None => self.warmup_steps,
        }
    }
}

static LEARNING_RATE: Schema = Schema {
    keys: &[&[
        "start_lr",
        "stop_lr",
        "stop_lr_ratio",
        "decay_steps",
        "decay_rate",
        "smooth",
        "warmup_steps",
        "warmup_ratio",
        "warmup_start_factor",
        "scale_by_worker",
    ]],
    unsupported: &[&[("type", "the only schedule dpw implements")]],
    ignored: &[],
    deepmd: "learning_rate",
};

pub(super) fn parse(v: Option<&Value>, path: &str) -> Result<LearningRateConfig> {
    let empty = json!({});
    let sec = Section::new(v.unwrap_or(&empty), path, &LEARNING_RATE)?;
    let p = |k: &str| sec.path_of(k);

    let start_lr = positive(sec.f64_or("start_lr", 1e-3)?, &p("start_lr"))?;
    let mut stop_lr = sec.opt_f64("stop_lr")?;
    let stop_lr_ratio = sec.opt_f64("stop_lr_ratio")?;
    let stop_lr_given = stop_lr.is_some();
    match (stop_lr, stop_lr_ratio) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::invalid(
                p("stop_lr_ratio"),
                "give either stop_lr or stop_lr_ratio, not both",
            ))
        }
        (Some(s), None) => {
            non_negative(s, &p("stop_lr"))?;
        }
        (None, Some(r)) => {
            non_negative(r, &p("stop_lr_ratio"))?;
        }
        (None, None) => stop_lr = Some(DEFAULT_STOP_LR),
    }

    let decay_steps = sec.usize_or("decay_steps", 5000)?;
    if decay_steps == 0 {
        return Err(ConfigError::invalid(
            p("decay_steps"),
            "must be >= 1, found 0",
        ));
    }
    let decay_rate = sec.opt_f64("decay_rate")?;
    if let Some(r) = decay_rate {
        positive(r, &p("decay_rate"))?;
    }
    check_decays(
        start_lr,
        stop_lr,
        stop_lr_ratio,
        decay_rate,
        stop_lr_given,
        &p,
    )?;

    let warmup_steps = sec.usize_or("warmup_steps", 0)?;
    let warmup_ratio = sec.opt_f64("warmup_ratio")?;
    if let Some(r) = warmup_ratio {
        if !(0.0..1.0).contains(&r) {
            return Err(ConfigError::invalid(
                p("warmup_ratio"),
                format!("must be in [0, 1), found {r}"),
            ));
        }
        if warmup_steps != 0 {
            return Err(ConfigError::invalid(
                p("warmup_ratio"),
                "give either warmup_steps or warmup_ratio, not both",
            ));
        }
    }
    let warmup_start_factor = sec.f64_or("warmup_start_factor", 0.0)?;
    non_negative(warmup_start_factor, &p("warmup_start_factor"))?;

    let scale_by_worker = match sec.string_or("scale_by_worker", "linear")?.as_str() {
        "linear" => ScaleByWorker::Linear,
        "sqrt" => ScaleByWorker::Sqrt,
        "none" => ScaleByWorker::None,
        other => {
            return Err(ConfigError::invalid(
                p("scale_by_worker"),
                format!("expected \"linear\", \"sqrt\" or \"none\", found {other:?}"),
            ))
        }
    };

    Ok(LearningRateConfig {
        start_lr,
        stop_lr,
        stop_lr_ratio,
        decay_steps,
        decay_rate,
        smooth: sec.bool_or("smooth", false)?,
        warmup_steps,
        warmup_ratio,
        warmup_start_factor,
        scale_by_worker,
    })
}

/// The loss prefactors move linearly with the lr (`limit + (start − limit)·lr/start_lr`), which
/// keeps them between their start and limit values, so non-negative, only while every lr the
/// schedule reaches lies in `[0, start_lr]`: an lr above start_lr extrapolates the prefactors
/// past their start values, to negative ones once far enough (and to a loss that trains to
/// NaN). DeePMD-kit's schedule decays from start_lr down to stop_lr.
fn check_decays(
    start_lr: f64,
    stop_lr: Option<f64>,
    stop_lr_ratio: Option<f64>,
    decay_rate: Option<f64>,
    stop_lr_given: bool,
    p: &dyn Fn(&str) -> String,
) -> Result<()> {
    if let Some(stop) = stop_lr.filter(|&s| s > start_lr) {
        let default = if stop_lr_given { "" } else { " (the default)" };
        return Err(ConfigError::invalid(
            p("stop_lr"),
            format!(
                "must be <= {} ({start_lr:e}), found {stop:e}{default}: the learning rate \
                 decays from start_lr to stop_lr",
                p("start_lr")
            ),
        ));
    }
    if let Some(r) = stop_lr_ratio.filter(|&r| r > 1.0) {
        return Err(ConfigError::invalid(
            p("stop_lr_ratio"),
            format!(
                "must be <= 1, found {r}: the final learning rate start_lr × stop_lr_ratio \
                 must not exceed {}",
                p("start_lr")
            ),
        ));
    }
    if let Some(r) = decay_rate.filter(|&r| r > 1.0) {
        return Err(ConfigError::invalid(
            p("decay_rate"),
            format!(
                "must be <= 1, found {r}: a rate above 1 raises the learning rate past {}",
                p("start_lr")
            ),
        ));
    }
    Ok(())
}

impl LearningRateConfig {
    pub(super) fn to_json(&self) -> Value {
        json!({
            "start_lr": self.start_lr,
            "stop_lr": self.stop_lr,
            "stop_lr_ratio": self.stop_lr_ratio,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "smooth": self.smooth,
            "warmup_steps": self.warmup_steps,
            "warmup_ratio": self.warmup_ratio,
            "warmup_start_factor": self.warmup_start_factor,
            "scale_by_worker": self.scale_by_worker.as_str(),
        })
    }
}

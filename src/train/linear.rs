//! Setting up a linear model of several DP models (docs/deepmd-spec.md §19.9): each DP model
//! is prepared as the single-model input it stands for (its own list, `sel`, statistics and
//! initial parameters), then they are joined, the linear model's energy bias set from the
//! data once (DeePMD-kit's linear model's out_bias; its DP models keep none).

use anyhow::{bail, ensure, Result};
use web_time::Instant;

use crate::config::linear::LinearConfig;
use crate::config::Config;
use crate::data::Files;
use crate::dist;
use crate::model::Model;

use super::setup::{self, Start, TrainSetup};

/// [`setup::prepare_in`] of an input whose model is `linear_ener` of DP models.
pub(super) fn prepare_in(
    fs: &dyn Files,
    cfg: Config,
    start: Start,
    neighbor_stat: bool,
    out_dir: &std::path::Path,
    t0: Instant,
) -> Result<TrainSetup> {
    let linear = cfg.model.linear.clone().expect("a linear model");
    if let Start::Finetune { what, .. } = &start {
        bail!(
            "--finetune of a linear model of several DP models (from {what}) is not implemented \
             (--restart, --init-model and -t are)"
        );
    }
    let (restart, init) = setup::open_start(start)?;
    if dist::world().is_distributed() {
        bail!(
            "training a linear model of several DP models on several processes is not implemented"
        );
    }
    if cfg.training.gradient_max_norm > 0.0 {
        bail!(
            "training.gradient_max_norm: clipping the gradient of a linear model of several DP \
             models is not implemented"
        );
    }
    let mut first = cfg.model.clone();
    first.linear = None;
    let n = 1 + linear.more.len();
    let mut setups = Vec::with_capacity(n);
    for (k, model) in std::iter::once(first).chain(linear.more).enumerate() {
        tracing::info!("linear model: DP model {} of {n}", k + 1);
        let member = Config {
            model,
            ..cfg.clone()
        };
        setups.push(setup::prepare_in(
            fs,
            member,
            Start::Fresh,
            neighbor_stat,
            out_dir,
            t0,
        )?);
    }
    let models: Vec<Model> = setups.iter().map(|s| s.model.clone()).collect();
    // The energy bias is the data's, the same for every DP model's setup: the linear model's.
    let mut model = Model::linear(&models, linear.weights.clone(), models[0].bias.clone());
    let mut resolved = setups.iter().map(|s| s.config.model.clone());
    let mut config = cfg;
    config.model = resolved.next().expect("a DP model");
    config.model.linear = Some(LinearConfig {
        weights: linear.weights,
        more: resolved.collect(),
    });
    let mut setup = setups.swap_remove(0);
    // Its parameters, statistics and bias from a checkpoint or model file of the same model.
    let given = restart.as_ref().map(|ck| &ck.model).or(init.as_ref());
    if let Some(m) = given {
        ensure!(
            m.spec == model.spec,
            "the model of the --restart checkpoint, --init-model or -t file does not match \
             input.json's linear model ({} DP models there, {} here)",
            m.spec.nmembers(),
            model.spec.nmembers()
        );
        model = m.clone();
    }
    if let Some(ck) = &restart {
        tracing::info!("restarting from step {} (lr {:.3e})", ck.step, ck.lr);
    }
    setup.model = model;
    setup.config = config;
    setup.restart = restart;
    Ok(setup)
}

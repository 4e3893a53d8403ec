//! DeePMD-kit's `linear_ener` of several DP models (docs/deepmd-spec.md §19.9): each atom's
//! energy is Σ_k w_k·e_k + the linear model's bias, every model with its own descriptor,
//! neighbour list, statistics and fitting net. (A DP model with a pair table is the other
//! linear model, `pairtab`'s.)
//!
//! A [`Model`] of such a model keeps its members one after the other: the spec holds the first
//! one's descriptor and fitting and [`Linear::more`] the others'; `params`, `davg` and `dstd`
//! are the members' vectors concatenated in order; `bias` is the linear model's (the members
//! hold none). So a checkpoint, Adam and the all-reduce see one parameter vector, and each
//! member is an ordinary model on the device ([`Model::members`]).

pub(super) mod yaml;

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};

use super::{DescriptorSpec, FittingSpec, Model, ModelSpec, ParamLayout};

/// A linear model's `weights`, for its models in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Weights {
    Sum,
    Mean,
    List(Vec<f64>),
}

impl Weights {
    /// The weight of each of `n` models.
    pub fn of(&self, n: usize) -> Vec<f64> {
        match self {
            Weights::Sum => vec![1.0; n],
            Weights::Mean => vec![1.0 / n as f64; n],
            Weights::List(w) => w.clone(),
        }
    }

    /// The weights of a DP model and of the pair table after it.
    pub fn pair(&self) -> (f64, f64) {
        let w = self.of(2);
        (w[0], w[1])
    }
}

/// The DP models after the first of a linear model, and every model's weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Linear {
    pub weights: Weights,
    pub more: Vec<Member>,
}

/// One DP model of a linear model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub descriptor: DescriptorSpec,
    pub fitting: FittingSpec,
}

impl ModelSpec {
    /// The number of DP models: 1, or a linear model's.
    pub fn nmembers(&self) -> usize {
        1 + self.linear.as_ref().map_or(0, |l| l.more.len())
    }

    /// Each DP model's weight in the energy: `[1.0]` for a plain model.
    pub fn member_weights(&self) -> Vec<f64> {
        match &self.linear {
            Some(l) => l.weights.of(self.nmembers()),
            None => vec![1.0],
        }
    }

    /// DP model `k` alone.
    pub fn member(&self, k: usize) -> ModelSpec {
        let (descriptor, fitting) = match k {
            0 => (self.descriptor.clone(), self.fitting.clone()),
            _ => {
                let m = &self.linear.as_ref().expect("a linear model").more[k - 1];
                (m.descriptor.clone(), m.fitting.clone())
            }
        };
        ModelSpec {
            type_map: self.type_map.clone(),
            descriptor,
            fitting,
            short_range: None,
            linear: None,
        }
    }
}

/// The lengths of one member's vectors.
fn lengths(spec: &ModelSpec) -> (usize, usize) {
    let stats = spec.descriptor.stat_blocks() * spec.ntypes() * 4;
    (ParamLayout::new(spec).len, stats)
}

impl Model {
    /// Each DP model alone, with its part of the vectors and no bias: the model itself for a
    /// plain model.
    pub fn members(&self) -> Vec<Model> {
        if self.spec.linear.is_none() {
            return vec![self.clone()];
        }
        let (mut p, mut s) = (0, 0);
        (0..self.spec.nmembers())
            .map(|k| {
                let spec = self.spec.member(k);
                let (np, ns) = lengths(&spec);
                let mut m = Model::new(spec, 0);
                m.params.copy_from_slice(&self.params[p..p + np]);
                m.davg.copy_from_slice(&self.davg[s..s + ns]);
                m.dstd.copy_from_slice(&self.dstd[s..s + ns]);
                (p, s) = (p + np, s + ns);
                m
            })
            .collect()
    }

    /// The linear model of `members` (in order) weighted by `weights`, with the linear model's
    /// `bias`; the members' own biases are left out.
    pub fn linear(members: &[Model], weights: Weights, bias: Vec<f64>) -> Model {
        let first = &members[0];
        let cat = |f: fn(&Model) -> &Vec<f64>| members.iter().flat_map(f).copied().collect();
        let more = (members[1..].iter())
            .map(|m| Member {
                descriptor: m.spec.descriptor.clone(),
                fitting: m.spec.fitting.clone(),
            })
            .collect();
        Model {
            spec: ModelSpec {
                linear: Some(Linear { weights, more }),
                ..first.spec.clone()
            },
            params: cat(|m| &m.params),
            davg: cat(|m| &m.davg),
            dstd: cat(|m| &m.dstd),
            bias,
            ..first.clone()
        }
    }
}

impl Model {
    /// [`Model::check`] of a linear model: what DeePMD-kit's linear model takes, and each DP
    /// model's own checks.
    pub(super) fn check_linear(&self) -> Result<()> {
        let spec = &self.spec;
        let n = spec.nmembers();
        ensure!(
            spec.short_range.is_none(),
            "model: a linear model of several DP models with a pair table is not supported"
        );
        if let Some(Linear {
            weights: Weights::List(w),
            ..
        }) = &spec.linear
        {
            ensure!(w.len() == n, "model.weights: {} for {n} models", w.len());
        }
        let (mut np, mut ns) = (0, 0);
        for k in 0..n {
            let m = spec.member(k);
            ensure!(
                m.descriptor.is_mixed(),
                "model.models[{k}].descriptor: a linear model takes mixed-type descriptors ({}), \
                 as DeePMD-kit does; not {}",
                super::registry::mixed_type_names(),
                m.descriptor.kind.as_str()
            );
            ensure!(
                m.fitting.output.is_ener() && m.fitting.param_inputs() == 0,
                "model.models[{k}].fitting: a linear model sums energy fittings without frame \
                 or atomic parameters"
            );
            let (p, s) = lengths(&m);
            (np, ns) = (np + p, ns + s);
        }
        for (name, len, want) in [
            ("parameters", self.params.len(), np),
            ("davg values", self.davg.len(), ns),
            ("dstd values", self.dstd.len(), ns),
            ("bias values", self.bias.len(), spec.ntypes()),
        ] {
            ensure!(
                len == want,
                "the file holds {len} {name}, its linear model needs {want}"
            );
        }
        for (k, m) in self.members().iter().enumerate() {
            m.check()
                .map_err(|e| e.context(format!("model.models[{k}]")))?;
        }
        Ok(())
    }
}

//! The head of a fitting scored on the host (every fitting but `ener`): the nets run on the
//! backend; what the step reads back of them, the batch's labels, the model's output
//! statistics, and the loss and seeds the head gives back (docs/design.md §12).

use crate::config::loss::LossConfig;
use crate::fitting::ener::Prefactors;
use crate::fitting::{outputs, Centres, OutStat};

/// What the step's loss needs beside the batch: the ener loss's prefactors, which the backend
/// takes, or a host head's loss and the learning-rate ratio lr/start_lr its prefactors
/// follow.
#[derive(Clone, Copy, Debug)]
pub enum StepLoss<'a> {
    Ener(Prefactors),
    Host { loss: &'a LossConfig, coef: f64 },
}

impl From<Prefactors> for StepLoss<'_> {
    fn from(p: Prefactors) -> Self {
        StepLoss::Ener(p)
    }
}

/// A host head's loss: its sums (the loss's `nsums`), the nets' seed ∂L/∂y and, for a tensor,
/// the descriptor's ∂L/∂A (empty otherwise).
pub struct HeadLoss {
    pub sums: Vec<f64>,
    pub ybar: Vec<f64>,
    pub abar: Vec<f64>,
}

/// A batch's labels for a host head: its frame labels `[nframes][dim]` and its atomic labels
/// in centre order `[ncentres][dim]`, each where its system has them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeadLabels {
    pub frame: Option<Vec<f64>>,
    pub atomic: Option<Vec<f64>>,
}

/// What a host head reads of a forward pass: the nets' outputs `[ncentres][dim]` (centre
/// order) and, for a tensor, the descriptor's A `[ncentres][4][M1]` (empty otherwise).
pub struct HeadInputs {
    pub y: Vec<f64>,
    pub rot: Vec<f64>,
}

impl HeadInputs {
    /// From the reads of the workspace's head buffers, in their order (the nets' outputs, then
    /// A where the head reads it).
    pub fn from_reads(mut reads: Vec<Vec<f64>>) -> Self {
        let rot = if reads.len() > 1 { reads.pop() } else { None };
        HeadInputs {
            y: reads.swap_remove(0),
            rot: rot.unwrap_or_default(),
        }
    }
}

/// A host head's output statistics, `[ntypes][dim_out]` each (a tensor's bias
/// `[ntypes][3 or 9]`).
pub struct HeadStat {
    pub bias: Vec<f64>,
    /// The output std where the fitting scales by it
    /// ([`crate::fitting::traits::FittingType::keeps_out_std`]); ones otherwise.
    pub std: Vec<f64>,
    /// A polar's diagonal shift per type: the mean of the diagonal of the type's output bias
    /// (DeePMD-kit's `DPPolarAtomicModel.apply_out_stat`); empty for the others.
    pub diag_bias: Vec<f64>,
}

impl HeadStat {
    pub fn out_stat(&self) -> OutStat<'_> {
        OutStat {
            bias: &self.bias,
            std: &self.std,
        }
    }

    /// The reduction of `k` outputs per atom: y·std + bias, summed (averaged where
    /// `intensive`) per frame ([`outputs`]).
    pub fn reduce(
        &self,
        k: usize,
        intensive: bool,
        c: &Centres,
        x: &HeadInputs,
    ) -> (Vec<f64>, Vec<f64>) {
        outputs(k, intensive, &self.out_stat(), c, &x.y)
    }
}

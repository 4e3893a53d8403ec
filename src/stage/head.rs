//! A model's head on the host: the fitting whose outputs are reduced and scored there (every
//! fitting but `ener`; its nets run on the backend) with the model's output statistics
//! (docs/design.md §12).

use crate::fitting::head::{HeadInputs, HeadLabels, HeadLoss, HeadStat, StepLoss};
use crate::fitting::output::FitOutput;
use crate::fitting::traits::HeadType;
use crate::fitting::Centres;

pub struct HostHead {
    pub output: FitOutput,
    pub stat: HeadStat,
}

impl HostHead {
    /// The head of a model of fitting `output` with output statistics `bias`, `out_std`;
    /// `None` where the fitting has none.
    pub fn new(output: &FitOutput, bias: &[f64], out_std: &[f64]) -> Option<Self> {
        let stat = output.fitting().head()?.stat(bias, out_std);
        Some(HostHead {
            output: output.clone(),
            stat,
        })
    }

    /// The fitting's head.
    pub fn kind(&self) -> &dyn HeadType {
        (self.output.fitting().head()).expect("a host head's fitting has one")
    }

    /// The loss sums its loss leaves ([`crate::train::loss::Loss::nsums`]).
    pub fn nsums(&self) -> usize {
        self.kind().nsums()
    }

    /// The values per atom the nets put out.
    pub fn dim(&self) -> usize {
        self.output.fitting().dim()
    }

    /// The values per atom and per frame of the outputs: the nets' for a property or a DOS,
    /// 3 or 9 for a tensor.
    pub fn out_width(&self) -> usize {
        self.output.fitting().label_width()
    }

    /// Atomic outputs `[ncentres][out_width]` (centre order) and frame outputs
    /// `[nframes][out_width]` from what the head reads of a forward pass.
    pub fn outputs(&self, c: &Centres, x: &HeadInputs) -> (Vec<f64>, Vec<f64>) {
        self.kind().outputs(&self.stat, c, x)
    }

    /// The loss of one batch laid out as `c` from what the head reads of its forward pass `x`.
    pub fn loss(
        &self,
        loss: StepLoss,
        c: &Centres,
        x: &HeadInputs,
        labels: &HeadLabels,
    ) -> HeadLoss {
        self.kind().loss(&self.stat, loss, c, x, labels)
    }
}

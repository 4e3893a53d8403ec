//! What a training step leaves for the host to read later: its loss sums and gradient norm stay
//! on the device, one row per step, until a display step or a checkpoint reads them all at once.
//! A step that displays nothing thus ends without a device-to-host transfer, and the metrics,
//! the disp_avg average and the NaN check come out as if each step had been read at once.

use anyhow::{bail, Result};

use crate::backend::{Backend, Real};

use super::loss::BatchPrefactors;

/// The host's record of one logged step: what turns its sums into metrics.
#[derive(Clone, Copy, Debug)]
pub struct StepInfo {
    /// 1-based step number, as lcurve.out and the messages print it.
    pub step: usize,
    /// The training system the batch came from (`None`: a `"mixed:N"` batch of several).
    pub sys: Option<usize>,
    /// Frames in the global batch and atoms per frame.
    pub nframes: usize,
    pub natoms: usize,
    pub pf: BatchPrefactors,
}

/// One step read back.
#[derive(Clone, Debug)]
pub struct LoggedStep {
    pub info: StepInfo,
    /// The loss sums ([`crate::train::loss::Loss::nsums`]).
    pub sums: Vec<f64>,
    /// The gradient norm (0 unless clipping computed it).
    pub grad_norm: f64,
}

/// Rows of steps not yet read, on the device.
pub struct StepLog<T: Real, B: Backend<T>> {
    rows: B::Buf,
    /// Values per row: the loss sums, then ‖gradient‖.
    row: usize,
    cap: usize,
    pending: Vec<StepInfo>,
}

impl<T: Real, B: Backend<T>> StepLog<T, B> {
    /// Room for `cap` steps of `nsums` loss sums between reads.
    pub fn new(b: &B, cap: usize, nsums: usize) -> Self {
        let cap = cap.max(1);
        let row = nsums + 1;
        StepLog {
            rows: b.zeros(row * cap),
            row,
            cap,
            pending: Vec::with_capacity(cap),
        }
    }

    /// Whether the next step needs a read first.
    pub fn is_full(&self) -> bool {
        self.pending.len() == self.cap
    }

    /// Logs a step's loss sums (a device copy); returns the row's buffer and the index in it
    /// where [`TrainOps::clip_grad_norm`](crate::backend::TrainOps::clip_grad_norm) puts the step's gradient norm.
    pub fn record(&mut self, b: &B, sums: &B::Buf, info: StepInfo) -> (&mut B::Buf, usize) {
        assert!(!self.is_full(), "the step log is full: read it first");
        let at = self.row * self.pending.len();
        b.copy(sums, &mut self.rows, at);
        self.pending.push(info);
        (&mut self.rows, at + self.row - 1)
    }

    /// The rows to read, if any step is logged.
    pub fn rows(&self) -> Option<&B::Buf> {
        (!self.pending.is_empty()).then_some(&self.rows)
    }

    /// The logged steps, from the values `v` read from [`StepLog::rows`]; empties the log.
    pub fn take(&mut self, v: &[T]) -> Vec<LoggedStep> {
        self.pending
            .drain(..)
            .zip(v.chunks(self.row))
            .map(|(info, r)| LoggedStep {
                info,
                sums: r[..self.row - 1].iter().map(|x| x.f64()).collect(),
                grad_norm: r[self.row - 1].f64(),
            })
            .collect()
    }

    /// Reads every logged step (one read-back) and empties the log.
    pub fn drain(&mut self, b: &B) -> Vec<LoggedStep> {
        match self.rows() {
            Some(rows) => {
                let v = b.download(rows);
                self.take(&v)
            }
            None => Vec::new(),
        }
    }
}

/// The clear error for a step whose gradient norm is not finite (with clipping on).
pub fn check_grad_norm(s: &LoggedStep) -> Result<()> {
    if !s.grad_norm.is_finite() {
        bail!(
            "the gradient norm is {} at step {}",
            s.grad_norm,
            s.info.step
        );
    }
    Ok(())
}

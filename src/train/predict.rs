//! Whole-batch conveniences over the step: predictions, and the loss with its gradient.

use anyhow::Result;

use crate::backend::{Backend, LossSums, Prefactors, Real};
use crate::model::Model;

use super::batch::{assemble, Frame, HostBatch};
use super::step::{forward, gradient, DeviceModel, StepLoss, Workspace};

/// Predictions for a batch, per frame, atoms in the order given (sorted by type): an energy
/// model's energies, forces and virials, or a property or DOS model's outputs (the others
/// empty).
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub energy: Vec<f64>,
    /// `[nframes][natoms]`
    pub atom_energy: Vec<f64>,
    /// `[nframes][natoms][3]`
    pub force: Vec<f64>,
    /// `[nframes][9]`
    pub virial: Vec<f64>,
    /// A property's or a DOS's, `[nframes][dim]`
    pub property: Vec<f64>,
    /// `[nframes][natoms][dim]`
    pub atom_property: Vec<f64>,
}

fn f64s<T: Real>(x: Vec<T>) -> Vec<f64> {
    x.into_iter().map(|v| v.f64()).collect()
}

pub fn read_prediction<T: Real, B: Backend<T>>(
    b: &B,
    m: &DeviceModel<T, B>,
    w: &Workspace<T, B>,
    batch: &HostBatch,
) -> Prediction {
    if let Some(h) = &m.head {
        let k = h.out_width();
        let (atomic, property) = h.outputs(&w.centres(), &w.head_inputs(b));
        let mut atom_property = vec![0.0; batch.dims.nbatch_atoms() * k];
        for (c, &a) in batch.centre_atom.iter().enumerate() {
            let a = a as usize;
            atom_property[a * k..(a + 1) * k].copy_from_slice(&atomic[c * k..(c + 1) * k]);
        }
        return Prediction {
            energy: vec![],
            atom_energy: vec![],
            force: vec![],
            virial: vec![],
            property,
            atom_property,
        };
    }
    let e_atom = b.download(&w.e_atom);
    let mut atom_energy = vec![0.0; batch.dims.nbatch_atoms()];
    for (c, &a) in batch.centre_atom.iter().enumerate() {
        atom_energy[a as usize] = e_atom[c].f64();
    }
    Prediction {
        energy: f64s(b.download(&w.energy)),
        atom_energy,
        force: f64s(b.download(&w.force)),
        virial: f64s(b.download(&w.virial)),
        property: vec![],
        atom_property: vec![],
    }
}

pub fn predict<T: Real, B: Backend<T>>(
    b: &B,
    model: &Model,
    atype: &[usize],
    frames: &[Frame],
) -> Result<Prediction> {
    predict_batch(b, model, &assemble(&model.spec, atype, frames)?)
}

/// Predictions for an assembled batch (frames of their own compositions too).
pub fn predict_batch<T: Real, B: Backend<T>>(
    b: &B,
    model: &Model,
    batch: &HostBatch,
) -> Result<Prediction> {
    let dm = DeviceModel::<T, B>::new(b, model);
    let mut w = Workspace::for_batch(b, &dm, batch)?;
    w.load(b, batch);
    forward(b, &dm, &mut w);
    Ok(read_prediction(b, &dm, &w, batch))
}

/// The `ener` loss sums and the gradient (f64, in the layout's order) of one batch.
pub fn loss_and_grad<T: Real, B: Backend<T>>(
    b: &B,
    model: &Model,
    atype: &[usize],
    frames: &[Frame],
    pref: Prefactors,
) -> Result<(LossSums, Vec<f64>, Prediction)> {
    loss_and_grad_batch(b, model, &assemble(&model.spec, atype, frames)?, pref)
}

/// [`loss_and_grad`] of an assembled batch (frames of their own compositions too).
pub fn loss_and_grad_batch<T: Real, B: Backend<T>>(
    b: &B,
    model: &Model,
    batch: &HostBatch,
    pref: Prefactors,
) -> Result<(LossSums, Vec<f64>, Prediction)> {
    let (sums, grad, pred) = step_of_batch(b, model, batch, StepLoss::Ener(pref))?;
    Ok((LossSums::from_values(&sums), grad, pred))
}

/// The loss sums ([`crate::train::loss::Loss::nsums`]), the gradient and the predictions of one
/// batch under any loss.
pub fn step_of<T: Real, B: Backend<T>>(
    b: &B,
    model: &Model,
    atype: &[usize],
    frames: &[Frame],
    loss: StepLoss,
) -> Result<(Vec<f64>, Vec<f64>, Prediction)> {
    step_of_batch(b, model, &assemble(&model.spec, atype, frames)?, loss)
}

fn step_of_batch<T: Real, B: Backend<T>>(
    b: &B,
    model: &Model,
    batch: &HostBatch,
    loss: StepLoss,
) -> Result<(Vec<f64>, Vec<f64>, Prediction)> {
    let mut dm = DeviceModel::<T, B>::new(b, model);
    let mut w = Workspace::for_batch(b, &dm, batch)?;
    w.load(b, batch);
    forward(b, &dm, &mut w);
    gradient(b, &mut dm, &mut w, loss);
    Ok((
        w.loss_sums(b),
        dm.grad_f64(b),
        read_prediction(b, &dm, &w, batch),
    ))
}

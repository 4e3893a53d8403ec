//! The fittings, found by their `type` ([`registry`]), each a folder of its own implementing
//! [`traits::FittingType`]: its spec, input keys, serialisation, statistics and, but for `ener`
//! (whose step runs whole on the backend), the head that scores it on the host
//! (docs/design.md §12). The heads share the reduction here: an atomic output y·std + bias of the
//! atom's type, summed (or averaged) per frame, and back.

pub mod dos;
pub mod ener;
pub mod head;
pub mod keys;
pub mod out_bias;
pub mod output;
pub mod property;
pub mod registry;
pub mod tensor;
pub mod traits;

/// Where each centre of a batch is: its type and its frame.
pub struct Centres<'a> {
    pub types: &'a [usize],
    pub frames: &'a [usize],
    pub nframes: usize,
    /// Atoms per frame.
    pub natoms: usize,
}

/// The output statistics of a model: `[ntypes][dim]` each (std all ones where unscaled).
pub struct OutStat<'a> {
    pub bias: &'a [f64],
    pub std: &'a [f64],
}

/// Atomic outputs `[ncentres][k]` (y·std + bias of the centre's type) and frame outputs
/// `[nframes][k]` (their sum, or mean where `intensive`) from the nets' outputs `y`.
pub fn outputs(
    k: usize,
    intensive: bool,
    stat: &OutStat,
    c: &Centres,
    y: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut atomic = vec![0.0; y.len()];
    let mut frame = vec![0.0; c.nframes * k];
    for (i, (&t, &f)) in c.types.iter().zip(c.frames).enumerate() {
        for j in 0..k {
            let a = y[i * k + j] * stat.std[t * k + j] + stat.bias[t * k + j];
            atomic[i * k + j] = a;
            frame[f * k + j] += a;
        }
    }
    if intensive {
        frame.iter_mut().for_each(|x| *x /= c.natoms as f64);
    }
    (atomic, frame)
}

/// The nets' seed ∂L/∂y `[ncentres][k]` from ∂L/∂(frame output) `dframe` and, where the loss
/// reads them, ∂L/∂(atomic output) `datomic` (centre order): [`outputs`] backwards.
pub fn seed(
    k: usize,
    intensive: bool,
    stat: &OutStat,
    c: &Centres,
    dframe: &[f64],
    datomic: Option<&[f64]>,
) -> Vec<f64> {
    let mean = if intensive {
        1.0 / c.natoms as f64
    } else {
        1.0
    };
    let mut ybar = vec![0.0; c.types.len() * k];
    for (i, (&t, &f)) in c.types.iter().zip(c.frames).enumerate() {
        for j in 0..k {
            let da = datomic.map_or(0.0, |d| d[i * k + j]);
            ybar[i * k + j] = (da + dframe[f * k + j] * mean) * stat.std[t * k + j];
        }
    }
    ybar
}

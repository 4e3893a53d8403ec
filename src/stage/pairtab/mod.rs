//! A pair table's terms of the loaded batch on the device ([`ShortRangeBatch`]), for a model
//! that mixes one into its DP energy (docs/deepmd-spec.md §19).

mod batch;

pub use batch::{ShortRangeBatch, TableInput};

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;
use crate::model::pairtab::Mix;

use super::net::Zeros;

pub struct PairTerms<T: Real, B: Backend<T>> {
    pub weight: B::Buf,
    pub dweight: B::Buf,
    pub pair_e: B::Buf,
    pub pair_force: B::Buf,
    pub pair_virial: B::Buf,
    /// The weight moves with the atoms (ZBL's): `dweight` is not all zero.
    pub moving_weight: bool,
}

impl<T: Real, B: Backend<T>> PairTerms<T, B> {
    pub fn new(d: &Dims, zeros: &Zeros<B::Buf>, mix: &Mix) -> Result<Self, OutOfMemory> {
        let (nc, ns) = (d.ncentres(), d.nslots());
        let moving_weight = matches!(mix, Mix::Zbl { .. });
        Ok(PairTerms {
            weight: zeros(nc)?,
            dweight: zeros(3 * ns)?,
            pair_e: zeros(nc)?,
            pair_force: zeros(3 * d.nbatch_atoms())?,
            pair_virial: zeros(9 * d.nframes)?,
            moving_weight,
        })
    }

    pub fn load(&mut self, b: &B, x: &ShortRangeBatch) {
        let t = |v: &[f64]| v.iter().map(|&x| T::of(x)).collect::<Vec<T>>();
        b.write(&mut self.weight, &t(&x.weight));
        b.write(&mut self.dweight, &t(&x.dweight));
        b.write(&mut self.pair_e, &t(&x.pair_e));
        b.write(&mut self.pair_force, &t(&x.pair_force));
        b.write(&mut self.pair_virial, &t(&x.pair_virial));
    }

    pub fn buffers(&self) -> [&B::Buf; 5] {
        [
            &self.weight,
            &self.dweight,
            &self.pair_e,
            &self.pair_force,
            &self.pair_virial,
        ]
    }
}

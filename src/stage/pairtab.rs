//! A pair table's terms of the loaded batch on the device ([`ShortRangeBatch`]), for a model
//! that mixes one into its DP energy (docs/deepmd-spec.md §19).

use crate::backend::{Backend, Dims, Real};
use crate::mem::OutOfMemory;
use crate::model::pairtab::ShortRangeBatch;

use super::net::Zeros;

pub struct PairTerms<T: Real, B: Backend<T>> {
    pub weight: B::Buf,
    pub dweight: B::Buf,
    pub pair_e: B::Buf,
    pub pair_q: B::Buf,
}

impl<T: Real, B: Backend<T>> PairTerms<T, B> {
    pub fn new(d: &Dims, zeros: &Zeros<B::Buf>) -> Result<Self, OutOfMemory> {
        let (nc, ns) = (d.ncentres(), d.nslots());
        Ok(PairTerms {
            weight: zeros(nc)?,
            dweight: zeros(3 * ns)?,
            pair_e: zeros(nc)?,
            pair_q: zeros(3 * ns)?,
        })
    }

    pub fn load(&mut self, b: &B, x: &ShortRangeBatch) {
        let t = |v: &[f64]| v.iter().map(|&x| T::of(x)).collect::<Vec<T>>();
        b.write(&mut self.weight, &t(&x.weight));
        b.write(&mut self.dweight, &t(&x.dweight));
        b.write(&mut self.pair_e, &t(&x.pair_e));
        b.write(&mut self.pair_q, &t(&x.pair_q));
    }

    pub fn buffers(&self) -> [&B::Buf; 4] {
        [&self.weight, &self.dweight, &self.pair_e, &self.pair_q]
    }
}

//! What every pass of a message-passing block reads (DPA-3's RepFlow, DPA-2's repinit and
//! repformers): the block's constants and layout, the model's parameters and statistics, and
//! the batch's slots and centres.

use bytemuck::Pod;

use crate::backend::keep::Key;
use crate::backend::Dims;

pub struct BlockIn<'a, O, L, T> {
    pub o: &'a O,
    pub l: &'a L,
    pub params: &'a [T],
    /// davg, dstd: `[nt][4]` of each statistics block in turn.
    pub davg: &'a [T],
    pub dstd: &'a [T],
    pub rij: &'a [T],
    pub owner: &'a [i32],
    pub nei_type: &'a [i32],
    pub centre_atom: &'a [i32],
}

impl<O: Clone + PartialEq, L, T: Pod> BlockIn<'_, O, L, T> {
    /// What a state built from these inputs (with the tangent `rdot`) is kept under.
    pub fn key(&self, d: &Dims, rdot: Option<&[T]>) -> Key<T, O> {
        let (vals, idx) = self.arrays(rdot);
        Key::new(self.o.clone(), centre_types(d), &vals, &idx)
    }

    /// Whether `key` is these inputs' (with the tangent `rdot`).
    pub fn made(&self, key: &Key<T, O>, d: &Dims, rdot: Option<&[T]>) -> bool {
        let (vals, idx) = self.arrays(rdot);
        key.is(self.o, &centre_types(d), &vals, &idx)
    }

    fn arrays<'s>(&'s self, rdot: Option<&'s [T]>) -> ([&'s [T]; 5], [&'s [i32]; 3]) {
        let rdot = rdot.unwrap_or_default();
        (
            [self.params, self.davg, self.dstd, self.rij, rdot],
            [self.owner, self.nei_type, self.centre_atom],
        )
    }
}

fn centre_types(d: &Dims) -> Vec<usize> {
    (0..d.ncentres()).map(|c| d.centre_type(c)).collect()
}

//! Host-side geometry: periodic images, neighbour lists and the statistics built on them.

mod cell;
mod nlist;


pub use cell::Cell;
pub use nlist::{build_nlist, NeighborList};


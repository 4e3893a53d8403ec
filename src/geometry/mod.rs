//! Host-side geometry: periodic images, neighbour lists and the statistics built on them.

mod cell;
mod nlist;
mod stat;

pub use cell::Cell;
pub use nlist::{build_nlist, NeighborList};
pub use stat::{energy_bias, frame_rows, EnvStats};

//! Host-side geometry: periodic images, neighbour lists and the statistics built on them.

mod bias;
mod cell;
mod env_row;
mod images;
mod nlist;
mod stat;

pub use bias::energy_bias;
pub use cell::Cell;
pub use env_row::{env_row, env_switch, EnvParams};
pub use images::{wrapped, ImageGrid};
pub use nlist::{build_nlist, build_nlist_mixed, visit_nlist, visit_nlist_mixed, NeighborList};
pub use stat::{frame_rows, protected_std, EnvStats, FrameRows};

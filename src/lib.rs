//! dpw: a trainer for Deep Potential models (DeePMD-kit's `se_e2_a` descriptor with an `ener`
//! fitting net), with one training step written against an op-level [`backend::Backend`] trait.

pub mod backend;
pub mod cli;
pub mod config;
pub mod data;
pub mod dist;
pub mod fmt;
pub mod geometry;
pub mod mem;
pub mod model;
pub mod stage;
pub mod train;

//! dpw: a trainer for Deep Potential models (DeePMD-kit's `se_e2_a`, `se_e2_r`, `se_e3`,
//! `se_e3_tebd`, `hybrid`, `se_atten`/`se_atten_v2` (DPA-1), `dpa2` and `dpa3` descriptors with
//! the `ener`, `dipole`, `polar`, `dos` and `property` fitting nets), with one training step
//! written against an op-level [`backend::Backend`] trait.

pub mod backend;
pub mod cli;
pub mod config;
pub mod data;
pub mod dist;
pub mod fitting;
pub mod fmt;
pub mod geometry;
pub mod logfile;
pub mod mem;
pub mod model;
pub mod settings;
pub mod stage;
pub mod train;
pub mod yaml_tree;

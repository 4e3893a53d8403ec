//! hybrid: a descriptor made of others side by side (DeePMD-kit's `DescrptHybrid`), a composition of
//! their stages. Its input keys are `config/model.rs`'s (`parse_hybrid`); this folder holds its
//! `.yaml`, a list of its parts' own.

pub(crate) mod input;
pub(super) mod yaml;

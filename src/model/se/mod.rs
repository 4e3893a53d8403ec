//! The se family: se_e2_a, se_e2_r and se_e3, DeePMD-kit's descriptors of one embedding net
//! per type (or type pair) over one env_mat whose neighbours come in one section per type
//! (docs/deepmd-spec.md §2–§4). Its input keys are `config/model.rs`'s shared ones; this folder
//! holds its `.yaml`.

pub(crate) mod input;
pub(super) mod yaml;

//! DPA-1 (`"type": "se_atten"` or `"dpa1"`, and `"se_atten_v2"`): its `.yaml`. Its keys are
//! [`super::AttentionConfig`], its tensors [`super::AttnLayout`]; the math is
//! `backend/cpu/attn.rs`.

pub(super) mod yaml;

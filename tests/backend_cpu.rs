//! The backend suite on the CPU backend: its fused embedding path (the default) and the
//! per-layer path that GPU backends use.
mod common;
mod suite;

mod fused {
    crate::backend_suite!(dpw::backend::cpu::Cpu { fused: true });
}

mod layered {
    crate::backend_suite!(dpw::backend::cpu::Cpu { fused: false });
}

//! The backend suite on the CPU backend.
mod common;
mod suite;

backend_suite!(dpw::backend::cpu::Cpu);

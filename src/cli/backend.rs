//! Choosing a backend and a precision, and running generic work on the chosen pair.

use anyhow::Result;
use clap::ValueEnum;

use crate::backend::cpu::Cpu;
use crate::backend::{Backend, Real};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The best available: cuda, then a real GPU through wgpu, then cpu.
    Auto,
    Cpu,
}

/// Work that runs on any backend and precision.
pub trait Job {
    type Output;
    fn run<T: Real, B: Backend<T>>(self, backend: &B) -> Result<Self::Output>;
}

pub fn run_job<J: Job>(choice: BackendChoice, float64: bool, job: J) -> Result<J::Output> {
    let cpu = match choice {
        BackendChoice::Auto => {
            tracing::info!("backend: cpu (no GPU backend is built into this dpw)");
            Cpu::default()
        }
        BackendChoice::Cpu => Cpu::default(),
    };
    if float64 {
        job.run::<f64, _>(&cpu)
    } else {
        job.run::<f32, _>(&cpu)
    }
}

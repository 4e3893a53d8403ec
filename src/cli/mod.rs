//! The `dpw` command line: subcommands, logging and backend selection.

pub mod backend;
pub mod bench;
pub mod test;
pub mod train;

use std::path::Path;

use anyhow::{Context, Result};
use tracing_subscriber::fmt::writer::MakeWriterExt;

/// Logs to stderr (and to `log_path` when given), `RUST_LOG` overriding the level.
pub fn init_logging(log_path: Option<&Path>) -> Result<()> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match log_path {
        Some(p) => {
            let file = std::fs::File::create(p)
                .with_context(|| format!("cannot create log file {}", p.display()))?;
            let file = std::sync::Mutex::new(file);
            builder
                .with_writer(std::io::stderr.and(file))
                .with_ansi(false)
                .init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

/// A model from a DeePMD-kit `.yaml` file, or a dpw model or checkpoint file.
pub use crate::model::read_model as load_model;

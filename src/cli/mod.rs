//! The `dpw` command line: subcommands, logging and backend selection.

pub mod backend;
pub mod bench;
pub mod change_bias;
pub mod heap;
pub mod neighbor_stat;
pub mod test;
pub mod train;

use std::io::IsTerminal;
use std::path::Path;

use anyhow::Result;
use tracing_subscriber::fmt::writer::MakeWriterExt;

/// Whether log lines on stderr get colours: only on a terminal, and not when `NO_COLOR` is set
/// to anything non-empty (no-color.org).
pub fn stderr_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Logs to stderr (and to `log_path` when given), `RUST_LOG` overriding the level.
pub fn init_logging(log_path: Option<&Path>) -> Result<()> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match log_path {
        Some(p) => {
            let file = LogFile::create(p)?;
            builder
                .with_writer(std::io::stderr.and(move || file.clone()))
                .with_ansi(false)
                .init();
        }
        None => builder
            .with_writer(std::io::stderr)
            .with_ansi(stderr_colour())
            .init(),
    }
    Ok(())
}

/// A model from a DeePMD-kit `.yaml` file, or a dpw model or checkpoint file.
pub use crate::model::read_model as load_model;

pub use crate::logfile::{log_write_error, LogFile};

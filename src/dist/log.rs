//! Rank-aware logging for `dpw train -m/--mpi-log` (DeePMD-kit's modes):
//!
//! * `master`: rank 0 logs as a serial run does (stderr, and `-l FILE`); the other ranks show
//!   only their errors, prefixed with `[rank]`.
//! * `collect`: every line of every rank, prefixed with `[rank]`, goes to rank 0, which prints
//!   it (and writes it to `-l FILE`). Rank 0's own lines appear at once; the others' lines are
//!   sent at the trainer's synchronisation points ([`flush`]: after the start-up, every display
//!   step, the end), errors at once on their own rank.
//! * `workers`: each rank prints its own lines, prefixed with `[rank]`; with `-l FILE` each
//!   rank writes its own file (`FILE_R.ext`, see [`super::worker_log_path`]).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result};
use clap::ValueEnum;
use tracing::Level;
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use super::{worker_log_path, World};
use crate::logfile::LogFile;

/// `-m/--mpi-log`: how the ranks of an MPI run log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum MpiLog {
    /// Rank 0 only (other ranks show only their errors).
    #[default]
    Master,
    /// Every rank's lines, prefixed with `[rank]`, printed by rank 0.
    Collect,
    /// Each rank prints its own lines, prefixed with `[rank]`; `-l` gives one file per rank.
    Workers,
}

/// The collect mode's state: this rank's lines not yet sent (ranks > 0), and rank 0's log file.
struct Collect {
    pending: Mutex<Vec<u8>>,
    file: Option<LogFile>,
}

static COLLECT: OnceLock<Collect> = OnceLock::new();

/// `[rank] ` before every line of `buf`.
fn prefixed(prefix: &str, buf: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(buf.len() + prefix.len());
    let mut start = true;
    for &c in buf {
        if start {
            out.extend_from_slice(prefix.as_bytes());
        }
        out.push(c);
        start = c == b'\n';
    }
    out
}

/// A writer that prefixes every line it is given (tracing writes one event per `write_all`).
#[derive(Clone)]
struct Prefixed<W> {
    prefix: Arc<str>,
    inner: W,
}

impl<W: Write> Write for Prefixed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(&prefixed(&self.prefix, buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The collect mode's outbox on ranks > 0.
struct Outbox;

impl Write for Outbox {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(c) = COLLECT.get() {
            if let Ok(mut p) = c.pending.lock() {
                p.extend_from_slice(buf);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

fn layer<W>(
    make: W,
    ansi: bool,
) -> tracing_subscriber::fmt::Layer<
    Registry,
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    W,
>
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + 'static,
{
    tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(make)
}

/// Logging for `dpw train` in `world`: a serial world logs as before
/// ([`crate::cli::train::init_logging`]); an MPI world by `mode`.
pub fn init(log_path: Option<&Path>, world: &World, mode: MpiLog) -> Result<()> {
    if !world.is_distributed() {
        return crate::cli::train::init_logging(log_path);
    }
    let rank = world.rank();
    let tag: Arc<str> = Arc::from(format!("[{rank}] "));
    let stderr = {
        let tag = Arc::clone(&tag);
        move || Prefixed {
            prefix: Arc::clone(&tag),
            inner: std::io::stderr(),
        }
    };
    let plain_stderr = std::io::stderr;
    let errors_only = || filter_fn(|m| *m.level() == Level::ERROR);
    let mut layers: Vec<Boxed> = Vec::new();
    match (mode, world.is_root()) {
        (MpiLog::Master, true) => {
            layers.push(layer(plain_stderr, false).with_filter(env_filter()).boxed());
            if let Some(p) = log_path {
                let f = LogFile::create(p)?;
                layers.push(
                    layer(move || f.clone(), false)
                        .with_filter(env_filter())
                        .boxed(),
                );
            }
        }
        (MpiLog::Master, false) => {
            layers.push(layer(stderr, false).with_filter(errors_only()).boxed());
        }
        (MpiLog::Workers, _) => {
            layers.push(layer(stderr, false).with_filter(env_filter()).boxed());
            if let Some(p) = log_path {
                let f = LogFile::create(&worker_log_path(p, rank))?;
                layers.push(
                    layer(move || f.clone(), false)
                        .with_filter(env_filter())
                        .boxed(),
                );
            }
        }
        (MpiLog::Collect, true) => {
            let file = log_path.map(LogFile::create).transpose()?;
            layers.push(layer(stderr, false).with_filter(env_filter()).boxed());
            if let Some(f) = &file {
                let (f, tag) = (f.clone(), Arc::clone(&tag));
                layers.push(
                    layer(
                        move || Prefixed {
                            prefix: Arc::clone(&tag),
                            inner: f.clone(),
                        },
                        false,
                    )
                    .with_filter(env_filter())
                    .boxed(),
                );
            }
            let _ = COLLECT.set(Collect {
                pending: Mutex::new(Vec::new()),
                file,
            });
        }
        (MpiLog::Collect, false) => {
            let tag2 = Arc::clone(&tag);
            layers.push(
                layer(
                    move || Prefixed {
                        prefix: Arc::clone(&tag2),
                        inner: Outbox,
                    },
                    false,
                )
                .with_filter(env_filter().and(filter_fn(|m| *m.level() != Level::ERROR)))
                .boxed(),
            );
            // Errors at once: the rank may be about to abort the job.
            layers.push(layer(stderr, false).with_filter(errors_only()).boxed());
            let _ = COLLECT.set(Collect {
                pending: Mutex::new(Vec::new()),
                file: None,
            });
        }
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .context("cannot set up logging")
}

/// Collective in `--mpi-log collect` (a no-op otherwise): sends the lines the ranks > 0 logged
/// since the last call to rank 0, which prints them (and writes them to its log file). Every
/// rank must call it at the same points.
pub fn flush(world: &World) {
    let Some(c) = COLLECT.get() else {
        return;
    };
    if !world.is_distributed() {
        return;
    }
    let mine = c
        .pending
        .lock()
        .map(|mut p| std::mem::take(&mut *p))
        .unwrap_or_default();
    let all = world.gather_to_root(&mine);
    if world.is_root() {
        let mut err = std::io::stderr().lock();
        for bytes in all.iter().skip(1).filter(|b| !b.is_empty()) {
            let _ = err.write_all(bytes);
            if let Some(f) = &c.file {
                let _ = f.clone().write_all(bytes);
            }
        }
        let _ = err.flush();
    }
}

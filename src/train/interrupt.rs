//! Ctrl-C (SIGINT) and SIGTERM during `dpw train`: the first one asks the loop to finish its
//! step, write a checkpoint at that step and stop; a second one ends the process at once.
//!
//! The run then exits with 128 + the signal's number (130, 143), as a shell reports a process
//! the signal ended: the run did not reach `numb_steps`, so `dpw train … && dpw freeze` must not
//! go on, and a batch scheduler must not record the job as completed. The checkpoint left
//! behind continues the run with `--restart`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

/// The signal that asked for a stop (0: none).
static REQUESTED: LazyLock<Arc<AtomicUsize>> = LazyLock::new(|| Arc::new(AtomicUsize::new(0)));

/// Catches SIGINT and SIGTERM for the rest of the process (a no-op where signals are not
/// Unix's: there the default, an immediate stop, stays).
#[cfg(unix)]
pub fn install() -> anyhow::Result<()> {
    use std::sync::atomic::AtomicBool;

    use anyhow::Context;
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag;

    let seen = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // Registered first, so it runs before `seen` is set: it exits on the second signal only.
        flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&seen))
            .and_then(|_| flag::register(sig, Arc::clone(&seen)))
            .and_then(|_| flag::register_usize(sig, Arc::clone(&REQUESTED), sig as usize))
            .with_context(|| format!("cannot catch {}", signal_name(sig as usize)))?;
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn install() -> anyhow::Result<()> {
    Ok(())
}

/// The signal that asked the run to stop, if one did.
pub fn requested() -> Option<usize> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

fn signal_name(sig: usize) -> &'static str {
    match sig {
        2 => "SIGINT",
        15 => "SIGTERM",
        _ => "a signal",
    }
}

/// A run stopped by a signal after a finished step, with its checkpoint written.
#[derive(Debug, thiserror::Error)]
#[error(
    "interrupted by {} after step {step}{}",
    signal_name(*.signal),
    .checkpoint.as_ref().map_or(String::new(), |p| format!("; checkpoint saved to {}", p.display()))
)]
pub struct Interrupted {
    pub signal: usize,
    pub step: usize,
    pub checkpoint: Option<PathBuf>,
}

impl Interrupted {
    /// What a shell reports for a process the signal ended.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

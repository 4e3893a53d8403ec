//! Ctrl-C (SIGINT) and SIGTERM during `dpw train`: the first one asks the loop to finish its
//! step, write a checkpoint at that step and stop; the process then ends by that very signal
//! (its default action, raised again), so that the parent sees a death by the signal: the run did
//! not reach `numb_steps`, so `dpw train … && dpw freeze` must not go on, a batch scheduler must
//! not record the job as completed, and a shell script running it stops as on any Ctrl-C. The
//! checkpoint left behind continues the run with `--restart`.
//!
//! A second signal within [`GRACE`] of the first is the same request: a wrapper such as `timeout`
//! or `mpirun` forwards to dpw the signal its process group got too, so one Ctrl-C arrives
//! twice. A later one stops the process at once, naming the last checkpoint.
//!
//! Before the first step (reading the data, the statistics) there is no step to finish and
//! nothing new to save: a signal then stops the process at once, saying so.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The signal that asked for a stop (0: none).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

/// The checkpoint a run stopped at once continues from.
static LAST_CHECKPOINT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Whether the training loop has begun ([`training_started`]).
static TRAINING: AtomicBool = AtomicBool::new(false);

/// How long after the first signal another one is taken as the same request.
pub const GRACE: Duration = Duration::from_secs(2);

/// What a signal asks for, given how long ago the first one came (`None`: it is the first).
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Finish the step, save a checkpoint and stop.
    Stop,
    /// The first signal again, forwarded or repeated: nothing more to do.
    Same,
    /// Stop at once, in the middle of a step.
    Now,
}

pub fn classify(since_first: Option<Duration>) -> Request {
    match since_first {
        None => Request::Stop,
        Some(t) if t < GRACE => Request::Same,
        Some(_) => Request::Now,
    }
}

/// Catches SIGINT and SIGTERM for the rest of the process, on a thread of its own (a no-op where
/// signals are not Unix's: there the default, an immediate stop, stays).
#[cfg(unix)]
pub fn install() -> anyhow::Result<()> {
    use anyhow::Context;
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::iterator::Signals;

    let mut signals = Signals::new([SIGINT, SIGTERM]).context("cannot catch SIGINT and SIGTERM")?;
    std::thread::Builder::new()
        .name("dpw-signals".into())
        .spawn(move || {
            let mut first: Option<std::time::Instant> = None;
            for sig in signals.forever() {
                let name = signal_name(sig as usize);
                match classify(first.map(|t| t.elapsed())) {
                    Request::Stop if !TRAINING.load(Ordering::SeqCst) => {
                        tracing::warn!(
                            "{name} during start-up, before the first training step: stopping \
                             now; {}",
                            resume_note()
                        );
                        stop_now(sig as usize);
                    }
                    Request::Stop => {
                        first = Some(std::time::Instant::now());
                        REQUESTED.store(sig as usize, Ordering::SeqCst);
                        tracing::warn!(
                            "{name}: finishing the step, then saving a checkpoint and stopping \
                             (another signal after {} s stops at once)",
                            GRACE.as_secs()
                        );
                    }
                    Request::Same => tracing::info!(
                        "{name} within {} s of the first signal: the same request",
                        GRACE.as_secs()
                    ),
                    Request::Now => {
                        tracing::warn!(
                            "{name} after the first signal: stopping at once, in the middle of \
                             a step; {}",
                            resume_note()
                        );
                        stop_now(sig as usize);
                    }
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

#[cfg(not(unix))]
pub fn install() -> anyhow::Result<()> {
    Ok(())
}

/// Where a run stopped at once goes on from.
#[cfg(unix)]
fn resume_note() -> String {
    let last = LAST_CHECKPOINT.lock().ok().and_then(|p| p.clone());
    last.map_or_else(
        || "no checkpoint has been written yet".to_string(),
        |p| {
            format!(
                "continue from the last checkpoint with --restart {}",
                p.display()
            )
        },
    )
}

/// Ends the process by `signal` from the signal thread, without unwinding the run: its lock
/// files are removed here, as the run would on its way out.
#[cfg(unix)]
fn stop_now(signal: usize) {
    super::outputs::remove_lock_files();
    end_by(signal);
}

/// Marks the start of the training loop: from now on a signal lets the step finish and saves a
/// checkpoint.
pub fn training_started() {
    TRAINING.store(true, Ordering::SeqCst);
}

/// Catches SIGXFSZ for the rest of the process. Its default action kills the process when a
/// write passes the file size limit (`ulimit -f`), silently and with the temporary file left
/// behind; caught, the signal lets the write fail with EFBIG instead, which is reported naming
/// the file, as a full disk is.
#[cfg(unix)]
pub fn survive_file_size_limit() -> anyhow::Result<()> {
    use anyhow::Context;
    use std::sync::{atomic::AtomicBool, Arc};
    // The flag is never read: the failed write itself says what happened.
    signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        Arc::new(AtomicBool::new(false)),
    )
    .context("cannot catch SIGXFSZ")?;
    Ok(())
}

#[cfg(not(unix))]
pub fn survive_file_size_limit() -> anyhow::Result<()> {
    Ok(())
}

/// The signal that asked the run to stop, if one did.
pub fn requested() -> Option<usize> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Records the checkpoint a run stopped at once would continue from.
pub fn note_checkpoint(path: &Path) {
    if let Ok(mut last) = LAST_CHECKPOINT.lock() {
        *last = Some(path.to_path_buf());
    }
}

/// Ends the process by `signal` with its default action. Where that cannot be done, the exit
/// code a shell gives a process the signal ended (128 + its number) is returned instead.
pub fn end_by(signal: usize) -> ExitCode {
    #[cfg(unix)]
    if let Ok(sig) = i32::try_from(signal) {
        let _ = signal_hook::low_level::emulate_default_handler(sig);
    }
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(1))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_signal_within_the_grace_is_the_same_request() {
        assert_eq!(classify(None), Request::Stop);
        assert_eq!(classify(Some(Duration::from_millis(1))), Request::Same);
        assert_eq!(
            classify(Some(GRACE - Duration::from_millis(1))),
            Request::Same
        );
        assert_eq!(classify(Some(GRACE)), Request::Now);
        assert_eq!(classify(Some(Duration::from_secs(60))), Request::Now);
    }
}

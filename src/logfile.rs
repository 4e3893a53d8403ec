//! The log file of `-l/--log-path`: shared by the command line and the MPI ranks' collected
//! log (`dist::log`), so it sits below both. It never replaces a file that is not a dpw log,
//! and a failed write is said once rather than failing the run.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};

/// The first failed write of the log file (`-l`): the file and the error. Logging cannot fail,
/// so the run goes on with its lines on stderr, and the command ends with an error saying that
/// the file lacks them ([`log_write_error`]).
static LOG_WRITE_ERROR: OnceLock<String> = OnceLock::new();

/// Why the log file lacks lines, if a write to it failed (a full disk, a file that takes no
/// writes).
pub fn log_write_error() -> Option<&'static str> {
    LOG_WRITE_ERROR.get().map(String::as_str)
}

/// The log file (`-l FILE`), shared by the layers that write to it.
#[derive(Clone)]
pub struct LogFile {
    path: Arc<PathBuf>,
    file: Arc<Mutex<File>>,
}

impl LogFile {
    /// Creates (or empties) the log file at `p`; an existing regular file that is not a dpw
    /// log is refused, since emptying it would lose what it holds (a checkpoint, data, an
    /// input given by mistake).
    pub fn create(p: &Path) -> Result<Self> {
        check_replaceable(p)?;
        let file =
            File::create(p).with_context(|| format!("cannot create log file {}", p.display()))?;
        Ok(LogFile {
            path: Arc::new(p.to_path_buf()),
            file: Arc::new(Mutex::new(file)),
        })
    }
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    /// Never fails: the first error is kept and said on stderr once, and the lines that follow
    /// are not tried (tracing would print a complaint for each of them).
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if LOG_WRITE_ERROR.get().is_some() {
            return Ok(());
        }
        let Ok(mut f) = self.file.lock() else {
            return Ok(());
        };
        if let Err(e) = f.write_all(buf) {
            let why = format!("cannot write the log file {}: {e}", self.path.display());
            if LOG_WRITE_ERROR.set(why.clone()).is_ok() {
                eprintln!("error: {why}; the log lines from here on are only on stderr");
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Refuses `p` when it is a regular file that holds something other than a dpw log. An empty
/// file, a missing one, and what is no regular file (`/dev/null`, a pipe) are taken.
fn check_replaceable(p: &Path) -> Result<()> {
    if !std::fs::metadata(p).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    // Enough for a first log line; the size in the metadata is 0 for files like /proc's.
    let mut head = Vec::new();
    File::open(p)
        .and_then(|f| f.take(512).read_to_end(&mut head))
        .with_context(|| {
            format!(
                "-l/--log-path {}: cannot read the existing file to check that it is a dpw log",
                p.display()
            )
        })?;
    let first = String::from_utf8_lossy(&head);
    let first = first.lines().next().unwrap_or("");
    if head.is_empty() || is_log_line(first) {
        return Ok(());
    }
    bail!(
        "-l/--log-path {}: the file exists and is not a dpw log; dpw does not replace it, since \
         what it holds would be lost: remove it first, or give another name",
        p.display()
    )
}

/// Whether `line` is a line of a dpw log: `TIME LEVEL ...` as tracing writes it (RFC 3339 UTC
/// time), after `[rank] ` in an MPI run's collected log.
fn is_log_line(line: &str) -> bool {
    let line = match line.strip_prefix('[').and_then(|r| r.split_once("] ")) {
        Some((rank, rest)) if rank.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => line,
    };
    let mut words = line.split_whitespace();
    let (Some(time), Some(level)) = (words.next(), words.next()) else {
        return false;
    };
    let t = time.as_bytes();
    t.len() >= 20
        && t[..4].iter().all(u8::is_ascii_digit)
        && (t[4], t[7], t[10]) == (b'-', b'-', b'T')
        && time.ends_with('Z')
        && ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level)
}

#[cfg(test)]
mod tests {
    use super::is_log_line;

    #[test]
    fn log_lines_are_known_by_time_and_level() {
        assert!(is_log_line(
            "2026-12-02T00:32:02.890532Z  INFO dpw 0.1.0 train input.json"
        ));
        assert!(is_log_line(
            "[0] 2026-12-02T00:32:02.890532Z  WARN something"
        ));
        for other in [
            "\u{93}NUMPY\u{1}",
            "#  step      rmse_val    rmse_trn",
            "{",
            "Linux version 6.1.0",
            "2026-12-02 notes",
            "[x] 2026-12-02T00:32:02.890532Z  INFO a",
        ] {
            assert!(!is_log_line(other), "{other}");
        }
    }
}

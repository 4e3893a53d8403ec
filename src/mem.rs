//! Allocations big enough to fail (batch workspaces, frames kept on the device, data read in):
//! made fallibly, so that a machine without the memory (or a `ulimit -v`) gets an error naming
//! what was being allocated, how much, and what lowers it, instead of Rust's abort, which says
//! only "memory allocation of N bytes failed".

/// An allocation that failed, or was refused before it was made for exceeding a limit (`limit`:
/// which; empty where the memory was simply not there), with the setting that lowers it
/// (empty: none).
#[derive(Debug, thiserror::Error)]
#[error(
    "{}cannot allocate {:.1} MiB for {what}{}{}",
    if .limit.is_empty() { "out of memory: " } else { "" },
    *.bytes as f64 / (1u64 << 20) as f64,
    if .limit.is_empty() { String::new() } else { format!(": {}", .limit) },
    if .knob.is_empty() { String::new() } else { format!("; {}", .knob) }
)]
pub struct OutOfMemory {
    pub what: String,
    pub bytes: usize,
    pub limit: String,
    pub knob: String,
}

impl OutOfMemory {
    /// The same failure, with `knob`, the setting that lowers it.
    pub fn lowered_by(self, knob: impl Into<String>) -> Self {
        OutOfMemory {
            knob: knob.into(),
            ..self
        }
    }
}

/// Bytes of host memory a new allocation can take without swapping (Linux's `MemAvailable`);
/// `None` where the system does not say.
pub fn host_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// An empty vector with room for `n` items, or the failure naming `what`.
pub fn try_with_capacity<T>(
    n: usize,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>, OutOfMemory> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| OutOfMemory {
        what: what(),
        bytes: n.saturating_mul(size_of::<T>()),
        limit: String::new(),
        knob: String::new(),
    })?;
    Ok(v)
}

/// `n` copies of `x`, or the failure naming `what`.
pub fn try_filled<T: Clone>(
    n: usize,
    x: T,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>, OutOfMemory> {
    let mut v = try_with_capacity(n, what)?;
    v.resize(n, x);
    Ok(v)
}

/// Checks that `bytes` more can be allocated now, for buffers that are then made one at a time
/// without a way to fail: where the room is missing (a small machine, a `ulimit -v`), this
/// error instead of an abort halfway. The room is reserved and given back at once, so nothing
/// stays allocated (and, under overcommit, nothing is touched).
pub fn check_room(bytes: usize, what: impl FnOnce() -> String) -> Result<(), OutOfMemory> {
    try_with_capacity::<u8>(bytes, what).map(drop)
}

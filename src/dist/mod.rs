//! Data-parallel training over MPI (cargo feature `mpi`): the process's world (rank, size, node),
//! the collectives the trainer needs (an all-reduce of the gradient, a parameter checksum, an
//! agreement on errors), how the global batch is split, and rank-aware logging ([`log`]).
//!
//! Without the feature, or when dpw was not started by an MPI launcher, the world is serial
//! (size 1) and every collective is the identity. Started by `mpirun -np N` (N > 1) without the
//! feature, dpw stops with [`BUILD_HINT`].
//!
//! The scheme: every rank runs the same seeded sampler and draws the *global* batch of the step
//! (`size × batch_size` frames of one system, [`crate::data::Sampler::next_batches`]); rank r
//! takes frames `[r·b, (r+1)·b)` ([`rank_slice`]), computes the gradient of the mean loss over
//! its frames and weights it by its share of the frames; one all-reduce sums the weighted
//! gradients and the squared-error sums of the loss, so every rank applies the same Adam update
//! to the same parameters, and the displayed RMSEs are those of the whole global batch. On CUDA
//! with a GPU per rank that all-reduce goes through NCCL on the device buffers (`exchange`).

mod comm;
mod device_link;
mod exchange;
pub mod log;
#[cfg(all(feature = "mpi", feature = "cuda"))]
mod nccl;
pub mod reduce_path;

use std::hash::Hasher as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use comm::Guard;
pub use device_link::DeviceLink;
pub use exchange::GradExchange;

use crate::config::ScaleByWorker;

/// What a user sees when dpw was started by an MPI launcher but built without MPI.
pub const BUILD_HINT: &str = "dpw was started by an MPI launcher (mpirun/srun) with more than one \
process, but this dpw is built without MPI support, so every process would train alone and they \
would overwrite each other's files. Build it with MPI: `cargo build --release --features mpi` \
(needs an MPI library with its headers, e.g. Debian/Ubuntu's libopenmpi-dev and openmpi-bin, and \
libclang-dev), or run a single process";

/// Without the `mpi` feature a launcher's world of more than one process (`launcher_size`, as
/// [`launcher_world_size`] reads it) cannot be joined: each process would train alone.
pub fn refuse_launcher_world_without_mpi(launcher_size: Option<usize>) -> anyhow::Result<()> {
    match launcher_size {
        Some(n) if n > 1 => anyhow::bail!("{n} processes: {BUILD_HINT}"),
        _ => Ok(()),
    }
}

/// The processes of this run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct World {
    rank: usize,
    size: usize,
    /// Rank among the processes on this node (picks the GPU), and their number.
    local_rank: usize,
    local_size: usize,
    host: String,
    /// Which MPI library, when running under MPI.
    library: Option<String>,
}

static WORLD: OnceLock<World> = OnceLock::new();

/// The world of this process: the one [`init`] found, else a serial one.
pub fn world() -> &'static World {
    WORLD.get_or_init(World::serial)
}

/// Detects the MPI world (with the `mpi` feature, when an MPI launcher started dpw) and makes it
/// the process's [`world`]. Keep the guard alive until the end of `main`: dropping it finalizes
/// MPI. With more than one rank, a panic on any rank aborts the whole job.
pub fn init() -> anyhow::Result<Guard> {
    let (guard, w) = comm::init()?;
    if w.size > 1 {
        install_panic_hook(w.rank, w.size);
    }
    // A second init keeps the first world (only tests could call it twice).
    let _ = WORLD.set(w);
    Ok(guard)
}

/// The world size an MPI launcher announces in the environment (Open MPI, MPICH/Hydra, Intel
/// MPI, PMI-2 under Slurm), if any.
pub fn launcher_world_size() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
}

/// The rank an MPI launcher announces in the environment, if any.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
}

/// The rank on this node an MPI launcher announces, if any.
pub fn launcher_local_rank() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "PMI_LOCAL_RANK",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

impl World {
    /// One process, no MPI.
    pub fn serial() -> World {
        World {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            host: hostname(),
            library: None,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Rank 0, which alone writes out.json, lcurve.out and checkpoints.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    pub fn is_distributed(&self) -> bool {
        self.size > 1
    }

    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    pub fn local_size(&self) -> usize {
        self.local_size
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// Element-wise sum over all ranks into `recv` (as long as `send`); every rank gets the
    /// same result.
    pub fn sum_into(&self, send: &[f64], recv: &mut [f64]) {
        assert_eq!(send.len(), recv.len(), "sum_into: buffer lengths differ");
        if self.size > 1 {
            comm::sum_into(send, recv);
        } else {
            recv.copy_from_slice(send);
        }
    }

    /// (minimum, maximum) of `x` over all ranks.
    pub fn min_max(&self, x: u64) -> (u64, u64) {
        if self.size > 1 {
            comm::min_max(x)
        } else {
            (x, x)
        }
    }

    /// Every rank's string, in rank order, on every rank.
    pub fn all_gather_str(&self, s: &str) -> Vec<String> {
        if self.size > 1 {
            comm::all_gather_bytes(s.as_bytes())
                .into_iter()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect()
        } else {
            vec![s.to_string()]
        }
    }

    /// Every rank's bytes on rank 0 (in rank order, rank 0's own first); empty elsewhere.
    pub fn gather_to_root(&self, bytes: &[u8]) -> Vec<Vec<u8>> {
        if self.size > 1 {
            comm::gather_to_root(self.rank, self.size, bytes)
        } else {
            vec![bytes.to_vec()]
        }
    }

    /// Rank 0's values on every rank.
    pub fn broadcast(&self, buf: &mut [f64]) {
        if self.size > 1 {
            comm::broadcast(buf);
        }
    }

    /// Rank 0's bytes on every rank (the NCCL communicator's id).
    pub fn broadcast_bytes(&self, buf: &mut [u8]) {
        if self.size > 1 {
            comm::broadcast_bytes(buf);
        }
    }

    /// Collective: rank 0's parameters and statistics on every rank, so all ranks start from
    /// the same model bit for bit (DDP's broadcast of the initial parameters).
    pub fn broadcast_model(&self, m: &mut crate::model::Model) {
        if self.size == 1 {
            return;
        }
        let parts = [&mut m.params, &mut m.davg, &mut m.dstd, &mut m.bias];
        let mut buf: Vec<f64> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        self.broadcast(&mut buf);
        let mut at = 0;
        for p in parts {
            let n = p.len();
            p.copy_from_slice(&buf[at..at + n]);
            at += n;
        }
    }

    pub fn barrier(&self) {
        if self.size > 1 {
            comm::barrier();
        }
    }

    /// Ends the whole job at once (`MPI_Abort`); a plain exit without MPI.
    pub fn abort(&self, code: i32) -> ! {
        if self.size > 1 {
            comm::abort(code)
        }
        std::process::exit(code)
    }

    /// Logs `e` as this rank's reason and ends the whole job (`MPI_Abort`), so that no other
    /// rank waits forever in a collective for this one.
    pub fn fail(&self, e: &anyhow::Error) -> ! {
        tracing::error!("{}: {e:#}", self.who());
        eprintln_flush();
        self.abort(1)
    }

    /// "rank r of n on host".
    pub fn who(&self) -> String {
        format!("rank {} of {} on {}", self.rank, self.size, self.host)
    }

    /// Collective: the ranks agree on whether a step that may fail on some of them succeeded.
    /// All failed (the usual case: they read the same input): rank 0 reports its error, the
    /// others return [`Reported`]. Some failed: each failing rank logs its error, and after a
    /// barrier (so the messages are out) every rank returns [`Reported`] and exits. Every rank
    /// must call it at the same point.
    pub fn agree<T>(&self, r: anyhow::Result<T>) -> anyhow::Result<T> {
        if self.size == 1 {
            return r;
        }
        let failed = self.all_gather_str(if r.is_err() { "1" } else { "0" });
        let bad: Vec<usize> = (0..self.size).filter(|&i| failed[i] == "1").collect();
        if bad.is_empty() {
            return r;
        }
        if bad.len() == self.size {
            return match r {
                Err(e) if self.is_root() => Err(e),
                _ => Err(Reported.into()),
            };
        }
        if let Err(e) = &r {
            tracing::error!("{}: {e:#}", self.who());
            eprintln_flush();
        } else if self.is_root() {
            tracing::error!("stopping: rank(s) {bad:?} failed (their messages are above)");
        }
        self.barrier();
        Err(Reported.into())
    }

    /// The factor `learning_rate.scale_by_worker` applies to the learning rate.
    pub fn lr_scale(&self, how: ScaleByWorker) -> f64 {
        lr_scale(how, self.size)
    }
}

fn eprintln_flush() {
    use std::io::Write as _;
    let _ = std::io::stderr().flush();
}

/// An error already reported by some rank: exit non-zero without another message.
#[derive(Debug, thiserror::Error)]
#[error("already reported")]
pub struct Reported;

/// The lr factor of `scale_by_worker` for `size` workers, as DeePMD-kit's TF trainer applies it.
pub fn lr_scale(how: ScaleByWorker, size: usize) -> f64 {
    match how {
        ScaleByWorker::Linear => size as f64,
        ScaleByWorker::Sqrt => (size as f64).sqrt(),
        ScaleByWorker::None => 1.0,
    }
}

/// The frames of a global batch of `n` frames that `rank` takes when each rank's share is `b`:
/// `[r·b, (r+1)·b)` clipped to `n` (the global batch is shorter at the end of an epoch; then
/// the last ranks get fewer frames, or none).
pub fn rank_slice(n: usize, b: usize, rank: usize) -> Range<usize> {
    (rank * b).min(n)..((rank + 1) * b).min(n)
}

/// A cheap, exact fingerprint of the parameters (FNV-1a over the bits of every value): equal
/// on all ranks iff the parameters are bit-identical.
pub fn checksum(params: &[f64]) -> u64 {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for x in params {
        h.write_u64(x.to_bits());
    }
    h.finish()
}

struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// DeePMD-kit's per-rank log file for `--mpi-log workers`: `name_R.ext`, or `name.R` when the
/// name has no extension.
pub fn worker_log_path(path: &Path, rank: usize) -> PathBuf {
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => path.with_file_name(format!(
            "{}_{rank}.{}",
            stem.to_string_lossy(),
            ext.to_string_lossy()
        )),
        _ => path.with_extension(rank.to_string()),
    }
}

/// The GPU a rank uses: its local rank on the node, modulo the number of visible GPUs.
pub fn gpu_ordinal(local_rank: usize, visible: usize) -> usize {
    if visible == 0 {
        0
    } else {
        local_rank % visible
    }
}

/// The GPUs a launcher or the user made visible (`CUDA_VISIBLE_DEVICES`, else
/// `HIP_VISIBLE_DEVICES` / `ROCR_VISIBLE_DEVICES`), as written.
pub fn visible_devices() -> Option<(&'static str, String)> {
    [
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    ]
    .into_iter()
    .find_map(|k| std::env::var(k).ok().map(|v| (k, v)))
}

/// Collective: DeePMD-kit's start-up summary of the run's processes: distributed or not, the
/// world size, this rank, the node list, each rank's host and the computing device it opened,
/// and for GPU backends the visible devices.
pub fn summary(w: &World, backend: &str) -> Vec<String> {
    let gpu = !backend.starts_with("cpu");
    let visible = visible_devices();
    // The backend's name is the device this rank opened (cli/backend.rs picks it by local rank).
    let device = if gpu {
        format!(
            "{backend} (local rank {} of {})",
            w.local_rank, w.local_size
        )
    } else {
        backend.to_string()
    };
    let me = format!("{}\t{}", w.host, device);
    let all = w.all_gather_str(&me);
    let mut nodes: Vec<&str> = Vec::new();
    for a in &all {
        let h = a.split('\t').next().unwrap_or("");
        if !nodes.contains(&h) {
            nodes.push(h);
        }
    }
    let mut lines = vec![
        "---Summary of the training---------------------------------------".to_string(),
        match &w.library {
            Some(lib) if w.is_distributed() => format!("distributed:          yes ({lib})"),
            _ => "distributed:          no".to_string(),
        },
        format!("world size:           {}", w.size),
        format!("my rank:              {}", w.rank),
        format!("node list:            {nodes:?}"),
    ];
    for (r, a) in all.iter().enumerate() {
        let (h, d) = a.split_once('\t').unwrap_or((a, ""));
        lines.push(format!(
            "rank {r:<3} running on:  {h}; computing device: {d}"
        ));
    }
    if gpu {
        lines.push(match &visible {
            Some((k, v)) => format!("visible GPUs:         {k}={v}"),
            None => "visible GPUs:         all (CUDA_VISIBLE_DEVICES unset)".to_string(),
        });
    }
    lines
}

/// Installs a panic hook that, after the usual message, names the rank and aborts the whole
/// MPI job, so the other ranks do not wait for this one forever.
fn install_panic_hook(rank: usize, size: usize) {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("[{rank}] error: rank {rank} of {size}: {info}");
        prev(info);
        eprintln!("[{rank}] aborting the MPI job");
        eprintln_flush();
        comm::abort(101);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Sampler;

    #[test]
    fn ranks_slices_of_the_global_batch_are_the_big_batch() {
        // N ranks drawing N batches' worth from one sampler see exactly the batches of one rank
        // with N times the batch size, split in order.
        let nf = [7, 5, 9];
        let (b, n) = (2, 3);
        let probs = vec![0.2, 0.3, 0.5];
        let mut big = Sampler::new(&nf, &[b * n; 3], probs.clone(), 42);
        let mut mine = Sampler::new(&nf, &[b; 3], probs, 42);
        for _ in 0..50 {
            let (s1, f1) = big.next_batch();
            let (s2, f2) = mine.next_batches(n);
            assert_eq!((s1, &f1), (s2, &f2));
            let joined: Vec<usize> = (0..n)
                .flat_map(|r| f2[rank_slice(f2.len(), b, r)].to_vec())
                .collect();
            assert_eq!(joined, f1);
        }
    }

    #[test]
    fn slices_at_the_end_of_an_epoch() {
        assert_eq!(rank_slice(3, 2, 0), 0..2);
        assert_eq!(rank_slice(3, 2, 1), 2..3);
        assert_eq!(rank_slice(3, 2, 2), 3..3);
    }

    #[test]
    fn lr_scales() {
        assert_eq!(lr_scale(ScaleByWorker::Linear, 4), 4.0);
        assert_eq!(lr_scale(ScaleByWorker::Sqrt, 4), 2.0);
        assert_eq!(lr_scale(ScaleByWorker::None, 4), 1.0);
    }

    #[test]
    fn worker_logs_and_checksums() {
        assert_eq!(
            worker_log_path(Path::new("/a/train.log"), 3),
            Path::new("/a/train_3.log")
        );
        assert_eq!(worker_log_path(Path::new("log"), 1), Path::new("log.1"));
        assert_ne!(checksum(&[1.0, 2.0]), checksum(&[2.0, 1.0]));
        assert_ne!(checksum(&[0.0]), checksum(&[-0.0]));
        assert_eq!(gpu_ordinal(5, 4), 1);
    }
}

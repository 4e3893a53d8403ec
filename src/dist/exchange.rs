//! The gradient exchange of each step: one all-reduce of every rank's share-weighted gradient
//! and of the loss sums, through NCCL on the GPUs' buffers where every rank has a GPU of its own
//! and NCCL loads, else through host MPI ([`super::reduce_path`] decides, at the first step).
//!
//! Numbers: both paths compute Σ_r share_r·grad_r and Σ_r sums_r, so the mean over the global
//! batch. Host MPI multiplies and sums in f64 and rounds to T once; NCCL multiplies on the
//! device in T and sums in T in its own (ring or tree) order. In float64 with two ranks both
//! are bit-identical (one addition of the same two products); with more ranks, or in float32,
//! they may differ at the rounding level. A serial run exchanges nothing.

use std::time::Instant;

use super::device_link::DeviceLink;
use super::reduce_path::{choose, RankFacts, ReducePath};
use super::World;
use crate::backend::{Backend, Real};

/// How the gradient is exchanged, once chosen.
enum Path {
    Host,
    #[cfg(all(feature = "mpi", feature = "cuda"))]
    Nccl(super::nccl::Comm),
}

/// The exchange: the path, the host buffers (which persist across steps), and where the time
/// goes (waiting for the slowest rank, the all-reduce itself, and the whole exchange with the
/// device copies).
pub struct GradExchange<'a, T, Buf> {
    link: DeviceLink<'a, T, Buf>,
    path: Option<Path>,
    send: Vec<f64>,
    recv: Vec<f64>,
    pub steps: usize,
    /// Seconds in a barrier before the all-reduce: waiting for the slowest rank.
    pub t_wait: f64,
    /// Seconds in the all-reduce proper.
    pub t_reduce: f64,
    /// Seconds of the whole exchange, device copies included (kept by the caller).
    pub t_total: f64,
}

/// `DPW_NCCL=0` (or `false`, `no`, `off`): host MPI even where NCCL could run. (A bad value
/// has been refused at start-up, `crate::settings::check_all`.)
fn nccl_disabled() -> bool {
    matches!(crate::settings::NCCL.get(), Ok(Some(false)))
}

/// This rank's facts for the choice of path.
fn my_facts<T: Real, B: Backend<T>>(w: &World, b: &B, link: &DeviceLink<T, B::Buf>) -> RankFacts {
    #[cfg(feature = "cuda")]
    let gpu = link.cuda_access().map(|d| d.device_uuid());
    #[cfg(not(feature = "cuda"))]
    let _ = link;
    #[cfg(not(feature = "cuda"))]
    let gpu = None;
    #[cfg(all(feature = "mpi", feature = "cuda"))]
    let nccl = match gpu {
        Some(_) => super::nccl::probe(),
        None => Err("not a CUDA backend".to_string()),
    };
    #[cfg(not(all(feature = "mpi", feature = "cuda")))]
    let nccl = Err("dpw was built without NCCL (features mpi and cuda)".to_string());
    RankFacts {
        host: w.host().to_string(),
        backend: b.name(),
        gpu,
        nccl,
    }
}

/// Collective: every rank's facts, the path they agree on, said in the log, and the NCCL
/// communicator when that is the path.
fn open_path<T: Real, B: Backend<T>>(w: &World, b: &B, link: &DeviceLink<T, B::Buf>) -> Path {
    let mine = serde_json::to_string(&my_facts(w, b, link)).expect("facts serialize");
    let facts: Vec<RankFacts> = w
        .all_gather_str(&mine)
        .iter()
        .map(|s| serde_json::from_str(s).expect("a rank's facts"))
        .collect();
    match choose(&facts, nccl_disabled()) {
        ReducePath::Host { why: None } => {
            tracing::info!("gradient all-reduce: host MPI (the backend is not CUDA)");
            Path::Host
        }
        ReducePath::Host { why: Some(why) } => {
            tracing::warn!("gradient all-reduce: host MPI, not NCCL: {why}");
            Path::Host
        }
        #[cfg(all(feature = "mpi", feature = "cuda"))]
        ReducePath::Nccl(version) => {
            let dev = link
                .cuda_access()
                .expect("a CUDA backend (checked by choose)");
            match super::nccl::Comm::new(w, dev.stream().clone()) {
                Ok(c) => {
                    tracing::info!(
                        "gradient all-reduce: NCCL {version} on the GPUs' buffers ({} ranks, \
                         one GPU each)",
                        w.size()
                    );
                    Path::Nccl(c)
                }
                // Rank 0 could not make the id, and said so.
                Err(e) if e.is::<super::Reported>() => w.abort(1),
                // The ranks may be half-way into the communicator: no way back to host MPI.
                Err(e) => w.fail(&e.context(
                    "setting up NCCL for the gradient all-reduce (DPW_NCCL=0 uses host MPI)",
                )),
            }
        }
        #[cfg(not(all(feature = "mpi", feature = "cuda")))]
        ReducePath::Nccl(_) => unreachable!("no rank can load NCCL in this build"),
    }
}

impl<'a, T: Real, Buf> GradExchange<'a, T, Buf> {
    pub fn new(link: DeviceLink<'a, T, Buf>) -> Self {
        GradExchange {
            link,
            path: None,
            send: Vec::new(),
            recv: Vec::new(),
            steps: 0,
            t_wait: 0.0,
            t_reduce: 0.0,
            t_total: 0.0,
        }
    }

    /// Sums `share × grad` and `extra` over the ranks on the host: (the summed gradient, the
    /// summed extra).
    pub fn run(
        &mut self,
        w: &World,
        grad: impl Iterator<Item = f64>,
        share: f64,
        extra: [f64; 3],
    ) -> (&[f64], [f64; 3]) {
        self.send.clear();
        self.send.extend(grad.map(|g| g * share));
        let n = self.send.len();
        self.send.extend(extra);
        self.recv.resize(self.send.len(), 0.0);
        let t = Instant::now();
        w.barrier();
        let t1 = Instant::now();
        w.sum_into(&self.send, &mut self.recv);
        self.t_reduce += t1.elapsed().as_secs_f64();
        self.t_wait += (t1 - t).as_secs_f64();
        self.steps += 1;
        let r = &self.recv;
        (&r[..n], [r[n], r[n + 1], r[n + 2]])
    }

    /// Collective: the step's all-reduce on device buffers: `share × grad` and the loss sums (3
    /// values) summed over the ranks, in place. Host MPI reads both back, reduces on the host
    /// and writes the results into the same buffers; NCCL reduces them where they are. The
    /// first call chooses the path (every rank must make it at the same step).
    pub fn all_reduce<B: Backend<T, Buf = Buf>>(
        &mut self,
        w: &World,
        b: &B,
        grad: &mut B::Buf,
        sums: &mut B::Buf,
        share: f64,
    ) {
        let t = Instant::now();
        match self.path.get_or_insert_with(|| open_path(w, b, &self.link)) {
            Path::Host => {}
            #[cfg(all(feature = "mpi", feature = "cuda"))]
            Path::Nccl(comm) => {
                let dev = self
                    .link
                    .cuda_access()
                    .expect("NCCL is chosen for CUDA backends only");
                if let Err(e) = comm.all_reduce(dev, grad, sums, share) {
                    w.fail(&e.context("the gradient all-reduce (NCCL)"));
                }
                self.t_total += t.elapsed().as_secs_f64();
                self.steps += 1;
                return;
            }
        }
        let g = b.download(grad);
        let s = b.download(sums);
        let (reduced, extra) = self.run(
            w,
            g.iter().map(|x| x.f64()),
            share,
            [0, 1, 2].map(|i| s[i].f64()),
        );
        let reduced: Vec<T> = reduced.iter().map(|&x| T::of(x)).collect();
        b.write(grad, &reduced);
        b.write(sums, &extra.map(T::of));
        self.t_total += t.elapsed().as_secs_f64();
    }

    /// Whether the exchange goes through NCCL (known after the first [`Self::all_reduce`]).
    pub fn uses_nccl(&self) -> bool {
        match &self.path {
            #[cfg(all(feature = "mpi", feature = "cuda"))]
            Some(Path::Nccl(_)) => true,
            _ => false,
        }
    }

    /// One line for the end of the run, with `s_per_step` the average step time.
    pub fn summary(&self, w: &World, s_per_step: f64) -> String {
        let n = self.steps.max(1) as f64;
        let ms = |t: f64| 1e3 * t / n;
        let pct = |t: f64| 100.0 * t / n / s_per_step;
        #[cfg(all(feature = "mpi", feature = "cuda"))]
        if let Some(Path::Nccl(_)) = &self.path {
            return format!(
                "gradient all-reduce over {} ranks (NCCL): {:.3} ms/step ({:.2}% of a step) to \
                 enqueue it; it runs on the GPUs with the step's kernels",
                w.size(),
                ms(self.t_total),
                pct(self.t_total)
            );
        }
        format!(
            "gradient all-reduce over {} ranks ({} values): {:.3} ms/step ({:.2}% of a step); \
             waiting for the slowest rank {:.3} ms/step ({:.2}%); the whole exchange with the \
             device copies {:.3} ms/step ({:.2}%)",
            w.size(),
            self.send.len(),
            ms(self.t_reduce),
            pct(self.t_reduce),
            ms(self.t_wait),
            pct(self.t_wait),
            ms(self.t_total),
            pct(self.t_total)
        )
    }
}

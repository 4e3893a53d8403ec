//! The forward + gradient of a training step captured once as a CUDA graph and replayed, so that
//! its ~300 launches cost one launch of host time: the default, `DPW_CUDA_GRAPH=0` turns it off
//! (measured on an H100 and an H200: 8–12 % faster per step in float64, the same lcurve.out;
//! BENCHMARKS.md).
//!
//! A replay must never run with stale arguments, so a graph is never trusted, it is matched:
//! every step first runs the region dry ([`Mode::Dry`]): each kernel launch, cuBLAS GEMM,
//! memset and device-to-device copy is recorded, byte for byte (the kernel's name, its launch
//! configuration and every argument value; the GEMM's shape, addresses and scalars), instead of
//! being enqueued. A graph is replayed only when its record, taken while it was captured, equals
//! this step's record exactly; so a replay enqueues exactly what the eager step would have.
//! An op that a graph cannot hold (an upload or new allocation, a read-back, a host write)
//! makes the dry run unreplayable: the region then runs again eagerly, as without the switch.
//!
//! For the records to repeat from step to step, what changes per step is kept out of the
//! arguments: per-op scratch comes from a bump arena reset at each region (same offsets, same
//! addresses), and per-step inputs (a resident frame's owner lists, the loss prefactors) are
//! *staged*: copied into arena blocks before the graph runs, outside it, so that the graph
//! reads them at fixed addresses.

use std::sync::{Mutex, MutexGuard};
use std::thread::{self, ThreadId};

use anyhow::{Context, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{result, CudaGraph, CudaSlice, DeviceRepr, LaunchConfig};

use super::Cuda;

/// The switch, read once when the backend opens.
pub const ENV: &str = crate::settings::CUDA_GRAPH.name;

/// Whether [`ENV`] leaves graphs on (the default; `crate::settings` reads the value).
pub(super) fn enabled() -> Result<bool> {
    Ok(crate::settings::CUDA_GRAPH.get()?.unwrap_or(true))
}

/// Graphs kept: one per batch shape (and owner-list length) in use; the least recently used
/// goes when more are made.
const MAX_GRAPHS: usize = 8;

/// Graphs stop being made once this many were captured with fewer than CHURN_REPLAYS
/// replays each on average.
const CHURN_CAPTURES: u64 = 16;
const CHURN_REPLAYS: u64 = 4;

/// Arena blocks start at multiples of cudaMalloc's alignment, as separate allocations would.
const ALIGN: usize = 256;

/// cuBLAS's workspace, set by us: otherwise cuBLAS (12.2+) allocates one inside every capture.
/// NVIDIA recommends 32 MiB on Hopper, 4 MiB before.
const BLAS_WORKSPACE: usize = 32 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Outside a region, or a region that runs uncaptured: every op as without the switch.
    Eager,
    /// Record the ops, enqueue none.
    Dry,
    /// Record the ops and enqueue them into the capturing stream.
    Capture,
}

/// A copy into an arena block, made before the graph (or its capture) on the stream.
enum Staged {
    Host { dst: u64, bytes: Vec<u8> },
    Device { dst: u64, src: u64, bytes: usize },
}

/// A captured graph. CUDA graphs are not thread-safe: this one is only touched under the
/// [`Graphs`] mutex.
struct Graph(CudaGraph);
// SAFETY: every use is serialised by the mutex that owns it.
unsafe impl Send for Graph {}

struct State {
    mode: Mode,
    /// The thread running the region: ops from any other are not part of it.
    thread: Option<ThreadId>,
    /// What the region enqueues, in order (see the module docs).
    record: Vec<u8>,
    /// In a dry run: the first op that a graph cannot hold.
    taint: Option<&'static str>,
    staged: Vec<Staged>,
    arena: Option<CudaSlice<u8>>,
    /// The arena's address (0 before the first region) and length in bytes.
    base: u64,
    len: usize,
    /// Bytes of the arena handed out in this region.
    cursor: usize,
    /// Most recently used last, each with the record it was captured from.
    graphs: Vec<(Vec<u8>, Graph)>,
    /// Set when a capture failed: later regions run eagerly.
    broken: bool,
    captures: u64,
    replays: u64,
    eager: u64,
}

/// The graph state of a [`Cuda`] opened with the switch on.
pub(super) struct Graphs {
    state: Mutex<State>,
    /// Referenced by the cuBLAS handle: lives as long as the backend.
    _blas_workspace: CudaSlice<u8>,
}

/// The record of one op, built while its arguments are evaluated: `None` outside a region.
pub(super) struct Op(Option<Vec<u8>>);

impl Op {
    /// The record of an op outside any region: nothing.
    pub fn none() -> Self {
        Op(None)
    }

    /// Appends one kernel argument's bytes.
    pub fn arg<A: DeviceRepr>(&mut self, a: &A) {
        if let Some(r) = &mut self.0 {
            // SAFETY: kernel arguments are integers, floats and the #[repr(C)] structs of
            // 4-byte integers (gpu_layout), none with padding: every byte is initialised.
            let bytes =
                unsafe { std::slice::from_raw_parts((a as *const A).cast::<u8>(), size_of::<A>()) };
            r.extend_from_slice(bytes);
        }
    }

    /// Appends plain values (GEMM shapes, addresses, copy lengths).
    pub fn words(&mut self, w: &[u64]) {
        if let Some(r) = &mut self.0 {
            for v in w {
                r.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

impl Graphs {
    /// Sets a fixed cuBLAS workspace on `handle` (a capture must allocate nothing).
    pub(super) fn new(c: &Cuda, handle: cudarc::cublas::sys::cublasHandle_t) -> Result<Self> {
        let ws = c
            .stream
            .alloc_zeros::<u8>(BLAS_WORKSPACE)
            .context("CUDA graph: allocating the cuBLAS workspace")?;
        // SAFETY: a valid handle; the workspace outlives it (both live as long as the backend).
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                handle,
                c.addr(&ws) as *mut std::ffi::c_void,
                BLAS_WORKSPACE,
            )
        }
        .result()
        .context("cuBLAS: setting the workspace")?;
        Ok(Graphs {
            state: Mutex::new(State {
                mode: Mode::Eager,
                thread: None,
                record: Vec::new(),
                taint: None,
                staged: Vec::new(),
                arena: None,
                base: 0,
                len: 0,
                cursor: 0,
                graphs: Vec::new(),
                broken: false,
                captures: 0,
                replays: 0,
                eager: 0,
            }),
            _blas_workspace: ws,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts recording an op of kind `tag` (a kernel's name, "gemm", ...).
    pub(super) fn op(&self, tag: &str, cfg: Option<&LaunchConfig>) -> Op {
        if self.lock().mode() == Mode::Eager {
            return Op::none();
        }
        let mut r = Vec::with_capacity(96);
        r.extend_from_slice(tag.as_bytes());
        r.push(0);
        let mut op = Op(Some(r));
        if let Some(c) = cfg {
            let (g, b) = (c.grid_dim, c.block_dim);
            op.words(&[g.0, g.1, g.2, b.0, b.1, b.2, c.shared_mem_bytes].map(u64::from));
        }
        op
    }

    /// Ends an op: appends its record; whether to enqueue it (not in a dry run).
    pub(super) fn submit(&self, op: Op) -> bool {
        let Some(r) = op.0 else { return true };
        let mut s = self.lock();
        s.record.extend_from_slice(&r);
        s.mode != Mode::Dry
    }

    /// Before an op a graph cannot hold (`what`). In a dry run it makes the region
    /// unreplayable; the result says whether the op runs now (`skip` ops mutate existing
    /// buffers, so they wait for the eager rerun, which runs them in order).
    pub(super) fn uncapturable(&self, what: &'static str, skip: bool) -> bool {
        let mut s = self.lock();
        match s.mode() {
            Mode::Eager => true,
            Mode::Dry => {
                s.taint.get_or_insert(what);
                !skip
            }
            // The dry run before saw none: the region did not repeat itself.
            Mode::Capture => panic!(
                "{ENV}: {what} while capturing a graph, after a dry run without one: the step \
                 is not deterministic (a bug)"
            ),
        }
    }

    /// `bytes` of scratch from the arena inside a region; `None` outside.
    pub(super) fn scratch(&self, bytes: usize) -> Option<u64> {
        let mut s = self.lock();
        (s.mode() != Mode::Eager).then(|| s.bump(bytes))
    }

    /// Inside a region: an arena block of `reserve` bytes that holds `x` when the region
    /// runs (written before it, outside the graph). `None` outside a region.
    pub(super) fn stage_host(&self, x: &[u8], reserve: usize) -> Option<u64> {
        let mut s = self.lock();
        if s.mode() == Mode::Eager {
            return None;
        }
        let dst = s.bump(reserve.max(x.len()));
        if s.mode == Mode::Dry {
            s.staged.push(Staged::Host {
                dst,
                bytes: x.to_vec(),
            });
        }
        Some(dst)
    }

    /// As [`Graphs::stage_host`], for `bytes` of device memory at `src`.
    pub(super) fn stage_device(&self, src: u64, bytes: usize, reserve: usize) -> Option<u64> {
        let mut s = self.lock();
        if s.mode() == Mode::Eager {
            return None;
        }
        let dst = s.bump(reserve.max(bytes));
        if s.mode == Mode::Dry && bytes > 0 {
            s.staged.push(Staged::Device { dst, src, bytes });
        }
        Some(dst)
    }

    /// Starts a region pass in `mode`.
    fn begin(&self, mode: Mode) {
        let mut s = self.lock();
        s.mode = mode;
        s.thread = Some(thread::current().id());
        s.record.clear();
        s.taint = None;
        s.staged.clear();
        s.cursor = 0;
    }

    /// Ends a region pass: what it recorded.
    fn end(&self) -> Pass {
        let mut s = self.lock();
        s.mode = Mode::Eager;
        s.thread = None;
        Pass {
            record: std::mem::take(&mut s.record),
            taint: s.taint.take(),
            staged: std::mem::take(&mut s.staged),
            fits: s.cursor <= s.len,
        }
    }
}

impl State {
    /// The mode for an op of the calling thread.
    fn mode(&self) -> Mode {
        if self.thread == Some(thread::current().id()) {
            self.mode
        } else {
            Mode::Eager
        }
    }

    fn bump(&mut self, bytes: usize) -> u64 {
        let at = self.cursor;
        self.cursor = (at + bytes.max(1)).next_multiple_of(ALIGN);
        self.base + at as u64
    }
}

/// What one pass over a region recorded.
struct Pass {
    record: Vec<u8>,
    taint: Option<&'static str>,
    staged: Vec<Staged>,
    /// Whether the arena held all its scratch (if not, its addresses were not real).
    fits: bool,
}

impl Cuda {
    /// The training step's forward + gradient under the switch: replayed from a graph whose
    /// record equals this step's, else captured, else (an op a graph cannot hold) run eagerly.
    pub(super) fn run_graphed(&self, g: &Graphs, f: &mut dyn FnMut()) {
        if g.lock().broken {
            return f();
        }
        let dry = match self.dry_run(g, f) {
            Ok(p) => p,
            Err(why) => {
                g.lock().eager += 1;
                tracing::debug!("{ENV}: step run without a graph ({why})");
                return f();
            }
        };
        self.run_staged(&dry.staged);
        if self.replay(g, &dry.record) {
            return;
        }
        self.capture(g, f, dry.record);
    }

    /// Dry runs of `f` until the arena holds its scratch (growing it once at most).
    fn dry_run(&self, g: &Graphs, f: &mut dyn FnMut()) -> Result<Pass, &'static str> {
        for _ in 0..2 {
            g.begin(Mode::Dry);
            f();
            let pass = g.end();
            if let Some(why) = pass.taint {
                return Err(why);
            }
            if pass.fits {
                return Ok(pass);
            }
            self.grow_arena(g);
        }
        Err("the scratch arena did not settle")
    }

    /// A new arena as large as the last region asked for, plus room to grow. The graphs
    /// of the old one go with it (their records name its addresses).
    fn grow_arena(&self, g: &Graphs) {
        let mut s = g.lock();
        let len = s.cursor + s.cursor / 4;
        self.counters.buffer();
        // SAFETY: arena blocks are scratch that kernels write before they read, or staged
        // blocks written before every run of the region.
        let arena = unsafe { self.stream.alloc::<u8>(len) }.expect("cuda: allocating the arena");
        s.base = self.addr(&arena);
        s.len = len;
        s.arena = Some(arena);
        s.graphs.clear();
        tracing::debug!("{ENV}: scratch arena of {len} bytes");
    }

    /// The staged copies of a dry run, on the stream before the region runs.
    fn run_staged(&self, staged: &[Staged]) {
        let stream = self.stream.cu_stream();
        for s in staged {
            self.counters.launch();
            // SAFETY: dst is an arena block reserved for at least this many bytes, src a live
            // buffer of the backend; a pageable host source is copied before the call returns.
            match s {
                Staged::Host { dst, bytes } => {
                    self.counters.upload(bytes.len());
                    unsafe { result::memcpy_htod_async(*dst, bytes, stream) }
                }
                Staged::Device { dst, src, bytes } => unsafe {
                    result::memcpy_dtod_async(*dst, *src, *bytes, stream)
                },
            }
            .expect("cuda: staging a graph input");
        }
    }

    /// Launches the graph captured from `record`, if there is one.
    fn replay(&self, g: &Graphs, record: &[u8]) -> bool {
        let mut s = g.lock();
        let Some(i) = s.graphs.iter().position(|(r, _)| r == record) else {
            return false;
        };
        let entry = s.graphs.remove(i);
        self.counters.launch();
        entry.1 .0.launch().expect("cuda: launching a graph");
        s.graphs.push(entry);
        s.replays += 1;
        true
    }

    /// Captures `f` into a graph, keeps it under its record and launches it. A capture that
    /// fails or records other ops than the dry run (`dry`) is dropped, the step runs eagerly
    /// and so do the later ones.
    fn capture(&self, g: &Graphs, f: &mut dyn FnMut(), dry: Vec<u8>) {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        if let Err(e) = self.stream.begin_capture(mode) {
            return self.give_up(g, f, &format!("starting a capture: {e}"));
        }
        g.begin(Mode::Capture);
        f();
        let pass = g.end();
        let graph = match self.stream.end_capture(CUgraphInstantiate_flags(0)) {
            Ok(Some(graph)) if pass.record == dry => graph,
            Ok(Some(_)) => return self.give_up(g, f, "the capture differs from the dry run"),
            Ok(None) => return self.give_up(g, f, "the capture is empty"),
            Err(e) => return self.give_up(g, f, &format!("ending a capture: {e}")),
        };
        self.counters.launch();
        graph.launch().expect("cuda: launching a graph");
        let mut s = g.lock();
        if s.graphs.len() >= MAX_GRAPHS {
            s.graphs.remove(0);
        }
        s.graphs.push((pass.record, Graph(graph)));
        s.captures += 1;
        let (n, replays) = (s.captures, s.replays);
        // A capture costs more than running the step once: when graphs are not replayed several
        // times each (many batch shapes, more than MAX_GRAPHS in turn), stop making them.
        if n >= CHURN_CAPTURES && replays < CHURN_REPLAYS * n {
            s.broken = true;
            drop(s);
            tracing::warn!(
                "{ENV}: {n} captures for {replays} replays: the step's shapes do not repeat \
                 enough; training goes on without graphs"
            );
            return;
        }
        drop(s);
        tracing::debug!("{ENV}: capture {n} ({replays} replays so far)");
        // Every new capture past a few means the step's arguments are not repeating.
        if n.is_power_of_two() && n >= 4 {
            tracing::info!("{ENV}: {n} captures, {replays} replays so far");
        }
    }

    fn give_up(&self, g: &Graphs, f: &mut dyn FnMut(), why: &str) {
        tracing::warn!("{ENV}: {why}; training goes on without graphs");
        let mut s = g.lock();
        s.broken = true;
        s.eager += 1;
        drop(s);
        f();
    }
}

impl Drop for Graphs {
    fn drop(&mut self) {
        let s = self.lock();
        tracing::info!(
            "{ENV}: {} captures, {} replays, {} steps without a graph",
            s.captures,
            s.replays,
            s.eager
        );
    }
}

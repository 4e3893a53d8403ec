//! The CUDA backend: NVIDIA GPUs through the driver API (cudarc), kernels from `kernels/*.cu`
//! compiled at run time with NVRTC, cuBLAS for the dense-layer matrix products.
//!
//! Everything runs in order on one stream; buffers are device vectors ([`CudaBuf`]), and every
//! op only enqueues work, except `download`, which waits. The loss sums and the gradient norm
//! are reduced on the device, so a training step ends without a synchronisation.
//! Results are deterministic: the kernels sum in fixed orders (no floating-point atomics) and
//! cuBLAS is deterministic for a fixed device and configuration on one stream.
//!
//! The driver, NVRTC and cuBLAS libraries are loaded at run time (cudarc's dynamic loading), so
//! building needs no CUDA toolkit (the feature is on by default); [`Cuda::new`] reports a missing library
//! as an error instead of panicking.
//!
//! The forward + gradient of a training step ([`Device::replayable`]) is captured once as a
//! CUDA graph and replayed while its ops and arguments repeat (the `graph` module says how a
//! replay is matched to the step, never trusted); `DPW_CUDA_GRAPH=0` turns it off.
//! The gradient all-reduce across GPUs (NCCL) lives in src/dist and reaches the buffers through
//! [`DeviceAccess`].

mod access;
mod dense;
mod graph;
pub mod kernels;
mod tape;

pub use access::DeviceAccess;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Context, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::counts::{Counters, Counts};
use super::gpu_layout::{
    self, count, AngleParams, AttnBlockParams, AttnParams, LossParams, ScatterParams, SumParams,
    VectorParams, LOSS_CHUNK,
};
use super::monomorphic::Generic;
use super::{
    radial_scale, AdamStep, AngleOps, AttnArgs, AttnOps, AttnOpts, Backend, BlockPass, ContractOps,
    DenseIo, DenseOps, Device, Dims, EnvOps, MemoryLimits, PairOps, Prefactors, RadialOps, Real,
    Span, StripArgs, TrainOps,
};
use crate::geometry::EnvParams;
use crate::model::{Layer, TebdLayout};

/// The message when no driver library can be loaded.
pub const NO_DRIVER: &str = "no CUDA driver found (libcuda.so); use --backend cpu or wgpu";

/// A float type the kernels are instantiated for (`op_f32`, `op_f64`), with its cuBLAS GEMM.
pub trait CudaReal: Real + DeviceRepr + ValidAsZeroBits {
    /// Kernel-name suffix.
    const SUFFIX: &'static str;

    /// Column-major `c = alpha·op(a)·op(b) + beta·c` on raw device pointers (cuBLAS).
    ///
    /// # Safety
    /// The pointers must be valid device memory of this context, large enough for the shapes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn cublas_gemm(
        handle: cudarc::cublas::sys::cublasHandle_t,
        ta: cudarc::cublas::sys::cublasOperation_t,
        tb: cudarc::cublas::sys::cublasOperation_t,
        m: i32,
        n: i32,
        k: i32,
        alpha: Self,
        a: u64,
        lda: i32,
        b: u64,
        ldb: i32,
        beta: Self,
        c: u64,
        ldc: i32,
    ) -> Result<(), cudarc::cublas::result::CublasError>;
}

macro_rules! impl_cuda_real {
    ($t:ty, $suffix:literal, $gemm:ident) => {
        impl CudaReal for $t {
            const SUFFIX: &'static str = $suffix;
            unsafe fn cublas_gemm(
                handle: cudarc::cublas::sys::cublasHandle_t,
                ta: cudarc::cublas::sys::cublasOperation_t,
                tb: cudarc::cublas::sys::cublasOperation_t,
                m: i32,
                n: i32,
                k: i32,
                alpha: Self,
                a: u64,
                lda: i32,
                b: u64,
                ldb: i32,
                beta: Self,
                c: u64,
                ldc: i32,
            ) -> Result<(), cudarc::cublas::result::CublasError> {
                cudarc::cublas::result::$gemm(
                    handle,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &alpha,
                    a as *const $t,
                    lda,
                    b as *const $t,
                    ldb,
                    &beta,
                    c as *mut $t,
                    ldc,
                )
            }
        }
    };
}
impl_cuda_real!(f32, "_f32", sgemm);
impl_cuda_real!(f64, "_f64", dgemm);

// SAFETY: a #[repr(C)] struct of 4-byte integers, passed by value to kernels that declare the
// struct from its Rust layout (gpu_layout::cuda_declarations, which static_asserts the offsets).
unsafe impl DeviceRepr for gpu_layout::DenseParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::AngleParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::ScatterParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::VectorParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::SumParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::LossParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::AttnParams {}
// SAFETY: as DenseParams.
unsafe impl DeviceRepr for gpu_layout::AttnBlockParams {}

/// A device vector of T. The allocation has at least one element (CUDA allocations of zero
/// bytes are not portable); `len` is the logical length.
pub struct CudaBuf<T> {
    data: CudaSlice<T>,
    len: usize,
}

/// A device vector of i32, with a host copy: index buffers are uploaded once per batch and the
/// host copy lets the backend build, once, the inverse lists that forces are gathered with.
pub struct CudaIdx {
    data: CudaSlice<i32>,
    host: Vec<i32>,
    owned: OnceLock<Arc<Owned>>,
    /// The inverse lists of windows of this buffer (the owner tables of resident frames), by
    /// the window's start and length, so that a frame's are built once, not at every batch that uses it.
    windows: OwnedWindows,
    /// Set when the last gather copied one contiguous window of another index buffer: that
    /// buffer's lists and the window's start.
    window: Option<(OwnedWindows, usize)>,
}

type OwnedWindows = Arc<Mutex<HashMap<(usize, usize), Arc<Owned>>>>;

/// For an `owner` index buffer: the slots each atom owns, as a CSR list in increasing slot order.
/// The allocations may be longer than the lists (they are reused from batch to batch).
struct Owned {
    /// Atoms with an entry: max(owner) + 1.
    n: usize,
    start: CudaSlice<i32>,
    slot: CudaSlice<i32>,
}

/// The CSR lists of [`Owned`] from the host copy of `owner`: (atoms, start, slot). `start`
/// has `atoms + 1` entries; `slot` one per real slot.
fn owned_lists(owner: &[i32]) -> (usize, Vec<i32>, Vec<i32>) {
    let n = owner.iter().map(|&o| o + 1).max().unwrap_or(0).max(0) as usize;
    let mut start = vec![0i32; n + 1];
    for &o in owner.iter().filter(|&&o| o >= 0) {
        start[o as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut next = start.clone();
    let mut slot = vec![0i32; start[n] as usize];
    for (s, &o) in owner.iter().enumerate().filter(|(_, &o)| o >= 0) {
        let k = &mut next[o as usize];
        slot[*k as usize] = s as i32;
        *k += 1;
    }
    (n, start, slot)
}

/// The CUDA backend on one device.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A cuBLAS handle must not be used by two threads at once.
    blas: Mutex<CudaBlas>,
    /// Every kernel of every file, by full name (`env_mat_f64`), loaded once at start.
    funcs: HashMap<String, CudaFunction>,
    /// The device table of each batch shape seen, by its host copy.
    dims: Mutex<HashMap<Vec<u32>, Arc<CudaSlice<i32>>>>,
    device: String,
    arch: String,
    counters: Counters,
    /// Unless `DPW_CUDA_GRAPH=0`: the captured graphs and what matching them needs. After
    /// `blas`, which references its cuBLAS workspace, so that the handle goes first.
    graph: Option<graph::Graphs>,
    /// With `DPW_CUDA_ATTN=kernels`: DPA-1's attention block as kernels (kernels/attn_block.cu),
    /// else through its host bodies. Off by default until a GPU has run their parity suite.
    attn_kernels: bool,
    /// With `DPW_CUDA_TAPE=kernels`: DPA-2's, se_e3_tebd's and DPA-3's blocks through their tapes
    /// (`tape`), else through their host bodies. Off by default until a GPU has checked them.
    tape_kernels: bool,
}

/// Device scratch: an allocation freed in stream order when dropped, or (in a graph region) a
/// block of the graph arena.
struct Scratch<T> {
    addr: u64,
    _own: Option<CudaSlice<T>>,
}

/// Something with a device address: a device vector or scratch.
trait Addressed {
    fn address(&self, c: &Cuda) -> u64;
}

impl<T> Addressed for CudaSlice<T> {
    fn address(&self, c: &Cuda) -> u64 {
        // With event tracking off the returned guard does nothing.
        let (p, _guard) = self.device_ptr(&c.stream);
        p
    }
}

impl<T> Addressed for Scratch<T> {
    fn address(&self, _: &Cuda) -> u64 {
        self.addr
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

impl Cuda {
    /// Opens CUDA device `ordinal`: checks that the driver, NVRTC and cuBLAS libraries load,
    /// compiles every kernel file for the device's architecture and loads it.
    pub fn new(ordinal: usize) -> Result<Self> {
        // cudarc panics on the first call into a library it cannot load: check first.
        Self::require_driver()?;
        if !kernels::nvrtc_present() {
            bail!(
                "libnvrtc not found: the CUDA backend compiles its kernels at run time; install \
                 the CUDA toolkit's NVRTC (or `pip install nvidia-cuda-nvrtc-cu12`) and put its \
                 lib folder on LD_LIBRARY_PATH, or use --backend cpu or wgpu"
            );
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            bail!(
                "libcublas not found: install the CUDA toolkit's cuBLAS (or `pip install \
                 nvidia-cublas-cu12`) and put its lib folder on LD_LIBRARY_PATH, or use \
                 --backend cpu or wgpu"
            );
        }
        // A symbol missing from an old library would still panic inside cudarc: report it.
        std::panic::catch_unwind(|| Self::open(ordinal))
            .unwrap_or_else(|p| Err(anyhow!("CUDA initialisation failed: {}", panic_text(p))))
    }

    /// Fails with [`NO_DRIVER`] unless libcuda loads.
    fn require_driver() -> Result<()> {
        // SAFETY: only tries to dlopen the library under its usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            bail!(NO_DRIVER);
        }
        Ok(())
    }

    /// The number of CUDA devices this process sees (`CUDA_VISIBLE_DEVICES` applied).
    pub fn device_count() -> Result<usize> {
        Self::require_driver()?;
        std::panic::catch_unwind(|| {
            CudaContext::device_count().context("CUDA driver: counting devices")
        })
        .unwrap_or_else(|p| Err(anyhow!("CUDA initialisation failed: {}", panic_text(p))))
        .map(|n| n.max(0) as usize)
    }

    fn open(ordinal: usize) -> Result<Self> {
        let count = CudaContext::device_count().context("CUDA driver: counting devices")?;
        if count <= 0 {
            bail!("no CUDA device found; use --backend cpu or wgpu");
        }
        if ordinal >= count as usize {
            bail!("CUDA device {ordinal} does not exist ({count} found)");
        }
        let ctx = CudaContext::new(ordinal).context("CUDA: creating the context")?;
        // One stream orders everything, so cudarc's per-buffer event tracking (for several
        // streams) is not needed.
        // SAFETY: every buffer is used on the one stream below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().context("CUDA: creating a stream")?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("sm_{major}{minor}");
        let device = format!(
            "GPU {ordinal}: {}",
            ctx.name().unwrap_or_else(|_| "unknown".into())
        );
        // NVRTC runs on the host: compile the files in parallel.
        let compiled: Vec<Result<kernels::Compiled>> = std::thread::scope(|s| {
            let handles: Vec<_> = kernels::FILES
                .iter()
                .map(|f| s.spawn(|| kernels::compile(f, &arch, &[])))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| Err(anyhow!(panic_text(p)))))
                .collect()
        });
        let mut funcs = HashMap::new();
        for (file, c) in kernels::FILES.iter().zip(compiled) {
            let c = c?;
            let module = ctx
                .load_module(Ptx::from_binary(c.cubin))
                .with_context(|| format!("CUDA: loading kernels/{} for {arch}", file.name))?;
            for k in file.kernels {
                for suffix in kernels::SUFFIXES {
                    let name = format!("{k}{suffix}");
                    let f = module
                        .load_function(&name)
                        .with_context(|| format!("CUDA: kernel {name} in kernels/{}", file.name))?;
                    funcs.insert(name, f);
                }
            }
        }
        let blas = CudaBlas::new(stream.clone()).context("cuBLAS: creating a handle")?;
        // Default math: full precision (no TF32 for f32), tensor cores where they keep it.
        // SAFETY: a valid handle.
        unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                *blas.handle(),
                cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
            )
        }
        .result()
        .context("cuBLAS: setting the math mode")?;
        let graphs = graph::enabled()?;
        let attn_kernels = crate::settings::CUDA_ATTN.get()? == Some("kernels");
        let tape_kernels = crate::settings::CUDA_TAPE.get()? == Some("kernels");
        let handle = *blas.handle();
        let mut cuda = Cuda {
            ctx,
            stream,
            blas: Mutex::new(blas),
            funcs,
            dims: Mutex::new(HashMap::new()),
            device,
            arch,
            counters: Counters::default(),
            graph: None,
            attn_kernels,
            tape_kernels,
        };
        if graphs {
            cuda.graph = Some(graph::Graphs::new(&cuda, handle)?);
        }
        Ok(cuda)
    }

    /// The GPU's name and architecture, for logs: `GPU 0: NVIDIA H100 80GB HBM3 (sm_90)`, with
    /// `, graphs` when the training step is captured (`graph::ENV`).
    pub fn device_name(&self) -> String {
        let variant = if self.graph.is_some() { ", graphs" } else { "" };
        format!("{} ({}{variant})", self.device, self.arch)
    }

    /// Waits until all queued work is done.
    pub fn synchronize(&self) {
        self.uncapturable("a synchronisation", false);
        self.stream.synchronize().expect("cuda: synchronize");
    }

    /// Before an op a graph cannot hold: see [`graph::Graphs::uncapturable`]; whether to run it.
    fn uncapturable(&self, what: &'static str, skip: bool) -> bool {
        self.graph
            .as_ref()
            .is_none_or(|g| g.uncapturable(what, skip))
    }

    /// Starts the record of an op (nothing is recorded outside a graph region).
    fn op(&self, tag: &str, cfg: Option<&LaunchConfig>) -> graph::Op {
        match &self.graph {
            Some(g) => g.op(tag, cfg),
            None => graph::Op::none(),
        }
    }

    /// Ends the record of an op: whether to enqueue it (not in a dry run).
    fn submit(&self, op: graph::Op) -> bool {
        self.graph.as_ref().is_none_or(|g| g.submit(op))
    }

    fn function(&self, name: &str) -> &CudaFunction {
        self.funcs.get(name).unwrap_or_else(|| {
            panic!("cuda: no kernel {name} (kernels.rs and kernels/*.cu disagree)")
        })
    }

    /// Raw device address of a slice or scratch.
    fn addr(&self, s: &impl Addressed) -> u64 {
        s.address(self)
    }

    /// Device address of element `offset` of a buffer.
    fn at<T>(&self, b: &CudaBuf<T>, offset: usize) -> u64 {
        assert!(
            offset <= b.len,
            "cuda: offset {offset} past a buffer of {}",
            b.len
        );
        self.addr(&b.data) + (offset * std::mem::size_of::<T>()) as u64
    }

    fn ptr<T>(&self, b: &CudaBuf<T>) -> u64 {
        self.addr(&b.data)
    }

    fn idx(&self, b: &CudaIdx) -> u64 {
        self.addr(&b.data)
    }

    /// Uninitialised device scratch of n elements (at least one), freed in stream order when
    /// dropped: the stream-ordered memory pool makes this cheap. In a graph region, a block
    /// of the graph arena instead, at the same address every step.
    fn scratch<T: DeviceRepr>(&self, n: usize) -> Scratch<T> {
        let bytes = n.max(1) * size_of::<T>();
        if let Some(addr) = self.graph.as_ref().and_then(|g| g.scratch(bytes)) {
            return Scratch { addr, _own: None };
        }
        self.counters.buffer();
        // SAFETY: every scratch buffer is written by a kernel before it is read.
        let s =
            unsafe { self.stream.alloc::<T>(n.max(1)) }.expect("cuda: allocating scratch memory");
        Scratch {
            addr: self.addr(&s),
            _own: Some(s),
        }
    }

    fn upload_vec<T: DeviceRepr + ValidAsZeroBits>(&self, x: &[T]) -> CudaSlice<T> {
        self.uncapturable("an upload", false);
        self.counters.buffer();
        self.counters.upload(size_of_val(x));
        if x.is_empty() {
            return self.stream.alloc_zeros(1).expect("cuda: allocation");
        }
        self.stream.clone_htod(x).expect("cuda: upload")
    }

    /// The device copy of a batch shape's table ([`gpu_layout::shape_table`]), made once.
    fn dims_table(&self, d: &Dims) -> Arc<CudaSlice<i32>> {
        let t = gpu_layout::shape_table(d);
        let mut map = self.dims.lock().unwrap();
        if let Some(b) = map.get(&t) {
            return b.clone();
        }
        // The kernels read the table as int: every entry is below 2^31.
        let b = Arc::new(self.upload_vec(bytemuck::cast_slice::<u32, i32>(&t)));
        map.insert(t, b.clone());
        b
    }

    /// The spans of [`Device::gather`], device to device, in stream order.
    fn copy_spans<X: DeviceRepr>(
        &self,
        src: &CudaSlice<X>,
        dst: &mut CudaSlice<X>,
        spans: &[Span],
    ) {
        for s in spans.iter().filter(|s| s.len > 0) {
            if !self.dtod(
                self.addr(src),
                self.addr(dst),
                s.src,
                s.dst,
                s.len,
                size_of::<X>(),
            ) {
                continue;
            }
            self.counters.launch();
            self.stream
                .memcpy_dtod(
                    &src.slice(s.src..s.src + s.len),
                    &mut dst.slice_mut(s.dst..s.dst + s.len),
                )
                .expect("cuda: gather");
        }
    }

    /// Records a device-to-device copy of `len` values of `size` bytes, from value `from` of
    /// `src` to value `to` of `dst`: whether to enqueue it.
    fn dtod(&self, src: u64, dst: u64, from: usize, to: usize, len: usize, size: usize) -> bool {
        let mut op = self.op("dtod", None);
        op.words(&[
            src + (from * size) as u64,
            dst + (to * size) as u64,
            (len * size) as u64,
        ]);
        self.submit(op)
    }

    /// The slots each atom owns, built on first use from the host copy of `owner`.
    fn owned<'a>(&self, owner: &'a CudaIdx) -> &'a Owned {
        owner.owned.get_or_init(|| match &owner.window {
            Some((lists, at)) => {
                let mut lists = lists.lock().unwrap();
                let key = (*at, owner.host.len());
                let built = lists
                    .entry(key)
                    .or_insert_with(|| Arc::new(self.build_owned(&owner.host)));
                Arc::clone(built)
            }
            None => Arc::new(self.build_owned(&owner.host)),
        })
    }

    /// The addresses of `owned`'s lists for a kernel: in a graph region, copies staged at
    /// fixed addresses (a resident frame's lists are its own allocations), reserved for the
    /// longest lists of the batch shape so that later blocks stay in place.
    fn owned_lists(&self, d: &Dims, owned: &Owned) -> (u64, u64) {
        let lists = [
            (&owned.start, d.nbatch_atoms() + 1),
            (&owned.slot, d.nslots()),
        ];
        let [start, slot] = lists.map(|(list, longest)| {
            let bytes = list.len() * size_of::<i32>();
            self.graph
                .as_ref()
                .and_then(|g| g.stage_device(self.addr(list), bytes, longest * size_of::<i32>()))
                .unwrap_or_else(|| self.addr(list))
        });
        (start, slot)
    }

    fn build_owned(&self, owner: &[i32]) -> Owned {
        let (n, start, slot) = owned_lists(owner);
        Owned {
            n,
            start: self.upload_vec(&start),
            slot: self.upload_vec(&slot),
        }
    }

    /// After `b`'s contents changed: its inverse lists follow, rewritten into the allocations
    /// they have when they are `b`'s own (a resident frame's are shared and stay as built).
    fn refresh_owned(&self, b: &mut CudaIdx) {
        match b.owned.get_mut().and_then(Arc::get_mut) {
            Some(o) => {
                let (n, start, slot) = owned_lists(&b.host);
                o.n = n;
                self.write_grow(&mut o.start, &start);
                self.write_grow(&mut o.slot, &slot);
            }
            None => b.owned = OnceLock::new(),
        }
    }

    /// Writes `x` to the start of `dst`, which grows (a new allocation) only when too short.
    fn write_grow(&self, dst: &mut CudaSlice<i32>, x: &[i32]) {
        if !self.uncapturable("a host write", true) {
            return;
        }
        if x.len() > dst.len() {
            *dst = self.upload_vec(x);
        } else if !x.is_empty() {
            self.counters.upload(size_of_val(x));
            self.stream
                .memcpy_htod(x, &mut dst.slice_mut(0..x.len()))
                .expect("cuda: write");
        }
    }

    /// Launches `name` after raising its dynamic shared-memory limit when it needs more than
    /// the default 48 KiB.
    fn prepare(&self, name: &str, cfg: &LaunchConfig) -> &CudaFunction {
        let f = self.function(name);
        if cfg.shared_mem_bytes > 48 * 1024 {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                cfg.shared_mem_bytes as i32,
            )
            .unwrap_or_else(|e| {
                panic!(
                    "cuda: {name} needs {} bytes of shared memory: {e}",
                    cfg.shared_mem_bytes
                )
            });
        }
        f
    }

    /// Column-major cuBLAS GEMM on raw addresses; `ta`/`tb` transpose a and b.
    #[allow(clippy::too_many_arguments)]
    fn gemm<T: CudaReal>(
        &self,
        ta: bool,
        tb: bool,
        (m, n, k): (usize, usize, usize),
        a: (u64, usize),
        b: (u64, usize),
        beta: T,
        c: (u64, usize),
    ) {
        use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        if m == 0 || n == 0 {
            return;
        }
        let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let int = |v: usize| i32::try_from(v).expect("cuda: GEMM dimension above 2^31");
        let mut rec = self.op(&name::<T>("gemm"), None);
        rec.words(&[ta as u64, tb as u64, m as u64, n as u64, k as u64]);
        rec.words(&[a.0, a.1 as u64, b.0, b.1 as u64, c.0, c.1 as u64]);
        rec.arg(&beta);
        if !self.submit(rec) {
            return;
        }
        let blas = self.blas.lock().unwrap();
        self.counters.launch();
        self.ctx
            .bind_to_thread()
            .expect("cuda: binding the context");
        // SAFETY: callers pass addresses of live buffers sized for these shapes.
        unsafe {
            T::cublas_gemm(
                *blas.handle(),
                op(ta),
                op(tb),
                int(m),
                int(n),
                int(k),
                T::one(),
                a.0,
                int(a.1),
                b.0,
                int(b.1),
                beta,
                c.0,
                int(c.1),
            )
        }
        .expect("cuBLAS: gemm");
    }
}

/// Launches a kernel: `launch!(cuda, "name_f64", cfg, [arg, ...])`. Arguments are passed by
/// value: device addresses as u64, counts and indices in the op's parameter struct
/// (gpu_layout), real scalars as T or f64, in the order of the kernel's parameter list in
/// kernels/*.cu.
macro_rules! launch {
    ($cuda:expr, $name:expr, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let name: &str = $name;
        let cfg: LaunchConfig = $cfg;
        // An empty grid (an op over no rows, e.g. a type with no atoms) is an error to CUDA;
        // such a launch has nothing to do.
        let (gx, gy, gz) = cfg.grid_dim;
        if gx > 0 && gy > 0 && gz > 0 {
            let func = $cuda.prepare(name, &cfg);
            let mut args = $cuda.stream.launch_builder(func);
            let mut op = $cuda.op(name, Some(&cfg));
            $(
                let a = $arg;
                op.arg(&a);
                cudarc::driver::PushKernelArg::arg(&mut args, &a);
            )*
            if $cuda.submit(op) {
                $cuda.counters.launch();
                // SAFETY: the arguments match the kernel's parameters (kernels/*.cu) and every
                // address is that of a live buffer large enough for the shapes passed.
                unsafe { args.launch(cfg) }
                    .unwrap_or_else(|e| panic!("cuda: launching {name}: {e}"));
            }
        }
    }};
}
use launch;

/// A 1-D grid of `block`-thread blocks covering n threads.
fn grid(n: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(block as usize).max(1) as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per centre, threads over the M1 rows (a multiple of 32, at most 256), with
/// `shared` bytes of dynamic shared memory.
fn per_centre(d: &Dims, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (d.ncentres() as u32, 1, 1),
        block_dim: ((d.m1.div_ceil(32) * 32).clamp(32, 256) as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// One block of 128 threads per frame (the per-frame sums of kernels/scatter.cu).
fn per_frame(d: &Dims) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (d.nframes as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Most values of one buffer: the kernels and cuBLAS index them with 32-bit integers.
const MAX_ELEMENTS: usize = i32::MAX as usize;

fn name<T: CudaReal>(base: &str) -> String {
    format!("{base}{}", T::SUFFIX)
}

const BLOCK: u32 = 256;

monomorphic_backend!(impl Backend<f32> for Cuda, Buf = CudaBuf<f32>, Idx = CudaIdx);
monomorphic_backend!(impl Backend<f64> for Cuda, Buf = CudaBuf<f64>, Idx = CudaIdx);

impl<T: CudaReal> Device<T> for Generic<'_, Cuda> {
    type Buf = CudaBuf<T>;
    type Idx = CudaIdx;

    fn name(&self) -> String {
        format!("cuda ({})", self.device_name())
    }

    fn upload(&self, x: &[T]) -> CudaBuf<T> {
        CudaBuf {
            data: self.upload_vec(x),
            len: x.len(),
        }
    }

    fn upload_idx(&self, x: &[i32]) -> CudaIdx {
        CudaIdx {
            data: self.upload_vec(x),
            host: x.to_vec(),
            owned: OnceLock::new(),
            windows: OwnedWindows::default(),
            window: None,
        }
    }

    fn download_idx(&self, b: &CudaIdx) -> Vec<i32> {
        b.host.clone()
    }

    fn download(&self, b: &CudaBuf<T>) -> Vec<T> {
        if b.len == 0 {
            return Vec::new();
        }
        self.uncapturable("a read-back", false);
        self.counters.readback(b.len * size_of::<T>());
        let v = self
            .stream
            .clone_dtoh(&b.data.slice(0..b.len))
            .expect("cuda: download");
        self.synchronize();
        v
    }

    fn zeros(&self, n: usize) -> CudaBuf<T> {
        self.uncapturable("an allocation", false);
        self.counters.buffer();
        CudaBuf {
            data: self.stream.alloc_zeros(n.max(1)).expect("cuda: allocation"),
            len: n,
        }
    }

    fn try_zeros(&self, n: usize) -> Result<CudaBuf<T>, String> {
        if n > MAX_ELEMENTS {
            return Err(format!(
                "over the {MAX_ELEMENTS} values of a buffer the CUDA kernels index (32-bit)"
            ));
        }
        self.uncapturable("an allocation", false);
        self.counters.buffer();
        let data = self
            .stream
            .alloc_zeros(n.max(1))
            .map_err(|_| String::new())?;
        Ok(CudaBuf { data, len: n })
    }

    fn memory_limits(&self) -> MemoryLimits {
        let free = self.ctx.mem_get_info().ok().map(|(free, _)| free as u64);
        MemoryLimits {
            available: free.map(|b| {
                (
                    b,
                    format!(
                        "the {} GPU's free memory",
                        self.ctx.name().unwrap_or_default()
                    ),
                )
            }),
            largest: Some((
                (MAX_ELEMENTS * size_of::<T>()) as u64,
                "the largest buffer the CUDA kernels index (2^31 - 1 values, 32-bit)".into(),
            )),
        }
    }

    fn fill(&self, b: &mut CudaBuf<T>, v: T) {
        if b.len == 0 {
            return;
        }
        launch!(
            self,
            &name::<T>("fill"),
            grid(b.len, BLOCK),
            [VectorParams::new(b.len), v, self.ptr(b)]
        );
    }

    fn write(&self, b: &mut CudaBuf<T>, x: &[T]) {
        assert_eq!(x.len(), b.len, "write: length differs from the buffer's");
        if x.is_empty() || !self.uncapturable("a host write", true) {
            return;
        }
        self.counters.upload(size_of_val(x));
        self.stream
            .memcpy_htod(x, &mut b.data.slice_mut(0..b.len))
            .expect("cuda: write");
    }

    fn write_idx(&self, b: &mut CudaIdx, x: &[i32]) {
        assert_eq!(
            x.len(),
            b.host.len(),
            "write_idx: length differs from the buffer's"
        );
        if !self.uncapturable("a host write", true) {
            return;
        }
        if !x.is_empty() {
            self.counters.upload(size_of_val(x));
            self.stream
                .memcpy_htod(x, &mut b.data.slice_mut(0..x.len()))
                .expect("cuda: write");
        }
        b.host.copy_from_slice(x);
        b.window = None;
        self.refresh_owned(b);
    }

    fn buf_id(&self, b: &CudaBuf<T>) -> u64 {
        self.ptr(b)
    }

    fn idx_id(&self, b: &CudaIdx) -> u64 {
        self.idx(b)
    }

    fn copy(&self, src: &CudaBuf<T>, dst: &mut CudaBuf<T>, at: usize) {
        assert!(at + src.len <= dst.len, "copy past the end of a buffer");
        if src.len == 0 || !self.dtod(self.ptr(src), self.ptr(dst), 0, at, src.len, size_of::<T>())
        {
            return;
        }
        self.counters.launch();
        self.stream
            .memcpy_dtod(
                &src.data.slice(0..src.len),
                &mut dst.data.slice_mut(at..at + src.len),
            )
            .expect("cuda: copy");
    }

    fn gather(&self, src: &CudaBuf<T>, dst: &mut CudaBuf<T>, spans: &[Span]) {
        assert_eq!(
            spans.iter().map(|s| s.len).sum::<usize>(),
            dst.len,
            "gather: the spans must tile the destination"
        );
        assert!(
            spans.iter().all(|s| s.src + s.len <= src.len),
            "gather past the end of the source"
        );
        self.copy_spans(&src.data, &mut dst.data, spans);
    }

    fn gather_idx(&self, src: &CudaIdx, dst: &mut CudaIdx, spans: &[Span]) {
        // It rewrites host copies too: not something to run twice.
        if !self.uncapturable("an index gather", true) {
            return;
        }
        super::gather_slices(&src.host, &mut dst.host, spans);
        self.copy_spans(&src.data, &mut dst.data, spans);
        dst.window = super::window_start(spans).map(|at| (Arc::clone(&src.windows), at));
        if dst.window.is_some() {
            dst.owned = OnceLock::new();
        } else {
            self.refresh_owned(dst);
        }
    }

    fn replayable(&self, f: &mut dyn FnMut()) {
        match &self.graph {
            Some(g) => self.run_graphed(g, f),
            None => f(),
        }
    }

    fn wait(&self) {
        self.synchronize();
    }

    fn resident_budget(&self) -> usize {
        // As wgpu's (src/backend/wgpu/ops.rs): far below any CUDA GPU's memory.
        1 << 30
    }

    fn prepare_frames(&self, d: &Dims, owner: &CudaIdx, _centre_atom: &CudaIdx) {
        let ns = d.nslots();
        if d.nframes != 1 || ns == 0 {
            return;
        }
        let mut lists = owner.windows.lock().unwrap();
        for (g, frame) in owner.host.chunks_exact(ns).enumerate() {
            lists
                .entry((g * ns, ns))
                .or_insert_with(|| Arc::new(self.build_owned(frame)));
        }
    }
}

impl<T: CudaReal> EnvOps<T> for Generic<'_, Cuda> {
    fn env_mat(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &CudaBuf<T>,
        owner: &CudaIdx,
        davg: &CudaBuf<T>,
        dstd: &CudaBuf<T>,
        rhat: &mut CudaBuf<T>,
        jac: &mut CudaBuf<T>,
        s: &mut CudaBuf<T>,
    ) {
        if d.nslots() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("env_mat"),
            grid(d.nslots(), 128),
            [
                self.addr(&*dims),
                env.rcut,
                env.rcut_smth,
                env.protection,
                self.ptr(rij),
                self.idx(owner),
                self.ptr(davg),
                self.ptr(dstd),
                self.ptr(rhat),
                self.ptr(jac),
                self.ptr(s),
            ]
        );
    }

    fn force_virial(
        &self,
        d: &Dims,
        q: &CudaBuf<T>,
        rij: &CudaBuf<T>,
        owner: &CudaIdx,
        centre_atom: &CudaIdx,
        force: &mut CudaBuf<T>,
        virial: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        let owned = self.owned(owner);
        let (start, slot) = self.owned_lists(d, owned);
        let wpart = self.scratch::<f64>(9 * d.ncentres());
        // Every atom is a centre, so every force is written below; zero first all the same,
        // so an atom that is no centre can never keep stale values.
        let mut op = self.op("memset", None);
        op.words(&[self.ptr(force), (force.data.len() * size_of::<T>()) as u64]);
        if self.submit(op) {
            self.stream
                .memset_zeros(&mut force.data)
                .expect("cuda: memset");
        }
        launch!(
            self,
            &name::<T>("force_centres"),
            // A warp per centre.
            grid(32 * d.ncentres(), 32 * gpu_layout::FORCE_WARPS as u32),
            [
                ScatterParams {
                    n_owned: gpu_layout::count(owned.n),
                    ..ScatterParams::new(d)
                },
                self.addr(&*dims),
                self.ptr(q),
                self.ptr(rij),
                self.idx(owner),
                self.idx(centre_atom),
                start,
                slot,
                self.ptr(force),
                self.addr(&wpart)
            ]
        );
        launch!(
            self,
            &name::<T>("virial_frames"),
            per_frame(d),
            [self.addr(&*dims), self.addr(&wpart), self.ptr(virial)]
        );
    }

    fn virtual_tangent(
        &self,
        d: &Dims,
        fres: &CudaBuf<T>,
        vres: &CudaBuf<T>,
        jac: &CudaBuf<T>,
        rij: &CudaBuf<T>,
        owner: &CudaIdx,
        centre_atom: &CudaIdx,
        rdot: &mut CudaBuf<T>,
        sdot: &mut CudaBuf<T>,
    ) {
        if d.nslots() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("virtual_tangent"),
            grid(d.nslots(), 128),
            [
                self.addr(&*dims),
                self.ptr(fres),
                self.ptr(vres),
                self.ptr(jac),
                self.ptr(rij),
                self.idx(owner),
                self.idx(centre_atom),
                self.ptr(rdot),
                self.ptr(sdot)
            ]
        );
    }
}

impl<T: CudaReal> DenseOps<T> for Generic<'_, Cuda> {
    fn dense_forward(
        &self,
        l: &Layer,
        p: &CudaBuf<T>,
        rows: Range<usize>,
        x: &CudaBuf<T>,
        h: &mut CudaBuf<T>,
        y: &mut CudaBuf<T>,
    ) {
        dense::forward(self, l, p, rows, x, h, y);
    }

    fn dense_backward(
        &self,
        l: &Layer,
        p: &CudaBuf<T>,
        rows: Range<usize>,
        h: &CudaBuf<T>,
        ybar: &CudaBuf<T>,
        xbar: &mut CudaBuf<T>,
    ) {
        dense::backward(self, l, p, rows, h, ybar, xbar);
    }

    fn dense_tangent(
        &self,
        l: &Layer,
        p: &CudaBuf<T>,
        rows: Range<usize>,
        h: &CudaBuf<T>,
        xdot: &CudaBuf<T>,
        zdot: &mut CudaBuf<T>,
        ydot: &mut CudaBuf<T>,
    ) {
        dense::tangent(self, l, p, rows, h, xdot, zdot, ydot);
    }

    fn dense_dual_backward(
        &self,
        l: &Layer,
        p: &CudaBuf<T>,
        rows: Range<usize>,
        io: DenseIo<CudaBuf<T>>,
        xdot: &CudaBuf<T>,
        zdot: &CudaBuf<T>,
        scale: Option<&CudaBuf<T>>,
        ybar: &CudaBuf<T>,
        ydotbar: &CudaBuf<T>,
        grad: &mut CudaBuf<T>,
        xbar: Option<(&mut CudaBuf<T>, &mut CudaBuf<T>)>,
    ) {
        dense::dual_backward(
            self,
            l,
            p,
            rows,
            dense::DualIn {
                x: io.x,
                h: io.h,
                xdot,
                zdot,
                scale,
                ybar,
                ydotbar,
            },
            grad,
            xbar,
        );
    }
}

impl<T: CudaReal> ContractOps<T> for Generic<'_, Cuda> {
    fn contract_forward(
        &self,
        d: &Dims,
        g: &CudaBuf<T>,
        rhat: &CudaBuf<T>,
        a: &mut CudaBuf<T>,
        desc: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        // A, then a tile of G and R̂ (kernels/contract.cu).
        let tile = gpu_layout::CONTRACT_TILE;
        let shared = (4 * d.m1 + tile * d.m1 + 4 * tile) * std::mem::size_of::<T>();
        launch!(
            self,
            &name::<T>("contract_forward"),
            per_centre(d, shared),
            [
                self.addr(&*dims),
                self.ptr(g),
                self.ptr(rhat),
                self.ptr(a),
                self.ptr(desc)
            ]
        );
    }

    fn contract_backward(
        &self,
        d: &Dims,
        a: &CudaBuf<T>,
        dbar: &CudaBuf<T>,
        abar: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        // A and the centre's D̄.
        let shared = (4 * d.m1 + d.m1 * d.m2) * std::mem::size_of::<T>();
        launch!(
            self,
            &name::<T>("contract_backward"),
            per_centre(d, shared),
            [
                self.addr(&*dims),
                self.ptr(a),
                self.ptr(dbar),
                self.ptr(abar)
            ]
        );
    }

    fn contract_gbar(&self, d: &Dims, abar: &CudaBuf<T>, rhat: &CudaBuf<T>, gbar: &mut CudaBuf<T>) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        let shared = 4 * d.m1 * std::mem::size_of::<T>();
        launch!(
            self,
            &name::<T>("contract_gbar"),
            per_centre(d, shared),
            [
                self.addr(&*dims),
                self.ptr(abar),
                self.ptr(rhat),
                self.ptr(gbar)
            ]
        );
    }

    fn slot_backward(
        &self,
        d: &Dims,
        abar: &CudaBuf<T>,
        g: &CudaBuf<T>,
        gp: &CudaBuf<T>,
        rhat: &CudaBuf<T>,
        jac: &CudaBuf<T>,
        q: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        // One slot per warp at a time, about four slots per warp: blocks of 8 warps, as many per
        // centre as that takes (5 for water's 138 slots). One block of 4 warps per centre took
        // 121 µs on an H100 (run 7, water, float64, batch 1).
        let per_block = 8;
        let cfg = LaunchConfig {
            grid_dim: (
                d.ncentres() as u32,
                d.nnei.div_ceil(4 * per_block).max(1) as u32,
                1,
            ),
            block_dim: (32 * per_block as u32, 1, 1),
            shared_mem_bytes: (4 * d.m1 * std::mem::size_of::<T>()) as u32,
        };
        launch!(
            self,
            &name::<T>("slot_backward"),
            cfg,
            [
                self.addr(&*dims),
                self.ptr(abar),
                self.ptr(g),
                self.ptr(gp),
                self.ptr(rhat),
                self.ptr(jac),
                self.ptr(q)
            ]
        );
    }

    fn contract_tangent(
        &self,
        d: &Dims,
        g: &CudaBuf<T>,
        gp: &CudaBuf<T>,
        rhat: &CudaBuf<T>,
        rdot: &CudaBuf<T>,
        a: &CudaBuf<T>,
        adot: &mut CudaBuf<T>,
        ddot: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        // Ȧ and A, then a tile of G, G', R̂ and Ṙ (kernels/contract.cu).
        let tile = gpu_layout::CONTRACT_TILE;
        let shared = (8 * d.m1 + 2 * tile * d.m1 + 8 * tile) * std::mem::size_of::<T>();
        launch!(
            self,
            &name::<T>("contract_tangent"),
            per_centre(d, shared),
            [
                self.addr(&*dims),
                self.ptr(g),
                self.ptr(gp),
                self.ptr(rhat),
                self.ptr(rdot),
                self.ptr(a),
                self.ptr(adot),
                self.ptr(ddot)
            ]
        );
    }

    fn contract_dual(
        &self,
        d: &Dims,
        a: &CudaBuf<T>,
        adot: &CudaBuf<T>,
        dbar: &CudaBuf<T>,
        ddotbar: &CudaBuf<T>,
        rhat: &CudaBuf<T>,
        rdot: &CudaBuf<T>,
        gbar: &mut CudaBuf<T>,
        gdotbar: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        // A, Ȧ, Ā, Ǡ, one [M1][M2] matrix, and R̂ and Ṙ of a tile of 4 · CONTRACT_TILE slots.
        let tile = gpu_layout::CONTRACT_TILE;
        let shared = (16 * d.m1 + d.m1 * d.m2 + 32 * tile) * std::mem::size_of::<T>();
        launch!(
            self,
            &name::<T>("contract_dual"),
            per_centre(d, shared),
            [
                self.addr(&*dims),
                self.ptr(a),
                self.ptr(adot),
                self.ptr(dbar),
                self.ptr(ddotbar),
                self.ptr(rhat),
                self.ptr(rdot),
                self.ptr(gbar),
                self.ptr(gdotbar)
            ]
        );
    }
}

impl<T: CudaReal> RadialOps<T> for Generic<'_, Cuda> {
    fn radial_forward(&self, d: &Dims, g: &CudaBuf<T>, desc: &mut CudaBuf<T>) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("radial_forward"),
            grid(d.ncentres() * d.m1, BLOCK),
            [
                self.addr(&*dims),
                T::of(radial_scale(d)),
                self.ptr(g),
                self.ptr(desc)
            ]
        );
    }

    fn radial_tangent(&self, d: &Dims, gp: &CudaBuf<T>, sdot: &CudaBuf<T>, ddot: &mut CudaBuf<T>) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("radial_tangent"),
            grid(d.ncentres() * d.m1, BLOCK),
            [
                self.addr(&*dims),
                T::of(radial_scale(d)),
                self.ptr(gp),
                self.ptr(sdot),
                self.ptr(ddot)
            ]
        );
    }

    fn radial_backward(
        &self,
        d: &Dims,
        dbar: &CudaBuf<T>,
        gp: &CudaBuf<T>,
        jac: &CudaBuf<T>,
        q: &mut CudaBuf<T>,
    ) {
        if d.nslots() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        // One warp per slot, four per block.
        launch!(
            self,
            &name::<T>("radial_backward"),
            grid(32 * d.nslots(), 128),
            [
                self.addr(&*dims),
                T::of(radial_scale(d)),
                self.ptr(dbar),
                self.ptr(gp),
                self.ptr(jac),
                self.ptr(q)
            ]
        );
    }

    fn radial_dual(
        &self,
        d: &Dims,
        dbar: &CudaBuf<T>,
        ddotbar: &CudaBuf<T>,
        gbar: &mut CudaBuf<T>,
        gdotbar: &mut CudaBuf<T>,
    ) {
        if d.nslots() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("radial_dual"),
            grid(d.nslots() * d.m1, BLOCK),
            [
                self.addr(&*dims),
                T::of(radial_scale(d)),
                self.ptr(dbar),
                self.ptr(ddotbar),
                self.ptr(gbar),
                self.ptr(gdotbar)
            ]
        );
    }
}

impl<T: CudaReal> AngleOps<T> for Generic<'_, Cuda> {
    fn angle_values(&self, d: &Dims, rhat: &CudaBuf<T>, e: &mut CudaBuf<T>) {
        let dims = self.dims_table(d);
        for u in AngleParams::pair_blocks(d) {
            launch!(
                self,
                &name::<T>("angle_values"),
                grid(u.nrows as usize, BLOCK),
                [u, self.addr(&*dims), self.ptr(rhat), self.ptr(e)]
            );
        }
    }

    fn angle_values_tangent(
        &self,
        d: &Dims,
        rhat: &CudaBuf<T>,
        rdot: &CudaBuf<T>,
        edot: &mut CudaBuf<T>,
    ) {
        let dims = self.dims_table(d);
        for u in AngleParams::pair_blocks(d) {
            launch!(
                self,
                &name::<T>("angle_values_tangent"),
                grid(u.nrows as usize, BLOCK),
                [
                    u,
                    self.addr(&*dims),
                    self.ptr(rhat),
                    self.ptr(rdot),
                    self.ptr(edot)
                ]
            );
        }
    }

    fn angle_forward(&self, d: &Dims, e: &CudaBuf<T>, g: &CudaBuf<T>, desc: &mut CudaBuf<T>) {
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("angle_forward"),
            grid(d.ncentres() * d.m1, BLOCK),
            [
                AngleParams::new(d),
                self.addr(&*dims),
                self.ptr(e),
                self.ptr(g),
                self.ptr(desc)
            ]
        );
    }

    fn angle_tangent(
        &self,
        d: &Dims,
        e: &CudaBuf<T>,
        edot: &CudaBuf<T>,
        g: &CudaBuf<T>,
        gp: &CudaBuf<T>,
        ddot: &mut CudaBuf<T>,
    ) {
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("angle_tangent"),
            grid(d.ncentres() * d.m1, BLOCK),
            [
                AngleParams::new(d),
                self.addr(&*dims),
                self.ptr(e),
                self.ptr(edot),
                self.ptr(g),
                self.ptr(gp),
                self.ptr(ddot)
            ]
        );
    }

    fn angle_backward(
        &self,
        d: &Dims,
        rhat: &CudaBuf<T>,
        jac: &CudaBuf<T>,
        e: &CudaBuf<T>,
        g: &CudaBuf<T>,
        gp: &CudaBuf<T>,
        dbar: &CudaBuf<T>,
        q: &mut CudaBuf<T>,
    ) {
        let dims = self.dims_table(d);
        let ebar = self.scratch::<T>(d.pairs().len());
        for u in AngleParams::pair_blocks(d) {
            launch!(
                self,
                &name::<T>("angle_backward_pairs"),
                grid(u.nrows as usize, BLOCK),
                [
                    u,
                    self.addr(&*dims),
                    self.ptr(e),
                    self.ptr(g),
                    self.ptr(gp),
                    self.ptr(dbar),
                    self.addr(&ebar)
                ]
            );
        }
        for u in AngleParams::slot_blocks(d) {
            launch!(
                self,
                &name::<T>("angle_backward_slots"),
                grid(u.nrows as usize, BLOCK),
                [
                    u,
                    self.addr(&*dims),
                    self.ptr(rhat),
                    self.ptr(jac),
                    self.addr(&ebar),
                    self.ptr(q)
                ]
            );
        }
    }

    fn angle_dual(
        &self,
        d: &Dims,
        e: &CudaBuf<T>,
        edot: &CudaBuf<T>,
        dbar: &CudaBuf<T>,
        ddotbar: &CudaBuf<T>,
        gbar: &mut CudaBuf<T>,
        gdotbar: &mut CudaBuf<T>,
    ) {
        let dims = self.dims_table(d);
        for u in AngleParams::pair_blocks(d) {
            launch!(
                self,
                &name::<T>("angle_dual"),
                grid(u.nrows as usize * d.m1, BLOCK),
                [
                    u,
                    self.addr(&*dims),
                    self.ptr(e),
                    self.ptr(edot),
                    self.ptr(dbar),
                    self.ptr(ddotbar),
                    self.ptr(gbar),
                    self.ptr(gdotbar)
                ]
            );
        }
    }
}

impl<T: CudaReal> PairOps<T> for Generic<'_, Cuda> {}

/// Scratch of one launch of DPA-1's attention block, at most: the centres of a launch run
/// side by side, so a GPU wants many.
const ATTN_BLOCK_SCRATCH: usize = 1 << 29;

impl Cuda {
    /// DPA-1's attention block (kernels/attn_block.cu, the twin of shaders/attn_block.wgsl) on
    /// every centre, in launches of as many centres as [`ATTN_BLOCK_SCRATCH`] holds: its slots
    /// loaded as numbers (duals with the tangent `rdot`), then `pass` on each launch.
    fn attn_block<T: CudaReal>(
        &self,
        d: &Dims,
        a: &AttnArgs<CudaBuf<T>, CudaIdx>,
        rdot: Option<&CudaBuf<T>>,
        stride: usize,
        mut pass: BlockPass<'_, CudaBuf<T>>,
    ) {
        let nc = d.ncentres();
        if nc == 0 {
            return;
        }
        let dual = rdot.is_some();
        let grad = matches!(pass, BlockPass::Dual { .. });
        let o = &a.opts;
        let (nl, len) = (a.layout.layers.len(), o.layer_len());
        let u = AttnBlockParams::new(o, nl, d.nnei, stride, grad, a.abar.is_some());
        let lp = self.scratch::<T>(nl * len);
        for (l, layer) in a.layout.layers.iter().enumerate() {
            let [w_in, b_in, w_out, b_out, gamma, beta] =
                AttnOpts::layer_offsets(layer).map(|x| count(x) as i32);
            launch!(
                self,
                &name::<T>("attn_block_pack"),
                grid(len, BLOCK),
                [
                    u,
                    self.ptr(a.params),
                    l as i32,
                    w_in,
                    b_in,
                    w_out,
                    b_out,
                    gamma,
                    beta,
                    self.addr(&lp)
                ]
            );
        }
        let per_centre = u.per_centre as usize * if dual { 2 } else { 1 };
        let chunk = (ATTN_BLOCK_SCRATCH / (per_centre * size_of::<T>())).clamp(1, nc);
        let ws = self.scratch::<T>(chunk * per_centre);
        let [alpha, ln_eps, inv_nnei, inv_m] =
            [o.alpha, o.ln_eps, 1.0 / d.nnei as f64, 1.0 / o.m1 as f64].map(T::of);
        let kernel = |real: &str, on_duals: &str| name::<T>(if dual { on_duals } else { real });
        let rd = rdot.unwrap_or(a.rhat);
        for c0 in (0..nc).step_by(chunk) {
            let n = chunk.min(nc - c0);
            let u = u.launch(c0, n);
            launch!(
                self,
                &kernel("attn_block_load", "attn_block_load_dual"),
                grid(n * d.nnei * u.slot_w as usize, BLOCK),
                [
                    u,
                    self.ptr(a.g0),
                    self.ptr(a.g0p),
                    self.ptr(a.rhat),
                    self.ptr(rd),
                    self.ptr(a.sw),
                    self.ptr(a.dsw),
                    self.idx(a.owner),
                    self.addr(&ws)
                ]
            );
            // One 64-thread block per centre (ATTN_WG in the kernels).
            let one_per_centre = grid(n * 64, 64);
            let (lp, ws) = (self.addr(&lp), self.addr(&ws));
            match &mut pass {
                BlockPass::Forward(out, rot) => {
                    launch!(
                        self,
                        &kernel("attn_block_forward", "attn_block_tangent"),
                        one_per_centre,
                        [u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, self.ptr(out)]
                    );
                    if let Some(rot) = rot {
                        launch!(
                            self,
                            &name::<T>("attn_block_rot"),
                            grid(n * 4 * o.m1, BLOCK),
                            [u, ws, self.ptr(rot)]
                        );
                    }
                }
                BlockPass::Backward { jac, dbar, q } => {
                    let dbar = self.ptr(dbar);
                    launch!(
                        self,
                        &name::<T>("attn_block_backward"),
                        one_per_centre,
                        [u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, dbar, dbar]
                    );
                    launch!(
                        self,
                        &name::<T>("attn_block_q"),
                        grid(n * d.nnei, BLOCK),
                        [
                            u,
                            ws,
                            self.ptr(a.g0p),
                            self.ptr(a.dsw),
                            self.ptr(jac),
                            self.ptr(q)
                        ]
                    );
                }
                BlockPass::Dual {
                    dbar,
                    ddotbar,
                    g0bar,
                    g0dotbar,
                    grad,
                } => {
                    if let Some(abar) = a.abar {
                        launch!(
                            self,
                            &name::<T>("attn_block_abar"),
                            grid(n * 4 * o.m1, BLOCK),
                            [u, ws, self.ptr(abar)]
                        );
                    }
                    let seeds = (self.ptr(ddotbar), self.ptr(dbar));
                    launch!(
                        self,
                        &name::<T>("attn_block_dual"),
                        one_per_centre,
                        [u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, seeds.0, seeds.1]
                    );
                    launch!(
                        self,
                        &name::<T>("attn_block_g0bar"),
                        grid(n * d.nnei * o.m1, BLOCK),
                        [u, ws, self.ptr(g0bar), self.ptr(g0dotbar)]
                    );
                    // Each tensor's sum over the launch's centres into the model's gradient;
                    // frozen layer norms get none.
                    for t in o.tensors(a.layout).filter(|t| t.trained) {
                        launch!(
                            self,
                            &name::<T>("attn_block_grad"),
                            grid(t.len, BLOCK),
                            [
                                u,
                                ws,
                                count(t.packed) as i32,
                                count(t.at) as i32,
                                count(t.len) as i32,
                                self.ptr(grad)
                            ]
                        );
                    }
                }
            }
        }
    }
}

/// DPA-1's ops run as kernels: the element-wise ones (kernels/attn.cu), and with
/// `DPW_CUDA_ATTN=kernels` the attention block (kernels/attn_block.cu: one forward and one
/// backward over a number type, on reals and on duals, give its four passes); by default the
/// block runs through its host bodies until a GPU has checked those kernels.
impl<T: CudaReal> AttnOps<T> for Generic<'_, Cuda> {
    fn attn_forward(
        &self,
        d: &Dims,
        a: &AttnArgs<CudaBuf<T>, CudaIdx>,
        desc: &mut CudaBuf<T>,
        stride: usize,
        rot: Option<&mut CudaBuf<T>>,
    ) {
        if !self.attn_kernels {
            return crate::backend::attn::attn_forward(self, d, a, desc, stride, rot);
        }
        self.attn_block(d, a, None, stride, BlockPass::Forward(desc, rot));
    }

    fn attn_backward(
        &self,
        d: &Dims,
        a: &AttnArgs<CudaBuf<T>, CudaIdx>,
        jac: &CudaBuf<T>,
        dbar: &CudaBuf<T>,
        stride: usize,
        q: &mut CudaBuf<T>,
    ) {
        if !self.attn_kernels {
            return crate::backend::attn::attn_backward(self, d, a, jac, dbar, stride, q);
        }
        self.attn_block(d, a, None, stride, BlockPass::Backward { jac, dbar, q });
    }

    fn attn_tangent(
        &self,
        d: &Dims,
        a: &AttnArgs<CudaBuf<T>, CudaIdx>,
        rdot: &CudaBuf<T>,
        ddot: &mut CudaBuf<T>,
        stride: usize,
    ) {
        if !self.attn_kernels {
            return crate::backend::attn::attn_tangent(self, d, a, rdot, ddot, stride);
        }
        self.attn_block(d, a, Some(rdot), stride, BlockPass::Forward(ddot, None));
    }

    fn attn_dual(
        &self,
        d: &Dims,
        a: &AttnArgs<CudaBuf<T>, CudaIdx>,
        rdot: &CudaBuf<T>,
        (dbar, ddotbar): (&CudaBuf<T>, &CudaBuf<T>),
        stride: usize,
        (g0bar, g0dotbar): (&mut CudaBuf<T>, &mut CudaBuf<T>),
        grad: &mut CudaBuf<T>,
    ) {
        if !self.attn_kernels {
            let (g0_adjoints, adjoints) = ((g0bar, g0dotbar), (dbar, ddotbar));
            return crate::backend::attn::attn_dual(
                self,
                d,
                a,
                rdot,
                adjoints,
                stride,
                g0_adjoints,
                grad,
            );
        }
        let pass = BlockPass::Dual {
            dbar,
            ddotbar,
            g0bar,
            g0dotbar,
            grad,
        };
        self.attn_block(d, a, Some(rdot), stride, pass);
    }

    fn attn_switch(
        &self,
        d: &Dims,
        env: EnvParams,
        rij: &CudaBuf<T>,
        owner: &CudaIdx,
        dstd: &CudaBuf<T>,
        sw: &mut CudaBuf<T>,
        dsw: &mut CudaBuf<T>,
    ) {
        for ti in 0..d.ntypes {
            let slots = d.type_slots(ti);
            if slots.is_empty() {
                continue;
            }
            launch!(
                self,
                &name::<T>("attn_switch"),
                grid(slots.len(), 128),
                [
                    AttnParams::switch(&slots, ti),
                    env.rcut,
                    env.rcut_smth,
                    env.protection,
                    self.ptr(rij),
                    self.idx(owner),
                    self.ptr(dstd),
                    self.ptr(sw),
                    self.ptr(dsw)
                ]
            );
        }
    }

    fn tebd_rows(
        &self,
        tebd: &TebdLayout,
        params: &CudaBuf<T>,
        lead: Option<&CudaBuf<T>>,
        types: &[&CudaIdx],
        out: &mut CudaBuf<T>,
        stride: usize,
        col: usize,
    ) {
        let nrows = types.first().map_or(0, |t| t.host.len());
        if nrows == 0 {
            return;
        }
        let first = usize::from(lead.is_some());
        let u = AttnParams::tebd(tebd, types.len(), nrows, stride, col + first);
        if let Some(lead) = lead {
            launch!(
                self,
                &name::<T>("tebd_rows_lead"),
                grid(nrows, BLOCK),
                [
                    AttnParams {
                        col: gpu_layout::count(col),
                        ..u
                    },
                    self.ptr(lead),
                    self.ptr(out)
                ]
            );
        }
        for (list, ty) in types.iter().enumerate() {
            launch!(
                self,
                &name::<T>("tebd_rows"),
                grid(nrows * tebd.dim, BLOCK),
                [u.list(list), self.ptr(params), self.idx(ty), self.ptr(out)]
            );
        }
    }

    fn tebd_rows_backward(
        &self,
        tebd: &TebdLayout,
        lead: bool,
        types: &[&CudaIdx],
        xbar: &CudaBuf<T>,
        stride: usize,
        col: usize,
        grad: &mut CudaBuf<T>,
    ) {
        let nrows = types.first().map_or(0, |t| t.host.len());
        if nrows == 0 {
            return;
        }
        let u = AttnParams::tebd(tebd, types.len(), nrows, stride, col + usize::from(lead));
        let entries = tebd.ntypes * tebd.dim;
        let partial = self.scratch::<T>(u.nparts as usize * entries);
        for (list, ty) in types.iter().enumerate() {
            launch!(
                self,
                &name::<T>("tebd_rows_backward_parts"),
                grid(u.nchunks as usize * tebd.dim, BLOCK),
                [
                    u.list(list),
                    self.idx(ty),
                    self.ptr(xbar),
                    self.addr(&partial)
                ]
            );
        }
        launch!(
            self,
            &name::<T>("tebd_rows_backward_sum"),
            grid(tebd.dim, 32),
            [u, self.addr(&partial), self.ptr(grad)]
        );
    }

    fn strip_forward(
        &self,
        a: &StripArgs<CudaBuf<T>, CudaIdx>,
        g0: &mut CudaBuf<T>,
        g0p: &mut CudaBuf<T>,
    ) {
        let ns = a.nei_type.host.len();
        if ns == 0 {
            return;
        }
        launch!(
            self,
            &name::<T>("strip_forward"),
            grid(ns * a.m1, BLOCK),
            [
                AttnParams::strip(ns, a.m1, a.ntypes, a.one_side, a.smooth),
                self.ptr(a.gs),
                self.ptr(a.gsp),
                self.ptr(a.tau),
                self.idx(a.nei_type),
                self.idx(a.centre_type),
                self.ptr(a.sw),
                self.ptr(a.dsw),
                self.ptr(g0),
                self.ptr(g0p)
            ]
        );
    }

    fn strip_dual(
        &self,
        a: &StripArgs<CudaBuf<T>, CudaIdx>,
        sdot: &CudaBuf<T>,
        (g0bar, g0dotbar): (&CudaBuf<T>, &CudaBuf<T>),
        (gsbar, gsdotbar): (&mut CudaBuf<T>, &mut CudaBuf<T>),
        taubar: &mut CudaBuf<T>,
    ) {
        let ns = a.nei_type.host.len();
        if ns == 0 {
            return;
        }
        let u = AttnParams::strip(ns, a.m1, a.ntypes, a.one_side, a.smooth);
        launch!(
            self,
            &name::<T>("strip_dual"),
            grid(ns * a.m1, BLOCK),
            [
                u,
                self.ptr(a.tau),
                self.idx(a.nei_type),
                self.idx(a.centre_type),
                self.ptr(a.sw),
                self.ptr(a.dsw),
                self.ptr(sdot),
                self.ptr(g0bar),
                self.ptr(g0dotbar),
                self.ptr(gsbar),
                self.ptr(gsdotbar)
            ]
        );
        let entries = (u.table_rows * u.width) as usize;
        let partial = self.scratch::<T>(u.nparts as usize * entries);
        launch!(
            self,
            &name::<T>("strip_dual_parts"),
            grid((u.nchunks * u.width) as usize, BLOCK),
            [
                u,
                self.ptr(a.gs),
                self.ptr(a.gsp),
                self.idx(a.nei_type),
                self.idx(a.centre_type),
                self.ptr(a.sw),
                self.ptr(a.dsw),
                self.ptr(sdot),
                self.ptr(g0bar),
                self.ptr(g0dotbar),
                self.addr(&partial)
            ]
        );
        launch!(
            self,
            &name::<T>("strip_dual_sum"),
            grid(entries, BLOCK),
            [u, self.addr(&partial), self.ptr(taubar)]
        );
    }
}

impl<T: CudaReal> TrainOps<T> for Generic<'_, Cuda> {
    fn clip_grad_norm(&self, grad: &mut CudaBuf<T>, max: f64, norm: &mut CudaBuf<T>, at: usize) {
        assert!(at < norm.len, "clip_grad_norm: norm index past the buffer");
        let chunks = grad.len.div_ceil(LOSS_CHUNK);
        // The partials, then their total in double at part[chunks].
        let part = self.scratch::<f64>(chunks + 1);
        if chunks > 0 {
            launch!(
                self,
                &name::<T>("grad_sq"),
                grid(chunks, 64),
                [
                    VectorParams::new(grad.len),
                    self.ptr(grad),
                    self.addr(&part)
                ]
            );
        }
        launch!(
            self,
            &name::<T>("sum_parts"),
            grid(1, 32),
            [
                SumParams::new(chunks, true),
                self.addr(&part),
                self.at(norm, at)
            ]
        );
        if grad.len > 0 {
            launch!(
                self,
                &name::<T>("clip_scale"),
                grid(grad.len, BLOCK),
                [
                    VectorParams::new(grad.len),
                    max,
                    self.addr(&part) + (chunks * size_of::<f64>()) as u64,
                    self.ptr(grad)
                ]
            );
        }
    }

    fn energy(
        &self,
        d: &Dims,
        e_fit: &CudaBuf<T>,
        bias: &CudaBuf<T>,
        e_atom: &mut CudaBuf<T>,
        energy: &mut CudaBuf<T>,
    ) {
        if d.ncentres() == 0 {
            return;
        }
        let dims = self.dims_table(d);
        launch!(
            self,
            &name::<T>("energy_atoms"),
            grid(d.ncentres(), BLOCK),
            [
                self.addr(&*dims),
                self.ptr(e_fit),
                self.ptr(bias),
                self.ptr(e_atom)
            ]
        );
        launch!(
            self,
            &name::<T>("energy_frames"),
            per_frame(d),
            [self.addr(&*dims), self.ptr(e_atom), self.ptr(energy)]
        );
    }

    fn loss(
        &self,
        d: &Dims,
        pref: Prefactors,
        pred: [&CudaBuf<T>; 3],
        label: [&CudaBuf<T>; 3],
        ebar: &mut CudaBuf<T>,
        fres: &mut CudaBuf<T>,
        vres: &mut CudaBuf<T>,
        sums: &mut CudaBuf<T>,
    ) {
        let dims = self.dims_table(d);
        let (n, nf) = (d.natoms as f64, d.nframes as f64);
        let ce = self.scratch::<T>(d.nframes);
        let nums = [2.0 * pref.e, 2.0 * pref.f, 2.0 * pref.v];
        // In a graph region the prefactors, which follow the learning rate, are read from
        // the device (the kernel's num_at), so that the launch's arguments repeat.
        let staged = self
            .graph
            .as_ref()
            .and_then(|g| g.stage_host(bytemuck::cast_slice(&nums), size_of_val(&nums)));
        let num = |k: usize| match staged {
            Some(at) => (0.0, at + (k * size_of::<f64>()) as u64),
            None => (nums[k], 0),
        };
        // (entries, 2·prefactor, denominator, output) per label, as the CPU rounds them.
        let parts = [
            (d.nframes, num(0), n * nf, self.addr(&ce)),
            (3 * d.nbatch_atoms(), num(1), 3.0 * n * nf, self.ptr(fres)),
            (9 * d.nframes, num(2), 9.0 * n * nf, self.ptr(vres)),
        ];
        for (k, &(len, (num, num_at), den, out)) in parts.iter().enumerate() {
            let chunks = len.div_ceil(LOSS_CHUNK);
            let part = self.scratch::<f64>(chunks + 1);
            if len > 0 {
                launch!(
                    self,
                    &name::<T>("loss_residual"),
                    // A warp per chunk.
                    grid(32 * chunks, 128),
                    [
                        LossParams::new(d, len, k),
                        num,
                        num_at,
                        den,
                        self.ptr(pred[k]),
                        self.ptr(label[k]),
                        out,
                        self.addr(&part)
                    ]
                );
            }
            // Summed in order in f64, as the CPU sums.
            launch!(
                self,
                &name::<T>("sum_parts"),
                grid(1, 32),
                [
                    SumParams::new(chunks, false),
                    self.addr(&part),
                    self.at(sums, k)
                ]
            );
        }
        if d.ncentres() > 0 {
            launch!(
                self,
                &name::<T>("loss_ebar"),
                grid(d.ncentres(), BLOCK),
                [self.addr(&*dims), self.addr(&ce), self.ptr(ebar)]
            );
        }
    }

    fn adam(
        &self,
        s: AdamStep,
        params: &mut CudaBuf<T>,
        grad: &CudaBuf<T>,
        m: &mut CudaBuf<T>,
        v: &mut CudaBuf<T>,
    ) {
        if params.len == 0 {
            return;
        }
        // The bias corrections in f64 on the host, exactly as the CPU backend computes them.
        let (step, bc2_sqrt) = s.corrections(s.t);
        let [(from, (tail_step, tail_bc2)), (fit_from, (fit_step, fit_bc2))] =
            s.tail_corrections(params.len);
        let (keep, l2) = s.decay_factors();
        launch!(
            self,
            &name::<T>("adam"),
            grid(params.len, BLOCK),
            [
                VectorParams {
                    tail_from: count(from),
                    fit_from: count(fit_from),
                    ..VectorParams::new(params.len)
                },
                T::of(step),
                T::of(s.beta1),
                T::of(s.beta2),
                T::of(s.eps),
                T::of(bc2_sqrt),
                T::of(tail_step),
                T::of(tail_bc2),
                T::of(fit_step),
                T::of(fit_bc2),
                T::of(keep),
                T::of(l2),
                self.ptr(params),
                self.ptr(grad),
                self.ptr(m),
                self.ptr(v)
            ]
        );
    }
}

impl<T: CudaReal> super::timed::Timeable<T> for Cuda
where
    Cuda: Backend<T, Buf = CudaBuf<T>, Idx = CudaIdx>,
{
    fn count_real(&self, owner: &CudaIdx) -> usize {
        owner.host.iter().filter(|&&o| o >= 0).count()
    }
    fn len(&self, b: &CudaBuf<T>) -> usize {
        b.len
    }
    fn counts(&self) -> Option<Counts> {
        Some(self.counters.get())
    }
}

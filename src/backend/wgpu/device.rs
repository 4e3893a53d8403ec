//! Adapter and device selection, buffers, pipelines and the pending command encoder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use wgpu::util::DeviceExt;

use super::profile::{add_waited, KernelName, Profile, Stamps};
use super::shaders::{source, Access, Kernel, Precision, Shader};
use super::{Buf, GpuReal, Idx, Window};
use crate::backend::counts::{Counters, Counts};
use crate::backend::{gpu_layout, Dims, Span};

/// Ops recorded before a submit, so that the device starts on long sequences early.
const MAX_PENDING_OPS: u32 = 64;

/// Cached bind groups kept before the cache is emptied: a training run needs a few hundred (one
/// per dispatch of a step, per batch shape), so this only bounds runs that keep making buffers.
const MAX_BIND_GROUPS: usize = 8192;

struct Pending {
    /// The compute pass open on `encoder` for the dispatches since its last other command
    /// ([`Passes::Shared`]). Declared first, so that it ends before the encoder is dropped.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    ops: u32,
    /// The latest submission, to wait for.
    last: Option<wgpu::SubmissionIndex>,
}

/// Where a buffer mapping's callback leaves its result for the future awaiting it.
#[derive(Default)]
struct MapSlot {
    result: Option<Result<(), wgpu::BufferAsyncError>>,
    waker: Option<std::task::Waker>,
}

/// Pipelines are keyed by (shader file, entry point, precision).
type PipelineKey = (&'static str, &'static str, Precision);

struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// The CSR gather lists of the force op for one batch shape, rewritten in place when the owner
/// and centre tables change.
struct ForceLists {
    /// The [`Idx`] versions (owner, centre_atom) they were built from.
    versions: (u64, u64),
    ptr: wgpu::Buffer,
    /// Sized for every slot real (2 entries per slot), so that any batch of the shape fits.
    ent: wgpu::Buffer,
}

/// The force gather lists of every frame of a table of resident owner tables (one frame per
/// batch), built once: a batch of one of those frames copies its lists on the device.
#[derive(Debug)]
pub(super) struct FrameLists {
    /// The one-frame batch shape and centre table they were built for.
    dims: Dims,
    centre_atom: Vec<i32>,
    /// `[frame][natoms + 1]`.
    ptr: wgpu::Buffer,
    /// `[frame][cap]`, the first `used[frame]` of each frame's entries valid.
    ent: wgpu::Buffer,
    cap: usize,
    used: Vec<usize>,
}

impl Pending {
    /// The pending encoder, with no pass open on it.
    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("dpw ops"),
            })
        })
    }

    /// The shared compute pass, begun on the pending encoder if none is open.
    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("dpw ops"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("just begun")
    }
}

/// An op's name and the bytes per value of its constants.
type ConstKey = (&'static str, usize);

/// A dispatch's bind group is reused whenever the same pipeline sees the same uniform block and
/// the same buffers: every dispatch of a step after the first.
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: PipelineKey,
    uniform: Vec<u32>,
    bufs: Vec<wgpu::Buffer>,
}

/// Proof that the caller holds the op lock ([`Wgpu::exclusive`]).
pub(super) struct OneOp<'a> {
    _held: std::sync::MutexGuard<'a, ()>,
}

/// How the dense layers' matrix products run. Both sum every output in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseKernels {
    /// 16×16 tiles staged in workgroup memory (`shaders/dense_tiled.wgsl`): hardware GPUs.
    Tiled,
    /// One thread per output, no workgroup memory or barriers: software adapters, which switch a
    /// workgroup's invocations at every barrier.
    Flat,
}

impl DenseKernels {
    /// `DPW_WGPU_DENSE` (tiled, flat) if set, else by the kind of adapter.
    fn choose(info: &wgpu::AdapterInfo) -> Result<Self> {
        Ok(match crate::settings::WGPU_DENSE.get()? {
            Some("flat") => Self::Flat,
            // "tiled", the other word the setting takes.
            Some(_) => Self::Tiled,
            None if info.device_type == wgpu::DeviceType::Cpu => Self::Flat,
            None => Self::Tiled,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Tiled => "tiled",
            Self::Flat => "flat",
        }
    }
}

/// How dispatches are grouped into compute passes. wgpu-core makes two command buffers of every
/// pass (its barriers, then its commands), so a pass per dispatch gives the driver some 600
/// command buffers a training step; in a shared pass wgpu puts the same barriers between the
/// dispatches. Both run the same kernels on the same buffers, so the numbers are the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passes {
    /// One pass for all the dispatches between two other commands (a copy, a clear, a submit).
    Shared,
    /// A pass of its own for every dispatch.
    Each,
}

impl Passes {
    /// `DPW_WGPU_PASSES` (shared, each) if set, else shared.
    fn choose() -> Result<Self> {
        Ok(match crate::settings::WGPU_PASSES.get()? {
            Some("each") => Self::Each,
            // "shared", the other word the setting takes, or the default.
            _ => Self::Shared,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Each => "each",
        }
    }
}

/// Scratch of one launch of DPA-1's attention block by default (or the largest binding, if
/// less): the centres of a launch run side by side, so a GPU wants many.
const ATTN_BLOCK_SCRATCH: usize = 1 << 29;

/// A wgpu device with its queue and the compute pipelines built so far.
pub struct Wgpu {
    adapter: wgpu::Adapter,
    info: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    f64_ok: bool,
    modules: Mutex<HashMap<(Shader, Precision), wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    pending: Mutex<Pending>,
    scratch: Mutex<HashMap<&'static str, wgpu::Buffer>>,
    /// Small per-op constant arrays (loss coefficients, Adam's hyper-parameters), by (op, bytes
    /// per value), with the contents last written.
    consts: Mutex<HashMap<ConstKey, (Vec<u8>, wgpu::Buffer)>>,
    bind_groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
    dims: Mutex<HashMap<Vec<u32>, wgpu::Buffer>>,
    force_lists: Mutex<Vec<(Dims, ForceLists)>>,
    /// Held by every op that uses a buffer shared between calls (a scratch buffer, its constants,
    /// the force lists) from writing it to its last dispatch recorded: the device is then safe
    /// for ops from several threads, which never see each other's scratch or constants (a later
    /// write lands after the dispatches already recorded, see [`Wgpu::write_bytes`]).
    op_lock: Mutex<()>,
    /// Every call into the device goes through this lock. wgpu-core 30 asserts when one thread
    /// polls for a submission index that another thread's submit has returned but not yet
    /// recorded; and wgpu's GLES backend panics when a thread waits over a second for its
    /// context, which long submits on a slow GL device exceed.
    device_lock: Mutex<()>,
    /// The largest buffer one storage binding may cover on this device.
    max_binding: u64,
    next_id: AtomicU64,
    counters: Counters,
    dense: DenseKernels,
    passes: Passes,
    /// Scratch of one launch of DPA-1's attention block, at most (see `Wgpu::attn_block`).
    pub(super) attn_scratch: usize,
    /// With `DPW_WGPU_PROFILE=1`: time per kernel (see `profile.rs`). For finding slow
    /// kernels, not for production runs.
    profile: Option<Mutex<Profile>>,
}

impl std::fmt::Debug for Wgpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wgpu")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .finish()
    }
}

fn storage_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
}

/// Device buffers are never smaller than this: a binding must hold at least one f64, and copies
/// go in multiples of 4 bytes.
const MIN_BYTES: u64 = 16;

fn padded(bytes: u64) -> u64 {
    bytes.max(MIN_BYTES).div_ceil(4) * 4
}

impl Wgpu {
    /// Opens the adapter wgpu prefers: `WGPU_BACKEND` (vulkan, metal, dx12, gl, ...) restricts the
    /// backends, `WGPU_ADAPTER_NAME` picks an adapter by a part of its name, `WGPU_POWER_PREF`
    /// (low, high) overrides `power`. The device gets `SHADER_F64` whenever the adapter has it.
    pub fn new(power: wgpu::PowerPreference) -> Result<Self> {
        pollster::block_on(Self::new_async(power))
    }

    /// As [`Wgpu::new`], failing unless the adapter can run float64 shaders.
    pub fn new_f64(power: wgpu::PowerPreference) -> Result<Self> {
        let w = Self::new(power)?;
        w.require::<f64>()?;
        Ok(w)
    }

    pub async fn new_async(power: wgpu::PowerPreference) -> Result<Self> {
        Self::with_backends(wgpu::Backends::default().with_env(), power).await
    }

    /// As [`Wgpu::new_async`] on the given graphics APIs only (`WGPU_BACKEND` is not read).
    pub async fn with_backends(
        backends: wgpu::Backends,
        power: wgpu::PowerPreference,
    ) -> Result<Self> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = match std::env::var("WGPU_ADAPTER_NAME") {
            Ok(want) => {
                let want = want.to_lowercase();
                let all = instance.enumerate_adapters(backends).await;
                let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
                all.into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&want))
                    .ok_or_else(|| anyhow!("WGPU_ADAPTER_NAME={want}: no such adapter among {names:?}"))?
            }
            Err(_) => instance
                .request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::from_env().unwrap_or(power),
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow!("no wgpu adapter ({e}); on Linux without a GPU, install lavapipe (mesa-vulkan-drivers)"))?,
        };
        Self::on_adapter(adapter).await
    }

    /// Every adapter of the graphics APIs `WGPU_BACKEND` allows, in wgpu's order.
    pub async fn adapters() -> Vec<wgpu::Adapter> {
        let backends = wgpu::Backends::default().with_env();
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = backends;
        wgpu::Instance::new(desc).enumerate_adapters(backends).await
    }

    /// Opens a device on `adapter`.
    pub async fn on_adapter(adapter: wgpu::Adapter) -> Result<Self> {
        Self::on_adapter_with(adapter, wgpu::Features::all()).await
    }

    /// As [`Wgpu::on_adapter`], asking for no feature outside `allowed`: a device as an adapter
    /// without them would give (float64 refused, float32 runs), on any adapter.
    pub async fn on_adapter_with(adapter: wgpu::Adapter, allowed: wgpu::Features) -> Result<Self> {
        let info = adapter.get_info();
        let f64_ok = adapter.features().contains(wgpu::Features::SHADER_F64)
            && allowed.contains(wgpu::Features::SHADER_F64);
        let profiling = crate::settings::WGPU_PROFILE.get()?.unwrap_or(false);
        let mut features = wgpu::Features::empty();
        features.set(wgpu::Features::SHADER_F64, f64_ok);
        features.set(
            wgpu::Features::TIMESTAMP_QUERY,
            profiling && (adapter.features() & allowed).contains(wgpu::Features::TIMESTAMP_QUERY),
        );
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("dpw"),
                required_features: features,
                // The adapter's own limits: large batches need large storage bindings.
                required_limits: adapter.limits(),
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("wgpu device on {} ({:?}): {e}", info.name, info.backend))?;
        let max_binding = device.limits().max_storage_buffer_binding_size;
        let dense = DenseKernels::choose(&info)?;
        let passes = Passes::choose()?;
        let profile = profiling.then(|| Mutex::new(Profile::new(&device, &queue)));
        let mut w = Wgpu {
            adapter,
            info,
            device,
            queue,
            f64_ok,
            modules: Mutex::default(),
            pipelines: Mutex::default(),
            pending: Mutex::new(Pending {
                pass: None,
                encoder: None,
                ops: 0,
                last: None,
            }),
            scratch: Mutex::default(),
            consts: Mutex::default(),
            bind_groups: Mutex::default(),
            dims: Mutex::default(),
            force_lists: Mutex::default(),
            op_lock: Mutex::new(()),
            device_lock: Mutex::default(),
            max_binding,
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
            dense,
            passes,
            attn_scratch: ATTN_BLOCK_SCRATCH.min(max_binding as usize),
            profile,
        };
        if let Some(bytes) = crate::settings::WGPU_MAX_BINDING_MB.bytes()? {
            w.set_max_binding(bytes as u64);
        }
        Ok(w)
    }

    pub fn adapter_name(&self) -> &str {
        &self.info.name
    }

    /// The graphics API in use: "vulkan", "metal", "dx12", "gl" or "webgpu".
    pub fn backend_name(&self) -> String {
        self.info.backend.to_string()
    }

    /// A software rasteriser (lavapipe, llvmpipe, SwiftShader, WARP): correct, not fast.
    pub fn is_cpu_adapter(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The dense kernels this device runs.
    pub fn dense_kernels(&self) -> DenseKernels {
        self.dense
    }

    /// Runs the dense layers with `k` from now on (the tests run both kinds on one adapter).
    pub fn set_dense_kernels(&mut self, k: DenseKernels) {
        self.dense = k;
    }

    /// How this device groups dispatches into compute passes.
    pub fn passes(&self) -> Passes {
        self.passes
    }

    /// Groups dispatches as `p` from now on (the tests run both ways on one adapter).
    pub fn set_passes(&mut self, p: Passes) {
        self.passes = p;
    }

    /// Caps the scratch of one launch of the attention block (a test's way to run it in many
    /// launches); at least one centre goes in each.
    pub fn set_attn_scratch(&mut self, bytes: usize) {
        self.attn_scratch = bytes;
    }

    /// Lowers the largest storage binding the device answers for, as a smaller device's (a
    /// browser's WebGPU allows 128 MiB): what buffers are checked against and what a block's
    /// tape and the resident systems must fit (a test's way to reach those limits).
    pub fn set_max_binding(&mut self, bytes: u64) {
        self.max_binding = self.max_binding.min(bytes);
        self.attn_scratch = self.attn_scratch.min(self.max_binding as usize);
    }

    pub fn supports_f64(&self) -> bool {
        self.f64_ok
    }

    /// Dispatches, transfers and objects created since the device was opened.
    pub fn counts(&self) -> Counts {
        self.counters.get()
    }

    pub(super) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.adapter
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// Fails with advice when this adapter cannot compute in T.
    pub fn require<T: GpuReal>(&self) -> Result<()> {
        if T::PRECISION == Precision::F64 && !self.f64_ok {
            bail!(
                "the GPU adapter '{}' ({}) has no 64-bit floats in shaders (wgpu SHADER_F64): \
                 set \"precision\": \"float32\" to train on it, or use the cpu backend",
                self.info.name,
                self.backend_name()
            );
        }
        Ok(())
    }

    fn module(&self, shader: Shader, prec: Precision) -> wgpu::ShaderModule {
        let mut modules = self.modules.lock().unwrap();
        modules
            .entry((shader, prec))
            .or_insert_with(|| {
                self.device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(shader.name()),
                        source: wgpu::ShaderSource::Wgsl(source(shader, prec).into()),
                    })
            })
            .clone()
    }

    fn pipeline(&self, k: &Kernel, prec: Precision) -> Arc<Pipeline> {
        if prec == Precision::F64 && !self.f64_ok {
            panic!("{}", self.require::<f64>().unwrap_err());
        }
        let key = (k.shader.name(), k.entry, prec);
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return p.clone();
        }
        let module = self.module(k.shader, prec);
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries = vec![entry(0, wgpu::BufferBindingType::Uniform)];
        for &(b, a) in k.bindings {
            entries.push(entry(
                b,
                wgpu::BufferBindingType::Storage {
                    read_only: a == Access::Read,
                },
            ));
        }
        let label = format!("{}:{}:{}", k.shader.name(), k.entry, prec.name());
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(&label),
                entries: &entries,
            });
        let pl = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&label),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: Some(&pl),
                module: &module,
                entry_point: Some(k.entry),
                compilation_options: Default::default(),
                cache: None,
            });
        let p = Arc::new(Pipeline { pipeline, layout });
        self.pipelines.lock().unwrap().insert(key, p.clone());
        p
    }

    /// Records one dispatch of `k` with its uniform block and storage buffers (in the order of
    /// `k.bindings`).
    pub(super) fn run(
        &self,
        k: &Kernel,
        prec: Precision,
        uniform: &[u32],
        bufs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) {
        assert_eq!(bufs.len(), k.bindings.len(), "{}: buffers", k.entry);
        assert!(
            uniform.len().is_multiple_of(4),
            "uniform blocks are whole 16-byte rows"
        );
        if groups.contains(&0) {
            return;
        }
        let _device = self.device_guard();
        let p = self.pipeline(k, prec);
        let key = BindKey {
            pipeline: (k.shader.name(), k.entry, prec),
            uniform: uniform.to_vec(),
            bufs: bufs.iter().map(|&b| b.clone()).collect(),
        };
        let bg = self.bind_group(k, &p, key);
        self.counters.launch();
        let dispatch = Dispatch {
            label: k.entry,
            pipeline: &p.pipeline,
            bind_group: &bg,
            groups,
        };
        let name: KernelName = (k.shader.name(), k.entry, prec.name());
        let mut profile = self.profile.as_ref().map(|p| p.lock().unwrap());
        match profile.as_deref_mut() {
            None if self.passes == Passes::Shared => {
                let mut pending = self.pending.lock().unwrap();
                dispatch.encode(pending.pass(&self.device));
                self.recorded(&mut pending);
            }
            None => self.own_pass(dispatch, None),
            Some(Profile::Stamped(s)) => {
                if s.full() {
                    self.read_stamps(s);
                }
                self.own_pass(dispatch, Some(s.next(name)));
            }
            Some(Profile::Waited(kernels)) => {
                self.sync_inner();
                let t0 = std::time::Instant::now();
                self.own_pass(dispatch, None);
                self.sync_inner();
                add_waited(kernels, name, t0.elapsed());
            }
        }
    }

    /// Records a dispatch in a compute pass of its own, stamped at both ends if `stamps`.
    fn own_pass(&self, d: Dispatch, stamps: Option<wgpu::ComputePassTimestampWrites>) {
        let mut pending = self.pending.lock().unwrap();
        d.encode(&mut pending.encoder(&self.device).begin_compute_pass(
            &wgpu::ComputePassDescriptor {
                label: Some(d.label),
                timestamp_writes: stamps,
            },
        ));
        self.recorded(&mut pending);
    }

    /// Reads back the timestamps of the dispatches stamped since the last read.
    fn read_stamps(&self, s: &mut Stamps) {
        let n = s.queries();
        if n == 0 {
            return;
        }
        self.pending
            .lock()
            .unwrap()
            .encoder(&self.device)
            .resolve_query_set(&s.set, 0..n, &s.resolved, 0);
        let bytes = self.read_locked(&s.resolved, n as u64 * wgpu::QUERY_SIZE as u64);
        s.add(&bytemuck::pod_collect_to_vec::<u8, u64>(&bytes));
    }

    /// The bind group of a dispatch, with its uniform block, made on first use.
    fn bind_group(&self, k: &Kernel, p: &Pipeline, key: BindKey) -> wgpu::BindGroup {
        let mut cache = self.bind_groups.lock().unwrap();
        if let Some(bg) = cache.get(&key) {
            return bg.clone();
        }
        if cache.len() >= MAX_BIND_GROUPS {
            cache.clear();
        }
        let ubuf = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(k.entry),
                contents: bytemuck::cast_slice(&key.uniform),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        self.counters.buffer();
        self.counters.upload(4 * key.uniform.len());
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: ubuf.as_entire_binding(),
        }];
        for (&(b, _), buf) in k.bindings.iter().zip(&key.bufs) {
            entries.push(wgpu::BindGroupEntry {
                binding: b,
                resource: buf.as_entire_binding(),
            });
        }
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.entry),
            layout: &p.layout,
            entries: &entries,
        });
        self.counters.bind_group();
        cache.insert(key, bg.clone());
        bg
    }

    /// Time per kernel, slowest first, when `DPW_WGPU_PROFILE=1`.
    pub fn profile_report(&self) -> Option<String> {
        let _device = self.device_guard();
        let mut profile = self.profile.as_ref()?.lock().unwrap();
        if let Profile::Stamped(s) = &mut *profile {
            self.read_stamps(s);
        }
        Some(profile.report())
    }

    /// Appends commands other than a dispatch to the pending encoder.
    pub(super) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = self.pending.lock().unwrap();
        f(p.encoder(&self.device));
        self.recorded(&mut p);
    }

    /// Counts an op recorded, submitting the pending encoder when it has grown long.
    fn recorded(&self, p: &mut Pending) {
        p.ops += 1;
        if p.ops >= MAX_PENDING_OPS {
            self.submit(p);
        }
    }

    fn submit(&self, p: &mut Pending) {
        p.pass = None;
        if let Some(enc) = p.encoder.take() {
            p.last = Some(self.queue.submit(std::iter::once(enc.finish())));
        }
        p.ops = 0;
    }

    /// Submits everything recorded so far.
    pub fn flush(&self) {
        let _device = self.device_guard();
        let mut p = self.pending.lock().unwrap();
        self.submit(&mut p);
    }

    /// Submits everything and waits for the device to finish it.
    pub fn synchronize(&self) {
        let _device = self.device_guard();
        self.sync_inner();
    }

    fn sync_inner(&self) {
        let last = {
            let mut p = self.pending.lock().unwrap();
            self.submit(&mut p);
            p.last.clone()
        };
        if let Some(idx) = last {
            self.wait_for(idx, || true);
        }
    }

    /// Waits until submission `idx` is done and `ready()` holds, polling in short slices: the
    /// GL backend holds its context for a whole wait and other threads give up on it after a
    /// second, which slow (software) devices exceed. The submission index is explicit since
    /// concurrent submits and index-less waits trip an assertion in wgpu-core.
    fn wait_for(&self, idx: wgpu::SubmissionIndex, mut ready: impl FnMut() -> bool) {
        let mut done = false;
        while !(done && ready()) {
            let slice = wgpu::PollType::Wait {
                submission_index: Some(idx.clone()),
                timeout: Some(std::time::Duration::from_millis(5)),
            };
            match self.device.poll(slice) {
                Ok(_) => done = true,
                Err(wgpu::PollError::Timeout) => {}
                Err(e) => panic!("wgpu device: {e}"),
            }
        }
    }

    /// This adapter's largest storage binding: bytes, and the limit as messages name it.
    pub(super) fn binding_limit(&self) -> (u64, String) {
        let limit = format!(
            "this adapter's largest storage binding ({:.1} MiB, {})",
            self.max_binding as f64 / 1048576.0,
            self.info.name
        );
        (self.max_binding, limit)
    }

    /// A buffer of `bytes` that wgpu would reject when bound, later and far from its cause: an
    /// error saying so.
    pub(super) fn check_size(&self, bytes: u64) -> Result<(), String> {
        let (max, limit) = self.binding_limit();
        match bytes <= max {
            true => Ok(()),
            false => Err(format!("over {limit}")),
        }
    }

    /// [`Wgpu::check_size`] where no error can be returned: the batch buffers are checked
    /// before ([`Device::memory_limits`], [`Device::try_zeros`]), and every other buffer is
    /// sized by a batch's, so this is a broken invariant, not bad input.
    fn assert_size(&self, bytes: u64) {
        if let Err(e) = self.check_size(bytes) {
            panic!(
                "a {:.1} MiB buffer is {e}, past the workspace's checks",
                bytes as f64 / 1048576.0
            );
        }
    }

    fn device_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.device_lock.lock().unwrap()
    }

    pub(super) fn buf_from<T: bytemuck::Pod>(&self, x: &[T]) -> wgpu::Buffer {
        self.assert_size(size_of_val(x) as u64);
        let _device = self.device_guard();
        let bytes: &[u8] = bytemuck::cast_slice(x);
        let mut data = bytes.to_vec();
        data.resize(padded(bytes.len() as u64) as usize, 0);
        self.counters.buffer();
        self.counters.upload(bytes.len());
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: &data,
                usage: storage_usage(),
            })
    }

    pub(super) fn upload_real<T: GpuReal>(&self, x: &[T]) -> Buf<T> {
        Buf {
            buf: self.buf_from(x),
            len: x.len(),
            id: self.new_id(),
            host: None,
            _t: Default::default(),
        }
    }

    pub(super) fn upload_i32(&self, x: &[i32]) -> Idx {
        Idx {
            buf: self.buf_from(x),
            host: Arc::new(x.to_vec()),
            id: self.new_id(),
            version: self.new_id(),
            window: None,
            frame_lists: Arc::default(),
        }
    }

    /// Overwrites the start of `buf` with `bytes` after the work recorded so far: that work is
    /// submitted first, since a queue write lands before the next submission.
    pub(super) fn write_bytes(&self, buf: &wgpu::Buffer, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        assert!(
            bytes.len() as u64 <= buf.size(),
            "writing {} bytes into a buffer of {}",
            bytes.len(),
            buf.size()
        );
        let _device = self.device_guard();
        let mut p = self.pending.lock().unwrap();
        self.submit(&mut p);
        self.queue.write_buffer(buf, 0, bytes);
        self.counters.upload(bytes.len());
    }

    pub(super) fn write_real<T: GpuReal>(&self, b: &mut Buf<T>, x: &[T]) {
        assert_eq!(x.len(), b.len, "write: length differs from the buffer's");
        self.write_bytes(&b.buf, bytemuck::cast_slice(x));
        if let Some(h) = &mut b.host {
            Arc::make_mut(h).copy_from_slice(x);
        }
    }

    pub(super) fn write_i32(&self, b: &mut Idx, x: &[i32]) {
        assert_eq!(
            x.len(),
            b.host.len(),
            "write_idx: length differs from the buffer's"
        );
        self.write_bytes(&b.buf, bytemuck::cast_slice(x));
        b.host = Arc::new(x.to_vec());
        b.version = self.new_id();
        b.window = None;
    }

    /// [`Device::gather`](crate::backend::Device::gather) of index buffers: device copies,
    /// the host copy kept alike.
    pub(super) fn gather_i32(&self, src: &Idx, dst: &mut Idx, spans: &[Span]) {
        let host: &mut Vec<i32> = Arc::make_mut(&mut dst.host);
        crate::backend::gather_slices(&src.host, host, spans);
        for s in spans {
            self.copy_region(
                &src.buf,
                4 * s.src as u64,
                &dst.buf,
                4 * s.dst as u64,
                4 * s.len as u64,
            );
        }
        dst.version = self.new_id();
        dst.window = crate::backend::window_start(spans).map(|at| Window {
            at,
            lists: Arc::clone(&src.frame_lists),
        });
    }

    /// A persistent buffer holding `x` for op `name`, rewritten only when `x` changes: an op's
    /// few constants (coefficients, hyper-parameters) without a new buffer per call.
    pub(super) fn consts<T: bytemuck::Pod>(
        &self,
        _op: &OneOp,
        name: &'static str,
        x: &[T],
    ) -> wgpu::Buffer {
        let bytes: &[u8] = bytemuck::cast_slice(x);
        let mut cache = self.consts.lock().unwrap();
        match cache.get_mut(&(name, size_of::<T>())) {
            Some((old, buf)) if old.len() == bytes.len() => {
                if old != bytes {
                    self.write_bytes(buf, bytes);
                    old.copy_from_slice(bytes);
                }
                buf.clone()
            }
            _ => {
                let buf = self.buf_from(x);
                cache.insert((name, size_of::<T>()), (bytes.to_vec(), buf.clone()));
                buf
            }
        }
    }

    /// Copies the first `bytes` of `src` into `dst` from byte `offset`, in order with the
    /// recorded ops.
    pub(super) fn copy_bytes(
        &self,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) {
        self.copy_region(src, 0, dst, offset, bytes);
    }

    /// Copies `bytes` of `src` from byte `from` into `dst` from byte `to`, in order with the
    /// recorded ops.
    pub(super) fn copy_region(
        &self,
        src: &wgpu::Buffer,
        from: u64,
        dst: &wgpu::Buffer,
        to: u64,
        bytes: u64,
    ) {
        if bytes == 0 {
            return;
        }
        assert!(
            from + bytes <= src.size() && to + bytes <= dst.size(),
            "copy past the end of a buffer"
        );
        let _device = self.device_guard();
        self.counters.launch();
        self.record(|enc| enc.copy_buffer_to_buffer(src, from, dst, to, bytes));
    }

    /// A zero-filled buffer (wgpu zero-initialises new buffers).
    pub(super) fn zeros_raw(&self, bytes: u64) -> wgpu::Buffer {
        self.assert_size(bytes);
        let _device = self.device_guard();
        self.counters.buffer();
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: padded(bytes),
            usage: storage_usage(),
            mapped_at_creation: false,
        })
    }

    pub(super) fn zeros_real<T: GpuReal>(&self, n: usize) -> Buf<T> {
        Buf {
            buf: self.zeros_raw((n * size_of::<T>()) as u64),
            len: n,
            id: self.new_id(),
            host: None,
            _t: Default::default(),
        }
    }

    /// Records a copy of the first `bytes` (rounded up to 4) of `buf` into a new mappable
    /// buffer after all recorded work, and submits it.
    fn stage(&self, buf: &wgpu::Buffer, bytes: u64) -> (wgpu::Buffer, wgpu::SubmissionIndex) {
        let size = bytes.div_ceil(4) * 4;
        self.counters.buffer();
        self.counters.readback(bytes as usize);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut p = self.pending.lock().unwrap();
        p.encoder(&self.device)
            .copy_buffer_to_buffer(buf, 0, &staging, 0, size);
        self.submit(&mut p);
        (staging, p.last.clone().expect("just submitted"))
    }

    fn unstage(staging: wgpu::Buffer, bytes: u64) -> Vec<u8> {
        let out = staging.get_mapped_range(..).expect("mapped range")[..bytes as usize].to_vec();
        staging.unmap();
        out
    }

    /// Copies the first `bytes` of a buffer back to the host, after all recorded work.
    pub(super) fn read_bytes(&self, buf: &wgpu::Buffer, bytes: u64) -> Vec<u8> {
        if bytes == 0 {
            return Vec::new();
        }
        let _device = self.device_guard();
        self.read_locked(buf, bytes)
    }

    /// [`Wgpu::read_bytes`] for a caller that holds the device lock.
    fn read_locked(&self, buf: &wgpu::Buffer, bytes: u64) -> Vec<u8> {
        let (staging, idx) = self.stage(buf, bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        let mut mapped = None;
        self.wait_for(idx, || {
            mapped = mapped.take().or_else(|| rx.try_recv().ok());
            mapped.is_some()
        });
        mapped
            .expect("map callback")
            .expect("mapping a download buffer");
        Self::unstage(staging, bytes)
    }

    /// [`Wgpu::read_bytes`] without blocking the thread: in a browser the mapping completes only
    /// after control returns to the page's event loop, so a download there must be awaited.
    async fn read_bytes_async(&self, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = {
            let _device = self.device_guard();
            self.stage(buf, bytes).0
        };
        let slot: Arc<Mutex<MapSlot>> = Arc::default();
        let done = Arc::clone(&slot);
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let mut s = done.lock().unwrap();
            s.result = Some(r);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        std::future::poll_fn(|cx| {
            // Native devices deliver the callback only when polled; a browser ignores this.
            {
                let _device = self.device_guard();
                let _ = self.device.poll(wgpu::PollType::Poll);
            }
            let mut s = slot.lock().unwrap();
            match s.result.take() {
                Some(r) => std::task::Poll::Ready(r),
                None => {
                    s.waker = Some(cx.waker().clone());
                    if cfg!(not(target_arch = "wasm32")) {
                        cx.waker().wake_by_ref();
                    }
                    std::task::Poll::Pending
                }
            }
        })
        .await
        .map_err(|e| anyhow!("reading back a GPU buffer on {}: {e}", self.info.name))?;
        Ok(Self::unstage(staging, bytes))
    }

    pub(super) fn download_real<T: GpuReal>(&self, b: &Buf<T>) -> Vec<T> {
        let bytes = self.read_bytes(&b.buf, (b.len * size_of::<T>()) as u64);
        bytemuck::pod_collect_to_vec(&bytes)
    }

    /// A buffer's values, awaited rather than waited for (see `Wgpu::read_bytes_async`); the
    /// way to read results in a browser. Fails if the device is lost.
    pub async fn download_async<T: GpuReal>(&self, b: &Buf<T>) -> Result<Vec<T>> {
        let bytes = self
            .read_bytes_async(&b.buf, (b.len * size_of::<T>()) as u64)
            .await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Zeroes a buffer, in order with the recorded ops.
    pub(super) fn clear(&self, buf: &wgpu::Buffer) {
        let _device = self.device_guard();
        self.counters.launch();
        self.record(|enc| enc.clear_buffer(buf, 0, None));
    }

    /// To be held while recording an op that uses [`Wgpu::scratch`], [`Wgpu::consts`] or
    /// [`Wgpu::force_lists`] (which ask for it).
    pub(super) fn exclusive(&self) -> OneOp<'_> {
        OneOp {
            _held: self.op_lock.lock().unwrap(),
        }
    }

    /// A grow-only scratch buffer private to one op; ops run in order on the device, so one
    /// op's scratch is free again when the next op starts.
    pub(super) fn scratch(&self, _op: &OneOp, name: &'static str, bytes: u64) -> wgpu::Buffer {
        let mut s = self.scratch.lock().unwrap();
        match s.get(name) {
            Some(b) if b.size() >= padded(bytes) => b.clone(),
            _ => {
                let b = self.zeros_raw(bytes.max(1024));
                s.insert(name, b.clone());
                b
            }
        }
    }

    /// A plan of batch shape `d` was dropped ([`crate::backend::Device::forget_shape`]): its
    /// table and force lists go, and every bind group with them, since a bind group holds the
    /// buffers it binds (a dropped plan's among them). The plans still in use make theirs
    /// again on their next step.
    pub(super) fn forget(&self, d: &Dims) {
        self.bind_groups.lock().unwrap().clear();
        self.dims
            .lock()
            .unwrap()
            .remove(&gpu_layout::shape_table(d));
        self.force_lists.lock().unwrap().retain(|(cd, _)| cd != d);
    }

    /// The batch shape's table ([`gpu_layout::shape_table`]), uploaded once per shape.
    pub(super) fn dims_buf(&self, d: &Dims) -> wgpu::Buffer {
        let table = gpu_layout::shape_table(d);
        let mut cache = self.dims.lock().unwrap();
        if let Some(b) = cache.get(&table) {
            return b.clone();
        }
        let b = self.buf_from(&table);
        cache.insert(table, b.clone());
        b
    }

    /// The force gather lists of a batch (see `shaders/scatter.wgsl`): (ptr, ent), written into
    /// the same buffers when the owner or centre table has changed since: copied on the device
    /// when the batch is one resident frame ([`Wgpu::resident_lists`]), else built on the host.
    pub(super) fn force_lists(
        &self,
        _op: &OneOp,
        d: &Dims,
        owner: &Idx,
        centre_atom: &Idx,
    ) -> (wgpu::Buffer, wgpu::Buffer) {
        let versions = (owner.version, centre_atom.version);
        let mut cache = self.force_lists.lock().unwrap();
        let i = match cache.iter().position(|(cd, _)| cd == d) {
            Some(i) => i,
            None => {
                let natoms = d.nbatch_atoms();
                let fl = ForceLists {
                    versions: (0, 0),
                    ptr: self.zeros_raw(4 * (natoms as u64 + 1)),
                    // Sized for every slot real (2 entries per slot): any batch of the shape fits.
                    ent: self.zeros_raw(8 * d.nslots() as u64),
                };
                cache.push((d.clone(), fl));
                cache.len() - 1
            }
        };
        let fl = &mut cache[i].1;
        if fl.versions != versions {
            if let Some((lists, g)) = self.resident_lists(d, owner, centre_atom) {
                let n = (d.natoms + 1) as u64;
                self.copy_region(&lists.ptr, 4 * n * g as u64, &fl.ptr, 0, 4 * n);
                let (cap, used) = (lists.cap as u64, lists.used[g] as u64);
                self.copy_region(&lists.ent, 4 * cap * g as u64, &fl.ent, 0, 4 * used);
            } else {
                let (ptr, ent) = super::force_csr::force_csr(d, &owner.host, &centre_atom.host);
                self.write_bytes(&fl.ptr, bytemuck::cast_slice(&ptr));
                self.write_bytes(&fl.ent, bytemuck::cast_slice(&ent));
            }
            fl.versions = versions;
        }
        (fl.ptr.clone(), fl.ent.clone())
    }

    /// Builds and uploads the force gather lists of every frame of `owner`, the owner tables
    /// of resident frames of one-frame shape `d` one after the other (once).
    pub(super) fn frame_lists(&self, d: &Dims, owner: &Idx, centre_atom: &Idx) {
        let ns = d.nslots();
        if d.nframes != 1 || ns == 0 || !owner.len().is_multiple_of(ns) {
            return;
        }
        owner.frame_lists.get_or_init(|| {
            let mut ptr = Vec::new();
            let mut ents = Vec::new();
            for frame in owner.host.chunks(ns) {
                let (p, e) = super::force_csr::force_csr(d, frame, &centre_atom.host);
                ptr.extend(p);
                ents.push(e);
            }
            let cap = ents.iter().map(Vec::len).max().unwrap_or(0).max(1);
            let used = ents.iter().map(Vec::len).collect();
            let mut ent = Vec::with_capacity(cap * ents.len());
            for mut e in ents {
                e.resize(cap, 0);
                ent.extend(e);
            }
            FrameLists {
                dims: d.clone(),
                centre_atom: centre_atom.host.to_vec(),
                ptr: self.buf_from(&ptr),
                ent: self.buf_from(&ent),
                cap,
                used,
            }
        });
    }

    /// When the batch is one frame whose owner table was gathered from a table of resident
    /// frames prepared by [`Wgpu::frame_lists`]: those lists and the frame.
    fn resident_lists<'a>(
        &self,
        d: &Dims,
        owner: &'a Idx,
        centre_atom: &Idx,
    ) -> Option<(&'a FrameLists, usize)> {
        let w = owner.window.as_ref()?;
        let lists = w.lists.get()?;
        let ns = d.nslots();
        let same = lists.dims == *d && lists.centre_atom == *centre_atom.host;
        (same && owner.len() == ns && w.at.is_multiple_of(ns)).then_some((lists, w.at / ns))
    }
}

/// One dispatch, ready to be encoded into a compute pass.
struct Dispatch<'a> {
    label: &'static str,
    pipeline: &'a wgpu::ComputePipeline,
    bind_group: &'a wgpu::BindGroup,
    groups: [u32; 3],
}

impl Dispatch<'_> {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(self.pipeline);
        pass.set_bind_group(0, self.bind_group, &[]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

//! `DPW_WGPU_PROFILE`: the device's time per kernel ([`Wgpu::profile_report`]).
//!
//! Where the adapter has timestamp queries, every dispatch gets a compute pass of its own whose
//! start and end the GPU stamps, read back every few thousand dispatches: the kernels' own times,
//! and the time between them (barriers, command buffers, the host's submits), with nothing
//! waited for in between. Elsewhere every dispatch is waited for and timed on the host, which
//! adds a submit and a wait to each (tens of µs on a GPU), so it ranks kernels only roughly.
//!
//! [`Wgpu::profile_report`]: super::Wgpu::profile_report

use std::collections::HashMap;
use std::time::Duration;

/// Dispatches stamped before their timestamps are read back: a query set holds at most
/// 4,096 queries, two per dispatch.
pub(super) const STAMPED: usize = (wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;

/// A kernel as the report names it: shader file, entry point, precision.
pub(super) type KernelName = (&'static str, &'static str, &'static str);

#[derive(Default)]
pub(super) struct Totals {
    calls: u64,
    seconds: f64,
}

impl Totals {
    fn add(&mut self, seconds: f64) {
        self.calls += 1;
        self.seconds += seconds;
    }
}

pub(super) enum Profile {
    /// Every dispatch waited for; host wall time per kernel.
    Waited(HashMap<KernelName, Totals>),
    Stamped(Stamps),
}

/// The query set of the dispatches stamped since the last read-back, and the sums so far.
pub(super) struct Stamps {
    pub(super) set: wgpu::QuerySet,
    /// Where the set is resolved to, to be copied back.
    pub(super) resolved: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// The kernel of each dispatch stamped since the last read-back, in order.
    pending: Vec<KernelName>,
    kernels: HashMap<KernelName, Totals>,
    /// Seconds from the first start to the last end of each read-back's dispatches, summed.
    span: f64,
    dispatches: u64,
}

impl Profile {
    /// Stamped when `device` has `TIMESTAMP_QUERY`, else waited.
    pub(super) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        if !device.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return Profile::Waited(HashMap::new());
        }
        let set = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("dpw profile"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * STAMPED as u32,
        });
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dpw profile"),
            size: 2 * STAMPED as u64 * wgpu::QUERY_SIZE as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Profile::Stamped(Stamps {
            set,
            resolved,
            period_ns: queue.get_timestamp_period() as f64,
            pending: Vec::with_capacity(STAMPED),
            kernels: HashMap::new(),
            span: 0.0,
            dispatches: 0,
        })
    }

    pub(super) fn report(&self) -> String {
        match self {
            Profile::Waited(kernels) => {
                let head = format!(
                    "wgpu kernels, each dispatch waited for: {:.1} ms in all:\n",
                    seconds(kernels) * 1e3
                );
                head + &rows(kernels)
            }
            Profile::Stamped(s) => {
                let busy = seconds(&s.kernels);
                let gaps = s.span - busy;
                let head = format!(
                    "wgpu kernels, GPU timestamps: {:.1} ms inside {} dispatches, {:.1} ms from \
                     first start to last end ({:.1} ms between dispatches, {:.1} µs a dispatch):\n",
                    busy * 1e3,
                    s.dispatches,
                    s.span * 1e3,
                    gaps * 1e3,
                    gaps * 1e6 / s.dispatches.max(1) as f64
                );
                head + &rows(&s.kernels)
            }
        }
    }
}

/// Adds one waited-for dispatch's wall time.
pub(super) fn add_waited(kernels: &mut HashMap<KernelName, Totals>, k: KernelName, t: Duration) {
    kernels.entry(k).or_default().add(t.as_secs_f64());
}

impl Stamps {
    /// The next dispatch's pair of queries, after [`Stamps::full`] was handled.
    pub(super) fn next(&mut self, k: KernelName) -> wgpu::ComputePassTimestampWrites<'_> {
        let i = 2 * self.pending.len() as u32;
        self.pending.push(k);
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        }
    }

    pub(super) fn full(&self) -> bool {
        self.pending.len() == STAMPED
    }

    /// Queries written since the last read-back.
    pub(super) fn queries(&self) -> u32 {
        2 * self.pending.len() as u32
    }

    /// Adds the read-back timestamps of the pending dispatches.
    pub(super) fn add(&mut self, ticks: &[u64]) {
        let to_s = self.period_ns * 1e-9;
        let (mut first, mut last) = (u64::MAX, 0);
        for (k, t) in self.pending.drain(..).zip(ticks.chunks_exact(2)) {
            first = first.min(t[0]);
            last = last.max(t[1]);
            let seconds = t[1].saturating_sub(t[0]) as f64 * to_s;
            self.kernels.entry(k).or_default().add(seconds);
            self.dispatches += 1;
        }
        self.span += last.saturating_sub(first) as f64 * to_s;
    }
}

/// Seconds inside all the kernels.
fn seconds(kernels: &HashMap<KernelName, Totals>) -> f64 {
    kernels.values().map(|t| t.seconds).sum()
}

/// One line per kernel, slowest first.
fn rows(kernels: &HashMap<KernelName, Totals>) -> String {
    let mut rows: Vec<_> = kernels.iter().collect();
    rows.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    let mut out = String::new();
    for ((file, entry, prec), t) in rows {
        out += &format!(
            "  {:9.2} ms {:6} calls {:8.1} µs a call  {file}:{entry} {prec}\n",
            t.seconds * 1e3,
            t.calls,
            t.seconds * 1e6 / t.calls as f64
        );
    }
    out
}

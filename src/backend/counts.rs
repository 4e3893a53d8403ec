//! What a step costs besides arithmetic: launches, transfers between host and device, and
//! objects created. `dpw bench --profile` reports these per step for every backend; a GPU
//! step's time is set by them long before the kernels matter.

use std::sync::atomic::{AtomicU64, Ordering};

/// Totals since a backend was opened (or per step, as a difference of two totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Kernel launches / compute dispatches (and device-side copies and clears); on the CPU,
    /// op calls.
    pub launches: u64,
    /// Host-to-device transfers: new buffers with contents and writes into existing ones.
    pub uploads: u64,
    pub upload_bytes: u64,
    /// Device-to-host transfers.
    pub readbacks: u64,
    pub readback_bytes: u64,
    /// Device buffers allocated (uniform, staging and scratch buffers included).
    pub buffers: u64,
    /// wgpu bind groups created.
    pub bind_groups: u64,
}

impl Counts {
    /// `self − earlier`, field by field.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            launches: self.launches - earlier.launches,
            uploads: self.uploads - earlier.uploads,
            upload_bytes: self.upload_bytes - earlier.upload_bytes,
            readbacks: self.readbacks - earlier.readbacks,
            readback_bytes: self.readback_bytes - earlier.readback_bytes,
            buffers: self.buffers - earlier.buffers,
            bind_groups: self.bind_groups - earlier.bind_groups,
        }
    }

    /// The fields with their report names, in report order.
    pub fn entries(&self) -> [(&'static str, u64); 7] {
        [
            ("launches", self.launches),
            ("uploads", self.uploads),
            ("upload_bytes", self.upload_bytes),
            ("readbacks", self.readbacks),
            ("readback_bytes", self.readback_bytes),
            ("buffers_created", self.buffers),
            ("bind_groups_created", self.bind_groups),
        ]
    }
}

/// Thread-safe running totals, kept by a backend at the points where it touches the device.
#[derive(Debug, Default)]
pub struct Counters {
    launches: AtomicU64,
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
    readbacks: AtomicU64,
    readback_bytes: AtomicU64,
    buffers: AtomicU64,
    bind_groups: AtomicU64,
}

fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub fn launch(&self) {
        bump(&self.launches, 1);
    }
    pub fn upload(&self, bytes: usize) {
        bump(&self.uploads, 1);
        bump(&self.upload_bytes, bytes as u64);
    }
    pub fn readback(&self, bytes: usize) {
        bump(&self.readbacks, 1);
        bump(&self.readback_bytes, bytes as u64);
    }
    pub fn buffer(&self) {
        bump(&self.buffers, 1);
    }
    pub fn bind_group(&self) {
        bump(&self.bind_groups, 1);
    }

    pub fn get(&self) -> Counts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            launches: g(&self.launches),
            uploads: g(&self.uploads),
            upload_bytes: g(&self.upload_bytes),
            readbacks: g(&self.readbacks),
            readback_bytes: g(&self.readback_bytes),
            buffers: g(&self.buffers),
            bind_groups: g(&self.bind_groups),
        }
    }
}

//! Training frames kept on the device for the whole run (docs/design.md §5): each frame's slot
//! layout (r_ij, owners) and labels are assembled once at start-up, so that a step only selects
//! frames: the batch is put together on the device by [`Device::gather`](crate::backend::Device::gather) and
//! [`Device::gather_idx`](crate::backend::Device::gather_idx) into the plan's buffers, and nothing of it crosses from the host.
//!
//! Which systems: those that fit the budget, in order — `DPW_RESIDENT_MB` or the backend's
//! [`Device::resident_budget`](crate::backend::Device::resident_budget) (1 GiB on wgpu and cuda; 0 on the cpu backend, where a resident
//! frame would be a copy as large as the per-step write it replaces, and the float64 slot
//! layout of the water example alone, 0.7 MB a frame, would take its memory past the CPU
//! target). A system left out is assembled on the host and written every step, as before.

use std::ops::Range;

use anyhow::Result;
use rayon::prelude::*;

use crate::backend::{Backend, Dims, Real, Span};
use crate::data::{System, SystemInfo, SystemStore};
use crate::mem::{try_with_capacity, OutOfMemory};
use crate::model::ModelSpec;

use super::batch::{assemble_frames, centre_atoms};
use super::dataset::DataSet;
use super::step::Workspace;

/// Frames assembled at a time while building: enough for every thread, few enough that the
/// float64 host batches in flight stay small beside the device copy.
const CHUNK: usize = 64;

/// The budget in bytes: `DPW_RESIDENT_MB` if set, else the backend's default.
pub fn budget<T: Real, B: Backend<T>>(b: &B, data: &DataSet) -> Result<usize> {
    if data.mixed.is_some() {
        // A "mixed:N" batch takes frames of several systems: it is assembled on the host.
        return Ok(0);
    }
    Ok(crate::settings::RESIDENT_MB
        .bytes()?
        .unwrap_or_else(|| b.resident_budget()))
}

/// One system's frames on the device.
pub struct ResidentSystem<T: Real, B: Backend<T>> {
    /// The shape of a batch of one frame (the first; a mixed-type system's frames differ in
    /// composition, not in atoms or slots).
    one: Dims,
    /// Each frame's atoms of each type, `[frame][type]`.
    counts: Vec<Vec<usize>>,
    nframes: usize,
    /// Batch positions provided for: the system's batch size.
    positions: usize,
    /// `[frame][3·slots]`.
    rij: B::Buf,
    /// `[position][frame][slots]`, each owner already numbered for its batch position
    /// (`position·natoms + atom`), so that a batch is assembled by copies alone.
    owner: B::Idx,
    /// A mixed-type descriptor's (DPA-1's) neighbour type of every slot, `[frame][slots]`
    /// ([`crate::train::batch::HostBatch::nei_type`]); `None` for the others.
    nei_type: Option<B::Idx>,
    /// `[frame]`, `[frame][3·natoms]`, `[frame][9]`.
    labels: [B::Buf; 3],
}

/// Bytes a system's frames take on the device: r_ij, owners (per batch position), labels, and
/// up to two entries per slot of a backend's force gather lists ([`Device::prepare_frames`](crate::backend::Device::prepare_frames)).
fn bytes<T: Real>(one: &Dims, nframes: usize, positions: usize) -> usize {
    let (ns, n) = (one.nslots(), one.natoms);
    let per_frame = ns * (3 * size_of::<T>() + (positions + 2) * size_of::<i32>())
        + (1 + 3 * n + 9) * size_of::<T>();
    nframes * per_frame
}

/// The largest of those arrays: r_ij's, or the neighbours' owners at every batch position.
fn largest_array<T: Real>(one: &Dims, nframes: usize, positions: usize) -> usize {
    let ns = one.nslots() * nframes;
    (3 * ns * size_of::<T>()).max(ns * positions.max(1) * size_of::<i32>())
}

/// The atoms of each of `ntypes` types in `atype`.
fn type_counts(ntypes: usize, atype: &[usize]) -> Vec<usize> {
    (0..ntypes)
        .map(|t| atype.iter().filter(|&&x| x == t).count())
        .collect()
}

/// The shape of a batch of one frame of atoms `atype` (sorted).
fn one_frame_dims(spec: &ModelSpec, atype: &[usize]) -> Dims {
    Dims::of_descriptor(&spec.descriptor, 1, &type_counts(spec.ntypes(), atype))
}

impl<T: Real, B: Backend<T>> ResidentSystem<T, B> {
    /// Every frame of `sys` on the device, for batches of up to `positions` frames.
    pub fn new(b: &B, spec: &ModelSpec, sys: &System, positions: usize) -> Result<Self> {
        let one = one_frame_dims(spec, sys.frame_atype(0));
        let nframes = sys.nframes;
        let (ns, n) = (one.nslots(), one.natoms);
        let oom = |e: OutOfMemory| {
            e.lowered_by(
                "DPW_RESIDENT_MB lowers the frames kept on the device (0: none; the others are \
                 written every step)",
            )
        };
        let what = || format!("the frames of {} kept on the device", sys.path.display());
        let mut rij = try_with_capacity(3 * ns * nframes, what).map_err(oom)?;
        let mut owner = try_with_capacity(ns * nframes * positions.max(1), what).map_err(oom)?;
        let [mut e, mut f, mut v] = [Vec::new(), Vec::new(), Vec::new()];
        let mut nei_type = Vec::new();
        let all: Vec<usize> = (0..nframes).collect();
        for chunk in all.chunks(CHUNK) {
            let batches = chunk
                .par_iter()
                .map(|&g| assemble_frames(spec, sys, &[g], "training"))
                .collect::<Result<Vec<_>>>()?;
            for hb in batches {
                assert_eq!(
                    (hb.dims.nslots(), hb.dims.natoms),
                    (ns, n),
                    "a frame of another size in one system"
                );
                rij.extend(hb.rij.iter().map(|&x| T::of(x)));
                owner.extend(hb.owner);
                nei_type.extend(hb.nei_type);
                e.extend(hb.energy.iter().map(|&x| T::of(x)));
                f.extend(hb.force.iter().map(|&x| T::of(x)));
                v.extend(hb.virial.iter().map(|&x| T::of(x)));
            }
        }
        let frame_owner = owner.len();
        for p in 1..positions {
            let shift = (p * n) as i32;
            owner.extend_from_within(..frame_owner);
            let copy = owner.len() - frame_owner..owner.len();
            owner[copy]
                .iter_mut()
                .filter(|o| **o >= 0)
                .for_each(|o| *o += shift);
        }
        let owner = b.upload_idx(&owner);
        if positions == 1 {
            b.prepare_frames(&one, &owner, &b.upload_idx(&centre_atoms(&one)));
        }
        Ok(ResidentSystem {
            counts: (0..nframes)
                .map(|g| type_counts(one.ntypes, sys.frame_atype(g)))
                .collect(),
            one,
            nframes,
            positions,
            // Kept on the host too where the descriptor reads r_ij there (block models):
            // a batch gathered on the device is then known to the host without a read-back.
            rij: if spec.descriptor.kind.reads_rij() {
                b.upload_kept(rij)
            } else {
                b.upload(&rij)
            },
            owner,
            nei_type: (spec.descriptor.is_mixed()).then(|| b.upload_idx(&nei_type)),
            labels: [b.upload(&e), b.upload(&f), b.upload(&v)],
        })
    }

    /// The shape of the batch of `frames` of this system (the batch layout's of these
    /// frames' compositions, as [`assemble_frames`] makes it).
    pub fn dims(&self, frames: &[usize]) -> Dims {
        let counts: Vec<Vec<usize>> = frames.iter().map(|&g| self.counts[g].clone()).collect();
        Dims::of_frames(&counts, &self.one.sel, self.one.m1, self.one.m2)
    }

    /// Whether a batch of these frames can be gathered from the device.
    pub fn holds(&self, frames: &[usize]) -> bool {
        frames.len() <= self.positions && frames.iter().all(|&g| g < self.nframes)
    }

    /// Puts the batch of `frames` together in `w` (shaped [`ResidentSystem::dims`]) on the
    /// device.
    pub fn load(&self, b: &B, w: &mut Workspace<T, B>, frames: &[usize]) {
        assert!(self.holds(frames), "frames {frames:?} are not resident");
        let d = self.dims(frames);
        assert_eq!(w.dims, d, "workspace built for another batch shape");
        let (ns, n) = (self.one.nslots(), self.one.natoms);
        let (rij, owner, labels) = w.inputs_mut();
        // A frame's slot block of each (centre type, neighbour type) goes to its frame's place
        // in that block of the batch (the layout of [`Dims`]).
        let nsec = self.one.nsec;
        let blocks: Vec<Vec<(Range<usize>, usize)>> = (frames.iter().enumerate())
            .map(|(f, &g)| {
                let one = Dims::new(1, &self.counts[g], &self.one.sel, self.one.m1, self.one.m2);
                (0..one.block_start.len() - 1)
                    .map(|k| {
                        let r = one.block_start[k]..one.block_start[k + 1];
                        let (ti, tj) = (k / nsec, k % nsec);
                        let before = d.frame_start[ti * (d.nframes + 1) + f] - d.centre_start[ti];
                        (r, d.block_start[k] + before * d.sel[tj])
                    })
                    .filter(|(r, _)| !r.is_empty())
                    .collect()
            })
            .collect();
        let slot_spans = |scale: usize, src_base: &dyn Fn(usize) -> usize| -> Vec<Span> {
            let mut spans = Vec::new();
            for (f, &g) in frames.iter().enumerate() {
                for (r, at) in &blocks[f] {
                    spans.push(Span {
                        src: scale * (src_base(f) + g * ns + r.start),
                        dst: scale * at,
                        len: scale * r.len(),
                    });
                }
            }
            spans
        };
        b.gather(&self.rij, rij, &slot_spans(3, &|_| 0));
        b.gather_idx(
            &self.owner,
            owner,
            &slot_spans(1, &|f| f * self.nframes * ns),
        );
        for (i, per) in [1, 3 * n, 9].into_iter().enumerate() {
            let spans: Vec<Span> = frames
                .iter()
                .enumerate()
                .map(|(f, &g)| Span {
                    src: g * per,
                    dst: f * per,
                    len: per,
                })
                .collect();
            b.gather(&self.labels[i], &mut labels[i], &spans);
        }
        if let (Some(src), Some(dst)) = (&self.nei_type, w.nei_type_mut()) {
            b.gather_idx(src, dst, &slot_spans(1, &|_| 0));
        }
    }
}

/// The resident systems of a training set (`None` for one assembled every step).
pub struct Resident<T: Real, B: Backend<T>> {
    systems: Vec<Option<ResidentSystem<T, B>>>,
}

impl<T: Real, B: Backend<T>> Resident<T, B> {
    /// Keeps on the device, in order, the training systems (`infos`, with their batch sizes,
    /// frames in `store`) that fit `budget` bytes together.
    pub fn new(
        b: &B,
        spec: &ModelSpec,
        infos: &[SystemInfo],
        batch_sizes: &[usize],
        store: &SystemStore,
        budget: usize,
    ) -> Result<Self> {
        // Each array is one buffer: none may be larger than the device's largest (a storage
        // binding's on wgpu: 128 MiB on some adapters, below the budget).
        let limits = b.memory_limits().largest;
        let largest = limits.as_ref().map_or(usize::MAX, |(l, _)| {
            usize::try_from(*l).unwrap_or(usize::MAX)
        });
        let mut too_large = 0;
        let mut used = 0usize;
        let mut systems = Vec::new();
        let mut frames = 0;
        for (s, info) in infos.iter().enumerate() {
            let one = one_frame_dims(spec, &info.compositions[0].atype);
            let need = bytes::<T>(&one, info.nframes, batch_sizes[s]);
            let fits = largest_array::<T>(&one, info.nframes, batch_sizes[s]) <= largest;
            // A model's with frame or atomic parameters is assembled every step: the resident
            // frames do not hold its fitting input. So is a property model's, whose loss reads
            // its labels on the host, and a model's with a pair table, whose terms are made on
            // the host from each batch, and a linear model's, whose DP models have lists of
            // their own. (A mixed-type system's frames, each of its own composition and padding
            // type, are kept with their own slot layouts.)
            let keep = spec.fitting.param_inputs() == 0
                && spec.short_range.is_none()
                && spec.linear.is_none()
                && spec.fitting.output.is_ener()
                && used.saturating_add(need) <= budget
                && fits;
            too_large += usize::from(!fits);
            systems.push(if keep {
                used += need;
                frames += info.nframes;
                let sys = store.get(s)?;
                Some(ResidentSystem::new(b, spec, &sys, batch_sizes[s])?)
            } else {
                None
            });
        }
        let kept = systems.iter().flatten().count();
        tracing::info!(
            "training frames on the device: {kept} of {} systems ({frames} frames, {:.0} MiB; budget {} MiB, DPW_RESIDENT_MB){}",
            systems.len(),
            used as f64 / (1u64 << 20) as f64,
            budget >> 20,
            match (kept < systems.len(), &limits) {
                (true, Some((_, limit))) if too_large > 0 => format!(
                    "; the others are written every step ({too_large} with an array over {limit})"
                ),
                (true, _) => "; the others are written every step".into(),
                (false, _) => String::new(),
            }
        );
        Ok(Resident { systems })
    }

    /// No frame on the device (a run with no step left to train).
    pub fn none() -> Self {
        Resident {
            systems: Vec::new(),
        }
    }

    /// System `s`, if its frames are on the device.
    pub fn system(&self, s: usize) -> Option<&ResidentSystem<T, B>> {
        self.systems.get(s).and_then(Option::as_ref)
    }

    /// Per training system: whether its frames are on the device.
    pub fn held(&self) -> Vec<bool> {
        self.systems.iter().map(Option::is_some).collect()
    }
}

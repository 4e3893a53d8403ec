//! Shapes of one batch as every backend sees them.
//!
//! Centres (the atoms of all frames of the batch) are ordered by type first, so the atoms of a
//! type form one contiguous row range for the fitting nets; within a type, frame by frame. The
//! frames of a batch usually share one composition; a mixed-type system's may not
//! ([`Dims::of_frames`]), and then a type's centres per frame vary: `frame_start` says where
//! they start, on every backend (the GPU shape table carries it). Neighbour slots are ordered in
//! blocks `(ti, tj)` (centre type, neighbour section): inside a block, centre by centre, the
//! `sel[tj]` slots of that section. Every embedding net thus runs on contiguous rows.
//!
//! The neighbour sections are one per neighbour type (`nsec == ntypes`) for every descriptor
//! but DPA-1, whose list mixes all neighbour types in ONE section of nnei slots (`nsec == 1`,
//! blocks `(ti, 0)`, slots `slot(ti, c, 0, j)`; the neighbour type of each slot is a batch
//! buffer of its own, `HostBatch::nei_type`). Loops over centre types run to `ntypes`, loops
//! over neighbour sections to `nsec`.

use std::ops::Range;

use crate::model::{pair_types, DescriptorSpec};

#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub nframes: usize,
    pub natoms: usize,
    /// Centre types (the type map's length).
    pub ntypes: usize,
    /// Neighbour sections per centre: `ntypes` (one per neighbour type), or 1 for a mixed list.
    pub nsec: usize,
    /// Slots of each neighbour section, `[nsec]`.
    pub sel: Vec<usize>,
    pub nnei: usize,
    pub m1: usize,
    pub m2: usize,
    /// Centres of type t are `centre_start[t]..centre_start[t+1]`.
    pub centre_start: Vec<usize>,
    /// Slots of block (ti, tj) start at `block_start[ti * nsec + tj]`; the last entry is the total.
    pub block_start: Vec<usize>,
    /// Centres of type t in frame f are `frame_start[t * (nframes + 1) + f]` up to the next entry.
    pub frame_start: Vec<usize>,
}

impl Dims {
    /// `type_counts[t]` atoms of type t per frame (`ntypes` entries), `sel[tj]` slots in
    /// neighbour section tj (`nsec` entries: one per type, or one for a mixed list).
    pub fn new(nframes: usize, type_counts: &[usize], sel: &[usize], m1: usize, m2: usize) -> Self {
        Self::build(
            nframes,
            type_counts.len(),
            |_, t| type_counts[t],
            sel,
            m1,
            m2,
        )
    }

    /// The layout descriptor `d` asks for: its slots per section and widths
    /// ([`DescriptorSpec::slot_sel`], [`DescriptorSpec::slot_widths`]).
    pub fn of_descriptor(d: &DescriptorSpec, nframes: usize, type_counts: &[usize]) -> Self {
        let (m1, m2) = d.slot_widths();
        Self::new(nframes, type_counts, &d.slot_sel(), m1, m2)
    }

    /// [`Dims::of_descriptor`] for frames of their own compositions (a mixed-type system's).
    pub fn of_descriptor_frames(d: &DescriptorSpec, counts: &[Vec<usize>]) -> Self {
        let (m1, m2) = d.slot_widths();
        Self::of_frames(counts, &d.slot_sel(), m1, m2)
    }

    /// [`Dims::new`] for frames of their own compositions, `counts[f][t]` (a batch of a
    /// mixed-type system, or a `"mixed:N"` batch of frames of several systems). A frame of
    /// fewer atoms than the largest is padded with virtual atoms: atom slots that are no
    /// centre and no neighbour, so their force is 0 ([`Dims::natoms`] is the largest frame's).
    pub fn of_frames(counts: &[Vec<usize>], sel: &[usize], m1: usize, m2: usize) -> Self {
        let ntypes = counts.first().map_or(0, Vec::len);
        Self::build(counts.len(), ntypes, |f, t| counts[f][t], sel, m1, m2)
    }

    /// These centres with `s` slots each in their one mixed section.
    pub fn with_mixed_sel(&self, s: usize) -> Self {
        debug_assert_eq!(self.nsec, 1, "one mixed section");
        let mut block_start = vec![0];
        for t in 0..self.ntypes {
            let nc = self.centre_start[t + 1] - self.centre_start[t];
            block_start.push(block_start.last().unwrap() + nc * s);
        }
        Dims {
            sel: vec![s],
            nnei: s,
            block_start,
            ..self.clone()
        }
    }

    fn build(
        nframes: usize,
        ntypes: usize,
        count: impl Fn(usize, usize) -> usize,
        sel: &[usize],
        m1: usize,
        m2: usize,
    ) -> Self {
        let mut centre_start = vec![0];
        let mut frame_start = Vec::with_capacity(ntypes * (nframes + 1));
        for t in 0..ntypes {
            let mut at = *centre_start.last().unwrap();
            frame_start.push(at);
            for f in 0..nframes {
                at += count(f, t);
                frame_start.push(at);
            }
            centre_start.push(at);
        }
        let mut block_start = vec![0];
        for t in 0..ntypes {
            let nc = centre_start[t + 1] - centre_start[t];
            for &s in sel {
                block_start.push(block_start.last().unwrap() + nc * s);
            }
        }
        Dims {
            nframes,
            natoms: (0..nframes.max(1))
                .map(|f| (0..ntypes).map(|t| count(f, t)).sum())
                .max()
                .unwrap_or(0),
            ntypes,
            nsec: sel.len(),
            sel: sel.to_vec(),
            nnei: sel.iter().sum(),
            m1,
            m2,
            centre_start,
            block_start,
            frame_start,
        }
    }

    /// Every real atom of the batch is a centre; virtual atoms ([`Dims::of_frames`]) are not.
    pub fn ncentres(&self) -> usize {
        *self.centre_start.last().unwrap()
    }

    /// The batch's atom slots, `nframes · natoms`, virtual atoms included: the rows of forces
    /// and of every per-atom array.
    pub fn nbatch_atoms(&self) -> usize {
        self.nframes * self.natoms
    }

    pub fn nslots(&self) -> usize {
        *self.block_start.last().unwrap()
    }

    pub fn centres(&self, t: usize) -> Range<usize> {
        self.centre_start[t]..self.centre_start[t + 1]
    }

    /// Slots of (centre type ti, neighbour section tj).
    pub fn block(&self, ti: usize, tj: usize) -> Range<usize> {
        let k = ti * self.nsec + tj;
        self.block_start[k]..self.block_start[k + 1]
    }

    /// Slot of (centre c of type ti, j-th slot of section tj).
    pub fn slot(&self, ti: usize, c: usize, tj: usize, j: usize) -> usize {
        self.block(ti, tj).start + (c - self.centre_start[ti]) * self.sel[tj] + j
    }

    /// The neighbour sections, `0..nsec`.
    pub fn sections(&self) -> Range<usize> {
        0..self.nsec
    }

    /// All slots of the centres of type ti (every section), a contiguous range.
    pub fn type_slots(&self, ti: usize) -> Range<usize> {
        self.block(ti, 0).start..self.block(ti, self.nsec - 1).end
    }

    /// The slots of centre c in a batch of one neighbour section (DPA-1's mixed-type list):
    /// nnei in a row.
    pub fn mixed_slots(&self, c: usize) -> Range<usize> {
        debug_assert_eq!(self.nsec, 1, "one mixed section");
        let s = self.slot(self.centre_type(c), c, 0, 0);
        s..s + self.nnei
    }

    pub fn centre_type(&self, c: usize) -> usize {
        (0..self.ntypes)
            .find(|&t| c < self.centre_start[t + 1])
            .expect("centre in range")
    }
}

impl Dims {
    /// The centres of type t in frame f.
    pub fn frame_centres(&self, t: usize, f: usize) -> Range<usize> {
        let k = t * (self.nframes + 1) + f;
        self.frame_start[k]..self.frame_start[k + 1]
    }

    /// Frame of centre c: centres of a type are ordered frame by frame.
    pub fn centre_frame(&self, c: usize) -> usize {
        let t = self.centre_type(c);
        let starts = &self.frame_start[t * (self.nframes + 1)..(t + 1) * (self.nframes + 1)];
        // The last frame starting at or before c: frames without atoms of t start where the
        // next one does.
        starts.partition_point(|&s| s <= c) - 1
    }
}

/// se_e3's rows: one per (centre, j, k), j a slot of section ti and k one of section tj of the
/// centre, for every pair type p = (ti, tj), ti ≤ tj ([`pair_types`]). They come in blocks
/// (centre type c, pair type p), inside a block centre by centre, j-major: the rows of one
/// centre and pair type are `sel[ti]·sel[tj]` in a row. So each pair type's embedding net runs
/// on `ntypes` contiguous row ranges, as the slot nets do on the blocks of [`Dims`].
#[derive(Clone, Debug, PartialEq)]
pub struct Pairs {
    pub types: Vec<(usize, usize)>,
    /// Rows of block (c, p) start at `start[c·types.len() + p]`; the last entry is the total.
    pub start: Vec<usize>,
}

impl Pairs {
    pub fn len(&self) -> usize {
        *self.start.last().unwrap()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn block(&self, c: usize, p: usize) -> Range<usize> {
        let k = c * self.types.len() + p;
        self.start[k]..self.start[k + 1]
    }
}

impl Dims {
    /// The pair rows of this batch (se_e3).
    pub fn pairs(&self) -> Pairs {
        let types = pair_types(self.nsec);
        let mut start = vec![0];
        for c in 0..self.ntypes {
            let nc = self.centres(c).len();
            for &(ti, tj) in &types {
                start.push(start.last().unwrap() + nc * self.sel[ti] * self.sel[tj]);
            }
        }
        Pairs { types, start }
    }

    /// se_e3's weight of pair type (ti, tj): DeePMD-kit's mean over `sel[ti]·sel[tj]` pairs.
    pub fn pair_weight(&self, (ti, tj): (usize, usize)) -> f64 {
        1.0 / (self.sel[ti] * self.sel[tj]) as f64
    }
}

//! The memory layouts the two GPU backends share with their kernels, defined once: the batch
//! shape table and the ops' parameter structs. The CUDA and WGSL declarations of them are
//! generated from these definitions and put before every kernel source (see
//! `cuda::kernels::KernelFile::source` and `wgpu::shaders::source`), so a kernel cannot read a
//! layout other than the one the host writes.
//!
//! Every field is 4 bytes. A `u32` field is a count or an index below 2^31 ([`count`] checks
//! it): WGSL reads it as `u32`, CUDA as `int`, the types the kernels do their index arithmetic in.

use std::ops::Range;

use super::{AttnOpts, Dims};
use crate::model::{Activation, Layer, Skip, TebdLayout};

/// A scalar type a GPU struct field may have, with its names in the two kernel languages.
pub trait GpuScalar {
    const WGSL: &'static str;
    const CUDA: &'static str;
}

impl GpuScalar for u32 {
    const WGSL: &'static str = "u32";
    const CUDA: &'static str = "int";
}

/// One field of a [`GpuStruct`].
#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    pub wgsl: &'static str,
    pub cuda: &'static str,
    /// Byte offset in the Rust struct.
    pub offset: usize,
}

/// The layout of a `#[repr(C)]` struct that kernels read.
#[derive(Debug)]
pub struct Layout {
    pub name: &'static str,
    pub size: usize,
    pub fields: &'static [Field],
}

/// A `#[repr(C)]` struct the host writes and kernels read, declared by `gpu_struct!`.
pub trait GpuStruct: bytemuck::Pod {
    const LAYOUT: Layout;
}

/// Declares a `#[repr(C)]`, `Pod` struct of 4-byte scalars with its [`GpuStruct::LAYOUT`]. Its
/// size is whole 16-byte rows, as a WGSL uniform block's must be.
macro_rules! gpu_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
        }

        const _: () = assert!(size_of::<$name>() % 16 == 0, "pad to whole 16-byte rows");

        impl GpuStruct for $name {
            const LAYOUT: Layout = Layout {
                name: stringify!($name),
                size: size_of::<$name>(),
                fields: &[$(Field {
                    name: stringify!($f),
                    wgsl: <$t as GpuScalar>::WGSL,
                    cuda: <$t as GpuScalar>::CUDA,
                    offset: std::mem::offset_of!($name, $f),
                },)*],
            };
        }
    };
}

/// `x` as a field value: below 2^31, so that CUDA's `int` reads it unchanged.
pub fn count(x: usize) -> u32 {
    i32::try_from(x).expect("batch dimension above 2^31") as u32
}

gpu_struct! {
    /// The head of the shape table ([`shape_table`]): the counts, then where each of its
    /// sections (`sections`) starts in the table. A kernel finds a section through the head,
    /// so section lengths (`nsec` sels, `ntypes·nsec + 1` block starts) need no formula of
    /// their own in the kernel languages.
    pub struct DimsHeader {
        pub ntypes: u32,
        /// Neighbour sections per centre: `ntypes`, or 1 for DPA-1's mixed-type list.
        pub nsec: u32,
        pub nnei: u32,
        pub m1: u32,
        pub m2: u32,
        pub nframes: u32,
        pub natoms: u32,
        pub ncentres: u32,
        pub nslots: u32,
        pub sel_at: u32,
        pub centre_start_at: u32,
        pub block_start_at: u32,
        pub frame_start_at: u32,
        pub _pad0: u32,
        pub _pad1: u32,
        pub _pad2: u32,
    }
}

/// The sections of the shape table after its head, in table order, each named as the head
/// field `<name>_at` that says where it starts: `sel` [nsec], `centre_start` [ntypes + 1],
/// `block_start` [ntypes·nsec + 1], `frame_start` [ntypes·(nframes + 1)] (where each frame's
/// centres of a type start, so frames of a batch may differ in composition).
fn sections(d: &Dims) -> [(&'static str, &[usize]); 4] {
    [
        ("sel", &d.sel),
        ("centre_start", &d.centre_start),
        ("block_start", &d.block_start),
        ("frame_start", &d.frame_start),
    ]
}

/// The batch layout ([`Dims`]) as one table of 4-byte integers, the one way both GPU backends
/// pass it to their kernels: a [`DimsHeader`], then the `sections`. Kernels
/// walk neighbour sections up to `nsec`, so one table serves one section per type and DPA-1's
/// one mixed section alike.
pub fn shape_table(d: &Dims) -> Vec<u32> {
    let mut at = [0; 4];
    let mut next = size_of::<DimsHeader>() / 4;
    for (a, (_, s)) in at.iter_mut().zip(sections(d)) {
        *a = count(next);
        next += s.len();
    }
    let head = DimsHeader {
        ntypes: count(d.ntypes),
        nsec: count(d.nsec),
        nnei: count(d.nnei),
        m1: count(d.m1),
        m2: count(d.m2),
        nframes: count(d.nframes),
        natoms: count(d.natoms),
        ncentres: count(d.ncentres()),
        nslots: count(d.nslots()),
        sel_at: at[0],
        centre_start_at: at[1],
        block_start_at: at[2],
        frame_start_at: at[3],
        ..Default::default()
    };
    let mut t = bytemuck::cast_slice::<DimsHeader, u32>(&[head]).to_vec();
    for (_, s) in sections(d) {
        t.extend(s.iter().map(|&v| count(v)));
    }
    t
}

/// Rows per partial sum of b̄ and īdt (and W̄ on wgpu) in the dense dual backward: the
/// partials are then added in chunk order, so the sums' order depends on the shapes alone.
pub const DENSE_CHUNK: usize = 256;

/// Slots per shared-memory tile of the CUDA contraction kernels (kernels/contract.cu): the
/// block stages a tile's G, G', R̂ and Ṙ with coalesced loads, then sums through it in slot
/// order. 16 keeps contract_tangent's float64 shared memory under 48 KiB at M1 = 100.
pub const CONTRACT_TILE: usize = 16;

/// Warps per block of the CUDA kernel force_centres (kernels/scatter.cu), one per centre.
pub const FORCE_WARPS: usize = 4;

/// Entries per partial sum of the CUDA sums of squares (the loss's, a warp's, and the gradient
/// norm's, a thread's): the partials are then added in order by one thread, `sum_parts`, so
/// the sums' order depends on the lengths alone.
pub const LOSS_CHUNK: usize = 256;

gpu_struct! {
    /// The scalars of every dense-layer kernel: one layer on a row range.
    pub struct DenseParams {
        /// The rows: the first, and how many.
        pub row0: u32,
        pub nrows: u32,
        pub nin: u32,
        pub nout: u32,
        /// φ: 0 linear, 1 tanh, 2 silu, 3 silut.
        pub act: u32,
        /// The skip connection: 0 none, 1 identity (nout == nin), 2 doubled (nout == 2 nin).
        pub skip: u32,
        /// 1 when the layer has a timestep (idt).
        pub has_idt: u32,
        /// 1 when the dual backward scales ẋ per row (embedding nets).
        pub has_scale: u32,
        /// Offsets of W, b and idt in the parameter vector, for the WGSL kernels (CUDA's get
        /// pointers).
        pub w: u32,
        pub b: u32,
        pub idt: u32,
        /// Rows per partial sum ([`DENSE_CHUNK`]), and the number of chunks of the rows.
        pub chunk: u32,
        pub nchunks: u32,
        /// silut's threshold c as three f32 (bits) that sum to it exactly in f64 (`f32_parts`):
        /// the kernels make silu(c) and silu'(c) from it, as DeePMD-kit does from c.
        pub silut_c0: u32,
        pub silut_c1: u32,
        pub silut_c2: u32,
    }
}

/// φ as the dense kernels read it: 0 linear, 1 tanh, 2 silu, 3 silut.
fn act_code(a: Activation) -> u32 {
    match a {
        Activation::Linear => 0,
        Activation::Tanh => 1,
        Activation::Silu => 2,
        Activation::Silut(_) => 3,
    }
}

/// x as a + b + c, three f32 whose f64 sum is x (24 + 24 + 24 bits cover f64's 53), as bits.
fn f32_parts(x: f64) -> [u32; 3] {
    let a = x as f32;
    let r = x - f64::from(a);
    let b = r as f32;
    let c = (r - f64::from(b)) as f32;
    [a.to_bits(), b.to_bits(), c.to_bits()]
}

/// A skip connection as the kernels read it: 0 none, 1 identity, 2 doubled.
fn skip_code(skip: Skip) -> u32 {
    match skip {
        Skip::None => 0,
        Skip::Identity => 1,
        Skip::Double => 2,
    }
}

impl DenseParams {
    /// Layer `l` on `rows`; `scale`: whether ẋ is scaled per row.
    pub fn new(l: &Layer, rows: &Range<usize>, scale: bool) -> Self {
        let mut p = DenseParams {
            row0: count(rows.start),
            nrows: count(rows.len()),
            nin: count(l.nin),
            nout: count(l.nout),
            act: act_code(l.act),
            skip: skip_code(l.skip),
            has_idt: l.idt.is_some().into(),
            has_scale: scale.into(),
            w: count(l.w),
            b: count(l.b),
            idt: count(l.idt.unwrap_or(0)),
            chunk: count(DENSE_CHUNK),
            nchunks: count(rows.len().div_ceil(DENSE_CHUNK)),
            ..Default::default()
        };
        if let Activation::Silut(c) = l.act {
            [p.silut_c0, p.silut_c1, p.silut_c2] = f32_parts(c);
        }
        p
    }
}

gpu_struct! {
    /// The scalars of the WGSL descriptor kernels, se_e2_a's contraction and se_e2_r's radial
    /// sum (CUDA's read the shape table alone).
    pub struct ContractParams {
        pub ncentres: u32,
        pub m1: u32,
        pub m2: u32,
        pub nnei: u32,
        /// Per-slot kernels, launched per (ti, tj) block: the block's first slot, its slot
        /// count, `sel[tj]` and first centre.
        pub slot0: u32,
        pub nslots: u32,
        pub sel: u32,
        pub centre0: u32,
        /// d_outer: 0 for D = A A<ᵀ, 1 for Ḋ = Ȧ A<ᵀ + A Ȧ<ᵀ.
        pub mode: u32,
        pub _pad0: u32,
        pub _pad1: u32,
        pub _pad2: u32,
    }
}

impl ContractParams {
    pub fn new(d: &Dims, mode: u32) -> Self {
        ContractParams {
            ncentres: count(d.ncentres()),
            m1: count(d.m1),
            m2: count(d.m2),
            nnei: count(d.nnei),
            mode,
            ..Default::default()
        }
    }

    /// For a per-slot kernel on block `slots` of neighbour sel `sel`, whose first centre is `c0`.
    pub fn block(self, slots: &Range<usize>, sel: usize, c0: usize) -> Self {
        ContractParams {
            slot0: count(slots.start),
            nslots: count(slots.len()),
            sel: count(sel),
            centre0: count(c0),
            ..self
        }
    }
}

gpu_struct! {
    /// The scalars of se_e3's angle kernels, on both backends. Per-centre kernels read the
    /// counts; the others are launched once per block, of pair rows ([`Dims::pairs`]) or of
    /// slots, so that a row or slot finds its centre and pair by division alone.
    pub struct AngleParams {
        pub ncentres: u32,
        pub m1: u32,
        /// Pair rows per centre, `Σ_p sel[ti]·sel[tj]`: block (tc, p) starts at
        /// `centre_start[tc]·pair_rows` + (centres of tc)·(rows per centre of the pairs before p).
        pub pair_rows: u32,
        /// The block's centre type, first centre, first row (pair row or slot) and row count.
        pub tc: u32,
        pub centre0: u32,
        pub row0: u32,
        pub nrows: u32,
        /// A pair block's pair type p = (ti, tj); a slot block's neighbour type is ti.
        pub pair: u32,
        pub ti: u32,
        pub tj: u32,
        pub _pad0: u32,
        pub _pad1: u32,
    }
}

impl AngleParams {
    /// For the per-centre kernels.
    pub fn new(d: &Dims) -> Self {
        let pairs = d.pairs();
        AngleParams {
            ncentres: count(d.ncentres()),
            m1: count(d.m1),
            pair_rows: count(
                pairs
                    .types
                    .iter()
                    .map(|&(ti, tj)| d.sel[ti] * d.sel[tj])
                    .sum(),
            ),
            ..Default::default()
        }
    }

    /// One per non-empty block (centre type, pair type) of pair rows.
    pub fn pair_blocks(d: &Dims) -> Vec<Self> {
        let (u, pairs) = (Self::new(d), d.pairs());
        let mut out = Vec::new();
        for tc in 0..d.ntypes {
            for (p, &(ti, tj)) in pairs.types.iter().enumerate() {
                let rows = pairs.block(tc, p);
                if !rows.is_empty() {
                    out.push(AngleParams {
                        pair: count(p),
                        ti: count(ti),
                        tj: count(tj),
                        ..u.block(tc, d.centre_start[tc], &rows)
                    });
                }
            }
        }
        out
    }

    /// One per non-empty block (centre type, neighbour type) of slots.
    pub fn slot_blocks(d: &Dims) -> Vec<Self> {
        let u = Self::new(d);
        let mut out = Vec::new();
        for tc in 0..d.ntypes {
            for t in d.sections() {
                let slots = d.block(tc, t);
                if !slots.is_empty() {
                    out.push(AngleParams {
                        ti: count(t),
                        ..u.block(tc, d.centre_start[tc], &slots)
                    });
                }
            }
        }
        out
    }

    fn block(self, tc: usize, c0: usize, rows: &Range<usize>) -> Self {
        AngleParams {
            tc: count(tc),
            centre0: count(c0),
            row0: count(rows.start),
            nrows: count(rows.len()),
            ..self
        }
    }
}

gpu_struct! {
    /// The scalars of the energy, force and virial kernels: the WGSL kernels read the counts
    /// (CUDA's read the shape table), CUDA's force_centres the owned-slot lists' length.
    pub struct ScatterParams {
        pub ncentres: u32,
        pub nframes: u32,
        pub natoms: u32,
        /// Atoms with a list of the slots they own (max(owner) + 1): force_centres looks up
        /// only these.
        pub n_owned: u32,
        pub _pad0: u32,
        pub _pad1: u32,
        pub _pad2: u32,
        pub _pad3: u32,
    }
}

impl ScatterParams {
    pub fn new(d: &Dims) -> Self {
        ScatterParams {
            ncentres: count(d.ncentres()),
            nframes: count(d.nframes),
            natoms: count(d.natoms),
            ..Default::default()
        }
    }
}

gpu_struct! {
    /// The scalars of the kernels over the n entries of one vector, the same for all of them:
    /// fill, Adam, and the gradient clip (its norm and scaling). `tail_from`, `fit_from`: where
    /// Adam's tail and its fitting part begin ([`crate::backend::AdamTail`]; 0 for the other
    /// kernels, which do not read them).
    pub struct VectorParams {
        pub n: u32,
        pub tail_from: u32,
        pub fit_from: u32,
        pub _pad2: u32,
    }
}

impl VectorParams {
    pub fn new(n: usize) -> Self {
        VectorParams {
            n: count(n),
            ..Default::default()
        }
    }
}

gpu_struct! {
    /// The scalars of CUDA's sum_parts, which adds the partials of a chunked sum of squares
    /// ([`LOSS_CHUNK`]) in order.
    pub struct SumParams {
        pub nparts: u32,
        /// 1 when the total's square root is wanted (the gradient norm).
        pub root: u32,
        pub _pad0: u32,
        pub _pad1: u32,
    }
}

impl SumParams {
    pub fn new(nparts: usize, root: bool) -> Self {
        SumParams {
            nparts: count(nparts),
            root: root.into(),
            ..Default::default()
        }
    }
}

/// Rows per partial sum of DPA-1's sums over rows (T̄ in tebd_rows_backward, τ̄ in
/// strip_dual), at the least: the partials are then added in chunk order, so that the sums'
/// order depends on the shapes alone.
const ATTN_CHUNK: usize = 256;

/// The partial values one of those sums keeps, at most (give or take a chunk's): with many
/// types (τ̄ has ntypes²·M1 entries) the chunks grow instead of the scratch.
const ATTN_PARTIALS: usize = 1 << 22;

/// (rows per chunk, chunks) for `entries` sums over `rows` rows.
fn attn_chunks(rows: usize, entries: usize) -> (u32, u32) {
    let chunk = ATTN_CHUNK.max((rows * entries).div_ceil(ATTN_PARTIALS));
    (count(chunk), count(rows.div_ceil(chunk)))
}

gpu_struct! {
    /// The scalars of DPA-1's kernels (attn_switch, tebd_rows, tebd_rows_backward,
    /// strip_forward, strip_dual), on both backends. attn_switch is launched once per centre
    /// type over its slots, the type-embedding kernels once per type list, whose values start
    /// at column `col` of each row.
    pub struct AttnParams {
        /// The rows (slots, or rows of the type lists): the first, and how many.
        pub row0: u32,
        pub nrows: u32,
        /// attn_switch's centre type: the row of dstd.
        pub ti: u32,
        pub ntypes: u32,
        /// Values per row of a table: the type embedding's dim, or M1 (strip).
        pub width: u32,
        /// The type embedding T = skip(e_t) + W (+ b): its skip (0 none, 1 identity, 2
        /// doubled), the offsets of W and b in the parameter vector, whether there is a b.
        pub skip: u32,
        pub w: u32,
        pub b: u32,
        pub has_b: u32,
        /// The row stride of the type-embedding values, the launch's first column.
        pub stride: u32,
        pub col: u32,
        /// strip: the rows of the type net's table τ (ntypes, or ntypes² at t_i·ntypes + t_j),
        /// whether a slot's is t_j alone (type_one_side), whether c = σ (smooth; else 1).
        /// (`smooth` is a reserved word in WGSL.)
        pub table_rows: u32,
        pub one_side: u32,
        pub c_is_sw: u32,
        /// The sums over rows (T̄, τ̄): rows per partial sum (see `attn_chunks`), chunks per
        /// launch, the launch's first partial (a type list's come after the lists before it),
        /// and the partials of all launches.
        pub chunk: u32,
        pub nchunks: u32,
        pub part0: u32,
        pub nparts: u32,
        pub _pad0: u32,
        pub _pad1: u32,
    }
}

impl AttnParams {
    /// attn_switch on the slots of centre type `ti`.
    pub fn switch(slots: &Range<usize>, ti: usize) -> Self {
        AttnParams {
            row0: count(slots.start),
            nrows: count(slots.len()),
            ti: count(ti),
            ..Default::default()
        }
    }

    /// The type-embedding kernels on `nlists` type lists of `nrows` rows each, the values of
    /// the first at column `col` of rows of `stride`.
    pub fn tebd(t: &TebdLayout, nlists: usize, nrows: usize, stride: usize, col: usize) -> Self {
        let (chunk, nchunks) = attn_chunks(nrows, t.ntypes * t.dim);
        AttnParams {
            nrows: count(nrows),
            ntypes: count(t.ntypes),
            width: count(t.dim),
            skip: skip_code(t.skip),
            w: count(t.w),
            b: count(t.b.unwrap_or(0)),
            has_b: t.b.is_some().into(),
            stride: count(stride),
            col: count(col),
            chunk,
            nchunks,
            nparts: nchunks * count(nlists),
            ..Default::default()
        }
    }

    /// For type list `k` of [`AttnParams::tebd`]: its values follow those of the lists before.
    pub fn list(self, k: usize) -> Self {
        AttnParams {
            col: self.col + count(k) * self.width,
            part0: count(k) * self.nchunks,
            ..self
        }
    }

    /// The strip kernels on `nslots` slots.
    pub fn strip(nslots: usize, m1: usize, ntypes: usize, one_side: bool, smooth: bool) -> Self {
        let rows = if one_side { ntypes } else { ntypes * ntypes };
        let (chunk, nchunks) = attn_chunks(nslots, rows * m1);
        AttnParams {
            nrows: count(nslots),
            ntypes: count(ntypes),
            width: count(m1),
            table_rows: count(rows),
            one_side: one_side.into(),
            c_is_sw: smooth.into(),
            chunk,
            nchunks,
            nparts: nchunks,
            ..Default::default()
        }
    }
}

gpu_struct! {
    /// The scalars of DPA-1's attention block (shaders/attn_block.wgsl), one launch per run of
    /// centres: the shape, the options, and where each of a centre's arrays starts in its
    /// stretch of the scratch (in numbers: one real, or two for a dual).
    pub struct AttnBlockParams {
        /// The launch's first centre and how many.
        pub centre0: u32,
        pub ncentres: u32,
        pub nnei: u32,
        pub m1: u32,
        pub m2: u32,
        pub h: u32,
        pub nlayers: u32,
        /// The row stride of D.
        pub stride: u32,
        /// Numbers per slot in a centre's slot table: G⁰ `[M1]`, R̂ `[4]`, σ, a neighbour's 1.
        pub slot_w: u32,
        /// Numbers of scratch per centre, and of parameters per layer.
        pub per_centre: u32,
        pub layer_len: u32,
        /// (`smooth` is a reserved word in WGSL.)
        pub use_norm: u32,
        pub is_smooth: u32,
        pub use_dotr: u32,
        pub o_rdir: u32,
        pub o_dotr: u32,
        pub o_g: u32,
        pub o_qkv: u32,
        pub o_nrm: u32,
        pub o_logit: u32,
        pub o_p: u32,
        pub o_w: u32,
        pub o_o: u32,
        pub o_z: u32,
        pub o_xhat: u32,
        pub o_sinv: u32,
        pub o_a: u32,
        pub o_desc: u32,
        /// The backward's arrays: D̄, Ā, and per slot Ḡ, R̄, r̂̄, σ̄, Ō, [q̄ k̄ v̄]; n × n Ā_att
        /// (then L̄), C̄ and Ē; the centre's parameter gradient, packed as the parameters
        /// (kept by the dual reverse alone: `want_grad`).
        pub o_dbar: u32,
        pub o_abar: u32,
        pub o_gbar: u32,
        pub o_rbar: u32,
        pub o_rdbar: u32,
        pub o_swbar: u32,
        pub o_obar: u32,
        pub o_qkvbar: u32,
        pub o_nn: u32,
        pub o_cbar: u32,
        pub o_ebar: u32,
        pub o_grad: u32,
        /// The centre's slot table (see attn_block_load) and what the backward gives back per
        /// slot (Ḡ, R̄, σ̄).
        pub o_slots: u32,
        pub o_adj: u32,
        pub want_grad: u32,
        /// The parameters of all layers.
        pub plen: u32,
        /// A tensor fitting's Ā `[4][M1]` (as the dual reverse's ε part), which the backward
        /// adds to the contraction's; read where `with_abar`.
        pub o_abar_in: u32,
        pub with_abar: u32,
        pub _pad0: u32,
        pub _pad1: u32,
    }
}

impl AttnBlockParams {
    /// The block of `o` with `nlayers` layers on slots of `nnei` per centre, D's rows `stride`
    /// apart, keeping each centre's parameter gradient with `grad` (the dual reverse), and with
    /// `abar` as well a tensor fitting's Ā for it to add; [`AttnBlockParams::launch`] sets the
    /// centres.
    pub fn new(
        o: &AttnOpts,
        nlayers: usize,
        nnei: usize,
        stride: usize,
        grad: bool,
        abar: bool,
    ) -> Self {
        let abar = grad && abar;
        let (m, h, l) = (o.m1, o.h, nlayers);
        let mut at = 0;
        let mut next = |len: usize| {
            let start = at;
            at += len;
            count(start)
        };
        let mut p = AttnBlockParams {
            nnei: count(nnei),
            m1: count(m),
            m2: count(o.m2),
            h: count(h),
            nlayers: count(l),
            stride: count(stride),
            slot_w: count(m + 6),
            layer_len: count(o.layer_len()),
            use_norm: o.normalize.into(),
            is_smooth: o.smooth.into(),
            use_dotr: o.dotr.into(),
            o_rdir: next(3 * nnei),
            o_dotr: next(if o.dotr { nnei * nnei } else { 0 }),
            o_g: next((l + 1) * nnei * m),
            o_qkv: next(l * nnei * 3 * h),
            o_nrm: next(l * nnei * 3),
            o_logit: next(l * nnei * nnei),
            o_p: next(l * nnei * nnei),
            o_w: next(l * nnei * nnei),
            o_o: next(l * nnei * h),
            o_z: next(nnei * m),
            o_xhat: next(l * nnei * m),
            o_sinv: next(l * nnei),
            o_a: next(4 * m),
            o_desc: next(m * o.m2),
            o_dbar: next(m * o.m2),
            o_abar: next(4 * m),
            o_gbar: next(nnei * m),
            o_rbar: next(nnei * 4),
            o_rdbar: next(nnei * 3),
            o_swbar: next(nnei),
            o_obar: next(nnei * h),
            o_qkvbar: next(nnei * 3 * h),
            o_nn: next(nnei * nnei),
            o_cbar: next(if o.dotr { nnei * nnei } else { 0 }),
            o_ebar: next(if o.smooth { nnei * nnei } else { 0 }),
            o_grad: next(if grad { l * o.layer_len() } else { 0 }),
            o_slots: next(nnei * (m + 6)),
            o_adj: next(nnei * (m + 5)),
            o_abar_in: next(if abar { 4 * m } else { 0 }),
            want_grad: grad.into(),
            with_abar: abar.into(),
            plen: count(l * o.layer_len()),
            ..Default::default()
        };
        p.per_centre = count(at);
        p
    }

    /// The launch on centres `first..first + n`.
    pub fn launch(self, first: usize, n: usize) -> Self {
        AttnBlockParams {
            centre0: count(first),
            ncentres: count(n),
            ..self
        }
    }
}

gpu_struct! {
    /// The scalars of the WGSL environment-matrix kernel, launched once per centre type over
    /// that type's slots (CUDA's reads the type of each slot from the shape table).
    pub struct EnvMatParams {
        pub slot0: u32,
        pub nslots: u32,
        /// The centre type: the row of davg and dstd.
        pub ti: u32,
        pub _pad0: u32,
    }
}

gpu_struct! {
    /// The scalars of the loss kernels: the residuals and their sums of squares, ∂L/∂E per
    /// centre (energy_bar) and the virtual displacement (virtual_tangent). CUDA's read n alone
    /// (the rest from the shape table).
    pub struct LossParams {
        /// Entries (residual, sumsq), centres (energy_bar) or the block's slots
        /// (virtual_tangent).
        pub n: u32,
        /// Which label, 0 energy, 1 force, 2 virial: the residual's coefficient, the sum's
        /// output.
        pub which: u32,
        pub natoms: u32,
        /// virtual_tangent, launched per (ti, tj) block: the block's first slot, `sel[tj]` and
        /// first centre.
        pub slot0: u32,
        pub sel: u32,
        pub centre0: u32,
        pub _pad0: u32,
        pub _pad1: u32,
    }
}

impl LossParams {
    /// For the batch `d`, over n entries of label `which`.
    pub fn new(d: &Dims, n: usize, which: usize) -> Self {
        LossParams {
            n: count(n),
            which: count(which),
            natoms: count(d.natoms),
            ..Default::default()
        }
    }

    /// For virtual_tangent on block `slots` of neighbour sel `sel`, whose first centre is `c0`.
    pub fn block(d: &Dims, slots: &Range<usize>, sel: usize, c0: usize) -> Self {
        LossParams {
            slot0: count(slots.start),
            sel: count(sel),
            centre0: count(c0),
            ..Self::new(d, slots.len(), 0)
        }
    }
}

gpu_struct! {
    /// The scalars of one tape kernel (shaders/tape.wgsl, which says what each reads): a
    /// tensor's `[rows][cols]`, a broadcast operand's `[br][bc]`, a product's m, k and n
    /// (`nn`) and transposes, parameter offsets `w` and `b`, where the op's constants (`ci`)
    /// and indices (`ix`) start, the kind of op (`op`), whether it adds to its output, and a
    /// long sum's split: `nparts` parts of up to `chunk` terms for each of its `nout` entries.
    pub struct TapeParams {
        pub rows: u32,
        pub cols: u32,
        pub br: u32,
        pub bc: u32,
        pub m: u32,
        pub k: u32,
        pub nn: u32,
        pub ta: u32,
        pub tb: u32,
        pub acc: u32,
        pub op: u32,
        pub has_b: u32,
        pub w: u32,
        pub b: u32,
        pub ci: u32,
        pub ix: u32,
        pub nout: u32,
        pub nparts: u32,
        pub chunk: u32,
        pub _pad: u32,
    }
}

/// The ops' parameter structs: WGSL uniform blocks, and by-value CUDA kernel arguments.
pub const PARAMS: &[Layout] = &[
    DenseParams::LAYOUT,
    ContractParams::LAYOUT,
    AngleParams::LAYOUT,
    ScatterParams::LAYOUT,
    VectorParams::LAYOUT,
    SumParams::LAYOUT,
    EnvMatParams::LAYOUT,
    LossParams::LAYOUT,
    AttnParams::LAYOUT,
    AttnBlockParams::LAYOUT,
    TapeParams::LAYOUT,
];

/// The declarations put before every CUDA kernel file: the kernels' fixed sizes
/// ([`CONTRACT_TILE`], [`FORCE_WARPS`], [`LOSS_CHUNK`]), the offsets of the shape table's head
/// fields (`DIMS_NTYPES`, ..., `DIMS_SEL_AT`, ...) and the parameter structs. The members are
/// those of the Rust struct in its order, all 4 bytes, so C lays them out at the same offsets;
/// a static_assert of the size checks that NVRTC agrees (it has no offsetof).
pub fn cuda_declarations() -> String {
    let mut s = String::from("// Generated from src/backend/gpu_layout.rs.\n");
    s += &format!("#define CONTRACT_TILE {CONTRACT_TILE}\n#define FORCE_WARPS {FORCE_WARPS}\n");
    s += &format!("#define LOSS_CHUNK {LOSS_CHUNK}\n");
    for f in DimsHeader::LAYOUT.fields {
        s += &format!("#define DIMS_{} {}\n", f.name.to_uppercase(), f.offset / 4);
    }
    for l in PARAMS {
        s += &format!("struct {} {{\n", l.name);
        for f in l.fields {
            s += &format!("  {} {};\n", f.cuda, f.name);
        }
        s += "};\n";
        s += &format!(
            "static_assert(sizeof({0}) == {1}, \"{0}: size\");\n",
            l.name, l.size
        );
    }
    s
}

/// The declarations put before every WGSL shader: the offsets of the shape table's head fields
/// (`DIMS_NTYPES`, ..., `DIMS_SEL_AT`, ...) and the parameter structs (checked against the Rust structs by
/// tests/shaders_naga.rs).
pub fn wgsl_declarations() -> String {
    let mut s = String::from("// Generated from src/backend/gpu_layout.rs.\n");
    for f in DimsHeader::LAYOUT.fields {
        s += &format!(
            "const DIMS_{}: u32 = {}u;\n",
            f.name.to_uppercase(),
            f.offset / 4
        );
    }
    for l in PARAMS {
        s += &format!("struct {} {{\n", l.name);
        for f in l.fields {
            s += &format!("    {}: {},\n", f.name, f.wgsl);
        }
        s += "}\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each section stands where its head field says, one after the other to the table's end,
    /// with one neighbour section per type and with one mixed section (DPA-1), and for a batch
    /// of frames of several compositions.
    #[test]
    fn shape_table_layout() {
        let mut batches = Vec::new();
        for counts in [&[3usize][..], &[2, 0, 5], &[1, 4]] {
            let per_type: Vec<usize> = (0..counts.len()).map(|t| 3 + t).collect();
            let mixed = [per_type.iter().sum()];
            for sel in [&per_type[..], &mixed] {
                batches.push(Dims::new(2, counts, sel, 8, 4));
            }
        }
        batches.push(Dims::of_frames(
            &[vec![2, 0, 1], vec![1, 2, 0], vec![0, 1, 2]],
            &[9],
            8,
            4,
        ));
        for d in batches {
            let t = shape_table(&d);
            let head = DimsHeader::LAYOUT.fields;
            let field = |n: &str| t[head.iter().find(|f| f.name == n).unwrap().offset / 4] as usize;
            let mut next = size_of::<DimsHeader>() / 4;
            for (name, data) in sections(&d) {
                let at = field(&format!("{name}_at"));
                assert_eq!(at, next, "{name}: where it starts");
                let want: Vec<u32> = data.iter().map(|&v| v as u32).collect();
                assert_eq!(&t[at..at + data.len()], &want[..], "{name}");
                next = at + data.len();
            }
            assert_eq!(t.len(), next);
            assert_eq!(field("ntypes"), d.ntypes);
            assert_eq!(field("nsec"), d.nsec);
            assert_eq!(field("nframes"), d.nframes);
            assert_eq!(field("ncentres"), d.ncentres());
            assert_eq!(field("nslots"), d.nslots());
        }
    }
}

//! What the descriptors written once as a forward on the tape (tape.rs) share: DPA-2
//! (repformer.rs, docs/deepmd-spec.md §20) and se_e3_tebd (three_body.rs, §20.4). The batch's
//! centres, a block's list and environment rows cut from the model's list, the type embedding,
//! DeePMD-kit's embedding nets, and the four passes: the tape gives the backward; the tangent
//! is the forward on duals, the dual reverse the tape's backward on duals.
//!
//! Every block reads its list from the model's: the first `s` slots of a centre, those beyond
//! the block's cut-off made padding (spec §20.2).

use std::sync::Arc;

use super::act::cst;
use super::block_in::BlockIn;
use super::dual::{Dual, Num};
use super::tape::{Elem, Tape, NONE, V};
use crate::backend::keep::Keep;
use crate::backend::{Dims, Real};
use crate::model::dpa3::UpdateStyle;
use crate::model::{Activation, Layer, Net, Skip, TebdLayout};

/// A descriptor built on the tape: its constants (`Self`, one per model) say how its blocks'
/// lists are cut from the model's and how D is built.
pub(crate) trait TapeBlock: Clone + PartialEq + Send + 'static {
    /// Its tensors.
    type Layout;
    /// The number of types.
    fn nt(&self) -> usize;
    /// The model's list: nsel slots per centre.
    fn nsel(&self) -> usize;
    /// p of the environment matrix (spec §3), every block's.
    fn protection(&self) -> f64;
    /// Whether a pair of types is excluded.
    fn excludes(&self, ti: usize, tj: usize) -> bool;
    /// M, the rotation matrix's width, where the model's fitting reads it (a dipole or polar
    /// fitting): the block then gives A after D ([`output`]).
    fn rot_width(&self) -> Option<usize>;
    /// D `[nc][width]` from the slots' r_ij `[nslots][3]`, and where [`TapeBlock::rot_width`]
    /// asks for it, hg `[nc·3][M]`: per centre Σ_j h_ij ⊗ w_ij g_ij on the last layer's pair
    /// features g (DeePMD-kit's `_cal_hg`, whose transpose is the `rot_mat` it returns).
    fn build<T: Real, N: Num<T>>(
        ctx: &Ctx<'_, Self, T>,
        t: &mut Tape<'_, T, N>,
        rij: V,
    ) -> (V, Option<V>);
}

/// Values per centre of a block's output: D's width, then A's `4·M` where it gives the
/// rotation matrix.
pub(crate) fn out_width(width: usize, rot_width: Option<usize>) -> usize {
    width + rot_width.map_or(0, |m| 4 * m)
}

/// The block's one output node: D's `nc·width` values, then where it gives one A `[nc][4][M]`
/// (row 0 zero, rows 1..3 hg: se_e2_a's A's layout, which a tensor fitting's head reads), so
/// that every pass on every backend (the tape's backward, the forward on duals, a device's
/// walk) carries A as it carries D.
fn output<T: Real, N: Num<T>>(t: &mut Tape<'_, T, N>, (desc, hg): (V, Option<V>)) -> V {
    let Some(hg) = hg else {
        return desc;
    };
    let ((rows, m), (nc, w)) = (t.shape(hg), t.shape(desc));
    assert_eq!(rows, 3 * nc, "hg has three rows per centre");
    let hg = t.reshape(hg, nc, 3 * m);
    let zero = t.consts(&vec![T::zero(); nc * m], nc, m);
    let a = t.concat(&[zero, hg]);
    let a = t.reshape(a, 1, nc * 4 * m);
    let desc = t.reshape(desc, 1, nc * w);
    t.concat(&[desc, a])
}

/// What every pass reads: the model and the batch (davg, dstd: `[nt][4]` of each block's
/// statistics in turn).
pub(crate) type TapeIn<'a, O, T> = BlockIn<'a, O, <O as TapeBlock>::Layout, T>;

/// A block's list: the first `s` slots of the model's, those at r > rcut padding, with the
/// davg/dstd rows of statistics block `stats`.
pub(crate) struct List {
    pub s: usize,
    pub rcut: f64,
    pub rcut_smth: f64,
    pub stats: usize,
    /// An excluded pair's slot is padding (DPA-2's repformer, DPA-3) rather than a zero row
    /// (the repinit and the three-body block; spec §20.2).
    pub excluded_is_padding: bool,
    /// DPA-3's exponential switch (use_exp_switch) in place of the quintic one.
    pub exp_switch: bool,
}

/// A block's list and environment rows (spec §20.2-20.3), `m = nc·S` rows.
pub(crate) struct BlockEnv {
    pub s: usize,
    /// R̂ `[m][4]`, the switch `[m][1]` (0 where not real), r and r_ij `[m][1]`, `[m][3]`
    /// (1 and (1, 0, 0) where not real, so that no derivative divides by 0).
    pub rhat: V,
    pub sw: V,
    pub r: V,
    pub rv: V,
    pub real: Vec<bool>,
    /// The neighbour's type (local atom 0's where not real), its owner's centre ([`NONE`]).
    pub ntype: Vec<u32>,
    pub owner: Vec<u32>,
}

/// The batch's centres, for every block of one pass.
pub(crate) struct Ctx<'a, O: TapeBlock, T> {
    pub(crate) x: &'a TapeIn<'a, O, T>,
    pub(crate) d: &'a Dims,
    pub(crate) nc: usize,
    pub(crate) ctype: Vec<usize>,
    /// The centre of each atom (atoms numbered frame by frame), and local atom 0's type per
    /// centre's frame.
    atom_centre: Vec<usize>,
    atom0_type: Vec<usize>,
}

impl<'a, O: TapeBlock, T: Real> Ctx<'a, O, T> {
    fn new(x: &'a TapeIn<'a, O, T>, d: &'a Dims) -> Self {
        let nc = d.ncentres();
        let ctype: Vec<usize> = (0..nc).map(|c| d.centre_type(c)).collect();
        let mut atom_centre = vec![0; d.nbatch_atoms()];
        for (c, &at) in x.centre_atom.iter().enumerate() {
            atom_centre[at as usize] = c;
        }
        let atom0_type = (x.centre_atom.iter())
            .map(|&at| ctype[atom_centre[at as usize / d.natoms * d.natoms]])
            .collect();
        Ctx {
            x,
            d,
            nc,
            ctype,
            atom_centre,
            atom0_type,
        }
    }

    /// The centres' types as row indices.
    pub(crate) fn centre_rows(&self) -> Vec<u32> {
        self.ctype.iter().map(|&ty| ty as u32).collect()
    }

    pub(crate) fn env<N: Num<T>>(&self, t: &mut Tape<'_, T, N>, rij: V, b: &List) -> BlockEnv {
        let (o, x) = (self.x.o, self.x);
        let (s, rc, rcs, k) = (b.s, b.rcut, b.rcut_smth, b.stats);
        let (nt, si) = (o.nt(), o.nsel());
        let stats =
            |v: &[T], ti: usize| -> [T; 4] { std::array::from_fn(|q| v[(k * nt + ti) * 4 + q]) };
        let m = self.nc * s;
        let (mut real, mut ntype, mut owner) = (vec![false; m], vec![0u32; m], vec![NONE; m]);
        let mut gidx = vec![NONE; 3 * m];
        let mut pad = vec![T::zero(); 3 * m];
        let (mut avg, mut istd, mut padval) = (
            vec![T::zero(); 4 * m],
            vec![T::one(); 4 * m],
            vec![T::zero(); 4 * m],
        );
        let rc_t = cst::<T>(rc);
        for cc in 0..self.nc {
            let ti = self.ctype[cc];
            let (a, sd) = (stats(x.davg, ti), stats(x.dstd, ti));
            let s0 = self.d.mixed_slots(cc).start;
            for j in 0..s {
                let row = cc * s + j;
                let slot = (j < si).then_some(s0 + j);
                let found = slot.filter(|&sl| x.owner[sl] >= 0).filter(|&sl| {
                    let v = &x.rij[3 * sl..3 * sl + 3];
                    (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt() <= rc_t
                });
                let excluded = found.is_some_and(|sl| o.excludes(ti, x.nei_type[sl] as usize));
                ntype[row] = self.atom0_type[cc] as u32;
                for q in 0..4 {
                    avg[4 * row + q] = a[q];
                    istd[4 * row + q] = T::one() / sd[q];
                }
                match found {
                    Some(sl) if !excluded => {
                        real[row] = true;
                        ntype[row] = x.nei_type[sl] as u32;
                        owner[row] = self.atom_centre[x.owner[sl] as usize] as u32;
                        for q in 0..3 {
                            gidx[3 * row + q] = (3 * sl + q) as u32;
                        }
                    }
                    Some(_) if !b.excluded_is_padding => pad[3 * row] = T::one(),
                    _ => {
                        pad[3 * row] = T::one();
                        for q in 0..4 {
                            padval[4 * row + q] = -a[q] / sd[q];
                        }
                    }
                }
            }
        }
        let mask: Vec<T> = real
            .iter()
            .map(|&r| if r { T::one() } else { T::zero() })
            .collect();
        let rv = t.gather(rij, Arc::new(gidx), m, 3);
        let padc = t.consts(&pad, m, 3);
        let rv = t.add(rv, padc);
        let sq = t.mul(rv, rv);
        let r2 = t.row_sum(sq);
        let r = t.map(r2, Elem::Sqrt);
        let sw = t.map(r, Elem::switch(b.exp_switch, rcs, rc));
        let inv = t.map(r, Elem::Recip(o.protection()));
        let sr = t.mul(sw, inv);
        let sd = t.mul(sr, inv);
        let ang = t.mul(rv, sd);
        let env = t.concat(&[sr, ang]);
        let (avg, istd) = (t.consts(&avg, m, 4), t.consts(&istd, m, 4));
        let centred = t.sub(env, avg);
        let rhat = t.mul(centred, istd);
        let maskc = t.consts(&mask, m, 1);
        let rhat = t.mul(rhat, maskc);
        let padv = t.consts(&padval, m, 4);
        let rhat = t.add(rhat, padv);
        let sw = t.mul(sw, maskc);
        BlockEnv {
            s,
            rhat,
            sw,
            r,
            rv,
            real,
            ntype,
            owner,
        }
    }
}

/// Columns of a net's input, side by side with the others: a tensor, or rows `idx` of a table
/// (the type embedding's). A table's product with its block of the first layer's weights is
/// taken over the table's few rows before they are gathered, so the input is never built
/// (for the three-body block it was `[e_jk, T_j, T_k]` on every pair of neighbours, 17 numbers
/// a row for 2 out).
pub(crate) enum Part<'a> {
    Cols(V),
    Rows(V, &'a [u32]),
}

/// [`net`] on the parts side by side, the first layer's product taken part by part (the input
/// itself is built only where that layer's skip reads it).
pub(crate) fn net_parts<T: Real, N: Num<T>>(
    t: &mut Tape<'_, T, N>,
    parts: &[Part<'_>],
    net: &Net,
    a: Activation,
) -> V {
    let (first, rest) = net.layers.split_first().expect("a net with layers");
    if first.skip != Skip::None {
        let cols: Vec<V> = (parts.iter())
            .map(|p| match *p {
                Part::Cols(x) => x,
                Part::Rows(tab, idx) => t.rows(tab, idx),
            })
            .collect();
        let x = t.concat(&cols);
        return layers(t, x, &net.layers, a);
    }
    let (mut z, mut at) = (None, 0);
    for p in parts {
        let (src, width) = match *p {
            Part::Cols(x) | Part::Rows(x, _) => (x, t.shape(x).1),
        };
        let bias = z.is_none().then_some(first.b);
        let y = t.linear(src, first.w + at * first.nout, bias, first.nout);
        let y = match *p {
            Part::Cols(_) => y,
            Part::Rows(_, idx) => t.rows(y, idx),
        };
        z = Some(z.map_or(y, |z| t.add(z, y)));
        at += width;
    }
    assert_eq!(at, first.nin, "the parts' widths against the first layer's");
    let h = layer_out(t, z.expect("a part"), first, None, a);
    layers(t, h, rest, a)
}

/// An embedding net of DeePMD-kit (spec §5): φ(x·W + b) (· idt), plus the width-decided skip.
pub(crate) fn net<T: Real, N: Num<T>>(t: &mut Tape<'_, T, N>, x: V, net: &Net, a: Activation) -> V {
    layers(t, x, &net.layers, a)
}

fn layers<T: Real, N: Num<T>>(t: &mut Tape<'_, T, N>, mut x: V, ls: &[Layer], a: Activation) -> V {
    for l in ls {
        let z = t.linear(x, l.w, Some(l.b), l.nout);
        x = layer_out(t, z, l, Some(x), a);
    }
    x
}

/// A layer's output from its z = x·W + b: φ(z) (· idt), plus the skip from x (`None` where
/// the layer has no skip and its input was never built).
fn layer_out<T: Real, N: Num<T>>(
    t: &mut Tape<'_, T, N>,
    z: V,
    l: &Layer,
    x: Option<V>,
    a: Activation,
) -> V {
    let mut h = t.act(z, a);
    if let Some(idt) = l.idt {
        let p = t.param(idt, 1, l.nout);
        h = t.mul(h, p);
    }
    let x = || x.expect("a skip reads the layer's input");
    match l.skip {
        Skip::None => h,
        Skip::Identity => t.add(h, x()),
        Skip::Double => {
            let x = x();
            let xx = t.concat(&[x, x]);
            t.add(h, xx)
        }
    }
}

/// x with its terms by the update style (DPA-2's spec §20.6, DPA-3's §18.4).
pub(crate) fn update<T: Real, N: Num<T>>(
    t: &mut Tape<'_, T, N>,
    style: UpdateStyle,
    x: V,
    terms: &[V],
    residual: &[usize],
    width: usize,
) -> V {
    let k = terms.len();
    if k == 0 {
        return x;
    }
    match style {
        UpdateStyle::ResAvg => {
            let s = terms.iter().fold(x, |a, &u| t.add(a, u));
            t.scale(s, T::one() / cst::<T>((k + 1) as f64).sqrt())
        }
        UpdateStyle::ResIncr => {
            let s = terms[1..].iter().fold(terms[0], |a, &u| t.add(a, u));
            let s = t.scale(s, T::one() / cst::<T>(k as f64).sqrt());
            t.add(x, s)
        }
        UpdateStyle::ResResidual => terms.iter().zip(residual).fold(x, |a, (&u, &r)| {
            let rv = t.param(r, 1, width);
            let ru = t.mul(u, rv);
            t.add(a, ru)
        }),
    }
}

/// T `[nt][T]`: the type embedding's layer over one-hot rows, with its skip.
pub(crate) fn tebd<T: Real, N: Num<T>>(t: &mut Tape<'_, T, N>, l: &TebdLayout) -> V {
    let (nt, dim) = (l.ntypes, l.dim);
    let mut tt = t.param(l.w, nt, dim);
    if let Some(b) = l.b {
        let b = t.param(b, 1, dim);
        tt = t.add(tt, b);
    }
    let skip: Vec<T> = (0..nt * dim)
        .map(|e| {
            let (ty, c) = (e / dim, e % dim);
            let on = match l.skip {
                Skip::None => false,
                Skip::Identity => c == ty,
                Skip::Double => c % nt == ty,
            };
            if on {
                T::one()
            } else {
                T::zero()
            }
        })
        .collect();
    let skip = t.consts(&skip, nt, dim);
    t.add(tt, skip)
}

/// A pass's tape with its r_ij and D nodes.
type Built<T, N> = (Tape<'static, T, N>, V, V);

/// A tape recorded for a device to run ([`record`]), with its r_ij and D nodes.
pub(crate) type Recorded<T> = Built<T, T>;

fn run<O: TapeBlock, T: Real, N: Num<T>>(
    x: &TapeIn<'_, O, T>,
    d: &Dims,
    rdot: Option<&[T]>,
) -> Built<T, N> {
    let ctx = Ctx::new(x, d);
    let mut t = Tape::new(x.params);
    let ns = d.nslots();
    let rv = (0..3 * ns)
        .map(|e| N::pair(x.rij[e], rdot.map_or(T::zero(), |r| r[e])))
        .collect();
    let rij = t.leaf(rv, ns, 3);
    let built = O::build(&ctx, &mut t, rij);
    let desc = output(&mut t, built);
    (t.owned(), rij, desc)
}

/// The tape of these inputs recorded, not evaluated, for a device to run: its r_ij is the
/// device's, its parameters are read there (`x.params` is not read).
pub(crate) fn record<O: TapeBlock, T: Real>(x: &TapeIn<'_, O, T>, d: &Dims) -> Built<T, T> {
    let ctx = Ctx::new(x, d);
    let mut t = Tape::record();
    let rij = t.leaf(Vec::new(), d.nslots(), 3);
    let built = O::build(&ctx, &mut t, rij);
    let desc = output(&mut t, built);
    (t, rij, desc)
}

/// [`record`] of a block on some of a batch's slots (`x` and `d` are theirs): its r_ij is the
/// batch's `[nslots][3]`, of which the block reads rows `slot`, so that the device's r_ij goes
/// in as it is and the other slots' adjoint is 0.
pub(crate) fn record_on<O: TapeBlock, T: Real>(
    x: &TapeIn<'_, O, T>,
    d: &Dims,
    nslots: usize,
    slot: &[u32],
) -> Built<T, T> {
    let ctx = Ctx::new(x, d);
    let mut t = Tape::record();
    let batch = t.leaf(Vec::new(), nslots, 3);
    let rij = t.rows(batch, slot);
    let built = O::build(&ctx, &mut t, rij);
    let desc = output(&mut t, built);
    (t, batch, desc)
}

/// The tape kept for these inputs, or one built now.
fn kept<O: TapeBlock, T: Real, N: Num<T> + Send + 'static>(
    x: &TapeIn<'_, O, T>,
    d: &Dims,
    keep: &Keep,
    rdot: Option<&[T]>,
) -> Built<T, N> {
    (keep.take(|k| x.made(k, d, rdot))).unwrap_or_else(|| run(x, d, rdot))
}

/// D `[nc][width]` of every centre (then A, [`output`]); the tape kept for the backward.
pub(crate) fn forward<O: TapeBlock, T: Real>(
    d: &Dims,
    x: &TapeIn<'_, O, T>,
    keep: &Keep,
    desc: &mut [T],
) {
    let built = run::<O, T, T>(x, d, None);
    desc.copy_from_slice(built.0.val(built.2));
    keep.put(x.key(d, None), built);
}

/// Ḋ `[nc][width]` (then Ȧ) for the tangent ṙ_ij `[nslots][3]`; the tape kept for the dual
/// reverse.
pub(crate) fn tangent<O: TapeBlock, T: Real>(
    d: &Dims,
    x: &TapeIn<'_, O, T>,
    keep: &Keep,
    rdot: &[T],
    ddot: &mut [T],
) {
    let built = run::<O, T, Dual<T>>(x, d, Some(rdot));
    for (o, v) in ddot.iter_mut().zip(built.0.val(built.2)) {
        *o = v.d;
    }
    keep.put(x.key(d, Some(rdot)), built);
}

/// q = ∂E/∂r_ij `[nslots][3]` from D̄ `[nc][width]` (then Ā).
pub(crate) fn backward<O: TapeBlock, T: Real>(
    d: &Dims,
    x: &TapeIn<'_, O, T>,
    keep: &Keep,
    dbar: &[T],
    q: &mut [T],
) {
    let (t, rij, dv) = kept::<O, T, T>(x, d, keep, None);
    let g = t.backward(vec![(dv, dbar.to_vec())], &mut []);
    match g.of(rij) {
        Some(a) => q.copy_from_slice(a),
        None => q.fill(T::zero()),
    }
}

/// The dual reverse from (D̄, Ḋ̄) (each then A's) for the tangent ṙ_ij: the parameter gradient
/// added to `grad`.
pub(crate) fn dual<O: TapeBlock, T: Real>(
    d: &Dims,
    x: &TapeIn<'_, O, T>,
    keep: &Keep,
    rdot: &[T],
    dbar: &[T],
    ddotbar: &[T],
    grad: &mut [T],
) {
    let (t, _, dv) = kept::<O, T, Dual<T>>(x, d, keep, Some(rdot));
    // Cotangent Ḋ̄ + ε D̄: the ε part of a parameter's adjoint is its gradient (dual.rs).
    let seed = (ddotbar.iter().zip(dbar))
        .map(|(&db, &b)| Dual::new(db, b))
        .collect();
    let mut g = vec![Dual::default(); grad.len()];
    t.backward(vec![(dv, seed)], &mut g);
    for (gv, v) in grad.iter_mut().zip(g) {
        *gv += v.d;
    }
}

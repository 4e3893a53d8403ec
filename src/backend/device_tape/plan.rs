//! What a run of a recorded tape needs before any device is asked: its constants and indices
//! (a gather's, its adjoint's CSR, a softmax's mask), which ops' adjoints are wanted, and the
//! pool its buffers are kept in. The same for every device that runs the tape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::cpu::tape::{Elem, Op, Tape, NONE, V};
use crate::backend::cpu::tape_block::Recorded;
use crate::backend::gpu_layout::{count, TapeParams};
use crate::backend::Real;
use crate::model::Activation;

/// A buffer of a tape's runs: a tensor's value, slope or adjoint, the run's indices or constant
/// tensors, or the parts of its long sums (by bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    Val(usize),
    Slope(usize),
    Adj(usize),
    Cst,
    Idx,
    Leaves,
    Parts(u64),
}

/// The buffers of a stage's tape runs by slot, each as large as the largest run has needed (a
/// stage has one run live at a time: its keep holds one). Kept in the stage's [`Keep`], so
/// that they go with the stage rather than live as long as the device: a finite difference's
/// or a test's model, or a batch shape no longer used, leaves nothing behind.
///
/// [`Keep`]: crate::backend::keep::Keep
pub(crate) struct Pool<R>(Arc<Mutex<HashMap<Slot, R>>>);

impl<R> Default for Pool<R> {
    fn default() -> Self {
        Pool(Arc::default())
    }
}

impl<R> Clone for Pool<R> {
    fn clone(&self) -> Self {
        Pool(self.0.clone())
    }
}

impl<R: Clone> Pool<R> {
    /// Buffer `slot`: the one kept where it `fits`, else one `make` makes (kept from now on).
    pub(crate) fn get(
        &self,
        slot: Slot,
        fits: impl FnOnce(&R) -> bool,
        make: impl FnOnce() -> R,
    ) -> R {
        let mut slots = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match slots.get(&slot) {
            Some(b) if fits(b) => b.clone(),
            _ => {
                let b = make();
                slots.insert(slot, b.clone());
                b
            }
        }
    }
}

/// A block's tape recorded from one batch, with its plan: what every pass on that batch
/// shares (the forward's run and the tangent's alike), so made once a batch.
pub(crate) struct Prepared<T: Real> {
    pub(crate) rec: Recorded<T>,
    pub(super) plan: Plan,
}

impl<T: Real> Prepared<T> {
    pub(crate) fn new(rec: Recorded<T>) -> Self {
        let plan = plan(&rec.0, rec.1);
        Prepared { rec, plan }
    }

    /// Bytes of the largest buffer its runs on duals make: a tensor, or the constant leaves,
    /// constants or indices each uploaded as one.
    pub(crate) fn largest_buffer(&self) -> usize {
        let (t, input, _) = &self.rec;
        let dual = 2 * size_of::<T>();
        let tensor = t.ops().map(|(_, (r, c))| r * c).max().unwrap_or(0);
        let leaves: usize = (t.ops().enumerate())
            .filter(|&(i, (o, _))| matches!(o, Op::Leaf) && i != input.index())
            .map(|(_, (_, (r, c)))| r * c)
            .sum();
        let cst = self.plan.cst.len() * size_of::<T>();
        (tensor.max(leaves) * dual)
            .max(cst)
            .max(4 * self.plan.idx.len())
    }
}

/// The constants and indices of one tape, and which ops' adjoints are wanted.
pub(super) struct Plan {
    /// Where each op's constants (in `cst`) and indices (in `idx`) begin: a gather's indices
    /// and then its adjoint's CSR, a softmax's mask.
    pub(super) ci: Vec<u32>,
    pub(super) ix: Vec<Ix>,
    pub(super) cst: Vec<f64>,
    pub(super) idx: Vec<u32>,
    /// Whether an op's adjoint is wanted: it reads r_ij or a parameter, itself or through
    /// what it reads.
    pub(super) wanted: Vec<bool>,
}

/// Where an op's indices begin in the run's index buffer: a gather's, and its adjoint's CSR
/// with the most units one source unit is read into; a softmax's mask.
#[derive(Clone, Copy, Default)]
pub(super) struct Ix {
    pub(super) at: u32,
    pub(super) csr: u32,
    pub(super) longest: usize,
}

/// cst[0] and cst[1]: the scales of a plain copy and of a negated one.
pub(super) const ONE: u32 = 0;
pub(super) const MINUS_ONE: u32 = 1;

/// The element function's number in the kernels' `elem3` (shaders/tape.wgsl, kernels/tape.cu)
/// and its constants.
pub(super) fn elem_id(f: Elem) -> (u32, Vec<f64>) {
    match f {
        Elem::Sqrt => (0, vec![]),
        Elem::Switch { rs, rc } => (1, vec![rs, rc]),
        Elem::Recip(p) => (2, vec![p]),
        Elem::Rsqrt(e) => (3, vec![e]),
        Elem::Act(Activation::Tanh) => (4, vec![]),
        Elem::Act(Activation::Silu) => (5, vec![]),
        Elem::Act(Activation::Silut(c)) => {
            // As Activation::eval3 takes them, in f64.
            let sig = 1.0 / (1.0 + (-c).exp());
            (6, vec![c, sig + c * sig * (1.0 - sig), c * sig])
        }
        Elem::Act(Activation::Linear) => (7, vec![]),
        Elem::ExpSwitch { rs, rc } => (8, vec![rs, rc]),
    }
}

/// A gather's adjoint as a CSR over the `n` units of its source: starts `[n + 1]`, then the
/// units reading each, in order, in room for all of `idx`: a tape's index layout is then its
/// shapes' alone, and so are its kernels' uniforms and bind groups, whatever the batch.
fn csr(idx: &[u32], n: usize) -> Vec<u32> {
    let mut start = vec![0u32; n + 1];
    for &i in idx.iter().filter(|&&i| i != NONE) {
        start[i as usize + 1] += 1;
    }
    for k in 0..n {
        start[k + 1] += start[k];
    }
    let mut at = start.clone();
    let mut list = vec![0u32; idx.len()];
    for (e, &i) in idx.iter().enumerate().filter(|(_, &i)| i != NONE) {
        list[at[i as usize] as usize] = e as u32;
        at[i as usize] += 1;
    }
    start.extend(list);
    start
}

fn plan<T: Real>(t: &Tape<'_, T, T>, input: V) -> Plan {
    let n = t.ops().len();
    let mut p = Plan {
        ci: vec![ONE; n],
        ix: vec![Ix::default(); n],
        cst: vec![1.0, -1.0],
        idx: Vec::new(),
        wanted: vec![false; n],
    };
    for (i, (op, _)) in t.ops().enumerate() {
        let constants = match op {
            Op::Scale(_, s) => vec![s.f64()],
            Op::Map(_, f, _) => elem_id(*f).1,
            _ => vec![],
        };
        if !constants.is_empty() {
            p.ci[i] = count(p.cst.len());
            p.cst.extend(constants);
        }
        match op {
            Op::Gather { x, idx: g, w } => {
                let (r, c) = t.shape(*x);
                let units = r * c / w;
                let at = count(p.idx.len());
                p.idx.extend_from_slice(g);
                let back = p.idx.len();
                p.idx.extend(csr(g, units));
                let starts = &p.idx[back..back + units + 1];
                let longest = starts.windows(2).map(|w| (w[1] - w[0]) as usize).max();
                p.ix[i] = Ix {
                    at,
                    csr: count(back),
                    // Rounded up, so that batches share the number of parts of the adjoint's
                    // sums (and their uniforms): the parts past a row's terms add nothing.
                    longest: longest.unwrap_or(0).next_power_of_two(),
                };
            }
            Op::Softmax(_, Some(mask)) => {
                p.ix[i].at = count(p.idx.len());
                p.idx.extend(mask.iter().map(|&m| m as u32));
            }
            _ => {}
        }
        p.wanted[i] = match op {
            Op::Param(_) | Op::Linear { .. } => true,
            Op::Leaf => i == input.index(),
            _ => args(op).iter().any(|a| p.wanted[a.index()]),
        };
    }
    p
}

/// The tensors an op reads.
fn args<T, N>(op: &Op<T, N>) -> Vec<V> {
    match op {
        Op::Leaf | Op::Param(_) => vec![],
        Op::Linear { x, .. } => vec![*x],
        Op::Bmm { a, b, .. } => vec![*a, *b],
        Op::Add(a, b) | Op::Sub(a, b) | Op::Mul(a, b) => vec![*a, *b],
        Op::Map(x, ..)
        | Op::Scale(x, _)
        | Op::Gather { x, .. }
        | Op::SumRows(x, _)
        | Op::RowSum(x)
        | Op::Softmax(x, _)
        | Op::Reshape(x) => vec![*x],
        Op::Concat(xs) => xs.clone(),
    }
}

/// Launch shape: rows and columns of the tensor written (the kernel's thread count is theirs,
/// or as the kernel says).
pub(super) fn shape(rows: usize, cols: usize) -> TapeParams {
    TapeParams {
        rows: count(rows),
        cols: count(cols),
        ..Default::default()
    }
}

pub(super) fn shape_u32((r, c): (usize, usize)) -> (u32, u32) {
    (count(r), count(c))
}

/// A batched product's scalars: `batch` products of `[m][k]`·`[k][n]`, transposes (ta, tb).
pub(super) fn bmm(
    batch: usize,
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
) -> TapeParams {
    TapeParams {
        rows: count(batch),
        m: count(m),
        k: count(k),
        nn: count(n),
        ta: ta as u32,
        tb: tb as u32,
        ..Default::default()
    }
}

/// Copying w columns of `rows` rows from column `from.1` of rows `from.0` wide to column `to.1`
/// of rows `to.0` wide.
pub(super) fn copy_cols(
    rows: usize,
    from: (usize, usize),
    to: (usize, usize),
    w: usize,
    acc: bool,
) -> TapeParams {
    TapeParams {
        rows: count(rows),
        cols: count(from.0),
        m: count(from.1),
        br: count(to.0),
        k: count(to.1),
        nn: count(w),
        acc: acc as u32,
        ..Default::default()
    }
}

//! hybrid: its sub-descriptors side by side, D_i the concatenation of theirs in `list` order
//! (docs/design.md §10, tests/reference/descriptors/README.md).
//!
//! A batch's slots hold, per centre and neighbour type t, every sub-descriptor's sel_k[t] slots
//! one after the other ([`crate::model::DescriptorSpec::slot_sel`]), each section filled from
//! DeePMD-kit's one list of the largest rcut and sel as its `nlist_cut_idx` does
//! (`train::batch`). Each sub-descriptor runs on its own slot layout and environment: r_ij and
//! owners are gathered from the batch's, its D and Ḋ are copied side by side and gathered into
//! rows of the whole descriptor, D̄ and Ḋ̄ are gathered back out of them, and its q are gathered
//! into the batch's slots, whose one force/virial scatter then sums every sub-descriptor's.
//! Only the backend's `gather`, `gather_idx` and `copy`: no op of its own.

use crate::backend::{Backend, Dims, Real, Span};

use super::super::env::Env;
use super::super::net::Zeros;
use super::super::{DescModel, Part};
use super::{forward_on, stage, tangent_on, BoxedStage};

/// One sub-descriptor: its slot layout, environment, stage and the spans that move its values
/// between its layout and the hybrid's.
struct Sub<T: Real, B: Backend<T>> {
    dims: Dims,
    env: Env<T, B>,
    desc: BoxedStage<T, B>,
    /// q of its slots; D̄, Ḋ̄ of its columns.
    q: B::Buf,
    dbar: B::Buf,
    ddotbar: B::Buf,
    /// The batch's r_ij (3 per slot), owners (1 per slot) → its own.
    rij_spans: Vec<Span>,
    owner_spans: Vec<Span>,
    /// The whole descriptor's rows → its columns.
    split: Vec<Span>,
    /// Where its D (and Ḋ) start in the side-by-side buffer, and its q in theirs.
    desc_at: usize,
    q_at: usize,
}

pub struct Hybrid<T: Real, B: Backend<T>> {
    subs: Vec<Sub<T, B>>,
    /// D, Ḋ: `[nc][dim]`, dim = Σ dim_k.
    desc: B::Buf,
    ddot: B::Buf,
    /// Every sub-descriptor's D (or Ḋ) `[nc][dim_k]`, one after the other; and their q.
    side: B::Buf,
    qside: B::Buf,
    /// `side` → rows of `desc`, and `qside` → the batch's slots.
    join: Vec<Span>,
    qjoin: Vec<Span>,
}

/// Adds a span, merged into the last one where both ends continue it.
fn push(v: &mut Vec<Span>, s: Span) {
    if s.len == 0 {
        return;
    }
    if let Some(l) = v.last_mut() {
        if l.src + l.len == s.src && l.dst + l.len == s.dst {
            l.len += s.len;
            return;
        }
    }
    v.push(s);
}

/// For every centre and neighbour type, the sub-descriptor's run of slots (`w` values each) in
/// its own layout `s` (from `base`) and in the batch's `u` (from slot `off[t]` of the section):
/// as (own, batch) value offsets and length.
fn slot_runs(u: &Dims, s: &Dims, off: &[usize], w: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for ti in 0..u.ntypes {
        for (tj, &at) in off.iter().enumerate() {
            for c in u.centres(ti) {
                let own = w * s.slot(ti, c, tj, 0);
                let batch = w * u.slot(ti, c, tj, at);
                out.push((own, batch, w * s.sel[tj]));
            }
        }
    }
    out
}

impl<T: Real, B: Backend<T>> Hybrid<T, B> {
    pub fn new(
        b: &B,
        parts: &[Part<T, B>],
        views: &[DescModel<'_, T, B>],
        d: &Dims,
        zeros: &Zeros<B::Buf>,
        centre_atom: &[i32],
    ) -> anyhow::Result<Self> {
        let nt = d.ntypes;
        let nc = d.ncentres();
        let counts: Vec<usize> = (0..nt)
            .map(|t| d.centres(t).len() / d.nframes.max(1))
            .collect();
        let dim: usize = parts.iter().map(|p| p.m1 * p.m2).sum();
        let mut off = vec![0; nt];
        let (mut col, mut desc_at, mut q_at) = (0, 0, 0);
        let (mut join, mut qjoin) = (Vec::new(), Vec::new());
        let mut subs = Vec::new();
        for (p, view) in parts.iter().zip(views) {
            let dims = Dims::new(d.nframes, &counts, &p.sel, p.m1, p.m2);
            let (ns, dk) = (dims.nslots(), p.m1 * p.m2);
            let (mut rij_spans, mut owner_spans, mut split) = (Vec::new(), Vec::new(), Vec::new());
            for (own, batch, len) in slot_runs(d, &dims, &off, 3) {
                push(
                    &mut rij_spans,
                    Span {
                        src: batch,
                        dst: own,
                        len,
                    },
                );
                push(
                    &mut qjoin,
                    Span {
                        src: q_at + own,
                        dst: batch,
                        len,
                    },
                );
            }
            for (own, batch, len) in slot_runs(d, &dims, &off, 1) {
                push(
                    &mut owner_spans,
                    Span {
                        src: batch,
                        dst: own,
                        len,
                    },
                );
            }
            for c in 0..nc {
                let (own, whole) = (c * dk, c * dim + col);
                push(
                    &mut split,
                    Span {
                        src: whole,
                        dst: own,
                        len: dk,
                    },
                );
                push(
                    &mut join,
                    Span {
                        src: desc_at + own,
                        dst: whole,
                        len: dk,
                    },
                );
            }
            subs.push(Sub {
                env: Env::new(b, &dims, zeros, centre_atom, (false, false))?,
                desc: stage(b, view, &dims, zeros, false)?,
                q: zeros(3 * ns)?,
                dbar: zeros(nc * dk)?,
                ddotbar: zeros(nc * dk)?,
                rij_spans,
                owner_spans,
                split,
                desc_at,
                q_at,
                dims,
            });
            off.iter_mut().zip(&p.sel).for_each(|(o, s)| *o += s);
            col += dk;
            desc_at += nc * dk;
            q_at += 3 * ns;
        }
        Ok(Hybrid {
            subs,
            desc: zeros(nc * dim)?,
            ddot: zeros(nc * dim)?,
            side: zeros(nc * dim)?,
            qside: zeros(q_at)?,
            join,
            qjoin,
        })
    }

    pub fn desc(&self) -> &B::Buf {
        &self.desc
    }

    pub fn ddot(&self) -> &B::Buf {
        &self.ddot
    }

    pub fn buffers(&self) -> Vec<&B::Buf> {
        let mut v = Vec::new();
        for s in &self.subs {
            v.extend(s.env.buffers());
            v.extend(s.desc.buffers());
            v.extend([&s.q, &s.dbar, &s.ddotbar]);
        }
        v.extend([&self.desc, &self.ddot, &self.side, &self.qside]);
        v
    }

    /// Each sub-descriptor's environment and D from the batch's r_ij and owners; D side by side.
    pub fn forward(&mut self, b: &B, m: &[DescModel<'_, T, B>], _d: &Dims, env: &Env<T, B>) {
        for (s, m) in self.subs.iter_mut().zip(m) {
            b.gather(&env.rij, &mut s.env.rij, &s.rij_spans);
            b.gather_idx(&env.owner, &mut s.env.owner, &s.owner_spans);
            forward_on(s.desc.as_mut(), b, m, &s.dims, &mut s.env);
            b.copy(s.desc.desc(), &mut self.side, s.desc_at);
        }
        b.gather(&self.side, &mut self.desc, &self.join);
    }

    /// Each sub-descriptor's q from its columns of D̄, into the batch's slots.
    pub fn backward(
        &mut self,
        b: &B,
        m: &[DescModel<'_, T, B>],
        _d: &Dims,
        dbar: &B::Buf,
        q: &mut B::Buf,
    ) {
        for (s, m) in self.subs.iter_mut().zip(m) {
            b.gather(dbar, &mut s.dbar, &s.split);
            s.desc.backward(b, m, &s.dims, &s.env, &s.dbar, &mut s.q);
            b.copy(&s.q, &mut self.qside, s.q_at);
        }
        b.gather(&self.qside, q, &self.qjoin);
    }

    /// Each sub-descriptor's environment tangent and Ḋ; Ḋ side by side.
    pub fn tangent(
        &mut self,
        b: &B,
        m: &[DescModel<'_, T, B>],
        _d: &Dims,
        residuals: (&B::Buf, &B::Buf),
    ) {
        for (s, m) in self.subs.iter_mut().zip(m) {
            tangent_on(s.desc.as_mut(), b, m, &s.dims, &mut s.env, residuals);
            b.copy(s.desc.ddot(), &mut self.side, s.desc_at);
        }
        b.gather(&self.side, &mut self.ddot, &self.join);
    }

    /// Each sub-descriptor's dual reverse from its columns of (D̄, Ḋ̄).
    pub fn dual(
        &mut self,
        b: &B,
        m: &[DescModel<'_, T, B>],
        grad: &mut B::Buf,
        _d: &Dims,
        (dbar, ddotbar): (&B::Buf, &B::Buf),
    ) {
        for (s, m) in self.subs.iter_mut().zip(m) {
            b.gather(dbar, &mut s.dbar, &s.split);
            b.gather(ddotbar, &mut s.ddotbar, &s.split);
            s.desc
                .dual(b, m, grad, &s.dims, &s.env, (&s.dbar, &s.ddotbar));
        }
    }
}

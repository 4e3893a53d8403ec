//! One net's per-layer buffers over its rows and its dual reverse, shared by the embedding nets
//! (over slots) and the fitting nets (over centres).

use std::ops::Range;

use crate::backend::{Backend, DenseIo, Real};
use crate::mem::OutOfMemory;
use crate::model::{Layer, Net};

/// A fallible allocation of n values, naming the batch when it fails.
pub type Zeros<'a, Buf> = dyn Fn(usize) -> Result<Buf, OutOfMemory> + 'a;

/// Per-layer buffers of one net over its rows: input-side tangents and adjoints are per layer
/// too, since layer widths differ.
pub struct NetCache<Buf> {
    pub h: Vec<Buf>,
    pub y: Vec<Buf>,
    pub zdot: Vec<Buf>,
    pub ydot: Vec<Buf>,
    pub xbar: Vec<Buf>,
    pub xdotbar: Vec<Buf>,
}

impl<Buf> NetCache<Buf> {
    pub fn all(&self) -> impl Iterator<Item = &Buf> {
        [
            &self.h,
            &self.y,
            &self.zdot,
            &self.ydot,
            &self.xbar,
            &self.xdotbar,
        ]
        .into_iter()
        .flatten()
    }

    /// The net's output and its tangent for a unit input tangent (the derivative along the
    /// input, for a one-wide input).
    pub fn out(&self) -> (&Buf, &Buf) {
        (self.y.last().unwrap(), self.ydot.last().unwrap())
    }

    pub fn new(zeros: &Zeros<Buf>, net: &Net, rows: usize) -> Result<Self, OutOfMemory> {
        let out = |f: &dyn Fn(&Layer) -> usize| {
            net.layers
                .iter()
                .map(|l| zeros(rows * f(l)))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(NetCache {
            h: out(&|l| l.nout)?,
            y: out(&|l| l.nout)?,
            zdot: out(&|l| l.nout)?,
            ydot: out(&|l| l.nout)?,
            xbar: out(&|l| l.nin)?,
            xdotbar: out(&|l| l.nin)?,
        })
    }
}

/// One net forward on `rows` from its input (value, tangent), keeping every layer's values and
/// tangents in `c` for the dual reverse.
pub fn net_forward<T: Real, B: Backend<T>>(
    b: &B,
    params: &B::Buf,
    net: &Net,
    rows: Range<usize>,
    c: &mut NetCache<B::Buf>,
    (x0, xdot0): (&B::Buf, &B::Buf),
) {
    for (l, layer) in net.layers.iter().enumerate() {
        let (head_y, tail_y) = c.y.split_at_mut(l);
        let (head_yd, tail_yd) = c.ydot.split_at_mut(l);
        let (x, xdot) = if l == 0 {
            (x0, xdot0)
        } else {
            (&head_y[l - 1], &head_yd[l - 1])
        };
        b.dense_forward(layer, params, rows.clone(), x, &mut c.h[l], &mut tail_y[0]);
        b.dense_tangent(
            layer,
            params,
            rows.clone(),
            &c.h[l],
            xdot,
            &mut c.zdot[l],
            &mut tail_yd[0],
        );
    }
}

/// What one net's dual reverse starts from: its input (value, tangent), the adjoints of its
/// output (ȳ, ẏ̄), the per-row tangent scale of [`DenseOps::dense_dual_backward`](crate::backend::DenseOps::dense_dual_backward), and
/// whether the adjoints of the input are wanted (they are `c.xbar[0]`, `c.xdotbar[0]`).
pub struct NetDual<'a, Buf> {
    pub input: (&'a Buf, &'a Buf),
    pub seed: (&'a Buf, &'a Buf),
    pub scale: Option<&'a Buf>,
    pub input_adjoint: bool,
}

/// The dual reverse through the layers of `net` on `rows`, accumulating into `grad`.
pub fn net_dual_backward<T: Real, B: Backend<T>>(
    b: &B,
    params: &B::Buf,
    grad: &mut B::Buf,
    net: &Net,
    rows: Range<usize>,
    c: &mut NetCache<B::Buf>,
    dual: NetDual<B::Buf>,
) {
    for (l, layer) in net.layers.iter().enumerate().rev() {
        let (xb_head, xb_tail) = c.xbar.split_at_mut(l + 1);
        let (xdb_head, xdb_tail) = c.xdotbar.split_at_mut(l + 1);
        let (ybar, ydotbar) = if l + 1 == net.layers.len() {
            dual.seed
        } else {
            (&xb_tail[0], &xdb_tail[0])
        };
        let (x, xdot) = if l == 0 {
            dual.input
        } else {
            (&c.y[l - 1], &c.ydot[l - 1])
        };
        let xbar = (l > 0 || dual.input_adjoint).then(|| (&mut xb_head[l], &mut xdb_head[l]));
        b.dense_dual_backward(
            layer,
            params,
            rows.clone(),
            DenseIo { x, h: &c.h[l] },
            xdot,
            &c.zdot[l],
            dual.scale,
            ybar,
            ydotbar,
            grad,
            xbar,
        );
    }
}

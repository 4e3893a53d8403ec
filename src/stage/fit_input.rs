//! The fitting net's input of a model with frame or atomic parameters or a case embedding:
//! DeePMD-kit's `[D_i, (fparam − fparam_avg)·fparam_inv_std, (aparam_i − aparam_avg)·aparam_inv_std,
//! case_embd]`.
//!
//! The parameters are data, not functions of the coordinates or the weights, so they are
//! normalised on the host as a batch is loaded, and on the device only moved; the case
//! embedding is the same row for every centre, written once. D (or Ḋ) and the
//! parameters (or zeros, their tangent) are copied side by side and gathered into rows; the
//! input's adjoints are gathered back to D̄ and Ḋ̄. The backend's `copy` and `gather` alone, no
//! op of its own (as `descriptor::hybrid` joins its parts).

use crate::backend::{Backend, Dims, Real, Span};
use crate::mem::OutOfMemory;

use super::net::Zeros;

pub struct FitInput<T: Real, B: Backend<T>> {
    /// The descriptor's width, and the centres.
    dim: usize,
    nc: usize,
    /// Per parameter column: the avg it is shifted by and the inverse std it is scaled by.
    avg: Vec<f64>,
    inv_std: Vec<f64>,
    case_embd: Vec<f64>,
    /// The batch's normalised parameters and the case embedding, `[nc][nx]`.
    params: B::Buf,
    /// `[nc·dim | nc·nx]`: D then the parameters; Ḋ then zeros.
    side: B::Buf,
    side_dot: B::Buf,
    /// The net's input and its tangent, `[nc][dim + nx]`.
    pub x: B::Buf,
    pub xdot: B::Buf,
    /// D̄ and Ḋ̄, `[nc][dim]`.
    pub dbar: B::Buf,
    pub ddotbar: B::Buf,
    /// `side` → rows of `x`, and the first `dim` columns of the rows → D̄.
    join: Vec<Span>,
    split: Vec<Span>,
}

impl<T: Real, B: Backend<T>> FitInput<T, B> {
    /// `None` without parameters or case embedding: the net then reads D itself.
    pub fn new(
        b: &B,
        (avg, inv_std): (&[f64], &[f64]),
        case_embd: &[f64],
        d: &Dims,
        dim: usize,
        zeros: &Zeros<B::Buf>,
    ) -> Result<Option<Self>, OutOfMemory> {
        let nx = avg.len() + case_embd.len();
        if nx == 0 {
            return Ok(None);
        }
        let nc = d.ncentres();
        let w = dim + nx;
        let mut join = Vec::with_capacity(2 * nc);
        let mut split = Vec::with_capacity(nc);
        for c in 0..nc {
            join.push(Span {
                src: c * dim,
                dst: c * w,
                len: dim,
            });
            join.push(Span {
                src: nc * dim + c * nx,
                dst: c * w + dim,
                len: nx,
            });
            split.push(Span {
                src: c * w,
                dst: c * dim,
                len: dim,
            });
        }
        let mut input = FitInput {
            dim,
            nc,
            avg: avg.to_vec(),
            inv_std: inv_std.to_vec(),
            case_embd: case_embd.to_vec(),
            params: zeros(nc * nx)?,
            side: zeros(nc * w)?,
            side_dot: zeros(nc * w)?,
            x: zeros(nc * w)?,
            xdot: zeros(nc * w)?,
            dbar: zeros(nc * dim)?,
            ddotbar: zeros(nc * dim)?,
            join,
            split,
        };
        // Without parameters no batch loads anything: the case embedding stays as written.
        input.write_rows(b, &vec![0.0; nc * avg.len()]);
        Ok(Some(input))
    }

    pub fn buffers(&self) -> [&B::Buf; 7] {
        [
            &self.params,
            &self.side,
            &self.side_dot,
            &self.x,
            &self.xdot,
            &self.dbar,
            &self.ddotbar,
        ]
    }

    /// A batch's parameters, `[nc][numb_fparam + numb_aparam]` as the data has them
    /// ([`crate::train::batch::HostBatch::fit_input`]), normalised into the side buffer.
    pub fn load(&mut self, b: &B, raw: &[f64]) {
        if !self.avg.is_empty() {
            self.write_rows(b, raw);
        }
    }

    /// Each centre's row: its parameters `raw` normalised, then the case embedding.
    fn write_rows(&mut self, b: &B, raw: &[f64]) {
        let (np, nc) = (self.avg.len(), self.nc);
        let rows: Vec<T> = (0..nc)
            .flat_map(|c| {
                let row = &raw[c * np..(c + 1) * np];
                let norm =
                    (row.iter().zip(&self.avg).zip(&self.inv_std)).map(|((v, a), s)| (v - a) * s);
                norm.chain(self.case_embd.iter().copied()).map(T::of)
            })
            .collect();
        b.write(&mut self.params, &rows);
        b.copy(&self.params, &mut self.side, nc * self.dim);
    }

    /// The net's input from D.
    pub fn join(&mut self, b: &B, desc: &B::Buf) {
        b.copy(desc, &mut self.side, 0);
        b.gather(&self.side, &mut self.x, &self.join);
    }

    /// The input's tangent from Ḋ (the parameters' is zero).
    pub fn join_tangent(&mut self, b: &B, ddot: &B::Buf) {
        b.copy(ddot, &mut self.side_dot, 0);
        b.gather(&self.side_dot, &mut self.xdot, &self.join);
    }

    /// D̄ (and Ḋ̄) from the input's adjoints.
    pub fn split(&mut self, b: &B, xbar: &B::Buf, xdotbar: Option<&B::Buf>) {
        b.gather(xbar, &mut self.dbar, &self.split);
        if let Some(xd) = xdotbar {
            b.gather(xd, &mut self.ddotbar, &self.split);
        }
    }
}

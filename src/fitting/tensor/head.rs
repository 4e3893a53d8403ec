//! The tensor head on the host: the nets' outputs y_i and the rotation matrix gr_i to atomic and
//! frame tensors, DeePMD-kit's `TensorLoss`, and the seeds ∂L/∂y_i, ∂L/∂A_i of the dual pass
//! (docs/deepmd-spec.md §17).

use super::{Tensor, TensorSpec};
use crate::fitting::head::HeadLabels;
use crate::fitting::Centres;

/// The loss sums one batch leaves for the metrics: the loss, the atomic term's mean squared
/// error, the frame term's, and the atoms with a tensor per frame (DeePMD-kit's `atom_num`).
pub const NSUMS: usize = 4;

/// The head of one model: its tensor, keys, and the diagonal shift of each type (a polar's
/// `shift_diag`: the output bias's mean diagonal; zeros otherwise).
pub struct TensorHead<'a> {
    pub tensor: Tensor,
    pub spec: &'a TensorSpec,
    pub diag_bias: &'a [f64],
}

/// gr of one centre as `g[m][k]` = A[k + 1][m], from its A `[4][M1]`.
fn rot(a: &[f64], m1: usize) -> Vec<[f64; 3]> {
    (0..m1)
        .map(|m| [a[m1 + m], a[2 * m1 + m], a[3 * m1 + m]])
        .collect()
}

impl TensorHead<'_> {
    fn m1(&self) -> usize {
        self.spec.embedding_width
    }

    /// The polar's scale of type t (1 for a dipole).
    fn scale(&self, t: usize) -> f64 {
        match self.tensor {
            Tensor::Polar => self.spec.scale.get(t).copied().unwrap_or(1.0),
            Tensor::Dipole => 1.0,
        }
    }

    /// The symmetric M1×M1 matrix of a full polar, s·(y + yᵀ)/2.
    fn sym(&self, y: &[f64], s: f64) -> Vec<f64> {
        let m = self.m1();
        let mut out = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                out[i * m + j] = s * (y[i * m + j] + y[j * m + i]) / 2.0;
            }
        }
        out
    }

    /// The atomic tensor of one centre of type t from its nets' outputs y and gr g.
    fn atomic(&self, t: usize, y: &[f64], g: &[[f64; 3]]) -> Vec<f64> {
        let s = self.scale(t);
        match self.tensor {
            Tensor::Dipole => (0..3)
                .map(|k| g.iter().zip(y).map(|(gm, ym)| ym * gm[k]).sum())
                .collect(),
            Tensor::Polar => {
                let mut p = vec![0.0; 9];
                if self.spec.fit_diag {
                    for (gm, ym) in g.iter().zip(y) {
                        for a in 0..3 {
                            for b in 0..3 {
                                p[3 * a + b] += s * ym * gm[a] * gm[b];
                            }
                        }
                    }
                } else {
                    let yg = mul_rot(&self.sym(y, s), g);
                    for (gm, ygm) in g.iter().zip(&yg) {
                        for a in 0..3 {
                            for b in 0..3 {
                                p[3 * a + b] += gm[a] * ygm[b];
                            }
                        }
                    }
                }
                if self.spec.shift_diag {
                    for a in 0..3 {
                        p[4 * a] += self.diag_bias[t] * s;
                    }
                }
                p
            }
        }
    }

    /// Atomic tensors `[ncentres][size]` (centre order; zero for excluded types) and frame
    /// tensors `[nframes][size]` (their sums) from the nets' outputs `y` and A `[nc][4][M1]`.
    pub fn outputs(&self, c: &Centres, y: &[f64], a: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (k, m1) = (self.tensor.size(), self.m1());
        let dim = self.spec.dim(self.tensor);
        let mut atomic = vec![0.0; c.types.len() * k];
        let mut frame = vec![0.0; c.nframes * k];
        for (i, (&t, &f)) in c.types.iter().zip(c.frames).enumerate() {
            if self.spec.excluded(t) {
                continue;
            }
            let g = rot(&a[i * 4 * m1..(i + 1) * 4 * m1], m1);
            let v = self.atomic(t, &y[i * dim..(i + 1) * dim], &g);
            atomic[i * k..(i + 1) * k].copy_from_slice(&v);
            for (x, v) in frame[f * k..(f + 1) * k].iter_mut().zip(&v) {
                *x += v;
            }
        }
        (atomic, frame)
    }

    /// The seeds of the dual pass from ∂L/∂(atomic tensor) `da` (centre order) and ∂L/∂(frame
    /// tensor) `df`: ∂L/∂y `[ncentres][dim]` and ∂L/∂A `[ncentres][4][M1]` (row 0 zero).
    pub fn seed(
        &self,
        c: &Centres,
        y: &[f64],
        a: &[f64],
        da: &[f64],
        df: &[f64],
    ) -> (Vec<f64>, Vec<f64>) {
        let (k, m1) = (self.tensor.size(), self.m1());
        let dim = self.spec.dim(self.tensor);
        let mut ybar = vec![0.0; c.types.len() * dim];
        let mut abar = vec![0.0; c.types.len() * 4 * m1];
        for (i, (&t, &f)) in c.types.iter().zip(c.frames).enumerate() {
            if self.spec.excluded(t) {
                continue;
            }
            let pbar: Vec<f64> = (0..k).map(|j| da[i * k + j] + df[f * k + j]).collect();
            let g = rot(&a[i * 4 * m1..(i + 1) * 4 * m1], m1);
            let yi = &y[i * dim..(i + 1) * dim];
            let (yb, gbar) = self.atomic_reverse(t, yi, &g, &pbar);
            ybar[i * dim..(i + 1) * dim].copy_from_slice(&yb);
            let ab = &mut abar[i * 4 * m1..(i + 1) * 4 * m1];
            for (m, gb) in gbar.iter().enumerate() {
                for kk in 0..3 {
                    ab[(kk + 1) * m1 + m] = gb[kk];
                }
            }
        }
        (ybar, abar)
    }

    /// [`TensorHead::atomic`] backwards: (ȳ, ḡ) from the tensor's adjoint `pbar`.
    fn atomic_reverse(
        &self,
        t: usize,
        y: &[f64],
        g: &[[f64; 3]],
        pbar: &[f64],
    ) -> (Vec<f64>, Vec<[f64; 3]>) {
        let s = self.scale(t);
        match self.tensor {
            Tensor::Dipole => {
                let yb = g
                    .iter()
                    .map(|gm| (0..3).map(|k| pbar[k] * gm[k]).sum())
                    .collect();
                let gb = y
                    .iter()
                    .map(|ym| std::array::from_fn(|k| ym * pbar[k]))
                    .collect();
                (yb, gb)
            }
            Tensor::Polar => {
                // P̄ + P̄ᵀ, which both the diagonal and the full form's ∂/∂gr take.
                let ps: [f64; 9] = std::array::from_fn(|e| pbar[e] + pbar[3 * (e % 3) + e / 3]);
                let sym_times = |v: &[f64; 3]| -> [f64; 3] {
                    std::array::from_fn(|a| (0..3).map(|b| ps[3 * a + b] * v[b]).sum())
                };
                // gᵀ_m P̄ g_n.
                let bilinear = |gm: &[f64; 3], gn: &[f64; 3]| -> f64 {
                    (0..3)
                        .map(|a| (0..3).map(|b| pbar[3 * a + b] * gm[a] * gn[b]).sum::<f64>())
                        .sum()
                };
                if self.spec.fit_diag {
                    let yb = g.iter().map(|gm| s * bilinear(gm, gm)).collect();
                    let gb = (g.iter().zip(y))
                        .map(|(gm, ym)| sym_times(gm).map(|x| s * ym * x))
                        .collect();
                    (yb, gb)
                } else {
                    let m = self.m1();
                    // Ȳ = g P̄ gᵀ; ȳ = s (Ȳ + Ȳᵀ)/2.
                    let mut yb = vec![0.0; m * m];
                    for i in 0..m {
                        for j in 0..m {
                            let v = s * (bilinear(&g[i], &g[j]) + bilinear(&g[j], &g[i])) / 2.0;
                            yb[i * m + j] = v;
                        }
                    }
                    // ḡ = (Y g)(P̄ + P̄ᵀ) with Y symmetric.
                    let yg = mul_rot(&self.sym(y, s), g);
                    let gb = yg.iter().map(sym_times).collect();
                    (yb, gb)
                }
            }
        }
    }
}

/// Y g for an M1×M1 matrix Y (row-major) and gr g `[M1][3]`.
fn mul_rot(y: &[f64], g: &[[f64; 3]]) -> Vec<[f64; 3]> {
    let m = g.len();
    (0..m)
        .map(|i| std::array::from_fn(|k| (0..m).map(|j| y[i * m + j] * g[j][k]).sum()))
        .collect()
}

/// DeePMD-kit's `TensorLoss` of the atomic tensors `atomic` (`[ncentres][size]`) and frame
/// tensors `frame` (`[nframes][size]`) against `labels`, at prefactors (atomic, frame), where
/// `with_tensor` tells which centres are not excluded: the loss sums ([`NSUMS`]; a term without
/// labels NaN, and out of the loss) and ∂L/∂atomic, ∂L/∂frame. The atomic term is the mean
/// square over the centres with a tensor (an excluded one's label is not read), the frame term
/// over every frame's values.
pub fn loss(
    pref: (f64, f64),
    atomic: &[f64],
    frame: &[f64],
    labels: &HeadLabels,
    with_tensor: &[bool],
) -> ([f64; NSUMS], Vec<f64>, Vec<f64>) {
    let k = atomic.len() / with_tensor.len().max(1);
    let nframes = frame.len() / k.max(1);
    let counted = with_tensor.iter().filter(|x| **x).count();
    let mut sums = [0.0, f64::NAN, f64::NAN, counted as f64 / nframes as f64];
    let (mut da, mut df) = (vec![0.0; atomic.len()], vec![0.0; frame.len()]);
    let atom_mask: Vec<bool> = (with_tensor.iter())
        .flat_map(|&m| std::iter::repeat_n(m, k))
        .collect();
    let frame_mask = vec![true; frame.len()];
    for (slot, pred, label, pref, grad, mask) in [
        (
            1,
            atomic,
            labels.atomic.as_deref(),
            pref.0,
            &mut da,
            &atom_mask,
        ),
        (
            2,
            frame,
            labels.frame.as_deref(),
            pref.1,
            &mut df,
            &frame_mask,
        ),
    ] {
        let Some(label) = label else { continue };
        let n = mask.iter().filter(|x| **x).count() as f64;
        let mut mse = 0.0;
        for (((p, l), g), _) in
            (pred.iter().zip(label).zip(grad.iter_mut()).zip(mask)).filter(|(_, m)| **m)
        {
            mse += (p - l) * (p - l);
            *g = pref * 2.0 * (p - l) / n;
        }
        mse /= n;
        sums[slot] = mse;
        sums[0] += pref * mse;
    }
    (sums, da, df)
}

/// The metrics of tensor `t`'s loss, in lcurve.out's order.
pub fn metrics(t: Tensor) -> &'static [&'static str] {
    match t {
        Tensor::Dipole => &["rmse_global_dipole", "rmse_local_dipole"],
        Tensor::Polar => &["rmse_global_polar", "rmse_local_polar"],
    }
}

/// The metric values of loss sums `sums` (the frame term per atom with a tensor), where its
/// prefactor is non-zero: [`metrics`]'s order.
pub fn metric_values(pref: (f64, f64), sums: &[f64]) -> [Option<f64>; 2] {
    [
        (pref.1 > 0.0).then(|| sums[2].sqrt() / sums[3]),
        (pref.0 > 0.0).then(|| sums[1].sqrt()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn centres<'a>(types: &'a [usize], frames: &'a [usize]) -> Centres<'a> {
        Centres {
            types,
            frames,
            nframes: 2,
            natoms: 2,
        }
    }

    fn spec(fit_diag: bool) -> TensorSpec {
        TensorSpec {
            embedding_width: 3,
            fit_diag,
            scale: vec![1.7, 0.6],
            shift_diag: true,
            exclude_types: vec![],
        }
    }

    fn numbers(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64 + 1.0) * seed).sin()).collect()
    }

    /// ∂L/∂y and ∂L/∂A of every tensor against central differences of the whole head and loss.
    #[test]
    fn seeds_match_finite_differences() {
        let (types, frames) = ([0, 0, 1, 1], [0, 1, 0, 1]);
        let c = centres(&types, &frames);
        for (tensor, fit_diag) in [
            (Tensor::Dipole, true),
            (Tensor::Polar, true),
            (Tensor::Polar, false),
        ] {
            let s = spec(fit_diag);
            let bias = [0.4, -0.3];
            let head = TensorHead {
                tensor,
                spec: &s,
                diag_bias: &bias,
            };
            let (k, dim) = (tensor.size(), s.dim(tensor));
            let y = numbers(4 * dim, 0.37);
            let a = numbers(4 * 12, 0.91);
            let (la, lf) = (numbers(4 * k, 1.3), numbers(2 * k, 2.1));
            let labels = HeadLabels {
                frame: Some(lf.clone()),
                atomic: Some(la.clone()),
            };
            let mask = [true, true, false, true];
            let total = |y: &[f64], a: &[f64]| {
                let (at, fr) = head.outputs(&c, y, a);
                loss((0.7, 1.9), &at, &fr, &labels, &mask).0[0]
            };
            let (at, fr) = head.outputs(&c, &y, &a);
            let (_, da, df) = loss((0.7, 1.9), &at, &fr, &labels, &mask);
            let (ybar, abar) = head.seed(&c, &y, &a, &da, &df);
            let h = 1e-6;
            let fd = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
            for (i, g) in ybar.iter().enumerate() {
                let d = fd(&|e| {
                    let mut y = y.clone();
                    y[i] += e;
                    total(&y, &a)
                });
                assert!((d - g).abs() < 1e-7, "{tensor:?} y {i}: {g} vs {d}");
            }
            for (i, g) in abar.iter().enumerate() {
                let d = fd(&|e| {
                    let mut a = a.clone();
                    a[i] += e;
                    total(&y, &a)
                });
                assert!((d - g).abs() < 1e-7, "{tensor:?} A {i}: {g} vs {d}");
            }
        }
    }

    /// An excluded type's atomic tensor is zero, shift included, and adds nothing to the frame.
    #[test]
    fn excluded_types_put_out_zero() {
        let (types, frames) = ([0, 1], [0, 0]);
        let c = Centres {
            types: &types,
            frames: &frames,
            nframes: 1,
            natoms: 2,
        };
        let mut s = spec(true);
        s.exclude_types = vec![1];
        let bias = [0.4, -0.3];
        let head = TensorHead {
            tensor: Tensor::Polar,
            spec: &s,
            diag_bias: &bias,
        };
        let (y, a) = (numbers(6, 0.37), numbers(24, 0.91));
        let (at, fr) = head.outputs(&c, &y, &a);
        assert!(at[9..].iter().all(|x| *x == 0.0));
        assert!(at[..9].iter().any(|x| *x != 0.0));
        assert_eq!(&fr[..], &at[..9]);
    }
}

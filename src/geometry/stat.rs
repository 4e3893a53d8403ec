//! Input statistics DeePMD-kit computes before training: davg/dstd of the environment matrix
//! (spec §4) and the per-type energy bias by least squares (spec §7).

use super::env_row;
use super::{build_nlist, Cell};
use crate::backend::EnvParams;
use crate::model::DescriptorSpec;

/// Raw sums per centre type: `[number, sum, squared_sum]` of the radial column (`r`) and of the
/// three angular columns pooled (`a`), padded slots (exact zeros) included.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvStats {
    pub r: Vec<[f64; 3]>,
    pub a: Vec<[f64; 3]>,
}

impl EnvStats {
    pub fn new(ntypes: usize) -> Self {
        EnvStats {
            r: vec![[0.0; 3]; ntypes],
            a: vec![[0.0; 3]; ntypes],
        }
    }

    /// Adds the un-normalised environment rows of one frame (atoms sorted by type or not).
    pub fn add_frame(
        &mut self,
        d: &DescriptorSpec,
        coord: &[f64],
        cell: Option<&Cell>,
        atype: &[usize],
    ) {
        let env = EnvParams {
            rcut: d.rcut,
            rcut_smth: d.rcut_smth,
            protection: d.env_protection,
        };
        let nl = build_nlist(coord, cell, atype, d.rcut, &d.sel);
        for (i, &t) in atype.iter().enumerate() {
            for j in 0..nl.nnei {
                let s = i * nl.nnei + j;
                let row = if nl.owner[s] >= 0 {
                    env_row([nl.rij[3 * s], nl.rij[3 * s + 1], nl.rij[3 * s + 2]], &env).0
                } else {
                    [0.0; 4]
                };
                self.r[t][0] += 1.0;
                self.r[t][1] += row[0];
                self.r[t][2] += row[0] * row[0];
                for v in &row[1..] {
                    self.a[t][0] += 1.0;
                    self.a[t][1] += v;
                    self.a[t][2] += v * v;
                }
            }
        }
    }

    /// davg and dstd rows per type (`[ntypes][4]` each), with DeePMD's std protection.
    pub fn davg_dstd(&self, set_davg_zero: bool) -> (Vec<f64>, Vec<f64>) {
        let (mut davg, mut dstd) = (Vec::new(), Vec::new());
        for (r, a) in self.r.iter().zip(&self.a) {
            let avg_r = if set_davg_zero || r[0] == 0.0 {
                0.0
            } else {
                r[1] / r[0]
            };
            davg.extend([avg_r, 0.0, 0.0, 0.0]);
            let (sr, sa) = (protected_std(r), protected_std(a));
            dstd.extend([sr, sa, sa, sa]);
        }
        (davg, dstd)
    }
}

/// `StatItem.compute_std(default=1e-1, protection=1e-2)`.
fn protected_std(s: &[f64; 3]) -> f64 {
    if s[0] == 0.0 {
        return 0.1;
    }
    let avg = s[1] / s[0];
    let std = (s[2] / s[0] - avg * avg).max(0.0).sqrt();
    if std < 1e-2 {
        1e-2
    } else {
        std
    }
}

/// Minimum-norm least-squares solution of `counts · bias = energy` (numpy's `lstsq`), where
/// `counts` is `[nframes][ntypes]`. Returns the bias per type and the std of the residual.
pub fn energy_bias(counts: &[Vec<f64>], energy: &[f64]) -> (Vec<f64>, f64) {
    let nt = counts.first().map_or(0, |c| c.len());
    // Normal matrix AᵀA and Aᵀy; its eigenvectors with non-negligible eigenvalues span the row
    // space of A, and projecting onto them gives the pseudo-inverse (minimum-norm) solution.
    let mut m = vec![vec![0.0; nt]; nt];
    let mut aty = vec![0.0; nt];
    for (row, &y) in counts.iter().zip(energy) {
        for i in 0..nt {
            aty[i] += row[i] * y;
            for j in 0..nt {
                m[i][j] += row[i] * row[j];
            }
        }
    }
    let (vals, vecs) = jacobi_eigen(m);
    let lmax = vals.iter().cloned().fold(0.0, f64::max);
    let tol = lmax * (f64::EPSILON * counts.len().max(nt) as f64).powi(2);
    let mut bias = vec![0.0; nt];
    for (k, &l) in vals.iter().enumerate() {
        if l > tol {
            let c = (0..nt).map(|i| vecs[i][k] * aty[i]).sum::<f64>() / l;
            for i in 0..nt {
                bias[i] += c * vecs[i][k];
            }
        }
    }
    let res: Vec<f64> = counts
        .iter()
        .zip(energy)
        .map(|(row, &y)| y - row.iter().zip(&bias).map(|(a, b)| a * b).sum::<f64>())
        .collect();
    let mean = res.iter().sum::<f64>() / res.len().max(1) as f64;
    let std =
        (res.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / res.len().max(1) as f64).sqrt();
    (bias, std)
}

/// Eigen-decomposition of a small symmetric matrix by cyclic Jacobi rotations; returns the
/// eigenvalues and the eigenvectors as columns.
fn jacobi_eigen(mut a: Vec<Vec<f64>>) -> (Vec<f64>, Vec<Vec<f64>>) {
    let n = a.len();
    let mut v: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..n).map(|j| f64::from(u8::from(i == j))).collect())
        .collect();
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i][j] * a[i][j])
            .sum();
        if off < 1e-30 * (0..n).map(|i| a[i][i] * a[i][i]).sum::<f64>().max(1e-300) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                if a[p][q] == 0.0 {
                    continue;
                }
                let theta = (a[q][q] - a[p][p]) / (2.0 * a[p][q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                // A ← Jᵀ A J and V ← V J, J the rotation in the (p, q) plane.
                for row in a.iter_mut().chain(v.iter_mut()) {
                    let (xp, xq) = (row[p], row[q]);
                    row[p] = c * xp - s * xq;
                    row[q] = s * xp + c * xq;
                }
                let (rp, rq) = (a[p].clone(), a[q].clone());
                for (k, (x, y)) in rp.iter().zip(&rq).enumerate() {
                    a[p][k] = c * x - s * y;
                    a[q][k] = s * x + c * y;
                }
            }
        }
    }
    ((0..n).map(|i| a[i][i]).collect(), v)
}

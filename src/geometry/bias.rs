//! The per-type energy bias as DeePMD-kit 3.2.0 computes it (docs/deepmd-spec.md §7; `utils/out_stat.py:
//! compute_stats_from_redu`): `numpy.linalg.lstsq(natoms, energy, rcond=None)` over one row per
//! statistics frame, then the std of the residual.
//!
//! When every frame has the same composition (or the compositions are linearly dependent) the
//! problem is rank-deficient and only the minimum-norm solution is DeePMD-kit's; any other
//! solution gives the same energies for the training compositions but different ones for every
//! other composition. So the solve is an SVD of the count matrix with numpy's cut-off
//! `σ ≤ eps·max(nframes, ntypes)·σ_max`, never the normal equations: squaring the matrix turns
//! its exact null directions into eigenvalues of rounding size that no cut-off separates
//! reliably.

/// Minimum-norm least-squares solution of `counts · bias = energy` (numpy's `lstsq` with
/// `rcond=None`), where `counts` is `[nframes][ntypes]`. Returns the bias per type and the
/// (population) std of the residual over frames.
pub fn energy_bias(counts: &[Vec<f64>], energy: &[f64]) -> (Vec<f64>, f64) {
    let nt = counts.first().map_or(0, |c| c.len());
    let bias = min_norm_lstsq(counts, energy, nt);
    let res: Vec<f64> = counts
        .iter()
        .zip(energy)
        .map(|(row, &y)| y - row.iter().zip(&bias).map(|(a, b)| a * b).sum::<f64>())
        .collect();
    let nf = res.len().max(1) as f64;
    let mean = res.iter().sum::<f64>() / nf;
    let std = (res.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / nf).sqrt();
    (bias, std)
}

fn min_norm_lstsq(rows: &[Vec<f64>], y: &[f64], nt: usize) -> Vec<f64> {
    // Frames of one composition are one row, weighted: Σ_f (n·b − y_f)² = m (n·b − ȳ)² + const,
    // with the same singular values, so the same minimisers and cut-off, and a single
    // composition is exactly rank 1 instead of numerically so.
    let mut groups: Vec<(&[f64], f64, f64)> = Vec::new(); // (counts, frames, Σ y)
    for (row, &e) in rows.iter().zip(y) {
        match groups.iter_mut().find(|g| g.0 == row.as_slice()) {
            Some(g) => {
                g.1 += 1.0;
                g.2 += e;
            }
            None => groups.push((row, 1.0, e)),
        }
    }
    let w: Vec<Vec<f64>> = groups
        .iter()
        .map(|(n, m, _)| n.iter().map(|x| x * m.sqrt()).collect())
        .collect();
    let wy: Vec<f64> = groups.iter().map(|(_, m, s)| s / m.sqrt()).collect();
    let cutoff = f64::EPSILON * rows.len().max(nt) as f64;
    let mut bias = vec![0.0; nt];
    if groups.len() < nt {
        // Aᵀ = G Vᵀ with G's columns the rotated rows of A, so A = V Gᵀ: b = Σ_k g_k (v_k·y) / σ_k².
        let svd = one_sided_jacobi(w);
        for (g, v, s2) in svd.kept(cutoff) {
            let c = v.iter().zip(&wy).map(|(a, b)| a * b).sum::<f64>() / s2;
            for (b, x) in bias.iter_mut().zip(g) {
                *b += c * x;
            }
        }
    } else {
        // A = G Vᵀ with G's columns the rotated columns of A: b = Σ_k v_k (g_k·y) / σ_k².
        let cols: Vec<Vec<f64>> = (0..nt).map(|t| w.iter().map(|r| r[t]).collect()).collect();
        let svd = one_sided_jacobi(cols);
        for (g, v, s2) in svd.kept(cutoff) {
            let c = g.iter().zip(&wy).map(|(a, b)| a * b).sum::<f64>() / s2;
            for (b, x) in bias.iter_mut().zip(v) {
                *b += c * x;
            }
        }
    }
    bias
}

/// `M = G Vᵀ` for the matrix whose columns were given: G's columns are mutually orthogonal
/// (their norms are the singular values), V is orthogonal.
struct Svd {
    g: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

impl Svd {
    /// `(g_k, v_k, σ_k²)` for the singular values above `rcond·σ_max`.
    fn kept(&self, rcond: f64) -> impl Iterator<Item = (&[f64], &[f64], f64)> {
        let s2: Vec<f64> = self.g.iter().map(|g| dot(g, g)).collect();
        let max = s2.iter().copied().fold(0.0, f64::max);
        let cut = rcond * rcond * max;
        self.g
            .iter()
            .zip(&self.v)
            .zip(s2)
            .filter(move |&(_, s2)| s2 > cut && s2 > 0.0)
            .map(|((g, v), s2)| (g.as_slice(), v.as_slice(), s2))
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Hestenes' one-sided Jacobi SVD: plane rotations of column pairs until all are orthogonal;
/// accurate to rounding relative to each singular value, which is what the cut-off needs.
fn one_sided_jacobi(mut g: Vec<Vec<f64>>) -> Svd {
    let q = g.len();
    let mut v: Vec<Vec<f64>> = (0..q)
        .map(|i| (0..q).map(|j| f64::from(u8::from(i == j))).collect())
        .collect();
    for _sweep in 0..60 {
        let mut rotated = false;
        for i in 0..q {
            for j in i + 1..q {
                let (a, b, c) = (dot(&g[i], &g[i]), dot(&g[j], &g[j]), dot(&g[i], &g[j]));
                if c == 0.0 || c.abs() <= f64::EPSILON * (a * b).sqrt() {
                    continue;
                }
                rotated = true;
                let zeta = (b - a) / (2.0 * c);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let cs = 1.0 / (1.0 + t * t).sqrt();
                let sn = cs * t;
                for m in [&mut g, &mut v] {
                    let (lo, hi) = m.split_at_mut(j);
                    for (x, y) in lo[i].iter_mut().zip(hi[0].iter_mut()) {
                        let (xi, yj) = (*x, *y);
                        *x = cs * xi - sn * yj;
                        *y = sn * xi + cs * yj;
                    }
                }
            }
        }
        if !rotated {
            break;
        }
    }
    Svd { g, v }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_composition_is_proportional_to_it() {
        let n = [65.0, 32.0, 11.0];
        let counts = vec![n.to_vec(); 7];
        let energy = [22.1, 22.9, 23.4, 22.0, 22.6, 23.1, 22.8];
        let (bias, _) = energy_bias(&counts, &energy);
        let mean = energy.iter().sum::<f64>() / 7.0;
        let nn = n.iter().map(|x| x * x).sum::<f64>();
        for (b, x) in bias.iter().zip(n) {
            assert!((b - x * mean / nn).abs() < 1e-15, "{bias:?}");
        }
    }

    #[test]
    fn dependent_compositions_and_absent_types_take_the_minimum_norm() {
        // Rows (2,4,0) and (1,2,0): rank 1, type 2 absent. Min-norm: along (1,2,0).
        let counts = vec![
            vec![2.0, 4.0, 0.0],
            vec![1.0, 2.0, 0.0],
            vec![2.0, 4.0, 0.0],
        ];
        let energy = [10.0, 5.0, 10.0];
        let (bias, std) = energy_bias(&counts, &energy);
        assert!((bias[0] - 1.0).abs() < 1e-14 && (bias[1] - 2.0).abs() < 1e-14);
        assert_eq!(bias[2], 0.0);
        assert!(std < 1e-14);
    }
}

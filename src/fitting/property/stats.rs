//! The property's output statistics: DeePMD-kit's `compute_output_stats` of a property
//! (`compute_stats_from_redu`, or `compute_stats_do_not_distinguish_types` without
//! `distinguish_types`) over the statistics frames: a bias and a std per type and component.

use crate::geometry::energy_bias;

use super::PropertySpec;

/// `(out_bias, out_std)`, each `[ntypes][task_dim]`, from each frame's type counts `counts`
/// (`[nframes][ntypes]`) and label `labels` (`[nframes][task_dim]`).
pub fn out_stats(p: &PropertySpec, counts: &[Vec<f64>], labels: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (k, nt) = (p.task_dim, counts.first().map_or(0, Vec::len));
    let atoms = |c: &Vec<f64>| c.iter().sum::<f64>();
    let column = |j: usize| labels.iter().skip(j).step_by(k).copied();
    let (mut bias, mut std) = (vec![0.0; nt * k], vec![0.0; nt * k]);
    for j in 0..k {
        let (b, s) = if p.distinguish_types {
            // Least squares over the type counts (fractions where intensive).
            let rows: Vec<Vec<f64>> = match p.intensive {
                true => (counts.iter())
                    .map(|c| c.iter().map(|n| n / atoms(c)).collect())
                    .collect(),
                false => counts.to_vec(),
            };
            energy_bias(&rows, &column(j).collect::<Vec<_>>())
        } else {
            // The mean and std of the frame values (per atom where extensive), every type alike.
            let y: Vec<f64> = (column(j).zip(counts))
                .map(|(y, c)| if p.intensive { y } else { y / atoms(c) })
                .collect();
            let n = y.len().max(1) as f64;
            let mean = y.iter().sum::<f64>() / n;
            let var = y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            (vec![mean; nt], var.sqrt())
        };
        for t in 0..nt {
            bias[t * k + j] = b[t];
            std[t * k + j] = s;
        }
    }
    (bias, std)
}

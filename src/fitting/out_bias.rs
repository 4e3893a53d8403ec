//! The output bias of the DOS and tensor fittings: DeePMD-kit's `compute_output_stats`
//! (docs/deepmd-spec.md §16, §17): from atomic labels where the statistics frames have them (the
//! mean per type, `compute_stats_from_atomic`), the types they lack from the frame labels (least
//! squares over the type counts of the types not excluded, `compute_stats_from_redu`; an
//! excluded type's bias 0).

use crate::geometry::energy_bias;

/// The statistics frames' labels, gathered per kind.
#[derive(Default)]
pub struct Samples {
    /// Frames with a frame DOS: their type counts `[ntypes]` and labels `[k]`.
    pub counts: Vec<Vec<f64>>,
    pub frame: Vec<f64>,
    /// Atoms of frames with an atomic DOS: each atom's type, and its label `[k]`.
    pub atom_types: Vec<usize>,
    pub atomic: Vec<f64>,
}

/// The output bias `[ntypes][k]` of label `name` with types `exclude` excluded; an error where
/// neither kind of label gives a type one.
pub fn out_bias(
    s: &Samples,
    ntypes: usize,
    k: usize,
    exclude: &[usize],
    name: &str,
) -> Result<Vec<f64>, String> {
    let mut bias = vec![f64::NAN; ntypes * k];
    if !s.atom_types.is_empty() {
        for t in 0..ntypes {
            let rows: Vec<&[f64]> = (s.atom_types.iter().zip(s.atomic.chunks_exact(k)))
                .filter(|(&a, _)| a == t)
                .map(|(_, r)| r)
                .collect();
            if rows.is_empty() {
                continue;
            }
            for j in 0..k {
                bias[t * k + j] = rows.iter().map(|r| r[j]).sum::<f64>() / rows.len() as f64;
            }
        }
    }
    if bias.iter().any(|b| b.is_nan()) && !s.counts.is_empty() {
        let kept: Vec<usize> = (0..ntypes).filter(|t| !exclude.contains(t)).collect();
        let counts: Vec<Vec<f64>> = (s.counts.iter())
            .map(|c| kept.iter().map(|&t| c[t]).collect())
            .collect();
        for j in 0..k {
            let y: Vec<f64> = s.frame.iter().skip(j).step_by(k).copied().collect();
            let (b, _) = energy_bias(&counts, &y);
            for t in 0..ntypes {
                if bias[t * k + j].is_nan() {
                    bias[t * k + j] = kept.iter().position(|&u| u == t).map_or(0.0, |i| b[i]);
                }
            }
        }
    }
    match bias.iter().position(|b| b.is_nan()) {
        Some(i) => Err(format!(
            "no statistics frame gives type {} a {name} bias (neither {name}.npy nor \
             atom_{name}.npy covers it)",
            i / k
        )),
        None => Ok(bias),
    }
}

//! The DOS's output bias: DeePMD-kit's `compute_output_stats` of the `dos` key
//! (docs/deepmd-spec.md §16): from atomic labels where the statistics frames have them (the mean
//! per type, `compute_stats_from_atomic`), the types they lack from the frame labels (least
//! squares over the type counts, `compute_stats_from_redu`).

use crate::geometry::energy_bias;

/// The statistics frames' labels, gathered per kind.
#[derive(Default)]
pub struct DosSamples {
    /// Frames with a frame DOS: their type counts `[ntypes]` and labels `[k]`.
    pub counts: Vec<Vec<f64>>,
    pub frame: Vec<f64>,
    /// Atoms of frames with an atomic DOS: each atom's type, and its label `[k]`.
    pub atom_types: Vec<usize>,
    pub atomic: Vec<f64>,
}

/// The output bias `[ntypes][k]`; an error where neither kind of label gives a type one.
pub fn out_bias(s: &DosSamples, ntypes: usize, k: usize) -> Result<Vec<f64>, String> {
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
        for j in 0..k {
            let y: Vec<f64> = s.frame.iter().skip(j).step_by(k).copied().collect();
            let (b, _) = energy_bias(&s.counts, &y);
            for t in 0..ntypes {
                if bias[t * k + j].is_nan() {
                    bias[t * k + j] = b[t];
                }
            }
        }
    }
    match bias.iter().position(|b| b.is_nan()) {
        Some(i) => Err(format!(
            "no statistics frame gives type {} a DOS bias (neither dos.npy nor atom_dos.npy \
             covers it)",
            i / k
        )),
        None => Ok(bias),
    }
}

//! Input statistics DeePMD-kit computes before training: davg/dstd of the environment matrix
//! (docs/deepmd-spec.md §4); the per-type energy bias is in `bias.rs`.

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
        self.add_rows(atype, &frame_rows(d, coord, cell, atype));
    }

    /// Adds rows from [`frame_rows`]: split from it so frames can be computed in parallel and
    /// still be summed in one fixed order (the same sums bit for bit).
    pub fn add_rows(&mut self, atype: &[usize], rows: &[[f64; 4]]) {
        let nnei = rows.len() / atype.len().max(1);
        for (i, &t) in atype.iter().enumerate() {
            for row in &rows[i * nnei..(i + 1) * nnei] {
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

/// The un-normalised environment rows of one frame, `[natoms][nnei]`, zero where a slot is
/// empty.
pub fn frame_rows(
    d: &DescriptorSpec,
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
) -> Vec<[f64; 4]> {
    let env = EnvParams {
        rcut: d.rcut,
        rcut_smth: d.rcut_smth,
        protection: d.env_protection,
    };
    let nl = build_nlist(coord, cell, atype, d.rcut, &d.sel);
    (0..atype.len() * nl.nnei)
        .map(|s| {
            if nl.owner[s] >= 0 {
                env_row([nl.rij[3 * s], nl.rij[3 * s + 1], nl.rij[3 * s + 2]], &env).0
            } else {
                [0.0; 4]
            }
        })
        .collect()
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

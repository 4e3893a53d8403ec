//! Input statistics DeePMD-kit computes before training: davg/dstd of the environment matrix
//! (docs/deepmd-spec.md §4); the per-type energy bias is in `bias.rs`.

use super::env_row::env_value;
use super::{visit_nlist, visit_nlist_mixed, Cell};
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
        self.add_rows(&frame_rows(d, coord, cell, atype));
    }

    /// Adds rows from [`frame_rows`]: split from it so frames can be computed in parallel and
    /// still be summed in one fixed order (the same sums bit for bit). A padded slot's row is
    /// exact zeros, which leave a sum unchanged (the sums are never −0), so only its count is
    /// added, in one step (counts are exact integers).
    pub fn add_rows(&mut self, rows: &FrameRows) {
        for (t, (rows, &slots)) in rows.rows.iter().zip(&rows.slots).enumerate() {
            let (r, a) = (&mut self.r[t], &mut self.a[t]);
            r[0] += slots as f64;
            a[0] += 3.0 * slots as f64;
            for row in rows {
                r[1] += row[0];
                r[2] += row[0] * row[0];
                for v in &row[1..] {
                    a[1] += v;
                    a[2] += v * v;
                }
            }
        }
    }

    /// Adds another's sums: how DeePMD-kit's `share_params` merges the statistics of the
    /// tasks sharing a descriptor.
    pub fn add(&mut self, other: &EnvStats) {
        let pairs = (self.r.iter_mut().zip(&other.r)).chain(self.a.iter_mut().zip(&other.a));
        for (mine, theirs) in pairs {
            for (x, y) in mine.iter_mut().zip(theirs) {
                *x += y;
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
            let (sr, sa) = (protected_std(r, 1e-2), protected_std(a, 1e-2));
            dstd.extend([sr, sa, sa, sa]);
        }
        (davg, dstd)
    }
}

/// The un-normalised environment rows of one frame's neighbour slots, per centre type.
#[derive(Clone, Debug, Default)]
pub struct FrameRows {
    /// Per centre type, the rows of its atoms' filled slots in atom then slot order.
    rows: Vec<Vec<[f64; 4]>>,
    /// Per centre type, its atoms' slots, padded ones included.
    slots: Vec<usize>,
    /// What the neighbour search saw on the way, for the neighbour statistics of the same pass:
    /// the largest neighbour count per type inside rcut and the smallest pair distance.
    pub max_count: Vec<usize>,
    pub min_dist: f64,
}

/// The environment rows of one frame, atoms in `atype`'s order. A mixed-type descriptor (DPA-1)
/// has one list of nnei slots per atom, all neighbour types together, so its rows are per
/// centre type over all its neighbours (DeePMD-kit's `compute_input_stats` of se_atten), and
/// `max_count` has one entry, the largest count of all types together.
pub fn frame_rows(
    d: &DescriptorSpec,
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
) -> FrameRows {
    let env = d.env();
    let nnei: usize = d.sel.iter().sum();
    let ntypes = atype.iter().max().map_or(0, |&t| t + 1);
    let mut out = FrameRows {
        rows: vec![Vec::new(); ntypes],
        slots: vec![0; ntypes],
        ..FrameRows::default()
    };
    if d.is_mixed() {
        let (max, min_dist) = visit_nlist_mixed(coord, cell, d.rcut, nnei, |i, kept| {
            let t = atype[i];
            out.slots[t] += nnei;
            let real = kept.iter().filter(|&&(j, _)| !d.excludes(t, atype[j]));
            out.rows[t].extend(real.map(|&(_, x)| env_value(x, &env)));
        });
        (out.max_count, out.min_dist) = (vec![max], min_dist);
        return out;
    }
    (out.max_count, out.min_dist) = visit_nlist(coord, cell, atype, d.rcut, &d.sel, |i, kept| {
        let t = atype[i];
        out.slots[t] += nnei;
        for list in kept {
            out.rows[t].extend(list.iter().map(|&(_, x)| env_value(x, &env)));
        }
    });
    out
}

/// DeePMD-kit's `StatItem.compute_std(default=1e-1, protection)` of `[number, sum,
/// squared_sum]`: the environment matrix's with protection 1e-2, the fitting's input
/// statistics with the model's `data_stat_protect`.
pub fn protected_std(s: &[f64; 3], protection: f64) -> f64 {
    if s[0] == 0.0 {
        return 0.1;
    }
    let avg = s[1] / s[0];
    let std = (s[2] / s[0] - avg * avg).max(0.0).sqrt();
    if std < protection {
        protection
    } else {
        std
    }
}

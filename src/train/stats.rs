//! What `dp train` computes from the data before the first step: the neighbour statistics that
//! turn `sel: "auto"` into numbers (docs/deepmd-spec.md §2 item 5), and the davg/dstd and energy-bias statistics
//! over `data_stat_nbatch` batches per training system (docs/deepmd-spec.md §4, §7).

use std::sync::Arc;

use anyhow::Result;
use rayon::prelude::*;

use crate::data::{Sampler, System, SystemInfo};
use crate::geometry::{energy_bias, frame_rows, Cell, EnvStats, FrameRows, ImageGrid};
use crate::model::DescriptorSpec;

use super::dataset::{phase_bar, window, DataSet};

/// Largest number of neighbours of each type inside rcut over all frames, and the smallest
/// pair distance seen.
#[derive(Clone, Debug, PartialEq)]
pub struct NeighborStats {
    pub max_count: Vec<usize>,
    pub min_dist: f64,
    pub nframes: usize,
}

fn cell_of(sys: &System, f: usize) -> Option<Cell> {
    sys.frame_cell(f).and_then(Cell::new)
}

/// Per type, the largest number of neighbours of that type any atom of the frame has within
/// `rcut` (all periodic images), and the smallest pair distance.
fn frame_counts(sys: &System, f: usize, ntypes: usize, rcut: f64) -> (Vec<usize>, f64) {
    let cell = cell_of(sys, f);
    let pos: Vec<[f64; 3]> = sys
        .frame_coord(f)
        .chunks_exact(3)
        .map(|r| {
            let r = [r[0], r[1], r[2]];
            cell.as_ref().map_or(r, |c| c.wrap(r))
        })
        .collect();
    let grid = ImageGrid::new(&pos, cell.as_ref(), rcut);
    let rc2 = rcut * rcut;
    let mut max_count = vec![0usize; ntypes];
    let mut min_d2 = f64::INFINITY;
    let mut count = vec![0usize; ntypes];
    for i in 0..pos.len() {
        count.fill(0);
        min_d2 = min_d2.min(grid.count(i, rc2, &sys.atype, &mut count));
        for (m, &c) in max_count.iter_mut().zip(&count) {
            *m = (*m).max(c);
        }
    }
    (max_count, min_d2.sqrt())
}

/// Neighbour statistics over every frame of the data (DeePMD-kit's `NeighborStat`), systems
/// read a window at a time and their frames counted in parallel.
pub fn neighbor_stats(data: &DataSet, ntypes: usize, rcut: f64) -> Result<NeighborStats> {
    let (ns, _) = scan(data, ntypes, Some(rcut), None, "neighbour statistics")?;
    Ok(ns.expect("counted"))
}

/// `sel` from neighbour counts as DeePMD-kit's `wrap_up_4(count * factor)` computes it:
/// `4 * ((int(count * factor) + 3) // 4)`.
pub fn auto_sel(max_count: &[usize], factor: f64) -> Vec<usize> {
    max_count
        .iter()
        .map(|&c| {
            let x = (c as f64 * factor).floor() as usize;
            4 * x.div_ceil(4)
        })
        .collect()
}

/// Frames used for the statistics: `nbatch` batches drawn from each training system's own
/// shuffled stream (batch size of that system), like DeePMD-kit's `make_stat_input`.
pub fn stat_frames(
    systems: &[SystemInfo],
    batch_sizes: &[usize],
    nbatch: usize,
    seed: u64,
) -> Vec<Vec<usize>> {
    systems
        .iter()
        .zip(batch_sizes)
        .enumerate()
        .map(|(i, (sys, &bs))| {
            let mut s = Sampler::new(
                &[sys.nframes],
                &[bs],
                vec![1.0],
                seed.wrapping_add(i as u64),
            );
            (0..nbatch).flat_map(|_| s.next_batch().1).collect()
        })
        .collect()
}

/// The statistics a model starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct DataStats {
    pub davg: Vec<f64>,
    pub dstd: Vec<f64>,
    pub bias: Vec<f64>,
    pub out_std: Vec<f64>,
    pub nframes: usize,
}

/// davg/dstd (environment matrix) and the least-squares energy bias (one row per frame) over
/// the given frames of each system.
pub fn data_stats(
    d: &DescriptorSpec,
    ntypes: usize,
    data: &DataSet,
    frames: &[Vec<usize>],
) -> Result<DataStats> {
    let (_, st) = scan(data, ntypes, None, Some((d, frames)), "data statistics")?;
    Ok(st.expect("summed"))
}

/// [`neighbor_stats`] and [`data_stats`] (with `d.rcut`) in one pass over the data: each system
/// is read once, and a statistics frame's neighbour list gives its neighbour counts too.
pub fn neighbor_and_data_stats(
    d: &DescriptorSpec,
    ntypes: usize,
    data: &DataSet,
    frames: &[Vec<usize>],
) -> Result<(NeighborStats, DataStats)> {
    let (ns, st) = scan(data, ntypes, Some(d.rcut), Some((d, frames)), "statistics")?;
    Ok((ns.expect("counted"), st.expect("summed")))
}

/// What the pass computes for one frame.
enum FrameStat {
    /// Neighbour counts only: the largest count per type and the smallest pair distance.
    Counts(Vec<usize>, f64),
    /// A statistics frame's environment rows (with its counts).
    Rows(FrameRows),
}

impl FrameStat {
    fn counts(&self) -> (&[usize], f64) {
        match self {
            FrameStat::Counts(c, d) => (c, *d),
            FrameStat::Rows(r) => (&r.max_count, r.min_dist),
        }
    }
}

/// One system's frames in the pass: its `FrameStat` per frame (`None` for frames neither
/// counted nor in the statistics).
type SystemStats = (usize, Arc<System>, Vec<Option<FrameStat>>);

/// The pass over the data behind the start-up statistics: with `count` (an rcut), the neighbour
/// statistics over every frame; with `stat`, the environment rows of the given frames of each
/// system, summed in system and frame order (so the result does not depend on the number of
/// threads), and the energy bias. Systems are read a window at a time and their frames computed
/// in parallel; the sums of one window run beside the frames of the next.
fn scan(
    data: &DataSet,
    ntypes: usize,
    count: Option<f64>,
    stat: Option<(&DescriptorSpec, &[Vec<usize>])>,
    what: &str,
) -> Result<(Option<NeighborStats>, Option<DataStats>)> {
    let mut max_count = vec![0; ntypes];
    let mut min_dist = f64::INFINITY;
    let mut env = EnvStats::new(ntypes);
    let (mut counts, mut energy) = (Vec::new(), Vec::new());
    let bar = phase_bar(data.systems.len(), what);
    let all: Vec<usize> = (0..data.systems.len()).collect();
    let frames_of = |chunk: &[usize]| -> Result<Vec<SystemStats>> {
        let systems = chunk
            .par_iter()
            .map(|&s| data.system(s))
            .collect::<Result<Vec<_>>>()?;
        // Per frame of the window: whether it is a statistics frame, or only counted.
        let mut jobs = Vec::new();
        for (k, (&s, sys)) in chunk.iter().zip(&systems).enumerate() {
            let mut rows = vec![false; sys.nframes];
            if let Some((_, frames)) = stat {
                for &f in &frames[s] {
                    rows[f] = true;
                }
            }
            jobs.extend(
                (0..sys.nframes)
                    .filter(|&f| rows[f] || count.is_some())
                    .map(|f| (k, f, rows[f])),
            );
        }
        let done: Vec<FrameStat> = jobs
            .par_iter()
            .map(|&(k, f, rows)| {
                let sys = &systems[k];
                match stat {
                    Some((d, _)) if rows => FrameStat::Rows(frame_rows(
                        d,
                        sys.frame_coord(f),
                        cell_of(sys, f).as_ref(),
                        &sys.atype,
                    )),
                    _ => {
                        let rcut = count.expect("a frame only counted");
                        let (c, m) = frame_counts(sys, f, ntypes, rcut);
                        FrameStat::Counts(c, m)
                    }
                }
            })
            .collect();
        let mut out: Vec<SystemStats> = chunk
            .iter()
            .zip(systems)
            .map(|(&s, sys)| {
                let none = (0..sys.nframes).map(|_| None).collect();
                (s, sys, none)
            })
            .collect();
        for (&(k, f, _), r) in jobs.iter().zip(done) {
            out[k].2[f] = Some(r);
        }
        Ok(out)
    };
    let mut add = |window: Vec<SystemStats>| {
        for (s, sys, per_frame) in window {
            if count.is_some() {
                // Maxima and minima: the same whatever the order.
                for (c, m) in per_frame.iter().flatten().map(FrameStat::counts) {
                    for (mc, &c) in max_count.iter_mut().zip(c) {
                        *mc = (*mc).max(c);
                    }
                    min_dist = min_dist.min(m);
                }
            }
            if let Some((_, frames)) = stat {
                let c: Vec<f64> = sys.type_counts(ntypes).iter().map(|&n| n as f64).collect();
                for &f in &frames[s] {
                    let Some(FrameStat::Rows(r)) = &per_frame[f] else {
                        unreachable!("statistics frames have rows");
                    };
                    env.add_rows(r);
                    counts.push(c.clone());
                    energy.push(sys.energy[f]);
                }
            }
            bar.inc(1);
        }
    };
    let mut pending = None;
    for chunk in all.chunks(window()) {
        let (next, ()) = rayon::join(
            || frames_of(chunk),
            || {
                if let Some(w) = pending.take() {
                    add(w)
                }
            },
        );
        pending = Some(next?);
    }
    if let Some(w) = pending {
        add(w);
    }
    bar.finish_and_clear();
    let neighbours = count.map(|_| NeighborStats {
        max_count,
        min_dist,
        nframes: data.systems.iter().map(|s| s.nframes).sum(),
    });
    let stats = stat.map(|(d, _)| {
        let (davg, dstd) = env.davg_dstd(d.set_davg_zero);
        let (bias, std) = energy_bias(&counts, &energy);
        DataStats {
            davg,
            dstd,
            bias,
            out_std: vec![std; ntypes],
            nframes: energy.len(),
        }
    });
    Ok((neighbours, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_up_4_like_deepmd() {
        // water, rcut 6: counts [38, 72] → [44, 80] with the default factor 1.1
        assert_eq!(auto_sel(&[38, 72], 1.1), vec![44, 80]);
        assert_eq!(auto_sel(&[40, 0], 1.0), vec![40, 0]);
        // int(40.5) = 40 → 40 (DeePMD truncates before rounding up to 4)
        assert_eq!(auto_sel(&[27], 1.5), vec![40]);
        assert_eq!(auto_sel(&[41], 1.0), vec![44]);
    }
}

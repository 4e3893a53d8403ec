//! What `dp train` computes from the data before the first step: the neighbour statistics that
//! turn `sel: "auto"` into numbers (docs/deepmd-spec.md §2 item 5), and the davg/dstd and energy-bias statistics
//! over `data_stat_nbatch` batches per training system (docs/deepmd-spec.md §4, §7).

use std::sync::Arc;

use anyhow::Result;
use rayon::prelude::*;

use crate::config::DataConfig;
use crate::data::{keep_open, Files, Labels, Sampler, System, SystemInfo};
use crate::fitting::out_bias::{out_bias, Samples};
use crate::fitting::property::stats::out_stats;
use crate::fitting::property::PropertySpec;
use crate::geometry::{
    energy_bias, frame_rows, protected_std, Cell, EnvStats, FrameRows, ImageGrid,
};
use crate::model::{DescriptorSpec, FittingSpec};

use super::dataset::{load_data_visiting, phase_bar, window, DataSet, Kept};

/// Largest number of neighbours of each type inside rcut over all frames, and the smallest
/// pair distance seen.
#[derive(Clone, Debug, PartialEq)]
pub struct NeighborStats {
    /// Per type; for a mixed-type count one entry, the largest number of neighbours of all
    /// types together (DeePMD-kit's `NeighborStat` with `mixed_type`), which is not the sum of
    /// the per-type maxima: those are reached at different atoms.
    pub max_count: Vec<usize>,
    pub min_dist: f64,
    pub nframes: usize,
}

fn cell_of(sys: &System, f: usize) -> Option<Cell> {
    sys.frame_cell(f).and_then(Cell::new)
}

/// Per type, the largest number of neighbours of that type any atom of the frame has within
/// `rcut` (all periodic images), and the smallest pair distance; `mixed`: one entry, the largest
/// number of neighbours of any type.
fn frame_counts(
    sys: &System,
    f: usize,
    ntypes: usize,
    rcut: f64,
    mixed: bool,
) -> (Vec<usize>, f64) {
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
    let mut max_count = vec![0usize; if mixed { 1 } else { ntypes }];
    let mut min_d2 = f64::INFINITY;
    let mut count = vec![0usize; ntypes];
    for i in 0..pos.len() {
        count.fill(0);
        min_d2 = min_d2.min(grid.count(i, rc2, sys.frame_atype(f), &mut count));
        if mixed {
            max_count[0] = max_count[0].max(count.iter().sum());
        } else {
            for (m, &c) in max_count.iter_mut().zip(&count) {
                *m = (*m).max(c);
            }
        }
    }
    (max_count, min_d2.sqrt())
}

/// Neighbour statistics over every frame of the data (DeePMD-kit's `NeighborStat`; `mixed`:
/// its mixed-type count), systems read a window at a time and their frames counted in parallel.
pub fn neighbor_stats(
    data: &DataSet,
    ntypes: usize,
    rcut: f64,
    mixed: bool,
) -> Result<NeighborStats> {
    let pass = Pass {
        ntypes,
        count: Some(rcut),
        mixed,
        stat: None,
    };
    let (ns, _) = scan(pass, data, &[], "neighbour statistics")?;
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
        .map(|(i, (sys, &bs))| system_stat_frames(i, sys.nframes, bs, nbatch, seed))
        .collect()
}

/// [`stat_frames`] of training system `i` (of `nframes` frames, batch size `bs`).
fn system_stat_frames(i: usize, nframes: usize, bs: usize, nbatch: usize, seed: u64) -> Vec<usize> {
    let mut s = Sampler::new(&[nframes], &[bs], vec![1.0], seed.wrapping_add(i as u64));
    (0..nbatch).flat_map(|_| s.next_batch().1).collect()
}

/// The sums behind DeePMD-kit's input statistics of the fitting's frame and atomic parameters
/// (`GeneralFitting.compute_input_stats`) over the statistics frames `frames` of each system:
/// per parameter its StatItem (rows, Σx, Σx²); fparam's (a row per frame, the model's
/// `default_fparam` for a system without fparam.npy) then aparam's (a row per atom).
/// [`fit_input_norm`] makes the statistics.
pub fn fit_input_sums(
    fit: &FittingSpec,
    data: &DataSet,
    frames: &[Vec<usize>],
) -> Result<Vec<[f64; 3]>> {
    let (nfp, nap) = (fit.numb_fparam, fit.numb_aparam);
    // Per column: rows, Σx, Σx² (DeePMD-kit's StatItem).
    let mut sums = vec![[0.0f64; 3]; nfp + nap];
    let mut add = |cols: std::ops::Range<usize>, row: &[f64]| {
        for (s, &x) in sums[cols].iter_mut().zip(row) {
            *s = [s[0] + 1.0, s[1] + x, s[2] + x * x];
        }
    };
    for (s, frames) in frames.iter().enumerate() {
        if frames.is_empty() {
            continue;
        }
        let sys = data.system(s)?;
        for &f in frames {
            if nfp > 0 {
                let p = sys.frame_fparam(f).or(fit.default_fparam.as_deref());
                add(0..nfp, p.expect("checked by check_params"));
            }
            if nap > 0 {
                let p = sys.frame_aparam(f).expect("checked by check_params");
                for row in p.chunks_exact(nap) {
                    add(nfp..nfp + nap, row);
                }
            }
        }
    }
    Ok(sums)
}

/// Per parameter the mean and the inverse of the standard deviation of its sums (one below
/// `protect`, the model's `data_stat_protect`, taken as `protect`): DeePMD-kit's
/// `StatItem.compute_avg` (0 without rows) and `compute_std`.
pub fn fit_input_norm(sums: &[[f64; 3]], protect: f64) -> (Vec<f64>, Vec<f64>) {
    sums.iter()
        .map(|s| {
            let avg = if s[0] == 0.0 { 0.0 } else { s[1] / s[0] };
            (avg, 1.0 / protected_std(s, protect))
        })
        .unzip()
}

/// A property's output bias and std ([`crate::fitting::property::stats::out_stats`]) over the
/// statistics frames `frames` of each system.
pub fn property_stats(
    p: &PropertySpec,
    ntypes: usize,
    data: &DataSet,
    frames: &[Vec<usize>],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut counts, mut labels) = (Vec::new(), Vec::new());
    for (s, frames) in frames.iter().enumerate() {
        if frames.is_empty() {
            continue;
        }
        let sys = data.system(s)?;
        for &f in frames {
            counts.push(
                sys.type_counts(f, ntypes)
                    .iter()
                    .map(|&n| n as f64)
                    .collect(),
            );
            labels.extend(sys.frame_label(f).expect("checked by check_labels"));
        }
    }
    Ok(out_stats(p, &counts, &labels))
}

/// The output bias ([`crate::fitting::out_bias::out_bias`]) of a DOS or a tensor, label `name`
/// of width `k`, types `exclude` excluded, over the statistics frames `frames` of each system.
pub fn label_bias(
    name: &str,
    k: usize,
    exclude: &[usize],
    ntypes: usize,
    data: &DataSet,
    frames: &[Vec<usize>],
) -> Result<Vec<f64>> {
    let mut samples = Samples::default();
    for (s, frames) in frames.iter().enumerate() {
        if frames.is_empty() {
            continue;
        }
        let sys = data.system(s)?;
        for &f in frames {
            if let Some(l) = sys.frame_atom_label(f) {
                samples.atom_types.extend(sys.frame_atype(f));
                samples.atomic.extend(l);
            }
            if let Some(l) = sys.frame_label(f) {
                samples.counts.push(
                    sys.type_counts(f, ntypes)
                        .iter()
                        .map(|&n| n as f64)
                        .collect(),
                );
                samples.frame.extend(l);
            }
        }
    }
    out_bias(&samples, ntypes, k, exclude, name).map_err(anyhow::Error::msg)
}

/// The statistics a model starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct DataStats {
    pub davg: Vec<f64>,
    pub dstd: Vec<f64>,
    /// The sums davg and dstd come from, one per part of the descriptor
    /// ([`DescriptorSpec::stat_parts`]): what multi-task training merges.
    pub env: Vec<EnvStats>,
    pub bias: Vec<f64>,
    /// The std over frames of the energy left after the bias fit (DeePMD's `out_std`, one value
    /// for every type): logged only, see `write_deepmd_yaml`.
    pub residual_std: f64,
    pub nframes: usize,
}

/// davg and dstd of descriptor `d` from the sums of its parts.
pub fn env_davg_dstd(d: &DescriptorSpec, env: &[EnvStats]) -> (Vec<f64>, Vec<f64>) {
    let (mut davg, mut dstd) = (Vec::new(), Vec::new());
    for (p, env) in d.stat_parts().iter().zip(env) {
        let (a, mut s) = env.davg_dstd(p.set_davg_zero);
        // Where its statistics cover fewer columns than the rows' four (se_e2_r's, the radial
        // one alone), the others go unused.
        let columns = p.kind.registered().env_columns;
        s.chunks_mut(4).for_each(|row| row[columns..].fill(1.0));
        davg.extend(a);
        dstd.extend(s);
    }
    (davg, dstd)
}

/// davg/dstd (environment matrix) and the least-squares energy bias (one row per frame) over
/// the given frames of each system.
pub fn data_stats(
    d: &DescriptorSpec,
    ntypes: usize,
    data: &DataSet,
    frames: &[Vec<usize>],
) -> Result<DataStats> {
    let pass = Pass {
        ntypes,
        count: None,
        mixed: d.is_mixed(),
        stat: Some(d),
    };
    let (_, st) = scan(pass, data, frames, "data statistics")?;
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
    let pass = Pass {
        ntypes,
        count: Some(d.rcut),
        mixed: d.is_mixed(),
        stat: Some(d),
    };
    let (ns, st) = scan(pass, data, frames, "statistics")?;
    Ok((ns.expect("counted"), st.expect("summed")))
}

/// What a pass over the data computes: with `count` (an rcut), the neighbour statistics over
/// every frame (of all types together if `mixed`, as a mixed-type descriptor's sel counts them;
/// `mixed` is then `stat`'s own); with `stat`, the environment rows of each system's statistics
/// frames and the energy bias.
#[derive(Clone, Copy)]
pub struct Pass<'a> {
    pub ntypes: usize,
    pub count: Option<f64>,
    pub mixed: bool,
    pub stat: Option<&'a DescriptorSpec>,
}

/// The statistics frames of the data statistics computed on the training systems as they are
/// read ([`load_training_with_stats`]): `nbatch` batches per system, of its batch size times
/// `batch_factor` (the data-parallel ranks), drawn with `seed` as [`stat_frames`] draws them.
pub struct StatDraw {
    pub nbatch: usize,
    pub batch_factor: usize,
    pub seed: u64,
}

/// The training data loaded with `pass` computed on each system as it is read, beside the
/// reading of the next ones: a system streamed from disk is then read once, not again for the
/// statistics, and the statistics of a data set read under a lock (HDF5) use the other cores
/// meanwhile. The same numbers as [`neighbor_and_data_stats`] over [`stat_frames`] after
/// loading, bit for bit (the same frames, summed in the same order).
pub fn load_training_with_stats(
    fs: &dyn Files,
    cfg: &DataConfig,
    type_map: &[String],
    rcut: f64,
    pass: Pass,
    draw: &StatDraw,
    labels: &Labels,
) -> Result<(DataSet, Option<NeighborStats>, Option<DataStats>)> {
    let mut sums = Sums::new(&pass);
    let data = load_data_visiting(
        fs,
        cfg,
        type_map,
        rcut,
        "training",
        labels,
        |kept: Vec<Kept>| {
            let systems = kept
                .into_iter()
                .map(|k| {
                    let frames = match pass.stat {
                        Some(_) => system_stat_frames(
                            k.index,
                            k.sys.nframes,
                            k.batch_size * draw.batch_factor,
                            draw.nbatch,
                            draw.seed,
                        ),
                        None => Vec::new(),
                    };
                    (k.sys, frames)
                })
                .collect();
            pass.compute(systems)
        },
        |window| sums.add(pass, window),
    )?;
    let (ns, st) = sums.finish(pass);
    Ok((data, ns, st))
}

/// What the pass computes for one frame.
enum FrameStat {
    /// Neighbour counts only: the largest count per type and the smallest pair distance.
    Counts(Vec<usize>, f64),
    /// A statistics frame's environment rows (with its counts), one set per part of the
    /// descriptor (a hybrid's sub-descriptors each on its own rcut and sel, as DeePMD-kit's
    /// `compute_input_stats` of each does); the counts are those of the part of the largest
    /// rcut, the descriptor's.
    Rows(Vec<FrameRows>, usize),
}

impl FrameStat {
    fn counts(&self) -> (&[usize], f64) {
        match self {
            FrameStat::Counts(c, d) => (c, *d),
            FrameStat::Rows(r, k) => (&r[*k].max_count, r[*k].min_dist),
        }
    }
}

/// One system's part of the pass: the system, its statistics frames, and its `FrameStat` per
/// frame (`None` for frames neither counted nor in the statistics).
type SystemStats = (Arc<System>, Vec<usize>, Vec<Option<FrameStat>>);

impl Pass<'_> {
    /// The frames of a window of systems (each with its statistics frames), computed in
    /// parallel.
    fn compute(&self, systems: Vec<(Arc<System>, Vec<usize>)>) -> Vec<SystemStats> {
        // Per frame of the window: whether it is a statistics frame, or only counted.
        let mut jobs = Vec::new();
        for (k, (sys, frames)) in systems.iter().enumerate() {
            let mut rows = vec![false; sys.nframes];
            if self.stat.is_some() {
                for &f in frames {
                    rows[f] = true;
                }
            }
            jobs.extend(
                (0..sys.nframes)
                    .filter(|&f| rows[f] || self.count.is_some())
                    .map(|f| (k, f, rows[f])),
            );
        }
        let done: Vec<FrameStat> = jobs
            .par_iter()
            .map(|&(k, f, rows)| {
                let sys = &systems[k].0;
                match self.stat {
                    Some(d) if rows => {
                        let cell = cell_of(sys, f);
                        let parts = d.stat_parts();
                        let widest = (parts.iter()).position(|p| p.rcut == d.rcut).unwrap_or(0);
                        FrameStat::Rows(
                            (parts.iter())
                                .map(|p| {
                                    let atype = sys.frame_atype(f);
                                    frame_rows(p, sys.frame_coord(f), cell.as_ref(), atype)
                                })
                                .collect(),
                            widest,
                        )
                    }
                    _ => {
                        let rcut = self.count.expect("a frame only counted");
                        let (c, m) = frame_counts(sys, f, self.ntypes, rcut, self.mixed);
                        FrameStat::Counts(c, m)
                    }
                }
            })
            .collect();
        let mut out: Vec<SystemStats> = systems
            .into_iter()
            .map(|(sys, frames)| {
                let none = (0..sys.nframes).map(|_| None).collect();
                (sys, frames, none)
            })
            .collect();
        for (&(k, f, _), r) in jobs.iter().zip(done) {
            out[k].2[f] = Some(r);
        }
        out
    }
}

/// The running sums of a pass, added to in system and frame order (so that the result does not
/// depend on the number of threads).
struct Sums {
    max_count: Vec<usize>,
    min_dist: f64,
    nframes: usize,
    /// One per part of the descriptor.
    env: Vec<EnvStats>,
    counts: Vec<Vec<f64>>,
    energy: Vec<f64>,
}

impl Sums {
    fn new(pass: &Pass) -> Self {
        Sums {
            max_count: vec![0; if pass.mixed { 1 } else { pass.ntypes }],
            min_dist: f64::INFINITY,
            nframes: 0,
            env: Vec::new(),
            counts: Vec::new(),
            energy: Vec::new(),
        }
    }

    fn add(&mut self, pass: Pass, window: Vec<SystemStats>) {
        for (sys, frames, per_frame) in window {
            self.nframes += sys.nframes;
            if pass.count.is_some() {
                // Maxima and minima: the same whatever the order.
                for (c, m) in per_frame.iter().flatten().map(FrameStat::counts) {
                    for (mc, &c) in self.max_count.iter_mut().zip(c) {
                        *mc = (*mc).max(c);
                    }
                    self.min_dist = self.min_dist.min(m);
                }
            }
            if pass.stat.is_some() {
                for &f in &frames {
                    // A mixed-type frame's own counts: DeePMD-kit's `real_natoms_vec`.
                    let c = sys.type_counts(f, pass.ntypes);
                    let Some(FrameStat::Rows(r, _)) = &per_frame[f] else {
                        unreachable!("statistics frames have rows");
                    };
                    if self.env.is_empty() {
                        self.env = r.iter().map(|_| EnvStats::new(pass.ntypes)).collect();
                    }
                    for (env, r) in self.env.iter_mut().zip(r) {
                        env.add_rows(r);
                    }
                    self.counts.push(c.iter().map(|&n| n as f64).collect());
                    self.energy.push(sys.energy[f]);
                }
            }
        }
    }

    fn finish(self, pass: Pass) -> (Option<NeighborStats>, Option<DataStats>) {
        let neighbours = pass.count.map(|_| NeighborStats {
            max_count: self.max_count,
            min_dist: self.min_dist,
            nframes: self.nframes,
        });
        let stats = pass.stat.map(|d| {
            let mut env = self.env;
            if env.is_empty() {
                env = d
                    .stat_parts()
                    .iter()
                    .map(|_| EnvStats::new(pass.ntypes))
                    .collect();
            }
            let (davg, dstd) = env_davg_dstd(d, &env);
            let (bias, std) = energy_bias(&self.counts, &self.energy);
            DataStats {
                davg,
                dstd,
                env,
                bias,
                residual_std: std,
                nframes: self.energy.len(),
            }
        });
        (neighbours, stats)
    }
}

/// `pass` over the loaded data, with the statistics frames `frames` of each system. Systems
/// are read a window at a time and their frames computed in parallel; the sums of one window
/// run beside the frames of the next.
fn scan(
    pass: Pass,
    data: &DataSet,
    frames: &[Vec<usize>],
    what: &str,
) -> Result<(Option<NeighborStats>, Option<DataStats>)> {
    let mut sums = Sums::new(&pass);
    let bar = phase_bar(data.systems.len(), what);
    let all: Vec<usize> = (0..data.systems.len()).collect();
    let _open = keep_open();
    let frames_of = |chunk: &[usize]| -> Result<Vec<SystemStats>> {
        let systems = chunk
            .par_iter()
            .map(|&s| Ok((data.system(s)?, frames.get(s).cloned().unwrap_or_default())))
            .collect::<Result<Vec<_>>>()?;
        Ok(pass.compute(systems))
    };
    let mut pending: Option<Vec<SystemStats>> = None;
    for chunk in all.chunks(window()) {
        let (next, ()) = rayon::join(
            || frames_of(chunk),
            || {
                if let Some(w) = pending.take() {
                    bar.inc(w.len() as u64);
                    sums.add(pass, w);
                }
            },
        );
        pending = Some(next?);
    }
    if let Some(w) = pending {
        sums.add(pass, w);
    }
    bar.finish_and_clear();
    Ok(sums.finish(pass))
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

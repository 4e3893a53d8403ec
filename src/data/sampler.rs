//! Batch sizes, system probabilities and the batch sampler (docs/deepmd-spec.md §12).

use std::str::FromStr;

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The `batch_size` setting of `training_data` / `validation_data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchSize {
    /// The same number of frames for every system.
    Fixed(usize),
    /// One batch size per system.
    PerSystem(Vec<usize>),
    /// `"auto:N"` (`"auto"` is `Auto(32)`): the smallest batch with at least N atoms.
    Auto(usize),
    /// `"max:N"`: the largest batch with at most N atoms, but at least one frame.
    Max(usize),
}

impl FromStr for BatchSize {
    type Err = String;

    /// Parses the string forms: `"auto"`, `"auto:N"`, `"max:N"` and a plain integer.
    fn from_str(s: &str) -> Result<Self, String> {
        let number = |n: &str| {
            n.parse::<usize>()
                .map_err(|_| format!("batch_size {s:?}: {n:?} is not a non-negative integer"))
        };
        if s == "auto" {
            Ok(BatchSize::Auto(32))
        } else if let Some(n) = s.strip_prefix("auto:") {
            number(n).map(BatchSize::Auto)
        } else if let Some(n) = s.strip_prefix("max:") {
            number(n).map(BatchSize::Max)
        } else if let Ok(n) = s.parse::<usize>() {
            Ok(BatchSize::Fixed(n))
        } else {
            Err(format!(
                "batch_size {s:?}: expected an integer, \"auto\", \"auto:N\" or \"max:N\""
            ))
        }
    }
}

/// Batch size of each system, given each system's atom count.
pub fn batch_sizes(spec: &BatchSize, natoms: &[usize]) -> Result<Vec<usize>, String> {
    let per_atoms = |n: usize, rule: fn(usize, usize) -> usize| {
        if n == 0 {
            return Err(format!(
                "batch_size {spec:?}: the atom budget must be positive"
            ));
        }
        natoms
            .iter()
            .map(|&na| match na {
                0 => Err("a system has no atoms".to_string()),
                _ => Ok(rule(n, na)),
            })
            .collect()
    };
    let sizes = match spec {
        BatchSize::Fixed(bs) => vec![*bs; natoms.len()],
        BatchSize::PerSystem(list) if list.len() != natoms.len() => {
            return Err(format!(
                "batch_size lists {} values but there are {} systems",
                list.len(),
                natoms.len()
            ))
        }
        BatchSize::PerSystem(list) => list.clone(),
        BatchSize::Auto(n) => per_atoms(*n, |n, na| n.div_ceil(na))?,
        BatchSize::Max(n) => per_atoms(*n, |n, na| (n / na).max(1))?,
    };
    if sizes.contains(&0) {
        return Err(format!("batch_size {spec:?}: a batch size of 0 is invalid"));
    }
    Ok(sizes)
}

/// Number of batches per epoch of each system; the last partial batch counts.
pub fn nbatches(nframes: &[usize], batch_sizes: &[usize]) -> Vec<usize> {
    nframes
        .iter()
        .zip(batch_sizes)
        .map(|(&nf, &bs)| nf.div_ceil(bs))
        .collect()
}

/// [`nbatches`] as DeePMD-kit's TensorFlow backend counts them (`DeepmdData.get_numb_batch`):
/// whole batches only, at least one. Its `"mixed:N"` batches, which only it has, are counted so.
pub fn nbatches_whole(nframes: &[usize], batch_sizes: &[usize]) -> Vec<usize> {
    (nframes.iter().zip(batch_sizes))
        .map(|(&nf, &bs)| (nf / bs).max(1))
        .collect()
}

/// Probability of drawing each system, from `auto_prob` or, when given, `sys_probs`.
/// The result may not sum exactly to one (as in DeePMD); [`Sampler`] normalizes it.
pub fn system_probs(
    auto_prob: &str,
    sys_probs: Option<&[f64]>,
    nbatches: &[usize],
) -> Result<Vec<f64>, String> {
    let nsys = nbatches.len();
    if nsys == 0 {
        return Err("no systems to draw from".into());
    }
    let probs = match sys_probs {
        Some(p) => process_sys_probs(p, nbatches)?,
        None if auto_prob == "prob_uniform" => vec![1.0 / nsys as f64; nsys],
        None if auto_prob == "prob_sys_size" => prob_sys_size(&format!("0:{nsys}:1.0"), nbatches)?,
        None => match auto_prob.strip_prefix("prob_sys_size;") {
            Some(blocks) => prob_sys_size(blocks, nbatches)?,
            None => return Err(format!(
                "auto_prob {auto_prob:?}: expected \"prob_uniform\", \"prob_sys_size\" or \"prob_sys_size;a:b:w;...\""
            )),
        },
    };
    if probs.iter().sum::<f64>() <= 0.0 {
        return Err("the system probabilities sum to zero".into());
    }
    Ok(probs)
}

/// DeePMD's `process_sys_probs`: non-negative entries are kept, and the remaining mass goes to
/// the systems with negative entries in proportion to their number of batches.
fn process_sys_probs(sys_probs: &[f64], nbatches: &[usize]) -> Result<Vec<f64>, String> {
    if sys_probs.len() != nbatches.len() {
        return Err(format!(
            "sys_probs has {} entries but there are {} systems",
            sys_probs.len(),
            nbatches.len()
        ));
    }
    if sys_probs.iter().any(|p| !p.is_finite()) {
        return Err(format!("sys_probs {sys_probs:?} has a non-finite entry"));
    }
    let assigned: f64 = sys_probs.iter().filter(|&&p| p >= 0.0).sum();
    // DeePMD allows 1e-8 of rounding slack here.
    if assigned > 1.0 + 1e-8 {
        return Err(format!(
            "sys_probs: the non-negative entries sum to {assigned}, more than 1"
        ));
    }
    let rest = 1.0 - assigned;
    let rest_nbatch: usize = sys_probs
        .iter()
        .zip(nbatches)
        .filter(|(&p, _)| p < 0.0)
        .map(|(_, &nb)| nb)
        .sum();
    // numpy's isclose(rest, 0) decides whether there is mass left to spread.
    if rest.abs() <= 1e-8 {
        if sys_probs.iter().any(|&p| p < 0.0) {
            return Err(format!(
                "sys_probs {sys_probs:?}: the non-negative entries already sum to 1, leaving nothing for the negative ones"
            ));
        }
        return Ok(sys_probs.to_vec());
    }
    if !sys_probs.iter().any(|&p| p < 0.0) {
        return Err(format!(
            "sys_probs {sys_probs:?} sum to {assigned} < 1 and no negative entry takes the rest"
        ));
    }
    Ok(sys_probs
        .iter()
        .zip(nbatches)
        .map(|(&p, &nb)| {
            if p >= 0.0 {
                p
            } else {
                rest * nb as f64 / rest_nbatch as f64
            }
        })
        .collect())
}

/// DeePMD's `prob_sys_size_ext` over `"a:b:w;c:d:w2;..."`: block `[a, b)` gets mass ∝ `w`,
/// spread inside the block ∝ number of batches; systems in no block get 0.
fn prob_sys_size(blocks: &str, nbatches: &[usize]) -> Result<Vec<f64>, String> {
    let parsed = blocks
        .split(';')
        .map(|block| {
            let bad = || format!("auto_prob block {block:?}: expected start:end:weight");
            let fields: Vec<&str> = block.split(':').collect();
            let [a, b, w] = fields[..] else {
                return Err(bad());
            };
            let (a, b) = (a.parse::<usize>(), b.parse::<usize>());
            let (Ok(a), Ok(b), Ok(w)) = (a, b, w.parse::<f64>()) else {
                return Err(bad());
            };
            if a >= b || b > nbatches.len() {
                return Err(format!(
                    "auto_prob block {block:?}: need start < end <= {} (the number of systems)",
                    nbatches.len()
                ));
            }
            if !(w >= 0.0 && w.is_finite()) {
                return Err(format!(
                    "auto_prob block {block:?}: the weight must be >= 0"
                ));
            }
            Ok((a, b, w))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let total_weight: f64 = parsed.iter().map(|&(_, _, w)| w).sum();
    if total_weight <= 0.0 {
        return Err(format!(
            "auto_prob blocks {blocks:?}: the weights sum to zero"
        ));
    }
    let mut probs = vec![0.0; nbatches.len()];
    for (a, b, w) in parsed {
        let block_nbatch: usize = nbatches[a..b].iter().sum();
        for (p, &nb) in probs[a..b].iter_mut().zip(&nbatches[a..b]) {
            *p = nb as f64 / block_nbatch as f64 * (w / total_weight);
        }
    }
    Ok(probs)
}

/// The frames of one batch (or of one rank's part of it): several of one system, or (a
/// `"mixed:N"` batch) each of its own system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Draw {
    /// System and frames.
    System(usize, Vec<usize>),
    /// (system, frame) of each frame.
    Mixed(Vec<(usize, usize)>),
}

impl Draw {
    /// The system of a batch of one system's frames.
    pub fn system(&self) -> Option<usize> {
        match self {
            Draw::System(s, _) => Some(*s),
            Draw::Mixed(_) => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Draw::System(_, f) => f.is_empty(),
            Draw::Mixed(p) => p.is_empty(),
        }
    }
}

/// Endless stream of batches over several systems; its whole state (de)serializes, so a
/// checkpoint can resume the exact sequence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sampler {
    rng: ChaCha8Rng,
    /// Running sums of the system probabilities.
    cumulative: Vec<f64>,
    systems: Vec<Epoch>,
    /// A `"mixed:N"` stream's N: each batch is N draws of one frame each ([`Sampler::mixed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mixed: Option<usize>,
}

/// One system's pass over its frames in shuffled order.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Epoch {
    batch_size: usize,
    order: Vec<usize>,
    /// Frames `order[..next]` have been handed out this epoch.
    next: usize,
}

impl Sampler {
    /// # Panics
    /// If the lengths differ, a system has no frames, a batch size is 0, or `probs` has a
    /// negative or non-finite entry or sums to 0 (the inputs of [`batch_sizes`] and
    /// [`system_probs`] never do).
    pub fn new(nframes: &[usize], batch_sizes: &[usize], probs: Vec<f64>, seed: u64) -> Self {
        assert!(
            nframes.len() == batch_sizes.len() && nframes.len() == probs.len(),
            "Sampler::new: {} systems, {} batch sizes, {} probabilities",
            nframes.len(),
            batch_sizes.len(),
            probs.len()
        );
        assert!(
            nframes.iter().chain(batch_sizes).all(|&n| n > 0),
            "Sampler::new: frame counts {nframes:?} and batch sizes {batch_sizes:?} must be positive"
        );
        assert!(
            probs.iter().all(|p| p.is_finite() && *p >= 0.0) && probs.iter().sum::<f64>() > 0.0,
            "Sampler::new: invalid probabilities {probs:?}"
        );
        let cumulative = probs
            .iter()
            .scan(0.0, |acc, p| {
                *acc += p;
                Some(*acc)
            })
            .collect();
        let systems = nframes
            .iter()
            .zip(batch_sizes)
            .map(|(&nf, &batch_size)| Epoch {
                batch_size,
                order: (0..nf).collect(),
                // Start exhausted so that the first batch triggers the first shuffle.
                next: nf,
            })
            .collect();
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            cumulative,
            systems,
            mixed: None,
        }
    }

    /// The stream of `"mixed:N"` batches (DeePMD-kit's `get_batch_mixed`): each of a batch's
    /// `n` frames comes from a system drawn by `probs`, the next frame of that system's
    /// shuffled pass over its frames.
    ///
    /// # Panics
    /// As [`Sampler::new`], or if `n` is 0.
    pub fn mixed(nframes: &[usize], n: usize, probs: Vec<f64>, seed: u64) -> Self {
        assert!(n > 0, "Sampler::mixed: a batch of no frames");
        Sampler {
            mixed: Some(n),
            ..Sampler::new(nframes, &vec![1; nframes.len()], probs, seed)
        }
    }

    /// The frames of a `"mixed:N"` batch; `None` for a stream of one system a batch.
    pub fn mixed_size(&self) -> Option<usize> {
        self.mixed
    }

    /// Rank `rank`'s part of the next global batch of `size` ranks (each rank's share of a
    /// batch: system s's batch size, or N of a `"mixed:N"` stream), and the frames in the
    /// global batch. A mixed part is sorted by system, then frame, so that few batch shapes
    /// recur.
    pub fn draw(&mut self, (rank, size): (usize, usize)) -> (Draw, usize) {
        let part = |n, b| crate::dist::rank_slice(n, b, rank);
        match self.mixed {
            None => {
                let (s, frames) = self.next_batches(size);
                let mine = frames[part(frames.len(), self.systems[s].batch_size)].to_vec();
                (Draw::System(s, mine), frames.len())
            }
            Some(n) => {
                let picks: Vec<(usize, usize)> = (0..size * n)
                    .map(|_| {
                        let (s, frames) = self.next_batches(1);
                        (s, frames[0])
                    })
                    .collect();
                let mut mine = picks[part(picks.len(), n)].to_vec();
                mine.sort_unstable();
                (Draw::Mixed(mine), picks.len())
            }
        }
    }

    /// Next batch: (system index, frame indices into that system, all from one system).
    pub fn next_batch(&mut self) -> (usize, Vec<usize>) {
        self.next_batches(1)
    }

    /// `k` batches' worth of frames from one system: exactly the draw of a sampler whose batch
    /// sizes are `k` times these (the global batch of `k` data-parallel ranks). Fewer frames
    /// when the system's epoch runs out first.
    ///
    /// # Panics
    /// If `k` is 0.
    pub fn next_batches(&mut self, k: usize) -> (usize, Vec<usize>) {
        assert!(k > 0, "Sampler::next_batches: k must be positive");
        let sys = self.draw_system();
        let epoch = &mut self.systems[sys];
        if epoch.next == epoch.order.len() {
            epoch.order.shuffle(&mut self.rng);
            epoch.next = 0;
        }
        let end = (epoch.next + k * epoch.batch_size).min(epoch.order.len());
        let frames = epoch.order[epoch.next..end].to_vec();
        epoch.next = end;
        (sys, frames)
    }

    /// Whether this state is one a sampler of `nframes`, `batch_sizes` and `probs` can reach
    /// (a restored checkpoint's, which [`Sampler::next_batches`] indexes by): the problem
    /// found, in words.
    pub fn check(
        &self,
        nframes: &[usize],
        batch_sizes: &[usize],
        probs: &[f64],
        mixed: Option<usize>,
    ) -> Result<(), String> {
        if self.mixed != mixed {
            return Err(format!(
                "mixed batches of {:?} frames, the data's {mixed:?}",
                self.mixed
            ));
        }
        // A mixed stream takes one frame a draw ([`Sampler::mixed`]).
        let ones;
        let batch_sizes = match mixed {
            Some(_) => {
                ones = vec![1; batch_sizes.len()];
                &ones
            }
            None => batch_sizes,
        };
        let nsys = nframes.len();
        if batch_sizes.len() != nsys || probs.len() != nsys {
            return Err(format!(
                "{nsys} systems, {} batch sizes, {} probabilities",
                batch_sizes.len(),
                probs.len()
            ));
        }
        if nframes.contains(&0) || batch_sizes.contains(&0) {
            return Err(format!(
                "frame counts {nframes:?} and batch sizes {batch_sizes:?} must be positive"
            ));
        }
        if !(probs.iter().all(|p| p.is_finite() && *p >= 0.0) && probs.iter().sum::<f64>() > 0.0) {
            return Err(format!("invalid system probabilities {probs:?}"));
        }
        let cumulative: Vec<f64> = (probs.iter())
            .scan(0.0, |acc, p| {
                *acc += p;
                Some(*acc)
            })
            .collect();
        if self.cumulative != cumulative {
            return Err(format!(
                "cumulative probabilities {:?}, not the running sums of {probs:?}",
                self.cumulative
            ));
        }
        if self.systems.len() != nsys {
            return Err(format!("{} systems for {nsys}", self.systems.len()));
        }
        for (i, (e, (&nf, &bs))) in (self.systems.iter())
            .zip(nframes.iter().zip(batch_sizes))
            .enumerate()
        {
            if e.batch_size != bs {
                return Err(format!(
                    "systems[{i}].batch_size is {}, not {bs}",
                    e.batch_size
                ));
            }
            let mut seen = vec![false; nf];
            let permutation = e.order.len() == nf
                && (e.order.iter()).all(|&f| f < nf && !std::mem::replace(&mut seen[f], true));
            if !permutation {
                return Err(format!(
                    "systems[{i}].order is not an order of the system's {nf} frames"
                ));
            }
            if e.next > nf {
                return Err(format!(
                    "systems[{i}].next is {}, past the system's {nf} frames",
                    e.next
                ));
            }
        }
        Ok(())
    }

    fn draw_system(&mut self) -> usize {
        let total = *self.cumulative.last().expect("at least one system");
        let u = self.rng.random::<f64>() * total;
        let sys = self.cumulative.partition_point(|&c| c <= u);
        // `u` can round up to `total`; then take the last system with non-zero probability.
        sys.min(self.cumulative.partition_point(|&c| c < total))
    }
}

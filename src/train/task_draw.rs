//! The task of each multi-task training step, drawn bit for bit as DeePMD-kit 3.2.0 draws it.
//!
//! DeePMD-kit keeps one numpy legacy generator, `deepmd/utils/random.py`'s
//! `_RANDOM_GENERATOR = np.random.RandomState()`. `prepare_trainer_input_single`
//! (`deepmd/pt/entrypoints/main.py`) seeds it through `setup_seed` (`deepmd/pt/utils/dataloader.py`)
//! with the list `[rank, seed % 2**32]`, and every step of a multi-task run takes
//! `dp_random.choice(np.arange(ntasks), p=model_prob)` (`deepmd/pt/train/training.py`). Nothing
//! else on the PyTorch training path draws from it, so the task sequence is a function of
//! `(rank, seed, model_prob)` alone, and matching it needs numpy's exact arithmetic:
//!
//! - seeding: a list is not an integer, so `MT19937._legacy_seeding` takes its array path:
//!   `np.asarray(seed).astype(np.int64, casting='safe')`, a ValueError for any value outside
//!   `[0, 2**32 − 1]`, then `astype(np.uint32)` and `mt19937_init_by_array` over those words —
//!   the reference `init_by_array` of Matsumoto and Nishimura;
//! - `random_sample()`: two 32-bit outputs `a`, `b` make `((a >> 5)·2^26 + (b >> 6)) / 2^53`;
//! - `choice(a, p=p)` with `size=None`: `cdf = p.cumsum(); cdf /= cdf[-1]`, one `random_sample()`,
//!   and the index `cdf.searchsorted(u, side='right')` — the first `i` with `cdf[i] > u`.
//!
//! MT19937 is written here rather than taken from the `rand_mt` crate: it is a few dozen lines
//! whose every output the tests pin against numpy's, and it spares the crate (and the wasm build)
//! a dependency tied to another `rand_core` version than the one in Cargo.toml.

/// Words of MT19937's state.
const N: usize = 624;
/// The middle word of the recurrence.
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// numpy's MT19937 (`numpy/random/src/mt19937/mt19937.c`), seeded from a key array.
struct Mt19937 {
    key: [u32; N],
    pos: usize,
}

impl Mt19937 {
    /// `mt19937_init_by_array`: `init_genrand(19650218)` and then the two mixing passes over
    /// `init_key`.
    fn from_key(init_key: &[u32]) -> Self {
        let mut mt = [0u32; N];
        mt[0] = 19_650_218;
        for i in 1..N {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(init_key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(init_key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= init_key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        // The most significant bit set assures a non-zero state.
        mt[0] = 0x8000_0000;
        // The whole state is regenerated before the first output.
        Mt19937 { key: mt, pos: N }
    }

    /// `mt19937_gen`: the next 624 words of the recurrence, in place.
    fn regenerate(&mut self) {
        let twist = |upper: u32, lower: u32, far: u32| {
            let y = (upper & UPPER_MASK) | (lower & LOWER_MASK);
            far ^ (y >> 1) ^ (if y & 1 == 1 { MATRIX_A } else { 0 })
        };
        let k = &mut self.key;
        for i in 0..N {
            k[i] = twist(k[i], k[(i + 1) % N], k[(i + M) % N]);
        }
        self.pos = 0;
    }

    /// `mt19937_next32`: one tempered output.
    fn next_u32(&mut self) -> u32 {
        if self.pos == N {
            self.regenerate();
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `RandomState.random_sample()`: a double in [0, 1) with 53 random bits.
    fn random_sample(&mut self) -> f64 {
        let a = self.next_u32() >> 5;
        let b = self.next_u32() >> 6;
        (f64::from(a) * 67_108_864.0 + f64::from(b)) / 9_007_199_254_740_992.0
    }
}

/// The task of each multi-task step, drawn as DeePMD-kit draws it (numpy's RandomState seeded
/// with [rank, seed]; one choice per step).
pub struct TaskDraw {
    mt: Mt19937,
    /// `cumsum(p) / cumsum(p)[-1]`, as `choice` builds it on every call.
    cdf: Vec<f64>,
}

impl TaskDraw {
    /// The draws of process `rank` for a run seeded with `seed`, over tasks with the normalized
    /// `model_prob` `probs`.
    ///
    /// DeePMD-kit reduces the seed modulo 2^32 before numpy sees it (`seed % (2**32)`), so any
    /// `u64` seed is accepted and 2^32 + s draws what s draws. A run without a seed seeds
    /// numpy from the OS and cannot be reproduced; the caller passes the seed it picked.
    ///
    /// # Panics
    /// If `probs` is empty, has a negative or non-finite entry or sums to zero (numpy's `choice`
    /// refuses these too), or `rank` ≥ 2^32 (numpy's "Seed must be between 0 and 2**32 - 1").
    pub fn new(rank: usize, seed: u64, probs: &[f64]) -> Self {
        assert!(
            !probs.is_empty() && probs.iter().all(|p| p.is_finite() && *p >= 0.0),
            "task probabilities must be non-empty, finite and non-negative: {probs:?}"
        );
        let rank = u32::try_from(rank).expect("numpy seeds with words below 2^32");
        let mut cdf: Vec<f64> = probs
            .iter()
            .scan(0.0, |sum, p| {
                *sum += p;
                Some(*sum)
            })
            .collect();
        let total = cdf[cdf.len() - 1];
        assert!(total > 0.0, "task probabilities sum to zero");
        for c in &mut cdf {
            *c /= total;
        }
        // `seed % 2**32`, as DeePMD-kit writes the list.
        let seed = (seed & 0xffff_ffff) as u32;
        TaskDraw {
            mt: Mt19937::from_key(&[rank, seed]),
            cdf,
        }
    }

    /// The task index of the next step.
    // Not an Iterator: the draws never end, and each step wants a task, not an Option of one.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> usize {
        let u = self.mt.random_sample();
        // searchsorted(side='right'): the count of cdf entries ≤ u. u < 1 = cdf[-1], so the
        // index is always a task.
        self.cdf.partition_point(|&c| c <= u)
    }

    /// `n` draws thrown away (a restart at step n continues the sequence).
    pub fn skip(&mut self, n: usize) {
        // Each draw is one random_sample, whatever the task it lands on.
        for _ in 0..n {
            self.mt.random_sample();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(d: &mut TaskDraw, n: usize) -> Vec<usize> {
        (0..n).map(|_| d.next()).collect()
    }

    /// DeePMD-kit's recorded run (tests/reference/multitask/pre_mt/info.json): seed 10 on rank
    /// 0, model_keys [water, alloy] with model_prob 1:3, and trace.steps[k].task
    /// alloy, alloy, water, alloy, alloy, alloy.
    #[test]
    fn task_draw_matches_deepmd_recorded_run() {
        let mut d = TaskDraw::new(0, 10, &[0.25, 0.75]);
        assert_eq!(draws(&mut d, 6), [1, 1, 0, 1, 1, 1]);
    }

    /// Made by
    /// `/tmp/dpvenv/bin/python -c "import numpy as np; r=np.random.RandomState([1,12345]); print([int(r.choice(np.arange(3), p=[0.2,0.5,0.3])) for _ in range(40)])"`
    /// with numpy 2.4.6.
    #[test]
    fn task_draw_matches_numpy_choice_three_tasks() {
        let mut d = TaskDraw::new(1, 12345, &[0.2, 0.5, 0.3]);
        let numpy = [
            0, 1, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1, 1, 2, 2, 1, 1, 0, 0, 1, 1, 1, 2, 2, 1, 2, 0, 1, 2,
            2, 2, 1, 0, 2, 0, 2, 1, 0, 1, 1,
        ];
        assert_eq!(draws(&mut d, 40), numpy);
    }

    /// Made by
    /// `/tmp/dpvenv/bin/python -c "import numpy as np; print([repr(float(x)) for x in np.random.RandomState([0,10]).random_sample(5)])"`
    /// — Python's float repr round-trips, so the literals are numpy's exact doubles.
    #[test]
    fn task_draw_random_sample_is_numpys_bit_for_bit() {
        let mut mt = Mt19937::from_key(&[0, 10]);
        let numpy = [
            0.5711645283903414,
            0.5406088340207632,
            0.2087303983901988,
            0.43948469611909746,
            0.5373812213561989,
        ];
        for want in numpy {
            assert_eq!(mt.random_sample().to_bits(), f64::to_bits(want));
        }
    }

    #[test]
    fn task_draw_skip_continues_the_sequence() {
        let probs = [0.2, 0.5, 0.3];
        let all = draws(&mut TaskDraw::new(1, 12345, &probs), 40);
        for n in [0, 1, 7, 39] {
            let mut d = TaskDraw::new(1, 12345, &probs);
            d.skip(n);
            assert_eq!(d.next(), all[n], "skip({n})");
        }
        // Past several regenerations of the 624-word state. Made by
        // `/tmp/dpvenv/bin/python -c "import numpy as np; r=np.random.RandomState([1,12345]); print([int(r.choice(np.arange(3), p=[0.2,0.5,0.3])) for _ in range(1010)][1000:])"`
        let mut d = TaskDraw::new(1, 12345, &probs);
        d.skip(1000);
        assert_eq!(draws(&mut d, 10), [1, 0, 2, 2, 1, 1, 0, 2, 0, 1]);
    }

    /// DeePMD-kit seeds with `seed % 2**32`; numpy itself would refuse the unreduced value.
    #[test]
    fn task_draw_reduces_large_seeds_modulo_2_pow_32() {
        let probs = [0.5, 0.5];
        let big = draws(&mut TaskDraw::new(0, (1 << 40) + 7, &probs), 30);
        assert_eq!(big, draws(&mut TaskDraw::new(0, 7, &probs), 30));
    }
}

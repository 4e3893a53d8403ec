//! The frames of a data set's systems: those that fit the budget stay in memory, the others are
//! read on demand from disk through a least-recently-used cache of what is left of it, so
//! memory does not grow with the number of frames. Either way a system's frames are the same
//! numbers, so training on them gives the same results.
//!
//! Keeping a fixed part rather than caching everything by recency: the start-up statistics pass
//! over the systems in order, which a recency cache smaller than the data never hits, and while
//! training a random draw hits a fixed part as often as a recency cache of the same size.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::error::DataError;
use super::load::load_system_with;
use super::system::{Labels, System};

/// Budget of the frames kept in memory, from `DPW_DATA_CACHE_MB` (default 384 MiB: with the
/// model, the workspaces and a prefetched batch, training stays under 1 GB however large the
/// data set).
pub fn cache_budget() -> anyhow::Result<usize> {
    const DEFAULT: usize = 384 << 20;
    Ok(crate::settings::DATA_CACHE_MB.bytes()?.unwrap_or(DEFAULT))
}

pub struct SystemStore {
    paths: Vec<PathBuf>,
    type_map: Vec<String>,
    /// Bytes of the cache of systems read on demand.
    budget: usize,
    /// Systems kept for the whole run (those that fit the budget at start-up).
    pinned: Vec<Option<Arc<System>>>,
    /// What a system read on demand is read with and must hold (training data: the loss's labels).
    labels: Labels,
    recent: Mutex<Recent>,
}

/// The systems read on demand, most recently used last, with their total size in bytes.
#[derive(Default)]
struct Recent {
    lru: VecDeque<(usize, Arc<System>)>,
    bytes: usize,
}

impl SystemStore {
    /// A store over the systems at `paths` (on disk), holding `pinned[s]` for good where it is
    /// `Some` and reading the others on demand, caching them within what the pinned systems
    /// leave of `budget` bytes; `labels`: what each is read with and must hold, as the pinned
    /// ones were checked to.
    pub fn new(
        paths: Vec<PathBuf>,
        type_map: Vec<String>,
        pinned: Vec<Option<Arc<System>>>,
        budget: usize,
        labels: Labels,
    ) -> Self {
        assert_eq!(paths.len(), pinned.len(), "one entry per system");
        let held: usize = pinned.iter().flatten().map(|s| s.info().bytes()).sum();
        SystemStore {
            paths,
            type_map,
            budget: budget.saturating_sub(held),
            pinned,
            labels,
            recent: Mutex::default(),
        }
    }

    /// Whether every system stays in memory.
    pub fn all_in_memory(&self) -> bool {
        self.pinned.iter().all(Option::is_some)
    }

    /// System `s`'s frames.
    pub fn get(&self, s: usize) -> Result<Arc<System>, DataError> {
        if let Some(sys) = &self.pinned[s] {
            return Ok(Arc::clone(sys));
        }
        {
            let lru = &mut self.recent.lock().expect("system cache lock").lru;
            if let Some(i) = lru.iter().position(|(k, _)| *k == s) {
                let entry = lru.remove(i).expect("present");
                let sys = Arc::clone(&entry.1);
                lru.push_back(entry);
                return Ok(sys);
            }
        }
        // Read outside the lock so the batch thread and statistics threads overlap their I/O.
        let sys = Arc::new(load_system_with(
            &self.paths[s],
            &self.type_map,
            &self.labels,
        )?);
        sys.check_labels(&self.labels)?;
        let size = sys.info().bytes();
        let mut r = self.recent.lock().expect("system cache lock");
        if !r.lru.iter().any(|(k, _)| *k == s) {
            r.lru.push_back((s, Arc::clone(&sys)));
            r.bytes += size;
        }
        // Keep at least the system just read (a batch needs it whole).
        while r.bytes > self.budget && r.lru.len() > 1 {
            let (_, old) = r.lru.pop_front().expect("non-empty");
            r.bytes -= old.info().bytes();
        }
        Ok(sys)
    }
}

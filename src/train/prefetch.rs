//! The training batches of the next steps, drawn and assembled on a helper thread.

use std::collections::VecDeque;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use anyhow::{anyhow, Result};

use crate::data::{Draw, Sampler, SystemStore};
use crate::model::ModelSpec;

use super::batch::{assemble_draw, HostBatch};
use super::run::{Batches, StepBatch};

/// Draws training batches and assembles them on a helper thread one step ahead, so the host
/// work of step t+1 overlaps the device work of step t. The sampler state it reports is the
/// one from which the next batch *handed out* is drawn, whatever has been prefetched.
///
/// With `size` data-parallel ranks every rank draws the global batch (`size` batches' worth of
/// frames) from the same sampler and assembles only its own slice of it ([`crate::dist::rank_slice`]).
pub struct Prefetcher {
    sampler: Sampler,
    /// (sampler state before the draw, the rank's frames, frames in the global batch) of each
    /// batch requested and not yet handed out.
    pending: VecDeque<(Sampler, Draw, usize)>,
    req: Option<mpsc::Sender<Draw>>,
    res: mpsc::Receiver<Result<Option<HostBatch>>>,
    worker: Option<JoinHandle<()>>,
    /// (rank, size) of the data-parallel world.
    world: (usize, usize),
}

impl Prefetcher {
    pub fn new(
        store: Arc<SystemStore>,
        spec: ModelSpec,
        sampler: Sampler,
        depth: usize,
        world: (usize, usize),
        resident: Vec<bool>,
    ) -> Self {
        let (req_tx, req_rx) = mpsc::channel::<Draw>();
        let (res_tx, res_rx) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("dpw-batches".into())
            .spawn(move || {
                for draw in req_rx {
                    let r = assemble_draw(&spec, &store, &draw, &resident, "training");
                    if res_tx.send(r).is_err() {
                        break;
                    }
                }
            })
            .expect("cannot start the batch thread");
        let mut p = Prefetcher {
            sampler,
            pending: VecDeque::new(),
            req: Some(req_tx),
            res: res_rx,
            worker: Some(worker),
            world,
        };
        for _ in 0..depth.max(1) {
            p.request();
        }
        p
    }

    fn request(&mut self) {
        let before = self.sampler.clone();
        let (mine, nglobal) = self.sampler.draw(self.world);
        self.pending.push_back((before, mine.clone(), nglobal));
        if let Some(tx) = &self.req {
            let _ = tx.send(mine);
        }
    }
}

impl Batches for Prefetcher {
    fn next(&mut self) -> Result<StepBatch> {
        let (_, draw, nglobal) = self.pending.pop_front().expect("always one pending");
        let batch = self
            .res
            .recv()
            .map_err(|_| anyhow!("the batch thread stopped"))??;
        self.request();
        Ok(StepBatch {
            draw,
            batch,
            nglobal,
        })
    }

    fn state(&self) -> Sampler {
        self.pending
            .front()
            .map_or_else(|| self.sampler.clone(), |(s, ..)| s.clone())
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.req = None;
        if let Some(w) = self.worker.take() {
            // Unblock the worker if it is waiting to send, then wait for it.
            while self.res.try_recv().is_ok() {}
            let _ = w.join();
        }
    }
}

//! The MPI calls behind [`super::World`] (feature `mpi`), or their serial stand-ins.

#[cfg(feature = "mpi")]
pub use with_mpi::*;
#[cfg(not(feature = "mpi"))]
pub use without_mpi::*;

#[cfg(not(feature = "mpi"))]
mod without_mpi {
    use super::super::{launcher_world_size, refuse_launcher_world_without_mpi, World};

    /// Nothing to finalize without MPI.
    pub struct Guard;

    pub fn init() -> anyhow::Result<(Guard, World)> {
        refuse_launcher_world_without_mpi(launcher_world_size())?;
        Ok((Guard, World::serial()))
    }

    // Never called: the world is serial.
    pub fn sum_into(_: &[f64], _: &mut [f64]) {}
    pub fn min_max(x: u64) -> (u64, u64) {
        (x, x)
    }
    pub fn all_gather_bytes(b: &[u8]) -> Vec<Vec<u8>> {
        vec![b.to_vec()]
    }
    pub fn gather_to_root(_: usize, _: usize, b: &[u8]) -> Vec<Vec<u8>> {
        vec![b.to_vec()]
    }
    pub fn barrier() {}
    pub fn broadcast(_: &mut [f64]) {}
    pub fn broadcast_bytes(_: &mut [u8]) {}
    pub fn abort(code: i32) -> ! {
        std::process::exit(code)
    }
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use mpi::collective::SystemOperation;
    use mpi::datatype::PartitionMut;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use mpi::Count;

    use super::super::{hostname, launcher_local_rank, launcher_world_size, World};

    /// Holds MPI open: dropping it calls `MPI_Finalize`.
    pub struct Guard(#[allow(dead_code)] Option<mpi::environment::Universe>);

    fn world() -> SimpleCommunicator {
        SimpleCommunicator::world()
    }

    /// MPI is initialized only when a launcher started dpw (so a plain `dpw train` needs no MPI
    /// runtime); only the main thread calls MPI.
    pub fn init() -> anyhow::Result<(Guard, World)> {
        if launcher_world_size().is_none() {
            return Ok((Guard(None), World::serial()));
        }
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| anyhow::anyhow!("MPI was already initialized"))?;
        let w = universe.world();
        let (rank, size) = (w.rank() as usize, w.size() as usize);
        // Ranks sharing a node (memory): the local rank picks the GPU.
        let node = w.split_shared(w.rank());
        let (local_rank, local_size) = (node.rank() as usize, node.size() as usize);
        if let Some(env) = launcher_local_rank() {
            if env != local_rank {
                tracing::debug!("local rank {local_rank} (MPI) but {env} in the environment");
            }
        }
        let host = mpi::environment::processor_name().unwrap_or_else(|_| hostname());
        let library = mpi::environment::library_version()
            .ok()
            .and_then(|v| {
                v.lines()
                    .next()
                    .map(|l| l.split(',').next().unwrap_or(l).trim().to_string())
            })
            .unwrap_or_else(|| "MPI".into());
        Ok((
            Guard(Some(universe)),
            World {
                rank,
                size,
                local_rank,
                local_size,
                host,
                library: Some(library),
            },
        ))
    }

    pub fn sum_into(send: &[f64], recv: &mut [f64]) {
        world().all_reduce_into(send, recv, SystemOperation::sum());
    }

    pub fn min_max(x: u64) -> (u64, u64) {
        let (mut lo, mut hi) = (0u64, 0u64);
        world().all_reduce_into(&x, &mut lo, SystemOperation::min());
        world().all_reduce_into(&x, &mut hi, SystemOperation::max());
        (lo, hi)
    }

    fn displs(counts: &[Count]) -> Vec<Count> {
        counts
            .iter()
            .scan(0, |acc, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect()
    }

    pub fn all_gather_bytes(b: &[u8]) -> Vec<Vec<u8>> {
        let w = world();
        let n = w.size() as usize;
        let mut counts = vec![0 as Count; n];
        w.all_gather_into(&(b.len() as Count), &mut counts[..]);
        let d = displs(&counts);
        let total: Count = counts.iter().sum();
        let mut buf = vec![0u8; total as usize];
        {
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &d[..]);
            w.all_gather_varcount_into(b, &mut part);
        }
        (0..n)
            .map(|r| buf[d[r] as usize..(d[r] + counts[r]) as usize].to_vec())
            .collect()
    }

    pub fn gather_to_root(rank: usize, size: usize, b: &[u8]) -> Vec<Vec<u8>> {
        let w = world();
        if rank == 0 {
            let mut out = vec![b.to_vec()];
            for r in 1..size {
                let (v, _) = w.process_at_rank(r as i32).receive_vec::<u8>();
                out.push(v);
            }
            out
        } else {
            w.process_at_rank(0).send(b);
            Vec::new()
        }
    }

    pub fn barrier() {
        world().barrier();
    }

    pub fn broadcast(buf: &mut [f64]) {
        world().process_at_rank(0).broadcast_into(buf);
    }

    pub fn broadcast_bytes(buf: &mut [u8]) {
        world().process_at_rank(0).broadcast_into(buf);
    }

    pub fn abort(code: i32) -> ! {
        world().abort(code)
    }
}

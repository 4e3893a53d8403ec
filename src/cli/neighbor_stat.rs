//! `dpw neighbor-stat`: the smallest pair distance and the largest neighbour count per type
//! within rcut over every frame of some systems, like `dp neighbor-stat` (what `sel: "auto"`
//! is computed from).

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::data::{load_system, Disk};
use crate::train::dataset::find_systems;
use crate::train::stats::{neighbor_stats, NeighborStats};

/// Searches `systems` for deepmd/npy systems, loads them with `type_map` and scans them.
pub fn neighbor_stat(systems: &[PathBuf], rcut: f64, type_map: &[String]) -> Result<NeighborStats> {
    if !(rcut.is_finite() && rcut > 0.0) {
        anyhow::bail!("--rcut {rcut}: expected a positive cut-off radius in Å");
    }
    let paths = find_systems(&Disk, systems, "neighbor-stat")?;
    let loaded = paths
        .iter()
        .map(|p| load_system(p, type_map).with_context(|| format!("system {}", p.display())))
        .collect::<Result<Vec<_>>>()?;
    let ns = neighbor_stats(&loaded, type_map.len(), rcut);
    tracing::info!(
        "{} frames in {} system(s), rcut {rcut}, types {}",
        ns.nframes,
        loaded.len(),
        type_map.join(", ")
    );
    Ok(ns)
}

/// The two lines `dp neighbor-stat` ends with.
pub fn report(ns: &NeighborStats) -> String {
    format!(
        "min_nbor_dist: {:.6}\nmax_nbor_size: {:?}\n",
        ns.min_dist, ns.max_count
    )
}

//! `dpw neighbor-stat`: the smallest pair distance and the largest neighbour count per type
//! within rcut over every frame of some systems, like `dp neighbor-stat` (what `sel: "auto"`
//! is computed from).

use std::path::PathBuf;

use anyhow::Result;

use crate::config::{AutoProb, BatchSizeSpec, DataConfig};
use crate::data::Labels;
use crate::train::dataset::load_data;
use crate::train::stats::{neighbor_stats, NeighborStats};

/// Searches `systems` for deepmd/npy systems, loads them with `type_map` and scans them;
/// `mixed_type`: one count of all types together, as a se_atten's sel "auto" is made from.
pub fn neighbor_stat(
    systems: &[PathBuf],
    rcut: f64,
    type_map: &[String],
    mixed_type: bool,
) -> Result<NeighborStats> {
    if !(rcut.is_finite() && rcut > 0.0) {
        anyhow::bail!("--rcut {rcut}: expected a positive cut-off radius in Å");
    }
    // The training loader, so that the systems are searched, checked and read as `train` does.
    let cfg = DataConfig {
        systems: systems.iter().map(|p| p.display().to_string()).collect(),
        systems_string: false,
        system_paths: systems.to_vec(),
        batch_size: BatchSizeSpec::Fixed(1),
        auto_prob: AutoProb::Uniform,
        sys_probs: None,
    };
    // Coordinates, cells and types are all it reads: data without labels is fine, as for
    // `dp neighbor-stat`.
    let data = load_data(&cfg, type_map, rcut, "neighbor-stat", &Labels::Optional)?;
    let ns = neighbor_stats(&data, type_map.len(), rcut, mixed_type)?;
    tracing::info!(
        "{} frames in {} system(s), rcut {rcut}, types {}",
        ns.nframes,
        data.systems.len(),
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

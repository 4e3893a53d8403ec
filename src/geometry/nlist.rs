//! DeePMD-kit's neighbour list (docs/deepmd-spec.md §2): the `Σsel` nearest atoms (any type) inside rcut over
//! all periodic images, then split into type sections of `sel[t]` slots, nearest first.

use super::{wrapped, Cell, ImageGrid};

/// Neighbour slots of every atom of one frame, `nnei = Σsel` slots per atom in type sections.
#[derive(Clone, Debug)]
pub struct NeighborList {
    pub nnei: usize,
    /// Owner (local atom index) of each slot, −1 for a padded slot. `[natoms][nnei]`.
    pub owner: Vec<i32>,
    /// r_j − r_i of each slot (zero for padded slots). `[natoms][nnei][3]`.
    pub rij: Vec<f64>,
    /// Largest number of neighbours of each type found inside rcut, for sel statistics.
    pub max_count: Vec<usize>,
    /// Smallest pair distance seen.
    pub min_dist: f64,
}

/// `coord` is `[natoms][3]`, `cell` the 9 box numbers (None: no periodicity).
pub fn build_nlist(
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
    rcut: f64,
    sel: &[usize],
) -> NeighborList {
    let nnei: usize = sel.iter().sum();
    let mut owner = vec![-1i32; atype.len() * nnei];
    let mut rij = vec![0.0; atype.len() * nnei * 3];
    let (max_count, min_dist) = visit_nlist(coord, cell, atype, rcut, sel, |i, kept| {
        let mut slot = i * nnei;
        for (list, &width) in kept.iter().zip(sel) {
            for (k, &(j, d)) in list.iter().enumerate() {
                owner[slot + k] = j as i32;
                rij[3 * (slot + k)..3 * (slot + k + 1)].copy_from_slice(&d);
            }
            slot += width;
        }
    });
    NeighborList {
        nnei,
        owner,
        rij,
        max_count,
        min_dist,
    }
}

/// The neighbour list of [`build_nlist`] one atom at a time, without its padding: `f(i, kept)`
/// for every atom in order, `kept[t]` holding the (owner, r_j − r_i) of atom `i`'s slots of
/// type `t` that are filled, nearest first (the padded slots follow them in the list).
/// Returns the largest neighbour count per type inside rcut and the smallest pair distance.
pub fn visit_nlist(
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
    rcut: f64,
    sel: &[usize],
    mut f: impl FnMut(usize, &[Vec<(usize, [f64; 3])>]),
) -> (Vec<usize>, f64) {
    let n = atype.len();
    let nt = sel.len();
    let nnei: usize = sel.iter().sum();
    let pos = wrapped(coord, cell);
    let grid = ImageGrid::new(&pos, cell, rcut);
    let rc2 = rcut * rcut;
    let mut max_count = vec![0usize; nt];
    let mut min_d2 = f64::INFINITY;
    // Per candidate: its sort key (distance², then extended index: DeePMD's stable sort over
    // extended atoms) with its position in `found` in the low bits, so that the sort moves
    // 16-byte integers. A distance² is never negative, so its bits order as its values. Keys
    // are kept per type: when no more than nnei candidates are found (sel large enough, the
    // usual case) each type keeps its own nearest, and sorting the types apart is cheaper.
    let mut keys: Vec<Vec<u128>> = vec![Vec::new(); nt];
    let mut all: Vec<u128> = Vec::new();
    let mut found: Vec<(usize, [f64; 3])> = Vec::new();
    let mut kept: Vec<Vec<(usize, [f64; 3])>> = vec![Vec::new(); nt];
    for i in 0..n {
        keys.iter_mut().for_each(Vec::clear);
        kept.iter_mut().for_each(Vec::clear);
        found.clear();
        grid.neighbours(i, rc2, |e, j, d, d2| {
            min_d2 = min_d2.min(d2);
            keys[atype[j]]
                .push((u128::from(d2.to_bits()) << 64) | ((e as u128) << 32) | found.len() as u128);
            found.push((j, d));
        });
        for (m, k) in max_count.iter_mut().zip(&keys) {
            *m = (*m).max(k.len());
        }
        if found.len() <= nnei {
            for ((k, list), &width) in keys.iter_mut().zip(&mut kept).zip(sel) {
                if k.len() > width {
                    k.select_nth_unstable(width);
                    k.truncate(width);
                }
                k.sort_unstable();
                list.extend(k.iter().map(|&k| found[(k as u32) as usize]));
            }
        } else {
            // More candidates than slots: the nnei nearest of any type, as DeePMD-kit keeps them.
            all.clear();
            keys.iter().for_each(|k| all.extend(k));
            all.sort_unstable();
            for &k in all.iter().take(nnei) {
                let (j, d) = found[(k as u32) as usize];
                if kept[atype[j]].len() < sel[atype[j]] {
                    kept[atype[j]].push((j, d));
                }
            }
        }
        f(i, &kept);
    }
    (max_count, min_d2.sqrt())
}

/// DPA-1's mixed-type neighbour list (DeePMD-kit's `build_neighbor_list` with
/// `distinguish_types=False`): per atom ONE section of `nnei` slots, the nearest neighbours of
/// any type within rcut, nearest first (ties by extended index, as [`visit_nlist`]), truncated
/// to nnei, then padding (owner −1). `max_count` has one entry: the largest neighbour count of
/// any type together (DeePMD-kit's mixed-type sel statistic).
pub fn build_nlist_mixed(
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
    rcut: f64,
    nnei: usize,
) -> NeighborList {
    let mut owner = vec![-1i32; atype.len() * nnei];
    let mut rij = vec![0.0; atype.len() * nnei * 3];
    let (max_count, min_dist) = visit_nlist_mixed(coord, cell, rcut, nnei, |i, kept| {
        for (k, &(j, d)) in kept.iter().enumerate() {
            let slot = i * nnei + k;
            owner[slot] = j as i32;
            rij[3 * slot..3 * slot + 3].copy_from_slice(&d);
        }
    });
    NeighborList {
        nnei,
        owner,
        rij,
        max_count: vec![max_count],
        min_dist,
    }
}

/// [`build_nlist_mixed`] one atom at a time, without its padding: `f(i, kept)` for every atom
/// in order, `kept` the (owner, r_j − r_i) of its filled slots, nearest first. Returns the
/// largest neighbour count (all types) inside rcut and the smallest pair distance.
pub fn visit_nlist_mixed(
    coord: &[f64],
    cell: Option<&Cell>,
    rcut: f64,
    nnei: usize,
    mut f: impl FnMut(usize, &[(usize, [f64; 3])]),
) -> (usize, f64) {
    let n = coord.len() / 3;
    let pos = wrapped(coord, cell);
    let grid = ImageGrid::new(&pos, cell, rcut);
    let rc2 = rcut * rcut;
    let mut max_count = 0usize;
    let mut min_d2 = f64::INFINITY;
    // The sort key of [`visit_nlist`]: distance², then extended index, then the position in
    // `found`.
    let mut keys: Vec<u128> = Vec::new();
    let mut found: Vec<(usize, [f64; 3])> = Vec::new();
    let mut kept: Vec<(usize, [f64; 3])> = Vec::new();
    for i in 0..n {
        keys.clear();
        kept.clear();
        found.clear();
        grid.neighbours(i, rc2, |e, j, d, d2| {
            min_d2 = min_d2.min(d2);
            keys.push((u128::from(d2.to_bits()) << 64) | ((e as u128) << 32) | found.len() as u128);
            found.push((j, d));
        });
        max_count = max_count.max(keys.len());
        if keys.len() > nnei {
            keys.select_nth_unstable(nnei);
            keys.truncate(nnei);
        }
        keys.sort_unstable();
        kept.extend(keys.iter().map(|&k| found[(k as u32) as usize]));
        f(i, &kept);
    }
    (max_count, min_d2.sqrt())
}

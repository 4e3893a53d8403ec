//! DeePMD-kit's neighbour list (docs/deepmd-spec.md §2): the `Σsel` nearest atoms (any type) inside rcut over
//! all periodic images, then split into type sections of `sel[t]` slots, nearest first.

use super::{Cell, ImageGrid};

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
    let (max_count, min_dist) =
        visit_nlist(coord, cell, atype, rcut, sel, |i, slot_owner, slot_rij| {
            owner[i * nnei..(i + 1) * nnei].copy_from_slice(slot_owner);
            for (dst, src) in rij[3 * i * nnei..3 * (i + 1) * nnei]
                .chunks_exact_mut(3)
                .zip(slot_rij)
            {
                dst.copy_from_slice(src);
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

/// The neighbour list of [`build_nlist`] one atom at a time: `f(i, owner, rij)` for every atom
/// in order, with the `nnei` slots of atom `i` (owner −1 and rij zero where a slot is padded).
/// Returns the largest neighbour count per type inside rcut and the smallest pair distance.
pub fn visit_nlist(
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
    rcut: f64,
    sel: &[usize],
    mut f: impl FnMut(usize, &[i32], &[[f64; 3]]),
) -> (Vec<usize>, f64) {
    let n = atype.len();
    let nt = sel.len();
    let nnei: usize = sel.iter().sum();
    let pos: Vec<[f64; 3]> = coord
        .chunks_exact(3)
        .map(|r| {
            let r = [r[0], r[1], r[2]];
            cell.map_or(r, |c| c.wrap(r))
        })
        .collect();
    let grid = ImageGrid::new(&pos, cell, rcut);
    let rc2 = rcut * rcut;
    let sections: Vec<usize> = std::iter::once(0)
        .chain(sel.iter().scan(0, |s, &x| {
            *s += x;
            Some(*s)
        }))
        .collect();
    let mut max_count = vec![0usize; nt];
    let mut min_d2 = f64::INFINITY;
    // Per candidate: its sort key (distance², then extended index: DeePMD's stable sort over
    // extended atoms) with its position in `found` in the low bits, so that the sort moves
    // 16-byte integers. A distance² is never negative, so its bits order as its values.
    let mut keys: Vec<u128> = Vec::new();
    let mut found: Vec<(usize, [f64; 3])> = Vec::new();
    let (mut count, mut filled) = (vec![0usize; nt], vec![0usize; nt]);
    let mut owner = vec![-1i32; nnei];
    let mut rij = vec![[0.0; 3]; nnei];
    for i in 0..n {
        keys.clear();
        found.clear();
        count.fill(0);
        grid.neighbours(i, rc2, |e, j, d, d2| {
            count[atype[j]] += 1;
            keys.push((u128::from(d2.to_bits()) << 64) | ((e as u128) << 32) | found.len() as u128);
            found.push((j, d));
        });
        keys.sort_unstable();
        for (m, &c) in max_count.iter_mut().zip(&count) {
            *m = (*m).max(c);
        }
        if let Some(&k) = keys.first() {
            min_d2 = min_d2.min(f64::from_bits((k >> 64) as u64));
        }
        owner.fill(-1);
        rij.fill([0.0; 3]);
        filled.fill(0);
        for &k in keys.iter().take(nnei) {
            let (j, d) = found[(k as u32) as usize];
            let t = atype[j];
            if filled[t] < sel[t] {
                let slot = sections[t] + filled[t];
                owner[slot] = j as i32;
                rij[slot] = d;
                filled[t] += 1;
            }
        }
        f(i, &owner, &rij);
    }
    (max_count, min_d2.sqrt())
}

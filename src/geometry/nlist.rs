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

struct Candidate {
    d2: f64,
    ext: usize,
    owner: usize,
    rij: [f64; 3],
}

/// `coord` is `[natoms][3]`, `cell` the 9 box numbers (None: no periodicity).
pub fn build_nlist(
    coord: &[f64],
    cell: Option<&Cell>,
    atype: &[usize],
    rcut: f64,
    sel: &[usize],
) -> NeighborList {
    let n = atype.len();
    let nt = sel.len();
    let nnei: usize = sel.iter().sum();
    let pos: Vec<[f64; 3]> = (0..n)
        .map(|i| {
            let r = [coord[3 * i], coord[3 * i + 1], coord[3 * i + 2]];
            cell.map_or(r, |c| c.wrap(r))
        })
        .collect();
    let grid = ImageGrid::new(&pos, cell, rcut);
    let rc2 = rcut * rcut;
    let mut owner = vec![-1i32; n * nnei];
    let mut rij = vec![0.0; n * nnei * 3];
    let mut max_count = vec![0usize; nt];
    let mut min_d2 = f64::INFINITY;
    let mut cands: Vec<Candidate> = Vec::new();
    let sections: Vec<usize> = std::iter::once(0)
        .chain(sel.iter().scan(0, |s, &x| {
            *s += x;
            Some(*s)
        }))
        .collect();
    for i in 0..n {
        cands.clear();
        grid.neighbours(i, rc2, |ext, rij, d2| {
            cands.push(Candidate {
                d2,
                ext,
                owner: grid.owner(ext),
                rij,
            })
        });
        // Ascending distance, ties by extended index: DeePMD's stable sort over extended atoms.
        cands.sort_unstable_by(|a, b| a.d2.total_cmp(&b.d2).then(a.ext.cmp(&b.ext)));
        let mut count = vec![0usize; nt];
        for c in &cands {
            count[atype[c.owner]] += 1;
        }
        for t in 0..nt {
            max_count[t] = max_count[t].max(count[t]);
        }
        if let Some(c) = cands.first() {
            min_d2 = min_d2.min(c.d2);
        }
        let mut filled = vec![0usize; nt];
        for c in cands.iter().take(nnei) {
            let t = atype[c.owner];
            if filled[t] < sel[t] {
                let slot = i * nnei + sections[t] + filled[t];
                owner[slot] = c.owner as i32;
                rij[3 * slot..3 * slot + 3].copy_from_slice(&c.rij);
                filled[t] += 1;
            }
        }
    }
    NeighborList {
        nnei,
        owner,
        rij,
        max_count,
        min_dist: min_d2.sqrt(),
    }
}

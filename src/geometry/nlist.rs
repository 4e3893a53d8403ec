//! DeePMD-kit's neighbour list (docs/deepmd-spec.md §2): the `Σsel` nearest atoms (any type) inside rcut over
//! all periodic images, then split into type sections of `sel[t]` slots, nearest first.

use super::Cell;

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
    let shifts = image_shifts(cell, rcut);
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
        for (si, sh) in shifts.iter().enumerate() {
            for (j, pj) in pos.iter().enumerate() {
                if si == 0 && j == i {
                    continue;
                }
                let d = [
                    pj[0] + sh[0] - pos[i][0],
                    pj[1] + sh[1] - pos[i][1],
                    pj[2] + sh[2] - pos[i][2],
                ];
                let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if d2 <= rc2 {
                    cands.push(Candidate {
                        d2,
                        ext: si * n + j,
                        owner: j,
                        rij: d,
                    });
                }
            }
        }
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

/// Cartesian shifts of the periodic images that can hold a neighbour within rcut, the
/// zero shift first, ordered by the norm of the integer shift as DeePMD-kit orders them.
fn image_shifts(cell: Option<&Cell>, rcut: f64) -> Vec<[f64; 3]> {
    let Some(c) = cell else {
        return vec![[0.0; 3]];
    };
    let nb = c.face_distances().map(|f| (rcut / f).ceil() as i64);
    let mut ints = Vec::new();
    for a in -nb[0]..=nb[0] {
        for b in -nb[1]..=nb[1] {
            for k in -nb[2]..=nb[2] {
                ints.push([a, b, k]);
            }
        }
    }
    ints.sort_by_key(|s| s[0] * s[0] + s[1] * s[1] + s[2] * s[2]);
    ints.iter()
        .map(|s| c.to_cart(s.map(|x| x as f64)))
        .collect()
}

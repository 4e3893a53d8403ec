//! The periodic images of a frame's atoms that can lie within rcut of an atom, binned so that an
//! atom's neighbours are found among a few dozen candidates rather than among every image of
//! every atom (the statistics of a large data set are mostly this search).

use std::collections::HashMap;

use super::Cell;

/// Every image `s` of every atom `j` within reach, as extended atom `e = s·n + j` (the unshifted
/// atoms first, so atom i is extended atom i), binned into cubes a little wider than rcut: the
/// atoms within rcut of a point lie in the 27 cubes around the point's own.
pub struct ImageGrid {
    pos: Vec<[f64; 3]>,
    ext: Vec<[f64; 3]>,
    lo: [f64; 3],
    side: f64,
    bins: HashMap<[i64; 3], Vec<usize>>,
}

impl ImageGrid {
    /// `pos` are the atoms' positions, already wrapped into the cell when there is one.
    pub fn new(pos: &[[f64; 3]], cell: Option<&Cell>, rcut: f64) -> Self {
        let ext: Vec<[f64; 3]> = image_shifts(cell, rcut)
            .iter()
            .flat_map(|sh| {
                pos.iter()
                    .map(move |p| [p[0] + sh[0], p[1] + sh[1], p[2] + sh[2]])
            })
            .collect();
        let mut lo = [f64::INFINITY; 3];
        for r in &ext {
            for a in 0..3 {
                lo[a] = lo[a].min(r[a]);
            }
        }
        // Wider than rcut by a margin far above rounding, so that no pair within rcut is two
        // cubes apart.
        let side = rcut * (1.0 + 1e-6);
        let mut grid = ImageGrid {
            pos: pos.to_vec(),
            ext,
            lo,
            side,
            bins: HashMap::new(),
        };
        for e in 0..grid.ext.len() {
            let key = grid.bin(grid.ext[e]);
            grid.bins.entry(key).or_default().push(e);
        }
        grid
    }

    fn bin(&self, r: [f64; 3]) -> [i64; 3] {
        [0, 1, 2].map(|a| ((r[a] - self.lo[a]) / self.side).floor() as i64)
    }

    /// The atom an extended atom is an image of.
    pub fn owner(&self, e: usize) -> usize {
        e % self.pos.len()
    }

    /// Calls `f(e, d, d2)` for every extended atom `e` other than atom `i` itself with
    /// d = r_e − r_i and |d|² = d2 ≤ `rc2`, in no particular order.
    pub fn neighbours(&self, i: usize, rc2: f64, mut f: impl FnMut(usize, [f64; 3], f64)) {
        let pi = self.pos[i];
        let b = self.bin(pi);
        for da in -1..=1 {
            for db in -1..=1 {
                for dc in -1..=1 {
                    let Some(items) = self.bins.get(&[b[0] + da, b[1] + db, b[2] + dc]) else {
                        continue;
                    };
                    for &e in items {
                        if e == i {
                            continue;
                        }
                        let r = self.ext[e];
                        let d = [r[0] - pi[0], r[1] - pi[1], r[2] - pi[2]];
                        let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                        if d2 <= rc2 {
                            f(e, d, d2);
                        }
                    }
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The binned search finds exactly the pairs a search over every image of every atom finds,
    /// with the same r_e − r_i, in a skewed cell thinner than rcut and without a cell.
    #[test]
    fn binned_search_equals_the_search_over_every_image() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let rows = [7.0, 0.0, 0.0, 2.5, 4.5, 0.0, -1.0, 1.5, 9.0];
        let cell = Cell::new(&rows).unwrap();
        for (cell, n) in [(Some(&cell), 40), (None, 60)] {
            let pos: Vec<[f64; 3]> = (0..n)
                .map(|_| {
                    let r = [0, 1, 2].map(|_| 12.0 * uniform() - 3.0);
                    cell.map_or(r, |c| c.wrap(r))
                })
                .collect();
            let rcut = 5.0;
            let grid = ImageGrid::new(&pos, cell, rcut);
            for (i, pi) in pos.iter().enumerate() {
                let mut found = Vec::new();
                grid.neighbours(i, rcut * rcut, |e, d, d2| found.push((e, d, d2)));
                found.sort_by_key(|x| x.0);
                let mut all = Vec::new();
                for (e, r) in grid.ext.iter().enumerate() {
                    let d = [r[0] - pi[0], r[1] - pi[1], r[2] - pi[2]];
                    let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                    if e != i && d2 <= rcut * rcut {
                        all.push((e, d, d2));
                    }
                }
                assert!(!all.is_empty());
                assert_eq!(found, all, "atom {i}");
            }
        }
    }
}

//! The periodic images of a frame's atoms that can lie within rcut of an atom, binned so that an
//! atom's neighbours are found among a few dozen candidates rather than among every image of
//! every atom (the statistics of a large data set are mostly this search).

use super::Cell;

/// Bins per rcut along each direction: an atom's neighbours lie in the 5 × 5 × 5 bins around
/// its own, a volume of (2.5 rcut)³ searched instead of the (3 rcut)³ of rcut-wide bins.
const SPLIT: usize = 2;

/// Every image `s` of every atom `j` within reach, as extended atom `e = s·n + j` (the unshifted
/// atoms first, so atom i is extended atom i). The images that can lie within rcut of an atom
/// are binned into a dense grid of cubes, in bin order (a counting sort), so that a search visits
/// a few contiguous runs of memory.
pub struct ImageGrid {
    pos: Vec<[f64; 3]>,
    lo: [f64; 3],
    /// 1 / bin side.
    inv_side: f64,
    dims: [usize; 3],
    /// Bins searched on each side of an atom's own: `SPLIT` for bins of rcut / `SPLIT`, fewer
    /// for the wider bins of spread-out atoms or a short cut-off.
    span: usize,
    /// Bin `b`'s images are entries `start[b]..start[b + 1]` of the binned arrays: extended
    /// index, owner and coordinates, in separate arrays for a tight search loop.
    start: Vec<u32>,
    ext_of: Vec<u32>,
    owner_of: Vec<u32>,
    xyz: [Vec<f64>; 3],
}

/// A frame's flat coordinates as positions, wrapped into the cell when there is one: what
/// [`ImageGrid::new`] takes.
pub fn wrapped(coord: &[f64], cell: Option<&Cell>) -> Vec<[f64; 3]> {
    coord
        .chunks_exact(3)
        .map(|r| {
            let r = [r[0], r[1], r[2]];
            cell.map_or(r, |c| c.wrap(r))
        })
        .collect()
}

impl ImageGrid {
    /// `pos` are the atoms' positions, already wrapped into the cell when there is one.
    pub fn new(pos: &[[f64; 3]], cell: Option<&Cell>, rcut: f64) -> Self {
        let shifts = image_shifts(cell, rcut);
        let n = pos.len();
        assert!(
            u32::try_from(shifts.len() * n).is_ok(),
            "{} periodic images exceed the grid's u32 indices",
            shifts.len() * n
        );
        // Only images within rcut of the atoms' bounding box can be anyone's neighbour; the
        // margin, far above rounding, keeps every pair within rcut inside the box and the bins.
        let reach = rcut * (1.0 + 1e-6);
        let (mut lo, mut hi) = ([f64::INFINITY; 3], [f64::NEG_INFINITY; 3]);
        for p in pos {
            for a in 0..3 {
                lo[a] = lo[a].min(p[a] - reach);
                hi[a] = hi[a].max(p[a] + reach);
            }
        }
        let inside = |r: &[f64; 3]| (0..3).all(|a| r[a] >= lo[a] && r[a] <= hi[a]);
        // (extended index, owner, position) of the images kept.
        let mut kept: Vec<(u32, u32, [f64; 3])> = Vec::with_capacity(n);
        for (s, sh) in shifts.iter().enumerate() {
            for (j, p) in pos.iter().enumerate() {
                let r = [p[0] + sh[0], p[1] + sh[1], p[2] + sh[2]];
                if inside(&r) {
                    kept.push(((s * n + j) as u32, j as u32, r));
                }
            }
        }
        // Bins a little wider than rcut / SPLIT, so that a pair within rcut is at most SPLIT
        // bins apart per direction; wider still when the atoms are spread far apart (a
        // molecule without a cell), so that the grid holds about as many bins as images.
        let (mut side, mut span) = (reach / SPLIT as f64, SPLIT);
        let dims_of = |side: f64| -> [usize; 3] {
            [0, 1, 2].map(|a| (((hi[a] - lo[a]) / side).floor() as usize).saturating_add(1))
        };
        while dims_of(side).iter().map(|&d| d as f64).product::<f64>()
            > 8.0 * kept.len() as f64 + 64.0
        {
            side *= 2.0;
            // A pair within reach is at most ⌈reach / side⌉ bins apart.
            span = span.div_ceil(2);
        }
        let dims = dims_of(side);
        let mut grid = ImageGrid {
            pos: pos.to_vec(),
            lo,
            inv_side: 1.0 / side,
            dims,
            span,
            start: vec![0; dims.iter().product::<usize>() + 1],
            ext_of: vec![0; kept.len()],
            owner_of: vec![0; kept.len()],
            xyz: [0, 1, 2].map(|_| vec![0.0; kept.len()]),
        };
        let bins: Vec<usize> = kept.iter().map(|k| grid.flat(grid.bin(k.2))).collect();
        for &b in &bins {
            grid.start[b + 1] += 1;
        }
        for b in 0..grid.start.len() - 1 {
            grid.start[b + 1] += grid.start[b];
        }
        let mut next = grid.start.clone();
        for (&(e, j, r), &b) in kept.iter().zip(&bins) {
            let k = next[b] as usize;
            next[b] += 1;
            grid.ext_of[k] = e;
            grid.owner_of[k] = j;
            for (xs, x) in grid.xyz.iter_mut().zip(r) {
                xs[k] = x;
            }
        }
        grid
    }

    /// The bin of a point inside the box, per direction.
    fn bin(&self, r: [f64; 3]) -> [usize; 3] {
        [0, 1, 2].map(|a| (((r[a] - self.lo[a]) * self.inv_side) as usize).min(self.dims[a] - 1))
    }

    fn flat(&self, b: [usize; 3]) -> usize {
        (b[2] * self.dims[1] + b[1]) * self.dims[0] + b[0]
    }

    /// The atom an extended atom is an image of (what the search passes along with it).
    #[cfg(test)]
    fn owner(&self, e: usize) -> usize {
        e % self.pos.len()
    }

    /// Calls `f(k)` for each contiguous run `k` of binned entries that can hold atom `i`'s
    /// neighbours (one per row of bins around it).
    fn for_runs(&self, i: usize, mut f: impl FnMut(std::ops::Range<usize>)) {
        let b = self.bin(self.pos[i]);
        let lo = b.map(|x| x.saturating_sub(self.span));
        let hi: [usize; 3] = std::array::from_fn(|a| (b[a] + self.span).min(self.dims[a] - 1));
        for z in lo[2]..=hi[2] {
            for y in lo[1]..=hi[1] {
                let row = self.flat([0, y, z]);
                f(self.start[row + lo[0]] as usize..self.start[row + hi[0] + 1] as usize);
            }
        }
    }

    /// Calls `f(e, j, d, d2)` for every extended atom `e` (an image of atom `j`) other than atom
    /// `i` itself with d = r_e − r_i and |d|² = d2 ≤ `rc2`, in no particular order.
    pub fn neighbours(&self, i: usize, rc2: f64, mut f: impl FnMut(usize, usize, [f64; 3], f64)) {
        let pi = self.pos[i];
        self.for_runs(i, |run| {
            let xs = &self.xyz[0][run.clone()];
            let ys = &self.xyz[1][run.clone()];
            let zs = &self.xyz[2][run.clone()];
            let es = &self.ext_of[run.clone()];
            let os = &self.owner_of[run];
            for ((((&x, &y), &z), &e), &o) in xs.iter().zip(ys).zip(zs).zip(es).zip(os) {
                let d = [x - pi[0], y - pi[1], z - pi[2]];
                let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if d2 <= rc2 && e as usize != i {
                    f(e as usize, o as usize, d, d2);
                }
            }
        });
    }

    /// What [`neighbours`](Self::neighbours) finds, only counted: adds to `count[t]` the
    /// neighbours of atom `i` whose atom has type `atype[..] = t`, and returns the smallest d2
    /// among them (∞ when none), for the statistics over every frame.
    pub fn count(&self, i: usize, rc2: f64, atype: &[usize], count: &mut [usize]) -> f64 {
        let mut min_d2 = f64::INFINITY;
        self.neighbours(i, rc2, |_, j, _, d2| {
            count[atype[j]] += 1;
            min_d2 = min_d2.min(d2);
        });
        min_d2
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
    /// with the same r_e − r_i, and counts them by type, in a skewed cell thinner than rcut and without a cell (atoms
    /// close together, and spread far apart so that the bins are widened).
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
        for (cell, n, spread) in [(Some(&cell), 40, 12.0), (None, 60, 12.0), (None, 30, 400.0)] {
            let pos: Vec<[f64; 3]> = (0..n)
                .map(|_| {
                    let r = [0, 1, 2].map(|_| spread * uniform() - 3.0);
                    cell.map_or(r, |c| c.wrap(r))
                })
                .collect();
            let rcut = 5.0;
            let grid = ImageGrid::new(&pos, cell, rcut);
            for (i, pi) in pos.iter().enumerate() {
                let mut found = Vec::new();
                grid.neighbours(i, rcut * rcut, |e, j, d, d2| {
                    assert_eq!(j, grid.owner(e));
                    found.push((e, d, d2))
                });
                found.sort_by_key(|x| x.0);
                let types: Vec<usize> = (0..n).map(|j| j % 3).collect();
                let mut count = [0; 3];
                let min_d2 = grid.count(i, rcut * rcut, &types, &mut count);
                let mut want = [0; 3];
                for &(e, _, _) in &found {
                    want[types[grid.owner(e)]] += 1;
                }
                assert_eq!(count, want, "atom {i}");
                let nearest = found.iter().map(|x| x.2).fold(f64::INFINITY, f64::min);
                assert_eq!(min_d2, nearest, "atom {i}");
                let mut all = Vec::new();
                let ext = image_shifts(cell, rcut).into_iter().flat_map(|sh| {
                    pos.iter()
                        .map(move |p| [p[0] + sh[0], p[1] + sh[1], p[2] + sh[2]])
                });
                for (e, r) in ext.enumerate() {
                    let d = [r[0] - pi[0], r[1] - pi[1], r[2] - pi[2]];
                    let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                    if e != i && d2 <= rcut * rcut {
                        all.push((e, d, d2));
                    }
                }
                if spread < 100.0 {
                    assert!(!all.is_empty());
                }
                assert_eq!(found, all, "atom {i}");
            }
        }
    }
}

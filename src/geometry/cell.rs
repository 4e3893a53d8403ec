//! A periodic cell whose rows are the lattice vectors a, b, c (DeePMD-kit's `box.npy` layout).

#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub m: [[f64; 3]; 3],
    inv: [[f64; 3]; 3],
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

impl Cell {
    /// `None` when the cell is singular (zero volume).
    pub fn new(rows: &[f64]) -> Option<Self> {
        let m = [
            [rows[0], rows[1], rows[2]],
            [rows[3], rows[4], rows[5]],
            [rows[6], rows[7], rows[8]],
        ];
        let vol = dot(m[0], cross(m[1], m[2]));
        if !vol.is_finite() || vol.abs() < 1e-12 {
            return None;
        }
        // inv = adj(m) / det; columns of the inverse are the reciprocal vectors.
        let c0 = cross(m[1], m[2]);
        let c1 = cross(m[2], m[0]);
        let c2 = cross(m[0], m[1]);
        let mut inv = [[0.0; 3]; 3];
        for i in 0..3 {
            inv[i] = [c0[i] / vol, c1[i] / vol, c2[i] / vol];
        }
        Some(Cell { m, inv })
    }

    pub fn volume(&self) -> f64 {
        dot(self.m[0], cross(self.m[1], self.m[2])).abs()
    }

    /// Distance between opposite faces, per lattice direction.
    pub fn face_distances(&self) -> [f64; 3] {
        let v = self.volume();
        std::array::from_fn(|i| {
            let c = cross(self.m[(i + 1) % 3], self.m[(i + 2) % 3]);
            v / dot(c, c).sqrt()
        })
    }

    /// Periodic images per direction that can hold a neighbour within `rcut`
    /// (`ceil(rcut / face distance)`), or why there would be too many of them in all.
    pub fn images(&self, rcut: f64) -> Result<[i64; 3], String> {
        let d = self.face_distances();
        let nb = d.map(|f| (rcut / f).ceil());
        let total: f64 = nb.iter().map(|n| 2.0 * n + 1.0).product();
        if total.is_nan() || total > Self::MAX_IMAGES as f64 {
            return Err(format!(
                "with rcut {rcut} Å the cell (face distances {:.3e}, {:.3e}, {:.3e} Å) needs {total:.3e} \
                 periodic images, more than dpw's limit of {}; is box.npy in Å?",
                d[0],
                d[1],
                d[2],
                Self::MAX_IMAGES
            ));
        }
        Ok(nb.map(|n| n as i64))
    }

    /// Most periodic images (the cell itself included) a frame may need for its cut-off: a
    /// one-atom cell with a 12 Å cut-off needs about 2000.
    pub const MAX_IMAGES: u64 = 20_000;

    pub fn to_frac(&self, r: [f64; 3]) -> [f64; 3] {
        std::array::from_fn(|j| (0..3).map(|i| r[i] * self.inv[i][j]).sum())
    }

    pub fn to_cart(&self, s: [f64; 3]) -> [f64; 3] {
        std::array::from_fn(|j| (0..3).map(|i| s[i] * self.m[i][j]).sum())
    }

    /// Wraps a position into the cell as DeePMD-kit's `normalize_coord` does.
    pub fn wrap(&self, r: [f64; 3]) -> [f64; 3] {
        let s = self.to_frac(r);
        self.to_cart(s.map(|x| x.rem_euclid(1.0)))
    }
}

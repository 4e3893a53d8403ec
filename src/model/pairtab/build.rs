//! A pair table from its file as DeePMD-kit builds it (`utils/pair_tab.py`: `PairTab.reinit`,
//! `_check_table_upper_boundary`, `_extrapolate_table`, `_make_data`; spec §19.2), with scipy's
//! `CubicSpline` arithmetic where DeePMD-kit calls it, so the coefficients agree to rounding.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::PairTable;

impl PairTable {
    /// The table of file `path` (rows r, E_00, E_01, …, E_11, …: the upper triangle of the
    /// type pairs), extended to `rcut` as DeePMD-kit does; `sel` neighbours are read.
    pub fn from_file(path: &Path, rcut: f64, sel: usize) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the pair table {}", path.display()))?;
        Self::from_text(&text, rcut, sel).with_context(|| format!("pair table {}", path.display()))
    }

    fn from_text(text: &str, rcut: f64, sel: usize) -> Result<Self> {
        let mut rows: Vec<Vec<f64>> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let row = (line.split_whitespace())
                .map(|x| x.parse::<f64>())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("line {}: not a row of numbers", n + 1))?;
            if let Some(first) = rows.first() {
                if row.len() != first.len() {
                    bail!(
                        "line {}: {} columns, the first row has {}",
                        n + 1,
                        row.len(),
                        first.len()
                    );
                }
            }
            rows.push(row);
        }
        if rows.len() < 2 {
            bail!("{} rows: a table needs at least two", rows.len());
        }
        let ncol = rows[0].len();
        let npairs = ncol - 1;
        let ntypes = ((-1.0 + (1.0 + 8.0 * npairs as f64).sqrt()) * 0.5 + 0.1) as usize;
        if ntypes * (ntypes + 1) / 2 != npairs || npairs == 0 {
            bail!(
                "{ncol} columns: a table of N types has 1 + N(N+1)/2 (r, then E of each type \
                 pair t0 ≤ t1)"
            );
        }
        if rows.windows(2).any(|w| w[1][0] <= w[0][0]) {
            bail!("the distances (first column) must increase");
        }
        let (rmin, rmax) = (rows[0][0], rows[rows.len() - 1][0]);
        let hh = rows[1][0] - rows[0][0];
        if rmin < 0.0 || rcut <= rmin {
            bail!("rcut {rcut} must exceed the table's first distance {rmin} (≥ 0)");
        }
        extend_to_rcut(&mut rows, rmin, rmax, hh, rcut);
        let nspline = rows.len() - 1;
        let tab_data = coefficients(&rows, ntypes, hh);
        Ok(PairTable {
            rmin,
            rmax,
            hh,
            ntypes,
            rcut,
            nspline,
            sel,
            vdata: rows.concat(),
            tab_info: [rmin, hh, nspline as f64, ntypes as f64],
            tab_data,
        })
    }
}

/// numpy's `linspace(start, stop, num)`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = if num > 1 {
        (stop - start) / (num - 1) as f64
    } else {
        0.0
    };
    let mut y: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(last) = y.last_mut() {
        if num > 1 {
            *last = stop;
        }
    }
    y
}

/// `_check_table_upper_boundary`: rows appended up to the grid point at or after rcut, zeros
/// where the table already ends at 0, else a cubic from the last row (its slope the last row
/// difference, not divided by hh) to 0 with zero slope at the last grid point before rcut.
fn extend_to_rcut(rows: &mut Vec<Vec<f64>>, rmin: f64, rmax: f64, hh: f64, rcut: f64) {
    let ncol = rows[0].len();
    let upper = rows.len() - 1;
    let rcut_idx = (rcut / hh - rmin / hh).ceil() as i64;
    if rcut <= rmax || rcut_idx <= upper as i64 {
        return;
    }
    let k = (rcut_idx - upper as i64) as usize;
    let r = linspace(rmax + hh, rmax + hh * k as f64, k);
    let last = rows[upper].clone();
    if last[1..].iter().all(|&v| v == 0.0) {
        rows.extend(r.iter().map(|&x| {
            let mut row = vec![0.0; ncol];
            row[0] = x;
            row
        }));
        return;
    }
    let prev = &rows[upper - 1];
    let grid = if r[k - 1] / hh - rmax / hh >= 2.0 {
        k - 2
    } else {
        k - 1
    };
    let (x0, x1) = (last[0], r[grid]);
    let mut new: Vec<Vec<f64>> = r.iter().map(|&x| vec![x]).collect();
    for col in 1..ncol {
        let slope = last[col] - prev[col];
        // scipy's CubicSpline on two points with both end slopes given: one cubic piece.
        let c = hermite(x0, x1, last[col], 0.0, slope, 0.0);
        for (row, &x) in new.iter_mut().zip(&r) {
            row.push(eval(&c, x - x0));
        }
    }
    if grid == k - 2 {
        new.pop();
    }
    rows.extend(new);
}

/// scipy's piece [c0, c1, c2, c3] (c0 the cubic term) on [x0, x1] from its end values and
/// slopes (`CubicSpline._init`'s formulas).
fn hermite(x0: f64, x1: f64, y0: f64, y1: f64, s0: f64, s1: f64) -> [f64; 4] {
    let dx = x1 - x0;
    let slope = (y1 - y0) / dx;
    let t = (s0 + s1 - 2.0 * slope) / dx;
    [t / dx, (slope - s0) / dx - t, s0, y0]
}

/// scipy's `PPoly` value at s = x − x0 (`evaluate_poly1`, powers of s built by products).
fn eval(c: &[f64; 4], s: f64) -> f64 {
    let mut res = 0.0;
    let mut z = 1.0;
    for kp in 0..4 {
        res += c[3 - kp] * z;
        if kp < 3 {
            z *= s;
        }
    }
    res
}

/// scipy's `PPoly` first derivative at s (`evaluate_poly1` with dx 1).
fn slope_at(c: &[f64; 4], s: f64) -> f64 {
    let mut res = 0.0;
    let mut z = 1.0;
    for kp in 1..4 {
        res += c[3 - kp] * z * kp as f64;
        if kp < 3 {
            z *= s;
        }
    }
    res
}

/// `_make_data`: per type pair a clamped cubic spline (zero slope at both ends) through every
/// row, d_i = hh·S′(r_i), and each interval's cubic in its unit parameter.
fn coefficients(rows: &[Vec<f64>], nt: usize, hh: f64) -> Vec<f64> {
    let n = rows.len();
    let ns = n - 1;
    let x: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    let mut data = vec![0.0; nt * nt * ns * 4];
    let mut col = 1;
    for t0 in 0..nt {
        for t1 in t0..nt {
            let v: Vec<f64> = rows.iter().map(|r| r[col]).collect();
            let s = clamped_slopes(&x, &v);
            // `cs(xx, 1)`: each knot's slope from the piece it starts, the last from the last
            // piece's end.
            let mut d: Vec<f64> = s[..ns].to_vec();
            let c = hermite(x[ns - 1], x[ns], v[ns - 1], v[ns], s[ns - 1], s[ns]);
            d.push(slope_at(&c, x[ns] - x[ns - 1]));
            d.iter_mut().for_each(|di| *di *= hh);
            for i in 0..ns {
                let a = [
                    2.0 * v[i] - 2.0 * v[i + 1] + d[i] + d[i + 1],
                    -3.0 * v[i] + 3.0 * v[i + 1] - 2.0 * d[i] - d[i + 1],
                    d[i],
                    v[i],
                ];
                for (p, q) in [(t0, t1), (t1, t0)] {
                    let at = ((p * nt + q) * ns + i) * 4;
                    data[at..at + 4].copy_from_slice(&a);
                }
            }
            col += 1;
        }
    }
    data
}

/// The knot slopes of scipy's `CubicSpline(x, v, bc_type="clamped")`: its tridiagonal system
/// dx_i·s_{i−1} + 2(dx_{i−1} + dx_i)·s_i + dx_{i−1}·s_{i+1} = 3(dx_i·m_{i−1} + dx_{i−1}·m_i),
/// s_0 = s_{n−1} = 0, solved by elimination (scipy's banded LU, which pivots nothing on this
/// diagonally dominant system).
fn clamped_slopes(x: &[f64], v: &[f64]) -> Vec<f64> {
    let n = x.len();
    if n == 2 {
        return vec![0.0, 0.0];
    }
    let dx: Vec<f64> = x.windows(2).map(|w| w[1] - w[0]).collect();
    let m: Vec<f64> = (0..n - 1).map(|i| (v[i + 1] - v[i]) / dx[i]).collect();
    // Rows: lower, diagonal, upper, right-hand side.
    let (mut lo, mut di, mut up, mut b) = (vec![0.0; n], vec![1.0; n], vec![0.0; n], vec![0.0; n]);
    for i in 1..n - 1 {
        lo[i] = dx[i];
        di[i] = 2.0 * (dx[i - 1] + dx[i]);
        up[i] = dx[i - 1];
        b[i] = 3.0 * (dx[i] * m[i - 1] + dx[i - 1] * m[i]);
    }
    for i in 1..n {
        let f = lo[i] / di[i - 1];
        di[i] -= f * up[i - 1];
        b[i] -= f * b[i - 1];
    }
    let mut s = vec![0.0; n];
    s[n - 1] = b[n - 1] / di[n - 1];
    for i in (0..n - 1).rev() {
        s[i] = (b[i] - up[i] * s[i + 1]) / di[i];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of `tests/reference/pairtab` against DeePMD-kit's own (`table_probe.json`):
    /// its extension to rcut, its coefficients and its pair energies.
    #[test]
    fn reference_table_is_deepmds() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/pairtab");
        let t = PairTable::from_file(&root.join("tab.txt"), 4.0, 40).unwrap();
        let probe: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join("table_probe.json")).unwrap())
                .unwrap();
        let flat = |v: &serde_json::Value| -> Vec<f64> {
            fn go(v: &serde_json::Value, out: &mut Vec<f64>) {
                match v {
                    serde_json::Value::Array(a) => a.iter().for_each(|x| go(x, out)),
                    x => out.push(x.as_f64().unwrap()),
                }
            }
            let mut out = Vec::new();
            go(v, &mut out);
            out
        };
        assert_eq!(t.nspline, 36);
        assert_eq!(t.tab_info.to_vec(), flat(&probe["tab_info"]));
        let worst = |a: &[f64], b: &[f64]| {
            assert_eq!(a.len(), b.len());
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        let rows = worst(&t.vdata, &flat(&probe["vdata_expanded"]));
        let coef = worst(&t.tab_data, &flat(&probe["tab_data"]));
        assert!(
            rows < 1e-15 && coef < 1e-14,
            "rows {rows:e}, coefficients {coef:e}"
        );
        let r = flat(&probe["r"]);
        for (key, ti, tj) in [("00", 0, 0), ("01", 0, 1), ("10", 1, 0), ("11", 1, 1)] {
            let want = flat(&probe["energy"][key]);
            for (&r, &e) in r.iter().zip(&want) {
                match t.pair(ti, tj, r) {
                    Ok((mine, _)) => {
                        assert!((mine - e).abs() < 1e-14, "E_{key}({r}): {mine} vs {e}")
                    }
                    Err(_) => assert!(r < t.rmin, "E_{key}({r}) refused"),
                }
            }
        }
    }

    #[test]
    fn slope_is_the_energys_derivative() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/pairtab");
        let t = PairTable::from_file(&root.join("tab.txt"), 4.0, 40).unwrap();
        for r in [0.43, 0.9573, 1.234, 2.5, 3.55, 3.95] {
            let h = 1e-6;
            let fd = (t.pair(0, 1, r + h).unwrap().0 - t.pair(0, 1, r - h).unwrap().0) / (2.0 * h);
            let de = t.pair(0, 1, r).unwrap().1;
            assert!((fd - de).abs() < 1e-8, "r {r}: {de} vs {fd}");
        }
    }

    #[test]
    fn bad_tables_are_refused() {
        for (text, what) in [
            ("0.1 1 2\n0.2 1 2\n", "columns"),
            ("0.1 1 2 3\n0.2 1 x 3\n", "line 2"),
            ("0.1 1 2 3\n", "rows"),
            ("0.2 1 2 3\n0.1 1 2 3\n", "increase"),
            ("0.1 1 2 3\n0.2 1 2\n", "line 2"),
        ] {
            let e = format!("{:#}", PairTable::from_text(text, 1.0, 4).unwrap_err());
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }
}

//! C's `%.Ne` formatting (`1.234560e+01`), as DeePMD-kit's outputs are written by Python's
//! `%` operator and numpy's `savetxt`.

/// `x` as C's `%.{prec}e`; `width` pads on the left as `%{width}.{prec}e` does.
pub fn sci(x: f64, prec: usize, width: usize) -> String {
    let s = if x.is_finite() {
        let r = format!("{x:.prec$e}");
        let (mant, exp) = r
            .split_once('e')
            .expect("Rust's {:e} always has an exponent");
        let exp: i32 = exp.parse().expect("integer exponent");
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else if x.is_nan() {
        "nan".to_string()
    } else if x > 0.0 {
        "inf".to_string()
    } else {
        "-inf".to_string()
    };
    format!("{s:>width$}")
}

#[cfg(test)]
mod tests {
    use super::sci;

    #[test]
    fn matches_c_printf() {
        assert_eq!(sci(15.1411, 6, 0), "1.514110e+01");
        assert_eq!(sci(-2.994390625e4, 18, 0), "-2.994390625000000000e+04");
        assert_eq!(sci(3.51e-8, 1, 8), " 3.5e-08");
        assert_eq!(sci(0.0, 2, 11), "   0.00e+00");
        assert_eq!(sci(1e-123, 2, 0), "1.00e-123");
        assert_eq!(sci(f64::NAN, 2, 11), "        nan");
    }
}

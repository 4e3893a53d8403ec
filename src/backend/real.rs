//! The floating-point types a backend computes in (DeePMD's `precision`: float64 or float32).

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, MulAssign, SubAssign};

use num_traits::Float;

pub trait Real:
    Float
    + AddAssign
    + SubAssign
    + MulAssign
    + Sum
    + Default
    + Debug
    + Send
    + Sync
    + bytemuck::Pod
    + 'static
{
    const NAME: &'static str;

    fn of(x: f64) -> Self;
    fn f64(self) -> f64;

    /// `c[m×n] = alpha·op(a)·op(b) + beta·c` on row-major matrices given by strides.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: &[Self],
        a_rs: isize,
        a_cs: isize,
        b: &[Self],
        b_rs: isize,
        b_cs: isize,
        beta: Self,
        c: &mut [Self],
        c_rs: isize,
    );
}

macro_rules! impl_real {
    ($t:ty, $name:literal, $gemm:path) => {
        impl Real for $t {
            const NAME: &'static str = $name;
            fn of(x: f64) -> Self {
                x as $t
            }
            fn f64(self) -> f64 {
                self as f64
            }
            fn gemm(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: &[Self],
                a_rs: isize,
                a_cs: isize,
                b: &[Self],
                b_rs: isize,
                b_cs: isize,
                beta: Self,
                c: &mut [Self],
                c_rs: isize,
            ) {
                if m == 0 || n == 0 {
                    return;
                }
                let last = |rows: usize, cols: usize, rs: isize, cs: isize| {
                    (rows as isize - 1) * rs + (cols as isize - 1) * cs
                };
                // matrixmultiply takes raw pointers; check every touched index is in bounds.
                assert!(k == 0 || last(m, k, a_rs, a_cs) < a.len() as isize);
                assert!(k == 0 || last(k, n, b_rs, b_cs) < b.len() as isize);
                assert!(last(m, n, c_rs, 1) < c.len() as isize);
                // SAFETY: the bounds of all three matrices were checked just above.
                unsafe {
                    $gemm(
                        m,
                        k,
                        n,
                        alpha,
                        a.as_ptr(),
                        a_rs,
                        a_cs,
                        b.as_ptr(),
                        b_rs,
                        b_cs,
                        beta,
                        c.as_mut_ptr(),
                        c_rs,
                        1,
                    )
                }
            }
        }
    };
}

impl_real!(f64, "float64", matrixmultiply::dgemm);
impl_real!(f32, "float32", matrixmultiply::sgemm);

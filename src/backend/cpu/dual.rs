//! Numbers with a tangent, so that one generic forward pass is also its tangent pass and one
//! generic backward pass also its dual reverse (docs/design.md §11.4):
//!
//! - forward on `x + εẋ` gives `f(x) + ε f'(x)ẋ` (the tangent pass);
//! - the backward (vector–Jacobian product) on `x + εẋ` with cotangent `ẏ̄ + εȳ` gives
//!   `f'(x)ᵀẏ̄ + ε (f'(x)ᵀȳ + (f''(x)ẋ)ᵀẏ̄)`: the real part is ẋ̄ and the ε part x̄ of the
//!   (value, tangent) pair, and for a parameter θ (tangent 0) the ε part is θ̄ — what the dual
//!   reverse of §3.2 needs, the second derivative included, without deriving it by hand.
//!
//! Used where the math per centre is long (DPA-1's attention) and a hand-written dual would be
//! a second copy of it to keep right.

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

use num_traits::Float;

use super::exp::exp_in_place;
use super::gemm::{small_gemm, small_gemm_into, small_gemm_to, Mat, MatMut, Prod};
use crate::backend::Real;

/// What the generic passes compute with: a real `R`, or a [`Dual`] of `R`.
pub trait Num<R: Real>:
    Copy
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Default
{
    /// A constant (tangent 0).
    fn of(x: R) -> Self;
    /// The value, for branches (a floor, the softmax's shift): they follow the value alone.
    fn re(self) -> R;
    fn sqrt(self) -> Self;
    /// `self · r` for a constant r.
    fn scale(self, r: R) -> Self;
    /// e^x of each number in place, for values ≤ 0 (a softmax's shifted logits), many at a
    /// time (exp.rs).
    fn exp_nonpos(x: &mut [Self]);
    /// `v + εd`; a real keeps v alone (the passes that carry no tangent).
    fn pair(v: R, d: R) -> Self;
    /// f(self) for a real function given as `f(v) = (f(v), f'(v))` at the value: the chain
    /// rule for the tangent (DPA-3's activations and switches).
    fn apply(self, f: impl Fn(R) -> (R, R)) -> Self;
    /// f(z) and f'(z) of each z into `f` and `s` (a function and its slope from one evaluation,
    /// for a backward that needs both), with `eval(x, y, dy, d2y)` giving f, f' and f'' of a
    /// slice of reals at once; `work` is scratch.
    fn apply2_slice(
        z: &[Self],
        f: &mut [Self],
        s: &mut [Self],
        work: &mut Vec<R>,
        eval: impl Fn(&[R], &mut [R], &mut [R], &mut [R]),
    );
    /// C (+)= A·B through gemm.rs's kernel: a real product, or a dual one as real ones
    /// ((A + εA')(B + εB') = AB + ε(A'B + AB')). `work` is scratch for a dual's parts.
    fn gemm(p: Prod, a: Mat<Self>, b: &[Self], c: &mut [Self], work: &mut Vec<R>);
    /// [`Num::gemm`] with B real (a layer's weights).
    fn gemm_r(p: Prod, a: Mat<Self>, b: &[R], c: &mut [Self], work: &mut Vec<R>);
    /// [`Num::gemm`] into a parameter gradient: of a dual product only the ε part is formed
    /// (C's value parts are left as they are), as the dual reverse reads the ε parts alone;
    /// the value part was a third of the product.
    fn gemm_grad(p: Prod, a: Mat<Self>, b: &[Self], c: &mut [Self], work: &mut Vec<R>);

    fn zero() -> Self {
        Self::of(R::zero())
    }
}

impl<R: Real> Num<R> for R {
    fn of(x: R) -> Self {
        x
    }
    fn re(self) -> R {
        self
    }
    fn sqrt(self) -> Self {
        Float::sqrt(self)
    }
    fn scale(self, r: R) -> Self {
        self * r
    }
    fn exp_nonpos(x: &mut [Self]) {
        exp_in_place(x, |v| *v, |v, e| *v = e);
    }
    fn pair(v: R, _: R) -> Self {
        v
    }
    fn apply(self, f: impl Fn(R) -> (R, R)) -> Self {
        f(self).0
    }
    fn apply2_slice(
        z: &[Self],
        f: &mut [Self],
        s: &mut [Self],
        work: &mut Vec<R>,
        eval: impl Fn(&[R], &mut [R], &mut [R], &mut [R]),
    ) {
        let n = z.len();
        let (d2y, _, _, _) = split_work(work, [n, 0, 0, 0]);
        eval(z, f, s, d2y);
    }
    fn gemm(p: Prod, a: Mat<Self>, b: &[Self], c: &mut [Self], _: &mut Vec<R>) {
        Self::gemm_r(p, a, b, c, &mut Vec::new());
    }
    fn gemm_r(p: Prod, a: Mat<Self>, b: &[R], c: &mut [Self], _: &mut Vec<R>) {
        small_gemm_into(p, a, b, c);
    }
    fn gemm_grad(p: Prod, a: Mat<Self>, b: &[Self], c: &mut [Self], _: &mut Vec<R>) {
        small_gemm_into(p, a, b, c);
    }
}

/// `v + ε d` with ε² = 0. `repr(C)`: a slice of them is a slice of reals, v and d in turn
/// ([`parts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Dual<R> {
    pub v: R,
    pub d: R,
}

impl<R: Real> Dual<R> {
    pub fn new(v: R, d: R) -> Self {
        Dual { v, d }
    }
}

impl<R: Real> Add for Dual<R> {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Dual::new(self.v + o.v, self.d + o.d)
    }
}

impl<R: Real> Sub for Dual<R> {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Dual::new(self.v - o.v, self.d - o.d)
    }
}

impl<R: Real> Mul for Dual<R> {
    type Output = Self;
    fn mul(self, o: Self) -> Self {
        Dual::new(self.v * o.v, self.d * o.v + self.v * o.d)
    }
}

impl<R: Real> Div for Dual<R> {
    type Output = Self;
    fn div(self, o: Self) -> Self {
        let q = self.v / o.v;
        Dual::new(q, (self.d - q * o.d) / o.v)
    }
}

impl<R: Real> Neg for Dual<R> {
    type Output = Self;
    fn neg(self) -> Self {
        Dual::new(-self.v, -self.d)
    }
}

impl<R: Real> AddAssign for Dual<R> {
    fn add_assign(&mut self, o: Self) {
        *self = *self + o;
    }
}

impl<R: Real> SubAssign for Dual<R> {
    fn sub_assign(&mut self, o: Self) {
        *self = *self - o;
    }
}

impl<R: Real> MulAssign for Dual<R> {
    fn mul_assign(&mut self, o: Self) {
        *self = *self * o;
    }
}

impl<R: Real> Num<R> for Dual<R> {
    fn of(x: R) -> Self {
        Dual::new(x, R::zero())
    }
    fn re(self) -> R {
        self.v
    }
    fn sqrt(self) -> Self {
        let s = Float::sqrt(self.v);
        Dual::new(s, self.d / (s + s))
    }
    fn scale(self, r: R) -> Self {
        Dual::new(self.v * r, self.d * r)
    }
    fn exp_nonpos(x: &mut [Self]) {
        exp_in_place(x, |x| x.v, |x, e| *x = Dual::new(e, x.d * e));
    }
    fn pair(v: R, d: R) -> Self {
        Dual::new(v, d)
    }
    fn apply(self, f: impl Fn(R) -> (R, R)) -> Self {
        let (y, dy) = f(self.v);
        Dual::new(y, dy * self.d)
    }
    fn apply2_slice(
        z: &[Self],
        f: &mut [Self],
        s: &mut [Self],
        work: &mut Vec<R>,
        eval: impl Fn(&[R], &mut [R], &mut [R], &mut [R]),
    ) {
        let n = z.len();
        let (x, y, dy, d2y) = split_work(work, [n; 4]);
        super::simd::wide(
            #[inline(always)]
            || {
                for (x, z) in x.iter_mut().zip(z) {
                    *x = z.v;
                }
            },
        );
        eval(x, y, dy, d2y);
        super::simd::wide(
            #[inline(always)]
            || {
                for (i, z) in z.iter().enumerate() {
                    f[i] = Dual::new(y[i], dy[i] * z.d);
                    s[i] = Dual::new(dy[i], d2y[i] * z.d);
                }
            },
        );
    }
    fn gemm(p: Prod, a: Mat<Self>, b: &[Self], c: &mut [Self], work: &mut Vec<R>) {
        let (cv, cd) = dual_gemm(p, a, b, true, work);
        join(p, cv, cd, c);
    }
    fn gemm_grad(p: Prod, a: Mat<Self>, b: &[Self], c: &mut [Self], work: &mut Vec<R>) {
        let (_, cd) = dual_gemm(p, a, b, false, work);
        for (row, d) in c.chunks_mut(p.c_rs).zip(cd.chunks(p.n)).take(p.m) {
            for (x, &d) in row[..p.n].iter_mut().zip(d) {
                x.d = if p.acc { x.d + d } else { d };
            }
        }
    }
    fn gemm_r(p: Prod, a: Mat<Self>, b: &[R], c: &mut [Self], _: &mut Vec<R>) {
        // B real: C's values and tangents are each a real product, written in place.
        let (av, ad) = mat_parts(a);
        let f = parts_mut(c);
        let (rs, cs) = (2 * p.c_rs, 2);
        small_gemm_to(
            p,
            ad,
            b,
            MatMut {
                v: &mut f[1..],
                rs,
                cs,
            },
        );
        small_gemm_to(p, av, b, MatMut { v: f, rs, cs });
    }
}

/// The parts of the dual product A·B into scratch: (AB, A'B + AB'), the first formed only
/// `with_value`.
fn dual_gemm<'w, R: Real>(
    p: Prod,
    a: Mat<'_, Dual<R>>,
    b: &[Dual<R>],
    with_value: bool,
    work: &'w mut Vec<R>,
) -> (&'w [R], &'w [R]) {
    // The kernel reads B's rows in place, so B's parts are copied out; A's are read through
    // strides.
    let (kn, mn) = (p.k * p.n, p.m * p.n);
    let (bv, bd, cv, cd) = split_work(work, [kn, kn, if with_value { mn } else { 0 }, mn]);
    for (i, row) in b.chunks(p.b_rs).take(p.k).enumerate() {
        for (j, x) in row[..p.n].iter().enumerate() {
            bv[i * p.n + j] = x.v;
            bd[i * p.n + j] = x.d;
        }
    }
    let (av, ad) = mat_parts(a);
    if with_value {
        small_gemm(p.m, p.k, p.n, av, bv, p.n, false, cv);
    }
    small_gemm(p.m, p.k, p.n, ad, bv, p.n, false, cd);
    small_gemm(p.m, p.k, p.n, av, bd, p.n, true, cd);
    (cv, cd)
}

/// The reals of a slice of duals: v₀, d₀, v₁, d₁, …
fn parts<R: Real>(x: &[Dual<R>]) -> &[R] {
    // SAFETY: `Dual<R>` is `repr(C)` of two R, so n of them are 2n R in this order, aligned
    // as R.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<R>(), 2 * x.len()) }
}

/// [`parts`], to write.
fn parts_mut<R: Real>(x: &mut [Dual<R>]) -> &mut [R] {
    // SAFETY: as in `parts`; the borrow of x is held by the result.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<R>(), 2 * x.len()) }
}

/// A matrix of duals as its matrix of values and its matrix of tangents.
fn mat_parts<R: Real>(a: Mat<'_, Dual<R>>) -> (Mat<'_, R>, Mat<'_, R>) {
    let f = parts(a.v);
    let (rs, cs) = (2 * a.rs, 2 * a.cs);
    (
        Mat { v: f, rs, cs },
        Mat {
            v: f.get(1..).unwrap_or(&[]),
            rs,
            cs,
        },
    )
}

/// Four scratch slices of the given lengths from `work`, grown as needed (never shrunk: the
/// same shapes come back centre after centre).
fn split_work<R: Real>(
    work: &mut Vec<R>,
    len: [usize; 4],
) -> (&mut [R], &mut [R], &mut [R], &mut [R]) {
    let total = len.iter().sum();
    if work.len() < total {
        work.resize(total, R::zero());
    }
    let (a, w) = work.split_at_mut(len[0]);
    let (b, w) = w.split_at_mut(len[1]);
    let (c, w) = w.split_at_mut(len[2]);
    (a, b, c, &mut w[..len[3]])
}

/// C (+)= (cv + ε cd) `[m][n]`, C's rows `c_rs` apart.
fn join<R: Real>(p: Prod, cv: &[R], cd: &[R], c: &mut [Dual<R>]) {
    for (i, row) in c.chunks_mut(p.c_rs).take(p.m).enumerate() {
        let (v, d) = (&cv[i * p.n..(i + 1) * p.n], &cd[i * p.n..(i + 1) * p.n]);
        for ((x, &v), &d) in row[..p.n].iter_mut().zip(v).zip(d) {
            *x = if p.acc {
                Dual::new(x.v + v, x.d + d)
            } else {
                Dual::new(v, d)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_of_the_elementary_functions() {
        let x = Dual::new(0.7_f64, 1.0);
        let mut e = [x.scale(-1.0)];
        Num::exp_nonpos(&mut e);
        let y = (x * x + e[0]) / x.sqrt() - x.scale(3.0);
        let f = |x: f64| (x * x + (-x).exp()) / x.sqrt() - 3.0 * x;
        let h = 1e-6;
        let fd = (f(0.7 + h) - f(0.7 - h)) / (2.0 * h);
        assert!((y.v - f(0.7)).abs() < 1e-15, "{} vs {}", y.v, f(0.7));
        assert!((y.d - fd).abs() < 1e-8, "{} vs {fd}", y.d);
    }

    /// A dual product through the real GEMMs against the product of the numbers.
    #[test]
    fn gemm_of_duals() {
        let (m, k, n) = (5, 7, 3);
        let val = |i: usize, s: f64| Dual::new((i as f64 * s).sin(), (i as f64 * s).cos());
        let a: Vec<Dual<f64>> = (0..m * k).map(|i| val(i, 0.3)).collect();
        let b: Vec<Dual<f64>> = (0..k * (n + 2)).map(|i| val(i, 0.7)).collect();
        let c = vec![Dual::new(1.0, 2.0); m * (n + 1)];
        let p = Prod {
            m,
            k,
            n,
            b_rs: n + 2,
            c_rs: n + 1,
            acc: true,
        };
        let at = Mat {
            v: &a,
            rs: 1,
            cs: m,
        };
        // The product in full, with B real (its values), and into a gradient (ε parts alone).
        let br: Vec<f64> = b.iter().map(|x| x.v).collect();
        let (mut full, mut real, mut grad) = (c.clone(), c.clone(), c.clone());
        Num::gemm(p, at, &b, &mut full, &mut Vec::new());
        Num::gemm_r(p, at, &br, &mut real, &mut Vec::new());
        Num::gemm_grad(p, at, &b, &mut grad, &mut Vec::new());
        let close = |x: f64, y: f64| (x - y).abs() < 1e-13;
        for i in 0..m {
            for j in 0..n + 1 {
                let (want, want_r) = if j < n {
                    let sum = |b: &dyn Fn(usize) -> Dual<f64>| {
                        (0..k).fold(Dual::new(1.0, 2.0), |s, q| s + a[q * m + i] * b(q))
                    };
                    let at = |q: usize| q * (n + 2) + j;
                    (sum(&|q| b[at(q)]), sum(&|q| Dual::new(br[at(q)], 0.0)))
                } else {
                    (Dual::new(1.0, 2.0), Dual::new(1.0, 2.0))
                };
                let e = i * (n + 1) + j;
                assert!(close(full[e].v, want.v) && close(full[e].d, want.d));
                assert!(close(real[e].v, want_r.v) && close(real[e].d, want_r.d));
                assert!(grad[e].v == 1.0 && close(grad[e].d, want.d));
            }
        }
    }
}

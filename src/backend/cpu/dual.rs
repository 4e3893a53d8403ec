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
{
    /// A constant (tangent 0).
    fn of(x: R) -> Self;
    /// The value, for branches (a floor, the softmax's shift): they follow the value alone.
    fn re(self) -> R;
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    /// `self · r` for a constant r.
    fn scale(self, r: R) -> Self;

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
    fn exp(self) -> Self {
        Float::exp(self)
    }
    fn scale(self, r: R) -> Self {
        self * r
    }
}

/// `v + ε d` with ε² = 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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
    fn exp(self) -> Self {
        let e = Float::exp(self.v);
        Dual::new(e, self.d * e)
    }
    fn scale(self, r: R) -> Self {
        Dual::new(self.v * r, self.d * r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_of_the_elementary_functions() {
        let x = Dual::new(0.7_f64, 1.0);
        let y = (x * x + x.exp()) / x.sqrt() - x.scale(3.0);
        let f = |x: f64| (x * x + x.exp()) / x.sqrt() - 3.0 * x;
        let h = 1e-6;
        let fd = (f(0.7 + h) - f(0.7 - h)) / (2.0 * h);
        assert_eq!(y.v, f(0.7));
        assert!((y.d - fd).abs() < 1e-8, "{} vs {fd}", y.d);
    }
}

//! Adam exactly as torch.optim.Adam computes it (the reference's optimizer, docs/deepmd-spec.md §11).

use rayon::prelude::*;

use crate::backend::{AdamStep, Real};

pub fn adam<T: Real>(s: AdamStep, params: &mut [T], grad: &[T], m: &mut [T], v: &mut [T]) {
    let bc1 = 1.0 - s.beta1.powi(s.t as i32);
    let bc2_sqrt = (1.0 - s.beta2.powi(s.t as i32)).sqrt();
    let step = T::of(s.lr / bc1);
    let (b1, b2, eps, bc2) = (
        T::of(s.beta1),
        T::of(s.beta2),
        T::of(s.eps),
        T::of(bc2_sqrt),
    );
    params
        .par_iter_mut()
        .zip(grad.par_iter())
        .zip(m.par_iter_mut().zip(v.par_iter_mut()))
        .for_each(|((p, &g), (m, v))| {
            *m = *m * b1 + g * (T::one() - b1);
            *v = *v * b2 + g * g * (T::one() - b2);
            let denom = v.sqrt() / bc2 + eps;
            *p -= step * *m / denom;
        });
}

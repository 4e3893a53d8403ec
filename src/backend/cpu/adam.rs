//! Adam exactly as torch.optim.Adam computes it (the reference's optimizer, docs/deepmd-spec.md
//! §11), with torch's weight decay (Adam's L2 term, AdamW's decoupled decay).

use rayon::prelude::*;

use super::simd::wide;
use crate::backend::{AdamStep, Real, WeightDecay};

/// Parameters per task: whole slices, so that each task's loop is vectorised (a division and a
/// square root per parameter make the update compute-bound, not memory-bound).
const CHUNK: usize = 8192;

pub fn adam<T: Real>(s: AdamStep, params: &mut [T], grad: &[T], m: &mut [T], v: &mut [T]) {
    let [(from, own), (fit_from, fit)] = s.tail_corrections(params.len());
    let (p0, p1) = params.split_at_mut(from);
    let (m0, m1) = m.split_at_mut(from);
    let (v0, v1) = v.split_at_mut(from);
    let (g0, g1) = grad.split_at(from);
    update(&s, s.corrections(s.t), p0, g0, m0, v0);
    let at = fit_from - from;
    let (p1, p2) = p1.split_at_mut(at);
    let (m1, m2) = m1.split_at_mut(at);
    let (v1, v2) = v1.split_at_mut(at);
    let (g1, g2) = g1.split_at(at);
    update(&s, own, p1, g1, m1, v1);
    update(&s, fit, p2, g2, m2, v2);
}

/// Adam on one stretch of parameters with the bias corrections `(lr / bc1, sqrt(bc2))`.
fn update<T: Real>(
    s: &AdamStep,
    (step, bc2_sqrt): (f64, f64),
    params: &mut [T],
    grad: &[T],
    m: &mut [T],
    v: &mut [T],
) {
    let step = T::of(step);
    let (keep, l2) = s.decay_factors();
    let decays = s.decay != WeightDecay::None;
    let (keep, l2) = (T::of(keep), T::of(l2));
    let (b1, b2, eps, bc2) = (
        T::of(s.beta1),
        T::of(s.beta2),
        T::of(s.eps),
        T::of(bc2_sqrt),
    );
    params
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| {
            wide(
                #[inline(always)]
                || {
                    let moments = m.iter_mut().zip(v.iter_mut());
                    for ((p, &g), (m, v)) in p.iter_mut().zip(g).zip(moments) {
                        let g = if decays { g + l2 * *p } else { g };
                        if decays {
                            *p *= keep;
                        }
                        *m = *m * b1 + g * (T::one() - b1);
                        *v = *v * b2 + g * g * (T::one() - b2);
                        let denom = v.sqrt() / bc2 + eps;
                        *p -= step * *m / denom;
                    }
                },
            )
        });
}

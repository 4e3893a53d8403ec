//! se_e2_r's descriptor D_c = k Σ_slots G_s (k = [`radial_scale`]) and its derivatives.
//!
//! Work is split per centre, as in the se_e2_a contraction (`contract.rs`), whose slot walks
//! these share.

use rayon::prelude::*;

use super::contract::{dot, per_slot, sections};
use super::simd::wide;
use crate::backend::{radial_scale, Dims, Real};

/// `out_c = k Σ_{s of c} x_s ⊙ w_s` (w_s = 1 without weights), `[nc][M1]`.
fn slot_sum<T: Real>(d: &Dims, x: &[T], w: Option<&[T]>, out: &mut [T]) {
    let m1 = d.m1;
    let k = T::of(radial_scale(d));
    out.par_chunks_mut(m1).enumerate().for_each(|(c, oc)| {
        wide(
            #[inline(always)]
            || {
                oc.fill(T::zero());
                for s in sections(d, c).flatten() {
                    let ws = w.map_or(T::one(), |w| w[s]);
                    let xs = &x[s * m1..(s + 1) * m1];
                    oc.iter_mut().zip(xs).for_each(|(o, x)| *o += ws * *x);
                }
                oc.iter_mut().for_each(|o| *o *= k);
            },
        )
    });
}

pub fn forward<T: Real>(d: &Dims, g: &[T], desc: &mut [T]) {
    slot_sum(d, g, None, desc);
}

pub fn tangent<T: Real>(d: &Dims, gp: &[T], sdot: &[T], ddot: &mut [T]) {
    slot_sum(d, gp, Some(sdot), ddot);
}

pub fn backward<T: Real>(d: &Dims, dbar: &[T], gp: &[T], jac: &[T], q: &mut [T]) {
    let m1 = d.m1;
    let k = T::of(radial_scale(d));
    per_slot(
        d,
        q,
        3,
        #[inline(always)]
        |c, s, qs| {
            let sbar = k * dot(&gp[s * m1..(s + 1) * m1], &dbar[c * m1..(c + 1) * m1]);
            for (x, q) in qs.iter_mut().enumerate() {
                *q = jac[12 * s + x] * sbar;
            }
        },
    );
}

pub fn dual<T: Real>(d: &Dims, dbar: &[T], ddotbar: &[T], gbar: &mut [T], gdotbar: &mut [T]) {
    let m1 = d.m1;
    let k = T::of(radial_scale(d));
    for (from, to) in [(dbar, gbar), (ddotbar, gdotbar)] {
        per_slot(
            d,
            to,
            m1,
            #[inline(always)]
            |c, _, row| {
                let fc = &from[c * m1..(c + 1) * m1];
                row.iter_mut().zip(fc).for_each(|(r, f)| *r = k * *f);
            },
        );
    }
}

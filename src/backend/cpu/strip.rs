//! se_atten_v2's strip (docs/design.md §11.1 step 4) on host slices: G⁰ = G_s ⊙ (1 + c τ) per
//! slot and its dual reverse, on [`StripArgs`] over anything that reads as slices. The cpu
//! backend runs these on its buffers; the `AttnOps` defaults run them on downloaded copies.

use rayon::prelude::*;

use crate::backend::{Real, StripArgs};

/// Slot s's row of τ.
fn row<B: ?Sized, I: AsRef<[i32]> + ?Sized>(x: &StripArgs<'_, B, I>, s: usize) -> usize {
    let j = x.nei_type.as_ref()[s] as usize;
    if x.one_side {
        j
    } else {
        x.centre_type.as_ref()[s] as usize * x.ntypes + j
    }
}

/// Slot s's c (σ when smooth, else 1) and c' = dc/dŝ.
fn c<T: Real, B: AsRef<[T]> + ?Sized, I: ?Sized>(x: &StripArgs<'_, B, I>, s: usize) -> (T, T) {
    if x.smooth {
        (x.sw.as_ref()[s], x.dsw.as_ref()[s])
    } else {
        (T::one(), T::zero())
    }
}

/// G⁰ = G_s ⊙ (1 + c τ) and G⁰' = G_s' ⊙ (1 + c τ) + G_s ⊙ τ c' per slot.
pub fn forward<T: Real, B: AsRef<[T]> + Sync + ?Sized, I: AsRef<[i32]> + Sync + ?Sized>(
    x: &StripArgs<'_, B, I>,
    g0: &mut [T],
    g0p: &mut [T],
) {
    let (m, gs, gsp, tau) = (x.m1, x.gs.as_ref(), x.gsp.as_ref(), x.tau.as_ref());
    g0.par_chunks_mut(m)
        .zip(g0p.par_chunks_mut(m))
        .enumerate()
        .for_each(|(s, (g, gp))| {
            let (c, cp) = c(x, s);
            let tau = &tau[row(x, s) * m..][..m];
            for k in 0..m {
                let (i, t) = (s * m + k, tau[k]);
                g[k] = gs[i] * (T::one() + c * t);
                gp[k] = gsp[i] * (T::one() + c * t) + gs[i] * t * cp;
            }
        });
}

/// The dual reverse of [`forward`] for the tangent ṡ, from (Ḡ⁰, Ġ̄⁰): (Ḡ_s, Ġ̄_s) per slot and
/// τ̄ per table row (written; summed over the slots in order, so the sum does not depend on the
/// thread count). With Ġ⁰ = Ġ_s (1 + cτ) + G_s τ ċ (Ġ_s = G_s'ṡ, ċ = c'ṡ, which no parameter
/// moves): Ḡ_s = Ḡ⁰(1 + cτ) + Ġ̄⁰ τ ċ, Ġ̄_s = Ġ̄⁰(1 + cτ), τ̄ = Ḡ⁰ G_s c + Ġ̄⁰ (Ġ_s c + G_s ċ).
pub fn dual<T: Real, B: AsRef<[T]> + Sync + ?Sized, I: AsRef<[i32]> + Sync + ?Sized>(
    x: &StripArgs<'_, B, I>,
    sdot: &[T],
    (gb, gdb): (&[T], &[T]),
    (sb, sdb): (&mut [T], &mut [T]),
    taubar: &mut [T],
) {
    let (m, gs, gsp, tau) = (x.m1, x.gs.as_ref(), x.gsp.as_ref(), x.tau.as_ref());
    sb.par_chunks_mut(m)
        .zip(sdb.par_chunks_mut(m))
        .enumerate()
        .for_each(|(s, (sb, sdb))| {
            let (c, cp) = c(x, s);
            let cdot = cp * sdot[s];
            let tau = &tau[row(x, s) * m..][..m];
            for k in 0..m {
                let (i, t) = (s * m + k, tau[k]);
                let one = T::one() + c * t;
                sb[k] = gb[i] * one + gdb[i] * t * cdot;
                sdb[k] = gdb[i] * one;
            }
        });
    taubar.fill(T::zero());
    for s in 0..x.nei_type.as_ref().len() {
        let (c, cp) = c(x, s);
        let cdot = cp * sdot[s];
        let tb = &mut taubar[row(x, s) * m..][..m];
        for (k, tv) in tb.iter_mut().enumerate() {
            let i = s * m + k;
            let gsdot = gsp[i] * sdot[s];
            *tv += gb[i] * gs[i] * c + gdb[i] * (gsdot * c + gs[i] * cdot);
        }
    }
}

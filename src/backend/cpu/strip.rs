//! se_atten_v2's strip (docs/design.md §11.1 step 4) on host slices: G⁰ = G_s ⊙ (1 + c τ) per
//! slot and its dual reverse. The cpu backend runs these on its buffers; the `AttnOps` defaults
//! run them on downloaded copies.

use rayon::prelude::*;

use crate::backend::Real;

/// What the strip reads, per slot: G_s and G_s' = ∂G_s/∂ŝ `[nslots][M1]`, the neighbour's and
/// the centre's type, σ and dσ/dŝ; and the type net's table τ `[pairs][M1]` (row t_i·ntypes +
/// t_j, or t_j with type_one_side).
pub struct StripIn<'a, T> {
    pub ntypes: usize,
    pub m1: usize,
    pub one_side: bool,
    /// c = σ when smooth, else 1.
    pub smooth: bool,
    pub gs: &'a [T],
    pub gsp: &'a [T],
    pub tau: &'a [T],
    pub nei_type: &'a [i32],
    pub centre_type: &'a [i32],
    pub sw: &'a [T],
    pub dsw: &'a [T],
}

impl<T: Real> StripIn<'_, T> {
    /// Slot s's row of τ.
    fn row(&self, s: usize) -> usize {
        let j = self.nei_type[s] as usize;
        if self.one_side {
            j
        } else {
            self.centre_type[s] as usize * self.ntypes + j
        }
    }

    /// Slot s's c and c' = dc/dŝ.
    fn c(&self, s: usize) -> (T, T) {
        if self.smooth {
            (self.sw[s], self.dsw[s])
        } else {
            (T::one(), T::zero())
        }
    }
}

/// G⁰ = G_s ⊙ (1 + c τ) and G⁰' = G_s' ⊙ (1 + c τ) + G_s ⊙ τ c' per slot.
pub fn forward<T: Real>(x: &StripIn<'_, T>, g0: &mut [T], g0p: &mut [T]) {
    let m = x.m1;
    g0.par_chunks_mut(m)
        .zip(g0p.par_chunks_mut(m))
        .enumerate()
        .for_each(|(s, (g, gp))| {
            let (c, cp) = x.c(s);
            let tau = &x.tau[x.row(s) * m..][..m];
            for k in 0..m {
                let (i, t) = (s * m + k, tau[k]);
                g[k] = x.gs[i] * (T::one() + c * t);
                gp[k] = x.gsp[i] * (T::one() + c * t) + x.gs[i] * t * cp;
            }
        });
}

/// The dual reverse of [`forward`] for the tangent ṡ, from (Ḡ⁰, Ġ̄⁰): (Ḡ_s, Ġ̄_s) per slot and
/// τ̄ per table row (written; summed over the slots in order, so the sum does not depend on the
/// thread count). With Ġ⁰ = Ġ_s (1 + cτ) + G_s τ ċ (Ġ_s = G_s'ṡ, ċ = c'ṡ, which no parameter
/// moves): Ḡ_s = Ḡ⁰(1 + cτ) + Ġ̄⁰ τ ċ, Ġ̄_s = Ġ̄⁰(1 + cτ), τ̄ = Ḡ⁰ G_s c + Ġ̄⁰ (Ġ_s c + G_s ċ).
pub fn dual<T: Real>(
    x: &StripIn<'_, T>,
    sdot: &[T],
    (gb, gdb): (&[T], &[T]),
    (sb, sdb): (&mut [T], &mut [T]),
    taubar: &mut [T],
) {
    let m = x.m1;
    sb.par_chunks_mut(m)
        .zip(sdb.par_chunks_mut(m))
        .enumerate()
        .for_each(|(s, (sb, sdb))| {
            let (c, cp) = x.c(s);
            let cdot = cp * sdot[s];
            let tau = &x.tau[x.row(s) * m..][..m];
            for k in 0..m {
                let (i, t) = (s * m + k, tau[k]);
                let one = T::one() + c * t;
                sb[k] = gb[i] * one + gdb[i] * t * cdot;
                sdb[k] = gdb[i] * one;
            }
        });
    taubar.fill(T::zero());
    for s in 0..x.nei_type.len() {
        let (c, cp) = x.c(s);
        let cdot = cp * sdot[s];
        let tb = &mut taubar[x.row(s) * m..][..m];
        for (k, tv) in tb.iter_mut().enumerate() {
            let i = s * m + k;
            let gsdot = x.gsp[i] * sdot[s];
            *tv += gb[i] * x.gs[i] * c + gdb[i] * (gsdot * c + x.gs[i] * cdot);
        }
    }
}

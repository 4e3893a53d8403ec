//! Per-frame energies, and forces and virials scattered from the per-slot ∂E/∂r_ij.
//! Sequential on purpose: a fixed summation order, and the cost is a few adds per slot.

use crate::backend::{Dims, Real};

pub fn energy<T: Real>(d: &Dims, e_fit: &[T], bias: &[T], e_atom: &mut [T], energy: &mut [T]) {
    let mut acc = vec![0.0f64; d.nframes];
    for (t, &bt) in bias.iter().enumerate().take(d.ntypes) {
        for c in d.centres(t) {
            e_atom[c] = e_fit[c] + bt;
            acc[d.centre_frame(c)] += e_atom[c].f64();
        }
    }
    for (e, a) in energy.iter_mut().zip(acc) {
        *e = T::of(a);
    }
}

/// Calls `f(centre, slot)` for every slot, centre by centre.
pub fn for_each_slot(d: &Dims, mut f: impl FnMut(usize, usize)) {
    for ti in 0..d.ntypes {
        for c in d.centres(ti) {
            for tj in d.sections() {
                let first = d.slot(ti, c, tj, 0);
                for s in first..first + d.sel[tj] {
                    f(c, s);
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn force_virial<T: Real>(
    d: &Dims,
    q: &[T],
    rij: &[T],
    owner: &[i32],
    centre_atom: &[i32],
    force: &mut [T],
    virial: &mut [T],
) {
    let mut f = vec![0.0f64; force.len()];
    let mut w = vec![0.0f64; virial.len()];
    for_each_slot(d, |c, s| {
        if owner[s] < 0 {
            return;
        }
        let (i, o) = (centre_atom[c] as usize, owner[s] as usize);
        let fr = d.centre_frame(c);
        for a in 0..3 {
            let qa = q[3 * s + a].f64();
            f[3 * i + a] += qa;
            f[3 * o + a] -= qa;
            for b in 0..3 {
                w[9 * fr + 3 * a + b] -= qa * rij[3 * s + b].f64();
            }
        }
    });
    force.iter_mut().zip(f).for_each(|(x, v)| *x = T::of(v));
    virial.iter_mut().zip(w).for_each(|(x, v)| *x = T::of(v));
}

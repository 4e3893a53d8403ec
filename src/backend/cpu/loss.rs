//! Loss residuals and the virtual displacement that turns the force/virial terms of the loss
//! into a tangent of the environment (docs/design.md §3.2).

use crate::backend::{Dims, LossSums, Prefactors, Real};

use super::scatter::for_each_slot;

#[allow(clippy::too_many_arguments)]
pub fn loss<T: Real>(
    d: &Dims,
    pref: Prefactors,
    pred: [&[T]; 3],
    label: [&[T]; 3],
    ebar: &mut [T],
    fres: &mut [T],
    vres: &mut [T],
) -> LossSums {
    let (n, nf) = (d.natoms as f64, d.nframes as f64);
    let mut sums = LossSums::default();
    let mut ce = vec![0.0; d.nframes];
    for f in 0..d.nframes {
        let de = pred[0][f].f64() - label[0][f].f64();
        sums.e2 += de * de;
        ce[f] = 2.0 * pref.e * de / (n * nf);
    }
    for (r, (p, l)) in fres.iter_mut().zip(pred[1].iter().zip(label[1])) {
        let df = p.f64() - l.f64();
        sums.f2 += df * df;
        *r = T::of(2.0 * pref.f * df / (3.0 * n * nf));
    }
    for (r, (p, l)) in vres.iter_mut().zip(pred[2].iter().zip(label[2])) {
        let dv = p.f64() - l.f64();
        sums.v2 += dv * dv;
        *r = T::of(2.0 * pref.v * dv / (9.0 * n * nf));
    }
    for (c, e) in ebar.iter_mut().enumerate() {
        *e = T::of(ce[d.centre_frame(c)]);
    }
    sums
}

/// u_ij = fres_i − fres_owner(j) − vres·r_ij of slot s of centre c (the seed as a
/// displacement of r_ij), `None` for padding.
#[allow(clippy::too_many_arguments)]
fn seed<T: Real>(
    d: &Dims,
    fres: &[T],
    vres: &[T],
    rij: &[T],
    owner: &[i32],
    centre_atom: &[i32],
    c: usize,
    s: usize,
) -> Option<[T; 3]> {
    let o = usize::try_from(owner[s]).ok()?;
    let (i, fr) = (centre_atom[c] as usize, d.centre_frame(c));
    Some(std::array::from_fn(|a| {
        let wr = (0..3)
            .map(|b| vres[9 * fr + 3 * a + b] * rij[3 * s + b])
            .sum::<T>();
        fres[3 * i + a] - fres[3 * o + a] - wr
    }))
}

#[allow(clippy::too_many_arguments)]
pub fn virtual_tangent<T: Real>(
    d: &Dims,
    fres: &[T],
    vres: &[T],
    jac: &[T],
    rij: &[T],
    owner: &[i32],
    centre_atom: &[i32],
    rdot: &mut [T],
    sdot: &mut [T],
) {
    for_each_slot(d, |c, s| {
        let rd = &mut rdot[4 * s..4 * s + 4];
        let Some(u) = seed(d, fres, vres, rij, owner, centre_atom, c, s) else {
            rd.fill(T::zero());
            sdot[s] = T::zero();
            return;
        };
        for (k, r) in rd.iter_mut().enumerate() {
            *r = (0..3).map(|a| jac[12 * s + 3 * k + a] * u[a]).sum();
        }
        sdot[s] = rd[0];
    });
}

/// ṙ_ij = u_ij of every slot, 0 for padding: the seed for a descriptor that reads r_ij itself.
#[allow(clippy::too_many_arguments)]
pub fn rij_tangent<T: Real>(
    d: &Dims,
    fres: &[T],
    vres: &[T],
    rij: &[T],
    owner: &[i32],
    centre_atom: &[i32],
    rijdot: &mut [T],
) {
    for_each_slot(d, |c, s| {
        let u = seed(d, fres, vres, rij, owner, centre_atom, c, s).unwrap_or([T::zero(); 3]);
        rijdot[3 * s..3 * s + 3].copy_from_slice(&u);
    });
}

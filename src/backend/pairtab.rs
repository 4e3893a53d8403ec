//! The host bodies of [`PairOps`](super::PairOps), every backend's default: the inputs
//! downloaded, a few values per centre and slot computed, the outputs written back.

use super::{Device, Dims, Real};

#[allow(clippy::too_many_arguments)]
pub fn mix_energy<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    e_fit: &B::Buf,
    bias: &B::Buf,
    weight: &B::Buf,
    pair_e: &B::Buf,
    e_atom: &mut B::Buf,
    energy: &mut B::Buf,
) {
    let (e_fit, bias) = (b.download(e_fit), b.download(bias));
    let (weight, pair_e) = (b.download(weight), b.download(pair_e));
    let mut atom = vec![T::zero(); d.ncentres()];
    let mut acc = vec![0.0f64; d.nframes];
    for (t, bt) in bias.iter().enumerate().take(d.ntypes) {
        for c in d.centres(t) {
            // DeePMD-kit's order: the weighted sum of the models, then the bias.
            let e = weight[c].f64() * e_fit[c].f64() + pair_e[c].f64() + bt.f64();
            atom[c] = T::of(e);
            acc[d.centre_frame(c)] += e;
        }
    }
    b.write(e_atom, &atom);
    b.write(energy, &acc.into_iter().map(T::of).collect::<Vec<_>>());
}

pub fn mix_force<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    e_fit: &B::Buf,
    dweight: &B::Buf,
    q: &mut B::Buf,
) {
    let (e_fit, dweight) = (b.download(e_fit), b.download(dweight));
    let mut out = b.download(q);
    for (c, e) in e_fit.iter().enumerate() {
        let e = e.f64();
        for s in d.mixed_slots(c) {
            for a in 3 * s..3 * s + 3 {
                out[a] = T::of(out[a].f64() + e * dweight[a].f64());
            }
        }
    }
    b.write(q, &out);
}

pub fn mix_table<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    pair_force: &B::Buf,
    pair_virial: &B::Buf,
    force: &mut B::Buf,
    virial: &mut B::Buf,
) {
    for (x, add) in [(force, pair_force), (virial, pair_virial)] {
        let add = b.download(add);
        let sum: Vec<T> = (b.download(x).iter().zip(&add))
            .map(|(x, y)| T::of(x.f64() + y.f64()))
            .collect();
        b.write(x, &sum);
    }
}

pub fn mix_seed<T: Real, B: Device<T> + ?Sized>(
    b: &B,
    d: &Dims,
    weight: &B::Buf,
    dweight: &B::Buf,
    rijdot: &B::Buf,
    ebar: &mut B::Buf,
) {
    let (weight, dweight, rijdot) = (b.download(weight), b.download(dweight), b.download(rijdot));
    let mut out = b.download(ebar);
    for (c, e) in out.iter_mut().enumerate() {
        let slots = d.mixed_slots(c);
        let along: f64 = (3 * slots.start..3 * slots.end)
            .map(|a| dweight[a].f64() * rijdot[a].f64())
            .sum();
        *e = T::of(weight[c].f64() * e.f64() + along);
    }
    b.write(ebar, &out);
}

//! A linear model's sums over its DP models (docs/deepmd-spec.md §19.9), on the host: read
//! back, a few values per centre or atom, written back (as the pair tables' mixes are).

use crate::backend::{Backend, Dims, Real};

/// e_i = Σ_k w_k·e_k,i plus the bias of its type, of every centre, in DeePMD-kit's order (the
/// weighted sum of the models, then the bias), and each frame's energy.
pub fn energy<T: Real, B: Backend<T>>(
    b: &B,
    d: &Dims,
    e_fit: &[(&B::Buf, f64)],
    bias: &B::Buf,
    e_atom: &mut B::Buf,
    energy: &mut B::Buf,
) {
    let e: Vec<(Vec<T>, f64)> = e_fit.iter().map(|&(x, w)| (b.download(x), w)).collect();
    let bias = b.download(bias);
    let mut atom = vec![T::zero(); d.ncentres()];
    let mut acc = vec![0.0f64; d.nframes];
    for (t, bt) in bias.iter().enumerate().take(d.ntypes) {
        for c in d.centres(t) {
            let sum = (e.iter()).fold(0.0, |s, (x, w)| s + w * x[c].f64());
            let v = sum + bt.f64();
            atom[c] = T::of(v);
            acc[d.centre_frame(c)] += v;
        }
    }
    b.write(e_atom, &atom);
    b.write(energy, &acc.into_iter().map(T::of).collect::<Vec<_>>());
}

/// `into` += `x`: another DP model's forces or virial.
pub fn add<T: Real, B: Backend<T>>(b: &B, x: &B::Buf, into: &mut B::Buf) {
    let x = b.download(x);
    let sum: Vec<T> = (b.download(into).iter().zip(&x))
        .map(|(a, x)| T::of(a.f64() + x.f64()))
        .collect();
    b.write(into, &sum);
}

/// `x` ×= w: a DP model's share of the energies' adjoint.
pub fn scale<T: Real, B: Backend<T>>(b: &B, x: &mut B::Buf, w: f64) {
    let y: Vec<T> = b.download(x).iter().map(|v| T::of(w * v.f64())).collect();
    b.write(x, &y);
}

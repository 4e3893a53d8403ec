//! Tensors zeroed in parallel, a chunk at a time, each chunk handed at once to the op that
//! writes it. `vec![zero; len]` zeroed a whole tensor first, on one core, while the other
//! waited: a sixth of DPA-2's float64 step on a 2-core Xeon went to that memset.

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// `len` zeros, `chunk` at a time in parallel, chunk k handed to `fill(work, k, chunk)` on the
/// core that zeroed it (`work` from `init`, one per task as in rayon's `for_each_init`).
pub(super) fn zeroed_with<N, W>(
    len: usize,
    chunk: usize,
    init: impl Fn() -> W + Sync + Send,
    fill: impl Fn(&mut W, usize, &mut [N]) + Sync + Send,
) -> Vec<N>
where
    N: Copy + Default + Send + Sync,
{
    let mut v: Vec<N> = Vec::with_capacity(len);
    v.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk.max(1))
        .enumerate()
        .for_each_init(init, |work, (k, c)| fill(work, k, zero(c)));
    // SAFETY: the chunks cover `[0, len)` of the capacity, and `zero` initialised each (a panic
    // in `fill` propagates before this line, and the vector drops with length 0).
    unsafe { v.set_len(len) };
    v
}

/// Two tensors of `len` zeros made side by side, `chunk` at a time in parallel: chunk k of
/// each handed to `fill(k, a, b)` (an op with two outputs, as an activation and its slope).
pub(super) fn zeroed_pair<N>(
    len: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [N], &mut [N]) + Sync + Send,
) -> (Vec<N>, Vec<N>)
where
    N: Copy + Default + Send + Sync,
{
    let (mut a, mut b): (Vec<N>, Vec<N>) = (Vec::with_capacity(len), Vec::with_capacity(len));
    (a.spare_capacity_mut()[..len].par_chunks_mut(chunk.max(1)))
        .zip(b.spare_capacity_mut()[..len].par_chunks_mut(chunk.max(1)))
        .enumerate()
        .for_each(|(k, (ca, cb))| fill(k, zero(ca), zero(cb)));
    // SAFETY: as in `zeroed_with`, for each of the two.
    unsafe {
        a.set_len(len);
        b.set_len(len);
    }
    (a, b)
}

/// `c` zeroed, as the numbers it now holds.
fn zero<N: Copy + Default>(c: &mut [MaybeUninit<N>]) -> &mut [N] {
    c.fill(MaybeUninit::new(N::default()));
    // SAFETY: every entry of `c` was written just above, and `MaybeUninit<N>` has N's layout.
    unsafe { &mut *(c as *mut [MaybeUninit<N>] as *mut [N]) }
}

/// `len` zeros, zeroed in parallel.
pub(super) fn zeros<N: Copy + Default + Send + Sync>(len: usize) -> Vec<N> {
    zeroed_with(len, 1 << 14, || (), |_, _, _| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_zeroed_then_filled_in_its_place() {
        for (len, chunk) in [(0, 4), (1, 4), (10, 4), (12, 4), (1000, 7)] {
            let v: Vec<f64> = zeroed_with(
                len,
                chunk,
                || (),
                |_, k, c| {
                    assert!(c.iter().all(|&x| x == 0.0));
                    for (i, x) in c.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
                        *x = (k * chunk + i) as f64;
                    }
                },
            );
            assert_eq!(v.len(), len);
            for (i, &x) in v.iter().enumerate() {
                assert_eq!(x, if i % chunk % 2 == 0 { i as f64 } else { 0.0 });
            }
        }
        assert!(zeros::<f32>(100_000).iter().all(|&x| x == 0.0));
        let (a, b) = zeroed_pair(10, 4, |k, a: &mut [f64], b| {
            assert!(a.iter().chain(&*b).all(|&x| x == 0.0));
            a[0] = k as f64 + 1.0;
            b[a.len() - 1] = -(k as f64) - 1.0;
        });
        assert_eq!(a, [1., 0., 0., 0., 2., 0., 0., 0., 3., 0.]);
        assert_eq!(b, [0., 0., 0., -1., 0., 0., 0., -2., 0., -3.]);
    }
}

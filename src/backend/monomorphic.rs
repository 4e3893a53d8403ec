//! A backend's ops are written once, generic over the precision, as
//! `impl<T: ..> Device<T> for Generic<'_, B>` and an impl of each op family likewise;
//! `monomorphic_backend!(impl Backend<f64> for B, Buf = .., Idx = ..)` then makes `B`'s concrete
//! impls, every method forwarding to those. With `fused if |b| ..`, `B` also offers
//! `Generic<'_, B>`'s [`FusedEmbedding`](super::FusedEmbedding) where that function says so.
//!
//! Why: a crate that calls a generic function compiles its own copy of it, in release builds
//! too (rustc shares generic instantiations across crates only in debug builds). With a generic
//! `impl<T: Real> Backend<T>`, every integration test, and every crate that trains, compiled
//! the backend's kernels anew: in the wgpu test crate ~60 % of the code was the cpu backend.
//! The methods of a concrete impl are ordinary functions, compiled once here and linked to.

use std::ops::Deref;

/// A backend seen through its generic op bodies (derefs to the backend).
pub(crate) struct Generic<'a, B>(pub(crate) &'a B);

impl<B> Deref for Generic<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        self.0
    }
}

macro_rules! monomorphic_backend {
    (impl Backend<$t:ty> for $outer:ty, Buf = $buf:ty, Idx = $idx:ty $(, fused if $fused:expr)?) => {
        const _: () = {
            // The op table's argument types, and the precision `T` its forwarders name; the fused
            // family's own go unused in a backend that does not offer it.
            use std::ops::Range;
            use $crate::backend::monomorphic::Generic;
            #[allow(unused_imports)]
            use $crate::backend::{
                AdamStep, AngleOps, AttnArgs, AttnOps, ContractDual, ContractOps, DenseIo,
                DenseOps, Device, Dims, EnvOps, FusedEmbedding, Prefactors, RadialOps, BlockArgs,
                BlockOps, PairOps, Span, StripArgs, TrainOps,
            };
            use $crate::geometry::EnvParams;
            #[allow(unused_imports)]
            use $crate::model::{Layer, Net, TebdLayout};
            type T = $t;

            impl Device<T> for $outer {
                type Buf = $buf;
                type Idx = $idx;

                fn name(&self) -> String {
                    Device::<T>::name(&Generic(self))
                }
                fn upload(&self, x: &[T]) -> Self::Buf {
                    Device::<T>::upload(&Generic(self), x)
                }
                fn upload_idx(&self, x: &[i32]) -> Self::Idx {
                    Device::<T>::upload_idx(&Generic(self), x)
                }
                fn download(&self, b: &Self::Buf) -> Vec<T> {
                    Device::<T>::download(&Generic(self), b)
                }
                fn download_idx(&self, b: &Self::Idx) -> Vec<i32> {
                    Device::<T>::download_idx(&Generic(self), b)
                }
                fn upload_kept(&self, x: Vec<T>) -> Self::Buf {
                    Device::<T>::upload_kept(&Generic(self), x)
                }
                fn host_copy(&self, b: &Self::Buf) -> Option<Vec<T>> {
                    Device::<T>::host_copy(&Generic(self), b)
                }
                fn zeros(&self, n: usize) -> Self::Buf {
                    Device::<T>::zeros(&Generic(self), n)
                }
                fn try_zeros(&self, n: usize) -> Result<Self::Buf, String> {
                    Device::<T>::try_zeros(&Generic(self), n)
                }
                fn memory_limits(&self) -> $crate::backend::MemoryLimits {
                    Device::<T>::memory_limits(&Generic(self))
                }
                fn fill(&self, b: &mut Self::Buf, v: T) {
                    Device::<T>::fill(&Generic(self), b, v)
                }
                fn write(&self, b: &mut Self::Buf, x: &[T]) {
                    Device::<T>::write(&Generic(self), b, x)
                }
                fn write_idx(&self, b: &mut Self::Idx, x: &[i32]) {
                    Device::<T>::write_idx(&Generic(self), b, x)
                }
                fn buf_id(&self, b: &Self::Buf) -> u64 {
                    Device::<T>::buf_id(&Generic(self), b)
                }
                fn idx_id(&self, b: &Self::Idx) -> u64 {
                    Device::<T>::idx_id(&Generic(self), b)
                }
                fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, at: usize) {
                    Device::<T>::copy(&Generic(self), src, dst, at)
                }
                fn gather(&self, src: &Self::Buf, dst: &mut Self::Buf, spans: &[Span]) {
                    Device::<T>::gather(&Generic(self), src, dst, spans)
                }
                fn gather_idx(&self, src: &Self::Idx, dst: &mut Self::Idx, spans: &[Span]) {
                    Device::<T>::gather_idx(&Generic(self), src, dst, spans)
                }
                fn prepare_frames(&self, d: &Dims, owner: &Self::Idx, centre_atom: &Self::Idx) {
                    Device::<T>::prepare_frames(&Generic(self), d, owner, centre_atom)
                }
                fn forget_shape(&self, d: &Dims) {
                    Device::<T>::forget_shape(&Generic(self), d)
                }
                fn resident_budget(&self) -> usize {
                    Device::<T>::resident_budget(&Generic(self))
                }
                fn replayable(&self, f: &mut dyn FnMut()) {
                    Device::<T>::replayable(&Generic(self), f)
                }
                fn wait(&self) {
                    Device::<T>::wait(&Generic(self))
                }
                $(
                    fn fused_embedding(
                        &self,
                    ) -> Option<&dyn FusedEmbedding<T, Buf = $buf, Idx = $idx>> {
                        let fused: fn(&Self) -> bool = $fused;
                        fused(self).then_some(self as &dyn FusedEmbedding<T, Buf = $buf, Idx = $idx>)
                    }
                )?
            }

            compute_ops!(forward_ops, [$outer], [$($fused)?]);
        };
    };
}

/// The op families' impls of `monomorphic_backend!`, from the table: `FusedEmbedding`'s only
/// for a backend that offers it.
macro_rules! forward_ops {
    ([[$outer:ty] $fused:tt] $($family:ident [$(#[$fm:meta])*] [$($entry:tt)*])*) => {
        $(forward_ops!(@family $outer, $fused, $family $($entry)*);)*
    };
    (@family $outer:ty, [], FusedEmbedding $($entry:tt)*) => {};
    (@family $outer:ty, [$($fused:tt)*], $family:ident $({
        $name:ident, $op:ident, [$(#[$m:meta])*], $slf:ident, [$($arg:ident: $ty:ty),*],
        $inner:tt, $flops:block, [$($body:block)?]
    })*) => {
        impl $family<T> for $outer {
            $(
                fn $name(&$slf, $($arg: $ty),*) {
                    $family::<T>::$name(&Generic($slf), $($arg),*)
                }
            )*
        }
    };
}

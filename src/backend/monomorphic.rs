//! A backend's ops are written once, generic over the precision, as
//! `impl<T: ..> Backend<T> for Generic<'_, B>`; `monomorphic_backend!(impl Backend<f64> for B,
//! Buf = .., Idx = ..)` then makes `B`'s concrete impl, every method forwarding to those.
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
    (impl Backend<$t:ty> for $outer:ty, Buf = $buf:ty, Idx = $idx:ty) => {
        const _: () = {
            // The op table's argument types, and the precision `T` its forwarders name.
            use std::ops::Range;
            use $crate::backend::monomorphic::Generic;
            use $crate::backend::{
                AdamStep, AttnArgs, Backend, ContractDual, DenseIo, Dims, Prefactors, Span,
                StripArgs,
            };
            use $crate::geometry::EnvParams;
            use $crate::model::{Layer, Net, TebdLayout};
            type T = $t;

            #[allow(clippy::too_many_arguments)]
            impl Backend<T> for $outer {
                type Buf = $buf;
                type Idx = $idx;

                fn name(&self) -> String {
                    Backend::<T>::name(&Generic(self))
                }
                fn upload(&self, x: &[T]) -> Self::Buf {
                    Backend::<T>::upload(&Generic(self), x)
                }
                fn upload_idx(&self, x: &[i32]) -> Self::Idx {
                    Backend::<T>::upload_idx(&Generic(self), x)
                }
                fn download(&self, b: &Self::Buf) -> Vec<T> {
                    Backend::<T>::download(&Generic(self), b)
                }
                fn download_idx(&self, b: &Self::Idx) -> Vec<i32> {
                    Backend::<T>::download_idx(&Generic(self), b)
                }
                fn zeros(&self, n: usize) -> Self::Buf {
                    Backend::<T>::zeros(&Generic(self), n)
                }
                fn try_zeros(&self, n: usize) -> Option<Self::Buf> {
                    Backend::<T>::try_zeros(&Generic(self), n)
                }
                fn fill(&self, b: &mut Self::Buf, v: T) {
                    Backend::<T>::fill(&Generic(self), b, v)
                }
                fn write(&self, b: &mut Self::Buf, x: &[T]) {
                    Backend::<T>::write(&Generic(self), b, x)
                }
                fn write_idx(&self, b: &mut Self::Idx, x: &[i32]) {
                    Backend::<T>::write_idx(&Generic(self), b, x)
                }
                fn buf_id(&self, b: &Self::Buf) -> u64 {
                    Backend::<T>::buf_id(&Generic(self), b)
                }
                fn idx_id(&self, b: &Self::Idx) -> u64 {
                    Backend::<T>::idx_id(&Generic(self), b)
                }
                fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, at: usize) {
                    Backend::<T>::copy(&Generic(self), src, dst, at)
                }
                fn gather(&self, src: &Self::Buf, dst: &mut Self::Buf, spans: &[Span]) {
                    Backend::<T>::gather(&Generic(self), src, dst, spans)
                }
                fn gather_idx(&self, src: &Self::Idx, dst: &mut Self::Idx, spans: &[Span]) {
                    Backend::<T>::gather_idx(&Generic(self), src, dst, spans)
                }
                fn prepare_frames(&self, d: &Dims, owner: &Self::Idx, centre_atom: &Self::Idx) {
                    Backend::<T>::prepare_frames(&Generic(self), d, owner, centre_atom)
                }
                fn check_shape(&self, d: &Dims) -> Result<(), String> {
                    Backend::<T>::check_shape(&Generic(self), d)
                }
                fn resident_budget(&self) -> usize {
                    Backend::<T>::resident_budget(&Generic(self))
                }
                fn replayable(&self, f: &mut dyn FnMut()) {
                    Backend::<T>::replayable(&Generic(self), f)
                }
                fn wait(&self) {
                    Backend::<T>::wait(&Generic(self))
                }
                fn fused_embedding(&self) -> bool {
                    Backend::<T>::fused_embedding(&Generic(self))
                }
                fn fuses_contract_dual(&self) -> bool {
                    Backend::<T>::fuses_contract_dual(&Generic(self))
                }

                compute_ops!(forward_ops);
            }
        };
    };
}

/// The compute ops of `monomorphic_backend!`, from the op table.
macro_rules! forward_ops {
    ($({ $name:ident, $op:ident, [$(#[$m:meta])*], $slf:ident, [$($arg:ident: $ty:ty),*],
         $inner:tt, $flops:block, [$($body:block)?] })*) => {
        $(
            fn $name(&$slf, $($arg: $ty),*) {
                Backend::<T>::$name(&Generic($slf), $($arg),*)
            }
        )*
    };
}

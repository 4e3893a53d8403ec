//! Runtime dispatch of hot elementwise code to AVX2 + FMA. The crate is built for the x86-64
//! baseline (SSE2: two f64 per instruction); a function defined through [`simd_dispatch!`] is
//! compiled twice, once with AVX2 and FMA enabled, and picks its version on each call from the
//! CPU's features. Everything it calls that should run in the wide version must be
//! `#[inline(always)]`. Rust fuses no multiply-add on its own, so both versions give the same
//! bits.
//!
//! AVX-512 would double the width again, but `#[target_feature(enable = "avx512f")]` needs
//! Rust 1.89, above this crate's rust-version.

/// `simd_dispatch! { fn name<T: Real>(args) { body } }`: a function with that body, run
/// with AVX2 + FMA where the CPU has them.
macro_rules! simd_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$t:ident: Real>($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        $vis fn $name<$t: Real>($($arg: $ty),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body<$t: Real>($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide<$t: Real>($($arg: $ty),*) {
                    body($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has the features `wide` is compiled for.
                    return unsafe { wide($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub(super) use simd_dispatch;

/// Runs `f` in a function compiled with AVX2 + FMA where the CPU has them. `f` is called once
/// from there, so it is inlined and compiled wide too, along with what it calls that is
/// `#[inline(always)]`.
#[inline(always)]
pub(super) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features `run` is compiled for.
            return unsafe { run(f) };
        }
    }
    f()
}

//! Runtime dispatch of hot elementwise code to AVX2 + FMA. The crate is built for the x86-64
//! baseline (SSE2: two f64 per instruction); code run through [`wide`] is compiled a second
//! time with AVX2 and FMA enabled, and the version is picked on each call from the CPU's
//! features (a cached check). Everything it calls that should run in the wide version must be
//! `#[inline(always)]`, the closure included. Rust fuses no multiply-add on its own, so both
//! versions give the same bits.
//!
//! AVX-512 would double the width again, but `#[target_feature(enable = "avx512f")]` needs
//! Rust 1.89, above this crate's rust-version.

/// Runs `f` in a function compiled with AVX2 + FMA where the CPU has them; with `f` marked
/// `#[inline(always)]` (`wide(#[inline(always)] || ...)`) it is compiled wide there, along with
/// whatever it calls that is `#[inline(always)]`.
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

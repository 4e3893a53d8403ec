//! Runtime dispatch of hot elementwise code to AVX-512 or AVX2 + FMA. The crate is built for
//! the x86-64 baseline (SSE2: two f64 per instruction); code run through [`wide`] is compiled
//! twice more, with AVX-512 (F, VL, DQ: eight f64 per instruction, and the f64 ↔ i64
//! conversions tanh needs) and with AVX2 + FMA, and the widest version the CPU has is picked
//! on each call (a cached check). Everything it calls that should run in the wide version must
//! be `#[inline(always)]`, the closure included. Rust fuses no multiply-add on its own and
//! reorders no floating-point sum, so every version gives the same bits: the width changes
//! how many lanes run at once, not what each lane computes.

/// Runs `f` in a function compiled with AVX-512 or AVX2 + FMA where the CPU has them; with `f`
/// marked `#[inline(always)]` (`wide(#[inline(always)] || ...)`) it is compiled wide there,
/// along with whatever it calls that is `#[inline(always)]`.
#[inline(always)]
pub(super) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
        unsafe fn run512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if avx512() {
            // SAFETY: the CPU has the features `run512` is compiled for.
            return unsafe { run512(f) };
        }
        if fma() {
            // SAFETY: the CPU has the features `run` is compiled for.
            return unsafe { run(f) };
        }
    }
    f()
}

/// Whether [`wide`] takes its AVX-512 version. `DPW_NO_AVX512=1` turns it off, so that the
/// AVX2 version can be tested and timed on a machine that has AVX-512.
#[cfg(target_arch = "x86_64")]
pub(super) fn avx512() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            // A bad value has been refused at start-up (`crate::settings::check_all`).
            && !matches!(crate::settings::NO_AVX512.get(), Ok(Some(true)))
    })
}

/// Whether [`wide`] takes an FMA version (AVX-512 or AVX2 + FMA).
pub(super) fn fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Nothing, in a form the compiler cannot see into. In a loop over the rows of a block whose
/// body works along each row, it keeps LLVM from vectorising the loop itself, across the rows
/// (three rows in lanes of four, through gathers and scatters), instead of along each row:
/// the loop vectoriser leaves loops with inline assembly alone.
#[inline(always)]
pub(super) fn rows_apart() {
    // SAFETY: an empty instruction sequence that touches no memory, stack or flags.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("", options(nomem, nostack, preserves_flags));
    }
}

/// A row of W values, one step of a formula at a time for all of them.
pub(super) type Row<F, const W: usize> = [F; W];

/// The row whose values are `f(q)`.
#[inline(always)]
pub(super) fn map<F: Copy + Default, const W: usize>(f: impl Fn(usize) -> F) -> Row<F, W> {
    let mut o = [F::default(); W];
    for (q, v) in o.iter_mut().enumerate() {
        *v = f(q);
    }
    o
}

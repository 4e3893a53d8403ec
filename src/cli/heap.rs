//! The heap's settings for training. glibc returns a freed block of more than 128 KiB to the
//! kernel at once (its own mapping) and trims the heap's top beyond 128 KiB, so a model whose
//! passes build large temporaries every step (DPA-2's tape, `backend/cpu/tape.rs`) pays a page
//! fault per page per step: on the water DPA-2 example a 2-core step took 2.8 s, a third of it in
//! the kernel. Every block stays in the heap (no mapping of its own: glibc caps the mmap
//! threshold at 32 MiB, and a DPA-2 step's dual tensors are larger, so only turning mappings
//! off keeps them), and freed memory is kept for the next step (0.94 s a step with the 32 MiB
//! threshold, 0.72 s with none, the same peak memory; BENCHMARKS.md). No top pad: a heap grown
//! in 256 MiB steps met tests/hardening.rs's 1 GiB address-space limit in an allocation that
//! cannot fail cleanly, before the memory check that names the cause.

/// Keeps freed memory in the process (glibc on Linux; elsewhere the allocator's own policy).
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's thresholds; it is called before any thread
    // starts, and an unaccepted value leaves the setting as it was.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

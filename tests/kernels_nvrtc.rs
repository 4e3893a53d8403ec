//! Compiles every CUDA kernel file (`kernels/*.cu`) with NVRTC for sm_80 and sm_90, as the CUDA
//! backend does at run time, and checks that each file defines exactly the kernels the backend
//! loads, in both precisions. Needs no GPU, only libnvrtc (the CUDA toolkit's, or PyPI's
//! `nvidia-cuda-nvrtc-cu12` with its lib folder on LD_LIBRARY_PATH).
//!
//! Without libnvrtc the test prints "SKIPPED: ..." and passes, unless DPW_REQUIRE_NVRTC=1
//! (set in CI), which turns the skip into a failure.
//!
//! NVRTC without a CUDA toolkit, as CI installs it (PyPI's wheel holds libnvrtc.so.12, one of
//! the names cudarc tries, so no symlink is needed):
//!
//! ```sh
//! pip install --target /opt/nvrtc nvidia-cuda-nvrtc-cu12==12.9.86
//! export LD_LIBRARY_PATH=/opt/nvrtc/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
//! DPW_REQUIRE_NVRTC=1 cargo test --features cuda --test kernels_nvrtc
//! ``` DPW_NVRTC_VERBOSE=1 prints NVRTC's log,
//! with ptxas' registers, stack and spills per kernel.

/// Skips (returns false) or, when DPW_REQUIRE_NVRTC=1, fails.
fn skip(why: &str) -> bool {
    if std::env::var("DPW_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("DPW_REQUIRE_NVRTC=1 but the NVRTC check cannot run: {why}");
    }
    // Written to stderr directly, not through eprintln!, so the test harness does not
    // capture it: a skip is visible in every run.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: nvrtc_compiles_every_kernel: {why}; no kernel was compiled"
    );
    false
}

#[cfg(not(feature = "cuda"))]
#[test]
fn nvrtc_compiles_every_kernel() {
    skip("built without --features cuda");
}

#[cfg(feature = "cuda")]
#[test]
fn nvrtc_compiles_every_kernel() {
    use dpw::backend::cuda::kernels::{self, FILES, SUFFIXES};
    use std::collections::BTreeSet;

    if !kernels::nvrtc_present() {
        skip("libnvrtc not found (put its folder on LD_LIBRARY_PATH)");
        return;
    }
    let mut failures = Vec::new();
    let mut compiled = 0;
    for arch in ["sm_80", "sm_90"] {
        for file in FILES {
            // -Xptxas -v: ptxas reports registers and spills per kernel in the log.
            let c = match kernels::compile(file, arch, &["--ptxas-options=-v"]) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{e:#}"));
                    continue;
                }
            };
            compiled += 1;
            let found: BTreeSet<String> = c
                .ptx
                .lines()
                .filter_map(|l| l.split(".entry ").nth(1))
                .map(|rest| rest.trim_end_matches('(').trim().to_string())
                .collect();
            let expected: BTreeSet<String> = file
                .kernels
                .iter()
                .flat_map(|k| SUFFIXES.map(|s| format!("{k}{s}")))
                .collect();
            if found != expected {
                failures.push(format!(
                    "kernels/{} for {arch}: PTX entries {found:?}, the backend loads {expected:?}",
                    file.name
                ));
            }
            if c.cubin.is_empty() {
                failures.push(format!("kernels/{} for {arch}: empty CUBIN", file.name));
            }
            if std::env::var("DPW_NVRTC_VERBOSE").is_ok_and(|v| v == "1") {
                eprintln!("--- kernels/{} {arch} NVRTC log ---\n{}", file.name, c.log);
            }
            // Spills to local memory are legal but slow: report them, do not fail.
            for line in c.log.lines().filter(|l| {
                l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads")
            }) {
                eprintln!("note: kernels/{} {arch}: {}", file.name, line.trim());
            }
            eprintln!(
                "ok: kernels/{} for {arch}: {} kernels, PTX {} bytes, CUBIN {} bytes",
                file.name,
                found.len(),
                c.ptx.len(),
                c.cubin.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(compiled, 2 * FILES.len());
}

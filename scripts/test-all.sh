#!/usr/bin/env bash
# The whole test suite: installs what the tests need (system packages when run as root on
# Debian/Ubuntu and they are missing; NVRTC from PyPI into .deps/ for the CUDA kernel check),
# then formatting, lints, and every test in release mode (the finite-difference and convergence
# tests are slow in debug builds).
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t pkgs < <(grep -v '^#' scripts/apt-packages.txt | sed '/^$/d')
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update && apt-get install -y "${missing[@]}"
  else
    echo "warning: missing system packages: ${missing[*]} (install them as root)" >&2
  fi
fi

# libnvrtc without a CUDA toolkit, so every CUDA kernel is compiled for sm_80 and sm_90 here.
nvrtc=.deps/nvrtc
if [ ! -e "$nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  pkg=nvidia-cuda-nvrtc-cu12==12.9.86
  python3 -m pip install -q --target "$nvrtc" "$pkg" ||
    python3 -m pip install -q --break-system-packages --target "$nvrtc" "$pkg"
fi
export LD_LIBRARY_PATH="$PWD/$nvrtc/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cargo fmt --all --check
cargo clippy --release --all-targets -- -D warnings
# The web page's crate (web/src) is built for wasm32 only.
rustup target list --installed | grep -qx wasm32-unknown-unknown ||
  rustup target add wasm32-unknown-unknown
cargo clippy --release -p dpw-web --target wasm32-unknown-unknown -- -D warnings
cargo clippy --release --all-targets --features cuda -- -D warnings
cargo clippy --release --all-targets --features mpi -- -D warnings
cargo clippy --release --all-targets --features hdf5 -- -D warnings
cargo test --release --all-targets
# deepmd/hdf5 data (feature hdf5, against the system libhdf5).
cargo test --release --features hdf5 --test data_hdf5
DPW_REQUIRE_NVRTC=1 cargo test --release --features cuda --test kernels_nvrtc --test backend_cuda
# Multi-process training under mpirun (2 ranks).
DPW_REQUIRE_MPI=1 cargo test --release --features mpi --test mpi_train
# Training convergence on the water data (minutes; not a timed test).
cargo test --release --test train_convergence -- --ignored --nocapture
# The browser demo in headless Chromium: WebGPU (SwiftShader) and CPU-in-wasm training, parity
# with the native CPU backend (minutes; builds the wasm crate, wasm-bindgen CLI and npm packages).
web/test.sh

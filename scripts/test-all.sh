#!/usr/bin/env bash
# The whole test suite: installs what the tests need (system packages when run as root on
# Debian/Ubuntu and they are missing; NVRTC from PyPI into .deps/ for the CUDA kernel check),
# then formatting, lints, and every test in release mode (the finite-difference and convergence
# tests are slow in debug builds). CI runs it without arguments: every phase.
#
# Usage: scripts/test-all.sh [--quick] [--only PHASE,...] [--skip PHASE,...]
#   phases, in order: setup lint test cuda kit convergence web
#   --quick       setup, rustfmt, clippy on the default features and the default-feature tests
#                 (what to run before a commit; no MPI/wasm builds, convergence or browser)
#   --only LIST   run just these phases; --skip LIST: all but these
# Each phase's wall time is printed at the end.
# A full run builds and tests one feature set, the default features plus mpi (one build of the
# crate, not one per feature set; dpw with the feature runs serially like the default build
# unless an MPI launcher started it); --quick builds the default features only.
set -euo pipefail
cd "$(dirname "$0")/.."

all_phases=(setup lint test cuda kit convergence web)
phases=("${all_phases[@]}")
quick=0
list() { tr ',' ' ' <<<"$1"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; phases=(setup lint test) ;;
    --only) shift; read -ra phases <<<"$(list "${1:?--only needs a list}")" ;;
    --skip)
      shift
      skip=" $(list "${1:?--skip needs a list}") "
      kept=()
      for p in "${phases[@]}"; do [[ "$skip" == *" $p "* ]] || kept+=("$p"); done
      phases=("${kept[@]}")
      ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "test-all.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for p in "${phases[@]}"; do
  [[ " ${all_phases[*]} " == *" $p "* ]] ||
    { echo "test-all.sh: unknown phase $p (phases: ${all_phases[*]})" >&2; exit 2; }
done
want() { [[ " ${phases[*]} " == *" $1 "* ]]; }
features=(--features mpi)
[ "$quick" = 0 ] || features=()
timings=()
started=$SECONDS
phase() {
  [ -z "${current:-}" ] || timings+=("$current $((SECONDS - started)) s")
  current="$1"
  started=$SECONDS
  [ -z "$1" ] || printf '\n== test-all: %s\n' "$1"
}

if want setup; then
  phase setup
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
fi

# libnvrtc without a CUDA toolkit, so every CUDA kernel is compiled for sm_80 and sm_90 here.
nvrtc=.deps/nvrtc
if want cuda && [ ! -e "$nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  pkg=nvidia-cuda-nvrtc-cu12==12.9.86
  python3 -m pip install -q --target "$nvrtc" "$pkg" ||
    python3 -m pip install -q --break-system-packages --target "$nvrtc" "$pkg"
fi
export LD_LIBRARY_PATH="$PWD/$nvrtc/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if want lint; then
  phase lint
  cargo fmt --all --check
  # The default features include cuda (loaded at run time), so this also lints the CUDA backend.
  cargo clippy --release --all-targets -- -D warnings
  # Doc links stay right: a renamed item breaks the comments that name it.
  RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --features mpi --lib
  if [ "$quick" = 0 ]; then
    # The web page's crate (web/src) is built for wasm32 only.
    rustup target list --installed | grep -qx wasm32-unknown-unknown ||
      rustup target add wasm32-unknown-unknown
    cargo clippy --release -p dpw-web --target wasm32-unknown-unknown -- -D warnings
    # The optional feature mpi (with cuda, a default feature, it is also the NCCL
    # all-reduce in src/dist/nccl.rs), on the targets it changes: the other tests compile the
    # same with or without it, and re-checking all of them per feature cost minutes of CI.
    cargo clippy --release --features mpi --lib --bins --test mpi_train \
      --test nccl_exchange -- -D warnings
  fi
fi
if want test; then
  phase test
  # The wgpu tests run on lavapipe (mesa-vulkan-drivers) and the mpi tests under mpirun
  # (2 ranks; compiled only with the mpi feature, so not by --quick): without an adapter or
  # mpirun they would skip.
  DPW_REQUIRE_WGPU=1 DPW_REQUIRE_MPI=1 cargo test --release --all-targets "${features[@]}"
fi
if want cuda; then
  phase cuda
  DPW_REQUIRE_NVRTC=1 cargo test --release "${features[@]}" --test kernels_nvrtc --test backend_cuda
fi
if want kit; then
  phase kit
  # The GPU verification kit (issue 28): it builds (the test phase's feature set: cached),
  # fits the device tool's 64 MiB with the working tree, and its run half works end to end
  # without a GPU on one quick step (a dry run; the cuda steps are reported as skipped).
  scripts/gpu-check.sh build
  out=$(mktemp -d)
  # The step's quick DPA-1 case only: its se_e2_a case takes lavapipe 90 s or more (the step's
  # limit on a GPU), and the test phase has just run both.
  GPU_CHECK_FORCE=1 GPU_CHECK_ONLY='^wgpu_train_parity$' GPU_CHECK_TEST_FILTER=dpa1 OUT="$out" \
    scripts/gpu-check.sh run || true
  python3 - "$out/report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
steps = {s["name"]: s["status"] for s in r["steps"]}
assert steps.get("wgpu_train_parity") == "pass", steps
assert steps.get("cuda_backend_suite") == "skipped", steps
print("kit: built, within 64 MiB; dry run report:", len(steps), "steps")
EOF
  rm -rf "$out"
fi
if want convergence; then
  phase convergence
  # Training convergence on the water data (minutes; not a timed test).
  cargo test --release "${features[@]}" --test train_convergence -- --ignored --nocapture
fi
if want web; then
  phase web
  # The browser demo in headless Chromium: WebGPU (SwiftShader) and CPU-in-wasm training,
  # parity with the native CPU backend (minutes; builds the wasm crate, the wasm-bindgen CLI
  # once per machine, and npm packages). The parity test takes the release dpw the test phase
  # built: a plain `cargo build --release` would compile wgpu and dpw again (5 min), since the
  # tests' dev-dependency tempfile turns on bitflags' `std` feature, which wgpu depends on (and
  # the test phase's dpw has the mpi feature).
  if [ -z "${DPW_BIN:-}" ] && want test; then
    export DPW_BIN="$PWD/target/release/dpw"
  fi
  web/test.sh
fi
phase ""
if [ ${#timings[@]} -gt 0 ]; then
  printf '\n== test-all: wall time per phase\n'
  printf '  %s\n' "${timings[@]}"
fi

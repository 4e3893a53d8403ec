#!/usr/bin/env bash
# The whole test suite: installs the system packages the tests need (when run as root on
# Debian/Ubuntu and they are missing), then formatting, lints, and every test in release mode
# (the finite-difference and convergence tests are slow in debug builds).
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

cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release --all-targets

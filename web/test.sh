#!/usr/bin/env bash
# Builds the demo (web/build.sh) and runs the page tests in headless Chromium.
#
# Usage: web/test.sh [--skip-build] [--mock]
#   --skip-build  use web/pkg, web/data and web/vendor as they are
#   --mock        test the page against dev/mock_dpw_web.js (no wasm build, no parity test)
# Needs Debian's chromium (/usr/bin/chromium) and node >= 20. Environment: DPW_TEST_STEPS
# (steps per backend, default 200), DPW_BIN (native dpw for the parity test).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build=1
for a in "$@"; do
  case "$a" in
    --skip-build) build=0 ;;
    --mock) export DPW_TEST_MOCK=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

if [ "$build" = 1 ]; then
  if [ "${DPW_TEST_MOCK:-0}" = 1 ]; then
    "$here/build.sh" --skip-wasm
  else
    "$here/build.sh"
    # The parity test compares with the native CPU backend.
    if [ -z "${DPW_BIN:-}" ]; then
      (cd "$root" && cargo build --release)
    fi
  fi
fi
[ -d "$here/node_modules/playwright-core" ] || (cd "$here" && npm ci --no-audit --no-fund)

cd "$root"
# One test file at a time: the timings they print are taken on an otherwise idle machine.
exec node --test --test-concurrency=1 web/tests/

#!/usr/bin/env bash
# Builds the browser demo into web/ so that web/ can be served as a static folder:
#   web/pkg/      dpw_web.js + dpw_web_bg.wasm (the dpw-web crate, via wasm-bindgen --target web)
#   web/data/     the bundled water data (train: examples/water/data_0, valid: data_3) and
#                 data/files.json, the list of files the page fetches
#   web/vendor/   uPlot from npm
#
# Usage: web/build.sh [--skip-wasm] [--skip-npm]
#   --skip-wasm   keep web/pkg as it is (only data and vendor files)
#   --skip-npm    do not run npm ci (node_modules must already be there)
# Environment: CARGO_TARGET_DIR is honoured.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
skip_wasm=0
skip_npm=0
for a in "$@"; do
  case "$a" in
    --skip-wasm) skip_wasm=1 ;;
    --skip-npm) skip_npm=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

say() { printf '\n== %s\n' "$*"; }

# 1. The wasm crate.
if [ "$skip_wasm" = 0 ]; then
  say "cargo build --release --target wasm32-unknown-unknown -p dpw-web"
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown
  fi
  (cd "$root" && cargo build --release --target wasm32-unknown-unknown -p dpw-web)
  target_dir="${CARGO_TARGET_DIR:-$root/target}"
  wasm="$target_dir/wasm32-unknown-unknown/release/dpw_web.wasm"
  [ -f "$wasm" ] || { echo "build.sh: $wasm was not built" >&2; exit 1; }

  # 2. wasm-bindgen CLI of exactly the version of the wasm-bindgen crate in Cargo.lock.
  want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$root/Cargo.lock")"
  [ -n "$want" ] || { echo "build.sh: no wasm-bindgen crate in Cargo.lock" >&2; exit 1; }
  have="$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)"
  if [ "$have" != "$want" ]; then
    say "cargo install --debug wasm-bindgen-cli --version $want (found: ${have:-none})"
    # No --locked: the registry mirror lacks one of the CLI's locked dependencies. A debug build:
    # 2.0 min to compile on 2 cores against 4.1 in release (every CI run pays it), and 3.2 s
    # against 0.6 s to process dpw_web.wasm, with the same output.
    cargo install --debug wasm-bindgen-cli --version "$want"
  fi
  say "wasm-bindgen --target web"
  rm -rf "$here/pkg"
  wasm-bindgen --target web --no-typescript --out-dir "$here/pkg" "$wasm"
fi

# 3. The water data and the list of files the page fetches.
say "data: examples/water/data_0 -> web/data/train, data_3 -> web/data/valid"
rm -rf "$here/data"
mkdir -p "$here/data"
cp -r "$root/examples/water/data_0" "$here/data/train"
cp -r "$root/examples/water/data_3" "$here/data/valid"
(
  cd "$here"
  files="$(find data -type f ! -name files.json | LC_ALL=C sort)"
  {
    printf '{\n  "files": [\n'
    first=1
    for f in $files; do
      if [ $first = 1 ]; then first=0; else printf ',\n'; fi
      printf '    "%s"' "$f"
    done
    printf '\n  ]\n}\n'
  } > data/files.json
)

# 4. npm packages and the browser files taken from them.
if [ "$skip_npm" = 0 ]; then
  say "npm ci"
  (cd "$here" && npm ci --no-audit --no-fund)
fi
say "vendor: uPlot"
rm -rf "$here/vendor"
mkdir -p "$here/vendor"
cp "$here/node_modules/uplot/dist/uPlot.esm.js" "$here/node_modules/uplot/dist/uPlot.min.css" \
  "$here/node_modules/uplot/LICENSE" "$here/vendor/"
mv "$here/vendor/LICENSE" "$here/vendor/uPlot.LICENSE"

say "done: serve with  python3 -m http.server 8000 --bind 127.0.0.1 --directory web"

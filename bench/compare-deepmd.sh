#!/usr/bin/env bash
# Trains an example with DeePMD-kit 3.2.0 (`dp --tf train`, and `dp --pt train` with
# COMPARE_PT=1) and with dpw on this machine, one after the other, and prints s/step, peak memory
# and the ratio. DeePMD-kit is installed into a virtual environment on first use.
#
#   bench/compare-deepmd.sh [STEPS] [INPUT] (default 300 steps of examples/water/input.json;
#                                           DeePMD-kit's average skips the first 100, dpw's bench
#                                           times the steps after warm-up)
#   BATCH=4      sets the training batch size of both programs
#   FLOAT32=1    also times dpw in float32 (the ratio stays against DeePMD-kit's float64)
#   DPW=path     times that dpw binary instead of building this checkout's
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
input=${2:-examples/water/input.json}
venv=$(realpath -m "${DEEPMD_VENV:-.bench/deepmd-venv}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -x "$venv/bin/dp" ]; then
  echo "installing deepmd-kit[cpu]==3.2.0 into $venv ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "deepmd-kit[cpu]==3.2.0"
fi

# The example input with absolute data paths, a fixed number of steps and no checkpoints.
python3 - "$work/input.json" "$steps" "$input" "${BATCH:-}" <<'PY'
import json, os, sys
src = sys.argv[3]
d = json.load(open(src))
base = os.path.dirname(os.path.abspath(src))
for key in ("training_data", "validation_data"):
    if key in d["training"]:
        d["training"][key]["systems"] = [os.path.join(base, s) for s in d["training"][key]["systems"]]
d["training"]["numb_steps"] = int(sys.argv[2])
d["training"]["disp_freq"] = 100
d["training"]["save_freq"] = 10 ** 9
if sys.argv[4]:
    d["training"]["training_data"]["batch_size"] = int(sys.argv[4])
json.dump(d, open(sys.argv[1], "w"), indent=2)
PY

if [ -n "${DPW:-}" ]; then
  dpw=$(realpath "$DPW")
else
  cargo build --release -q
  dpw=$PWD/target/release/dpw
fi

peak_mb() { awk '/Maximum resident set size/ {printf "%.0f", $6 / 1024}' "$1"; }

echo "input: $input, batch ${BATCH:-as given}"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
results=()
for b in tf ${COMPARE_PT:+pt}; do
  (cd "$work" && mkdir -p "$b" && cd "$b" && OMP_NUM_THREADS=$(nproc) /usr/bin/time -v -o time.txt \
    "$venv/bin/dp" --"$b" train ../input.json >log 2>&1) || { tail -30 "$work/$b/log" >&2; exit 1; }
  s=$(grep -oE "average training time: [0-9.]+ s/batch" "$work/$b/log" | awk '{print $4}' | tail -1)
  echo "DeePMD-kit 3.2.0 (--$b): ${s} s/step, peak memory $(peak_mb "$work/$b/time.txt") MB"
  results+=("$s")
done

(cd "$work" && /usr/bin/time -v -o dpw-time.txt "$dpw" bench input.json --backend cpu --steps "$steps" --json dpw.json >dpw.log 2>&1) \
  || { tail -30 "$work/dpw.log" >&2; exit 1; }
ours=$(python3 -c "import json; print(json.load(open('$work/dpw.json'))['median_s_per_step'])")
echo "dpw (cpu, float64): ${ours} s/step, peak memory $(peak_mb "$work/dpw-time.txt") MB"
python3 -c "print(f'dpw is {float(\"${results[0]}\") / float(\"$ours\"):.2f}x faster per step than DeePMD-kit --tf')"
if [ -n "${FLOAT32:-}" ]; then
  (cd "$work" && "$dpw" bench input.json --backend cpu --float32 --steps "$steps" --json dpw32.json >dpw32.log 2>&1) \
    || { tail -30 "$work/dpw32.log" >&2; exit 1; }
  ours32=$(python3 -c "import json; print(json.load(open('$work/dpw32.json'))['median_s_per_step'])")
  echo "dpw (cpu, float32): ${ours32} s/step"
  python3 -c "print(f'dpw float32 is {float(\"${results[0]}\") / float(\"$ours32\"):.2f}x faster per step than DeePMD-kit --tf float64')"
fi

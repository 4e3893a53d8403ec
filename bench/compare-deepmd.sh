#!/usr/bin/env bash
# Trains an example with DeePMD-kit 3.2.0 (`dp --tf train`, and `dp --pt train` with
# COMPARE_PT=1) and with dpw on this machine, one after the other, and prints s/step, peak memory
# and dpw's speed-up over each. DeePMD-kit is installed into a virtual environment on first use.
#
#   bench/compare-deepmd.sh [STEPS] [INPUT] (default 300 steps of examples/water/input.json;
#                                           DeePMD-kit's average skips the first quarter, at
#                                           most 100 steps; dpw's bench
#                                           times the steps after warm-up)
#   BATCH=4      sets the training batch size of both programs
#   FLOAT32=1    also times both programs in float32 (`precision: float32` in the descriptor and
#                the fitting net for DeePMD-kit, `--float32` for dpw); every ratio printed is
#                between the same precisions
#   DPW=path     times that dpw binary instead of building this checkout's
#   DP_BACKENDS  DeePMD-kit's backends to time (default "tf", "tf pt" with COMPARE_PT=1)
#   COMPILE=1    sets `training.enable_compile: true` for both programs: DeePMD-kit's `--pt-expt`
#                then trains through torch.compile (its compiled PyTorch); dpw takes the key and
#                trains as ever
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
input=${2:-examples/water/input.json}
venv=$(realpath -m "${DEEPMD_VENV:-.bench/deepmd-venv}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wanted=" ${DP_BACKENDS:-tf ${COMPARE_PT:+pt}} "
if [ ! -x "$venv/bin/dp" ]; then
  echo "installing deepmd-kit[cpu]==3.2.0 into $venv ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "deepmd-kit[cpu]==3.2.0"
fi
# DeePMD-kit's PyTorch backend needs its torch extra (the cpu extra is TensorFlow's).
if [[ "$wanted" == *" pt "* ]] && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing deepmd-kit[torch]==3.2.0 into $venv ..." >&2
  "$venv/bin/pip" install -q "deepmd-kit[cpu,torch]==3.2.0"
fi

# The example input with absolute data paths, a fixed number of steps and no checkpoints.
python3 - "$work/input.json" "$steps" "$input" "${BATCH:-}" "${COMPILE:-}" <<'PY'
import json, os, sys
src = sys.argv[3]
d = json.load(open(src))
base = os.path.dirname(os.path.abspath(src))
for key in ("training_data", "validation_data"):
    if key in d["training"]:
        d["training"][key]["systems"] = [os.path.join(base, s) for s in d["training"][key]["systems"]]
d["training"]["numb_steps"] = int(sys.argv[2])
# DeePMD-kit averages its step time leaving out the first display interval: a quarter of the
# run, at most 100 steps (with 100 and a 40-step run its average was 7x its step for DPA-3).
d["training"]["disp_freq"] = min(100, max(1, int(sys.argv[2]) // 4))
d["training"]["save_freq"] = 10 ** 9
if sys.argv[4]:
    d["training"]["training_data"]["batch_size"] = int(sys.argv[4])
if sys.argv[5]:
    d["training"]["enable_compile"] = True
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
# DeePMD-kit's s/step (its own average) for backend $1 on input $2 in precision $4, under tag $3.
dp_time() {
  local b=$1 in=$2 tag=$3 prec=$4 s
  (cd "$work" && mkdir -p "$tag" && cd "$tag" && OMP_NUM_THREADS=$(nproc) /usr/bin/time -v -o time.txt \
    "$venv/bin/dp" --"$b" train "$in" >log 2>&1) || { tail -30 "$work/$tag/log" >&2; exit 1; }
  s=$(grep -oE "average training time: [0-9.]+ s/batch" "$work/$tag/log" | awk '{print $4}' | tail -1)
  echo "DeePMD-kit 3.2.0 (--$b, $prec): ${s} s/step, peak memory $(peak_mb "$work/$tag/time.txt") MB" >&2
  echo "$s"
}

# dpw's median s/step from `dpw bench` on input $1 with extra flags $3..., kept under tag $2.
dpw_time() {
  local in=$1 tag=$2
  shift 2
  (cd "$work" && /usr/bin/time -v -o "$tag-time.txt" "$dpw" bench "$in" --backend cpu "$@" \
    --steps "$steps" --json "$tag.json" >"$tag.log" 2>&1) || { tail -30 "$work/$tag.log" >&2; exit 1; }
  python3 -c "import json; print(json.load(open('$work/$tag.json'))['median_s_per_step'])"
}

# "N.NNx faster" or "N.NNx slower": dpw's s/step $2 against DeePMD-kit's $1.
speedup() { python3 -c "r = float('$1') / float('$2'); print(f'{r:.2f}x faster' if r >= 1 else f'{1 / r:.2f}x slower')"; }

# DP_BACKENDS="pt" names them outright (DPA-2 and DPA-3 have no --tf).
read -ra backends <<<"${DP_BACKENDS:-tf ${COMPARE_PT:+pt}}"
# One line per DeePMD-kit backend: dpw's s/step $2 against the backend's, from the array named
# $3 (s/step in the order of `backends`), in precision $1.
ratios() {
  local prec=$1 ours=$2 i
  local -n times=$3
  for i in "${!backends[@]}"; do
    echo "$prec: dpw is $(speedup "${times[$i]}" "$ours") per step than DeePMD-kit --${backends[$i]}"
  done
}

# The input's own precision (its descriptor's, as both programs read it; DeePMD-kit's default
# is float64).
prec=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))["model"].get("descriptor", {}); print(d.get("precision", "float64") if d.get("precision", "default") != "default" else "float64")' "$work/input.json")
results=()
for b in "${backends[@]}"; do
  results+=("$(dp_time "$b" ../input.json "$b" "$prec")")
done
ours=$(dpw_time input.json dpw)
echo "dpw (cpu, $prec): ${ours} s/step, peak memory $(peak_mb "$work/dpw-time.txt") MB"
ratios "$prec" "$ours" results

if [ -n "${FLOAT32:-}" ]; then
  python3 - "$work/input.json" "$work/input32.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("descriptor", "fitting_net"):
    d["model"][k]["precision"] = "float32"
json.dump(d, open(sys.argv[2], "w"), indent=2)
PY
  results32=()
  for b in "${backends[@]}"; do
    results32+=("$(dp_time "$b" ../input32.json "$b-f32" float32)")
  done
  ours32=$(dpw_time input32.json dpw32 --float32)
  echo "dpw (cpu, float32): ${ours32} s/step, peak memory $(peak_mb "$work/dpw32-time.txt") MB"
  ratios float32 "$ours32" results32
fi

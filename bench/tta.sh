#!/usr/bin/env bash
# Time to accuracy (issue 33): trains the same input with dpw (`dpw train`, cpu backend) and with
# DeePMD-kit 3.2.0 (`dp --tf train`, `dp --pt train`), SEEDS runs each, one run after the other on
# this machine (seed 1 of every tool, then seed 2, ...), and reports per run and as medians per
# tool: for each threshold on the validation force RMSE (lcurve.out's `rmse_f_val`, found by the
# header's column names) the first step at which it is reached and the wall time then; the final
# model's errors on ALL frames of the test system (`dp test` after `dp freeze`, `dpw test` after
# `dpw freeze`); s/step. DeePMD-kit is installed into a virtual environment on first use.
#
#   bench/tta.sh [options]        every option also as an environment variable (a flag wins)
#   --seeds N      SEEDS=3        runs per tool, seed sets 1..N; seed set i sets descriptor seed i,
#                                 fitting_net seed i, training seed 10·i
#   --seed-sets "..." SEED_SETS=  which seed sets to run instead of 1..N, e.g. "2" or "2 3" (to add
#                                 runs to an earlier OUT one seed set at a time)
#   --steps N      STEPS=20000    numb_steps; save_freq is set to it (one checkpoint, at the end)
#   --tools "..."  TOOLS="dpw tf pt"   which trainers, in this order within a seed
#   --input FILE   INPUT=examples/water/input.json   data paths are taken relative to its folder
#   --thresholds "..." THRESHOLDS="0.15 0.12 0.11"   validation force RMSE targets, eV/Å
#   --out DIR      OUT=.bench/tta-<UTC time>   kept: every run's input.json, lcurve.out, logs,
#                                 model and test output (OUT/<tool>-seed<i>/), tta.md, tta.json
#   --disp N       DISP=500       disp_freq: a validation (and an lcurve.out line) every N steps
#   --val-frames N VAL_FRAMES=20  validation frames per display: validation_data.batch_size 1,
#                                 numb_btch N
#   --test-system DIR  TEST_SYSTEM=the input's first validation system (data_3): `dp test` /
#                                 `dpw test` on all its frames
#   START_LR=1e-3 STOP_LR=3.51e-8 DECAY_STEPS=1000   the exp learning-rate schedule (decay_rate is
#                                 removed, so the rate follows from stop_lr); the loss (start_pref_f
#                                 1000 in the water example) is left as the input has it
#   DPW=path                      uses that dpw binary instead of building this checkout's (tta.json
#                                 then names its sha256, not a commit)
#   DEEPMD_VENV=.bench/deepmd-venv  where DeePMD-kit 3.2.0 is (or gets) installed:
#                                 `pip install "deepmd-kit[cpu]==3.2.0"` for tf, the `torch` extra
#                                 (`deepmd-kit[cpu,torch]`) for pt; TORCH_INDEX=URL installs torch
#                                 from that index first (e.g. https://download.pytorch.org/whl/cpu
#                                 for CPU-only wheels instead of PyPI's CUDA ones)
#
# Wall times are measured by this script, not taken from the logs: seconds from launching the
# train command to the moment its lcurve.out line appears (the file is polled every 0.25 s; all
# three programs flush it after each line), so they include start-up (data loading, neighbour
# statistics, TensorFlow's graph, PyTorch's compilation). s/step is the wall time between the
# first and the last lcurve.out line over the steps between them (validation included); the
# programs' own figure (DeePMD-kit's "average training time", dpw's average leaving out the first
# display interval) is in tta.json as log_s_per_step. dp uses OMP_NUM_THREADS=$(nproc), as
# bench/compare-deepmd.sh. A tool that cannot be installed is left out with a message; a run that
# fails is reported as failed and the others go on. tta.md and tta.json are rewritten after every
# run, so a long benchmark's partial results are there while it runs. The report covers every run
# folder in OUT: a second call with the same OUT (e.g. TOOLS=pt SEEDS=3 to redo or add runs)
# replaces the runs it makes and keeps the others.
#
#   SEEDS=1 STEPS=300 DISP=100 DECAY_STEPS=100 THRESHOLDS="0.8 0.35 0.33" nice -n 19 bench/tta.sh
#                                 # a smoke test (minutes; see BENCHMARKS.md, issue 33)
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=${SEEDS:-3}
seed_sets=${SEED_SETS:-}
steps=${STEPS:-20000}
tools=${TOOLS:-"dpw tf pt"}
input=${INPUT:-examples/water/input.json}
thresholds=${THRESHOLDS:-"0.15 0.12 0.11"}
out=${OUT:-.bench/tta-$(date -u +%Y%m%dT%H%M%SZ)}
disp=${DISP:-500}
val_frames=${VAL_FRAMES:-20}
test_system=${TEST_SYSTEM:-}
start_lr=${START_LR:-1e-3}
stop_lr=${STOP_LR:-3.51e-8}
decay_steps=${DECAY_STEPS:-1000}
while [ $# -gt 0 ]; do
  case $1 in -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
  [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
  case $1 in
    --seeds) seeds=$2 ;;
    --seed-sets) seed_sets=$2 ;;
    --steps) steps=$2 ;;
    --tools) tools=$2 ;;
    --input) input=$2 ;;
    --thresholds) thresholds=$2 ;;
    --out) out=$2 ;;
    --disp) disp=$2 ;;
    --val-frames) val_frames=$2 ;;
    --test-system) test_system=$2 ;;
    *) echo "unknown option $1 (see bench/tta.sh --help)" >&2; exit 2 ;;
  esac
  shift 2
done
for t in $tools; do
  case $t in dpw | tf | pt) ;; *) echo "unknown tool $t in TOOLS (dpw, tf, pt)" >&2; exit 2 ;; esac
done
# A count and a list are two options: "SEEDS=2" meaning seed set 2 alone would silently rerun set 1.
[[ $seeds =~ ^[1-9][0-9]*$ ]] ||
  { echo "SEEDS: '$seeds' is not a count of seed sets (1, 2, ...); for chosen sets use SEED_SETS=\"2 3\"" >&2; exit 2; }
# One space between the sets, as the log and tta.json show them.
seed_list=$(xargs <<<"${seed_sets:-$(seq 1 "$seeds")}")
[ -n "$seed_list" ] || { echo "SEED_SETS is empty" >&2; exit 2; }
for i in $seed_list; do
  [[ $i =~ ^[1-9][0-9]*$ ]] || { echo "SEED_SETS: '$i' in '$seed_sets' is not a seed set (1, 2, ...)" >&2; exit 2; }
done

mkdir -p "$out"
out=$(realpath "$out")
input=$(realpath "$input")
venv=$(realpath -m "${DEEPMD_VENV:-.bench/deepmd-venv}")
helpers=$(mktemp -d)
trap 'rm -rf "$helpers"' EXIT
note() { echo "tta: $*" >&2; }

# ---------------------------------------------------------------------------------------------
# DeePMD-kit: install on first use; a backend that does not install or import is left out.
has() { case " $tools " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
drop() { tools=$(echo " $tools " | sed "s/ $1 / /g; s/^ *//; s/ *$//"); }
if has tf || has pt; then
  if [ ! -x "$venv/bin/dp" ]; then
    note "installing deepmd-kit[cpu]==3.2.0 into $venv (several minutes) ..."
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q "deepmd-kit[cpu]==3.2.0"; } ||
      note "DeePMD-kit 3.2.0 could not be installed into $venv"
  fi
  if has tf && ! "$venv/bin/python" -c "import deepmd.tf, tensorflow" >/dev/null 2>&1; then
    note "DeePMD-kit's TensorFlow backend is not usable in $venv: leaving out tf"
    drop tf
  fi
  if has pt && ! "$venv/bin/python" -c "import deepmd.pt, torch" >/dev/null 2>&1; then
    if [ -x "$venv/bin/pip" ]; then
      note "installing DeePMD-kit's torch extra into $venv (torch: a large download) ..."
      if [ -n "${TORCH_INDEX:-}" ]; then
        "$venv/bin/pip" install -q torch --index-url "$TORCH_INDEX" || true
      fi
      "$venv/bin/pip" install -q "deepmd-kit[cpu,torch]==3.2.0" || true
    fi
    if ! "$venv/bin/python" -c "import deepmd.pt, torch" >/dev/null 2>&1; then
      note "DeePMD-kit's PyTorch backend could not be installed into $venv: leaving out pt"
      drop pt
    fi
  fi
fi
if has dpw; then
  if [ -n "${DPW:-}" ]; then
    dpw=$(realpath "$DPW")
  else
    cargo build --release -q
    dpw=$PWD/target/release/dpw
  fi
fi
[ -n "$tools" ] || { note "no tool left to run"; exit 1; }

# ---------------------------------------------------------------------------------------------
# The input of seed set i: absolute data paths, the schedule, the validation and the seeds.
cat >"$helpers/make_input.py" <<'PY'
import json, os, sys
src, dst, seed, steps, disp, val_frames, start_lr, stop_lr, decay_steps = sys.argv[1:10]
d = json.load(open(src))
base = os.path.dirname(os.path.abspath(src))
tr = d["training"]
for key in ("training_data", "validation_data"):
    if key in tr:
        s = tr[key]["systems"]
        s = [s] if isinstance(s, str) else s
        tr[key]["systems"] = [os.path.join(base, x) for x in s]
if "validation_data" not in tr:
    sys.exit(f"{src} has no training.validation_data")
i = int(seed)
d["model"]["descriptor"]["seed"] = i
d["model"]["fitting_net"]["seed"] = i
tr["seed"] = 10 * i
tr["numb_steps"] = int(steps)
tr["disp_freq"] = int(disp)
tr["save_freq"] = int(steps)
tr["validation_data"]["batch_size"] = 1
tr["validation_data"]["numb_btch"] = int(val_frames)
lr = d.setdefault("learning_rate", {})
lr.pop("decay_rate", None)
lr.update(type="exp", start_lr=float(start_lr), stop_lr=float(stop_lr), decay_steps=int(decay_steps))
d.pop("_comment", None)
json.dump(d, open(dst, "w"), indent=2)
print(tr["validation_data"]["systems"][0])
PY

# Runs a command (its output to LOG) and records when each lcurve.out data line appears.
cat >"$helpers/run_timed.py" <<'PY'
import json, subprocess, sys, time
log, lcurve, dst = sys.argv[1:4]
cmd = sys.argv[5:]  # after "--"
lines, buf, pos = [], "", 0
def poll(t):
    global buf, pos
    try:
        with open(lcurve) as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
    except FileNotFoundError:
        return
    buf += chunk
    *done, buf = buf.split("\n")
    for l in done:
        if l.strip() and not l.lstrip().startswith("#"):
            lines.append({"step": int(float(l.split()[0])), "t": round(t, 3)})
start_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
t0 = time.monotonic()
with open(log, "w") as f:
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    while p.poll() is None:
        time.sleep(0.25)
        poll(time.monotonic() - t0)
wall = time.monotonic() - t0
poll(wall)
json.dump({"cmd": cmd, "start_utc": start_utc, "rc": p.returncode, "wall_s": round(wall, 3),
           "lcurve_seen": lines}, open(dst, "w"), indent=1)
sys.exit(p.returncode)
PY

# Collects every run folder under OUT into tta.md and tta.json.
cat >"$helpers/report.py" <<'PY'
import json, math, os, re, statistics, sys
out, thresholds, meta = sys.argv[1], [float(x) for x in sys.argv[2].split()], json.loads(sys.argv[3])
# Every run folder under OUT, also those of an earlier call with other TOOLS or SEEDS.
tools = ["dpw", "tf", "pt"]
found = [m.groups() for m in (re.fullmatch(r"(dpw|tf|pt)-seed(\d+)", x) for x in os.listdir(out)) if m]
seeds = sorted({int(s) for _, s in found})

def lcurve_val_f(path):
    """(step, rmse_f_val) of each data line, by the header's column names."""
    cols, rows = None, []
    for l in open(path):
        if l.lstrip().startswith("#"):
            names = l.lstrip()[1:].split()
            if names and names[0] == "step":
                cols = names
            continue
        if not l.strip():
            continue
        if cols is None or "rmse_f_val" not in cols:
            raise SystemExit(f"{path}: no rmse_f_val column in the header {cols}")
        v = l.split()
        rows.append((int(float(v[cols.index("step")])), float(v[cols.index("rmse_f_val")])))
    return rows

def last_float(pattern, text):
    m = re.findall(pattern, text)
    return float(m[-1]) if m else None

def run_record(tool, seed):
    d = os.path.join(out, f"{tool}-seed{seed}")
    r = {"tool": tool, "seed": seed, "dir": d}
    tj = os.path.join(d, "timing.json")
    if not os.path.exists(tj):
        return None
    timing = json.load(open(tj))
    r.update(start_utc=timing["start_utc"], train_rc=timing["rc"], wall_s=timing["wall_s"])
    seen = {x["step"]: x["t"] for x in timing["lcurve_seen"]}
    lc = os.path.join(d, "lcurve.out")
    rows = lcurve_val_f(lc) if os.path.exists(lc) else []
    r["final_step"] = rows[-1][0] if rows else None
    r["final_rmse_f_val"] = rows[-1][1] if rows else None
    r["thresholds"] = {}
    for th in thresholds:
        hit = next(((s, v) for s, v in rows if v <= th), None)
        r["thresholds"][str(th)] = None if hit is None else {"step": hit[0], "t_s": seen.get(hit[0])}
    if len(rows) >= 2 and rows[0][0] in seen and rows[-1][0] in seen:
        r["s_per_step"] = (seen[rows[-1][0]] - seen[rows[0][0]]) / (rows[-1][0] - rows[0][0])
    else:
        r["s_per_step"] = None
    log = open(os.path.join(d, "train.log"), errors="replace").read() if os.path.exists(os.path.join(d, "train.log")) else ""
    r["log_s_per_step"] = last_float(r"average training time: ([0-9.eE+-]+) s/batch", log) \
        if tool != "dpw" else last_float(r"([0-9.eE+-]+) s/step leaving out the first display", log)
    t = os.path.join(d, "test.log")
    text = open(t, errors="replace").read() if os.path.exists(t) else ""
    num = r"\s*:\s*([0-9.eE+-]+|nan)"
    r["test_e_rmse"] = last_float(r"Energy RMSE" + num, text)
    r["test_e_rmse_per_atom"] = last_float(r"Energy RMSE/Natoms" + num, text)
    r["test_f_rmse"] = last_float(r"Force\s+RMSE" + num, text)
    r["ok"] = timing["rc"] == 0
    return r

runs = [r for s in seeds for t in tools if (r := run_record(t, s))]

def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

medians = {}
for t in tools:
    rs = [r for r in runs if r["tool"] == t and r["ok"]]
    if not rs:
        continue
    m = {"runs": len(rs), "thresholds": {}}
    for th in map(str, thresholds):
        hits = [r["thresholds"][th] for r in rs]
        # A run that never reaches the threshold counts as infinitely late.
        step = statistics.median([h["step"] if h else math.inf for h in hits])
        tt = statistics.median([(h["t_s"] if h["t_s"] is not None else math.inf) if h else math.inf for h in hits])
        m["thresholds"][th] = {"reached": sum(h is not None for h in hits),
                               "step": None if math.isinf(step) else step,
                               "t_s": None if math.isinf(tt) else round(tt, 2)}
    for k in ("final_rmse_f_val", "test_e_rmse", "test_e_rmse_per_atom", "test_f_rmse",
              "s_per_step", "log_s_per_step", "wall_s"):
        m[k] = median([r[k] for r in rs])
    medians[t] = m

names = {"dpw": "dpw (cpu)", "tf": "DeePMD-kit --tf", "pt": "DeePMD-kit --pt"}
def g(x, f):
    return "—" if x is None else format(x, f)
def cell(h):
    if not h:
        return "—"
    st = h["step"]
    st = format(st, ".0f") if st is not None else "—"
    return f"{st} ({g(h['t_s'], '.0f')} s)" if h.get("t_s") is not None else st
head = ["tool", "seed"] + [f"≤ {th:g}: step (wall)" for th in thresholds] + \
    ["final rmse_f_val", "test E RMSE/atom (meV)", "test F RMSE (eV/Å)", "s/step", "train wall (s)"]
md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
for r in runs:
    if not r["ok"]:
        md.append(f"| {names[r['tool']]} | {r['seed']} | training failed (exit {r['train_rc']}); "
                  f"see {os.path.relpath(r['dir'], out)}/ |" + " |" * (len(head) - 3))
        continue
    tf = "failed" if r["test_f_rmse"] is None else None  # freeze or test failed: see test.log
    md.append("| " + " | ".join([names[r["tool"]], str(r["seed"])]
              + [cell(r["thresholds"][str(th)]) for th in thresholds]
              + [g(r["final_rmse_f_val"], ".3f"),
                 tf or g(r["test_e_rmse_per_atom"] and r["test_e_rmse_per_atom"] * 1e3, ".2f"),
                 tf or g(r["test_f_rmse"], ".4f"), g(r["s_per_step"], ".4f"), g(r["wall_s"], ".0f")]) + " |")
for t, m in medians.items():
    md.append("| " + " | ".join([f"**median {names[t]}**", f"{m['runs']} runs"]
              + [cell(m["thresholds"][str(th)]) + f", {m['thresholds'][str(th)]['reached']}/{m['runs']} reached"
                 for th in thresholds]
              + [g(m["final_rmse_f_val"], ".3f"),
                 g(m["test_e_rmse_per_atom"] and m["test_e_rmse_per_atom"] * 1e3, ".2f"),
                 g(m["test_f_rmse"], ".4f"), g(m["s_per_step"], ".4f"), g(m["wall_s"], ".0f")]) + " |")
text = "\n".join(md) + "\n"
notes = (f"\n{meta['steps']} steps, disp_freq {meta['disp']}, validation on {meta['val_frames']} frames "
         f"of {os.path.basename(meta['test_system'])}; test: all frames of {os.path.basename(meta['test_system'])}. "
         "Step (wall): the first lcurve.out step whose rmse_f_val is at or below the threshold, and the seconds "
         "from the train command's launch to that line's appearance (measured by bench/tta.sh); — = never. "
         "s/step: wall time between the first and last lcurve.out lines. Medians count a run that never "
         "reaches a threshold as infinitely late.\n")
open(os.path.join(out, "tta.md"), "w").write(text + notes)
json.dump({"meta": meta, "runs": runs, "medians": medians}, open(os.path.join(out, "tta.json"), "w"), indent=1)
print(text + notes)
PY

# ---------------------------------------------------------------------------------------------
machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# A given binary need not be this checkout's build, and dpw --version names no commit.
[ -z "${DPW:-}" ] || ! has dpw || commit="unknown: DPW=$dpw, sha256 $(sha256sum "$dpw" | cut -c1-16)"
kit=$([ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import deepmd; print(deepmd.__version__)" 2>/dev/null || echo none)
first_input=$out/.input-probe.json
test_default=$(python3 "$helpers/make_input.py" "$input" "$first_input" 1 "$steps" "$disp" "$val_frames" \
  "$start_lr" "$stop_lr" "$decay_steps")
rm -f "$first_input"
test_system=$(realpath "${test_system:-$test_default}")
meta=$(python3 -c 'import json, sys; a = sys.argv[1:]
print(json.dumps(dict(zip(["input", "steps", "seed_sets", "tools", "thresholds", "disp", "val_frames", "test_system",
    "start_lr", "stop_lr", "decay_steps", "machine", "dpw_commit", "deepmd_kit"], a))))' \
  "$input" "$steps" "$seed_list" "$tools" "$thresholds" "$disp" "$val_frames" "$test_system" \
  "$start_lr" "$stop_lr" "$decay_steps" "$machine" "$commit" "$kit")
note "input $input, $steps steps, seed sets $seed_list, tools: $tools; machine: $machine; out: $out"

report() { python3 "$helpers/report.py" "$out" "$thresholds" "$meta"; }

for i in $seed_list; do
  for t in $tools; do
    d=$out/$t-seed$i
    rm -rf "$d"
    mkdir -p "$d"
    python3 "$helpers/make_input.py" "$input" "$d/input.json" "$i" "$steps" "$disp" "$val_frames" \
      "$start_lr" "$stop_lr" "$decay_steps" >/dev/null
    note "$(date -u +%H:%M:%S) $t seed $i: training ..."
    case $t in
      dpw) train=("$dpw" train input.json --backend cpu) ;;
      *) train=(env OMP_NUM_THREADS="$(nproc)" "$venv/bin/dp" --"$t" train input.json) ;;
    esac
    if (cd "$d" && python3 "$helpers/run_timed.py" train.log lcurve.out timing.json -- "${train[@]}"); then
      note "$(date -u +%H:%M:%S) $t seed $i: freeze and test on $test_system ..."
      case $t in
        dpw) (cd "$d" && "$dpw" freeze -c model.ckpt -o model.dpw &&
          "$dpw" test -m model.dpw -s "$test_system" --backend cpu) >"$d/test.log" 2>&1 ;;
        tf) (cd "$d" && "$venv/bin/dp" --tf freeze -o frozen_model.pb &&
          "$venv/bin/dp" --tf test -m frozen_model.pb -s "$test_system") >"$d/test.log" 2>&1 ;;
        pt) (cd "$d" && "$venv/bin/dp" --pt freeze -o frozen_model.pth &&
          "$venv/bin/dp" --pt test -m frozen_model.pth -s "$test_system") >"$d/test.log" 2>&1 ;;
      esac || { note "$t seed $i: freeze/test failed:"; tail -20 "$d/test.log" >&2; }
    else
      note "$t seed $i: training failed:"
      tail -20 "$d/train.log" >&2
    fi
    report >/dev/null
  done
done
report
note "written: $out/tta.md, $out/tta.json"

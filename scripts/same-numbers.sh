#!/usr/bin/env bash
# A refactor changes no number: trains each example for 40 steps on the cpu backend with two dpw
# binaries (fixed seeds, as the inputs have them) and compares lcurve.out and model.ckpt-40 byte
# for byte. Exit status 1 if any differs or a run fails.
#
#   scripts/same-numbers.sh OLD_DPW NEW_DPW [WORKDIR]     (WORKDIR default: a fresh mktemp -d)
#
# Cases: water (float64 and float32), the alloy, the hybrid water input, the alloy's se_atten_v2.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1"); new=$(realpath "$2"); work=${3:-$(mktemp -d)}
mkdir -p "$work"
status=0
for case in water water-f32 alloy hybrid se_atten_v2; do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    d=$work/$case-$which; rm -rf "$d"; mkdir -p "$d"
    python3 - "$root" "$case" "$d" <<'PY'
import json, os, sys
root, case, d = sys.argv[1:]
src = {'water': 'water/input.json', 'water-f32': 'water/input.json',
       'alloy': 'alloy/input.json', 'hybrid': 'water/input_hybrid.json',
       'se_atten_v2': 'alloy/input_se_atten_v2.json'}[case]
src = os.path.join(root, 'examples', src)
j = json.load(open(src))
base = os.path.dirname(src)
t = j['training']
for part in ('training_data', 'validation_data'):
    if part in t:
        t[part]['systems'] = [os.path.join(base, s) for s in t[part]['systems']]
t.update(numb_steps=40, disp_freq=10, save_freq=40)
if case == 'water-f32':
    j['model']['descriptor']['precision'] = 'float32'
    j['model']['fitting_net']['precision'] = 'float32'
json.dump(j, open(os.path.join(d, 'input.json'), 'w'), indent=1)
PY
    if ! (cd "$d" && "$bin" train input.json --backend cpu >train.log 2>&1); then
      echo "$case: the $which binary failed (see $d/train.log)"; status=1
    fi
  done
  for f in lcurve.out model.ckpt-40; do
    if cmp -s "$work/$case-old/$f" "$work/$case-new/$f"; then
      echo "$case $f: identical"
    else
      echo "$case $f: DIFFERS"; status=1
    fi
  done
done
exit $status

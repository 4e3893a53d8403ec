#!/usr/bin/env bash
# A refactor changes no number: trains each example for 40 steps (DPA-2 and DPA-3: 8) on the cpu
# backend with two dpw binaries (fixed seeds, as the inputs have them) and compares lcurve.out, the
# last checkpoint and out.json byte for byte, and the model each freezes to DeePMD-kit's .yaml but
# for its `time:` line. Exit status 1 if any differs or a run fails.
#
#   scripts/same-numbers.sh OLD_DPW NEW_DPW [WORKDIR]     (WORKDIR default: a fresh mktemp -d)
#
# Cases: water (float64 and float32), the alloy, the hybrid water input, the alloy's se_atten_v2,
# water's DPA-2 and DPA-3 inputs, and DeePMD-kit's examples of the other fittings on their data in
# tests/data/deepmd-kit: fparam (ener with frame parameters), dos, property, dipole, polar.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1"); new=$(realpath "$2"); work=${3:-$(mktemp -d)}
mkdir -p "$work"
status=0
for case in water water-f32 alloy hybrid se_atten_v2 dpa2 dpa3 fparam dos property dipole polar; do
  steps=40; case $case in dpa2|dpa3) steps=8 ;; esac
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    d=$work/$case-$which; rm -rf "$d"; mkdir -p "$d"
    python3 - "$root" "$case" "$d" "$steps" <<'PY'
import json, os, sys
root, case, d, steps = sys.argv[1:]
deepmd = 'tests/data/deepmd-kit/examples/'
src = {'water': 'examples/water/input.json', 'water-f32': 'examples/water/input.json',
       'alloy': 'examples/alloy/input.json', 'hybrid': 'examples/water/input_hybrid.json',
       'se_atten_v2': 'examples/alloy/input_se_atten_v2.json',
       'dpa2': 'examples/water/input_dpa2.json', 'dpa3': 'examples/water/input_dpa3.json',
       'fparam': deepmd + 'fparam/train/input.json', 'dos': deepmd + 'dos/train/input_torch.json',
       'property': deepmd + 'property/train/input_torch.json',
       'dipole': deepmd + 'water_tensor/dipole/dipole_input_torch.json',
       'polar': deepmd + 'water_tensor/polar/polar_input_torch.json'}[case]
src = os.path.join(root, src)
j = json.load(open(src))
base = os.path.dirname(src)
t = j['training']
for part in ('training_data', 'validation_data'):
    if part in t:
        t[part]['systems'] = [os.path.join(base, s) for s in t[part]['systems']]
for alias in ('stop_batch', 'numb_step', 'num_step', 'num_steps'):
    t.pop(alias, None)
steps = int(steps)
t.update(numb_steps=steps, disp_freq=min(10, steps // 2), save_freq=steps, save_ckpt='model.ckpt')
if case == 'water-f32':
    j['model']['descriptor']['precision'] = 'float32'
    j['model']['fitting_net']['precision'] = 'float32'
json.dump(j, open(os.path.join(d, 'input.json'), 'w'), indent=1)
PY
    if ! (cd "$d" && "$bin" train input.json --backend cpu >train.log 2>&1 &&
          "$bin" freeze -o model.yaml >>train.log 2>&1); then
      echo "$case: the $which binary failed (see $d/train.log)"; status=1
    fi
    grep -v '^time: ' "$d/model.yaml" >"$d/model.untimed.yaml" || true
  done
  for f in lcurve.out model.ckpt-$steps out.json model.untimed.yaml; do
    if cmp -s "$work/$case-old/$f" "$work/$case-new/$f"; then
      echo "$case $f: identical"
    else
      echo "$case $f: DIFFERS"; status=1
    fi
  done
done
exit $status

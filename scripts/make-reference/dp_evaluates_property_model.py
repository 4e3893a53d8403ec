"""DeePMD-kit 3.2.0 evaluates a property model dpw trained as dpw does.

Run from the repository root with the DeePMD-kit 3.2.0 virtual environment's python (its `dp`
beside it), after `cargo build --release`:
`python scripts/make-reference/dp_evaluates_property_model.py`. For each case of
tests/reference/fittings/property_* it writes the three eval frames as a deepmd/npy system with
their band_prop.npy, trains the reference's model section 5 steps with dpw, freezes it to
DeePMD-kit's .yaml, runs `dpw test -d`, converts the .yaml to .pth with `dp convert-backend` and
evaluates it with DeePMD-kit's DeepProperty on the same frames; prints the largest difference of
the frame properties (2026-12-02: property_water 6.8e-13 on values up to 1.7e3, 4.0e-16
relative; property_mol 1.7e-16 on 0.29, 5.8e-16 relative).
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.getcwd()
DPW = os.path.join(ROOT, "target/release/dpw")


def npz_system(z, meta, sysdir):
    """A reference's eval.npz frames `z` as a deepmd/npy system in `sysdir` (with a box or
    `nopbc` as its eval.json `meta` says); returns its set.000 folder."""
    nf = z["coord"].shape[0]
    s = os.path.join(sysdir, "set.000")
    os.makedirs(s)
    with open(os.path.join(sysdir, "type.raw"), "w") as fh:
        fh.write("\n".join(map(str, z["atype"])))
    with open(os.path.join(sysdir, "type_map.raw"), "w") as fh:
        fh.write("\n".join(meta["type_map"]))
    np.save(os.path.join(s, "coord.npy"), z["coord"].reshape(nf, -1))
    if meta["pbc"]:
        np.save(os.path.join(s, "box.npy"), z["box"].reshape(nf, 9))
    else:
        open(os.path.join(sysdir, "nopbc"), "w").close()
    return s


def check(case):
    d = os.path.join(ROOT, "tests/reference/fittings", case)
    z = np.load(os.path.join(d, "eval.npz"))
    meta = json.load(open(os.path.join(d, "eval.json")))
    nf = 3
    with tempfile.TemporaryDirectory() as tmp:
        s = npz_system(z, meta, os.path.join(tmp, "sys"))
        pbc = meta["pbc"]
        np.save(os.path.join(s, "band_prop.npy"), z["property_label"].reshape(nf, -1))
        model = json.load(open(os.path.join(d, "input.json")))["model"]
        inp = {"model": model,
               "learning_rate": {"start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 5},
               "loss": {"type": "property"},
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
        from deepmd.infer.deep_property import DeepProperty

        dp = DeepProperty(os.path.join(tmp, "model.pth"))
        box = z["box"].reshape(nf, 9) if pbc else None
        theirs = dp.eval(z["coord"].reshape(nf, -1), box, z["atype"])[0].reshape(nf, -1)
        mine = np.stack([np.loadtxt(os.path.join(tmp, f"pred.property.out.{f}"))[:, 1]
                         for f in range(nf)])
        diff = np.abs(theirs - mine).max()
        print(f"{case}: property max abs diff {diff:.2e} (values up to "
              f"{np.abs(mine).max():.3e}; relative {diff / np.abs(mine).max():.1e})")


def main():
    for case in ["property_water", "property_mol"]:
        check(case)


if __name__ == "__main__":
    main()

"""DeePMD-kit 3.2.0's energy bias on the alloy example, for tests/deepmd_parity.rs.

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu]==3.2.0"`) from
the repository root: `python scripts/make-reference/energy_bias.py`. Writes
tests/reference/energy_bias.json.

The frames are every frame of the listed systems, read by DeePMD-kit's own `DeepmdData`, and the
bias is DeePMD-kit's `compute_output_stats` (the path every backend's `dp train` takes for
`out_bias` with `rcond: null`, the default): one row per frame, numpy's lstsq.
"""

import json

import deepmd
import numpy as np
from deepmd.dpmodel.utils.stat import compute_output_stats
from deepmd.utils.data import DeepmdData

TYPE_MAP = ["Cu", "Ni", "Al"]
CASES = {
    # every system has 65 Cu + 32 Ni + 11 Al: the count matrix has rank 1
    "single_composition": ["train/Cu65Ni32Al11_a", "train/Cu65Ni32Al11_b"],
    "mixed_composition": [
        "train/Cu65Ni32Al11_a",
        "train/Cu65Ni32Al11_b",
        "train/Cu36Ni36Al36",
        "train/Cu27Ni54Al27",
    ],
}


def system_sample(system):
    d = DeepmdData(f"examples/alloy/data/{system}", type_map=TYPE_MAP)
    d.add("energy", 1, atomic=False, must=True, high_prec=True)
    s = d.get_test()  # every frame of the system, as DeePMD-kit loads them
    nf = s["energy"].shape[0]
    natoms = d.get_natoms_vec(len(TYPE_MAP))
    return {
        "energy": s["energy"].reshape(nf, 1).astype(np.float64),
        "natoms": np.tile(natoms, (nf, 1)),
        "find_energy": np.float32(1.0),
    }


def main():
    out = {
        "generator": "scripts/make-reference/energy_bias.py",
        "deepmd_kit": deepmd.__version__,
        "numpy": np.__version__,
        "type_map": TYPE_MAP,
    }
    for case, systems in CASES.items():
        sampled = [system_sample(s) for s in systems]
        bias, std = compute_output_stats(sampled, len(TYPE_MAP), ["energy"], rcond=None)
        out[case] = {
            "systems": systems,
            "frames": "all",
            "bias": bias["energy"].reshape(-1).tolist(),
            "std": float(std["energy"].reshape(-1)[0]),
        }
        print(case, out[case]["bias"], out[case]["std"])
    with open("tests/reference/energy_bias.json", "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()

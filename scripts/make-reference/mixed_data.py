"""Mixed-type data (dpdata's `deepmd/npy/mixed`) and DeePMD-kit 3.2.0's numbers on it, for
tests/data_mixed.rs.

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`)
from the repository root: `python scripts/make-reference/mixed_data.py`. Seeded by construction
(no random numbers): rerunning writes the same files.

Writes
- tests/data/mixed/alloy/: ONE mixed-type system of 6 frames of the alloy example (108 atoms,
  three compositions), in two sets (4 + 2 frames), as dpdata's mixed writer lays it out:
  `type.raw` all 0 (one placeholder type), `type_map.raw` the elements in the data's own order
  (Al, Cu, Ni: not the model's Cu, Ni, Al, so types map by name), and per set
  `real_atom_types.npy` [nframes, natoms] (int64) beside coord, box, energy, force, virial
  (the dtypes of the source files). Frame k lists its atoms by type in a rotated block order
  (k = 0: Cu Ni Al, 1: Ni Al Cu, 2: Al Cu Ni, ...), so the first atom of a frame is not always
  of the lowest type: DeePMD-kit does not sort a mixed frame, and its padding slots take the
  type of the frame's atom 0 (docs/design.md §11.1 item 3).
- tests/reference/mixed_data.json: where each frame came from, and what DeePMD-kit computes:
  - `deepmd_atype`: the model types DeePMD-kit's own loader (`DeepmdData`, mixed_type) gives each
    frame, in file order;
  - `stats`: `dp train`'s statistics path on these frames: PyTorch `make_stat_input` over a
    `DpLoaderSet` of the system (one batch of all 6 frames, `fid` recorded), then the model's
    `compute_or_load_stat`: davg/dstd of a se_atten with set_davg_zero false and the out_bias
    (least squares over the frames' own type counts, `real_natoms_vec`);
  - `eval`: energy, force, virial of tests/reference/dpa1/se_atten_l2_alloy/model.yaml (concat,
    davg != 0, so the padding type reaches the energy) on the 6 frames as one batch, each frame
    with its own types in file order: the PyTorch model's forward.
"""

import copy
import json
import os

import deepmd
import numpy as np
import torch

TYPE_MAP = ["Cu", "Ni", "Al"]
DATA_TYPE_MAP = ["Al", "Cu", "Ni"]
SRC = "examples/alloy/data/train"
# (system, frame) in the mixed system's order: the compositions alternate, so each set mixes them
FRAMES = [("Cu65Ni32Al11_a", 0), ("Cu36Ni36Al36", 0), ("Cu27Ni54Al27", 0),
          ("Cu65Ni32Al11_a", 1), ("Cu36Ni36Al36", 1), ("Cu27Ni54Al27", 1)]
SETS = [4, 2]
OUT = "tests/data/mixed/alloy"
MODEL = "tests/reference/dpa1/se_atten_l2_alloy"
NATOMS = 108


def source(system):
    root = os.path.join(SRC, system)
    names = open(os.path.join(root, "type_map.raw")).read().split()
    raw = np.loadtxt(os.path.join(root, "type.raw"), dtype=int).reshape(-1)
    assert names == TYPE_MAP and np.all(np.diff(raw) >= 0), "sources are sorted, model order"
    s = os.path.join(root, "set.000")
    return raw, {k: np.load(os.path.join(s, f"{k}.npy"))
                 for k in ("coord", "box", "energy", "force", "virial")}


def block_order(model_types, k):
    """Atom indices of a type-sorted frame with its type blocks rotated by k."""
    blocks = [np.flatnonzero(model_types == t) for t in range(len(TYPE_MAP))]
    r = k % len(blocks)
    return np.concatenate(blocks[r:] + blocks[:r])


def write_data():
    frames = []
    for k, (system, f) in enumerate(FRAMES):
        raw, arrays = source(system)
        order = block_order(raw, k)
        data_types = np.array([DATA_TYPE_MAP.index(TYPE_MAP[t]) for t in raw[order]])
        frames.append({
            "system": system, "frame": f, "order": order,
            "coord": arrays["coord"][f].reshape(NATOMS, 3)[order].reshape(-1),
            "force": arrays["force"][f].reshape(NATOMS, 3)[order].reshape(-1),
            "box": arrays["box"][f], "energy": arrays["energy"][f], "virial": arrays["virial"][f],
            "real_atom_types": data_types,
        })
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "type.raw"), "w") as fh:
        fh.write("0\n" * NATOMS)
    with open(os.path.join(OUT, "type_map.raw"), "w") as fh:
        fh.write("".join(f"{n}\n" for n in DATA_TYPE_MAP))
    start = 0
    for s, n in enumerate(SETS):
        d = os.path.join(OUT, f"set.{s:03d}")
        os.makedirs(d, exist_ok=True)
        part = frames[start:start + n]
        for key in ("coord", "box", "energy", "force", "virial", "real_atom_types"):
            a = np.stack([fr[key] for fr in part])
            if key == "real_atom_types":
                a = a.astype(np.int64)
            np.save(os.path.join(d, f"{key}.npy"), a)
        start += n
    return frames


def deepmd_types():
    from deepmd.utils.data import DeepmdData

    d = DeepmdData(OUT, type_map=TYPE_MAP)
    assert d.mixed_type
    return np.concatenate([d._load_set(s)["type"] for s in d.dirs]).tolist()


def stats(frames):
    from deepmd.pt.model.model import get_model
    from deepmd.pt.utils.dataloader import DpLoaderSet
    from deepmd.pt.utils.stat import make_stat_input
    from deepmd.utils.data import DataRequirementItem

    params = json.load(open(os.path.join(MODEL, "input.json")))["model"]
    model = get_model(copy.deepcopy(params)).to(torch.float64)
    loader = DpLoaderSet([OUT], batch_size=len(FRAMES), type_map=TYPE_MAP, shuffle=False)
    loader.add_data_requirement([
        DataRequirementItem("energy", 1, atomic=False, must=True, high_prec=True),
        DataRequirementItem("force", 3, atomic=True, must=True, high_prec=False),
        DataRequirementItem("virial", 9, atomic=False, must=False, high_prec=False),
    ])
    sampled = make_stat_input(loader.systems, loader.dataloaders, 1)
    # The frames drawn, found by their energies (the collated batch keeps no frame index).
    energies = [float(fr["energy"]) for fr in frames]
    fids = sorted(energies.index(float(e)) for s in sampled
                  for e in np.asarray(s["energy"]).reshape(-1))
    model.compute_or_load_stat(lambda: sampled, None)
    am = model.atomic_model
    davg, dstd = (np.asarray(a.detach().cpu()) for a in am.descriptor.get_stat_mean_and_stddev())
    assert np.all(davg == davg[:, :1]) and np.all(dstd == dstd[:, :1])
    return {
        "descriptor": params["descriptor"]["type"],
        "set_davg_zero": params["descriptor"]["set_davg_zero"],
        "rcut": params["descriptor"]["rcut"], "rcut_smth": params["descriptor"]["rcut_smth"],
        "sel": params["descriptor"]["sel"],
        "frames_used": fids,
        "davg_per_type": davg[:, 0].tolist(), "dstd_per_type": dstd[:, 0].tolist(),
        "energy_bias": am.out_bias.detach().cpu().numpy().reshape(-1).tolist(),
    }


def evaluate(frames):
    from deepmd.dpmodel.utils.serialization import load_dp_model
    from deepmd.pt.model.model import BaseModel

    pt = BaseModel.deserialize(copy.deepcopy(load_dp_model(os.path.join(MODEL, "model.yaml"))["model"]))
    nf = len(frames)
    atype = np.array([[TYPE_MAP.index(DATA_TYPE_MAP[t]) for t in fr["real_atom_types"]]
                      for fr in frames])
    coord = np.stack([fr["coord"] for fr in frames]).astype(np.float64)
    box = np.stack([fr["box"] for fr in frames]).astype(np.float64)
    pt.train(False)
    r = pt(torch.tensor(coord.reshape(nf, -1)), torch.tensor(atype, dtype=torch.int64),
           box=torch.tensor(box.reshape(nf, 9)))
    # Each frame alone, sorted by type the way dpw sorts it: the same numbers but for the
    # padding type, which then is the lowest type present (recorded to show the order matters).
    alone = []
    for k in range(nf):
        o = np.argsort(atype[k], kind="stable")
        e = pt(torch.tensor(coord[k].reshape(NATOMS, 3)[o].reshape(1, -1)),
               torch.tensor(atype[k][o][None], dtype=torch.int64),
               box=torch.tensor(box[k].reshape(1, 9)))["energy"]
        alone.append(float(e.detach().reshape(-1)[0]))
    return {
        "model": os.path.join(MODEL, "model.yaml"),
        "atom_order": "file order (DeePMD-kit's loader does not sort a mixed frame)",
        "energy": r["energy"].detach().numpy().reshape(-1).tolist(),
        "force": r["force"].detach().numpy().reshape(nf, -1).tolist(),
        "virial": r["virial"].detach().numpy().reshape(nf, 9).tolist(),
        "energy_sorted_by_type": alone,
    }


def main():
    torch.set_default_dtype(torch.float64)
    frames = write_data()
    out = {
        "generator": "scripts/make-reference/mixed_data.py",
        "deepmd_kit": deepmd.__version__, "torch": torch.__version__, "numpy": np.__version__,
        "type_map": TYPE_MAP, "data_type_map": DATA_TYPE_MAP,
        "system": OUT, "sets": SETS,
        "frames": [{"system": f"{SRC}/{fr['system']}", "frame": fr["frame"],
                    "order": fr["order"].tolist()} for fr in frames],
        "deepmd_atype": deepmd_types(),
        "stats": stats(frames),
        "eval": evaluate(frames),
    }
    print(json.dumps({k: out[k] for k in ("stats",)}, indent=1))
    print("energy", out["eval"]["energy"], "sorted", out["eval"]["energy_sorted_by_type"])
    with open("tests/reference/mixed_data.json", "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()

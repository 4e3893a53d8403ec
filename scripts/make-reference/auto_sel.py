"""DeePMD-kit 3.2.0's `sel: "auto"` and its sel warning on the repository's example data, for
tests/hardening.rs (`auto_sel_is_deepmd_kits`, `auto_sel_of_dpa2_and_dpa3_lists_is_deepmd_kits`,
`small_sel_of_each_dpa2_and_dpa3_list_is_warned_about`,
`small_mixed_sel_is_warned_about_as_one_list`,
`small_sel_is_warned_about`, `zero_sel_of_a_type_is_not_warned_about`).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`)
from the repository root: `python scripts/make-reference/auto_sel.py`. Deterministic (no random
numbers): it prints one line per case, which the tests hold as numbers.

Each case goes the way `dp --pt train` goes before its first step (deepmd/pt/entrypoints/main.py,
`get_trainer` without --skip-neighbor-stat): `update_deepmd_input`, `normalize`, `get_data` of
the training data, then `BaseModel.update_sel` on the model, which runs each descriptor's own
`update_sel` (deepmd/utils/update_sel.py: NeighborStat per type, or of all types together for
the mixed-type se_atten / se_atten_v2; "auto:R" is `4 * ((int(count * R) + 3) // 4)`, R 1.1 by
default; a numeric sel below the count logs "sel of type i is not enough!", except where it is 0;
DPA-2 and DPA-3 count each of their lists at its own rcut, all types together).
Printed per case: the sel DeePMD-kit writes into the model, and the warnings it logs. Then
`dp neighbor-stat` (deepmd/entrypoints/neighbor_stat.py) on the alloy's training systems, per type
and with --mixed-type, for tests/hardening.rs's `neighbor_stat_mixed_type_is_deepmd_kits`.

The venv holds DeePMD-kit without PyTorch, so the model classes are the numpy backend's
(deepmd.dpmodel, `dp --dp`): their `update_sel` is the same `BaseUpdateSel.update_one_sel` as the
PyTorch backend's, with the numpy `NeighborStat`.

Data: the water example's data_0..data_2 (type_map O, H) and the alloy example's four training
systems (type_map Cu, Ni, Al), as tests/hardening.rs's `input_with` reads them.
"""

import copy
import logging
import os

from deepmd.dpmodel.model.base_model import BaseModel
from deepmd.entrypoints.neighbor_stat import neighbor_stat
from deepmd.utils.argcheck import normalize
from deepmd.utils.compat import update_deepmd_input
from deepmd.utils.data_system import get_data

WATER = (["O", "H"], [f"examples/water/data_{k}" for k in range(3)])
ALLOY = (["Cu", "Ni", "Al"], [os.path.join("examples/alloy/data/train", s) for s in
                              ("Cu65Ni32Al11_a", "Cu65Ni32Al11_b", "Cu36Ni36Al36",
                               "Cu27Ni54Al27")])


def descriptor(kind, rcut, sel):
    d = {"type": kind, "sel": sel, "rcut": rcut, "rcut_smth": 0.5, "neuron": [4, 8]}
    if kind.startswith("se_atten"):
        d.update(attn=8, attn_layer=1, tebd_dim=4)
    return d


CASES = [
    # (data, descriptor)
    (WATER, descriptor("se_e2_a", 6.0, "auto")),
    (WATER, descriptor("se_e2_r", 6.0, "auto")),
    (WATER, descriptor("se_e3", 4.0, "auto")),
    (WATER, descriptor("se_atten", 6.0, "auto")),
    (WATER, descriptor("se_atten_v2", 6.0, "auto")),
    (WATER, descriptor("se_e2_a", 6.0, "auto:1.5")),
    (WATER, descriptor("se_atten", 6.0, "auto:1.5")),
    (WATER, {"type": "hybrid", "list": [descriptor("se_e2_a", 6.0, "auto"),
                                        descriptor("se_e2_r", 4.0, "auto")]}),
    (ALLOY, descriptor("se_e2_a", 5.0, "auto")),
    (ALLOY, descriptor("se_atten", 5.0, "auto")),
    (ALLOY, descriptor("se_atten_v2", 5.0, "auto")),
    # the warnings
    (ALLOY, descriptor("se_atten_v2", 5.0, 40)),
    (WATER, descriptor("se_e2_a", 6.0, [4, 28])),
    (WATER, descriptor("se_e2_a", 6.0, [0, 28])),
    (WATER, {"type": "hybrid", "list": [descriptor("se_e2_a", 6.0, [46, 92]),
                                        descriptor("se_e2_r", 4.0, [10, 20])]}),
    # every list of DPA-2 (repinit, its three-body block, repformer) and DPA-3 (edges, angles),
    # each at its own rcut, mixed-type
    (WATER, {"type": "dpa2",
             "repinit": {"rcut": 5.0, "rcut_smth": 0.5, "nsel": "auto", "neuron": [4, 8],
                         "axis_neuron": 4, "use_three_body": True, "three_body_rcut": 3.5,
                         "three_body_rcut_smth": 0.5, "three_body_sel": "auto:1.25"},
             "repformer": {"rcut": 4.0, "rcut_smth": 0.5, "nsel": "auto:1.3", "nlayers": 1,
                           "g1_dim": 8, "g2_dim": 4}}),
    (WATER, {"type": "dpa3",
             "repflow": {"n_dim": 8, "e_dim": 4, "a_dim": 4, "nlayers": 1, "e_rcut": 4.5,
                         "e_rcut_smth": 0.5, "e_sel": "auto", "a_rcut": 3.0,
                         "a_rcut_smth": 0.5, "a_sel": "auto:0.9"}}),
    # their warnings, list by list
    (WATER, {"type": "dpa2",
             "repinit": {"rcut": 5.0, "rcut_smth": 0.5, "nsel": 60, "neuron": [4, 8],
                         "axis_neuron": 4, "use_three_body": True, "three_body_rcut": 3.5,
                         "three_body_rcut_smth": 0.5, "three_body_sel": 20},
             "repformer": {"rcut": 4.0, "rcut_smth": 0.5, "nsel": 30, "nlayers": 1,
                           "g1_dim": 8, "g2_dim": 4}}),
    (WATER, {"type": "dpa3",
             "repflow": {"n_dim": 8, "e_dim": 4, "a_dim": 4, "nlayers": 1, "e_rcut": 4.5,
                         "e_rcut_smth": 0.5, "e_sel": 40, "a_rcut": 3.0, "a_rcut_smth": 0.5,
                         "a_sel": 10}}),
]

# The keys of DPA-2's and DPA-3's lists: (block, rcut key, sel key).
LISTS = {
    "dpa2": [("repinit", "rcut", "nsel"), ("repinit", "three_body_rcut", "three_body_sel"),
             ("repformer", "rcut", "nsel")],
    "dpa3": [("repflow", "e_rcut", "e_sel"), ("repflow", "a_rcut", "a_sel")],
}


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        if "sel of type" in record.getMessage():
            self.messages.append(record.getMessage())


def run(data, desc):
    type_map, systems = data
    config = {
        "model": {"type_map": type_map, "descriptor": copy.deepcopy(desc),
                  "fitting_net": {"neuron": [8], "seed": 1}},
        "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5, "decay_steps": 10},
        "loss": {"type": "ener"},
        "training": {"training_data": {"systems": systems, "batch_size": 1},
                     "numb_steps": 1},
    }
    config = update_deepmd_input(config, warning=False)
    config = normalize(config)
    train_data = get_data(config["training"]["training_data"], 0, type_map, None)
    handler = Warnings()
    logging.getLogger().addHandler(handler)
    try:
        model, _ = BaseModel.update_sel(train_data, type_map, config["model"])
    finally:
        logging.getLogger().removeHandler(handler)
    d = model["descriptor"]
    if d["type"] in LISTS:
        sel = [d[block][key] for block, _, key in LISTS[d["type"]]]
    else:
        sel = [s["sel"] for s in d["list"]] if d["type"] == "hybrid" else d["sel"]
    return sel, handler.messages


def main():
    for data, desc in CASES:
        sel, warnings = run(data, desc)
        name = "water" if data is WATER else "alloy"
        if desc["type"] in LISTS:
            given = (desc["type"], [(f"{block}.{key}", desc[block][rc], desc[block][key])
                                    for block, rc, key in LISTS[desc["type"]]])
        elif desc["type"] == "hybrid":
            given = [(s["type"], s["rcut"], s["sel"]) for s in desc["list"]]
        else:
            given = (desc["type"], desc["rcut"], desc["sel"])
        print(f"{name} {given}: sel {sel}; warnings {warnings}")
    for mixed_type in (False, True):
        dist, size = neighbor_stat(system="examples/alloy/data/train", rcut=5.0,
                                   type_map=ALLOY[0], mixed_type=mixed_type, backend="numpy")
        print(f"dp neighbor-stat alloy train rcut 5 mixed_type {mixed_type}: "
              f"min_nbor_dist {dist:.6f} max_nbor_size {[int(n) for n in size]}")


if __name__ == "__main__":
    main()

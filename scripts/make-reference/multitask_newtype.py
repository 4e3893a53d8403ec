"""DeePMD-kit 3.2.0's fine-tune of a multi-task input to a type_map with an element the
pretrained model lacks (issue 56: `dp --pt train input.json --finetune pre_mt.pt`), for dpw to
start the same way.

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root, after
multitask.py (it fine-tunes that script's `pre_mt`):
`python scripts/make-reference/multitask_newtype.py` (no arguments; about half a minute).

Writes tests/reference/multitask/ft_mt_mt_newtype/: input.json (type_map_all O H Cu Ni Al **C**;
task `water`, a head of pre_mt named as the task and without finetune_head, so resumed, on
examples/water/data_0; task `mol`, fine-tuned from head `water` (finetune_head) on the C4H3O1
molecule, tests/data/nopbc/C4H3O1; numb_steps 0), each head's model_<task>.yaml as the run
saved it, and bias.json (each head's out_bias before and after).
"""

import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multitask as mt  # noqa: E402

OUT = "tests/reference/multitask/ft_mt_mt_newtype"
PRE = "tests/reference/multitask/pre_mt/model.ckpt.pt"

INPUT = {
    "model": {
        "shared_dict": {"type_map_all": mt.TYPE_MAP_ALL + ["C"], "dpa1": mt.DPA1},
        "model_dict": {
            "water": {"type_map": "type_map_all", "descriptor": "dpa1", "fitting_net": mt.fit(2),
                      "data_stat_nbatch": 20},
            "mol": {"type_map": "type_map_all", "descriptor": "dpa1", "fitting_net": mt.fit(2),
                    "data_stat_nbatch": 20, "finetune_head": "water"},
        },
    },
    "learning_rate": mt.LR,
    "loss_dict": {"water": mt.LOSS_EF, "mol": mt.LOSS_EF},
    "training": {
        "model_prob": {"water": 1.0, "mol": 1.0},
        "data_dict": {"water": {"training_data": mt.data(mt.WATER)},
                      "mol": {"training_data": mt.data(["tests/data/nopbc/C4H3O1"])}},
        "numb_steps": 0, "seed": 10, "disp_freq": 1, "save_freq": 1,
    },
}


def main():
    d = mt.workdir(tempfile.mkdtemp(), "ft_mt_mt_newtype")
    mt.write_json(os.path.join(d, "input.json"), INPUT)
    mt.run(mt.dp_cmd("--pt", "train", "input.json", "--finetune", PRE), d)
    ckpt = os.path.realpath(os.path.join(d, "model.ckpt.pt"))
    os.makedirs(OUT, exist_ok=True)
    mt.write_json(os.path.join(OUT, "input.json"), copy.deepcopy(INPUT))
    bias = {"command": f"dp --pt train input.json --finetune {PRE}", "heads": {}}
    for h in INPUT["model"]["model_dict"]:
        mt.save_yaml(ckpt, h, os.path.join(OUT, f"model_{h}.yaml"))
        bias["heads"][h] = {"out_bias_pretrained": mt.out_bias(PRE, "water"),
                            "out_bias_after": mt.out_bias(ckpt, h)}
    mt.write_json(os.path.join(OUT, "bias.json"), bias)
    print(json.dumps(bias, indent=1))


if __name__ == "__main__":
    main()

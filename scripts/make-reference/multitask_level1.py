"""DeePMD-kit 3.2.0's multi-task training with the descriptor shared at level 1
(`"descriptor": "dpa1:1"`: the tasks share the type embedding alone, each training the rest of
its descriptor with statistics of its own data), for dpw to replay exactly (issue 56, item 3:
`shared_level`).

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root, after
multitask_steps.py (it uses that script's one-frame systems and `mt_steps`'s input):
`python scripts/make-reference/multitask_level1.py` (no arguments; about a minute).

Writes tests/reference/multitask/:
- `l1_steps`: `mt_steps`'s input with `"descriptor": "dpa1:1"` in both tasks, 8 steps from
  `pre_mt` (`dp --pt train input.json --init-model pre_mt/model.ckpt.pt`), traced as
  multitask.py traces: input.json, lcurve.out, info.json, model_<task>.yaml after step 8.
- `l1_stats`: `mt_stats`'s input (the alloy task with a water frame added) with `"dpa1:1"`,
  trained 0 steps from scratch: each head's model_<task>.yaml holds its own davg/dstd (not
  merged over the tasks, as at level 0) and its energy bias.
"""

import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multitask_sharefit as sf  # noqa: E402

OUT = "tests/reference/multitask"
STEPS = 8


def level1(inp):
    inp = copy.deepcopy(inp)
    for task in inp["model"]["model_dict"].values():
        task["descriptor"] = "dpa1:1"
    return inp


def main():
    inp = level1(json.load(open(f"{OUT}/mt_steps/input.json")))
    tasks = sf.traced_steps("l1_steps", inp, f"{OUT}/pre_mt/model.ckpt.pt")
    stats = level1(json.load(open(f"{OUT}/mt_stats/input.json")))
    _, ckpt = sf.train("l1_stats", stats)
    sf.keep("l1_stats", stats, ckpt)
    print(f"l1_steps: tasks {tasks}")


if __name__ == "__main__":
    main()

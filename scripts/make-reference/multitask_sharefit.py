"""DeePMD-kit 3.2.0's multi-task training with a fitting net shared among the tasks and its case
embedding (`fitting_net: "<shared_dict key>"`, `dim_case_embd`), for dpw to replay exactly
(issue 56: DeePMD-kit's `water_multi_task/pytorch_example/input_torch_sharefit.json`).

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root, after
multitask_steps.py (it trains on that script's one-frame systems in tests/data/multitask):
`python scripts/make-reference/multitask_sharefit.py [PREFIX ...]` (about a minute; with
arguments, the cases of those prefixes alone: sf, pf, lf).

Writes tests/reference/multitask/:
- `sf_pre`: `mt_steps`'s tasks (water, alloy) sharing a DPA-1 descriptor and one fitting net
  with dim_case_embd 2, trained 4 steps from scratch (`dp --pt train input.json`): input.json,
  model.ckpt.pt, and each head as DeePMD-kit serialises it (model_<task>.yaml, which
  tests/pt_reader.rs reads the .pt against). Its case embeddings are DeePMD-kit's one-hot rows
  by the tasks' sorted names (alloy 0, water 1).
- `sf_steps`: 8 steps from `sf_pre` (`dp --pt train input.json --init-model
  sf_pre/model.ckpt.pt`), traced as multitask.py traces (the task of each step and every
  displayed loss at full precision): input.json, lcurve.out, info.json, model_<task>.yaml.
- `sf_stats`: the same input trained 0 steps from scratch: each head's energy bias and case
  embedding as a fresh run makes them (model_<task>.yaml).
- `sf_fparam`: two tasks on DeePMD-kit's fparam systems sharing a fitting net that takes a frame
  parameter, 0 steps: the merged fparam statistics.
- `pf_pre`, `pf_steps`, `pf_stats`: the same three forms for three tasks of which two (alloy,
  alloy2) share the fitting net and water has its own (PARTFIT).
- `lf_pre`, `lf_steps`, `lf_stats`: SHAREFIT with the descriptor shared at level 1 (L1FIT).
"""

import copy
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multitask as mt  # noqa: E402

OUT = "tests/reference/multitask"
DATA = "tests/data/multitask"
STEPS = 8


def sysd(name):
    return [f"{DATA}/{name}"]


def sharefit_input(type_map, descriptor, fit, tasks, nbatch, steps):
    """Tasks {name: (data_dict entry, loss, model_prob)} sharing the descriptor `descriptor`
    (its shared_dict key, its section) and the fitting net `fit`."""
    key, section = descriptor
    return {
        "model": {
            "shared_dict": {"type_map_all": type_map, key: section, "fit": fit},
            "model_dict": {
                name: {"type_map": "type_map_all", "descriptor": key, "fitting_net": "fit",
                       "data_stat_nbatch": nbatch}
                for name in tasks
            },
        },
        "learning_rate": mt.LR,
        "loss_dict": {name: loss for name, (_, loss, _) in tasks.items()},
        "training": {
            "model_prob": {name: p for name, (_, _, p) in tasks.items()},
            "data_dict": {name: d for name, (d, _, _) in tasks.items()},
            "numb_steps": steps, "seed": 10, "disp_freq": 1, "save_freq": max(steps, 1),
        },
    }


SHAREFIT = sharefit_input(
    mt.TYPE_MAP_ALL, ("dpa1", mt.DPA1), dict(mt.fit(2), dim_case_embd=2),
    {"water": ({"training_data": mt.data(sysd("water_f0"))}, mt.LOSS_EF, 1.0),
     "alloy": ({"training_data": mt.data(sysd("alloy_f0")),
                "validation_data": dict(mt.data(sysd("alloy_val_f0")), numb_btch=1)},
               mt.LOSS_EFV, 3.0)},
    nbatch=20, steps=4)

# Two tasks on DeePMD-kit's fparam example systems (one frame parameter, constant in each
# system: 0.2585 and 0.6894), sharing a fitting net that takes it: DeePMD-kit merges the tasks'
# fparam statistics into the first's, the other's weighted by model_prob[it] / model_prob[first].
FPARAM_DATA = "tests/data/deepmd-kit/examples/fparam/data"
SE_A_BE = {"type": "se_e2_a", "sel": [60], "rcut": 6.0, "rcut_smth": 1.8, "neuron": [4, 8],
           "axis_neuron": 2, "type_one_side": True, "precision": "float64", "seed": 1}
SHAREFIT_FPARAM = sharefit_input(
    ["Be"], ("se_a", SE_A_BE), dict(mt.fit(2), dim_case_embd=2, numb_fparam=1),
    {"cold": ({"training_data": mt.data([f"{FPARAM_DATA}/e3000_i2000"])}, mt.LOSS_EF, 1.0),
     "hot": ({"training_data": mt.data([f"{FPARAM_DATA}/e8000_i2000"])}, mt.LOSS_EF, 3.0)},
    nbatch=4, steps=0)

# Three tasks, two of which (alloy, alloy2) share the fitting net `fit` while water has one of
# its own: DeePMD-kit links a shared_dict part among the tasks that name it, so the shared
# fitting net steps at the steps of either alloy task (torch's Adam counting those) and water's
# at water's. dim_case_embd is one width for every task (DeePMD-kit's get_case_embd_config).
PARTFIT = sharefit_input(
    mt.TYPE_MAP_ALL, ("dpa1", mt.DPA1), dict(mt.fit(2), dim_case_embd=3),
    {"water": ({"training_data": mt.data(sysd("water_f0"))}, mt.LOSS_EF, 1.0),
     "alloy": ({"training_data": mt.data(sysd("alloy_f0")),
                "validation_data": dict(mt.data(sysd("alloy_val_f0")), numb_btch=1)},
               mt.LOSS_EFV, 2.0),
     "alloy2": ({"training_data": mt.data(sysd("alloy_val_f0"))}, mt.LOSS_EF, 1.0)},
    nbatch=20, steps=4)
PARTFIT["model"]["model_dict"]["water"]["fitting_net"] = dict(mt.fit(4), dim_case_embd=3)

# SHAREFIT with the descriptor shared at level 1 (its type embedding alone) beside the shared
# fitting net: each task's parameters fall in three parts that torch's Adam counts apart (the
# type embedding and the fitting net at every step, the rest of the descriptor at its task's).
L1FIT = copy.deepcopy(SHAREFIT)
for _task in L1FIT["model"]["model_dict"].values():
    _task["descriptor"] = "dpa1:1"

# The cases `cases` makes, by the prefix of their folders.
CASES = {"sf": SHAREFIT, "pf": PARTFIT, "lf": L1FIT}


def train(name, inp, *flags, traced=False):
    """Trains `inp` in a fresh folder; (folder, the last checkpoint's path)."""
    d = mt.workdir(tempfile.mkdtemp(), name)
    mt.write_json(os.path.join(d, "input.json"), inp)
    cmd = mt.traced_cmd if traced else mt.dp_cmd
    mt.run(cmd("--pt", "train", "input.json", *flags), d)
    return d, os.path.realpath(os.path.join(d, "model.ckpt.pt"))


def keep(name, inp, ckpt, d=None, with_ckpt=False):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    mt.write_json(os.path.join(out, "input.json"), inp)
    if with_ckpt:
        shutil.copyfile(ckpt, os.path.join(out, "model.ckpt.pt"))
    if d is not None:
        shutil.copyfile(os.path.join(d, "lcurve.out"), os.path.join(out, "lcurve.out"))
    for h in inp["model"]["model_dict"]:
        mt.save_yaml(ckpt, h, os.path.join(out, f"model_{h}.yaml"))
    return out


def traced_steps(name, inp, init):
    """`inp`'s steps from checkpoint `init` (`--init-model`), traced, kept as case `name` with
    its info.json; the tasks drawn."""
    d, ckpt = train(name, inp, "--init-model", init, traced=True)
    out = keep(name, inp, ckpt, d)
    keys = list(inp["model"]["model_dict"])
    steps = mt.steps_from_trace(json.load(open(os.path.join(d, "trace.json"))), keys)
    tasks = [s["task"] for s in steps]
    mt.write_json(os.path.join(out, "info.json"), {
        "command": f"dp --pt train input.json --init-model {init}",
        "tasks": tasks,
        "steps": steps,
    })
    return tasks


def cases(pre_input, prefix):
    """`prefix`_pre (4 steps from scratch, its checkpoint kept), `prefix`_steps (8 traced steps
    from it) and `prefix`_stats (0 steps from scratch) of `pre_input`; the tasks drawn."""
    pre = copy.deepcopy(pre_input)
    _, ckpt = train(f"{prefix}_pre", pre)
    keep(f"{prefix}_pre", pre, ckpt, with_ckpt=True)

    inp = copy.deepcopy(pre_input)
    inp["training"].update(numb_steps=STEPS, save_freq=STEPS)
    tasks = traced_steps(f"{prefix}_steps", inp, f"{OUT}/{prefix}_pre/model.ckpt.pt")

    stats = copy.deepcopy(pre_input)
    stats["training"].update(numb_steps=0, save_freq=1)
    _, ckpt = train(f"{prefix}_stats", stats)
    keep(f"{prefix}_stats", stats, ckpt)
    return tasks


def main():
    """Every case, or those whose prefixes are the arguments."""
    prefixes = sys.argv[1:] or list(CASES)
    for prefix in prefixes:
        print(f"{prefix}_steps: tasks {cases(CASES[prefix], prefix)}")
    if not sys.argv[1:]:
        fp = copy.deepcopy(SHAREFIT_FPARAM)
        _, ckpt = train("sf_fparam", fp)
        keep("sf_fparam", fp, ckpt)


if __name__ == "__main__":
    main()

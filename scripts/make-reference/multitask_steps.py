"""DeePMD-kit 3.2.0's multi-task training steps from a known start, for dpw to replay exactly
(issue 56, item 5: "a multi-task run's first steps' per-task losses equal DeePMD-kit's").

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root, after
multitask.py (it starts from that script's `pre_mt` checkpoint):
`python scripts/make-reference/multitask_steps.py` (no arguments; about a minute).

It also makes `mt_stats`: the same input trained from scratch for 0 steps (`dp --pt train
input.json`, numb_steps 0), the alloy task's data with a water frame added (`water_f1`), so
that both tasks have O and H atoms: its checkpoint holds DeePMD-kit's statistics of the shared
descriptor merged over the tasks (`share_params`: the sums of every task added, model_prob
playing no part) and each head's energy bias, on data whose every frame the statistics see.

Every task's data is one frame (`tests/data/multitask/`, cut from DeePMD-kit's example data
here), so that every batch is that frame whatever the batch order: dpw's batches are DeePMD-kit's
without replaying its sampler. The run is `pre_mt`'s input on those systems,
`dp --pt train input.json --init-model pre_mt/model.ckpt.pt` (the parameters and statistics
of `pre_mt`, a fresh Adam, step 0), traced as multitask.py traces `pre_mt` (the task drawn at
each step and every displayed loss at full precision). Writes tests/reference/multitask/mt_steps:
input.json, lcurve.out, info.json (the trace), model.ckpt.pt (after the last step) and
model_<task>.yaml (each head after the last step, DeePMD-kit's own serialization).
"""

import copy
import glob
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multitask as mt  # noqa: E402

OUT = "tests/reference/multitask/mt_steps"
DATA = "tests/data/multitask"
PRE = "tests/reference/multitask/pre_mt/model.ckpt.pt"
# (new system, source system, frame index over its sets in order)
FRAMES = [
    ("water_f0", "examples/water/data_0", 0),
    ("alloy_f0", "examples/alloy/data/valid/Cu48Ni30Al30", 0),
    ("alloy_val_f0", "examples/alloy/data/train/Cu36Ni36Al36", 0),
    ("water_f1", "examples/water/data_0", 1),
]
STEPS = 8


def one_frame(src, frame, dst):
    """deepmd/npy system `dst`: frame `frame` of system `src`, one set."""
    os.makedirs(os.path.join(dst, "set.000"), exist_ok=True)
    for f in ("type.raw", "type_map.raw"):
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    sets = sorted(glob.glob(os.path.join(src, "set.*")))
    for key in ("coord", "box", "energy", "force", "virial"):
        files = [os.path.join(s, f"{key}.npy") for s in sets]
        if not all(os.path.exists(f) for f in files):
            continue
        a = np.concatenate([np.load(f) for f in files])
        np.save(os.path.join(dst, "set.000", f"{key}.npy"), a[frame:frame + 1])


def main():
    for name, src, frame in FRAMES:
        one_frame(src, frame, os.path.join(DATA, name))
    inp = copy.deepcopy(mt.PRE_MT)
    sysd = lambda n: [f"{DATA}/{n}"]
    inp["training"]["data_dict"] = {
        "water": {"training_data": mt.data(sysd("water_f0"))},
        "alloy": {"training_data": mt.data(sysd("alloy_f0")),
                  "validation_data": dict(mt.data(sysd("alloy_val_f0")), numb_btch=1)},
    }
    inp["training"].update(numb_steps=STEPS, save_freq=STEPS, disp_freq=1)
    root = tempfile.mkdtemp()
    d = mt.workdir(root, "mt_steps")
    mt.write_json(os.path.join(d, "input.json"), inp)
    mt.run(mt.traced_cmd("--pt", "train", "input.json", "--init-model", PRE), d)
    ckpt = os.path.realpath(os.path.join(d, "model.ckpt.pt"))
    os.makedirs(OUT, exist_ok=True)
    shutil.copyfile(ckpt, os.path.join(OUT, "model.ckpt.pt"))
    mt.write_json(os.path.join(OUT, "input.json"), inp)
    shutil.copyfile(os.path.join(d, "lcurve.out"), os.path.join(OUT, "lcurve.out"))
    keys = list(inp["model"]["model_dict"])
    for h in keys:
        mt.save_yaml(ckpt, h, os.path.join(OUT, f"model_{h}.yaml"))
    steps = mt.steps_from_trace(json.load(open(os.path.join(d, "trace.json"))), keys)
    prob = np.array([inp["training"]["model_prob"][k] for k in keys], dtype=np.float64)
    rs = np.random.RandomState()
    rs.seed([0, inp["training"]["seed"]])
    numpy_tasks = [keys[int(rs.choice(np.arange(len(keys)), p=prob / prob.sum()))]
                   for _ in steps]
    info = {
        "command": f"dp --pt train input.json --init-model {PRE}",
        "checkpoint_written_as": os.path.basename(ckpt),
        "data": {n: {"from": s, "frame": f} for n, s, f in FRAMES},
        "numpy_reproduces_task_sequence": numpy_tasks == [s["task"] for s in steps],
        "tasks": [s["task"] for s in steps],
        "steps": steps,
    }
    mt.write_json(os.path.join(OUT, "info.json"), info)
    stats(inp)
    print(f"mt_steps: {STEPS} steps, tasks {info['tasks']}, numpy sequence "
          f"{info['numpy_reproduces_task_sequence']}")


def stats(inp):
    inp = copy.deepcopy(inp)
    inp["training"].update(numb_steps=0, save_freq=1)
    inp["training"]["data_dict"]["alloy"]["training_data"]["systems"].append(f"{DATA}/water_f1")
    out = OUT.replace("mt_steps", "mt_stats")
    d = mt.workdir(tempfile.mkdtemp(), "mt_stats")
    mt.write_json(os.path.join(d, "input.json"), inp)
    mt.run(mt.dp_cmd("--pt", "train", "input.json"), d)
    ckpt = os.path.realpath(os.path.join(d, "model.ckpt.pt"))
    os.makedirs(out, exist_ok=True)
    mt.write_json(os.path.join(out, "input.json"), inp)
    for h in inp["model"]["model_dict"]:
        mt.save_yaml(ckpt, h, os.path.join(out, f"model_{h}.yaml"))


if __name__ == "__main__":
    main()

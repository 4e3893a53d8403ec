"""DeePMD-kit 3.2.0's own multi-task training, fine-tuning and change-bias (issue 56).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`)
from the repository root: `python scripts/make-reference/multitask.py` (no arguments). It runs
the `dp` beside the running python (`dp --pt train`, `--finetune`, `dp --pt change-bias`,
`dp --pt freeze`, `dp convert-backend`) in a temporary folder that links `examples/` and
`tests/` of the repository, so every data path in the stored inputs is repository-relative.
About 10 minutes on 2 cores. Writes tests/reference/multitask/ (its README.md lists the cases
and files; docs/deepmd-spec.md §21 is the prose).

What it makes:
- two tiny "pretrained" models trained a few steps by `dp --pt train`: a single-task se_e2_a
  water model and a multi-task DPA-1 (se_atten) model with a shared descriptor and two heads
  (`water`, `alloy`) on two data sets; their `.pt` checkpoints are kept byte for byte. The
  multi-task run is traced (the task drawn at each step, the systems and frames of every batch,
  the displayed losses at full precision) by wrapping three DeePMD-kit functions in a child
  process (`traced_main`), so that dpw can replay the same batches.
- fine-tuned starts (`dp --pt train --finetune ... --model-branch ...` with numb_steps 0, which
  writes the checkpoint of step 0 after the bias re-fit and before any update) with another
  type_map (a subset, another order, a new element), `RANDOM`, `--use-pretrain-script`, and a
  multi-task fine-tune; and `dp --pt change-bias` outputs (-m change, -m set, -b).
- per case: DeePMD-kit's `.pt`, its `model.yaml` (DeePMD-kit's own serialization of the head,
  which dpw already reads), `eval.npz` (DeepPot on the `.pt`, native neighbour list, on the
  first 2 frames of the eval system with no pair inside rcut within MARGIN of it: DPA-1's
  energy is not reproducible to 1e-8 eV closer than that, spec §21.9), `bias.json` (the
  out_bias before and after by element, a re-computation of the bias from the formula of
  spec §21.6 on every frame DeePMD-kit used, and which tensors were copied or remapped).
- refusals.json: what DeePMD-kit refuses (exit status and its message) or accepts silently.
- pickle_inventory.json: the zip entries, pickle opcodes and globals of every stored `.pt`/`.pth`.
"""

import copy
import glob
import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter

import numpy as np

OUT = "tests/reference/multitask"
REPO = os.getcwd()
HERE = os.path.dirname(os.path.abspath(__file__))
DP = os.path.join(os.path.dirname(sys.executable), "dp")
ENV = dict(os.environ, NUM_WORKERS="0", OMP_NUM_THREADS="1",
           DP_INTRA_OP_PARALLELISM_THREADS="1", DP_INTER_OP_PARALLELISM_THREADS="1")

WATER = ["examples/water/data_0"]
ALLOY_PRE = ["examples/alloy/data/valid/Cu48Ni30Al30", "examples/alloy/data/valid/Cu65Ni32Al11"]
ALLOY_FT = ["examples/alloy/data/train/Cu27Ni54Al27", "examples/alloy/data/train/Cu36Ni36Al36",
            "examples/alloy/data/train/Cu65Ni32Al11_a", "examples/alloy/data/train/Cu65Ni32Al11_b"]
ALLOY_VAL = ["examples/alloy/data/train/Cu36Ni36Al36"]

SE_A = {"type": "se_e2_a", "sel": [20, 40], "rcut": 4.0, "rcut_smth": 0.5, "neuron": [4, 8],
        "axis_neuron": 2, "resnet_dt": False, "type_one_side": True, "precision": "float64",
        "seed": 1}
# DPA-1, attention layer 1, tebd_dim 4: 4 = 2 x 2, so the fine-tune to two types ([H, O]) gets
# the type embedding's [x, x] skip that the 5-type pretrained model does not have (spec §21.5)
DPA1 = {"type": "se_atten", "sel": 48, "rcut": 4.0, "rcut_smth": 0.5, "neuron": [4, 8],
        "axis_neuron": 2, "tebd_dim": 4, "attn": 8, "attn_layer": 1, "attn_dotr": True,
        "attn_mask": False, "type_one_side": False, "set_davg_zero": True,
        "smooth_type_embedding": False, "precision": "float64", "seed": 1}


def fit(seed):
    return {"neuron": [8, 8], "resnet_dt": True, "precision": "float64", "seed": seed}


LR = {"type": "exp", "start_lr": 0.001, "stop_lr": 1e-5, "decay_steps": 2}
LOSS_EF = {"type": "ener", "start_pref_e": 0.02, "limit_pref_e": 1, "start_pref_f": 1000,
           "limit_pref_f": 1}
LOSS_EFV = dict(LOSS_EF, start_pref_v=0.5, limit_pref_v=1)
TYPE_MAP_ALL = ["O", "H", "Cu", "Ni", "Al"]


def data(systems, batch_size=1):
    return {"systems": systems, "batch_size": batch_size}


def single_input(type_map, descriptor, fitting, systems, steps, nbatch, loss=LOSS_EF, **training):
    return {
        "model": {"type_map": type_map, "descriptor": descriptor, "fitting_net": fitting,
                  "data_stat_nbatch": nbatch},
        "learning_rate": LR,
        "loss": loss,
        "training": {"training_data": data(systems), "numb_steps": steps, "seed": 10,
                     "disp_freq": 1, "save_freq": max(steps, 1), **training},
    }


PRE_SE_A = single_input(["O", "H"], SE_A, fit(2), WATER, 4, 20)
PRE_MT = {
    "model": {
        "shared_dict": {"type_map_all": TYPE_MAP_ALL, "dpa1": DPA1},
        "model_dict": {
            "water": {"type_map": "type_map_all", "descriptor": "dpa1", "fitting_net": fit(2),
                      "data_stat_nbatch": 20},
            "alloy": {"type_map": "type_map_all", "descriptor": "dpa1", "fitting_net": fit(3),
                      "data_stat_nbatch": 20},
        },
    },
    "learning_rate": LR,
    "loss_dict": {"water": LOSS_EF, "alloy": LOSS_EFV},
    "training": {
        "model_prob": {"water": 1.0, "alloy": 3.0},
        "data_dict": {
            "water": {"training_data": data(WATER)},
            "alloy": {"training_data": data(ALLOY_PRE),
                      "validation_data": dict(data(ALLOY_VAL), numb_btch=1)},
        },
        "numb_steps": 6, "seed": 10, "disp_freq": 1, "save_freq": 6,
    },
}

# Fine-tune cases. data_stat_nbatch x batch_size >= the frames of every system, so the bias
# re-fit sees every frame (DeePMD-kit draws data_stat_nbatch batches per system, shuffled).
FINETUNE = {
    "ft_se_a": dict(
        pre="pre_se_a", branch=None, eval_sys="examples/water/data_2",
        input=single_input(["O", "H"], SE_A, fit(2), ["examples/water/data_2"], 0, 100)),
    "ft_mt_alloy": dict(
        pre="pre_mt", branch="alloy", eval_sys=ALLOY_FT[0],
        input=single_input(["Al", "Ni", "Cu"], DPA1, fit(3), ALLOY_FT, 0, 40, LOSS_EFV)),
    "ft_mt_alloy_script": dict(
        pre="pre_mt", branch="alloy", eval_sys=ALLOY_FT[0], flags=["--use-pretrain-script"],
        same_as="ft_mt_alloy",
        input=single_input(["Al", "Ni", "Cu"], {}, {}, ALLOY_FT, 0, 40, LOSS_EFV)),
    "ft_mt_water_ho": dict(
        pre="pre_mt", branch="water", eval_sys="examples/water/data_2",
        input=single_input(["H", "O"], DPA1, fit(2), ["examples/water/data_2"], 0, 100)),
    "ft_mt_newtype": dict(
        pre="pre_mt", branch="water", eval_sys="tests/data/nopbc/C4H3O1",
        input=single_input(["C", "H", "O"], DPA1, fit(2), ["tests/data/nopbc/C4H3O1"], 0, 20)),
    "ft_mt_random": dict(
        pre="pre_mt", branch="RANDOM", eval_sys=ALLOY_FT[0],
        input=single_input(["Cu", "Ni", "Al"], DPA1, fit(7), ALLOY_FT, 0, 40, LOSS_EFV)),
}
FT_MT_MT = {
    "model": {
        "shared_dict": {"type_map_all": TYPE_MAP_ALL, "dpa1": DPA1},
        "model_dict": {
            "water": {"type_map": "type_map_all", "descriptor": "dpa1", "fitting_net": fit(2),
                      "data_stat_nbatch": 20},
            "alloy_ft": {"type_map": "type_map_all", "descriptor": "dpa1", "fitting_net": fit(3),
                         "data_stat_nbatch": 40, "finetune_head": "alloy"},
        },
    },
    "learning_rate": LR,
    "loss_dict": {"water": LOSS_EF, "alloy_ft": LOSS_EFV},
    "training": {
        "model_prob": {"water": 1.0, "alloy_ft": 1.0},
        "data_dict": {"water": {"training_data": data(WATER)},
                      "alloy_ft": {"training_data": data(ALLOY_FT)}},
        "numb_steps": 0, "seed": 10, "disp_freq": 1, "save_freq": 1,
    },
}
FINETUNE["ft_mt_multitask"] = dict(pre="pre_mt", branch=None, eval_sys=ALLOY_FT[0],
                                   input=FT_MT_MT, heads=["water", "alloy_ft"])

CHANGE_BIAS = {
    "cb_se_a_change": dict(pre="pre_se_a", args=["-s", "examples/water/data_3", "-m", "change"],
                           eval_sys="examples/water/data_3", stat_sys=["examples/water/data_3"]),
    "cb_se_a_set": dict(pre="pre_se_a", args=["-s", "examples/water/data_3", "-m", "set"],
                        eval_sys="examples/water/data_3", stat_sys=["examples/water/data_3"]),
    "cb_se_a_value": dict(pre="pre_se_a", args=["-b", "-93.5", "-187.25"],
                          eval_sys="examples/water/data_3", stat_sys=None),
    "cb_mt_alloy": dict(pre="pre_mt", args=["-s", "examples/alloy/data/train", "-m", "change",
                                            "--model-branch", "alloy"],
                        eval_sys=ALLOY_FT[0], stat_sys=ALLOY_FT, head="alloy"),
}


# ------------------------------------------------------------------------------------------
# running dp


def workdir(root, name):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    for link in ("examples", "tests"):
        if not os.path.exists(os.path.join(d, link)):
            os.symlink(os.path.join(REPO, link), os.path.join(d, link))
    return d


def run(cmd, cwd, check=True):
    p = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    with open(os.path.join(cwd, "run.log"), "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr)
    if check and p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed in {cwd}:\n{p.stderr[-3000:]}")
    return p


def dp_cmd(*args):
    return [DP, *args]


def traced_cmd(*args):
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import multitask; "
            "multitask.traced_main(sys.argv[1:])")
    return [sys.executable, "-c", code, *args]


def traced_main(args):
    """`dp` with three DeePMD-kit functions wrapped to record what each training step used:
    the task drawn (`dp_random.choice`), every batch (`Trainer.get_data`: train/valid, task,
    system index, frame indices) and every displayed loss at full precision
    (`format_training_message_per_task`). Writes trace.json in the working folder."""
    import deepmd.pt.train.training as T
    from deepmd.main import main
    from deepmd.pt.utils import dp_random

    events = []
    choice = dp_random.choice

    def traced_choice(a, size=None, replace=True, p=None):
        r = choice(a, size=size, replace=replace, p=p)
        events.append({"event": "draw", "index": int(r), "p": [float(x) for x in p]})
        return r

    get_data = T.Trainer.get_data

    def traced_get_data(self, is_train=True, task_key="Default"):
        out = get_data(self, is_train=is_train, task_key=task_key)
        log = out[2]
        events.append({"event": "batch", "train": bool(is_train), "task": task_key,
                       "sid": int(log["sid"]) if "sid" in log else None,
                       "fid": [int(x) for x in log.get("fid", [])]})
        return out

    fmt = T.format_training_message_per_task

    def traced_fmt(batch, task_name, rmse, learning_rate):
        events.append({"event": "display", "step": int(batch), "task": task_name,
                       "rmse": {k: float(v) for k, v in rmse.items()},
                       "lr": None if learning_rate is None else float(learning_rate)})
        return fmt(batch=batch, task_name=task_name, rmse=rmse, learning_rate=learning_rate)

    dp_random.choice = traced_choice
    T.Trainer.get_data = traced_get_data
    T.format_training_message_per_task = traced_fmt
    try:
        main(args)
    finally:
        with open("trace.json", "w") as fh:
            json.dump(events, fh)


def steps_from_trace(events, keys):
    """Per training step: the task drawn, the batch the update used, and the displayed losses
    (the update batch's for the drawn task; a fresh training batch's and the validation
    batch's for the other tasks, which DeePMD-kit draws only to display them)."""
    steps, cur = [], None
    for ev in events:
        if ev["event"] == "draw":
            cur = {"task": keys[ev["index"]], "p": ev["p"], "update_batch": None,
                   "display_batches": [], "display": {}}
            steps.append(cur)
        elif ev["event"] == "batch":
            b = {k: ev[k] for k in ("train", "task", "sid", "fid")}
            if cur["update_batch"] is None:
                cur["update_batch"] = b
            else:
                cur["display_batches"].append(b)
        else:
            cur["display"][ev["task"]] = {"rmse": ev["rmse"], "lr": ev["lr"]}
            cur["step"] = ev["step"]
    return steps


# ------------------------------------------------------------------------------------------
# data, models, evaluation


def system_types(system, type_map):
    names = open(os.path.join(system, "type_map.raw")).read().split()
    atype = np.loadtxt(os.path.join(system, "type.raw"), dtype=int).reshape(-1)
    return np.array([type_map.index(names[t]) for t in atype])


def load_system(system, type_map, frames=None):
    """Every set of a deepmd/npy system (frames in set order), types mapped onto type_map."""
    atype = system_types(system, type_map)
    n = len(atype)
    sets = sorted(glob.glob(os.path.join(system, "set.*")))
    get = lambda k: np.concatenate(
        [np.load(os.path.join(s, f"{k}.npy")).astype(np.float64) for s in sets])
    nopbc = os.path.exists(os.path.join(system, "nopbc"))
    out = {"atype": atype, "coord": get("coord").reshape(-1, n, 3),
           "energy": get("energy").reshape(-1), "force": get("force").reshape(-1, n, 3)}
    out["box"] = None if nopbc else get("box").reshape(-1, 3, 3)
    if frames is not None:
        for k in ("coord", "energy", "force"):
            out[k] = out[k][frames]
        if out["box"] is not None:
            out["box"] = out["box"][frames]
    return out


def rcut_margins(d, rcut):
    """Per frame, the smallest rcut − r over the pairs inside rcut (periodic images
    included)."""
    import torch
    from deepmd.pt.utils.nlist import extend_input_and_build_neighbor_list

    out = []
    for f in range(d["coord"].shape[0]):
        n = len(d["atype"])
        c = torch.tensor(d["coord"][f].reshape(1, -1))
        b = None if d["box"] is None else torch.tensor(d["box"][f].reshape(1, 9))
        ec, _, _, nl = extend_input_and_build_neighbor_list(
            c, torch.tensor(d["atype"][None]), rcut + 0.2, [4 * n], mixed_types=True, box=b)
        x, nl = ec.reshape(-1, 3), nl[0]
        r = torch.linalg.norm(x[nl.clamp(min=0)] - x[:n, None], dim=-1)[nl >= 0]
        out.append(float((rcut - r[r < rcut]).min()))
    return np.array(out)


# Å: eval frames have no pair inside rcut closer than this to it. DPA-1 divides the slot's
# env-matrix direction by max(|.|, 1e-12): within ~1e-4 Å of rcut (for these models) the
# "unit" vector is not one, carries the switch's rounding, and the energy moves by ~1e-6 eV
# under 1e-14 Å displacements (spec §21.9); 1e-3 Å keeps a safe distance from that.
MARGIN = 1e-3


def eval_frames(system, type_map, rcut=4.0, n=2):
    """The first n frames of the system with no pair inside rcut within MARGIN of it."""
    d = load_system(system, type_map)
    m = rcut_margins(d, rcut)
    frames = [int(i) for i in np.flatnonzero(m > MARGIN)[:n]]
    return load_system(system, type_map, frames), frames, m


def head_state(path, head=None):
    """(model_params of the head, its state dict renamed to model.Default.*), as DeePMD-kit's
    DeepEval and `dp freeze --head` take a head out of a multi-task checkpoint."""
    import torch

    sd = torch.load(path, map_location="cpu", weights_only=True)
    sd = sd.get("model", sd)
    params = sd["_extra_state"]["model_params"]
    if "model_dict" in params:
        params = params["model_dict"][head]
        sd = dict({k.replace(f"model.{head}.", "model.Default."): v for k, v in sd.items()
                   if k.startswith(f"model.{head}.")}, _extra_state=sd["_extra_state"])
    return copy.deepcopy(params), sd


def pt_model(path, head=None):
    from deepmd.pt.model.model import get_model
    from deepmd.pt.train.wrapper import ModelWrapper

    params, sd = head_state(path, head)
    params.pop("hessian_mode", None)
    model = get_model(copy.deepcopy(params))
    ModelWrapper(model).load_state_dict(sd)
    return model.double().eval(), params


def out_bias(path, head=None):
    model, params = pt_model(path, head)
    b = model.get_out_bias().detach().numpy().reshape(-1)
    return dict(zip(params["type_map"], b.tolist()))


def save_yaml(path, head, yaml_path):
    from deepmd.dpmodel.utils.serialization import save_dp_model

    model, params = pt_model(path, head)
    var = {}
    if model.get_min_nbor_dist() is not None:
        var["min_nbor_dist"] = float(model.get_min_nbor_dist())
    save_dp_model(yaml_path, {"backend": "PyTorch", "model": model.serialize(),
                              "model_def_script": params, "@variables": var})
    return model.serialize()


def deeppot_eval(path, head, d, nlist_backend="native"):
    """DeepPot on the file. nlist_backend "native" is the neighbour list of training and of
    the bias re-fit; DeePMD-kit 3.2.0's default "auto" takes vesin when it is installed, whose
    ghost coordinates differ in the last bit (spec §21.9)."""
    from deepmd.infer import DeepPot

    kw = {"nlist_backend": nlist_backend}
    dp = DeepPot(path, head=head, **kw) if head else DeepPot(path, **kw)
    nf = d["coord"].shape[0]
    box = None if d["box"] is None else d["box"].reshape(nf, 9)
    e, f, v, ae, _ = dp.eval(d["coord"].reshape(nf, -1), box, d["atype"], atomic=True)
    return {"energy": e.reshape(nf), "atom_energy": ae.reshape(nf, -1),
            "force": f.reshape(nf, -1, 3), "virial": v.reshape(nf, 9)}


def dpmodel_energy(ser, d):
    """DeePMD-kit's numpy backend on the serialization written to model.yaml."""
    from deepmd.dpmodel.model.model import BaseModel

    m = BaseModel.deserialize(copy.deepcopy(ser))
    nf = d["coord"].shape[0]
    box = None if d["box"] is None else d["box"].reshape(nf, 9)
    r = m(d["coord"].reshape(nf, -1), np.tile(d["atype"], (nf, 1)), box=box)
    return r["energy"].reshape(nf), r["atom_energy"].reshape(nf, -1)


def pt_energies(model, d, chunk=8):
    import torch

    out = []
    nf = d["coord"].shape[0]
    for i in range(0, nf, chunk):
        c = torch.tensor(d["coord"][i:i + chunk].reshape(min(chunk, nf - i), -1))
        a = torch.tensor(np.tile(d["atype"], (c.shape[0], 1)))
        b = None if d["box"] is None else torch.tensor(d["box"][i:i + chunk].reshape(-1, 9))
        out.append(model(c, a, box=b)["energy"].detach().numpy().reshape(-1))
    return np.concatenate(out)


def hand_bias(path, head, systems, start_bias, mode, jitter=0.0):
    """The bias from the formula of spec §21.6 on every frame of `systems`: `set`,
    lstsq(N, E); `change`, start + lstsq(N, E − E_model) with E_model the model of `path`
    whose out_bias is replaced by `start_bias` (numpy lstsq, rcond None: the minimum-norm
    solution when N is rank-deficient)."""
    import torch

    model, params = pt_model(path, head)
    tm = params["type_map"]
    nt = len(tm)
    start = np.array([start_bias[t] for t in tm])
    model.set_out_bias(torch.tensor(start).reshape(1, nt, 1))
    rows, rhs = [], []
    for s in systems:
        d = load_system(s, tm)
        if jitter:
            d["coord"] = d["coord"] + np.random.default_rng(7).normal(scale=jitter,
                                                                      size=d["coord"].shape)
        n = np.bincount(d["atype"], minlength=nt).astype(np.float64)
        rows.append(np.tile(n, (len(d["energy"]), 1)))
        rhs.append(d["energy"] - (pt_energies(model, d) if mode == "change" else 0.0))
    N, y = np.concatenate(rows), np.concatenate(rhs)
    x = np.linalg.lstsq(N, y, rcond=None)[0]
    new = (start if mode == "change" else 0.0) + x
    return dict(zip(tm, new.tolist())), int(np.linalg.matrix_rank(N)), int(N.shape[0])


def maxabs(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def dict_diff(a, b):
    return max(abs(a[k] - b[k]) for k in a)


# ------------------------------------------------------------------------------------------
# pickle inventory


def pickle_inventory(path):
    z = zipfile.ZipFile(path)
    infos = z.infolist()
    root = infos[0].filename.split("/")[0]
    ops, globs = Counter(), Counter()
    out = {"root": root, "entries": len(infos),
           "compression": sorted({i.compress_type for i in infos}),
           "non_data_entries": {}, "pickles": {}}
    for i in infos:
        rel = i.filename[len(root) + 1:]
        if rel.startswith(("data/", "code/")) or rel.endswith(".pkl"):
            continue
        body = z.read(i.filename)
        try:
            out["non_data_entries"][rel] = body.decode() if len(body) < 64 else f"{len(body)} bytes"
        except UnicodeDecodeError:
            out["non_data_entries"][rel] = f"{len(body)} bytes"
    raw = open(path, "rb").read()
    # payload offset = local header offset + 30 + name length + the LOCAL extra field's length
    # (torch pads that extra field so that every storage starts on a 64-byte boundary)
    offsets = [i.header_offset + 30 + int.from_bytes(raw[i.header_offset + 26:i.header_offset + 28],
                                                     "little")
               + int.from_bytes(raw[i.header_offset + 28:i.header_offset + 30], "little")
               for i in infos if i.filename.startswith(root + "/data/")]
    out["data_payload_offsets_mod_64"] = sorted({o % 64 for o in offsets})
    for i in infos:
        if not i.filename.endswith(".pkl"):
            continue
        body = z.read(i.filename)
        ops, globs, proto = Counter(), Counter(), None
        # memo GETs of a container that was memoized empty and filled afterwards: a reader
        # that copies memo entries at PUT time (instead of sharing them) reads these empty
        producer, prev, mutable_gets = {}, None, Counter()
        for op, arg, _ in pickletools.genops(body):
            ops[op.name] += 1
            if op.name == "PROTO":
                proto = arg
            if op.name in ("GLOBAL", "STACK_GLOBAL"):
                globs[arg] += 1
            if op.name.endswith("PUT"):
                producer[arg] = prev
            elif op.name.endswith("GET"):
                if producer.get(arg) in ("EMPTY_DICT", "EMPTY_LIST", "REDUCE", "NEWOBJ"):
                    mutable_gets[producer[arg]] += 1
            else:
                prev = op.name
        storages = Counter()

        class Stub:
            def __init__(self, *a, **k):
                pass

            def __setstate__(self, state):
                pass

        class U(pickle.Unpickler):
            def persistent_load(self, pid):
                storages[pid[1]] += 1
                return None

            def find_class(self, mod, name):
                if name.endswith("Storage"):
                    return f"{mod}.{name}"
                if mod == "collections":
                    return super().find_class(mod, name)
                return type(name, (Stub,), {})

        U(__import__("io").BytesIO(body)).load()
        out["pickles"][i.filename[len(root) + 1:]] = {
            "protocol": proto, "bytes": len(body), "opcodes": dict(sorted(ops.items())),
            "globals": dict(sorted(globs.items())),
            "memo_gets_of_objects_memoized_by": dict(mutable_gets),
            "persistent_id_storage_types": dict(storages)}
    return out


def state_dict_summary(path):
    """Keys, dtypes and shapes of a checkpoint's model state dict, and which keys share a
    storage (the multi-task heads' shared descriptor; `filter_layers.networks` and
    `._networks`, two names of one ModuleList)."""
    import torch

    sd = torch.load(path, map_location="cpu", weights_only=True)
    top = sorted(sd.keys())
    m = sd.get("model", sd)
    tensors, shared = {}, {}
    for k, v in m.items():
        if k == "_extra_state":
            continue
        tensors[k] = [str(v.dtype).replace("torch.", ""), list(v.shape)]
        shared.setdefault(v.untyped_storage().data_ptr() if v.numel() else id(v), []).append(k)
    opt = sd.get("optimizer")
    return {"top_level_keys": top, "model_tensors": tensors,
            "shared_storage_groups": [g for g in shared.values() if len(g) > 1],
            "extra_state_keys": sorted(m["_extra_state"].keys()),
            "train_infos": m["_extra_state"]["train_infos"],
            "optimizer": None if opt is None else {
                "param_groups": [{k: v for k, v in g.items() if k != "params"} | {
                    "n_params": len(g["params"])} for g in opt["param_groups"]],
                "n_states": len(opt["state"]),
                "state_entry": sorted(next(iter(opt["state"].values())).keys())
                if opt["state"] else []}}


# ------------------------------------------------------------------------------------------
# the cases


def write_json(path, obj):
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1, default=float)
        fh.write("\n")


def pretrain(root, name, inp, traced):
    d = workdir(root, name)
    write_json(os.path.join(d, "input.json"), inp)
    cmd = (traced_cmd if traced else dp_cmd)("--pt", "train", "input.json")
    run(cmd, d)
    ckpt = os.path.realpath(os.path.join(d, "model.ckpt.pt"))
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(ckpt, os.path.join(out, "model.ckpt.pt"))
    write_json(os.path.join(out, "input.json"), inp)
    shutil.copyfile(os.path.join(d, "lcurve.out"), os.path.join(out, "lcurve.out"))
    info = {"command": " ".join(["dp", "--pt", "train", "input.json"]),
            "checkpoint_written_as": os.path.basename(ckpt),
            "state_dict": state_dict_summary(ckpt)}
    heads = list(inp["model"].get("model_dict", {})) or [None]
    info["heads"] = {}
    for h in heads:
        sub = f"model_{h}.yaml" if h else "model.yaml"
        ser = save_yaml(ckpt, h, os.path.join(out, sub))
        info["heads"][h or "Default"] = {"yaml": sub, "out_bias": out_bias(ckpt, h),
                                         "type_map": ser["type_map"]}
    if traced:
        events = json.load(open(os.path.join(d, "trace.json")))
        keys = list(inp["model"]["model_dict"])
        steps = steps_from_trace(events, keys)
        seed = inp["training"]["seed"]
        prob = np.array([inp["training"]["model_prob"][k] for k in keys], dtype=np.float64)
        rs = np.random.RandomState()
        rs.seed([0, seed % 2**32])
        numpy_tasks = [keys[int(rs.choice(np.arange(len(keys)), p=prob / prob.sum()))]
                       for _ in steps]
        info["trace"] = {
            "model_keys": keys,
            "rng": f"numpy RandomState seeded with [rank, seed] = [0, {seed}]; one "
                   "choice(arange(ntasks), p=model_prob/sum) per step",
            "numpy_reproduces_task_sequence": numpy_tasks == [s["task"] for s in steps],
            "systems": {k: inp["training"]["data_dict"][k]["training_data"]["systems"]
                        for k in keys},
            "validation_systems": {k: inp["training"]["data_dict"][k].get(
                "validation_data", {}).get("systems") for k in keys},
            "steps": steps,
        }
        shutil.copyfile(os.path.join(d, "trace.json"), os.path.join(d, "trace.raw.json"))
    print(f"{name}: trained ({os.path.getsize(ckpt)} bytes)")
    return ckpt, info


def finetune(root, name, case, pre_ckpt, pre_info):
    d = workdir(root, name)
    write_json(os.path.join(d, "input.json"), case["input"])
    shutil.copyfile(pre_ckpt, os.path.join(d, "pretrained.pt"))
    args = ["--pt", "train", "input.json", "--finetune", "pretrained.pt"]
    if case["branch"]:
        args += ["--model-branch", case["branch"]]
    args += case.get("flags", [])
    run(dp_cmd(*args), d)
    ckpt = os.path.realpath(os.path.join(d, "model.ckpt.pt"))
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    same_as = case.get("same_as")
    if not same_as:
        shutil.copyfile(ckpt, os.path.join(out, "model.ckpt.pt"))
    write_json(os.path.join(out, "input.json"), case["input"])
    out_json = json.load(open(os.path.join(d, "out.json")))
    multi = "model_dict" in case["input"]["model"]
    heads = case.get("heads", [None])
    meta = {"command": "dp " + " ".join(args).replace("pretrained.pt",
                                                     f"../{case['pre']}/model.ckpt.pt"),
            "checkpoint_written_as": os.path.basename(ckpt),
            "model_section_after_finetune_rules": out_json["model"],
            "heads": {}}
    for h in heads:
        params, _ = head_state(ckpt, h)
        tm = params["type_map"]
        if multi:
            fh = case["input"]["model"]["model_dict"][h].get("finetune_head")
            from_branch, mode = (fh, "change") if fh else (h, "resume")
            systems = case["input"]["training"]["data_dict"][h]["training_data"]["systems"]
        else:
            from_branch = case["branch"] if case["branch"] not in (None, "RANDOM") else None
            if case["branch"] == "RANDOM":
                from_branch = next(iter(pre_info["heads"]))
                from_branch = None if from_branch == "Default" else from_branch
            mode = "set" if case["branch"] == "RANDOM" else "change"
            systems = case["input"]["training"]["training_data"]["systems"]
        before = pre_info["heads"][from_branch or "Default"]["out_bias"]
        start = {t: before.get(t, 0.0) for t in tm}
        after = out_bias(ckpt, h)
        sub = f"_{h}" if h else ""
        ser = save_yaml(ckpt, h, os.path.join(root, name, f"model{sub}.yaml") if same_as
                        else os.path.join(out, f"model{sub}.yaml"))
        entry = {"type_map": tm, "from_branch": from_branch or "Default",
                 "bias_adjust_mode": {"change": "change-by-statistic",
                                      "set": "set-by-statistic",
                                      "resume": "none (resumed branch)"}[mode],
                 "out_bias_pretrained": before, "out_bias_start": start,
                 "out_bias_after": after, "stat_systems": systems}
        if mode != "resume":
            hb, rank, nfr = hand_bias(ckpt, h, systems, start, mode)
            entry.update({"out_bias_by_formula": hb, "formula_vs_deepmd_max_abs":
                          dict_diff(hb, after), "lstsq_rank": rank, "lstsq_frames": nfr})
            if mode == "change":
                # how much DeePMD-kit's own bias moves when every coordinate moves by ~1e-14 Å
                hj, _, _ = hand_bias(ckpt, h, systems, start, mode, jitter=1e-14)
                entry["formula_bias_change_under_1e-14_A_displacements"] = dict_diff(hj, hb)
        else:
            entry["after_minus_pretrained_max_abs"] = dict_diff(after, before)
        esys = case["eval_sys"] if not multi or h != "water" else WATER[0]
        ev, frames, _ = eval_frames(esys, tm)
        pred = deeppot_eval(ckpt, h, ev)
        auto = deeppot_eval(ckpt, h, ev, "auto")
        dpe, dpae = dpmodel_energy(ser, ev)
        entry["eval_system"], entry["eval_frames"] = esys, frames
        entry["energy"] = pred["energy"].tolist()
        entry["checks"] = {"deeppot_pt_vs_dpmodel_yaml_energy_max_abs":
                           maxabs(pred["energy"], dpe),
                           "deeppot_pt_vs_dpmodel_yaml_atom_energy_max_abs":
                           maxabs(pred["atom_energy"], dpae),
                           "deeppot_native_vs_auto_nlist_max_abs":
                           max(maxabs(pred[k], auto[k]) for k in pred)}
        if mode != "resume":
            entry["stat_frames_with_a_pair_inside_rcut_within_1e-3_of_it"] = {
                sys_: int((rcut_margins(load_system(sys_, tm), 4.0) < MARGIN).sum())
                for sys_ in systems}
        np.savez_compressed(os.path.join(out, f"eval{sub}.npz"), **eval_arrays(ev, pred))
        meta["heads"][h or "Default"] = entry
        # which tensors came from the pretrained branch, and how the type-dependent ones moved
        src = None if from_branch in (None, "Default") else from_branch
        entry["copied_from_pretrained"] = copy_report(pre_ckpt, src, ckpt, h)
    if same_as:
        import torch

        a = torch.load(ckpt, weights_only=True)["model"]
        b = torch.load(os.path.join(OUT, same_as, "model.ckpt.pt"), weights_only=True)["model"]
        meta["same_as"] = same_as
        meta["tensors_differing_from_" + same_as] = [
            k for k in a if k != "_extra_state" and not torch.equal(a[k], b[k])]
        meta["model_params_equal_to_" + same_as] = (
            a["_extra_state"]["model_params"] == b["_extra_state"]["model_params"])
    write_json(os.path.join(out, "bias.json"), meta)
    print(f"{name}: " + ", ".join(
        f"{h}: formula−DeePMD {e.get('formula_vs_deepmd_max_abs', 0):.1e}"
        for h, e in meta["heads"].items()))
    return ckpt, meta


def eval_arrays(d, pred):
    arrays = {"coord": d["coord"], "atype": d["atype"].astype(np.int64),
              "energy_label": d["energy"], "force_label": d["force"]}
    if d["box"] is not None:
        arrays["box"] = d["box"]
    arrays.update(pred)
    return arrays


def copy_report(pre_ckpt, src, ckpt, head):
    """Every tensor of the fine-tuned head against the pretrained branch's tensor of the same
    name: `equal` (bit for bit), `rows = pretrained rows [index_map]` (type-indexed rows
    selected and permuted), the type embedding's rows with DeePMD-kit's skip correction, or
    re-fitted / new."""
    import torch

    p_params, psd = head_state(pre_ckpt, src)
    f_params, fsd = head_state(ckpt, head)
    ptm, ftm = p_params["type_map"], f_params["type_map"]
    idx = [ptm.index(t) if t in ptm else None for t in ftm]
    res = {}
    for k, v in fsd.items():
        if k == "_extra_state" or "._networks." in k:
            continue
        name = k.replace("model.Default.", "")
        pv = psd.get(k)
        if pv is None:
            res[name] = "absent in pretrained"
        elif v.shape == pv.shape and torch.equal(v, pv):
            res[name] = "equal"
        else:
            res[name] = remap_kind(name, v, pv, idx, len(ptm))
    return {"pretrained_type_map": ptm, "type_map": ftm, "index_map": idx, "tensors": res}


def remap_kind(name, v, pv, idx, n_old):
    import torch

    known = [i for i, j in enumerate(idx) if j is not None]
    if name.endswith("out_bias") or name.endswith("out_std"):
        return "re-fitted"
    if not (v.dim() >= 1 and v.shape[0] == len(idx) and pv.shape[1:] == v.shape[1:] and known):
        return "differs"
    sel = torch.stack([pv[idx[i]] for i in known])
    if name.endswith("type_embedding.embedding.embedding_net.layers.0.matrix"):
        # TypeEmbedNetConsistent.change_type_map: + I (or [I, I]) where tebd_dim equals the old
        # ntypes (2 ntypes), rows selected, − I (or [I, I]) where it equals the new ntypes (2x)
        t, n_new = v.shape[1], len(idx)
        eye = lambda n: torch.eye(n, dtype=v.dtype)
        full = pv.clone()
        if t == n_old:
            full = full + eye(n_old)
        elif t == 2 * n_old:
            full = full + torch.cat([eye(n_old), eye(n_old)], dim=-1)
        corr = torch.zeros_like(v)
        if t == n_new:
            corr = eye(n_new)
        elif t == 2 * n_new:
            corr = torch.cat([eye(n_new), eye(n_new)], dim=-1)
        exp = torch.stack([full[idx[i]] for i in known]) - corr[known]
        if torch.equal(v[known], exp) and not torch.equal(v[known], sel):
            what = {0: "", 1: " minus I", 2: " minus [I, I]"}[
                1 if t == n_new else 2 if t == 2 * n_new else 0]
            plus = {0: "", 1: " plus I", 2: " plus [I, I]"}[
                1 if t == n_old else 2 if t == 2 * n_old else 0]
            tail = "" if len(known) == len(idx) else "; new types' rows drawn by torch.rand"
            return f"rows = (pretrained{plus}) rows [index_map]{what}{tail}"
    if torch.equal(v[known], sel):
        return ("rows = pretrained rows [index_map]" if len(known) == len(idx) else
                "rows of known types = pretrained rows [index_map]; new types' rows new")
    return "differs"


def change_bias(root, name, case, pre_ckpt, pre_info):
    d = workdir(root, name)
    shutil.copyfile(pre_ckpt, os.path.join(d, "pretrained.pt"))
    args = ["--pt", "change-bias", "pretrained.pt", *case["args"]]
    run(dp_cmd(*args), d)
    ckpt = os.path.join(d, "pretrained_updated.pt")
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(ckpt, os.path.join(out, "model_updated.pt"))
    h = case.get("head")
    tm = pre_info["heads"][h or "Default"]["type_map"]
    before = pre_info["heads"][h or "Default"]["out_bias"]
    after = out_bias(ckpt, h)
    meta = {"command": "dp " + " ".join(args).replace("pretrained.pt",
                                                     f"../{case['pre']}/model.ckpt.pt"),
            "output_written_as": "pretrained_updated.pt (default: input name with .pt -> "
                                 "_updated.pt)",
            "type_map": tm, "out_bias_before": before, "out_bias_after": after}
    if case["stat_sys"]:
        mode = case["args"][case["args"].index("-m") + 1]
        hb, rank, nfr = hand_bias(pre_ckpt, h, case["stat_sys"], before, mode)
        meta.update({"out_bias_by_formula": hb, "formula_vs_deepmd_max_abs": dict_diff(hb, after),
                     "lstsq_rank": rank, "lstsq_frames": nfr, "stat_systems": case["stat_sys"]})
    else:
        vals = [float(x) for x in case["args"][1:]]
        meta["set_values_vs_after_max_abs"] = max(abs(a - after[t]) for a, t in zip(vals, tm))
    # everything but the bias is kept: the other heads and every other tensor, bit for bit
    import torch

    a = torch.load(pre_ckpt, weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    changed = [k for k in a["model"] if k != "_extra_state"
               and not torch.equal(a["model"][k], b["model"][k])]
    meta["tensors_changed"] = changed
    meta["optimizer_kept"] = "optimizer" in b
    meta["train_infos_after"] = b["model"]["_extra_state"]["train_infos"]
    ev, frames, _ = eval_frames(case["eval_sys"], tm)
    pred = deeppot_eval(ckpt, h, ev)
    auto = deeppot_eval(ckpt, h, ev, "auto")
    ser = save_yaml(ckpt, h, os.path.join(out, "model.yaml"))
    dpe, dpae = dpmodel_energy(ser, ev)
    meta["eval_system"], meta["eval_frames"] = case["eval_sys"], frames
    meta["energy"] = pred["energy"].tolist()
    meta["checks"] = {"deeppot_pt_vs_dpmodel_yaml_energy_max_abs": maxabs(pred["energy"], dpe),
                      "deeppot_pt_vs_dpmodel_yaml_atom_energy_max_abs":
                      maxabs(pred["atom_energy"], dpae),
                      "deeppot_native_vs_auto_nlist_max_abs":
                      max(maxabs(pred[k], auto[k]) for k in pred)}
    np.savez_compressed(os.path.join(out, "eval.npz"), **eval_arrays(ev, pred))
    write_json(os.path.join(out, "bias.json"), meta)
    print(f"{name}: formula−DeePMD {meta.get('formula_vs_deepmd_max_abs', 0):.1e}, "
          f"changed {len(changed)} tensors")
    return ckpt, meta


# ------------------------------------------------------------------------------------------
# refusals


def refusal_cases():
    alloy = FINETUNE["ft_mt_alloy"]["input"]
    mt_bad = copy.deepcopy(alloy)
    mt_bad["model"]["descriptor"] = dict(DPA1, attn_layer=2)
    neuron_bad = copy.deepcopy(alloy)
    neuron_bad["model"]["descriptor"] = dict(DPA1, neuron=[4, 16])
    rcut_bad = copy.deepcopy(alloy)
    rcut_bad["model"]["descriptor"] = dict(DPA1, rcut=3.5)
    se_a_reorder = single_input(["H", "O"], SE_A, fit(2), ["examples/water/data_2"], 0, 100)
    subset_missing = single_input(["Cu", "Ni"], DPA1, fit(3), ALLOY_FT, 0, 40, LOSS_EFV)
    return {
        "se_e2_a_type_map_change": ("pre_se_a", se_a_reorder, []),
        "single_task_pretrained_with_branch": ("pre_se_a", PRE_SE_A_FT0, ["--model-branch", "water"]),
        "unknown_branch": ("pre_mt", alloy, ["--model-branch", "foo"]),
        "attn_layer_differs": ("pre_mt", mt_bad, ["--model-branch", "alloy"]),
        "neuron_differs": ("pre_mt", neuron_bad, ["--model-branch", "alloy"]),
        "rcut_differs": ("pre_mt", rcut_bad, ["--model-branch", "alloy"]),
        "data_type_not_in_type_map": ("pre_mt", subset_missing, ["--model-branch", "alloy"]),
        "multitask_input_with_cli_branch": ("pre_mt", FT_MT_MT, ["--model-branch", "alloy"]),
        "multitask_pretrained_without_branch": ("pre_mt", FINETUNE["ft_mt_random"]["input"], []),
    }


PRE_SE_A_FT0 = single_input(["O", "H"], SE_A, fit(2), ["examples/water/data_2"], 0, 100)


def last_error(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    errs = [l for l in lines if (":" in l and l.split(":")[0].strip().split(".")[-1].endswith(
        ("Error", "Exception", "Interrupt"))) or l.startswith("AssertionError")]
    if not errs:
        return lines[-1] if lines else ""
    i = len(lines) - 1 - lines[::-1].index(errs[-1])
    tail = [l.strip() for l in lines[i + 1:i + 3]] if errs[-1].rstrip().endswith(":") else []
    return " ".join([errs[-1].strip(), *tail])


def refusals(root, ckpts):
    out = {}
    for name, (pre, inp, flags) in refusal_cases().items():
        d = workdir(root, "refuse_" + name)
        write_json(os.path.join(d, "input.json"), inp)
        shutil.copyfile(ckpts[pre], os.path.join(d, "pretrained.pt"))
        args = ["--pt", "train", "input.json", "--finetune", "pretrained.pt", *flags]
        p = run(dp_cmd(*args), d, check=False)
        text = p.stdout + p.stderr
        tl = text.splitlines()
        warn = [" ".join([l.split("WARNING", 1)[1].strip()] + [
                    x.strip() for x in tl[k + 1:k + 6]
                    if x.startswith("  ") and ": input=" in x])
                for k, l in enumerate(tl) if "WARNING" in l
                and ("mismatch" in l.lower() or "re-initialized" in l or "differs" in l)]
        out[name] = {"pretrained": pre, "input_model": inp["model"],
                     "command": "dp " + " ".join(args).replace(
                         "pretrained.pt", f"../{pre}/model.ckpt.pt"),
                     "exit_status": p.returncode,
                     "error": last_error(p.stderr) if p.returncode else None,
                     "warnings": warn[:4]}
        if p.returncode == 0:
            import torch

            mp = torch.load(os.path.realpath(os.path.join(d, "model.ckpt.pt")),
                            weights_only=True)["model"]["_extra_state"]["model_params"]
            out[name]["descriptor_in_written_checkpoint"] = {
                k: mp["descriptor"].get(k) for k in ("type", "rcut", "sel", "attn_layer")}
            out[name]["fitting_random"] = "re-initialized" in " ".join(warn)
        print(f"refusal {name}: rc {p.returncode} {out[name]['error'] or warn[:1]}")
    others = {
        "convert_backend_multitask_pt": (["convert-backend", "pretrained.pt", "x.yaml"], "pre_mt"),
        "change_bias_multitask_without_branch": (
            ["--pt", "change-bias", "pretrained.pt", "-s", "examples/alloy/data/train"], "pre_mt"),
        "freeze_multitask_without_head": (["--pt", "freeze", "-c", "pretrained.pt"], "pre_mt"),
        "change_bias_default_backend_is_tensorflow": (
            ["change-bias", "pretrained.pt", "-s", "examples/water/data_3"], "pre_se_a"),
    }
    for name, (args, pre) in others.items():
        d = workdir(root, "refuse_" + name)
        shutil.copyfile(ckpts[pre], os.path.join(d, "pretrained.pt"))
        p = run(dp_cmd(*args), d, check=False)
        out[name] = {"pretrained": pre,
                     "command": "dp " + " ".join(args).replace(
                         "pretrained.pt", f"../{pre}/model.ckpt.pt"),
                     "exit_status": p.returncode,
                     "error": last_error(p.stderr) if p.returncode else None}
        print(f"refusal {name}: rc {p.returncode} {out[name]['error']}")
    return out


# ------------------------------------------------------------------------------------------


def freeze_checks(root, ckpts):
    """`dp --pt freeze` of the single-task model (kept: frozen.pth) and of the multi-task
    model's alloy head (not kept: its TorchScript code is large); DeepPot on each against the
    checkpoint."""
    res = {}
    d = workdir(root, "freeze")
    for name, ckpt, head, keep in [("pre_se_a", ckpts["pre_se_a"], None, True),
                                   ("pre_mt", ckpts["pre_mt"], "alloy", False)]:
        shutil.copyfile(ckpt, os.path.join(d, f"{name}.pt"))
        args = ["--pt", "freeze", "-c", f"{name}.pt", "-o", f"{name}_frozen"]
        if head:
            args += ["--head", head]
        run(dp_cmd(*args), d)
        pth = os.path.join(d, f"{name}_frozen.pth")
        ev, _, _ = eval_frames(WATER[0] if name == "pre_se_a" else ALLOY_PRE[0],
                               ["O", "H"] if name == "pre_se_a" else TYPE_MAP_ALL)
        a = deeppot_eval(ckpt, head, ev)
        b = deeppot_eval(pth, None, ev)
        import torch

        m = torch.jit.load(pth, map_location="cpu")
        res[name] = {"command": "dp " + " ".join(args).replace(f"{name}.pt",
                                                               f"{name}/model.ckpt.pt"),
                     "bytes": os.path.getsize(pth), "kept": keep,
                     "pt_vs_pth_max_abs": max(maxabs(a[k], b[k]) for k in a),
                     "model_def_script_type_map": json.loads(m.get_model_def_script())[
                         "type_map"],
                     "state_dict_keys": len(m.state_dict()),
                     "inventory": pickle_inventory(pth)}
        if keep:
            shutil.copyfile(pth, os.path.join(OUT, name, "frozen.pth"))
    return res


def main():
    import deepmd
    import torch

    assert deepmd.__version__ == "3.2.0", deepmd.__version__
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    keep = os.environ.get("MULTITASK_KEEP_WORKDIR")
    root = tempfile.mkdtemp(prefix="multitask-ref-")
    ckpts, infos, summary = {}, {}, {"deepmd_version": deepmd.__version__,
                                     "torch_version": torch.__version__,
                                     "numpy_version": np.__version__}
    for name, inp, traced in [("pre_se_a", PRE_SE_A, False), ("pre_mt", PRE_MT, True)]:
        ckpts[name], infos[name] = pretrain(root, name, inp, traced)
        write_json(os.path.join(OUT, name, "info.json"), infos[name])
    cases = {}
    for name, case in FINETUNE.items():
        _, cases[name] = finetune(root, name, case, ckpts[case["pre"]], infos[case["pre"]])
    for name, case in CHANGE_BIAS.items():
        _, cases[name] = change_bias(root, name, case, ckpts[case["pre"]], infos[case["pre"]])
    summary["freeze"] = freeze_checks(root, ckpts)
    write_json(os.path.join(OUT, "refusals.json"), refusals(root, ckpts))
    inv = {}
    for p in sorted(glob.glob(os.path.join(OUT, "*", "*.pt")) +
                    glob.glob(os.path.join(OUT, "*", "*.pth"))):
        inv[os.path.relpath(p, OUT)] = pickle_inventory(p)
    all_ops, all_globs = Counter(), Counter()
    for v in inv.values():
        for pk in v["pickles"].values():
            all_ops.update(pk["opcodes"])
            all_globs.update(pk["globals"])
    write_json(os.path.join(OUT, "pickle_inventory.json"),
               {"files": inv, "all_opcodes": sorted(all_ops), "all_globals": sorted(all_globs)})
    write_json(os.path.join(OUT, "summary.json"), summary)
    if keep:
        print("work folder kept:", root)
    else:
        shutil.rmtree(root)
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(OUT, "**"), recursive=True)
                if os.path.isfile(p))
    print(f"{OUT}: {total} bytes")


if __name__ == "__main__":
    main()

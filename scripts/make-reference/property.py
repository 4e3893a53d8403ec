"""DeePMD-kit 3.2.0's own numbers for the `property` fitting (fitting_net.type "property",
loss.type "property").

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root:
`python scripts/make-reference/property.py [case ...]` (no argument: both cases; a minute or
two on 2 cores). `property_mol` reads DeePMD-kit's examples/property/data/data_0, which this
repository does not hold: from a DeePMD-kit checkout named by DEEPMD_KIT_SRC, else from the git
directory DEEPMD_KIT_GIT (default /work/.mirror/deepmodeling+deepmd-kit/repo, `git show
HEAD:<path>`); the git blob ids of the files read are recorded in eval.json. Writes
tests/reference/fittings/<case>/{input.json, model.yaml, eval.npz, eval.json, train_step.npz,
train_step.json}; tests/reference/fittings/README.md describes them.

Cases:
- property_water: fparam.py's water case (se_e2_a float64 with davg/dstd by hand, DeePMD-kit's
  water frames 0, 1, 2; train frame 0) with an extensive `property` fitting of task_dim 3 and
  labels drawn here (seeded), one scale per component.
- property_mol: DeePMD-kit's examples/property (type_map H C N O, molecules without a box,
  mixed-type data) with a small DPA-1 (se_atten, attn_layer 0) and an intensive `property`
  fitting of task_dim 3 on the data's own band_prop; eval frames 0, 1, 2, train frames 0, 1.

The fitting's weights are initialised by DeePMD-kit's PyTorch `get_model` (dpmodel's
PropertyFittingNet ignores its seed, so only PyTorch's initialisation is reproducible). The
output statistics (out_bias, out_std of the atomic model, [1, ntypes, task_dim]) are DeePMD-kit's
own: the atomic model's `compute_or_load_out_stat` (`change_out_bias(..., "set-by-statistic")`,
i.e. `compute_output_stats` with the fitting's distinguish_types and intensive) on the eval
frames, sampled by DeePMD-kit's own loader (`DpLoaderSet` + `make_stat_input` over a copy of the
eval frames as a DeePMD-kit system); for property_mol that is the whole `compute_or_load_stat`
of `dp train` (descriptor davg/dstd too). The same statistics from a sample dict built here are
recorded beside them as a check.
- eval: the PyTorch model from the serialization (global `band_prop`, atomic `atom_band_prop`),
  dpmodel (numpy) beside it, DeePMD-kit's DeepProperty on the .pth that `dp convert-backend`
  made from model.yaml, and the round trip yaml → .pth → yaml.
- train step: DeePMD-kit PT's PropertyLoss (as `dp train` builds it: task_dim, var_name and
  intensive from the model) with loss_func "smooth_mae" (beta 1, metric ["mae"]) and with
  "mse", `loss.backward()`, `.grad` of every parameter under dpw's names; the loss written out
  by hand beside it; finite differences of DeePMD-kit's loss for a few gradient elements.
"""

import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import descriptors as D  # noqa: E402
import dpa1 as A  # noqa: E402  (dpw's names of DPA-1 parameters)

import deepmd  # noqa: E402
from deepmd.dpmodel.utils.serialization import save_dp_model  # noqa: E402

ROOT = "tests/reference/fittings"
NAME = "band_prop"
TASK_DIM = 3
LOSS_SMAE = {"type": "property", "loss_func": "smooth_mae", "beta": 1.0, "metric": ["mae"]}
LOSS_MSE = {"type": "property", "loss_func": "mse", "beta": 1.0, "metric": ["mae"]}

WATER = dict(D.WATER, descriptor=D.se_a([46, 92], 6.0, True, 1), pbc=True, mixed=False,
             fitting={"type": "property", "property_name": NAME, "task_dim": TASK_DIM,
                      "intensive": False, "neuron": D.FIT["neuron"], "resnet_dt": True,
                      "seed": 1, "precision": "float64"},
             # drawn labels: per component mean and scale, far apart so that a wrong component
             # order or scale shows
             label_mean=[-40.0, 3.0, 250.0], label_scale=[2.0, 0.05, 30.0], label_seed=11)

MOL = {
    "system": "examples/property/data/data_0",
    "type_map": ["H", "C", "N", "O"],
    "eval_frames": [0, 1, 2],
    "train_frames": [0, 1],
    "pbc": False,
    "mixed": True,
    # examples/property/train/input_torch.json's descriptor with small widths; set_davg_zero and
    # smooth_type_embedding are argcheck's defaults (dpmodel's class defaults differ), spelled
    # out so that get_model and `dp train` build the same model (checked below).
    "descriptor": {
        "type": "dpa1", "sel": 120, "rcut_smth": 0.5, "rcut": 6.0, "neuron": [8, 16],
        "tebd_dim": 8, "axis_neuron": 4, "type_one_side": True, "attn": 16, "attn_layer": 0,
        "attn_dotr": True, "attn_mask": False, "activation_function": "tanh",
        "scaling_factor": 1.0, "normalize": True, "temperature": 1.0, "precision": "float64",
        "set_davg_zero": True, "smooth_type_embedding": False, "seed": 1,
    },
    "fitting": {"type": "property", "intensive": True, "task_dim": TASK_DIM,
                "property_name": NAME, "neuron": [16, 16, 16], "resnet_dt": True, "seed": 1,
                "precision": "float64"},
}
CASES = {"property_water": WATER, "property_mol": MOL}


# ---------------------------------------------------------------- data

def example_file(path):
    """Bytes of a file of DeePMD-kit's source tree (see the module docstring) and its blob id."""
    src = os.environ.get("DEEPMD_KIT_SRC")
    if src:
        with open(os.path.join(src, path), "rb") as fh:
            raw = fh.read()
    else:
        git = os.environ.get("DEEPMD_KIT_GIT", "/work/.mirror/deepmodeling+deepmd-kit/repo")
        raw = subprocess.run(["git", "--git-dir", git, "show", f"HEAD:{path}"], check=True,
                             capture_output=True).stdout
    blob = hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()
    return raw, blob


def load_mol(case, frames):
    import io

    root = case["system"]
    blobs = {}

    def get(name):
        raw, blobs[name] = example_file(f"{root}/{name}")
        return raw

    names = get("type_map.raw").decode().split()
    assert get("nopbc") == b""  # the marker of a system without a box
    rat = np.load(io.BytesIO(get("set.000000/real_atom_types.npy")))
    coord = np.load(io.BytesIO(get("set.000000/coord.npy"))).astype(np.float64)
    prop = np.load(io.BytesIO(get(f"set.000000/{NAME}.npy"))).astype(np.float64)
    # one composition: every chosen frame has the same types, in the same order
    rows = rat[frames]
    assert np.all(rows == rows[0]) and np.all(rows[0] >= 0), "frames of one composition"
    atype = np.array([case["type_map"].index(names[t]) for t in rows[0]])
    assert np.all(np.diff(atype) >= 0), "the data's atoms are sorted by type already"
    nf, n = len(frames), len(atype)
    same = int(np.all(rat == rat[0], axis=1).sum())
    return {
        "atype": atype,
        "coord": coord[frames].reshape(nf, n, 3),
        "label": prop[frames].reshape(nf, TASK_DIM),
    }, {"blobs": blobs, "nframes_in_file": int(rat.shape[0]),
        "frames_with_the_composition_of_frame_0": same,
        "data_type_map": names}


def load_water(case, frames):
    data = D.load(case, frames)
    rng = np.random.default_rng(case["label_seed"])
    nf = len(frames)
    # drawn for all eval frames at once; the train frame takes its eval row
    lab = np.stack([rng.normal(m, s, nf) for m, s in zip(case["label_mean"],
                                                         case["label_scale"])], axis=1)
    return {"atype": data["atype"], "coord": data["coord"], "box": data["box"],
            "label": lab}, {}


def load(case, frames):
    return load_mol(case, frames) if case["mixed"] else load_water(case, frames)


def subset(data, idx):
    return {k: (v if k == "atype" else v[idx]) for k, v in data.items()}


def natoms_vec(data):
    nf, n = data["coord"].shape[:2]
    nt = data["nt"]
    return np.tile(np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)]), (nf, 1))


def write_system(path, data, case):
    """The frames as a DeePMD-kit system (deepmd/npy; deepmd/npy/mixed for property_mol)."""
    os.makedirs(os.path.join(path, "set.000"))
    nf, n = data["coord"].shape[:2]
    with open(os.path.join(path, "type_map.raw"), "w") as fh:
        fh.write("".join(f"{t}\n" for t in case["type_map"]))
    s = os.path.join(path, "set.000")
    if case["mixed"]:
        with open(os.path.join(path, "type.raw"), "w") as fh:
            fh.write("0\n" * n)
        np.save(os.path.join(s, "real_atom_types.npy"), np.tile(data["atype"], (nf, 1)))
    else:
        with open(os.path.join(path, "type.raw"), "w") as fh:
            fh.write("".join(f"{t}\n" for t in data["atype"]))
    if case["pbc"]:
        np.save(os.path.join(s, "box.npy"), data["box"].reshape(nf, 9))
    else:
        open(os.path.join(path, "nopbc"), "w").close()
    np.save(os.path.join(s, "coord.npy"), data["coord"].reshape(nf, -1))
    np.save(os.path.join(s, f"{NAME}.npy"), data["label"])


def loader_sample(case, data):
    """DeePMD-kit's own statistics sample (`dp train`'s path) of the frames: one batch of all."""
    from deepmd.pt.utils.dataloader import DpLoaderSet
    from deepmd.pt.utils.stat import make_stat_input
    from deepmd.utils.data import DataRequirementItem

    nf = data["coord"].shape[0]
    with tempfile.TemporaryDirectory() as tmp:
        sysdir = os.path.join(tmp, "sys")
        write_system(sysdir, data, case)
        loader = DpLoaderSet([sysdir], batch_size=nf, type_map=case["type_map"], shuffle=False)
        loader.add_data_requirement([DataRequirementItem(NAME, TASK_DIM, atomic=False, must=True,
                                                         high_prec=True)])
        sampled = make_stat_input(loader.systems, loader.dataloaders, 1)
    assert len(sampled) == 1
    got = np.asarray(sampled[0][NAME]).reshape(nf, TASK_DIM)
    assert np.array_equal(got, data["label"]), "the loader's batch is the frames, in order"
    return sampled


def own_sample(case, data):
    """The same sample written here (labels and natoms), for the check."""
    s = {NAME: torch.tensor(data["label"]), "find_" + NAME: np.float32(1.0),
         "natoms": torch.tensor(natoms_vec(data)),
         "atype": torch.tensor(np.tile(data["atype"], (data["coord"].shape[0], 1)))}
    if case["mixed"]:
        s["real_natoms_vec"] = s["natoms"]
    return [s]


# ---------------------------------------------------------------- model

def check_argcheck_defaults(params):
    """get_model on the parameters as given and on `dp train`'s normalised ones: same model."""
    from deepmd.dpmodel.model.model import get_model
    from deepmd.utils.argcheck import normalize

    inp = {"model": copy.deepcopy(params), "loss": dict(LOSS_SMAE),
           "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5,
                             "decay_steps": 100},
           "training": {"training_data": {"systems": ["x"], "batch_size": 1}, "numb_steps": 1}}
    norm = normalize(inp)["model"]
    strip = lambda d: ({k: strip(v) for k, v in d.items() if k not in ("@variables",)}
                       if isinstance(d, dict) else
                       [strip(v) for v in d] if isinstance(d, list) else
                       None if isinstance(d, np.ndarray) else d)
    a = strip(get_model(copy.deepcopy(params)).serialize())
    b = strip(get_model({k: copy.deepcopy(norm[k])
                         for k in ("type_map", "descriptor", "fitting_net")}).serialize())
    assert a == b, "the model of the input differs from dp train's"
    return norm


def pt_get_model(params):
    from deepmd.pt.model.model import get_model

    return get_model(copy.deepcopy(params)).to(torch.float64)


def make_model(case, ev):
    """(params, serialization, stats info). See the module docstring."""
    params = {"type_map": case["type_map"], "descriptor": case["descriptor"],
              "fitting_net": case["fitting"]}
    norm = check_argcheck_defaults(params)
    nt = len(case["type_map"])
    pt = pt_get_model(params)
    # PyTorch's initialisation is seeded: a second build gives the same weights
    again = pt_get_model(params)
    for (k, a), (_, b) in zip(pt.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    sampled = loader_sample(case, ev)
    if case["mixed"]:
        # `dp train`'s compute_or_load_stat: descriptor davg/dstd and the output statistics
        pt.compute_or_load_stat(lambda: sampled, None)
        ser = pt.serialize()
    else:
        # fparam.py's descriptor (dpmodel, seeded, davg/dstd by hand); the fitting of PyTorch's
        # get_model; the output statistics by the atomic model itself
        _, dser = D.make_model(case, {"atype": ev["atype"], "energy": np.zeros(len(ev["coord"]))})
        ser = pt.serialize()
        ser["descriptor"] = dser["descriptor"]
        pt = D.pt_model(ser)
        pt.atomic_model.compute_or_load_out_stat(sampled)
        ser = pt.serialize()
    am = pt.atomic_model
    bias = am.out_bias.detach().numpy().copy()
    std = am.out_std.detach().numpy().copy()
    assert bias.shape == (1, nt, TASK_DIM) and std.shape == (1, nt, TASK_DIM)
    assert np.array_equal(ser["@variables"]["out_bias"], bias)
    assert np.array_equal(ser["@variables"]["out_std"], std)
    # the same statistics from a sample written here, on a model with no statistics yet
    fresh = copy.deepcopy(ser)
    fresh["@variables"]["out_bias"] = np.zeros_like(bias)
    fresh["@variables"]["out_std"] = np.ones_like(std)
    other = D.pt_model(fresh)
    other.atomic_model.compute_or_load_out_stat(own_sample(case, ev))
    # and DeePMD-kit's compute_output_stats called directly with the atomic model's switches
    from deepmd.pt.utils.stat import compute_output_stats

    db, ds = compute_output_stats(own_sample(case, ev), nt, keys=[NAME], rcond=None,
                                  stats_distinguish_types=am.get_compute_stats_distinguish_types(),
                                  intensive=am.get_intensive())
    db2, ds2 = compute_output_stats(own_sample(case, ev), nt, keys=[NAME], rcond=None,
                                    stats_distinguish_types=False, intensive=am.get_intensive())
    info = {
        "how": ("dp train's compute_or_load_stat (descriptor davg/dstd and output statistics) "
                "on DpLoaderSet + make_stat_input over the eval frames" if case["mixed"] else
                "atomic_model.compute_or_load_out_stat (change_out_bias set-by-statistic) on "
                "DpLoaderSet + make_stat_input over the eval frames"),
        "out_bias": bias.tolist(),
        "out_std": std.tolist(),
        "natoms_per_type_of_frames": natoms_vec(ev)[:, 2:].tolist(),
        "distinguish_types": bool(am.get_compute_stats_distinguish_types()),
        "intensive": bool(am.get_intensive()),
        "labels": ev["label"].tolist(),
        "own_sample_vs_loader_max_abs": {
            "out_bias": float(np.abs(other.atomic_model.out_bias.detach().numpy() - bias).max()),
            "out_std": float(np.abs(other.atomic_model.out_std.detach().numpy() - std).max())},
        "compute_output_stats_direct_vs_loader_max_abs": {
            "out_bias": float(np.abs(db[NAME].numpy().reshape(bias.shape) - bias).max()),
            "out_std": float(np.abs(ds[NAME].numpy().reshape(std.shape) - std).max())},
        "data_stat_protect": norm["data_stat_protect"],
        "not_used_if_distinguish_types_false": {
            "note": "compute_output_stats with stats_distinguish_types false on the same sample "
            "(compute_stats_do_not_distinguish_types): NOT this model's statistics, recorded to "
            "show the other branch",
            "out_bias": db2[NAME].numpy().reshape(bias.shape).tolist(),
            "out_std": ds2[NAME].numpy().reshape(std.shape).tolist()},
    }
    return params, ser, info


# ---------------------------------------------------------------- eval

def inputs(case, data):
    nf = data["coord"].shape[0]
    d = {"coord": torch.tensor(data["coord"].reshape(nf, -1), dtype=torch.float64),
         "atype": torch.tensor(np.tile(data["atype"], (nf, 1)), dtype=torch.int64)}
    if case["pbc"]:
        d["box"] = torch.tensor(data["box"].reshape(nf, 9), dtype=torch.float64)
    return d


def pt_eval(pt, case, data, train=False):
    pt.train(train)
    return pt(**inputs(case, data))


def dp_eval(dp, case, data):
    nf = data["coord"].shape[0]
    return dp(data["coord"].reshape(nf, -1, 3), np.tile(data["atype"], (nf, 1)),
              box=data["box"].reshape(nf, 3, 3) if case["pbc"] else None)


def deep_property(pth, case, data):
    from deepmd.infer.deep_property import DeepProperty

    nf = data["coord"].shape[0]
    dp = DeepProperty(pth)
    out = dp.eval(data["coord"].reshape(nf, -1),
                  data["box"].reshape(nf, 9) if case["pbc"] else None, data["atype"],
                  atomic=True)
    info = {"get_var_name": dp.get_var_name(), "get_task_dim": dp.get_task_dim(),
            "get_intensive": bool(dp.get_intensive())}
    return np.asarray(out[0]).reshape(nf, -1), np.asarray(out[1]).reshape(nf, -1, TASK_DIM), info


def out_stat_application(ser, case, data, pred_atom):
    """atom_band_prop against the fitting net's own output (out_bias 0, out_std 1):
    atom = fit · out_std[type] + out_bias[type]."""
    raw = copy.deepcopy(ser)
    raw["@variables"]["out_bias"] = np.zeros_like(ser["@variables"]["out_bias"])
    raw["@variables"]["out_std"] = np.ones_like(ser["@variables"]["out_std"])
    r = pt_eval(D.pt_model(raw), case, data)[f"atom_{NAME}"].detach().numpy()
    b, s = ser["@variables"]["out_bias"][0], ser["@variables"]["out_std"][0]
    t = data["atype"]
    return {
        "fit_times_std_plus_bias_max_abs": float(np.abs(r * s[t] + b[t] - pred_atom).max()),
        "fit_plus_bias_max_abs": float(np.abs(r + b[t] - pred_atom).max()),
        "fit_output_first_atom_frame0": r[0, 0].tolist(),
    }


# ---------------------------------------------------------------- train step

def loss_obj(pt, lpar):
    """PropertyLoss as `dp train` makes it (training.py get_loss)."""
    from deepmd.pt.loss.property import PropertyLoss

    kw = {k: v for k, v in lpar.items() if k != "type"}
    return PropertyLoss(task_dim=pt.get_task_dim(), var_name=pt.get_var_name(),
                        intensive=pt.get_intensive(), **kw)


def loss_fn(pt, case, data, lpar):
    nf, n = data["coord"].shape[:2]
    label = {NAME: torch.tensor(data["label"]), "find_" + NAME: 1.0}  # fresh: the loss rebinds
    pt.train(True)
    pred, loss, more = loss_obj(pt, lpar)(inputs(case, data), pt, label, n, D.LR)
    return loss, pred, more


def grads(pt, case, data, lpar, names):
    pt.zero_grad(set_to_none=True)
    loss, pred, more = loss_fn(pt, case, data, lpar)
    loss.backward()
    g = {names[k]: (np.zeros(tuple(p.shape)) if p.grad is None else p.grad.detach().numpy().copy())
         for k, p in pt.named_parameters() if k in names}
    return float(loss.detach()), {k: float(v) for k, v in more.items()}, g


def hand_grads(pt, case, data, lpar, names):
    """PropertyLoss's formula written out: x = pred/N, y = label/N (extensive) or pred, label
    (intensive); d = ((y − b) − (x − b))/s with b = out_bias[0][0], s = out_std[0][0];
    loss = Σ smooth_l1(d; beta) or Σ d², over frames and components."""
    pt.zero_grad(set_to_none=True)
    r = pt_eval(pt, case, data, train=True)
    n = data["coord"].shape[1]
    x, y = r[NAME], torch.tensor(data["label"])
    if not pt.get_intensive():
        x, y = x / n, y / n
    b = pt.atomic_model.out_bias[0][0]
    s = pt.atomic_model.out_std[0][0]
    d = ((y - b) / s - (x - b) / s).abs()
    if lpar["loss_func"] == "mse":
        loss = (d**2).sum()
    else:
        beta = lpar["beta"]
        loss = torch.where(d < beta, 0.5 * d**2 / beta, d - 0.5 * beta).sum()
    loss.backward()
    g = {names[k]: (np.zeros(tuple(p.shape)) if p.grad is None else p.grad.detach().numpy().copy())
         for k, p in pt.named_parameters() if k in names}
    return float(loss.detach()), g


def fd_check(pt, case, data, lpar, names, g, key, label, h=1e-4):
    return D.fd_largest(pt, names, g, key, label,
                        lambda: float(loss_fn(pt, case, data, lpar)[0].detach()), h)


# ---------------------------------------------------------------- case

def run_case(name, case):
    out = os.path.join(ROOT, name)
    os.makedirs(out, exist_ok=True)
    nt = len(case["type_map"])
    ev, src = load(case, case["eval_frames"])
    ev["nt"] = nt
    pos = [case["eval_frames"].index(f) for f in case["train_frames"]]
    tr = subset({k: v for k, v in ev.items() if k != "nt"}, pos)
    ev_data = {k: v for k, v in ev.items() if k != "nt"}
    params, ser, stats = make_model(case, ev)
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {"model": ser, "model_def_script": params, "backend": "dpmodel",
                              "software": "deepmd-kit", "version": deepmd.__version__})
    pt = D.pt_model(ser)
    dp = D.dp_model(ser)
    nf = len(case["eval_frames"])
    r = pt_eval(pt, case, ev_data)
    assert set(r) >= {NAME, f"atom_{NAME}"}, sorted(r)
    prop = r[NAME].detach().numpy().reshape(nf, TASK_DIM)
    aprop = r[f"atom_{NAME}"].detach().numpy().reshape(nf, -1, TASK_DIM)
    npd = dp_eval(dp, case, ev_data)
    dprop = np.asarray(npd[NAME]).reshape(nf, TASK_DIM)
    daprop = np.asarray(npd[f"atom_{NAME}"]).reshape(nf, -1, TASK_DIM)
    with tempfile.TemporaryDirectory() as tmp:
        pth = os.path.join(tmp, "model.pth")
        back = os.path.join(tmp, "back.yaml")
        dp_bin = os.path.join(os.path.dirname(sys.executable), "dp")
        for a, b in [(yaml_path, pth), (pth, back)]:
            subprocess.run([dp_bin, "convert-backend", a, b], check=True, capture_output=True)
        roundtrip = D.yaml_roundtrip_diff(ser, back)
        iprop, iaprop, iinfo = deep_property(pth, case, ev_data)
    red = aprop.mean(1) if case["fitting"]["intensive"] else aprop.sum(1)
    arrays = {"coord": ev["coord"].reshape(nf, -1), "atype": ev["atype"],
              "property_label": ev["label"], "property": prop, "atom_property": aprop,
              "property_dpmodel": dprop, "atom_property_dpmodel": daprop}
    if case["pbc"]:
        arrays["box"] = ev["box"].reshape(nf, 9)
    np.savez(os.path.join(out, "eval.npz"), **arrays)
    fit_ser = ser["fitting"]
    meta = {
        "generator": "scripts/make-reference/property.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"],
        "frames": case["eval_frames"],
        "pbc": case["pbc"],
        "box": "eval.npz box [nf, 9]" if case["pbc"] else
               "none: eval.npz has no box (the system has `nopbc`; the model is called with "
               "box None)",
        "atom_order": ("type.raw's (the system is sorted by type already)" if not case["mixed"]
                       else "the data's real_atom_types order (the frames are sorted by type "
                       "already; the chosen frames share one composition)"),
        "type_map": case["type_map"],
        "atype": ev["atype"].tolist(),
        "descriptor": case["descriptor"],
        "fitting": case["fitting"],
        "fitting_serialized": {k: fit_ser[k] for k in (
            "type", "var_name", "task_dim", "dim_out", "intensive", "distinguish_types",
            "mixed_types", "neuron", "resnet_dt", "precision") if k in fit_ser},
        "fitting_bias_atom_e_all_zero": bool(np.all(fit_ser["@variables"]["bias_atom_e"] == 0)),
        "output_keys": {"global": NAME, "atomic": f"atom_{NAME}", "pt_forward_keys": sorted(r)},
        "label_source": ("drawn: rng default_rng(%d), component k ~ normal(mean_k, scale_k), "
                         "mean %s, scale %s" % (case["label_seed"], case["label_mean"],
                                                case["label_scale"])
                         if not case["mixed"] else f"the data's {NAME}.npy"),
        "stats": stats,
        "out_bias": stats["out_bias"],
        "out_std": stats["out_std"],
        "natoms_per_type": stats["natoms_per_type_of_frames"],
        "property": prop.tolist(),
        "property_dpmodel": dprop.tolist(),
        "atom_property_frame0_first4": aprop[0, :4].tolist(),
        "checks": {
            "pt_vs_dpmodel_property_max_rel": D.rel(prop, dprop),
            "pt_vs_dpmodel_atom_property_max_rel": D.rel(aprop, daprop),
            "pt_vs_deepproperty_pth_max_rel": D.rel(prop, iprop),
            "pt_vs_deepproperty_pth_atom_max_rel": D.rel(aprop, iaprop),
            "deepproperty": iinfo,
            "reduction": "mean over atoms" if case["fitting"]["intensive"] else "sum over atoms",
            "reduction_of_atom_property_max_abs": float(np.abs(red - prop).max()),
            "out_stat_application": out_stat_application(ser, case, ev_data, aprop),
            "yaml_to_pth_to_yaml_max_abs_param_diff": roundtrip,
        },
    }
    if case["mixed"]:
        meta["descriptor_stats"] = {
            "davg_per_type": ser["descriptor"]["@variables"]["davg"][:, 0].tolist(),
            "dstd_per_type": ser["descriptor"]["@variables"]["dstd"][:, 0].tolist(),
            "shape": list(ser["descriptor"]["@variables"]["davg"].shape),
            "all_slots_equal": bool(np.all(ser["descriptor"]["@variables"]["dstd"] ==
                                           ser["descriptor"]["@variables"]["dstd"][:, :1])),
            "how": "dp train's compute_or_load_stat on the eval frames (set_davg_zero true)",
        }
        meta["source"] = src
        meta["max_neighbours_within_rcut"] = int(max(
            ((np.linalg.norm(x[:, None] - x[None], axis=-1) < case["descriptor"]["rcut"]).sum(1)
             - 1).max() for x in ev["coord"]))
    else:
        meta["davg_dstd"] = "by hand, as fparam.py / descriptors.py's water cases"
    with open(os.path.join(out, "eval.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    print(f"{name}: out_bias {np.array(stats['out_bias']).reshape(nt, -1).tolist()}, "
          f"out_std {np.array(stats['out_std'])[0, 0].tolist()}; checks "
          f"{json.dumps({k: v for k, v in meta['checks'].items() if isinstance(v, float)})}",
          flush=True)

    # ---- train step
    names = (D.dpw_names(pt, ser) if not case["mixed"] else A.dpw_names(pt))
    n = tr["coord"].shape[1]
    ntr = tr["coord"].shape[0]
    tpred = pt_eval(pt, case, tr, train=True)[NAME].detach().numpy().reshape(ntr, TASK_DIM)
    l1, more1, g1 = grads(pt, case, tr, LOSS_SMAE, names)
    l2, more2, g2 = grads(pt, case, tr, LOSS_MSE, names)
    h1, hg1 = hand_grads(pt, case, tr, LOSS_SMAE, names)
    h2, hg2 = hand_grads(pt, case, tr, LOSS_MSE, names)
    arrays = {"coord": tr["coord"].reshape(ntr, -1), "atype": tr["atype"],
              "property_label": tr["label"], "property": tpred}
    if case["pbc"]:
        arrays["box"] = tr["box"].reshape(ntr, 9)
    for k in sorted(g1):
        arrays["grad." + k] = g1[k]
    for k in sorted(g2):
        arrays["grad_mse." + k] = g2[k]
    fit0 = "fit.t0.layer0.w" if not case["mixed"] else "fit.layer0.w"
    fitlast = sorted(k for k in g1 if k.startswith("fit.") and k.endswith(".w"))[-1]
    emb0 = "embed.t0.layer0.w" if not case["mixed"] else "embed.layer0.w"
    fds = []
    for key in [fit0, emb0, fitlast]:
        fds.append(fd_check(pt, case, tr, LOSS_SMAE, names, g1, key, "loss smooth_mae"))
        fds.append(fd_check(pt, case, tr, LOSS_MSE, names, g2, key, "loss mse"))
    am = pt.atomic_model
    x = tpred / (1.0 if case["fitting"]["intensive"] else n)
    y = tr["label"] / (1.0 if case["fitting"]["intensive"] else n)
    tmeta = {
        "generator": "scripts/make-reference/property.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU; PropertyLoss, loss.backward()",
        "system": case["system"],
        "frames": case["train_frames"],
        "pbc": case["pbc"],
        "natoms": n,
        "intensive": case["fitting"]["intensive"],
        "loss": LOSS_SMAE,
        "loss_mse": LOSS_MSE,
        "lr": D.LR,
        "lr_note": "PropertyLoss does not use the learning rate",
        "labels": tr["label"].tolist(),
        "property": tpred.tolist(),
        "out_bias_used": am.out_bias[0][0].detach().numpy().tolist(),
        "out_std_used": am.out_std[0][0].detach().numpy().tolist(),
        "loss_formula": "x = pred/N, y = label/N if not intensive (N = atoms of the frame, from "
        "the atom mask), else x = pred, y = label; d = (y − b)/s − (x − b)/s with b = "
        "out_bias[0][0] and s = out_std[0][0] of the atomic model (type 0's row, [task_dim]); "
        "loss = Σ_frames Σ_components smooth_l1(d; beta) (0.5 d²/beta if |d| < beta else "
        "|d| − beta/2), or Σ d² for mse (reduction sum); metric mae = mean |y − x|",
        "loss_value": l1,
        "loss_value_mse": l2,
        "more_loss": more1,
        "more_loss_mse": more2,
        "metric_mae_check": float(np.abs(y - x).mean()),
        "normalised_residual_d": ((y - x) / np.asarray(am.out_std[0][0].detach())).tolist(),
        "hand_written_loss": {
            "smooth_mae": {"value": h1, "grad_vs_deepmd_max_rel": D.grad_rel_diff(hg1, g1)},
            "mse": {"value": h2, "grad_vs_deepmd_max_rel": D.grad_rel_diff(hg2, g2)},
        },
        "fd_param_checks": fds,
        "n_tensors": len(g1),
        "n_parameters": int(sum(v.size for v in g1.values())),
        "tensors": {k: list(v.shape) for k, v in sorted(g1.items())},
    }
    np.savez(os.path.join(out, "train_step.npz"), **arrays)
    with open(os.path.join(out, "train_step.json"), "w") as fh:
        json.dump(tmeta, fh, indent=1)
        fh.write("\n")
    print(f"{name}: loss smooth_mae {l1!r} (hand {h1!r}), mse {l2!r} (hand {h2!r}), "
          f"mae {more1}; {len(g1)} tensors; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

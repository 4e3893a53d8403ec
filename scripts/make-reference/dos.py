"""DeePMD-kit 3.2.0's own numbers for the `dos` fitting (fitting_net.type "dos", loss.type
"dos").

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root:
`python scripts/make-reference/dos.py` (a minute or two on 2 cores: it also runs `dp train` for
one step twice and `dp test` twice). Writes tests/reference/fittings/dos_water/{input.json,
model.yaml, eval.npz, eval.json, train_step.npz, train_step.json};
tests/reference/fittings/README.md describes them.

Case dos_water: property.py's water case (se_e2_a float64, the descriptor of fparam_water with
davg/dstd by hand, DeePMD-kit's water frames 0, 1, 2; train frame 0) with the fitting
`{"type": "dos", "numb_dos": 8, "neuron": [16, 16, 16], "resnet_dt": true, "seed": 1,
"precision": "float64"}` and labels drawn here (seeded): per-atom `atom_dos` [nf, natoms, 8],
positive, with a per-type amplitude and a per-type channel shape, and a global `dos` [nf, 8] =
the frame's sum of atom_dos plus noise (so global and atomic labels are not exactly consistent).

- The fitting's weights are those of DeePMD-kit's PyTorch `get_model` (seeded); the descriptor
  is replaced by fparam.py's (dpmodel, seeded, davg/dstd by hand), as in property.py.
- Output statistics (out_bias, out_std of the atomic model, [1, ntypes, 8]): DeePMD-kit's own
  `compute_or_load_out_stat` of the atomic model on DeePMD-kit's own statistics sample
  (`DpLoaderSet` with DOSLoss's label requirement + `make_stat_input` over a copy of the eval
  frames written as a DeePMD-kit system) in three situations: (a) the system holds only
  dos.npy, (b) only atom_dos.npy, (c) both. model.yaml carries (a). Besides: the same numbers
  written out in numpy, and what `dp train` itself stores (one step, read from its checkpoint)
  with the full loss and with the global-only loss on the system holding both labels.
- eval: PyTorch model (`dos`, `atom_dos`), dpmodel (numpy) beside it, DeePMD-kit's DeepDOS on
  the .pth that `dp convert-backend` made from model.yaml, the yaml → .pth → yaml round trip,
  and `dp test` (with and without `-a`) on the .pth: its log lines and detail files.
- train step: DeePMD-kit PT's DOSLoss (as `dp train` builds it: numb_dos from the model,
  starter_learning_rate = start_lr) on frame 0 with both labels, all four terms active
  (`grad.`), with only the global terms (`grad_global.`) and with only the atomic terms
  (`grad_atomic.`); the loss written out by hand
  (value in numpy, gradient by torch autograd of the hand-written float64 formula: `grad_f64.`);
  finite differences of DeePMD-kit's loss for a few gradient elements.
"""

import copy
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import descriptors as D  # noqa: E402

import deepmd  # noqa: E402
from deepmd.dpmodel.utils.serialization import load_dp_model, save_dp_model  # noqa: E402

OUT = "tests/reference/fittings/dos_water"
NDOS = 8
FIT = {"type": "dos", "numb_dos": NDOS, "neuron": [16, 16, 16], "resnet_dt": True, "seed": 1,
       "precision": "float64"}
CASE = dict(D.WATER, descriptor=D.se_a([46, 92], 6.0, True, 1), fitting=FIT, label_seed=23)
# drawn labels: atom_dos[f, i, k] = amp[t_i] · shape[t_i][k] · lognormal(0, 0.25);
# shape[t][k] = exp(−((k − centre_t)/width_t)²/2) + floor_t; dos = Σ_i atom_dos + noise
LABELS = {"amp": [3.0, 0.8], "centre": [2.0, 5.0], "width": [1.5, 1.2], "floor": [0.1, 0.05],
          "atom_lognormal_sigma": 0.25, "global_noise_sigma": 0.5}
# all four terms active, with distinct start/limit (coef = lr/start_lr = 0.5 interpolates each)
LOSS = {"type": "dos", "start_pref_dos": 1.0, "limit_pref_dos": 2.0,
        "start_pref_cdf": 0.5, "limit_pref_cdf": 0.1,
        "start_pref_ados": 3.0, "limit_pref_ados": 1.0,
        "start_pref_acdf": 0.2, "limit_pref_acdf": 0.4}
LOSS_GLOBAL = dict(LOSS, start_pref_ados=0.0, limit_pref_ados=0.0, start_pref_acdf=0.0,
                   limit_pref_acdf=0.0)
# the atomic terms alone: in LOSS their share of the gradient is ~1e-4 (the global terms compare
# sums over 192 atoms), so a wrong atomic gradient could hide inside the full one's tolerance
LOSS_ATOMIC = dict(LOSS, start_pref_dos=0.0, limit_pref_dos=0.0, start_pref_cdf=0.0,
                   limit_pref_cdf=0.0)
TERMS = ["dos", "cdf", "ados", "acdf"]
DP = os.path.join(os.path.dirname(sys.executable), "dp")


def clean(x):
    """JSON-safe: NaN → "nan", numpy/torch scalars → float."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, torch.Tensor):
        x = x.detach().numpy()
    if isinstance(x, np.ndarray):
        return clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        return "nan" if math.isnan(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def dump(path, obj):
    with open(path, "w") as fh:
        json.dump(clean(obj), fh, indent=1)
        fh.write("\n")


# ---------------------------------------------------------------- data

def load(frames):
    data = D.load(CASE, frames)
    rng = np.random.default_rng(CASE["label_seed"])
    nf, n = data["coord"].shape[:2]
    k = np.arange(NDOS)
    shape = np.stack([np.exp(-0.5 * ((k - c) / w) ** 2) + f for c, w, f in
                      zip(LABELS["centre"], LABELS["width"], LABELS["floor"])])  # [nt, ndos]
    base = (np.array(LABELS["amp"])[:, None] * shape)[data["atype"]]  # [n, ndos]
    atom = base[None] * rng.lognormal(0.0, LABELS["atom_lognormal_sigma"], (nf, n, NDOS))
    dos = atom.sum(1) + rng.normal(0.0, LABELS["global_noise_sigma"], (nf, NDOS))
    return {"atype": data["atype"], "coord": data["coord"], "box": data["box"],
            "dos": dos, "atom_dos": atom}


def subset(data, idx):
    return {k: (v if k == "atype" else v[idx]) for k, v in data.items()}


def write_system(path, data, labels=("dos", "atom_dos")):
    """The frames as a deepmd/npy system with the chosen label files."""
    os.makedirs(os.path.join(path, "set.000"))
    nf, n = data["coord"].shape[:2]
    with open(os.path.join(path, "type_map.raw"), "w") as fh:
        fh.write("".join(f"{t}\n" for t in CASE["type_map"]))
    with open(os.path.join(path, "type.raw"), "w") as fh:
        fh.write("".join(f"{t}\n" for t in data["atype"]))
    s = os.path.join(path, "set.000")
    np.save(os.path.join(s, "box.npy"), data["box"].reshape(nf, 9))
    np.save(os.path.join(s, "coord.npy"), data["coord"].reshape(nf, -1))
    if "dos" in labels:
        np.save(os.path.join(s, "dos.npy"), data["dos"].reshape(nf, NDOS))
    if "atom_dos" in labels:
        np.save(os.path.join(s, "atom_dos.npy"), data["atom_dos"].reshape(nf, n * NDOS))


def loss_obj(lpar):
    """DOSLoss as `dp train` builds it (training.py get_loss)."""
    from deepmd.pt.loss.dos import DOSLoss

    kw = {k: v for k, v in lpar.items() if k != "type"}
    return DOSLoss(starter_learning_rate=D.START_LR, numb_dos=NDOS, **kw)


def loader_sample(data, labels, lpar=LOSS):
    """DeePMD-kit's own statistics sample (`dp train`'s path): DpLoaderSet with the loss's label
    requirement, make_stat_input, one batch of all frames."""
    from deepmd.pt.utils.dataloader import DpLoaderSet
    from deepmd.pt.utils.stat import make_stat_input

    nf, n = data["coord"].shape[:2]
    with tempfile.TemporaryDirectory() as tmp:
        sysdir = os.path.join(tmp, "sys")
        write_system(sysdir, data, labels)
        loader = DpLoaderSet([sysdir], batch_size=nf, type_map=CASE["type_map"], shuffle=False)
        loader.add_data_requirement(loss_obj(lpar).label_requirement)
        sampled = make_stat_input(loader.systems, loader.dataloaders, 1)
    assert len(sampled) == 1
    s = sampled[0]
    info = {"find_dos": float(s["find_dos"]), "find_atom_dos": float(s["find_atom_dos"]),
            "dos_shape": list(s["dos"].shape), "atom_dos_shape": list(s["atom_dos"].shape),
            "dtype": str(s["dos"].dtype)}
    if "dos" in labels:
        assert np.array_equal(np.asarray(s["dos"]).reshape(nf, NDOS), data["dos"])
    if "atom_dos" in labels:
        assert np.array_equal(np.asarray(s["atom_dos"]).reshape(nf, n, NDOS), data["atom_dos"])
    return sampled, info


# ---------------------------------------------------------------- model

def check_argcheck_defaults(params):
    """get_model on the parameters as given and on `dp train`'s normalised ones: same model."""
    from deepmd.dpmodel.model.model import get_model
    from deepmd.utils.argcheck import normalize

    inp = {"model": copy.deepcopy(params), "loss": dict(LOSS),
           "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5,
                             "decay_steps": 100},
           "training": {"training_data": {"systems": ["x"], "batch_size": 1}, "numb_steps": 1}}
    norm = normalize(inp)
    strip = lambda d: ({k: strip(v) for k, v in d.items() if k not in ("@variables",)}
                       if isinstance(d, dict) else
                       [strip(v) for v in d] if isinstance(d, list) else
                       None if isinstance(d, np.ndarray) else d)
    a = strip(get_model(copy.deepcopy(params)).serialize())
    b = strip(get_model({k: copy.deepcopy(norm["model"][k])
                         for k in ("type_map", "descriptor", "fitting_net")}).serialize())
    assert a == b, "the model of the input differs from dp train's"
    return norm


def pt_get_model(params):
    from deepmd.pt.model.model import get_model

    return get_model(copy.deepcopy(params)).to(torch.float64)


def with_stats(ser, bias, std):
    s = copy.deepcopy(ser)
    s["@variables"]["out_bias"] = bias
    s["@variables"]["out_std"] = std
    return s


def deepmd_stats(ser, data, labels):
    """compute_or_load_out_stat of a fresh atomic model (out_bias 0, out_std 1) on DeePMD-kit's
    sample of a system holding `labels`."""
    nt = len(CASE["type_map"])
    fresh = with_stats(ser, np.zeros((1, nt, NDOS)), np.ones((1, nt, NDOS)))
    pt = D.pt_model(fresh)
    sampled, info = loader_sample(data, labels)
    pt.atomic_model.compute_or_load_out_stat(sampled)
    am = pt.atomic_model
    return (am.out_bias.detach().numpy().copy(), am.out_std.detach().numpy().copy(), info,
            {"rcond": am.rcond, "distinguish_types": am.get_compute_stats_distinguish_types(),
             "intensive": am.get_intensive(), "preset_out_bias": am.preset_out_bias,
             "bias_keys": am.bias_keys})


def numpy_stats(data):
    """The statistics written out: global (lstsq, minimum norm, rcond None; std of the residual,
    population, over frames; tiled over types) and atomic (per type mean and population std
    over all atoms of the type in all frames)."""
    nt = len(CASE["type_map"])
    nf = data["coord"].shape[0]
    cnt = np.tile(np.bincount(data["atype"], minlength=nt), (nf, 1)).astype(np.float64)
    b, *_ = np.linalg.lstsq(cnt, data["dos"], rcond=None)
    res = data["dos"] - cnt @ b
    g_bias, g_std = b, np.tile(res.std(axis=0), (nt, 1))
    a_bias = np.stack([data["atom_dos"][:, data["atype"] == t].reshape(-1, NDOS).mean(0)
                       for t in range(nt)])
    a_std = np.stack([data["atom_dos"][:, data["atype"] == t].reshape(-1, NDOS).std(0)
                      for t in range(nt)])
    return {"global": (g_bias, g_std), "atomic": (a_bias, a_std)}


def make_model(ev):
    params = {"type_map": CASE["type_map"], "descriptor": CASE["descriptor"],
              "fitting_net": CASE["fitting"]}
    check_argcheck_defaults(params)
    nt = len(CASE["type_map"])
    pt = pt_get_model(params)
    again = pt_get_model(params)
    for (k, a), (_, b) in zip(pt.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    _, dser = D.make_model(CASE, {"atype": ev["atype"], "energy": np.zeros(len(ev["coord"]))})
    ser = pt.serialize()
    ser["descriptor"] = dser["descriptor"]
    situations = {"a_global_only": ("dos",), "b_atomic_only": ("atom_dos",),
                  "c_both": ("dos", "atom_dos")}
    hand = numpy_stats(ev)
    stats = {}
    switches = None
    for key, labels in situations.items():
        bias, std, info, switches = deepmd_stats(ser, ev, labels)
        assert bias.shape == (1, nt, NDOS) and std.shape == (1, nt, NDOS)
        hb, hs = hand["global"] if key == "a_global_only" else hand["atomic"]
        stats[key] = {"label_files": list(labels), "sample": info,
                      "out_bias": bias, "out_std": std,
                      "numpy_formula": "global" if key == "a_global_only" else "atomic",
                      "numpy_bias_max_abs_diff": float(np.abs(bias[0] - hb).max()),
                      "numpy_std_max_abs_diff": float(np.abs(std[0] - hs).max())}
    chosen = stats["a_global_only"]
    ser = with_stats(ser, chosen["out_bias"], chosen["out_std"])
    # the global-only bias: rank-1 least squares (one composition) → minimum-norm solution,
    # proportional to the type counts
    cnt = np.bincount(ev["atype"], minlength=nt).astype(np.float64)
    mean_dos = ev["dos"].mean(0)
    stats["a_global_only"]["minimum_norm_check_max_abs"] = float(np.abs(
        chosen["out_bias"][0] - cnt[:, None] * mean_dos[None] / (cnt @ cnt)).max())
    stats["c_equals_b"] = bool(
        np.array_equal(stats["c_both"]["out_bias"], stats["b_atomic_only"]["out_bias"])
        and np.array_equal(stats["c_both"]["out_std"], stats["b_atomic_only"]["out_std"]))
    stats["atomic_model_switches"] = switches
    stats["used_in_model_yaml"] = "a_global_only"
    return params, ser, stats


# ---------------------------------------------------------------- eval

def inputs(data):
    nf = data["coord"].shape[0]
    return {"coord": torch.tensor(data["coord"].reshape(nf, -1), dtype=torch.float64),
            "atype": torch.tensor(np.tile(data["atype"], (nf, 1)), dtype=torch.int64),
            "box": torch.tensor(data["box"].reshape(nf, 9), dtype=torch.float64)}


def pt_eval(pt, data, train=False):
    pt.train(train)
    return pt(**inputs(data))


def dp_eval(dp, data):
    nf = data["coord"].shape[0]
    return dp(data["coord"].reshape(nf, -1, 3), np.tile(data["atype"], (nf, 1)),
              box=data["box"].reshape(nf, 3, 3))


def deep_dos(pth, data):
    from deepmd.infer.deep_dos import DeepDOS

    nf = data["coord"].shape[0]
    dp = DeepDOS(pth)
    out = dp.eval(data["coord"].reshape(nf, -1), data["box"].reshape(nf, 9), data["atype"],
                  atomic=True)
    return (np.asarray(out[0]).reshape(nf, NDOS), np.asarray(out[1]).reshape(nf, -1, NDOS),
            {"numb_dos": dp.numb_dos, "n_outputs_atomic": len(out)})


def out_stat_application(ser, data, pred_atom):
    """atom_dos against the fitting net's own output (out_bias 0, out_std 1)."""
    raw = with_stats(ser, np.zeros_like(ser["@variables"]["out_bias"]),
                     np.ones_like(ser["@variables"]["out_std"]))
    r = pt_eval(D.pt_model(raw), data)["atom_dos"].detach().numpy()
    b, s = ser["@variables"]["out_bias"][0], ser["@variables"]["out_std"][0]
    t = data["atype"]
    return {
        "fit_plus_bias_max_abs": float(np.abs(r + b[t] - pred_atom).max()),
        "fit_times_std_plus_bias_max_abs": float(np.abs(r * s[t] + b[t] - pred_atom).max()),
        "fit_output_first_atom_frame0": r[0, 0].tolist(),
    }


def strip_log(text):
    """DeePMD-kit's log lines without the time/level prefix."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^.*?DEEPMD (INFO|WARNING)\s+(.*)$", line)
        if m:
            out.append(m.group(2))
    return out


def dp_test(pth, data, tmp):
    """`dp test` on the .pth (without and with -a): log lines and detail files."""
    sysdir = os.path.join(tmp, "test_sys")
    write_system(sysdir, data)
    res = {}
    for tag, extra in [("plain", []), ("atomic", ["-a"])]:
        wd = os.path.join(tmp, f"test_{tag}")
        os.makedirs(wd)
        p = subprocess.run([DP, "--pt", "test", "-m", pth, "-s", sysdir, "-d", "detail"]
                           + extra, cwd=wd, check=True, capture_output=True, text=True)
        log = strip_log(p.stdout + p.stderr)
        files = {}
        for f in sorted(os.listdir(wd)):
            with open(os.path.join(wd, f)) as fh:
                head = fh.readline().rstrip("\n")
            arr = np.loadtxt(os.path.join(wd, f))
            files[f] = {"header_line": head.replace(sysdir, "<system>"),
                        "shape": list(arr.shape)}
        res[tag] = {"command": f"dp --pt test -m model.pth -s <system> -d detail"
                    + "".join(f" {e}" for e in extra),
                    "log": [l.replace(sysdir, "<system>") for l in log], "files": files}
        # the numbers: mae/rmse over all frames and channels of the PT model's prediction
        if tag == "atomic":
            first = np.loadtxt(os.path.join(wd, "detail.ados.out.0"))
            res[tag]["ados_frame0_rows_are_atom_major"] = bool(np.array_equal(
                first[:, 0], data["atom_dos"][0].reshape(-1)))
    return res


def expected_dp_test(dos, ados, data):
    n = data["coord"].shape[1]
    d = dos - data["dos"]
    a = ados - data["atom_dos"]
    mae, rmse = float(np.abs(d).mean()), float(np.sqrt((d * d).mean()))
    return {"mae_dos": mae, "rmse_dos": rmse, "mae_dosa": mae / n, "rmse_dosa": rmse / n,
            "mae_ados": float(np.abs(a).mean()), "rmse_ados": float(np.sqrt((a * a).mean()))}


# ---------------------------------------------------------------- dp train

def dp_train(params, data, lpar, tmp, tag):
    """One step of `dp --pt train` on the frames (both label files present); lcurve.out and the
    out_bias / out_std stored in the checkpoint."""
    wd = os.path.join(tmp, f"train_{tag}")
    os.makedirs(wd)
    write_system(os.path.join(wd, "sys"), data)
    inp = {"model": copy.deepcopy(params), "loss": dict(lpar),
           "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5,
                             "decay_steps": 100},
           "training": {"training_data": {"systems": ["sys"], "batch_size": 1},
                        "validation_data": {"systems": ["sys"], "batch_size": 1,
                                            "numb_btch": 1},
                        "numb_steps": 1, "seed": 1, "disp_freq": 1, "save_freq": 1}}
    with open(os.path.join(wd, "input.json"), "w") as fh:
        json.dump(inp, fh)
    env = dict(os.environ, OMP_NUM_THREADS="1", DP_INTRA_OP_PARALLELISM_THREADS="1",
               DP_INTER_OP_PARALLELISM_THREADS="1")
    p = subprocess.run([DP, "--pt", "train", "input.json"], cwd=wd, check=True,
                       capture_output=True, text=True, env=env)
    with open(os.path.join(wd, "lcurve.out")) as fh:
        lcurve = fh.read().splitlines()
    ck = sorted(glob.glob(os.path.join(wd, "model.ckpt-*.pt")))[-1]
    sd = torch.load(ck, map_location="cpu", weights_only=False)["model"]
    bias = next(v for k, v in sd.items() if k.endswith("atomic_model.out_bias"))
    std = next(v for k, v in sd.items() if k.endswith("atomic_model.out_std"))
    rmse_lines = [l for l in strip_log(p.stdout + p.stderr) if "RMSE of" in l]
    return {"loss": lpar, "lcurve_out": lcurve, "stat_log": rmse_lines,
            "out_bias": bias.numpy(), "out_std": std.numpy()}


# ---------------------------------------------------------------- train step

def prefs(lpar):
    coef = D.LR / D.START_LR
    return {t: lpar["limit_pref_" + t] + (lpar["start_pref_" + t] - lpar["limit_pref_" + t])
            * coef for t in TERMS}


def active(lpar):
    """DOSLoss's has_*: a term exists only if both its start and limit prefactors are nonzero."""
    return {t: lpar["start_pref_" + t] != 0.0 and lpar["limit_pref_" + t] != 0.0 for t in TERMS}


def label_dict(data, find_atom=1.0):
    return {"dos": torch.tensor(data["dos"]), "atom_dos": torch.tensor(data["atom_dos"]),
            "find_dos": 1.0, "find_atom_dos": find_atom}


def loss_fn(pt, data, lpar, find_atom=1.0):
    n = data["coord"].shape[1]
    pt.train(True)
    pred, loss, more = loss_obj(lpar)(inputs(data), pt, label_dict(data, find_atom), n, D.LR)
    return loss, pred, more


def param_grads(pt, names):
    return {names[k]: (np.zeros(tuple(p.shape)) if p.grad is None
                       else p.grad.detach().numpy().copy())
            for k, p in pt.named_parameters() if k in names}


def grads(pt, data, lpar, names, find_atom=1.0):
    pt.zero_grad(set_to_none=True)
    loss, pred, more = loss_fn(pt, data, lpar, find_atom)
    loss.backward()
    mdt = {k: (str(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__)
           for k, v in more.items()}
    more = {k: float(v) for k, v in more.items()}
    return float(loss.detach()), more, mdt, param_grads(pt, names)


def hand_terms(dos, ados, data, xp):
    """The four mean squared errors: global dos, global cdf (cumsum over channels), atomic dos,
    atomic cdf; each a plain mean over all its elements."""
    y, ya = data["dos"], data["atom_dos"]
    cs = (lambda a: np.cumsum(a, axis=-1)) if xp is np else (lambda a: torch.cumsum(a, dim=-1))
    if xp is not np:
        y, ya = torch.tensor(y), torch.tensor(ya)
    return {"dos": ((dos - y) ** 2).mean(), "cdf": ((cs(dos) - cs(y)) ** 2).mean(),
            "ados": ((ados - ya) ** 2).mean(), "acdf": ((cs(ados) - cs(ya)) ** 2).mean()}


def hand_loss_numpy(dos, ados, data, lpar):
    p, on = prefs(lpar), active(lpar)
    n = data["coord"].shape[1]
    l2 = hand_terms(dos, ados, data, np)
    loss = sum(p[t] * l2[t] for t in TERMS if on[t])
    more = {}
    for t, key in [("ados", "local_dos"), ("acdf", "local_cdf"), ("dos", "global_dos"),
                   ("cdf", "global_cdf")]:
        if on[t]:
            more[f"l2_{key}_loss"] = l2[t]
            more[f"rmse_{key}"] = math.sqrt(l2[t]) / (n if t in ("dos", "cdf") else 1)
    return float(loss), {k: float(v) for k, v in more.items()}, {t: float(v) for t, v in l2.items()}


def hand_grads(pt, data, lpar, names):
    """hand_loss_numpy's formula in torch (float64 throughout) on the PT model's outputs."""
    p, on = prefs(lpar), active(lpar)
    pt.zero_grad(set_to_none=True)
    r = pt_eval(pt, data, train=True)
    l2 = hand_terms(r["dos"], r["atom_dos"], data, torch)
    loss = sum(p[t] * l2[t] for t in TERMS if on[t])
    loss.backward()
    return float(loss.detach()), param_grads(pt, names)


def fd_check(pt, data, lpar, names, g, key, label, h=1e-4):
    return D.fd_largest(pt, names, g, key, label,
                        lambda: float(loss_fn(pt, data, lpar)[0].detach()), h)


# ---------------------------------------------------------------- main

def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    nt = len(CASE["type_map"])
    ev = load(CASE["eval_frames"])
    tr = subset(ev, [CASE["eval_frames"].index(f) for f in CASE["train_frames"]])
    nf, n = ev["coord"].shape[:2]
    params, ser, stats = make_model(ev)
    dump(os.path.join(OUT, "input.json"), {"model": params})
    yaml_path = os.path.join(OUT, "model.yaml")
    save_dp_model(yaml_path, {"model": ser, "model_def_script": params, "backend": "dpmodel",
                              "software": "deepmd-kit", "version": deepmd.__version__})
    # the descriptor is property_water's (same construction)
    pw = os.path.join(os.path.dirname(OUT), "property_water", "model.yaml")
    same_desc = None
    if os.path.exists(pw):
        o = load_dp_model(pw)["model"]["descriptor"]
        same_desc = D.array_diff(ser["descriptor"], o)
    pt = D.pt_model(ser)
    dp = D.dp_model(ser)
    r = pt_eval(pt, ev)
    pt_keys = sorted(r)
    dos = r["dos"].detach().numpy().reshape(nf, NDOS)
    ados = r["atom_dos"].detach().numpy().reshape(nf, n, NDOS)
    npd = dp_eval(dp, ev)
    dp_keys = sorted(npd)
    ddos = np.asarray(npd["dos"]).reshape(nf, NDOS)
    dados = np.asarray(npd["atom_dos"]).reshape(nf, n, NDOS)
    with tempfile.TemporaryDirectory() as tmp:
        pth = os.path.join(tmp, "model.pth")
        back = os.path.join(tmp, "back.yaml")
        for a, b in [(yaml_path, pth), (pth, back)]:
            subprocess.run([DP, "convert-backend", a, b], check=True, capture_output=True)
        roundtrip = D.yaml_roundtrip_diff(ser, back)
        idos, iados, iinfo = deep_dos(pth, ev)
        dptest = dp_test(pth, ev, tmp)
        trains = {"full_loss": dp_train(params, ev, LOSS, tmp, "full"),
                  "global_loss": dp_train(params, ev, LOSS_GLOBAL, tmp, "global")}
    for v in trains.values():
        for key in ("c_both", "a_global_only"):
            v[f"out_bias_max_abs_diff_vs_{key}"] = float(
                np.abs(v["out_bias"] - stats[key]["out_bias"]).max())
            v[f"out_std_max_abs_diff_vs_{key}"] = float(
                np.abs(v["out_std"] - stats[key]["out_std"]).max())
    np.savez(os.path.join(OUT, "eval.npz"), coord=ev["coord"].reshape(nf, -1),
             box=ev["box"].reshape(nf, 9), atype=ev["atype"], dos_label=ev["dos"],
             atom_dos_label=ev["atom_dos"], dos=dos, atom_dos=ados, dos_dpmodel=ddos,
             atom_dos_dpmodel=dados)
    fit_ser = ser["fitting"]
    meta = {
        "generator": "scripts/make-reference/dos.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": CASE["system"],
        "frames": CASE["eval_frames"],
        "pbc": True,
        "atom_order": "type.raw's (the system is sorted by type already)",
        "type_map": CASE["type_map"],
        "natoms": n,
        "natoms_per_type": np.bincount(ev["atype"], minlength=nt).tolist(),
        "descriptor": CASE["descriptor"],
        "descriptor_max_abs_diff_vs_property_water": same_desc,
        "davg_dstd": "by hand, as fparam.py / descriptors.py's water cases",
        "fitting": CASE["fitting"],
        "fitting_serialized": {k: fit_ser[k] for k in (
            "type", "var_name", "dim_out", "mixed_types", "neuron", "resnet_dt", "precision",
            "activation_function", "rcond") if k in fit_ser},
        "fitting_bias_atom_e_all_zero": bool(np.all(fit_ser["@variables"]["bias_atom_e"] == 0)),
        "output_keys": {"global": "dos", "atomic": "atom_dos", "pt_forward_keys": pt_keys,
                        "dpmodel_call_keys": dp_keys},
        "label_source": {"seed": CASE["label_seed"], **LABELS, "how": (
            "rng = default_rng(seed); shape[t][k] = exp(-((k - centre_t)/width_t)^2/2) + floor_t;"
            " atom_dos[f, i, k] = amp[t_i] * shape[t_i][k] * rng.lognormal(0, sigma, (nf, n, 8))"
            "; dos = atom_dos.sum(atoms) + rng.normal(0, global_noise_sigma, (nf, 8))")},
        "global_minus_sum_of_atomic_labels": (ev["dos"] - ev["atom_dos"].sum(1)).tolist(),
        "stats": stats,
        "out_bias": stats["a_global_only"]["out_bias"],
        "out_std": stats["a_global_only"]["out_std"],
        "stats_formulas": {
            "a_global_only": "compute_stats_from_redu (stats_distinguish_types true, intensive "
            "false, rcond None, no preset bias): out_bias = np.linalg.lstsq(natoms_per_type "
            "[nf, ntypes], dos [nf, 8], rcond=None) (minimum-norm; here rank 1, one "
            "composition, so out_bias[t] = n_t * mean_f(dos) / sum_t n_t^2); out_std = "
            "population std over frames of dos - natoms_per_type @ out_bias, one [8] row tiled "
            "over types",
            "b_atomic_only": "compute_stats_from_atomic: out_bias[t] = mean of atom_dos over "
            "every atom of type t in every frame, out_std[t] = population std of the same "
            "(per channel)",
            "c_both": "the atomic statistics win wherever they exist (the global ones only fill "
            "types that no atomic label covers, then nan_to_num): equal to (b) here",
        },
        "dos": dos.tolist(),
        "dos_dpmodel": ddos.tolist(),
        "atom_dos_frame0_first4": ados[0, :4].tolist(),
        "checks": {
            "pt_vs_dpmodel_dos_max_rel": D.rel(dos, ddos),
            "pt_vs_dpmodel_atom_dos_max_rel": D.rel(ados, dados),
            "pt_vs_deepdos_pth_max_rel": D.rel(dos, idos),
            "pt_vs_deepdos_pth_atom_max_rel": D.rel(ados, iados),
            "deepdos": iinfo,
            "reduction": "sum over atoms",
            "reduction_of_atom_dos_max_abs": float(np.abs(ados.sum(1) - dos).max()),
            "out_stat_application": out_stat_application(ser, ev, ados),
            "yaml_to_pth_to_yaml_max_abs_param_diff": roundtrip,
        },
        "dp_test": dict(dptest, expected=expected_dp_test(idos, iados, ev), formulas={
            "mae_dos": "mean |pred - label| over frames and channels",
            "rmse_dos": "sqrt(mean (pred - label)^2) over frames and channels",
            "mae_dosa / rmse_dosa": "mae_dos / natoms, rmse_dos / natoms",
            "mae_ados / rmse_ados": "over frames, atoms and channels (only with -a; per "
            "system only, not in the weighted average)",
            "weighted average over systems": "mae: sum(mae*size)/sum(size); rmse: "
            "sqrt(sum(rmse^2*size)/sum(size)), size = number of elements (nframes*numb_dos; "
            "for ados nframes*natoms*numb_dos)",
            "detail files": "<detail>.dos.out.<frame> (one per frame; numb_dos rows 'data_dos "
            "pred_dos'), with -a also <detail>.ados.out.<frame> (natoms*numb_dos rows, atom "
            "major, 'data_ados pred_ados'); header '<system> - <frame>: data_<q> pred_<q>'; "
            "np.savetxt %.18e"}),
        "dp_train_one_step": trains,
    }
    dump(os.path.join(OUT, "eval.json"), meta)
    print("stats:", json.dumps(clean({k: {"bias_t0_t1_ch0": v["out_bias"][0, :, 0],
                                          "std_t0_ch0": v["out_std"][0, 0, 0]}
                                      for k, v in stats.items() if isinstance(v, dict)
                                      and "out_bias" in v})), flush=True)
    print("checks:", json.dumps(clean({k: v for k, v in meta["checks"].items()
                                       if isinstance(v, float)})), flush=True)

    # ---- train step
    names = D.dpw_names(pt, ser)
    ntr = tr["coord"].shape[0]
    tp = pt_eval(pt, tr, train=True)
    tdos = tp["dos"].detach().numpy().reshape(ntr, NDOS)
    tados = tp["atom_dos"].detach().numpy().reshape(ntr, n, NDOS)
    l1, more1, mdt1, g1 = grads(pt, tr, LOSS, names)
    l2, more2, mdt2, g2 = grads(pt, tr, LOSS_GLOBAL, names)
    l3, more3, _, g3 = grads(pt, tr, LOSS, names, find_atom=0.0)
    h1, hm1, hl2_1 = hand_loss_numpy(tdos, tados, tr, LOSS)
    h2, hm2, _ = hand_loss_numpy(tdos, tados, tr, LOSS_GLOBAL)
    l4, more4, mdt4, g4 = grads(pt, tr, LOSS_ATOMIC, names)
    h4, hm4, _ = hand_loss_numpy(tdos, tados, tr, LOSS_ATOMIC)
    t4, hg4 = hand_grads(pt, tr, LOSS_ATOMIC, names)
    t1, hg1 = hand_grads(pt, tr, LOSS, names)
    t2, hg2 = hand_grads(pt, tr, LOSS_GLOBAL, names)
    arrays = {"coord": tr["coord"].reshape(ntr, -1), "box": tr["box"].reshape(ntr, 9),
              "atype": tr["atype"], "dos_label": tr["dos"], "atom_dos_label": tr["atom_dos"],
              "dos": tdos, "atom_dos": tados}
    for k in sorted(g1):
        arrays["grad." + k] = g1[k]
    for k in sorted(g2):
        arrays["grad_global." + k] = g2[k]
    for k in sorted(g4):
        arrays["grad_atomic." + k] = g4[k]
    for k in sorted(hg1):
        arrays["grad_f64." + k] = hg1[k]
    fit0 = "fit.t0.layer0.w"
    fitlast = sorted(k for k in g1 if k.startswith("fit.t1") and k.endswith(".w"))[-1]
    emb0 = "embed.t0.layer0.w"
    fds = []
    for key in [fit0, emb0, fitlast]:
        fds.append(fd_check(pt, tr, LOSS, names, g1, key, "loss (all four terms)"))
        fds.append(fd_check(pt, tr, LOSS_GLOBAL, names, g2, key, "loss_global (dos, cdf)"))
        fds.append(fd_check(pt, tr, LOSS_ATOMIC, names, g4, key, "loss_atomic (ados, acdf)"))
    tmeta = {
        "generator": "scripts/make-reference/dos.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU; DOSLoss, loss.backward()",
        "system": CASE["system"],
        "frames": CASE["train_frames"],
        "natoms": n,
        "loss": LOSS,
        "loss_global": LOSS_GLOBAL,
        "loss_atomic": LOSS_ATOMIC,
        "start_lr": D.START_LR,
        "lr": D.LR,
        "prefactors": prefs(LOSS),
        "prefactors_global": prefs(LOSS_GLOBAL),
        "prefactors_atomic": prefs(LOSS_ATOMIC),
        "active_terms": active(LOSS),
        "active_terms_global": active(LOSS_GLOBAL),
        "active_terms_atomic": active(LOSS_ATOMIC),
        "loss_formula": (
            "coef = lr/start_lr; pref_X = limit_pref_X + (start_pref_X - limit_pref_X)*coef, X in"
            " dos, cdf, ados, acdf; a term exists only if start_pref_X != 0 and limit_pref_X !="
            " 0 (DOSLoss has_X) and its label is in the label dict, and its prefactor is "
            "multiplied by find_dos / find_atom_dos. l2_dos = mean over frames*8 of (dos_pred - "
            "dos_label)^2; l2_cdf = the same of cumsum over channels; l2_ados = mean over "
            "frames*natoms*8 of (atom_dos_pred - atom_dos_label)^2 (masked_atom_mean: sum / "
            "(8 * number of real atoms), the mask all ones here); l2_acdf = the same of the "
            "per-atom cumsum over channels. loss = pref_ados*l2_ados + pref_acdf*l2_acdf + "
            "pref_dos*l2_dos + pref_cdf*l2_cdf (accumulated in that order). No division by "
            "natoms anywhere in the loss."),
        "display_formula": (
            "more_loss: l2_local_dos_loss = l2_ados, rmse_local_dos = sqrt(l2_ados), "
            "l2_local_cdf_loss = l2_acdf, rmse_local_cdf = sqrt(l2_acdf), l2_global_dos_loss = "
            "l2_dos, rmse_global_dos = sqrt(l2_dos)/atom_num, l2_global_cdf_loss = l2_cdf, "
            "rmse_global_cdf = sqrt(l2_cdf)/atom_num, atom_num = mean over frames of "
            "float32(sum of the atom mask) (masked_atom_num with torch.float32) -- the only "
            "float32 quantity, display only (192 is exact in float32); a display value is NaN "
            "when its find_* is 0. The trainer drops every key containing 'l2_' and writes the "
            "rest sorted by name to lcurve.out, each as <key>_val <key>_trn (or only <key>_trn "
            "without validation data), then lr."),
        "loss_value": l1,
        "more_loss": more1,
        "more_loss_dtypes": mdt1,
        "l2_terms": hl2_1,
        "loss_value_global": l2,
        "more_loss_global": more2,
        "more_loss_global_dtypes": mdt2,
        "loss_value_atomic": l4,
        "more_loss_atomic": more4,
        "more_loss_atomic_dtypes": mdt4,
        "grad_minus_grad_global_minus_grad_atomic_max_abs": max(
            float(np.abs(g1[k] - g2[k] - g4[k]).max()) for k in g1),
        "grad_atomic_max_abs_over_grad_max_abs": max(float(np.abs(g4[k]).max()) for k in g4)
        / max(float(np.abs(g1[k]).max()) for k in g1),
        "atom_dos_missing": {
            "what": "the full loss with find_atom_dos 0 (atom_dos zeros, as the loader fills "
                    "a missing optional label): the atomic terms get prefactor 0 and display "
                    "NaN",
            "loss_value": l3, "more_loss": more3,
            "loss_minus_loss_global": l3 - l2,
            "grad_max_abs_diff_vs_grad_global": max(float(np.abs(g3[k] - g2[k]).max())
                                                    for k in g2)},
        "lcurve_columns": {
            "full_loss": sorted(k for k in more1 if "l2_" not in k),
            "global_loss": sorted(k for k in more2 if "l2_" not in k),
            "atomic_loss": sorted(k for k in more4 if "l2_" not in k)},
        "hand_written_loss": {
            "loss": {"value_numpy": h1, "value_torch_f64": t1, "more_loss_numpy": hm1,
                     "value_minus_deepmd": h1 - l1,
                     "more_loss_max_abs_diff": max(abs(hm1[k] - more1[k]) for k in more1),
                     "grad_f64_vs_deepmd_max_rel": D.grad_rel_diff(hg1, g1)},
            "loss_global": {"value_numpy": h2, "value_torch_f64": t2, "more_loss_numpy": hm2,
                            "value_minus_deepmd": h2 - l2,
                            "more_loss_max_abs_diff": max(abs(hm2[k] - more2[k])
                                                          for k in more2),
                            "grad_f64_vs_deepmd_max_rel": D.grad_rel_diff(hg2, g2)},
            "loss_atomic": {"value_numpy": h4, "value_torch_f64": t4, "more_loss_numpy": hm4,
                            "value_minus_deepmd": h4 - l4,
                            "more_loss_max_abs_diff": max(abs(hm4[k] - more4[k])
                                                          for k in more4),
                            "grad_f64_vs_deepmd_max_rel": D.grad_rel_diff(hg4, g4)},
            "note": "no float32 quantity enters DOSLoss's loss (only the display divisor "
                    "atom_num is float32, and 192 is exact): grad_f64 equals grad to rounding",
        },
        "fd_param_checks": fds,
        "n_tensors": len(g1),
        "n_parameters": int(sum(v.size for v in g1.values())),
        "tensors": {k: list(v.shape) for k, v in sorted(g1.items())},
    }
    np.savez(os.path.join(OUT, "train_step.npz"), **arrays)
    dump(os.path.join(OUT, "train_step.json"), tmeta)
    print(f"loss {l1!r} (hand {h1!r}), global {l2!r} (hand {h2!r}), atomic {l4!r} "
          f"(hand {h4!r}); more {more1}; "
          f"{len(g1)} tensors; fd rel " + ", ".join(f"{c['rel_err']:.1e}" for c in fds),
          flush=True)


if __name__ == "__main__":
    main()

"""DeePMD-kit 3.2.0's own numbers for the `dipole` and `polar` fittings (fitting_net.type
"dipole" / "polar", loss.type "tensor").

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root:
`python scripts/make-reference/tensor.py [case ...]` (no argument: all six cases; 1-1.5
minutes a case on 2 cores: per case it also runs `dp train` for one step twice and `dp test`
twice). Writes tests/reference/fittings/<case>/{input.json, model.yaml, eval.npz, eval.json,
train_step.npz, train_step.json}; tests/reference/fittings/README.md describes them.

Cases on se_e2_a (property.py's water case: se_e2_a float64 with fparam.py's davg/dstd by hand,
DeePMD-kit's water frames 0, 1, 2; train frame 0; fitting neuron [16, 16, 16], resnet_dt, seed 1):
- dipole_water: `dipole` fitting, model-level `atom_exclude_types: [1]` (H), as DeePMD-kit's
  examples/water_tensor/dipole/dipole_input_torch.json.
- polar_water: `polar` fitting, fit_diag false, shift_diag true, scale [2.0, 0.5],
  atom_exclude_types [1].
- polar_water_diag: `polar` fitting, fit_diag true, shift_diag true, scale [1.5, 0.7], no
  exclusion.

Cases on the descriptors that give a rotation matrix besides se_e2_a (same frames, labels as
dipole_water's (seed 31), `dipole` fitting neuron [8, 8], resnet_dt, seed 1, one net for all
types (the descriptor mixes types), atom_exclude_types [1]; the descriptor made as the
descriptor's own script makes it, whose helpers are imported: dpa1.py, dpa2.py, dpa3.py):
- dipole_dpa1: se_atten (DPA-1) sel 40, rcut 4, neuron [4, 8], axis_neuron 4, tebd_dim 4
  concat, two attention layers (attn 8, attn_dotr), smooth_type_embedding, set_davg_zero false
  (davg/dstd by hand, dpa1.py's water values); rotation matrix of width neuron[-1] = 8.
- dipole_dpa2: dpa2, repinit as dpa2.py's cases, repformer 2 layers, g1_dim 8, g2_dim 6, the
  gated g2 self-attention (attn2) on; davg/dstd DeePMD-kit's own statistics; width g2_dim 6.
- dipole_dpa3: dpa3, repflow n_dim 8, e_dim 6, a_dim 4, 2 layers (dpa3.py's water geometry and
  defaults); width e_dim 6.
For these eval.npz also holds DeePMD-kit's descriptor output (`descriptor`) and rotation matrix
(`rot_mat` [nf, natoms, width, 3], frame atom order), from the dpmodel descriptor's `call` on
the model's own neighbour list; eval.json `rot_mat` checks it against the PyTorch descriptor and
against the formula written out in numpy from the descriptor block's last pair features
(`rot_mat_checks`), and says which normalisation matches.

Labels are drawn here (seeded): atomic `atom_<label>` [nf, natoms, 3 | 9] per type (polar:
symmetric, diagonal mean 5 for O, 1.5 for H) and global `<label>` [nf, 3 | 9] = the sum of the
atomic labels over the atoms the model predicts (not the excluded ones) plus noise. The excluded
type's atomic labels are deliberately not zero (DeePMD-kit's example data has zeros there), so
that the reference shows they are ignored by the loss (the model's mask).

- The fitting's weights are those of DeePMD-kit's PyTorch `get_model` (seeded); the descriptor
  is replaced by fparam.py's (dpmodel, seeded, davg/dstd by hand), as in property.py / dos.py
  (the DPA cases: by the one its script's make_model builds, see DESCRIPTORS).
- Output statistics (out_bias, out_std of the atomic model, [1, ntypes, 3 | 9]): DeePMD-kit's
  own `compute_or_load_out_stat` on DeePMD-kit's own statistics sample (`DpLoaderSet` with
  TensorLoss's label requirement + `make_stat_input` over a copy of the eval frames written as a
  DeePMD-kit system), wrapped by the atomic model's `_make_wrapped_sampler` (which adds
  `atom_exclude_types` to the sample, as `dp train`'s `compute_or_load_stat` does), in three
  situations: (a) the system holds only the global label file, (b) only the atomic one,
  (c) both. model.yaml carries (c), what `dp train` stores with the loss of the train step
  (checked by one step of `dp train`). Besides: the same numbers written out in numpy, and (a)
  without the wrapper (what the exclusion changes).
- eval: PyTorch model, dpmodel (numpy) beside it, DeepDipole / DeepPolar on the .pth that
  `dp convert-backend` made from model.yaml, the yaml -> .pth -> yaml round trip, an
  independent numpy forward of the fitting from DeePMD-kit's descriptor output (the formulas of
  the README), and `dp test` (with and without `-a`) on the .pth: its log lines and detail file.
- train step: DeePMD-kit PT's TensorLoss (as `dp train` builds it: tensor_name, tensor_size,
  label_name from the model) on frame 0 with both labels: pref 1, pref_atomic 1 (`grad.`),
  pref 1, pref_atomic 0 (`grad_global.`) and pref 0, pref_atomic 1 (`grad_atomic.`); the loss
  written out by hand (value in numpy, gradient by torch autograd of the hand-written float64
  formula: `grad_f64.`); finite differences of DeePMD-kit's loss for a few gradient elements.
"""

import copy
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import descriptors as D  # noqa: E402
# the DPA-1/2/3 descriptor cases (their descriptor dicts, davg/dstd and dpw's parameter names)
import dpa1  # noqa: E402
import dpa2  # noqa: E402  (imports dpa3, which replaces descriptors.pt_eval / loss_fn by
import dpa3  # noqa: E402   box-None-capable twins; tensor.py uses neither)
# JSON writing, DeePMD-kit log lines, and the PyTorch model's build, evaluation and gradients
from dos import (  # noqa: E402
    clean, dump, inputs, param_grads, pt_eval, pt_get_model, strip_log, subset, with_stats,
)

import deepmd  # noqa: E402
from deepmd.dpmodel.utils.serialization import load_dp_model, save_dp_model  # noqa: E402

ROOT = "tests/reference/fittings"
DP = os.path.join(os.path.dirname(sys.executable), "dp")
FIT = {"neuron": [16, 16, 16], "resnet_dt": True, "seed": 1, "precision": "float64"}
LOSS = {"type": "tensor", "pref": 1.0, "pref_atomic": 1.0}
LOSS_GLOBAL = {"type": "tensor", "pref": 1.0, "pref_atomic": 0.0}
# the atomic term alone: in LOSS the global term compares sums over 64-192 atoms and dominates
# the gradient, so a wrong atomic gradient could hide inside the full one's tolerance
LOSS_ATOMIC = {"type": "tensor", "pref": 0.0, "pref_atomic": 1.0}

# per kind: DeePMD-kit's names. `label` is the data/label key (dipole.npy, atomic_dipole.npy;
# TensorLoss's label_name), `tensor` TensorLoss's tensor_name = the PT model's atomic output key
# (global: "global_" + tensor), `size` the number of components.
KINDS = {
    "dipole": {"label": "dipole", "tensor": "dipole", "size": 3,
               "deep": "deepmd.infer.deep_dipole.DeepDipole"},
    "polar": {"label": "polarizability", "tensor": "polar", "size": 9,
              "deep": "deepmd.infer.deep_polar.DeepPolar"},
}

# drawn labels, per type (O, H): dipole: atom_dipole ~ normal(mean_t, sigma_t) per component;
# polar: atom_polarizability = diag_mean_t * I + S, S symmetric with entries ~ normal(0,
# sigma_t) (the upper triangle drawn, mirrored); global = sum over the predicted atoms of the
# atomic labels + noise (polar: symmetric noise).
LABELS = {
    "dipole": {"mean": [[0.05, -0.03, 0.02], [0.01, 0.02, -0.01]], "sigma": [0.15, 0.05],
               "global_noise_sigma": 0.3},
    "polar": {"diag_mean": [5.0, 1.5], "sigma": [0.5, 0.2], "global_noise_sigma": 2.0},
}


def case(kind, fitting, excl, seed, descriptor=None, base=D.WATER, fit=FIT):
    c = dict(base, descriptor=descriptor or D.se_a([46, 92], 6.0, True, 1), kind=kind,
             fitting=dict({"type": kind, **fitting}, **fit), atom_exclude_types=excl,
             label_seed=seed)
    return c


# The descriptors with a rotation matrix besides se_e2_a, small. sel / nsel: at least the most
# neighbours within each cut-off on water frames 0-2 (36 within 4.0 Å, 24 within 3.5 (DPA-3's
# e_sel 24 exactly), 13 within 3.0; checked and recorded in eval.json `neighbours`), so that no
# list is truncated.
FIT_SMALL = {"neuron": [8, 8], "resnet_dt": True, "seed": 1, "precision": "float64"}
DPA1 = dpa1.atten("se_atten", 40, 4.0, neuron=[4, 8], axis_neuron=4, attn=8, attn_layer=2,
                  attn_dotr=True, tebd_dim=4, smooth_type_embedding=True,
                  type_one_side=False, set_davg_zero=False)
DPA2 = dpa2.dpa2(dpa2.W_INIT, dpa2.W_FORM, None, {
    "g1_dim": 8, "g2_dim": 6, "update_g2_has_attn": True, "attn2_has_gate": True,
    "attn2_hidden": 7, "attn2_nhead": 3})
DPA3 = dpa3.dpa3(dpa3.WATER_GEOM, {"n_dim": 8, "e_dim": 6, "a_dim": 4, "nlayers": 2})


CASES = {
    "dipole_water": case("dipole", {}, [1], 31),
    "polar_water": case("polar", {"fit_diag": False, "shift_diag": True, "scale": [2.0, 0.5]},
                        [1], 37),
    "polar_water_diag": case("polar", {"fit_diag": True, "shift_diag": True,
                                       "scale": [1.5, 0.7]}, [], 41),
    "dipole_dpa1": case("dipole", {}, [1], 31, DPA1, dpa1.WATER, FIT_SMALL),
    "dipole_dpa2": case("dipole", {}, [1], 31, DPA2, D.WATER, FIT_SMALL),
    "dipole_dpa3": case("dipole", {}, [1], 31, DPA3, D.WATER, FIT_SMALL),
}

# per descriptor type (input.json's): the script whose make_model builds the descriptor
# (None: descriptors.py's), the dpmodel block whose last pair features make the rotation
# matrix, how davg/dstd are made, and the descriptor tensors whose gradient is also checked by
# finite differences (beside the fitting's first and last layer)
DESCRIPTORS = {
    "se_e2_a": {"script": None, "block": None,
                "davg_dstd": "by hand, as fparam.py / descriptors.py's water cases",
                "fd": ["embed.t0.layer0.w"]},
    "se_atten": {"script": dpa1, "block": "se_atten",
                 "davg_dstd": "by hand, dpa1.py's WATER (davg of the radial column [0.15, "
                 "0.17] per centre type, set_davg_zero false; dstd radial / angular [[0.12, "
                 "0.09], [0.11, 0.08]]), every slot equal",
                 "fd": ["tebd.layer0.w", "attn1.in.w"]},
    "dpa2": {"script": dpa2, "block": "repformers",
             "davg_dstd": "DeePMD-kit's own compute_input_stats on the eval frames, per block "
             "(dpa2.py make_model; set_davg_zero true in both: davg 0)",
             "fd": ["tebd.layer0.w", "layer0.attn2g_map.mapqk.w"]},
    "dpa3": {"script": dpa3, "block": "repflows",
             "davg_dstd": "fix_stat_std 0.3: DeePMD-kit's constant statistics (davg 0, dstd "
             "0.3); res_residual weights seeded random instead of DeePMD-kit's constants "
             "(dpa3.py make_model)",
             "fd": ["tebd.layer0.w", "layer1.edge_self_linear.w"]},
}


# ---------------------------------------------------------------- data

def load(c, frames):
    data = D.load(c, frames)
    rng = np.random.default_rng(c["label_seed"])
    nf, n = data["coord"].shape[:2]
    t = data["atype"]
    kept = ~np.isin(t, c["atom_exclude_types"])
    lab = LABELS[c["kind"]]
    if c["kind"] == "dipole":
        mean = np.array(lab["mean"])[t]  # [n, 3]
        sig = np.array(lab["sigma"])[t][:, None]
        atom = mean[None] + sig[None] * rng.standard_normal((nf, n, 3))
        glob_ = atom[:, kept].sum(1) + rng.normal(0.0, lab["global_noise_sigma"], (nf, 3))
    else:
        up = rng.standard_normal((nf, n, 3, 3))
        sym = np.triu(up) + np.swapaxes(np.triu(up, 1), -1, -2)
        atom = (np.array(lab["diag_mean"])[t][None, :, None, None] * np.eye(3)
                + np.array(lab["sigma"])[t][None, :, None, None] * sym).reshape(nf, n, 9)
        noise = rng.standard_normal((nf, 3, 3))
        noise = (np.triu(noise) + np.swapaxes(np.triu(noise, 1), -1, -2)).reshape(nf, 9)
        glob_ = atom[:, kept].sum(1) + lab["global_noise_sigma"] * noise
    return {"atype": t, "coord": data["coord"], "box": data["box"], "label": glob_,
            "atom_label": atom}


def write_system(path, data, c, labels=("global", "atomic")):
    """The frames as a deepmd/npy system; label files `<label>.npy` and `atomic_<label>.npy`
    (DeePMD-kit's documented names; its loader reads `atom_<label>.npy` as well)."""
    k = KINDS[c["kind"]]
    os.makedirs(os.path.join(path, "set.000"))
    nf, n = data["coord"].shape[:2]
    with open(os.path.join(path, "type_map.raw"), "w") as fh:
        fh.write("".join(f"{t}\n" for t in c["type_map"]))
    with open(os.path.join(path, "type.raw"), "w") as fh:
        fh.write("".join(f"{t}\n" for t in data["atype"]))
    s = os.path.join(path, "set.000")
    np.save(os.path.join(s, "box.npy"), data["box"].reshape(nf, 9))
    np.save(os.path.join(s, "coord.npy"), data["coord"].reshape(nf, -1))
    if "global" in labels:
        np.save(os.path.join(s, f"{k['label']}.npy"), data["label"].reshape(nf, k["size"]))
    if "atomic" in labels:
        np.save(os.path.join(s, f"atomic_{k['label']}.npy"),
                data["atom_label"].reshape(nf, n * k["size"]))


# ---------------------------------------------------------------- model

def model_params(c):
    p = {"type_map": c["type_map"], "descriptor": c["descriptor"], "fitting_net": c["fitting"]}
    if c["atom_exclude_types"]:
        p["atom_exclude_types"] = c["atom_exclude_types"]
    return p


def train_input(params, lpar, systems="x"):
    return {"model": copy.deepcopy(params), "loss": dict(lpar),
            "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-5,
                              "decay_steps": 100},
            "training": {"training_data": {"systems": [systems], "batch_size": 1},
                         "numb_steps": 1}}


def check_argcheck_defaults(params):
    """get_model on the parameters as given and on `dp train`'s normalised ones: same model."""
    from deepmd.dpmodel.model.model import get_model
    from deepmd.utils.argcheck import normalize

    norm = normalize(train_input(params, LOSS))
    strip = lambda d: ({k: strip(v) for k, v in d.items() if k not in ("@variables",)}
                       if isinstance(d, dict) else
                       [strip(v) for v in d] if isinstance(d, list) else
                       None if isinstance(d, np.ndarray) else d)
    a = strip(get_model(copy.deepcopy(params)).serialize())
    keys = ("type_map", "descriptor", "fitting_net", "atom_exclude_types")
    b = strip(get_model({k: copy.deepcopy(norm["model"][k]) for k in keys
                         if k in norm["model"]}).serialize())
    assert a == b, "the model of the input differs from dp train's"
    return norm


def loss_obj(pt, lpar):
    """TensorLoss as `dp train` builds it (training.py get_loss, loss.type "tensor")."""
    from deepmd.pt.loss.tensor import TensorLoss

    out = [k for k in pt.model_output_type() if k != "mask"]
    name = out[0]
    kw = {k: v for k, v in lpar.items() if k != "type"}
    return TensorLoss(tensor_name="polar" if name == "polarizability" else name,
                      tensor_size=pt.model_output_def()[name].output_size, label_name=name,
                      **kw)


def loader_sample(c, data, labels, pt):
    """DeePMD-kit's own statistics sample (`dp train`'s path): DpLoaderSet with the loss's label
    requirement, make_stat_input, one batch of all frames."""
    from deepmd.pt.utils.dataloader import DpLoaderSet
    from deepmd.pt.utils.stat import make_stat_input

    k = KINDS[c["kind"]]
    nf, n = data["coord"].shape[:2]
    with tempfile.TemporaryDirectory() as tmp:
        sysdir = os.path.join(tmp, "sys")
        write_system(sysdir, data, c, labels)
        loader = DpLoaderSet([sysdir], batch_size=nf, type_map=c["type_map"], shuffle=False)
        loader.add_data_requirement(loss_obj(pt, LOSS).label_requirement)
        sampled = make_stat_input(loader.systems, loader.dataloaders, 1)
    assert len(sampled) == 1
    s = sampled[0]
    lk, ak = k["label"], "atom_" + k["label"]
    info = {f"find_{lk}": float(s[f"find_{lk}"]), f"find_{ak}": float(s[f"find_{ak}"]),
            f"{lk}_shape": list(s[lk].shape), f"{ak}_shape": list(s[ak].shape),
            "dtype": str(s[lk].dtype)}
    if "global" in labels:
        assert np.array_equal(np.asarray(s[lk]).reshape(nf, -1), data["label"])
    if "atomic" in labels:
        assert np.array_equal(np.asarray(s[ak]).reshape(nf, n, -1), data["atom_label"])
    return sampled, info


def deepmd_stats(ser, c, data, labels, wrap=True):
    """compute_or_load_out_stat of a fresh atomic model (out_bias 0, out_std 1) on DeePMD-kit's
    sample of a system holding `labels`; with `wrap`, through the atomic model's
    _make_wrapped_sampler as compute_or_load_stat (dp train) does."""
    shape = ser["@variables"]["out_bias"].shape
    pt = D.pt_model(with_stats(ser, np.zeros(shape), np.ones(shape)))
    am = pt.atomic_model
    sampled, info = loader_sample(c, data, labels, pt)
    am.compute_or_load_out_stat(am._make_wrapped_sampler(lambda: sampled) if wrap else sampled)
    if wrap:
        info["sample_atom_exclude_types"] = sampled[0].get("atom_exclude_types")
    return (am.out_bias.detach().numpy().copy(), am.out_std.detach().numpy().copy(), info,
            {"rcond": am.rcond, "distinguish_types": am.get_compute_stats_distinguish_types(),
             "intensive": am.get_intensive(), "preset_out_bias": am.preset_out_bias,
             "bias_keys": am.bias_keys})


def numpy_stats(c, data, exclude=True):
    """The statistics written out: global (natoms per type with the excluded types' counts set
    to 0; lstsq, minimum norm, rcond None; std of the residual, population, over frames; tiled
    over types) and atomic (per type mean and population std over all atoms of the type in all
    frames, excluded types included)."""
    nt = len(c["type_map"])
    nf = data["coord"].shape[0]
    cnt = np.tile(np.bincount(data["atype"], minlength=nt), (nf, 1)).astype(np.float64)
    if exclude:
        cnt[:, c["atom_exclude_types"]] = 0.0
    b, *_ = np.linalg.lstsq(cnt, data["label"], rcond=None)
    res = data["label"] - cnt @ b
    g_bias, g_std = b, np.tile(res.std(axis=0), (nt, 1))
    size = data["label"].shape[1]
    a_bias = np.stack([data["atom_label"][:, data["atype"] == t].reshape(-1, size).mean(0)
                       for t in range(nt)])
    a_std = np.stack([data["atom_label"][:, data["atype"] == t].reshape(-1, size).std(0)
                      for t in range(nt)])
    return {"global": (g_bias, g_std), "atomic": (a_bias, a_std)}


def descriptor_serialized(c, ev):
    """The descriptor as its own script makes it (dpmodel get_model, seeded; davg/dstd as
    DESCRIPTORS says); that script's energy fitting and bias are not used."""
    nf = len(ev["coord"])
    script = DESCRIPTORS[c["descriptor"]["type"]]["script"]
    if script is None:
        return D.make_model(c, {"atype": ev["atype"], "energy": np.zeros(nf)})[1]["descriptor"]
    own = {k: v for k, v in c.items() if k != "fitting"}
    return script.make_model(own, dict(ev, energy=np.zeros(nf)))[1]["descriptor"]


def dpw_names(pt, ser, c):
    """{PyTorch parameter name: dpw's name}, as the descriptor's own script maps them (a
    mixed-type descriptor has one fitting net: `fit.layer<l>.*`, else `fit.t<type>.layer<l>.*`)."""
    kind = c["descriptor"]["type"]
    if kind == "se_e2_a":
        return D.dpw_names(pt, ser)
    if kind == "se_atten":
        return dpa1.dpw_names(pt)
    script = DESCRIPTORS[kind]["script"]
    names = {k: script.dpw_name(k) for k, p in pt.named_parameters() if p.numel() > 0}
    assert sorted(names.values()) == sorted(script.model_params(ser)), "name map"
    return names


def make_model(c, ev):
    params = model_params(c)
    check_argcheck_defaults(params)
    pt = pt_get_model(params)
    again = pt_get_model(params)
    for (k, a), (_, b) in zip(pt.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    ser = pt.serialize()
    ser["descriptor"] = descriptor_serialized(c, ev)
    situations = {"a_global_only": ("global",), "b_atomic_only": ("atomic",),
                  "c_both": ("global", "atomic")}
    hand = numpy_stats(c, ev)
    stats = {}
    switches = None
    for key, labels in situations.items():
        bias, std, info, switches = deepmd_stats(ser, c, ev, labels)
        hb, hs = hand["global"] if key == "a_global_only" else hand["atomic"]
        stats[key] = {"label_files": list(labels), "sample": info,
                      "out_bias": bias, "out_std": std,
                      "numpy_formula": "global" if key == "a_global_only" else "atomic",
                      "numpy_bias_max_abs_diff": float(np.abs(bias[0] - hb).max()),
                      "numpy_std_max_abs_diff": float(np.abs(std[0] - hs).max())}
    stats["c_equals_b"] = bool(
        np.array_equal(stats["c_both"]["out_bias"], stats["b_atomic_only"]["out_bias"])
        and np.array_equal(stats["c_both"]["out_std"], stats["b_atomic_only"]["out_std"]))
    if c["atom_exclude_types"]:
        bias, std, _, _ = deepmd_stats(ser, c, ev, ("global",), wrap=False)
        hb, hs = numpy_stats(c, ev, exclude=False)["global"]
        stats["a_global_only_without_exclusion"] = {
            "note": "NOT this model's statistics: (a) with the sample passed to "
            "compute_or_load_out_stat directly (no _make_wrapped_sampler, so no "
            "atom_exclude_types in the sample and the excluded type's atoms are counted); "
            "shows what the exclusion changes",
            "out_bias": bias, "out_std": std,
            "numpy_bias_max_abs_diff": float(np.abs(bias[0] - hb).max()),
            "numpy_std_max_abs_diff": float(np.abs(std[0] - hs).max())}
    # one composition (64 O, 128 H in every frame): the global least squares is rank 1 and its
    # minimum-norm solution is out_bias[t] = n_t * mean_f(label) / sum_t n_t^2 (n_t = 0 for an
    # excluded type)
    nt = len(c["type_map"])
    cnt = np.bincount(ev["atype"], minlength=nt).astype(np.float64)
    cnt[c["atom_exclude_types"]] = 0.0
    stats["a_global_only"]["minimum_norm_check_max_abs"] = float(np.abs(
        stats["a_global_only"]["out_bias"][0]
        - cnt[:, None] * ev["label"].mean(0)[None] / (cnt @ cnt)).max())
    stats["atomic_model_switches"] = switches
    stats["used_in_model_yaml"] = "c_both"
    chosen = stats["c_both"]
    ser = with_stats(ser, chosen["out_bias"], chosen["out_std"])
    if c["kind"] == "polar":
        sc = ser["fitting"]["@variables"]["scale"].reshape(-1)
        for key in ("a_global_only", "b_atomic_only", "c_both"):
            b = stats[key]["out_bias"][0].reshape(nt, 3, 3)
            stats[key]["diag_shift_per_type"] = {
                "mean_diag_out_bias": np.trace(b, axis1=1, axis2=2) / 3,
                "times_scale": np.trace(b, axis1=1, axis2=2) / 3 * sc}
    return params, ser, stats


# ---------------------------------------------------------------- eval

def pt_tensors(pt, c, data, train=False):
    """(global [nf, size], atomic [nf, n, size], the forward's dict) of the PT model."""
    k = KINDS[c["kind"]]
    nf, n = data["coord"].shape[:2]
    r = pt_eval(pt, data, train)
    return (r["global_" + k["tensor"]].reshape(nf, k["size"]),
            r[k["tensor"]].reshape(nf, n, k["size"]), r)


def dp_tensors(dp, c, data):
    k = KINDS[c["kind"]]
    nf, n = data["coord"].shape[:2]
    r = dp(data["coord"].reshape(nf, -1, 3), np.tile(data["atype"], (nf, 1)),
           box=data["box"].reshape(nf, 3, 3))
    return (np.asarray(r["global_" + k["tensor"]]).reshape(nf, k["size"]),
            np.asarray(r[k["tensor"]]).reshape(nf, n, k["size"]), sorted(r))


def deep_tensor(pth, c, data):
    """DeepDipole / DeepPolar on the .pth: eval(atomic=True) and eval(atomic=False)."""
    import importlib

    k = KINDS[c["kind"]]
    mod, cls = k["deep"].rsplit(".", 1)
    nf, n = data["coord"].shape[:2]
    dp = getattr(importlib.import_module(mod), cls)(pth)
    x, b = data["coord"].reshape(nf, -1), data["box"].reshape(nf, 9)
    atom = np.asarray(dp.eval(x, b, data["atype"], atomic=True)).reshape(nf, n, k["size"])
    glob_ = np.asarray(dp.eval(x, b, data["atype"], atomic=False)).reshape(nf, k["size"])
    return glob_, atom, {"class": cls, "get_sel_type": [int(t) for t in dp.get_sel_type()],
                         "output_tensor_name": dp.output_tensor_name}


def descriptor_call(ser, data):
    """DeePMD-kit's descriptor (dpmodel) on the frames, on the neighbour list its model builds
    (extend_input_and_build_neighbor_list at the descriptor's rcut and sel, one list for all
    types where the descriptor mixes types): descriptor D [nf, n, dim_out], rot_mat gr [nf, n,
    dim_emb, 3], the extended inputs (coord, atype, mapping, nlist), and what the descriptor
    block whose last pair features make gr returned (DESCRIPTORS' `block`; None for se_e2_a)."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor
    from deepmd.dpmodel.utils.nlist import extend_input_and_build_neighbor_list

    desc = BaseDescriptor.deserialize(copy.deepcopy(ser["descriptor"]))
    nf, n = data["coord"].shape[:2]
    atype = np.tile(data["atype"], (nf, 1))
    ext, aext, mapping, nl = extend_input_and_build_neighbor_list(
        data["coord"].reshape(nf, -1), atype, desc.get_rcut(), desc.get_sel(),
        mixed_types=desc.mixed_types(), box=data["box"].reshape(nf, 9))
    seen = []
    kind = ser["descriptor"]["type"]
    block = DESCRIPTORS[{"dpa1": "se_atten"}.get(kind, kind)]["block"]  # serialized: "dpa1"
    if block is not None:  # record the block's outputs (NativeOP.__call__ calls self.call)
        blk = getattr(desc, block)
        own = blk.call
        blk.call = lambda *a, **k: seen.append(own(*a, **k)) or seen[-1]
    dd, gr, *_ = desc.call(ext, aext, nl, mapping)
    dd, gr = np.asarray(dd), np.asarray(gr).reshape(nf, n, -1, 3)
    return desc, (ext, aext, mapping, nl), dd, gr, (seen[-1] if seen else None)


def numpy_forward(ser, data):
    """The atomic tensor from DeePMD-kit's descriptor output (descriptor D_i and rot_mat gr_i
    [m, 3], dpmodel; se_e2_a: [64] and [16, 3]) and the fitting nets of the serialization
    (dpmodel FittingNet), with the rest written out in numpy: o = net_t(D_i) + bias_atom_e[t]
    (one net for all types where the descriptor mixes types); dipole: o @ gr; polar: o = o *
    scale[t], P = diag(o) (fit_diag) or (O + O^T)/2 (O = o as [m, m]), alpha = gr^T P gr, plus
    mean(diag(out_bias[t])) * scale[t] * I if shift_diag; zero for excluded types."""
    from deepmd.dpmodel.utils.network import NetworkCollection

    fit = ser["fitting"]
    nets = NetworkCollection.deserialize(copy.deepcopy(fit["nets"]))
    nf, n = data["coord"].shape[:2]
    _, _, dd, gr, _ = descriptor_call(ser, data)
    m = gr.shape[2]
    t = data["atype"]
    if fit["mixed_types"]:
        o = nets[()](dd) + fit["@variables"]["bias_atom_e"][t][None]
    else:
        o = np.zeros((nf, n, fit["nets"]["networks"][0]["layers"][-1]["@variables"]["w"]
                      .shape[1]))
        for ti in range(len(ser["type_map"])):
            sel = t == ti
            o[:, sel] = nets[(ti,)](dd[:, sel]) + fit["@variables"]["bias_atom_e"][ti]
    if fit["type"] == "dipole":
        out = np.einsum("fim,fimk->fik", o, gr)
    else:
        sc = fit["@variables"]["scale"].reshape(-1)[t]
        o = o * sc[None, :, None]
        if fit["fit_diag"]:
            p = o[..., :, None] * np.eye(m)
        else:
            p = o.reshape(nf, n, m, m)
            p = (p + np.swapaxes(p, -1, -2)) / 2
        out = np.einsum("fima,fimn,finb->fiab", gr, p, gr)
        if fit["shift_diag"]:
            b = ser["@variables"]["out_bias"][0].reshape(-1, 3, 3)
            shift = np.trace(b, axis1=1, axis2=2) / 3
            out = out + (shift[t] * sc)[None, :, None, None] * np.eye(3)
        out = out.reshape(nf, n, 9)
    out[:, np.isin(t, ser["atom_exclude_types"])] = 0.0
    return out, {"descriptor_shape": list(dd.shape), "gr_shape": list(gr.shape)}


def forward_checks(ser, c, data, pred_atom):
    """How the statistics and the fitting's own constants enter (see the README)."""
    t = data["atype"]
    nt = len(ser["type_map"])
    excl = np.isin(t, ser["atom_exclude_types"])
    out = {}
    ref, info = numpy_forward(ser, data)
    out["numpy_forward"] = dict(info, max_abs_vs_pt=float(np.abs(ref - pred_atom).max()),
                                max_abs_pt=float(np.abs(pred_atom).max()))
    # a non-zero bias_atom_e: added to the net output before the contraction with gr
    s2 = copy.deepcopy(ser)
    rng = np.random.default_rng(5)
    s2["fitting"]["@variables"]["bias_atom_e"] = 0.1 * rng.standard_normal(
        s2["fitting"]["@variables"]["bias_atom_e"].shape)
    p2 = pt_tensors(D.pt_model(s2), c, data)[1].detach().numpy()
    r2, _ = numpy_forward(s2, data)
    out["nonzero_bias_atom_e"] = {
        "what": "bias_atom_e set to 0.1*normal (seed 5): the numpy forward with "
        "o = net_t(D) + bias_atom_e[t] (before the contraction) against PT",
        "max_abs_vs_pt": float(np.abs(r2 - p2).max()),
        "changes_prediction_by": float(np.abs(p2 - pred_atom).max())}
    # out_bias zeroed (out_std 1): the fitting's raw output
    shape = ser["@variables"]["out_bias"].shape
    raw = pt_tensors(D.pt_model(with_stats(ser, np.zeros(shape), np.ones(shape))), c,
                     data)[1].detach().numpy()
    out["out_bias_zero_out_std_one"] = {
        "prediction_changes_by": float(np.abs(raw - pred_atom).max())}
    # out_std is never applied
    s3 = with_stats(ser, ser["@variables"]["out_bias"], 3.0 * np.ones(shape))
    p3 = pt_tensors(D.pt_model(s3), c, data)[1].detach().numpy()
    out["out_std_times_3_changes_prediction_by"] = float(np.abs(p3 - pred_atom).max())
    out["excluded_atoms_max_abs_prediction"] = float(np.abs(pred_atom[:, excl]).max()) \
        if excl.any() else None
    if c["kind"] == "polar":
        sc = ser["fitting"]["@variables"]["scale"].reshape(-1)
        b = ser["@variables"]["out_bias"][0].reshape(nt, 3, 3)
        shift = np.trace(b, axis1=1, axis2=2) / 3 * sc
        expect = raw + (shift[t][None, :, None] * np.eye(3).reshape(9)[None, None]
                        if ser["fitting"]["shift_diag"] else 0.0)
        expect[:, excl] = 0.0
        out["raw_plus_mean_diag_out_bias_times_scale_max_abs"] = float(
            np.abs(expect - pred_atom).max())
        out["diag_shift_per_type"] = shift
        # shift_diag false: out_bias is not applied at all
        s4 = copy.deepcopy(ser)
        s4["fitting"]["shift_diag"] = False
        p4 = pt_tensors(D.pt_model(s4), c, data)[1].detach().numpy()
        out["shift_diag_false_minus_raw_max_abs"] = float(np.abs(p4 - raw).max())
        # constant_matrix: PT ignores it, dpmodel adds constant_matrix[t]*scale[t]*I in the
        # fitting when shift_diag (on top of the atomic model's out_bias shift)
        s5 = copy.deepcopy(ser)
        s5["fitting"]["@variables"]["constant_matrix"] = np.array([0.7, -0.3])[:nt]
        p5 = pt_tensors(D.pt_model(s5), c, data)[1].detach().numpy()
        d5 = dp_tensors(D.dp_model(s5), c, data)[1]
        d0 = dp_tensors(D.dp_model(ser), c, data)[1]
        out["constant_matrix"] = {
            "value_in_model": ser["fitting"]["@variables"]["constant_matrix"],
            "what": "constant_matrix set to [0.7, -0.3]",
            "pt_changes_by": float(np.abs(p5 - pred_atom).max()),
            "dpmodel_changes_by": float(np.abs(d5 - d0).max()),
            "dpmodel_change_of_atom0_frame0": (d5 - d0)[0, 0]}
    else:
        out["dipole_out_bias_applied"] = bool(np.abs(raw - pred_atom).max() > 0)
    return out


def neighbour_counts(c, ser, data):
    """The most neighbours within each cut-off of the descriptor on the frames (all periodic
    images), against its sel / nsel."""
    from deepmd.dpmodel.utils.region import normalize_coord
    from deepmd.dpmodel.utils.nlist import extend_coord_with_ghosts

    d = c["descriptor"]
    if d["type"] == "se_atten":
        lists = {"se_atten": (d["rcut"], d["sel"])}
    elif d["type"] == "dpa2":
        lists = {b: (d[b]["rcut"], d[b]["nsel"]) for b in ("repinit", "repformer")}
    else:
        r = d["repflow"]
        lists = {"edge": (r["e_rcut"], r["e_sel"]), "angle": (r["a_rcut"], r["a_sel"])}
    nf, n = data["coord"].shape[:2]
    rmax = max(rc for rc, _ in lists.values())
    x = normalize_coord(data["coord"], data["box"])
    ext, _, _ = extend_coord_with_ghosts(x, np.tile(data["atype"], (nf, 1)), data["box"], rmax)
    ext = np.asarray(ext).reshape(nf, -1, 3)
    r = np.linalg.norm(ext[:, None, :, :] - x[:, :, None, :], axis=-1)  # [nf, n, nall]
    out = {}
    for k, (rc, sel) in lists.items():
        most = int(((r < rc) & (r > 0)).sum(-1).max())
        assert most <= sel, (k, most, sel)
        out[k] = {"rcut": rc, "sel": sel, "max_neighbours_within_rcut": most,
                  "pair_distance_nearest_rcut_relative_offset": float(
                      (r.ravel() - rc)[np.argmin(np.abs(r.ravel() - rc))] / rc)}
    return out


def hg(g, h, sw, smooth, sqrt, eps=1e-4):
    """DeePMD-kit's _cal_hg written out: rot_mat[e, c] = norm * sum_j g_j[e] h_j[c] (g masked by
    the list; smooth: g times sw, norm 1/nnei or 1/sqrt(nnei) with nnei the list width; not
    smooth: norm 1/(eps + count) or 1/(eps + sqrt(count)), count = neighbours in the list)."""
    nnei = g.shape[2]
    mask = (sw > 0).astype(g.dtype)  # sw > 0 exactly on the list's real neighbours
    if smooth:
        w = g * sw[..., None]
        norm = 1.0 / (np.sqrt(nnei) if sqrt else nnei)
    else:
        w = g * mask[..., None]
        cnt = mask.sum(-1)[..., None, None]
        norm = 1.0 / (eps + (np.sqrt(cnt) if sqrt else cnt))
    return np.einsum("fijc,fije->fiec", h, w) * norm


def rot_mat_checks(ser, c, data):
    """DeePMD-kit's rotation matrix and descriptor output (dpmodel) on the frames, against its
    PyTorch descriptor on the same inputs and against the formula written out from the
    block's outputs (last layer's pair features g, equivariant pair rows h = the normalised
    environment rows' columns 1:4, switch sw); every normalisation variant tried, so that the
    one DeePMD-kit uses shows as the one that is 0."""
    desc, (ext, aext, mapping, nl), dd, gr, blk = descriptor_call(ser, data)
    nf, n = data["coord"].shape[:2]
    kind = ser["descriptor"]["type"]
    ptd = D.pt_model(ser).atomic_model.descriptor
    with torch.no_grad():
        r = ptd(torch.tensor(np.asarray(ext).reshape(nf, -1)), torch.tensor(np.asarray(aext)),
                torch.tensor(np.asarray(nl)), mapping=torch.tensor(np.asarray(mapping)))
    pt_dd, pt_gr = r[0].numpy(), r[1].numpy().reshape(gr.shape)
    g, h, rot, sw = (np.asarray(a) for a in (blk[1], blk[2], blk[3], blk[4]))
    sw = sw.reshape(g.shape[:3])
    assert np.array_equal(np.asarray(rot).reshape(gr.shape), gr)
    if kind == "dpa1":  # se_atten
        nnei = g.shape[2]
        variants = {"sum_j h_j g_j / nnei": np.einsum("fijc,fije->fiec", h, g) / nnei,
                    "sum_j h_j g_j / sqrt(nnei)": np.einsum("fijc,fije->fiec", h, g)
                    / np.sqrt(nnei)}
        settings = {"nnei (= sel)": nnei, "smooth_type_embedding": desc.se_atten.smooth}
        how = ("DescrptDPA1.call (dense) -> DescrptBlockSeAtten: gg = the neighbour embedding "
               "G_j [nnei, 8] after the attention layers; gr = (1/nnei) sum_j R_j^T gg_j [4, 8] "
               "over all nnei = sel slots (padding included: its h is 0 since the angular davg "
               "is 0), R_j the normalised environment row (s, s x/r, s y/r, s z/r) (- davg) / "
               "dstd; rot_mat = gr[1:4]^T [8, 3]; no switch in this sum (sw enters gg "
               "through the smooth type embedding and the attention)")
    else:
        b = desc.repformers if kind == "dpa2" else desc.repflows
        smooth = getattr(b, "smooth", True) if kind == "dpa2" else True
        sqrt = getattr(b, "use_sqrt_nnei", True) if kind == "dpa2" else True
        variants = {f"{'smooth' if sm else 'count'}, {'1/sqrt' if sq else '1/'}(nnei)":
                    hg(g, h, sw, sm, sq) for sm in (True, False) for sq in (True, False)}
        settings = {"nnei (list width)": g.shape[2], "smooth": smooth, "use_sqrt_nnei": sqrt,
                    "epsilon": getattr(b, "epsilon", None)}
        what = ("repformer: g = g2 as the layers leave it [nnei, g2_dim] (the last layer "
                "updates g1 only: g2 is layer nlayers-2's output, the only layer with linear2 "
                "and the g2 attention here), h = h2 (the list's normalised rows' columns 1:4; "
                "update_h2 false)" if kind == "dpa2"
                else "repflow: g = the edge features of the last layer [nnei, e_dim], h = the "
                "normalised environment rows' columns 1:4")
        how = (f"the descriptor's call (dense) -> {type(b).__name__}.call: {what}; h2g2 = "
               f"_cal_hg(g, h, nlist_mask, sw, smooth={smooth}, use_sqrt_nnei={sqrt}) [3, "
               f"dim_emb] = h^T (g * sw) / sqrt(nnei) with nnei the block's list width (sel), "
               f"padding slots 0 (sw 0, g masked); rot_mat = h2g2^T [dim_emb, 3]")
    diffs = {k: float(np.abs(v - gr).max()) for k, v in variants.items()}
    return dd, gr, {
        "how": how,
        "dim_emb": int(desc.get_dim_emb()),
        "fitting_embedding_width": int(ser["fitting"]["embedding_width"]),
        "descriptor_dim_out": int(desc.get_dim_out()),
        "shape": list(gr.shape),
        "atom_order": "the frame's (type.raw's); DeePMD-kit's dpmodel descriptor `call` on "
                      "extend_input_and_build_neighbor_list's extended frame and list",
        "block_settings": settings,
        "formula_max_abs_diff": diffs,
        "max_abs": float(np.abs(gr).max()),
        "pt_vs_dpmodel_rot_mat_max_abs": float(np.abs(pt_gr - gr).max()),
        "pt_vs_dpmodel_descriptor_max_abs": float(np.abs(pt_dd - dd).max()),
    }


def dp_test(pth, c, data, tmp):
    """`dp test` on the .pth (without and with -a): log lines and the detail file."""
    sysdir = os.path.join(tmp, "test_sys")
    write_system(sysdir, data, c)
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
                lines = fh.read().splitlines()
            arr = np.loadtxt(os.path.join(wd, f), ndmin=2)
            files[f] = {"header_line": lines[0].replace(sysdir, "<system>")[:300]
                        + (" ..." if len(lines[0]) > 300 else ""),
                        "header_n_names": len(lines[0].lstrip("#").split()),
                        "shape": list(arr.shape),
                        "first_row_first_6": arr[0, :6].tolist()}
        res[tag] = {"command": "dp --pt test -m model.pth -s <system> -d detail"
                    + "".join(f" {e}" for e in extra),
                    "log": [l.replace(sysdir, "<system>") for l in log], "files": files}
    return res


def expected_dp_test(glob_, atom, data, sel_type):
    sel = np.isin(data["atype"], sel_type)
    ns = int(sel.sum())
    d = glob_ - data["label"]
    rmse = float(np.sqrt((d * d).mean()))
    a = (atom - data["atom_label"])[:, sel]
    return {"rmse": rmse, "rmse_sqrtn": rmse / np.sqrt(ns), "rmse_n": rmse / ns,
            "sel_natoms": ns, "rmse_atomic": float(np.sqrt((a * a).mean()))}


# ---------------------------------------------------------------- dp train

def dp_train(params, c, data, lpar, tmp, tag):
    """One step of `dp --pt train` on the frames (both label files present); lcurve.out and the
    out_bias / out_std stored in the checkpoint."""
    wd = os.path.join(tmp, f"train_{tag}")
    os.makedirs(wd)
    write_system(os.path.join(wd, "sys"), data, c)
    inp = train_input(params, lpar, "sys")
    inp["training"].update({"validation_data": {"systems": ["sys"], "batch_size": 1,
                                                "numb_btch": 1},
                            "seed": 1, "disp_freq": 1, "save_freq": 1})
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
    stat_lines = [l for l in strip_log(p.stdout + p.stderr) if "RMSE of" in l]
    return {"loss": lpar, "lcurve_out": lcurve, "stat_log": stat_lines,
            "out_bias": bias.numpy(), "out_std": std.numpy()}


# ---------------------------------------------------------------- train step

def label_dict(c, data, find_global=1.0, find_atomic=1.0):
    lk = KINDS[c["kind"]]["label"]
    return {lk: torch.tensor(data["label"]), "atom_" + lk: torch.tensor(data["atom_label"]),
            "find_" + lk: find_global, "find_atom_" + lk: find_atomic}


def loss_fn(pt, c, data, lpar, **find):
    n = data["coord"].shape[1]
    pt.train(True)
    pred, loss, more = loss_obj(pt, lpar)(inputs(data), pt, label_dict(c, data, **find), n,
                                          D.LR)
    return loss, pred, more


def grads(pt, c, data, lpar, names, **find):
    pt.zero_grad(set_to_none=True)
    loss, pred, more = loss_fn(pt, c, data, lpar, **find)
    loss.backward()
    mdt = {k: (str(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__)
           for k, v in more.items()}
    more = {k: float(v) for k, v in more.items()}
    return float(loss.detach()), more, mdt, param_grads(pt, names)


def hand_terms(glob_, atom, mask, data, xp):
    """l2_global = mean over frames x size of (global - label)^2; l2_local = sum over frames,
    atoms, components of mask * (atomic - label)^2 / (size * sum(mask))."""
    y, ya = data["label"], data["atom_label"]
    if xp is not np:
        y, ya = torch.tensor(y), torch.tensor(ya)
    size = y.shape[1]
    g = ((glob_ - y) ** 2).mean()
    loc = (((atom - ya) ** 2) * mask[:, :, None]).sum() / (size * mask.sum())
    return {"global": g, "local": loc}


def hand_loss_numpy(c, glob_, atom, mask, data, lpar):
    name = KINDS[c["kind"]]["tensor"]
    l2 = hand_terms(glob_, atom, mask, data, np)
    loss, more = 0.0, {}
    if lpar["pref_atomic"] > 0:
        loss += lpar["pref_atomic"] * l2["local"]
        more[f"l2_local_{name}_loss"] = l2["local"]
        more[f"rmse_local_{name}"] = np.sqrt(l2["local"])
    if lpar["pref"] > 0:
        loss += lpar["pref"] * l2["global"]
        more[f"l2_global_{name}_loss"] = l2["global"]
        more[f"rmse_global_{name}"] = np.sqrt(l2["global"]) / mask.sum(-1).mean()
    return float(loss), {k: float(v) for k, v in more.items()}, {k: float(v) for k, v in l2.items()}


def hand_grads(pt, c, data, lpar, names):
    """hand_loss_numpy's formula in torch (float64 throughout) on the PT model's outputs."""
    pt.zero_grad(set_to_none=True)
    g, a, r = pt_tensors(pt, c, data, train=True)
    l2 = hand_terms(g, a, r["mask"].to(torch.float64), data, torch)
    loss = lpar["pref_atomic"] * l2["local"] + lpar["pref"] * l2["global"]
    loss.backward()
    return float(loss.detach()), param_grads(pt, names)


def fd_check(pt, c, data, lpar, names, g, key, label, h=1e-4):
    return D.fd_largest(pt, names, g, key, label,
                        lambda: float(loss_fn(pt, c, data, lpar)[0].detach()), h)


# ---------------------------------------------------------------- case

def run_case(name, c):
    out = os.path.join(ROOT, name)
    os.makedirs(out, exist_ok=True)
    k = KINDS[c["kind"]]
    lk, tk, size = k["label"], k["tensor"], k["size"]
    nt = len(c["type_map"])
    ev = load(c, c["eval_frames"])
    tr = subset(ev, [c["eval_frames"].index(f) for f in c["train_frames"]])
    nf, n = ev["coord"].shape[:2]
    params, ser, stats = make_model(c, ev)
    dump(os.path.join(out, "input.json"), {"model": params})
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {"model": ser, "model_def_script": params, "backend": "dpmodel",
                              "software": "deepmd-kit", "version": deepmd.__version__})
    dkind = c["descriptor"]["type"]
    if dkind == "se_e2_a":
        # the descriptor is property_water's (same construction)
        pw = os.path.join(ROOT, "property_water", "model.yaml")
        same_desc = None
        if os.path.exists(pw):
            o = load_dp_model(pw)["model"]["descriptor"]
            same_desc = D.array_diff(ser["descriptor"], o)
        desc_meta = {"descriptor_max_abs_diff_vs_property_water": same_desc,
                     "davg_dstd": DESCRIPTORS[dkind]["davg_dstd"]}
        desc_arrays = {}
    else:
        dd, gr, rinfo = rot_mat_checks(ser, c, ev)
        desc_meta = {"davg_dstd": DESCRIPTORS[dkind]["davg_dstd"],
                     "neighbours": neighbour_counts(c, ser, ev), "rot_mat": rinfo}
        desc_arrays = {"rot_mat": gr, "descriptor": dd}
        brief = {k: v for k, v in rinfo.items() if k not in ("how", "atom_order")}
        print(f"{name}: rot_mat {json.dumps(clean(brief))}", flush=True)
    pt = D.pt_model(ser)
    dp = D.dp_model(ser)
    g_pt, a_pt, r = pt_tensors(pt, c, ev)
    pt_keys = sorted(r)
    mask_eval = r["mask"].detach().numpy()
    g_pt, a_pt = g_pt.detach().numpy(), a_pt.detach().numpy()
    g_dp, a_dp, dp_keys = dp_tensors(dp, c, ev)
    with tempfile.TemporaryDirectory() as tmp:
        pth = os.path.join(tmp, "model.pth")
        back = os.path.join(tmp, "back.yaml")
        for a, b in [(yaml_path, pth), (pth, back)]:
            subprocess.run([DP, "convert-backend", a, b], check=True, capture_output=True)
        roundtrip = D.yaml_roundtrip_diff(ser, back)
        g_in, a_in, iinfo = deep_tensor(pth, c, ev)
        dptest = dp_test(pth, c, ev, tmp)
        trains = {"full_loss": dp_train(params, c, ev, LOSS, tmp, "full"),
                  "global_loss": dp_train(params, c, ev, LOSS_GLOBAL, tmp, "global")}
    for v in trains.values():
        for key in ("c_both", "a_global_only"):
            v[f"out_bias_max_abs_diff_vs_{key}"] = float(
                np.abs(v["out_bias"] - stats[key]["out_bias"]).max())
            v[f"out_std_max_abs_diff_vs_{key}"] = float(
                np.abs(v["out_std"] - stats[key]["out_std"]).max())
    arrays = {"coord": ev["coord"].reshape(nf, -1), "box": ev["box"].reshape(nf, 9),
              "atype": ev["atype"], f"{lk}_label": ev["label"],
              f"atom_{lk}_label": ev["atom_label"], lk: g_pt, f"atom_{lk}": a_pt,
              f"{lk}_dpmodel": g_dp, f"atom_{lk}_dpmodel": a_dp, **desc_arrays}
    np.savez(os.path.join(out, "eval.npz"), **arrays)
    fit_ser = ser["fitting"]
    excl = np.isin(ev["atype"], c["atom_exclude_types"])
    meta = {
        "generator": "scripts/make-reference/tensor.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": c["system"],
        "frames": c["eval_frames"],
        "pbc": True,
        "atom_order": "type.raw's (the system is sorted by type already)",
        "type_map": c["type_map"],
        "natoms": n,
        "natoms_per_type": np.bincount(ev["atype"], minlength=nt).tolist(),
        "atom_exclude_types": c["atom_exclude_types"],
        "descriptor": c["descriptor"],
        **desc_meta,
        "fitting": c["fitting"],
        "fitting_serialized": {kk: fit_ser[kk] for kk in (
            "type", "var_name", "embedding_width", "dim_descrpt", "fit_diag", "shift_diag",
            "exclude_types", "mixed_types", "neuron", "resnet_dt", "precision",
            "activation_function", "rcond", "r_differentiable", "c_differentiable",
            "@version") if kk in fit_ser},
        "fitting_variables": {kk: (list(np.shape(v)) if v is not None else None)
                              for kk, v in fit_ser["@variables"].items()},
        "fitting_scale": (fit_ser["@variables"]["scale"].reshape(-1)
                          if "scale" in fit_ser["@variables"] else None),
        "fitting_constant_matrix": fit_ser["@variables"].get("constant_matrix"),
        "fitting_bias_atom_e_all_zero": bool(np.all(fit_ser["@variables"]["bias_atom_e"] == 0)),
        "model_serialized": {kk: ser[kk] for kk in (
            "type", "atom_exclude_types", "pair_exclude_types", "rcond", "preset_out_bias",
            "@version") if kk in ser},
        "output_keys": {"label_global": lk, "label_atomic": f"atom_{lk}",
                        "data_files": [f"{lk}.npy", f"atomic_{lk}.npy"],
                        "pt_forward_keys": pt_keys, "dpmodel_call_keys": dp_keys,
                        "pt_atomic": tk, "pt_global": f"global_{tk}",
                        "atomic_model_bias_keys": stats["atomic_model_switches"]["bias_keys"]},
        "pt_mask": {"sum_per_frame": mask_eval.sum(1).tolist(),
                    "zero_on_excluded": bool(np.all(mask_eval[:, excl] == 0)) if excl.any()
                    else None},
        "label_source": {"seed": c["label_seed"], **LABELS[c["kind"]], "how": (
            "rng = default_rng(seed); dipole: atom = mean[t_i] + sigma[t_i] * "
            "rng.standard_normal((nf, n, 3)); global = sum over non-excluded atoms of atom + "
            "rng.normal(0, global_noise_sigma, (nf, 3)). polar: U = rng.standard_normal((nf, n,"
            " 3, 3)), S = triu(U) + triu(U, 1)^T, atom = diag_mean[t_i] * I + sigma[t_i] * S; "
            "N = rng.standard_normal((nf, 3, 3)) symmetrised the same way; global = sum over "
            "non-excluded atoms of atom + global_noise_sigma * N. The excluded type's atomic "
            "labels are NOT zero on purpose.")},
        "global_minus_sum_of_predicted_atoms_labels": (
            ev["label"] - ev["atom_label"][:, ~excl].sum(1)).tolist(),
        "stats": stats,
        "out_bias": ser["@variables"]["out_bias"],
        "out_std": ser["@variables"]["out_std"],
        "stats_formulas": {
            "a_global_only": "compute_stats_from_redu (stats_distinguish_types true, intensive "
            "false, rcond None, no preset bias): natoms_per_type [nf, ntypes] with the columns "
            "of atom_exclude_types set to 0 (the sample carries atom_exclude_types, added by "
            "_make_wrapped_sampler); out_bias = np.linalg.lstsq(natoms_per_type, label [nf, "
            "size], rcond=None) (minimum-norm; rank 1 here, so out_bias[t] = n_t * "
            "mean_f(label) / sum_t n_t^2, 0 for an excluded type); out_std = population std "
            "over frames of label - natoms_per_type @ out_bias, one row tiled over types",
            "b_atomic_only": "compute_stats_from_atomic: out_bias[t] = mean of atom_label over "
            "every atom of type t in every frame, out_std[t] = population std of the same (per "
            "component); atom_exclude_types is NOT applied (the excluded type gets the mean of "
            "its labels, which the model never uses: its atoms are masked after the bias)",
            "c_both": "the atomic statistics win wherever they exist (the global ones only fill "
            "types that no atomic label covers, then nan_to_num): equal to (b) here",
        },
        "global": g_pt,
        "global_dpmodel": g_dp,
        "atomic_frame0_first4": a_pt[0, :4],
        "checks": {
            "pt_vs_dpmodel_global_max_rel": D.rel(g_pt, g_dp),
            "pt_vs_dpmodel_atomic_max_rel": D.rel(a_pt, a_dp),
            "pt_vs_deep_tensor_pth_global_max_rel": D.rel(g_pt, g_in),
            "pt_vs_deep_tensor_pth_atomic_max_rel": D.rel(a_pt, a_in),
            "deep_tensor": iinfo,
            "reduction": "sum over atoms (no division by natoms)",
            "reduction_of_atomic_max_abs": float(np.abs(a_pt.sum(1) - g_pt).max()),
            "polar_symmetric_max_abs": (float(np.abs(a_pt.reshape(nf, n, 3, 3) - np.swapaxes(
                a_pt.reshape(nf, n, 3, 3), -1, -2)).max()) if c["kind"] == "polar" else None),
            "forward": forward_checks(ser, c, ev, a_pt),
            "yaml_to_pth_to_yaml_max_abs_param_diff": roundtrip,
        },
        "dp_test": dict(dptest, expected=expected_dp_test(g_in, a_in, ev, iinfo["get_sel_type"]),
                        formulas={
            "without -a": "global only: pred = sum over atoms of DeepTensor.eval(atomic=True) "
            "(atoms of the unselected types are 0); rmse = sqrt(mean over frames x size of "
            "(pred - label)^2); rmse_sqrtn = rmse / sqrt(N_sel), rmse_n = rmse / N_sel, "
            "N_sel = number of atoms of the model's sel_type (types not excluded)",
            "with -a": "atomic only (no global line): the rows of the selected types' atoms, "
            "rmse over frames x N_sel x size",
            "weighted average over systems": "rmse: sqrt(sum(rmse^2*size)/sum(size)), size = "
            "number of elements; rmse_sqrtn and rmse_n per system only",
            "detail file": "<detail>.out (one file, frames appended): without -a one row per "
            "frame 'data_x data_y data_z pred_x pred_y pred_z' (polar: data_pxx ... data_pzz "
            "pred_pxx ... pred_pzz); with -a one row per frame, data_<c><i> for i = 1..N_sel "
            "(atom major, components inner) then pred_<c><i>; header '# <names>' (no system "
            "name), np.savetxt"}),
        "dp_train_one_step": trains,
    }
    dump(os.path.join(out, "eval.json"), meta)
    fc = meta["checks"]["forward"]
    print(f"{name}: out_bias (c) {np.asarray(stats['c_both']['out_bias'])[0].round(4).tolist()}"
          f"; (a) {np.asarray(stats['a_global_only']['out_bias'])[0].round(4).tolist()}",
          flush=True)
    print(f"{name}: checks " + json.dumps(clean(
        {kk: v for kk, v in meta["checks"].items() if isinstance(v, float)})) +
          f" numpy_forward {fc['numpy_forward']['max_abs_vs_pt']:.1e}"
          f" bias_atom_e {fc['nonzero_bias_atom_e']['max_abs_vs_pt']:.1e}", flush=True)

    # ---- train step
    names = dpw_names(pt, ser, c)
    ntr = tr["coord"].shape[0]
    tg, ta, tr_r = pt_tensors(pt, c, tr, train=True)
    tg, ta = tg.detach().numpy(), ta.detach().numpy()
    tmask = tr_r["mask"].detach().numpy().astype(np.float64)
    variants = {"": LOSS, "_global": LOSS_GLOBAL, "_atomic": LOSS_ATOMIC}
    res = {}
    for suf, lp in variants.items():
        l, more, mdt, g = grads(pt, c, tr, lp, names)
        h, hm, hl2 = hand_loss_numpy(c, tg, ta, tmask, tr, lp)
        th, hg = hand_grads(pt, c, tr, lp, names)
        res[suf] = {"loss": l, "more": more, "mdt": mdt, "g": g, "hand": h, "hand_more": hm,
                    "l2": hl2, "hand_torch": th, "hg": hg}
    # find_* gating
    lA, moreA, _, gA = grads(pt, c, tr, LOSS, names, find_atomic=0.0)
    lG, moreG, _, gG = grads(pt, c, tr, LOSS, names, find_global=0.0)
    arrays = {"coord": tr["coord"].reshape(ntr, -1), "box": tr["box"].reshape(ntr, 9),
              "atype": tr["atype"], f"{lk}_label": tr["label"],
              f"atom_{lk}_label": tr["atom_label"], lk: tg, f"atom_{lk}": ta}
    for suf in variants:
        for kk in sorted(res[suf]["g"]):
            arrays[f"grad{suf}.{kk}"] = res[suf]["g"][kk]
    for kk in sorted(res[""]["hg"]):
        arrays["grad_f64." + kk] = res[""]["hg"][kk]
    # the fitting's first and last layer (type 0's net where there is one per type) and the
    # descriptor's tensors of DESCRIPTORS
    fitp = "fit.t0." if "fit.t0.layer0.w" in res[""]["g"] else "fit."
    fitw = sorted(kk for kk in res[""]["g"] if kk.startswith(fitp) and kk.endswith(".w"))
    fds = []
    for key in [fitw[0], *DESCRIPTORS[dkind]["fd"], fitw[-1]]:
        for suf, lab in [("", "loss (pref 1, pref_atomic 1)"),
                         ("_global", "loss_global (pref 1, pref_atomic 0)"),
                         ("_atomic", "loss_atomic (pref 0, pref_atomic 1)")]:
            fds.append(fd_check(pt, c, tr, variants[suf], names, res[suf]["g"], key, lab))
    g1 = res[""]["g"]
    tmeta = {
        "generator": "scripts/make-reference/tensor.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU; TensorLoss, loss.backward()",
        "system": c["system"],
        "frames": c["train_frames"],
        "natoms": n,
        "mask_sum": tmask.sum(1).tolist(),
        "loss": LOSS, "loss_global": LOSS_GLOBAL, "loss_atomic": LOSS_ATOMIC,
        "tensor_loss_args": {"tensor_name": tk, "tensor_size": size, "label_name": lk},
        "lr": D.LR,
        "lr_note": "TensorLoss does not use the learning rate (pref and pref_atomic are "
                   "constants)",
        "loss_formula": (
            "loss = pref_atomic * find_atom_<label> * l2_local + pref * find_<label> * "
            "l2_global; l2_local = sum over frames, atoms, components of mask * (atomic_pred - "
            "atom_<label>)^2 / (size * sum(mask)) (masked_atom_mean; mask = the model's 'mask' "
            "output: 0 for atoms of atom_exclude_types, so those rows and their labels drop "
            "out and the mean is over the kept atoms only); l2_global = mean over frames x size "
            "of (global_pred - <label>)^2, global_pred = sum over atoms of the atomic "
            "prediction; no division by natoms in the loss. A term exists only if its pref > 0 "
            "(has_local_weight / has_global_weight) and its label key is in the label dict."),
        "display_formula": (
            "more_loss: l2_local_<t>_loss = l2_local, rmse_local_<t> = sqrt(l2_local), "
            "l2_global_<t>_loss = l2_global, rmse_global_<t> = sqrt(l2_global) / atom_num, "
            "atom_num = mean over frames of float32(sum of the model's mask) (masked_atom_num "
            "with torch.float32: the kept atoms, 64 with H excluded); a display is NaN when its "
            "find_* is 0 (display_if_exist). <t> = tensor_name ('dipole' / 'polar'). The "
            "trainer drops every key containing 'l2_' and writes the rest sorted by name to "
            "lcurve.out, each as <key>_val <key>_trn (only <key>_trn without validation data), "
            "then lr."),
        "l2_terms": res[""]["l2"],
    }
    for suf in variants:
        tmeta[f"loss_value{suf}"] = res[suf]["loss"]
        tmeta[f"more_loss{suf}"] = res[suf]["more"]
        tmeta[f"more_loss{suf}_dtypes"] = res[suf]["mdt"]
    tmeta.update({
        "grad_minus_grad_global_minus_grad_atomic_max_abs": max(
            float(np.abs(g1[kk] - res["_global"]["g"][kk] - res["_atomic"]["g"][kk]).max())
            for kk in g1),
        "grad_atomic_max_abs_over_grad_max_abs": max(
            float(np.abs(res["_atomic"]["g"][kk]).max()) for kk in g1)
        / max(float(np.abs(g1[kk]).max()) for kk in g1),
        "atomic_label_missing": {
            "what": "the full loss with find_atom_<label> 0 (as the loader sets it when the "
                    "optional atomic file is absent): the local term gets weight 0 and "
                    "displays NaN",
            "loss_value": lA, "more_loss": moreA,
            "loss_minus_loss_global": lA - res["_global"]["loss"],
            "grad_max_abs_diff_vs_grad_global": max(
                float(np.abs(gA[kk] - res["_global"]["g"][kk]).max()) for kk in gA)},
        "global_label_missing": {
            "what": "the full loss with find_<label> 0: the global term gets weight 0 and "
                    "displays NaN",
            "loss_value": lG, "more_loss": moreG,
            "loss_minus_loss_atomic": lG - res["_atomic"]["loss"],
            "grad_max_abs_diff_vs_grad_atomic": max(
                float(np.abs(gG[kk] - res["_atomic"]["g"][kk]).max()) for kk in gG)},
        "lcurve_columns": {
            "full_loss": sorted(kk for kk in res[""]["more"] if "l2_" not in kk),
            "global_loss": sorted(kk for kk in res["_global"]["more"] if "l2_" not in kk),
            "atomic_loss": sorted(kk for kk in res["_atomic"]["more"] if "l2_" not in kk)},
        "hand_written_loss": {
            f"loss{suf}": {"value_numpy": res[suf]["hand"],
                           "value_torch_f64": res[suf]["hand_torch"],
                           "more_loss_numpy": res[suf]["hand_more"],
                           "value_minus_deepmd": res[suf]["hand"] - res[suf]["loss"],
                           "more_loss_max_abs_diff": max(
                               abs(res[suf]["hand_more"][kk] - res[suf]["more"][kk])
                               for kk in res[suf]["more"]),
                           "grad_f64_vs_deepmd_max_rel": D.grad_rel_diff(res[suf]["hg"],
                                                                         res[suf]["g"])}
            for suf in variants},
        "fd_param_checks": fds,
        "n_tensors": len(g1),
        "n_parameters": int(sum(v.size for v in g1.values())),
        "tensors": {kk: list(v.shape) for kk, v in sorted(g1.items())},
    })
    tmeta["hand_written_loss"]["note"] = (
        "no float32 quantity enters TensorLoss's loss (only the display divisor atom_num is "
        "float32, and 64 / 192 are exact): grad_f64 equals grad to rounding")
    np.savez(os.path.join(out, "train_step.npz"), **arrays)
    dump(os.path.join(out, "train_step.json"), tmeta)
    print(f"{name}: loss {res['']['loss']!r} (hand {res['']['hand']!r}), global "
          f"{res['_global']['loss']!r}, atomic {res['_atomic']['loss']!r}; more "
          f"{res['']['more']}; {len(g1)} tensors; fd rel "
          + ", ".join(f"{x['rel_err']:.1e}" for x in fds), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

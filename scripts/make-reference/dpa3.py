"""DeePMD-kit 3.2.0's own numbers for DPA-3 (`"type": "dpa3"`, the repflow descriptor; issue 54).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`)
from the repository root: `python scripts/make-reference/dpa3.py [case ...]` (no argument: every
case of CASES). Like dpa1.py it imports descriptors.py for the shared helpers (data loading, the
loss and its hand-written f32/f64 1/N variants, finite differences, `dp convert-backend`) and
runs the `dp` beside the running python. About 5 minutes on 2 cores.
Writes tests/reference/dpa3/<case>/{input.json, model.yaml, eval.npz, eval.json, train_step.npz,
train_step.json}; tests/reference/dpa3/README.md describes them, docs/deepmd-spec.md §18 the math.

Per case: a small float64 DPA-3 + ener model initialised by DeePMD-kit's numpy backend
(`dpmodel`, seeded). Every repflow and descriptor key is written out in input.json. The
res_residual weights (all equal to update_residual at DeePMD-kit's "const" initialisation) are
replaced by seeded random values, so that a mix-up of the residual vectors cannot cancel out;
where fix_stat_std is 0, davg/dstd are set by hand (DeePMD-kit's own statistics on the eval
frames are recorded beside them); the energy bias comes from DeePMD-kit's compute_output_stats.
- eval: the PyTorch model (from the serialization, the path of `dp convert-backend`) gives
  energy, atom_energy, force and virial; `dpmodel` on numpy gives energy and atom_energy;
  `dpmodel` on torch tensors (DeePMD-kit's `pt_expt` backend: the dpmodel classes, autograd for
  the derivatives) gives all four; `DeepPot` on the .pth that `dp convert-backend` made from
  model.yaml gives all four again; `independent()` below recomputes all four from the formulas
  of docs/deepmd-spec.md §18 alone (its own neighbour list over periodic images, torch only as an
  autodiff calculator).
- train step: DeePMD-kit PT's `EnergyStdLoss`, `loss.backward()` (double backward), `.grad` of
  every parameter, with the float64-1/N variant (`grad_f64inv.`) that dpw should match; the same
  gradient from the dpmodel classes (pt_expt) and from `independent()` is compared with it.

Cases on DeePMD-kit's water (non-periodic too), on dpw's alloy, and on a synthetic 4-atom alloy
cell smaller than the cut-off (every neighbour is a periodic image, the atom's own images
included, through three message-passing layers).
"""

import copy
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile

import deepmd
import numpy as np
import torch
from deepmd.dpmodel.utils.serialization import save_dp_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import descriptors as base  # noqa: E402  (the shared helpers of the other descriptor cases)

OUT = "tests/reference/dpa3"
FIT = dict(base.FIT, neuron=[8, 8])  # small: train_step.npz holds every tensor 2-4 times
WATER = dict(base.WATER, eval_frames=[0, 1])
ALLOY = dict(base.ALLOY, eval_frames=[0, 1])
SMALL = {
    "system": "synthetic: a 4-atom fcc cell (a = 3.6 Å, sheared), atoms displaced at random; "
    "labels random (see small_cell() in the script)",
    "type_map": ["Cu", "Ni", "Al"],
    "eval_frames": [0, 1, 2],
    "train_frames": [0, 1],
    "virial": True,
}
# geometry: water max neighbours within 3.5 / 3.0 Å are 23 / 13 (periodic), alloy within 4.0 /
# 3.0 Å 19 / 12, the small cell within 4.0 / 3.0 Å 18 / 12 (checked and recorded per case)
WATER_GEOM = {"e_rcut": 3.5, "e_rcut_smth": 2.0, "e_sel": 24,
              "a_rcut": 3.0, "a_rcut_smth": 2.0, "a_sel": 14}
ALLOY_GEOM = {"e_rcut": 4.0, "e_rcut_smth": 3.0, "e_sel": 20,
              "a_rcut": 3.0, "a_rcut_smth": 2.5, "a_sel": 14}
SMALL_GEOM = {"e_rcut": 4.0, "e_rcut_smth": 3.0, "e_sel": 24,
              "a_rcut": 3.0, "a_rcut_smth": 2.5, "a_sel": 14}
LINEARS = ["node_self_mlp", "node_sym_linear", "node_edge_linear", "edge_self_linear",
           "edge_angle_linear1", "edge_angle_linear2", "angle_self_linear",
           "a_compress_n_linear", "a_compress_e_linear"]


def dpa3(geom, rep=None, **over):
    """A small DPA-3 with every repflow and descriptor key written out (the values here are
    argcheck's defaults except the sizes, smooth_edge_update true and silut:10.0)."""
    r = {
        "n_dim": 6, "e_dim": 5, "a_dim": 4, "nlayers": 2, **geom,
        "a_compress_rate": 0, "a_compress_e_rate": 1, "a_compress_use_split": False,
        "n_multi_edge_message": 1, "axis_neuron": 2, "fix_stat_std": 0.3, "skip_stat": False,
        "update_angle": True, "update_style": "res_residual", "update_residual": 0.1,
        "update_residual_init": "const", "optim_update": True, "smooth_edge_update": True,
        "edge_init_use_dist": False, "use_exp_switch": False, "use_dynamic_sel": False,
        "sel_reduce_factor": 10.0, "sequential_update": False,
    }
    r.update(rep or {})
    d = {
        "type": "dpa3", "repflow": r, "concat_output_tebd": False,
        "activation_function": "silut:10.0", "precision": "float64", "exclude_types": [],
        "env_protection": 0.0, "trainable": True, "seed": 1, "use_econf_tebd": False,
        "use_tebd_bias": False, "use_loc_mapping": True, "add_chg_spin_ebd": False,
    }
    d.update(over)
    return d


# hand statistics where fix_stat_std is 0: per centre type davg of the radial column (DeePMD-kit's
# own statistics leave it 0 for DPA-3; non-zero here to pin the formula) and dstd (radial,
# angular), close to DeePMD-kit's compute_input_stats on the eval frames
ALLOY_STATS = {"davg_r": [0.05, 0.06, 0.055],
               "dstd": [[0.17, 0.175], [0.172, 0.171], [0.168, 0.17]]}
CASES = {
    # (a) water, periodic, argcheck's defaults but smooth_edge_update true, three layers
    "water": dict(WATER, descriptor=dpa3(WATER_GEOM, {"nlayers": 3})),
    # (b) water without PBC; smooth_edge_update false (argcheck's default) and a_sel 6 below the
    # most neighbours within a_rcut on these frames (12): the angle list keeps the 6 nearest
    "water_nopbc": dict(WATER, nopbc=True, descriptor=dpa3(
        dict(WATER_GEOM, a_sel=6), {"smooth_edge_update": False})),
    # (c) alloy, periodic, three types, virial; fix_stat_std 0 with hand davg/dstd; pair
    # exclusion: an excluded neighbour becomes a hole in the list (not compacted)
    "alloy": dict(ALLOY, stats=ALLOY_STATS, descriptor=dpa3(
        ALLOY_GEOM, {"fix_stat_std": 0.0}, exclude_types=[[0, 1], [2, 2]])),
    # (c') a cell smaller than e_rcut: every neighbour is a periodic image (the atom's own ones
    # included) and every node feature a ghost reads is its owner's, over three layers
    "alloy_small_cell": dict(SMALL, descriptor=dpa3(SMALL_GEOM, {"nlayers": 3})),
    # (d) no angle update
    "water_no_angle": dict(WATER, descriptor=dpa3(WATER_GEOM, {"update_angle": False})),
    # (e) dynamic selection (the sums use e_sel/f and a_sel/f as neighbour scales), alloy
    "alloy_dynamic_sel": dict(ALLOY, descriptor=dpa3(
        dict(ALLOY_GEOM, e_sel=40, a_sel=20),
        {"use_dynamic_sel": True, "sel_reduce_factor": 4.0})),
    # (f) the other update styles; res_avg with two edge-message heads, plain silu;
    # res_incr with the unoptimised update path
    "water_res_avg": dict(WATER, descriptor=dpa3(
        WATER_GEOM, {"update_style": "res_avg", "n_multi_edge_message": 2},
        activation_function="silu")),
    "water_res_incr": dict(WATER, descriptor=dpa3(
        WATER_GEOM, {"update_style": "res_incr", "optim_update": False},
        activation_function="silu")),
    # (g) angle compression, linear (rate 1, edge rate 2) and by split (rate 2)
    "water_a_compress": dict(WATER, descriptor=dpa3(
        WATER_GEOM, {"a_compress_rate": 1, "a_compress_e_rate": 2})),
    "water_a_compress_split": dict(WATER, descriptor=dpa3(
        WATER_GEOM, {"a_compress_rate": 2, "a_compress_use_split": True})),
    # (h) edge initialised from r, exponential switch (rcut_smth is its centre here)
    "water_edge_dist_exp_sw": dict(WATER, descriptor=dpa3(
        dict(WATER_GEOM, e_rcut_smth=3.0, a_rcut_smth=2.5),
        {"edge_init_use_dist": True, "use_exp_switch": True})),
    # (i) type embedding appended to the output; with a bias in the type embedding
    "water_concat_tebd": dict(WATER, descriptor=dpa3(
        WATER_GEOM, concat_output_tebd=True, use_tebd_bias=True)),
    # sequential update, residuals from "norm" (DeePMD-kit's own random ones), use_loc_mapping
    # false (ghost node features gathered from the owners each layer: the same numbers)
    # (j) the fitting net's activation silut (DeePMD-kit's water/dpa3 example has silut:10.0);
    # its threshold 0.3 puts pre-activations on both sides of it (eval.json counts them) and is
    # no f32 number (the device kernels rebuild it from three)
    "water_fit_silut": dict(WATER, descriptor=dpa3(WATER_GEOM),
                            fitting=dict(FIT, activation_function="silut:0.3")),
    "water_sequential": dict(WATER, descriptor=dpa3(
        WATER_GEOM, {"sequential_update": True, "update_residual_init": "norm",
                     "update_residual": 0.05}, use_loc_mapping=False)),
}


# ---------------------------------------------------------------- data


def small_cell(frames):
    """4-atom fcc cells (Cu, Ni, Al, Cu) with a = 3.6 Å, a small shear, atoms displaced by up to
    0.12 Å; random labels (energy, force, symmetric virial). Seeded: the same every run."""
    rng = np.random.default_rng(20260054)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    out = {k: [] for k in ("coord", "box", "energy", "force", "virial")}
    for _ in range(3):
        box = 3.6 * np.eye(3) + rng.uniform(-0.08, 0.08, (3, 3))
        out["box"].append(box)
        out["coord"].append(basis @ box + rng.uniform(-0.12, 0.12, (4, 3)))
        out["energy"].append(-14.0 + rng.normal(0, 0.3))
        out["force"].append(rng.normal(0, 0.4, (4, 3)))
        v = rng.normal(0, 0.6, (3, 3))
        out["virial"].append(((v + v.T) / 2).reshape(9))
    d = {k: np.array(v)[frames] for k, v in out.items()}
    d["atype"] = np.array([0, 1, 2, 0])
    return d


def load(case, frames):
    if case["system"] == SMALL["system"]:
        return small_cell(frames)
    d = base.load(case, frames)
    if case.get("nopbc"):
        d["box"] = None
    return d


# ------------------------------------------------- DeePMD-kit calls that also take box None
# (a non-periodic frame); descriptors.py's grads / hand_grads / fd_param look pt_eval and
# loss_fn up in their module at call time, so these replace them there (same numbers for a box).


def pt_eval(pt, coord, box, atype, train=False):
    nf = coord.shape[0]
    pt.train(train)
    return pt(
        torch.tensor(coord.reshape(nf, -1), dtype=torch.float64),
        torch.tensor(np.tile(atype, (nf, 1)), dtype=torch.int64),
        box=None if box is None else torch.tensor(box.reshape(nf, 9), dtype=torch.float64),
    )


def loss_fn(pt, data, lpar, lr):
    from deepmd.pt.loss.ener import EnergyStdLoss

    nf, n = data["coord"].shape[:2]
    loss = EnergyStdLoss(starter_learning_rate=base.START_LR, **lpar)
    inp = {
        "coord": torch.tensor(data["coord"].reshape(nf, -1), dtype=torch.float64),
        "atype": torch.tensor(np.tile(data["atype"], (nf, 1)), dtype=torch.int64),
    }
    if data["box"] is not None:
        inp["box"] = torch.tensor(data["box"].reshape(nf, 9), dtype=torch.float64)
    label = {"energy": torch.tensor(data["energy"].reshape(nf, 1)),
             "force": torch.tensor(data["force"]), "find_energy": 1.0, "find_force": 1.0}
    if "virial" in data:
        label["virial"] = torch.tensor(data["virial"])
        label["find_virial"] = 1.0
    pt.train(True)
    pred, l, more = loss(inp, pt, label, n, lr)
    return l, pred, more


base.pt_eval = pt_eval
base.loss_fn = loss_fn


def dp_energy(dp, coord, box, atype):
    nf = coord.shape[0]
    r = dp(coord.reshape(nf, -1, 3), np.tile(atype, (nf, 1)),
           box=None if box is None else box.reshape(nf, 3, 3))
    return r["energy"].reshape(nf), r["atom_energy"].reshape(nf, -1)


class ExptModel(torch.nn.Module):
    """The dpmodel classes on torch tensors (DeePMD-kit's pt_expt backend), called like the PT
    model (flat coord, box [nf, 9] or None), so that EnergyStdLoss can drive it too."""

    def __init__(self, ser):
        super().__init__()
        import deepmd.pt_expt.model  # noqa: F401  (registers the model classes)
        from deepmd.pt_expt.model.model import BaseModel

        self.m = BaseModel.deserialize(copy.deepcopy(ser))

    def forward(self, coord, atype, box=None, **_):
        nf = coord.shape[0]
        c = coord.reshape(nf, -1, 3)
        if not c.requires_grad:
            c = c.detach().requires_grad_(True)
        out = self.m(c, atype, box=None if box is None else box.reshape(nf, 3, 3))
        return {**out, "force": out["force"].reshape(nf, -1, 3)}


def convert_and_deeppot(yaml_path, data, tmp):
    """descriptors.convert_and_deeppot with box None allowed."""
    from deepmd.infer import DeepPot

    pth, back = os.path.join(tmp, "model.pth"), os.path.join(tmp, "back.yaml")
    dp = os.path.join(os.path.dirname(sys.executable), "dp")
    for a, b in [(yaml_path, pth), (pth, back)]:
        subprocess.run([dp, "convert-backend", a, b], check=True, capture_output=True)
    nf = data["coord"].shape[0]
    box = None if data["box"] is None else data["box"].reshape(nf, 9)
    e, f, v, ae, _ = DeepPot(pth).eval(data["coord"].reshape(nf, -1), box, data["atype"],
                                        atomic=True)
    return {"energy": e.reshape(nf), "atom_energy": ae.reshape(nf, -1),
            "force": f.reshape(nf, -1, 3), "virial": v.reshape(nf, 9)}, back


def save_train_step(out, data, pred, arrays, meta):
    """descriptors.save_train_step; no `box` for a non-periodic case."""
    extra = {} if data["box"] is None else {"box": data["box"]}
    if "virial" in data:
        extra["virial_label"] = data["virial"]
    np.savez_compressed(
        os.path.join(out, "train_step.npz"), coord=data["coord"], atype=data["atype"],
        energy_label=data["energy"], force_label=data["force"], **extra,
        energy=pred["energy"].detach().numpy().reshape(-1), force=pred["force"].detach().numpy(),
        virial=pred["virial"].detach().numpy().reshape(-1, 9), **arrays)
    with open(os.path.join(out, "train_step.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")


# ---------------------------------------------------------------- the model


def set_stats(d, case):
    """davg/dstd [ntypes, e_sel, 4] by hand (fix_stat_std 0 cases): one row per centre type,
    every slot equal; angular davg 0."""
    nt, nnei = len(case["type_map"]), d["repflow_args"]["e_sel"]
    davg = np.zeros((nt, 4))
    davg[:, 0] = case["stats"]["davg_r"]
    dstd = np.array([[r, a, a, a] for r, a in case["stats"]["dstd"]])
    v = d["repflow_variable"]["@variables"]
    v["davg"] = np.repeat(davg[:, None, :], nnei, axis=1)
    v["dstd"] = np.repeat(dstd[:, None, :], nnei, axis=1)


def make_model(case, data):
    from deepmd.dpmodel.model.model import get_model
    from deepmd.dpmodel.utils.stat import compute_output_stats

    nt = len(case["type_map"])
    params = {"type_map": case["type_map"], "descriptor": case["descriptor"], "fitting_net": case.get("fitting", FIT)}
    ser = get_model(copy.deepcopy(params)).serialize()
    d = ser["descriptor"]
    if "stats" in case:
        set_stats(d, case)
    if d["repflow_args"]["update_residual_init"] == "const":
        # seeded random residual weights instead of DeePMD-kit's all-equal constants
        rng = np.random.default_rng(54)
        for lay in d["repflow_variable"]["repflow_layers"]:
            for key, vs in lay.get("@variables", {}).items():
                lay["@variables"][key] = [rng.uniform(0.05, 0.2, v.shape) for v in vs]
    natoms = np.concatenate([[len(data["atype"])] * 2, np.bincount(data["atype"], minlength=nt)])
    sampled = [{"energy": data["energy"].reshape(-1, 1),
                "natoms": np.tile(natoms, (len(data["energy"]), 1)),
                "find_energy": np.float32(1.0)}]
    bias, _ = compute_output_stats(sampled, nt, ["energy"], rcond=None)
    ser["@variables"]["out_bias"] = bias["energy"].reshape(1, nt, 1)
    return params, ser


def dpw_name(name):
    """dpw's name (README) of a PT or pt_expt parameter name."""
    parts = name.split(".")
    v = {"matrix": "w", "w": "w", "bias": "b", "b": "b", "idt": "idt"}.get(parts[-1])
    if "type_embedding" in parts:
        return f"tebd.layer{parts[-2]}.{v}"
    if "fitting_net" in parts:
        assert parts[-4] == "0", name  # mixed types: one fitting net
        return f"fit.layer{parts[-2]}.{v}"
    i = parts.index("repflows")
    rest = parts[i + 1:]
    if rest[0] in ("edge_embd", "angle_embd"):
        return f"{rest[0]}.{v}"
    assert rest[0] == "layers", name
    if rest[2].endswith("_residual"):
        return f"layer{rest[1]}.{rest[2]}.{rest[3]}"
    assert rest[2] in LINEARS, name
    return f"layer{rest[1]}.{rest[2]}.{v}"


def model_params(ser):
    """{dpw name: array} of every trainable tensor of the serialized model."""
    d = ser["descriptor"]
    var = d["repflow_variable"]
    out = {}

    def lay(prefix, x):
        for k in ("w", "b", "idt"):
            if x["@variables"].get(k) is not None:
                out[f"{prefix}.{k}"] = np.asarray(x["@variables"][k])

    for l, x in enumerate(d["type_embedding"]["embedding"]["layers"]):
        lay(f"tebd.layer{l}", x)
    lay("edge_embd", var["edge_embd"])
    lay("angle_embd", var["angle_embd"])
    for i, x in enumerate(var["repflow_layers"]):
        for k in LINEARS:
            if k in x:
                lay(f"layer{i}.{k}", x[k])
        for k, vs in x.get("@variables", {}).items():
            for j, a in enumerate(vs):
                out[f"layer{i}.{k}.{j}"] = np.asarray(a)
    for l, x in enumerate(ser["fitting"]["nets"]["networks"][0]["layers"]):
        lay(f"fit.layer{l}", x)
    return out


# ------------------------------------------- independent: docs/deepmd-spec.md §18, from scratch


def act_fn(name):
    n = (name or "none").lower()
    if n in ("none", "linear"):
        return lambda x: x
    if n == "tanh":
        return torch.tanh
    if n == "silu":
        return lambda x: x * torch.sigmoid(x)
    if n.startswith("silut") or n.startswith("custom_silu"):
        c = float(n.split(":")[-1]) if ":" in n else 3.0
        s = 1.0 / (1.0 + math.exp(-c))
        slope, const = s + c * s * (1.0 - s), c * s
        return lambda x: torch.where(x >= c, torch.tanh(slope * (x - c)) + const,
                                     x * torch.sigmoid(x))
    raise NotImplementedError(name)


def silut_branch_counts(ser, ev):
    """Per hidden fitting layer, how many pre-activations of the eval frames' atoms are ≥ the
    silut threshold, and how many in all (None unless the fitting's activation is silut)."""
    act = ser["fitting"]["activation_function"]
    if not act.startswith("silut"):
        return None
    c = float(act.split(":")[-1])
    P = {k: torch.tensor(v) for k, v in model_params(ser).items()}
    out = []
    for f in range(ev["coord"].shape[0]):
        box = None if ev["box"] is None else torch.tensor(ev["box"][f])
        zs = []
        independent(ser, P, torch.tensor(ev["coord"][f]), box, ev["atype"], fit_z=zs)
        for l, z in enumerate(zs):
            if len(out) <= l:
                out.append({"at_or_above": 0, "of": 0})
            out[l]["at_or_above"] += int((z >= c).sum())
            out[l]["of"] += z.numel()
    return out


def switch(r, rs, rc, use_exp):
    if use_exp:
        return torch.exp(-torch.exp(20.0 / rs * (torch.clamp(r, 0.0, rc) - rs)))
    u = torch.clamp((r - rs) / (rc - rs), 0.0, 1.0)
    return u**3 * (-6.0 * u**2 + 15.0 * u - 10.0) + 1.0


def neighbours(x, box, rc, nsel):
    """Own neighbour list of one frame: per atom the nsel nearest atoms or periodic images with
    r ≤ rc (stable order), as (owner [n, nsel] local index or -1, dvec [n, nsel, 3] = r_j − r_i,
    differentiable in x and box, 0 for padding)."""
    n = x.shape[0]
    if box is None:
        ext, owner = x, np.arange(n)
        zero = np.ones(n, dtype=bool)
    else:
        frac = x.detach().numpy() @ np.linalg.inv(box.detach().numpy())
        x = x - torch.tensor(np.floor(frac)) @ box  # wrapped into the cell
        b = box.detach().numpy()
        heights = abs(np.linalg.det(b)) / np.linalg.norm(np.cross(b[[1, 2, 0]], b[[2, 0, 1]]),
                                                         axis=1)
        k = np.ceil(rc / heights).astype(int)
        shifts = np.array(list(itertools.product(*[range(-kk, kk + 1) for kk in k])), dtype=float)
        ext = (x[None, :, :] + (torch.tensor(shifts) @ box)[:, None, :]).reshape(-1, 3)
        owner = np.tile(np.arange(n), len(shifts))
        zero = np.repeat(np.all(shifts == 0, axis=1), n)
    dall = ext[None, :, :] - x[:, None, :]
    r = np.linalg.norm(dall.detach().numpy(), axis=-1)
    r[np.arange(n), np.where(zero)[0]] = np.inf  # the atom itself
    r[r > rc] = np.inf
    order = np.argsort(r, axis=1, kind="stable")[:, :nsel]
    keep = np.isfinite(np.take_along_axis(r, order, axis=1))
    idx = np.where(keep, order, 0)
    dvec = dall[torch.arange(n)[:, None], torch.tensor(idx)] * torch.tensor(
        keep[..., None], dtype=torch.float64)
    return np.where(keep, owner[idx], -1), dvec


def independent(ser, P, x, box, atype, fit_z=None):
    """Atomic energies [n] of one frame from docs/deepmd-spec.md §18 (P: {dpw name: tensor});
    the hidden fitting layers' pre-activations are appended to fit_z where given."""
    d = ser["descriptor"]
    ra = d["repflow_args"]
    var = d["repflow_variable"]
    act = act_fn(d["activation_function"])
    nnei, asel, nd_, ed_ = ra["e_sel"], ra["a_sel"], ra["n_dim"], ra["e_dim"]
    n = x.shape[0]
    lin = lambda k, y: y @ P[k + ".w"] + (P[k + ".b"] if k + ".b" in P else 0.0)

    def net_layer(k, spec, y):
        pre = lin(k, y)
        if fit_z is not None and k.startswith("fit.") and spec["resnet"]:
            fit_z.append(pre.detach())
        z = act_fn(spec["activation_function"])(pre)
        if k + ".idt" in P:
            z = z * P[k + ".idt"]
        nin, nout = spec["@variables"]["w"].shape
        if spec["resnet"] and nout == nin:
            z = z + y
        elif spec["resnet"] and nout == 2 * nin:
            z = z + torch.cat([y, y], dim=-1)
        return z

    # type embedding: one-hot through the net
    tebd = torch.eye(len(ser["type_map"]), dtype=torch.float64)
    for l, spec in enumerate(d["type_embedding"]["embedding"]["layers"]):
        tebd = net_layer(f"tebd.layer{l}", spec, tebd)
    ti = torch.tensor(atype)
    # neighbour list, pair exclusion (a hole in place), environment matrix
    owner, dv = neighbours(x, box, ra["e_rcut"], nnei)
    mask = owner >= 0
    excl = {tuple(p) for p in d["exclude_types"]} | {tuple(p[::-1]) for p in d["exclude_types"]}
    for i in range(n):
        for j in range(nnei):
            if mask[i, j] and (atype[i], atype[owner[i, j]]) in excl:
                mask[i, j] = False
    m = torch.tensor(mask, dtype=torch.float64)
    dv = dv * m[..., None]
    r = torch.sqrt(torch.where(torch.tensor(mask), (dv**2).sum(-1), torch.ones(())))
    p = d["env_protection"]
    sw = switch(r, ra["e_rcut_smth"], ra["e_rcut"], ra["use_exp_switch"]) * m
    env = torch.cat([(1.0 / (r + p))[..., None], dv / ((r + p) ** 2)[..., None]], -1)
    env = env * sw[..., None]
    davg = torch.tensor(var["@variables"]["davg"])[ti]
    dstd = torch.tensor(var["@variables"]["dstd"])[ti]
    envn = (env - davg) / dstd
    h2 = envn[..., 1:]
    edge_in = (r * m)[..., None] if ra["edge_init_use_dist"] else envn[..., :1]
    # angle list: the first a_sel slots, within a_rcut
    amask = mask[:, :asel] & (r[:, :asel].detach().numpy() < ra["a_rcut"])
    am = torch.tensor(amask, dtype=torch.float64)
    asw = switch(r[:, :asel], ra["a_rcut_smth"], ra["a_rcut"], ra["use_exp_switch"]) * am
    u = dv[:, :asel] * am[..., None] / (r[:, :asel] * am + 1e-6)[..., None]
    cos = (u @ u.transpose(1, 2)) * (1.0 - 1e-6)
    ang_in = (cos / math.pi**0.5)[..., None]
    node = act(tebd[ti])
    edge = lin("edge_embd", edge_in)
    if not ra["edge_init_use_dist"]:
        edge = act(edge)
    angle = lin("angle_embd", ang_in)
    own = torch.tensor(np.where(mask, owner, 0))
    dyn, f = ra["use_dynamic_sel"], ra["sel_reduce_factor"]
    e_scale = nnei / f if dyn else nnei
    a_scale = asel / f if dyn else asel
    ws = (m * sw)[..., None]
    ax = ra["axis_neuron"]
    rate, erate = ra["a_compress_rate"], ra["a_compress_e_rate"]

    def sym(g):
        hg = torch.einsum("ijc,ijd->icd", h2, g * ws) / e_scale**0.5
        return (torch.einsum("ica,icd->iad", hg[:, :, :ax], hg) / 3.0).reshape(n, -1)

    def update(k, lst, lay):
        style = ra["update_style"]
        if style == "res_avg":
            return sum(lst[1:], lst[0]) / len(lst) ** 0.5
        if style == "res_incr":
            return lst[0] + sum(lst[1:]) * (1.0 / (len(lst) - 1) ** 0.5) if len(lst) > 1 else lst[0]
        out = lst[0]
        for j, uu in enumerate(lst[1:]):
            out = out + P[f"{lay}.{k}_residual.{j}"] * uu
        return out

    for li, spec in enumerate(var["repflow_layers"]):
        L = f"layer{li}"
        nj = node[own]
        ni = node[:, None, :].expand(-1, nnei, -1)

        def compress(e):
            if rate == 0:
                nn_, ee = node, e
            elif not ra["a_compress_use_split"]:
                nn_, ee = lin(f"{L}.a_compress_n_linear", node), lin(f"{L}.a_compress_e_linear", e)
            else:
                nn_ = node[:, : ra["a_dim"] // rate]
                ee = e[..., : ra["a_dim"] // (2 * rate) * erate]
            return nn_, ee[:, :asel] * am[..., None]

        def info(a, nn_, ee):
            return torch.cat([a, nn_[:, None, None, :].expand(-1, asel, asel, -1),
                              ee[:, None, :, :].expand(-1, asel, -1, -1),
                              ee[:, :, None, :].expand(-1, -1, asel, -1)], -1)

        def edge_angle(a, nn_, ee, fallback):
            msg = act(lin(f"{L}.edge_angle_linear1", info(a, nn_, ee)))
            red = (asw[:, :, None, None] * asw[:, None, :, None] * msg).sum(2) / a_scale**0.5
            full = torch.cat([red, torch.zeros(n, nnei - asel, ed_, dtype=torch.float64)], 1)
            if not ra["smooth_edge_update"]:
                fm = torch.tensor(np.concatenate([amask, np.zeros((n, nnei - asel), bool)], 1))
                full = torch.where(fm[..., None], full, fallback)
            return act(lin(f"{L}.edge_angle_linear2", full))

        def node_terms(e):
            ne_in = torch.cat([ni, nj, e], -1)
            msg = act(lin(f"{L}.node_edge_linear", ne_in)) * sw[..., None]
            red = msg.sum(1) / e_scale
            heads = [red[:, h * nd_:(h + 1) * nd_] for h in range(ra["n_multi_edge_message"])]
            return [node, act(lin(f"{L}.node_self_mlp", node)),
                    act(lin(f"{L}.node_sym_linear", torch.cat([sym(e), sym(nj)], -1)))] + heads

        e_self = act(lin(f"{L}.edge_self_linear", torch.cat([ni, nj, edge], -1)))
        if ra["sequential_update"]:
            e1 = edge + P[f"{L}.e_residual.0"] * e_self
            nn_, ee = compress(e1)
            a1 = angle + P[f"{L}.a_residual.0"] * act(lin(f"{L}.angle_self_linear",
                                                          info(angle, nn_, ee)))
            e2 = e1 + P[f"{L}.e_residual.1"] * edge_angle(a1, nn_, ee, e1)
            node, edge, angle = update("n", node_terms(e2), L), e2, a1
            continue
        nl = node_terms(edge)
        el, al = [edge, e_self], [angle]
        if ra["update_angle"]:
            nn_, ee = compress(edge)
            el.append(edge_angle(angle, nn_, ee, edge))
            al.append(act(lin(f"{L}.angle_self_linear", info(angle, nn_, ee))))
        node, edge, angle = update("n", nl, L), update("e", el, L), update("a", al, L)

    desc = torch.cat([node, tebd[ti]], -1) if d["concat_output_tebd"] else node
    fit = ser["fitting"]
    y = desc
    for l, spec in enumerate(fit["nets"]["networks"][0]["layers"]):
        y = net_layer(f"fit.layer{l}", spec, y)
    return (y[:, 0] + torch.tensor(fit["@variables"]["bias_atom_e"][:, 0])[ti]
            + torch.tensor(ser["@variables"]["out_bias"][0, :, 0])[ti])


def independent_eval(ser, data, P=None, create_graph=False):
    """Energy, atom energy, force (−∂E/∂r) and virial (−∂E/∂ε, r → r(1+ε), box too) of every
    frame by independent()."""
    if P is None:
        P = {k: torch.tensor(v) for k, v in model_params(ser).items()}
    out = {"energy": [], "atom_energy": [], "force": [], "virial": []}
    for f in range(data["coord"].shape[0]):
        x = torch.tensor(data["coord"][f], requires_grad=True)
        eps = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
        mm = torch.eye(3, dtype=torch.float64) + eps
        box = None if data["box"] is None else torch.tensor(data["box"][f]) @ mm
        ae = independent(ser, P, x @ mm, box, data["atype"])
        e = ae.sum()
        gx, ge = torch.autograd.grad(e, [x, eps], create_graph=create_graph)
        out["energy"].append(e)
        out["atom_energy"].append(ae)
        out["force"].append(-gx)
        out["virial"].append(-ge.reshape(9))
    return {k: torch.stack(v) for k, v in out.items()}


def independent_grads(ser, data, lpar, inv):
    """d loss / d parameter of the written-out loss (base.hand_loss's formula, 1/N = inv) with
    every prediction from independent()."""
    P = {k: torch.tensor(v, requires_grad=True) for k, v in model_params(ser).items()}
    r = independent_eval(ser, data, P, create_graph=True)
    coef = base.LR / base.START_LR
    p = lambda k: (lpar["limit_pref_" + k]
                   + (lpar["start_pref_" + k] - lpar["limit_pref_" + k]) * coef)
    loss = p("e") * torch.mean((r["energy"] - torch.tensor(data["energy"])) ** 2 * inv)
    loss = loss + p("f") * torch.mean((r["force"] - torch.tensor(data["force"])) ** 2)
    if "virial" in data and (lpar["start_pref_v"] or lpar["limit_pref_v"]):
        dv = r["virial"] - torch.tensor(data["virial"])
        loss = loss + p("v") * torch.mean(torch.mean(dv**2, dim=1) * inv)
    g = torch.autograd.grad(loss, list(P.values()), allow_unused=True)
    return float(loss.detach()), {k: (np.zeros(v.shape) if gg is None else gg.numpy())
                                  for (k, v), gg in zip(P.items(), g)}


# ---------------------------------------------------------------- records


def neighbour_info(case, data, ser):
    """Largest (and smallest) neighbour counts within e_rcut and a_rcut on the frames, and for
    the angle list the gap between the a_sel-th and the next distance where a_sel truncates."""
    ra = ser["descriptor"]["repflow_args"]
    out = {}
    for key, rc in (("e", ra["e_rcut"]), ("a", ra["a_rcut"])):
        counts, gaps = [], []
        for f in range(data["coord"].shape[0]):
            box = None if data["box"] is None else torch.tensor(data["box"][f])
            own, dv = neighbours(torch.tensor(data["coord"][f]), box, rc, 10000)
            c = (own >= 0).sum(1)
            counts.append(c)
            if key == "a" and c.max() > ra["a_sel"]:
                rr = np.linalg.norm(dv.numpy(), axis=-1)
                over = c > ra["a_sel"]
                gaps.append(float((rr[over, ra["a_sel"]] - rr[over, ra["a_sel"] - 1]).min()))
        c = np.concatenate(counts)
        out[f"max_neighbours_within_{key}_rcut"] = int(c.max())
        out[f"min_neighbours_within_{key}_rcut"] = int(c.min())
        if gaps:
            out["a_sel_truncates"] = {
                "centres_truncated": int((c > ra["a_sel"]).sum()),
                "smallest_gap_between_a_sel_th_and_next_distance": min(gaps)}
    out.update({
        "e_rcut": ra["e_rcut"], "e_sel": ra["e_sel"], "a_rcut": ra["a_rcut"],
        "a_sel": ra["a_sel"], "periodic": data["box"] is not None,
        "order": "one list for all types (mixed types): the neighbours within e_rcut nearest "
        "first, unused slots -1; the angle list is its first a_sel slots, those at r ≥ a_rcut "
        "set to -1",
    })
    return out


def deepmd_input_stats(ser, data, use_exp):
    """DeePMD-kit's own davg/dstd (compute_input_stats, the path of `dp train`) on these frames
    with fix_stat_std 0 (with the constant it does nothing); and the same by hand from the
    environment matrix with the quintic and with the exponential switch, to show which one
    DeePMD-kit's statistics use."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor

    d = copy.deepcopy(ser["descriptor"])
    d["repflow_args"]["fix_stat_std"] = 0.0
    d["repflow_variable"]["@variables"]["davg"] = 0.0 * d["repflow_variable"]["@variables"]["davg"]
    nf, n = data["coord"].shape[:2]
    nt = len(ser["type_map"])
    sample = [{
        "coord": data["coord"], "atype": np.tile(data["atype"], (nf, 1)),
        "box": None if data["box"] is None else data["box"].reshape(nf, 9),
        "natoms": np.tile(np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)]),
                          (nf, 1)),
    }]
    obj = BaseDescriptor.deserialize(d)
    obj.compute_input_stats(sample)
    davg, dstd = (np.asarray(a[0]) for a in obj.get_stat_mean_and_stddev())
    assert np.all(davg == davg[:, :1]) and np.all(dstd == dstd[:, :1])
    ra = d["repflow_args"]
    by_hand = {}
    for label, ex in (("quintic", False), ("exp", True)):
        rows = [[] for _ in range(nt)]
        for f in range(nf):
            box = None if data["box"] is None else torch.tensor(data["box"][f])
            own, dv = neighbours(torch.tensor(data["coord"][f]), box, ra["e_rcut"], ra["e_sel"])
            dv = dv.numpy()
            rr = np.linalg.norm(dv, axis=-1)
            ok = own >= 0
            rs = np.where(ok, rr, 1.0)
            s = switch(torch.tensor(rs), ra["e_rcut_smth"], ra["e_rcut"], ex).numpy() * ok
            env = np.concatenate([(s / rs)[..., None], dv * (s / rs**2)[..., None]], -1)
            tj = data["atype"][np.where(ok, own, 0)]
            for a, b in d["exclude_types"]:  # an excluded pair's row is 0, and counted
                env[((data["atype"][:, None] == a) & (tj == b))
                    | ((data["atype"][:, None] == b) & (tj == a))] = 0.0
            for t in range(nt):
                rows[t].append(env[data["atype"] == t].reshape(-1, 4))
        std = []
        for t in range(nt):
            a = np.concatenate(rows[t])
            std.append([float(np.sqrt(max((a[:, 0] ** 2).mean() - a[:, 0].mean() ** 2, 0))),
                        float(np.sqrt(max((a[:, 1:] ** 2).mean() - a[:, 1:].mean() ** 2, 0)))])
        by_hand[label] = std
    return {"shape": list(davg.shape), "davg_per_type": davg[:, 0].tolist(),
            "dstd_per_type": dstd[:, 0].tolist(),
            "by_hand_dstd_radial_angular_quintic_switch": by_hand["quintic"],
            "by_hand_dstd_radial_angular_exp_switch": by_hand["exp"]}


def maxabs(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def nearest_to(data, rc):
    """Over the frames' pairs (all images), the distance nearest rc and its offset relative to
    rc: a strain of ±2e-4 (the virial fd at h 1e-4) moves a pair by ~2e-4 relative."""
    best = None
    for f in range(data["coord"].shape[0]):
        box = None if data["box"] is None else torch.tensor(data["box"][f])
        own, dv = neighbours(torch.tensor(data["coord"][f]), box, rc * 1.01, 10000)
        rr = np.linalg.norm(dv.numpy(), axis=-1)[own >= 0]
        c = rr[np.argmin(np.abs(rr - rc))]
        if best is None or abs(c - rc) < abs(best - rc):
            best = float(c)
    return {"r": best, "relative_to_rcut": (best - rc) / rc}


def run_case(name, case):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    ev = load(case, case["eval_frames"])
    tr = load(case, case["train_frames"])
    params, ser = make_model(case, ev)
    ra = ser["descriptor"]["repflow_args"]
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {
        "backend": "dpmodel", "model": ser, "model_def_script": params, "@variables": {}})

    pt = base.pt_model(ser)
    dp = base.dp_model(ser)
    ex = ExptModel(ser)
    names = {k: dpw_name(k) for k, p in pt.named_parameters() if p.numel() > 0}
    assert sorted(names.values()) == sorted(model_params(ser)), "name map"

    # ---- eval
    nf = len(case["eval_frames"])
    keys = ["energy", "atom_energy", "force", "virial"]
    shape = {"energy": (nf,), "atom_energy": (nf, -1), "force": (nf, -1, 3), "virial": (nf, 9)}
    r = pt_eval(pt, ev["coord"], ev["box"], ev["atype"])
    pred = {k: r[k].detach().numpy().reshape(shape[k]) for k in keys}
    dpe, dpae = dp_energy(dp, ev["coord"], ev["box"], ev["atype"])
    rx = ex(torch.tensor(ev["coord"].reshape(nf, -1)), torch.tensor(np.tile(ev["atype"], (nf, 1))),
            box=None if ev["box"] is None else torch.tensor(ev["box"].reshape(nf, 9)))
    expt = {k: rx[k].detach().numpy().reshape(shape[k]) for k in keys}
    ind = {k: v.detach().numpy().reshape(shape[k]) for k, v in independent_eval(ser, ev).items()}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dpot, back = convert_and_deeppot(yaml_path, ev, tmp)
            rt = base.yaml_roundtrip_diff(ser, back)
        except subprocess.CalledProcessError as e:
            # DeePMD-kit 3.2.0 cannot TorchScript a RepFlowLayer with update_angle and
            # res_avg / res_incr (README): no .pth, so no DeepPot and no round trip
            err = [x.strip() for x in e.stderr.decode().splitlines()
                   if "Error" in x or "out of range" in x or "repflow_layer.py" in x]
            dpot, rt = None, {"dp convert-backend yaml -> pth failed": err[-4:]}
    # fd: the energy function ignores its box argument for a non-periodic case (fd_forces and
    # fd_virial pass box[:1], so they get a zero box there)
    evb = ev if ev["box"] is not None else dict(ev, box=np.zeros((nf, 3, 3)))
    per = ev["box"] is not None
    e_pt = lambda x, b: float(pt_eval(pt, x, b if per else None, ev["atype"])[
        "energy"].detach().numpy().sum())
    n = ev["coord"].shape[1]
    fd_atoms = [0, n - 1]
    fdf = base.fd_forces(e_pt, evb, fd_atoms)
    fdv = base.fd_virial(e_pt, evb)
    fdv_small = base.fd_virial(e_pt, evb, h=1e-6)
    v0 = pred["virial"][0].reshape(3, 3)
    checks = {
        "pt_vs_dpmodel_numpy": {"energy": maxabs(pred["energy"], dpe),
                                "atom_energy": maxabs(pred["atom_energy"], dpae)},
        "pt_vs_dpmodel_torch": {k: maxabs(pred[k], expt[k]) for k in keys},
        "pt_vs_deeppot_pth": None if dpot is None else {k: maxabs(pred[k], dpot[k]) for k in keys},
        "pt_vs_independent": {k: maxabs(pred[k], ind[k]) for k in keys},
        "pt_energy_max_abs": float(np.abs(pred["energy"]).max()),
        "pt_force_max_abs": float(np.abs(pred["force"]).max()),
        "pt_virial_max_abs": float(np.abs(pred["virial"]).max()),
        "yaml_to_pth_to_yaml_max_abs_param_diff": rt,
        "fd_force": {
            "frame": 0, "atoms": fd_atoms, "h": 1e-4, "scheme": "fourth-order central",
            "force_pt": pred["force"][0, fd_atoms].tolist(), "fd_of_pt_energy": fdf.tolist(),
            "max_abs_err": maxabs(fdf, pred["force"][0, fd_atoms]),
        },
        "fd_virial": {
            "frame": 0, "h": 1e-4,
            "scheme": "−∂E/∂ε_ab, coord and box (rows) times (1+ε), fourth-order central; vs "
            "virial[3a+b]",
            "fd": fdv.reshape(-1).tolist(), "max_abs_err": maxabs(fdv, v0),
            "pair_nearest_e_rcut": nearest_to(ev, ra["e_rcut"]),
            "pair_nearest_a_rcut": nearest_to(ev, ra["a_rcut"]),
        },
        "fd_virial_h_1e-6": {"frame": 0, "h": 1e-6, "fd": fdv_small.reshape(-1).tolist(),
                             "max_abs_err": maxabs(fdv_small, v0)},
    }
    # the last atom moved first: DPA-3's padding slots are masked everywhere, so the energy
    # does not depend on the atom order (unlike DPA-1's concat, dpa1/README.md)
    perm = np.r_[n - 1, np.arange(n - 1)]
    e_perm = float(pt_eval(pt, ev["coord"][:1, perm], ev["box"][:1] if per else None,
                           ev["atype"][perm])["energy"].detach().numpy().sum())
    checks["atom_order"] = {"frame": 0, "permutation": "the last atom moved first",
                            "minus_energy": e_perm - float(pred["energy"][0])}
    np.savez_compressed(os.path.join(out, "eval.npz"), coord=ev["coord"],
             **({} if ev["box"] is None else {"box": ev["box"]}), atype=ev["atype"],
             energy_label=ev["energy"], force_label=ev["force"],
             **({"virial_label": ev["virial"]} if "virial" in ev else {}),
             **pred, energy_dpmodel=dpe, atom_energy_dpmodel=dpae)
    d = ser["descriptor"]
    var = d["repflow_variable"]["@variables"]
    meta = {
        "generator": "scripts/make-reference/dpa3.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"],
        "periodic": per,
        "frames": case["eval_frames"],
        "atom_order": "type.raw's (the system is sorted by type already)",
        "type_map": case["type_map"],
        "descriptor": case["descriptor"],
        "fitting": case.get("fitting", FIT),
        "fitting_preactivations_at_or_above_silut_c": silut_branch_counts(ser, ev),
        "fitting_nets": "one net for every type (the descriptor has mixed types)",
        "descriptor_dim_out": ra["n_dim"] * (2 if d["concat_output_tebd"] else 1),
        "neighbour_list": neighbour_info(case, ev, ser),
        "stats": ("davg/dstd by hand (see the script)" if "stats" in case else
                  "DeePMD-kit's: davg 0, dstd = fix_stat_std everywhere")
        + "; out_bias from compute_output_stats on the eval frames",
        "davg_dstd_used": {"shape": list(var["davg"].shape),
                           "davg_per_type": var["davg"][:, 0].tolist(),
                           "dstd_per_type": var["dstd"][:, 0].tolist()},
        "deepmd_compute_input_stats_on_these_frames_with_fix_stat_std_0":
            deepmd_input_stats(ser, ev, ra["use_exp_switch"]),
        "out_bias": ser["@variables"]["out_bias"].reshape(-1).tolist(),
        "energy": pred["energy"].tolist(),
        "energy_dpmodel": dpe.tolist(),
        "virial": pred["virial"].tolist(),
        "atom_energy_first4": pred["atom_energy"][:, :4].tolist(),
        "force_first2": pred["force"][:, :2].tolist(),
        "checks": checks,
    }
    with open(os.path.join(out, "eval.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    print(f"{name}: PT−dpmodel(np) {max(checks['pt_vs_dpmodel_numpy'].values()):.1e}, "
          f"PT−dpmodel(torch) {max(checks['pt_vs_dpmodel_torch'].values()):.1e}, "
          f"PT−pth {max((checks['pt_vs_deeppot_pth'] or {0: -1}).values()):.1e}, "
          f"PT−independent {max(checks['pt_vs_independent'].values()):.1e}, "
          f"fd F {checks['fd_force']['max_abs_err']:.1e}, "
          f"fd W {checks['fd_virial']['max_abs_err']:.1e} / "
          f"{checks['fd_virial_h_1e-6']['max_abs_err']:.1e}, "
          f"order {checks.get('atom_order', {}).get('minus_energy', 0):.1e}", flush=True)

    # ---- train step (descriptors.train_step), no `param.` arrays: they are model.yaml's
    n = tr["coord"].shape[1]
    lpar = base.LOSS if case["virial"] else base.LOSS_NO_V

    def more_checks(g, arrays, hand, lval):
        # the same DeePMD-kit loss on the dpmodel classes (pt_expt), and the f64-1/N loss on
        # independent(): both gradients against the PT ones
        exn = {k: dpw_name(k) for k, p in ex.named_parameters() if p.numel() > 0}
        lx, _, _, gx = base.grads(ex, tr, lpar, exn)
        li, gi = independent_grads(ser, tr, lpar, 1.0 / n)
        ref64 = {k[len("grad_f64inv."):]: v for k, v in arrays.items()
                 if k.startswith("grad_f64inv.")}
        return {"dpmodel_torch_vs_pt": {"loss_abs": abs(lx - lval),
                                        "grad_max_rel": base.grad_rel_diff(gx, g)},
                "independent_f64inv_vs_pt_f64inv": {
                    "loss_abs": abs(li - hand["loss"]["value_f64_inv"]),
                    "grad_max_rel": base.grad_rel_diff(gi, ref64)}}

    L = ra["nlayers"] - 1
    fkeys = ["edge_embd.w", "tebd.layer0.w", "layer0.node_edge_linear.w",
             f"layer{L}.node_sym_linear.w", "fit.layer0.w"]
    if ra["update_angle"]:
        fkeys.insert(3, "layer0.edge_angle_linear1.w")
    if ra["update_style"] == "res_residual":
        # the last layer's edge and angle updates reach no output (their gradient is 0)
        fkeys[-1:-1] = [f"layer{L}.n_residual.1", f"layer{L - 1}.e_residual.0"]
    lval, tmeta = base.train_step(
        out, pt, tr, names, "scripts/make-reference/dpa3.py", case["system"],
        case["train_frames"], fkeys, case["virial"], periodic=per, params=model_params(ser),
        more_checks=more_checks, save=save_train_step)
    hand, fds = tmeta["hand_written_loss"], tmeta["fd_param_checks"]
    print(f"{name}: loss {lval!r}, {tmeta['n_tensors']} tensors, "
          f"{tmeta['n_parameters']} parameters; "
          f"f64inv vs deepmd {hand['loss']['grad_f64_inv_vs_deepmd_max_rel']:.1e}, "
          f"f32inv {hand['loss']['grad_f32_inv_vs_deepmd_max_rel']:.1e}; dpmodel(torch) "
          f"{tmeta['dpmodel_torch_vs_pt']['grad_max_rel']:.1e}; independent "
          f"{tmeta['independent_f64inv_vs_pt_f64inv']['grad_max_rel']:.1e}; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

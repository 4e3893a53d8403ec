"""DeePMD-kit 3.2.0's own numbers for the se_e2_r, se_e3 and hybrid descriptors (issue 29).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu]==3.2.0"`, which
brings PyTorch) from the repository root: `python scripts/make-reference/descriptors.py [case ...]`
(no argument: every case of CASES). The script runs `dp convert-backend` (the `dp` beside the
running python) to prove DeePMD-kit reads the model.yaml it writes. About 5 minutes on 2 cores.
Writes tests/reference/descriptors/<case>/{input.json, model.yaml, eval.npz, eval.json,
train_step.npz, train_step.json}; tests/reference/descriptors/README.md describes them.

Per case: a small float64 se_e2_r / se_e3 / hybrid + ener model is initialised by DeePMD-kit's
numpy backend (`dpmodel`, seeded), davg/dstd are set by hand (close to DeePMD-kit's own
statistics, which are recorded beside them; the angular davg is 0 as those make it) and the
energy bias comes from DeePMD-kit's own `compute_output_stats` on the case's eval frames. That
serialization is saved as model.yaml with DeePMD-kit's `save_dp_model` (the file
`dp convert-backend` reads and writes).
- eval: the PyTorch backend's model, built from the serialization (`BaseModel.deserialize`, the
  path of `dp convert-backend`), gives energy, atom_energy, force and virial; `dpmodel` (numpy,
  independent code) gives energy and atom_energy; `DeepPot` on the .pth that `dp convert-backend`
  made from model.yaml gives all four again. Their differences go to eval.json, with finite
  differences of DeePMD-kit's own energy for a few force components and for the virial (strain).
- train step: DeePMD-kit PT's `EnergyStdLoss` on the PT model in training mode (so the force and
  virial are differentiable: PyTorch autograd double backward), `loss.backward()`, and `.grad` of
  every parameter (`grad.`); at lr = half the start lr, so every prefactor is interpolated. For
  the cases with virial labels, the gradient of the virial term alone as well (`vgrad.`). The
  loss written out by hand with a float64 1/N (DeePMD-kit's is float32) gives `grad_f64inv.` /
  `vgrad_f64inv.`, what dpw should match. Finite differences of DeePMD-kit's loss check two
  parameters' gradients.
"""

import copy
import json
import os
import subprocess
import sys
import tempfile

import deepmd
import numpy as np
import torch
from deepmd.dpmodel.model.model import get_model
from deepmd.dpmodel.utils.serialization import load_dp_model, save_dp_model
from deepmd.dpmodel.utils.stat import compute_output_stats

OUT = "tests/reference/descriptors"
START_LR = 1e-3
LR = 5e-4  # coef = lr / start_lr = 0.5: every prefactor is interpolated
LOSS = {
    "start_pref_e": 0.02,
    "limit_pref_e": 1.0,
    "start_pref_f": 1000.0,
    "limit_pref_f": 1.0,
    "start_pref_v": 0.5,
    "limit_pref_v": 2.0,
}
# Water has no virial labels: its loss has no virial term at all.
LOSS_NO_V = dict(LOSS, start_pref_v=0.0, limit_pref_v=0.0)
# The virial term alone: next to pref_f's force term its share of the full gradient is small, so
# a wrong virial gradient could hide inside the full one's tolerance.
LOSS_V = dict(LOSS, start_pref_e=0.0, limit_pref_e=0.0, start_pref_f=0.0, limit_pref_f=0.0)

WATER = {
    "system": "examples/water/data_0",
    "type_map": ["O", "H"],
    "eval_frames": [0, 1, 2],
    "train_frames": [0],
    "virial": False,
    # per type: davg of the radial column, dstd of the radial and of the angular columns
    "davg_r": [0.05, 0.048],
    "dstd": [[0.14, 0.086], [0.124, 0.077]],
}
ALLOY = {
    "system": "examples/alloy/data/train/Cu36Ni36Al36",
    "type_map": ["Cu", "Ni", "Al"],
    "eval_frames": [0, 1, 2],
    "train_frames": [0, 1],
    "virial": True,
    "davg_r": [0.031, 0.030, 0.029],
    "dstd": [[0.073, 0.046], [0.074, 0.046], [0.069, 0.043]],
}
FIT = {"type": "ener", "neuron": [16, 16, 16], "resnet_dt": True, "seed": 2, "precision": "float64"}


def se_r(sel, rcut, neuron, seed):
    # type_one_side false is refused by DeePMD-kit's dpmodel se_e2_r (NotImplementedError) and
    # ignored by its PyTorch se_e2_r (always one net per neighbour type): only true exists there.
    return {"type": "se_e2_r", "sel": sel, "rcut": rcut, "rcut_smth": 0.5, "neuron": neuron,
            "resnet_dt": False, "type_one_side": True, "seed": seed, "precision": "float64"}


def se_e3(sel, rcut, neuron, seed):
    return {"type": "se_e3", "sel": sel, "rcut": rcut, "rcut_smth": 0.5, "neuron": neuron,
            "resnet_dt": False, "seed": seed, "precision": "float64"}


def se_a(sel, rcut, type_one_side, seed):
    return {"type": "se_e2_a", "sel": sel, "rcut": rcut, "rcut_smth": 0.5, "neuron": [4, 8, 16],
            "axis_neuron": 4, "resnet_dt": False, "type_one_side": type_one_side, "seed": seed,
            "precision": "float64"}


# sel: at least the largest count within rcut on the frames used (checked below), so that no
# neighbour list is truncated and the reference does not hinge on ties in distance.
CASES = {
    "se_e2_r_water": dict(WATER, descriptor=se_r([46, 92], 6.0, [4, 8, 16], 1)),
    "se_e2_r_alloy": dict(ALLOY, descriptor=se_r([40, 36, 24], 5.0, [4, 8, 16], 1)),
    "se_e3_water": dict(WATER, descriptor=se_e3([16, 28], 4.0, [4, 8], 1)),
    "se_e3_alloy": dict(ALLOY, descriptor=se_e3([14, 14, 14], 4.0, [4, 8], 1)),
    "hybrid_water": dict(WATER, descriptor={"type": "hybrid", "list": [
        se_a([46, 92], 6.0, True, 1), se_r([16, 28], 4.0, [4, 8], 3)]}),
    "hybrid_alloy": dict(ALLOY, descriptor={"type": "hybrid", "list": [
        se_a([40, 36, 24], 5.0, False, 1), se_e3([14, 14, 14], 4.0, [4, 8], 3)]}),
}


def load(case, frames):
    """Frames of the system in type.raw's atom order (already sorted by type in both systems)."""
    root = case["system"]
    names = open(os.path.join(root, "type_map.raw")).read().split()
    atype = np.loadtxt(os.path.join(root, "type.raw"), dtype=int).reshape(-1)
    atype = np.array([case["type_map"].index(names[t]) for t in atype])
    s = os.path.join(root, "set.000")
    get = lambda k: np.load(os.path.join(s, f"{k}.npy")).astype(np.float64)[frames]
    nf, n = len(frames), len(atype)
    out = {
        "atype": atype,
        "coord": get("coord").reshape(nf, n, 3),
        "box": get("box").reshape(nf, 3, 3),
        "energy": get("energy").reshape(nf),
        "force": get("force").reshape(nf, n, 3),
    }
    if case["virial"]:
        out["virial"] = get("virial").reshape(nf, 9)
    return out


def leaf_descriptors(d):
    return d["list"] if d["type"] == "hybrid" else [d]


def set_stats(desc_ser, case):
    """davg/dstd by hand: [ntypes, nnei, 1] for se_e2_r, [ntypes, nnei, 4] for se_e2_a/se_e3."""
    nnei = sum(desc_ser["sel"])
    if desc_ser["type"] == "se_r":
        davg = np.array(case["davg_r"])[:, None]
        dstd = np.array([r for r, _ in case["dstd"]])[:, None]
    else:
        davg = np.zeros((len(case["type_map"]), 4))
        davg[:, 0] = case["davg_r"]
        dstd = np.array([[r, a, a, a] for r, a in case["dstd"]])
    desc_ser["@variables"]["davg"] = np.repeat(davg[:, None, :], nnei, axis=1)
    desc_ser["@variables"]["dstd"] = np.repeat(dstd[:, None, :], nnei, axis=1)


def make_model(case, data):
    nt = len(case["type_map"])
    params = {"type_map": case["type_map"], "descriptor": case["descriptor"], "fitting_net": FIT}
    ser = get_model(copy.deepcopy(params)).serialize()
    d = ser["descriptor"]
    for sub in d["list"] if d["type"] == "hybrid" else [d]:
        set_stats(sub, case)
    natoms = np.concatenate([[len(data["atype"])] * 2, np.bincount(data["atype"], minlength=nt)])
    sampled = [{
        "energy": data["energy"].reshape(-1, 1),
        "natoms": np.tile(natoms, (len(data["energy"]), 1)),
        "find_energy": np.float32(1.0),
    }]
    bias, _ = compute_output_stats(sampled, nt, ["energy"], rcond=None)
    ser["@variables"]["out_bias"] = bias["energy"].reshape(1, nt, 1)
    return params, ser


def pt_model(ser):
    from deepmd.pt.model.model import BaseModel

    return BaseModel.deserialize(copy.deepcopy(ser))


def dp_model(ser):
    from deepmd.dpmodel.model.model import BaseModel

    return BaseModel.deserialize(copy.deepcopy(ser))


def dpw_names(pt, ser):
    """{PyTorch parameter name: dpw's name}, for every parameter with elements.

    `...filter_layers.networks.{k}.layers.{l}.{matrix,bias,idt}` is net k of a NetworkCollection,
    whose key (i0, i1, ...) is k = i0 + i1*ntypes + ...: for se_e2_a/se_e2_r with
    type_one_side true (ndim 1) k is the neighbour type; for se_e2_a with type_one_side false
    k = centre + ntypes*neighbour; for se_e3 k = ti + ntypes*tj, where ti and tj are the types of
    the two neighbours of a pair, and only ti <= tj is used (the rest are zeros, unused).
    """
    nt = len(ser["type_map"])
    d = ser["descriptor"]
    subs = d["list"] if d["type"] == "hybrid" else [d]
    out = {}
    for name, p in pt.named_parameters():
        if p.numel() == 0:  # compress_data / compress_info placeholders
            continue
        parts = name.split(".")
        v = {"matrix": "w", "bias": "b", "idt": "idt"}[parts[-1]]
        lay = int(parts[-2])
        k = int(parts[-4])
        if parts[1] == "fitting_net":
            out[name] = f"fit.t{k}.layer{lay}.{v}"
            continue
        assert parts[1] == "descriptor", name
        if d["type"] == "hybrid":
            si = int(parts[3])
            prefix = f"d{si}."
        else:
            si, prefix = 0, ""
        sub = subs[si]
        ndim = sub["embeddings"]["ndim"]
        if sub["type"] == "se_e3":
            ti, tj = k % nt, k // nt
            if ti > tj:
                continue  # never used by DeePMD-kit (zeros in model.yaml, zero gradient)
            net = f"embed.t{ti}_t{tj}"
        elif ndim == 1:
            net = f"embed.t{k}"
        else:
            net = f"embed.c{k % nt}_n{k // nt}"
        out[name] = f"{prefix}{net}.layer{lay}.{v}"
    return out


def pt_eval(pt, coord, box, atype, train=False):
    nf = coord.shape[0]
    pt.train(train)
    return pt(
        torch.tensor(coord.reshape(nf, -1), dtype=torch.float64),
        torch.tensor(np.tile(atype, (nf, 1)), dtype=torch.int64),
        box=torch.tensor(box.reshape(nf, 9), dtype=torch.float64),
    )


def dp_energy(dp, coord, box, atype):
    nf = coord.shape[0]
    r = dp(coord.reshape(nf, -1, 3), np.tile(atype, (nf, 1)), box=box.reshape(nf, 3, 3))
    return r["energy"].reshape(nf), r["atom_energy"].reshape(nf, -1)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def deepmd_input_stats(ser, data):
    """DeePMD-kit's own davg/dstd (`compute_input_stats`, the path of `dp train`) on these frames,
    per sub-descriptor and type (every slot row is equal): not used by the model, recorded so that
    dpw's statistics for these descriptors can be checked too."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor

    nf, n = data["coord"].shape[:2]
    nt = len(ser["type_map"])
    sample = [{
        "coord": data["coord"], "atype": np.tile(data["atype"], (nf, 1)),
        "box": data["box"].reshape(nf, 9),
        "natoms": np.tile(np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)]),
                          (nf, 1)),
    }]
    d = ser["descriptor"]
    out = []
    for sub in d["list"] if d["type"] == "hybrid" else [d]:
        obj = BaseDescriptor.deserialize(copy.deepcopy(sub))
        obj.compute_input_stats(sample)
        davg, dstd = np.asarray(obj.davg), np.asarray(obj.dstd)
        assert np.all(davg == davg[:, :1]) and np.all(dstd == dstd[:, :1])
        out.append({"type": sub["type"], "shape": list(davg.shape),
                    "davg_per_type": davg[:, 0].tolist(), "dstd_per_type": dstd[:, 0].tolist()})
    return out


def neighbour_info(case, data, ser):
    """DeePMD-kit's neighbour-list settings, and the largest count within each rcut on the frames
    (to show that sel truncates nothing)."""
    import itertools

    nt = len(case["type_map"])

    def max_counts(rc):
        mx = np.zeros(nt, dtype=int)
        for x, b in zip(data["coord"], data["box"]):
            shifts = np.array([np.array(s) @ b for s in itertools.product([-1, 0, 1], repeat=3)])
            r = np.linalg.norm(x[None, :, None, :] + shifts[None, None] - x[:, None, None, :],
                               axis=-1)
            r[np.arange(len(x)), np.arange(len(x)), 13] = np.inf  # the atom itself
            inr = (r < rc).sum(-1)
            for t in range(nt):
                mx[t] = max(mx[t], inr[:, data["atype"] == t].sum(1).max())
        return mx.tolist()

    d = ser["descriptor"]
    subs = d["list"] if d["type"] == "hybrid" else [d]
    info = {
        "model_rcut": max(s["rcut"] for s in subs),
        "model_sel": np.max([s["sel"] for s in subs], axis=0).tolist(),
        "sections": "one section per neighbour type, in type order; within a section the "
        "neighbours within rcut nearest first; unused slots -1 (padding)",
        "descriptors": [
            {"type": s["type"], "rcut": s["rcut"], "rcut_smth": s["rcut_smth"], "sel": s["sel"],
             "max_neighbours_within_rcut_on_eval_frames": max_counts(s["rcut"])}
            for s in subs
        ],
    }
    if d["type"] == "hybrid":
        info["hybrid"] = (
            "DeePMD-kit builds one list with rcut = max of the sub-descriptors' rcut and, per "
            "type, sel = max of their sel (model_rcut, model_sel). Sub-descriptor k takes, from "
            "each type section t of that list, its first sel_k[t] slots (the nearest), "
            "`DescrptHybrid.nlist_cut_idx`. A neighbour kept there but beyond the "
            "sub-descriptor's own rcut has switch 0, so its environment row is 0 before "
            "normalisation, exactly as a padding slot; so the result equals a list built with "
            "the sub-descriptor's own rcut and sel (checked: sub_descriptor_own_nlist_max_diff)."
        )
    return info


def hybrid_sub_check(ser, data):
    """Each sub-descriptor on the hybrid's cut list vs on its own list (rcut_k, sel_k)."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor
    from deepmd.dpmodel.utils.nlist import extend_input_and_build_neighbor_list

    d = ser["descriptor"]
    hyb = BaseDescriptor.deserialize(copy.deepcopy(d))
    nf = data["coord"].shape[0]
    atype = np.tile(data["atype"], (nf, 1))
    coord = data["coord"].reshape(nf, -1)
    box = data["box"].reshape(nf, 9)
    ext, aext, mapping, nl = extend_input_and_build_neighbor_list(
        coord, atype, hyb.get_rcut(), hyb.get_sel(), mixed_types=False, box=box)
    full, *_ = hyb.call(ext, aext, nl, mapping)
    worst, start = 0.0, 0
    for sub in hyb.descrpt_list:
        e2, a2, m2, nl2 = extend_input_and_build_neighbor_list(
            coord, atype, sub.get_rcut(), sub.get_sel(), mixed_types=False, box=box)
        own, *_ = sub.call(e2, a2, nl2, m2)
        n = own.shape[-1]
        worst = max(worst, float(np.abs(full[..., start:start + n] - own).max()))
        start += n
    return worst


def d5(f, h):
    """Fourth-order central difference f'(0) from f(±h), f(±2h): its truncation error (h^4) is
    far below the second-order one's (h^2) at an h where roundoff is still small; measured on
    se_e2_r_water, the plain central difference is no better than ~3e-7 relative at any h."""
    return (-f(2 * h) + 8 * f(h) - 8 * f(-h) + f(-2 * h)) / (12 * h)


def independent_atom_energy(ser, data):
    """Atomic energies of every frame from the README's formulas alone: numpy, an own
    neighbour list (all periodic images, per type section nearest first), and the serialized
    model (the nets applied as model.yaml describes them: tanh, `idt`, skip by widths where a
    layer says `resnet`). Agreement with DeePMD-kit checks the definitions dpw will follow."""
    nt = len(ser["type_map"])
    d = ser["descriptor"]
    subs = d["list"] if d["type"] == "hybrid" else [d]
    rmax = max(sub["rcut"] for sub in subs)

    def net_call(net, x):
        for lay in net["layers"]:
            v = lay["@variables"]
            y = x @ v["w"] + (v["b"] if v.get("b") is not None else 0.0)
            if lay["activation_function"] == "tanh":
                y = np.tanh(y)
            else:
                assert lay["activation_function"] in ("none", "linear", None), lay
            if v.get("idt") is not None:
                y = y * v["idt"]
            if lay["resnet"] and v["w"].shape[1] == v["w"].shape[0]:
                y = y + x
            elif lay["resnet"] and v["w"].shape[1] == 2 * v["w"].shape[0]:
                y = y + np.concatenate([x, x], axis=-1)
            x = y
        return x

    def sw(r, rs, rc):
        u = np.clip((r - rs) / (rc - rs), 0.0, 1.0)
        return u**3 * (-6 * u**2 + 15 * u - 10) + 1

    out = []
    for x, box in zip(data["coord"], data["box"]):
        n = len(x)
        # wrap into the cell first (the data need not be), so ±k cells reach every image
        frac = x @ np.linalg.inv(box)
        x = (frac - np.floor(frac)) @ box
        heights = abs(np.linalg.det(box)) / np.linalg.norm(
            np.cross(box[[1, 2, 0]], box[[2, 0, 1]]), axis=1)
        k = np.ceil(rmax / heights).astype(int)
        shifts = np.array([np.array([a, b, c]) @ box for a in range(-k[0], k[0] + 1)
                           for b in range(-k[1], k[1] + 1) for c in range(-k[2], k[2] + 1)])
        desc = []
        for sub in subs:
            sel, rc, rs = sub["sel"], sub["rcut"], sub["rcut_smth"]
            nnei = sum(sel)
            davg, dstd = sub["@variables"]["davg"], sub["@variables"]["dstd"]
            kind = sub["type"]
            nets = sub["embeddings"]["networks"]
            rows = []
            for i in range(n):
                dvec = (x[None, :, :] + shifts[:, None, :] - x[i]).reshape(-1, 3)
                typ = np.tile(data["atype"], len(shifts))
                r = np.linalg.norm(dvec, axis=1)
                r[r == 0] = np.inf  # the atom itself
                env = np.zeros((nnei, 4))
                slot = 0
                for t in range(nt):
                    cand = np.where((typ == t) & (r < rc))[0]
                    cand = cand[np.argsort(r[cand], kind="stable")][: sel[t]]
                    rr, dv = r[cand], dvec[cand]
                    s_ = sw(rr, rs, rc)
                    env[slot:slot + len(cand), 0] = s_ / rr
                    env[slot:slot + len(cand), 1:] = dv * (s_ / rr**2)[:, None]
                    slot += sel[t]
                ti = data["atype"][i]
                if kind == "se_r":
                    s = (env[:, 0] - davg[ti, :, 0]) / dstd[ti, :, 0]
                    acc = 0.0
                    for t in range(nt):
                        a, b = sum(sel[:t]), sum(sel[:t + 1])
                        acc = acc + net_call(nets[t], s[a:b, None]).sum(0)
                    rows.append(acc / nnei / 5.0)
                elif kind == "se_e3":
                    rt = ((env - davg[ti]) / dstd[ti])[:, 1:]
                    acc = 0.0
                    for t1 in range(nt):
                        for t2 in range(t1, nt):
                            a = rt[sum(sel[:t1]):sum(sel[:t1 + 1])]
                            b = rt[sum(sel[:t2]):sum(sel[:t2 + 1])]
                            e = a @ b.T
                            g = net_call(nets[t1 + nt * t2], e[:, :, None])
                            acc = acc + (e[:, :, None] * g).sum((0, 1)) / (sel[t1] * sel[t2])
                    rows.append(acc)
                else:  # se_e2_a
                    rt = (env - davg[ti]) / dstd[ti]
                    ndim = sub["embeddings"]["ndim"]
                    gr = 0.0
                    for t in range(nt):
                        a, b = sum(sel[:t]), sum(sel[:t + 1])
                        g = net_call(nets[t if ndim == 1 else ti + nt * t], rt[a:b, :1])
                        gr = gr + g.T @ rt[a:b]  # [ng, 4]
                    gr = gr / nnei
                    rows.append((gr @ gr[: sub["axis_neuron"]].T).reshape(-1))
            desc.append(np.array(rows))
        dd = np.concatenate(desc, axis=1)
        fit = ser["fitting"]
        ae = np.zeros(n)
        for i in range(n):
            t = data["atype"][i]
            ae[i] = (net_call(fit["nets"]["networks"][t], dd[i])[0]
                     + fit["@variables"]["bias_atom_e"][t, 0]
                     + ser["@variables"]["out_bias"][0, t, 0])
        out.append(ae)
    return np.array(out)


def tf_energy(ser, data):
    """Frame 0's energy by DeePMD-kit's TensorFlow backend from the same serialization. It is
    not a reference: TF never puts a skip connection on the first fitting layer, whereas
    dpmodel and PyTorch do whenever its widths allow (here: se_e2_r 16 → 16, se_e3 8 → 16), so
    TF's number differs in those cases; recorded to show that this is the only difference."""
    from deepmd.tf.env import tf
    from deepmd.tf.model.model import Model as TFModel

    nt = len(ser["type_map"])
    tf.reset_default_graph()
    model = TFModel.deserialize(copy.deepcopy(ser))
    ph = [tf.placeholder(tf.float64, [None]), tf.placeholder(tf.float64, [None]),
          tf.placeholder(tf.int32, [None]), tf.placeholder(tf.int32, [nt + 2]),
          tf.placeholder(tf.int32, [None])]
    out = model.build(ph[0], ph[2], ph[3], ph[1], ph[4], {}, reuse=False)
    n = len(data["atype"])
    natoms = np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)])
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        e = sess.run(out["energy"], {
            ph[0]: data["coord"][0].reshape(-1), ph[1]: data["box"][0].reshape(-1),
            ph[2]: data["atype"], ph[3]: natoms,
            ph[4]: np.array([0, 0, 0, 2, 2, 2], dtype=np.int32)})
    return float(np.asarray(e).reshape(-1)[0])


def first_fit_layer_skips(ser):
    lay = ser["fitting"]["nets"]["networks"][0]["layers"][0]
    nin, nout = lay["@variables"]["w"].shape
    return bool(lay["resnet"] and (nout == nin or nout == 2 * nin))


def fd_forces(energy_fn, data, atoms, h=1e-4):
    """−∂E/∂r of frame 0 for the listed atoms: [len(atoms), 3]."""
    out = np.zeros((len(atoms), 3))
    for i, a in enumerate(atoms):
        for c in range(3):
            def f(s):
                x = data["coord"][:1].copy()
                x[0, a, c] += s
                return energy_fn(x, data["box"][:1])
            out[i, c] = -d5(f, h)
    return out


def fd_virial(energy_fn, data, h=1e-4):
    """−∂E/∂ε_ab of frame 0 under the homogeneous strain r → r(1+ε) (row vectors, box too)."""
    out = np.zeros((3, 3))
    for a in range(3):
        for b in range(3):
            def f(s):
                m = np.eye(3)
                m[a, b] += s
                return energy_fn(data["coord"][:1] @ m, data["box"][:1] @ m)
            out[a, b] = -d5(f, h)
    return out


def convert_and_deeppot(yaml_path, data, tmp):
    """`dp convert-backend` yaml → .pth → yaml, and DeepPot on the .pth."""
    from deepmd.infer import DeepPot

    pth = os.path.join(tmp, "model.pth")
    back = os.path.join(tmp, "back.yaml")
    dp = os.path.join(os.path.dirname(sys.executable), "dp")
    for a, b in [(yaml_path, pth), (pth, back)]:
        subprocess.run([dp, "convert-backend", a, b], check=True, capture_output=True)
    nf = data["coord"].shape[0]
    e, f, v, ae, _ = DeepPot(pth).eval(
        data["coord"].reshape(nf, -1), data["box"].reshape(nf, 9), data["atype"], atomic=True)
    return {"energy": e.reshape(nf), "atom_energy": ae.reshape(nf, -1),
            "force": f.reshape(nf, -1, 3), "virial": v.reshape(nf, 9)}, back


def array_diff(x, y):
    """Largest difference between the arrays of two nested models (dicts and lists of arrays),
    over the keys both have."""
    worst = [0.0]

    def walk(x, y):
        if isinstance(x, dict):
            for k in x:
                if k in y:
                    walk(x[k], y[k])
        elif isinstance(x, list) and isinstance(y, list):
            for u, w in zip(x, y):
                walk(u, w)
        elif isinstance(x, np.ndarray):
            worst[0] = max(worst[0], float(np.abs(x - np.asarray(y)).max()) if x.size else 0.0)

    walk(x, y)
    return worst[0]


def yaml_roundtrip_diff(ser, back):
    """Largest difference between every array of the model and of its .pth → yaml round trip."""
    return array_diff(ser, load_dp_model(back)["model"])


def loss_fn(pt, data, lpar, lr):
    from deepmd.pt.loss.ener import EnergyStdLoss

    nf, n = data["coord"].shape[:2]
    loss = EnergyStdLoss(starter_learning_rate=START_LR, **lpar)
    inp = {
        "coord": torch.tensor(data["coord"].reshape(nf, -1), dtype=torch.float64),
        "atype": torch.tensor(np.tile(data["atype"], (nf, 1)), dtype=torch.int64),
        "box": torch.tensor(data["box"].reshape(nf, 9), dtype=torch.float64),
    }
    one = 1.0
    label = {
        "energy": torch.tensor(data["energy"].reshape(nf, 1)),
        "force": torch.tensor(data["force"]),
        "find_energy": one,
        "find_force": one,
    }
    if "virial" in data:
        label["virial"] = torch.tensor(data["virial"])
        label["find_virial"] = one
    pt.train(True)  # create_graph: the force and virial are differentiable w.r.t. parameters
    pred, l, more = loss(inp, pt, label, n, lr)
    return l, pred, more


def hand_loss(pred, data, lpar, lr, inv):
    """EnergyStdLoss's formula from the model's outputs, with inv for its 1/N (to document it)."""
    coef = lr / START_LR
    p = lambda k: lpar["limit_pref_" + k] + (lpar["start_pref_" + k] - lpar["limit_pref_" + k]) * coef
    e = pred["energy"].detach().numpy().reshape(-1)
    f = pred["force"].detach().numpy()
    out = p("e") * np.mean((e - data["energy"]) ** 2 * inv) + p("f") * np.mean((f - data["force"]) ** 2)
    if "virial" in data and (lpar["start_pref_v"] or lpar["limit_pref_v"]):
        v = pred["virial"].detach().numpy().reshape(-1, 9)
        out += p("v") * np.mean(np.mean((v - data["virial"]) ** 2, axis=1) * inv)
    return float(out), {k: p(k) for k in "efv"}


def grads(pt, data, lpar, names):
    pt.zero_grad(set_to_none=True)
    l, pred, more = loss_fn(pt, data, lpar, LR)
    l.backward()
    g = {}
    for name, prm in pt.named_parameters():
        if name in names:
            g[names[name]] = (np.zeros(tuple(prm.shape)) if prm.grad is None
                              else prm.grad.detach().numpy().copy())
    return float(l.detach()), pred, more, g


def hand_grads(pt, data, lpar, names, inv):
    """hand_loss's formula in torch on the PT model's outputs, and its gradient by autograd."""
    coef = LR / START_LR
    p = lambda k: lpar["limit_pref_" + k] + (lpar["start_pref_" + k] - lpar["limit_pref_" + k]) * coef
    pt.zero_grad(set_to_none=True)
    r = pt_eval(pt, data["coord"], data["box"], data["atype"], train=True)
    de = r["energy"].reshape(-1) - torch.tensor(data["energy"])
    df = r["force"].reshape(data["force"].shape) - torch.tensor(data["force"])
    loss = p("e") * torch.mean(de**2 * inv) + p("f") * torch.mean(df**2)
    if "virial" in data and (lpar["start_pref_v"] or lpar["limit_pref_v"]):
        dv = r["virial"].reshape(-1, 9) - torch.tensor(data["virial"])
        loss = loss + p("v") * torch.mean(torch.mean(dv**2, dim=1) * inv)
    loss.backward()
    g = {}
    for name, prm in pt.named_parameters():
        if name in names:
            g[names[name]] = (np.zeros(tuple(prm.shape)) if prm.grad is None
                              else prm.grad.detach().numpy().copy())
    return float(loss.detach()), g


def grad_rel_diff(a, b):
    """Largest |a − b| over all tensors, relative to the largest |b|."""
    num = max(float(np.abs(a[k] - b[k]).max()) for k in b)
    return num / max(float(np.abs(b[k]).max()) for k in b)


def fd_param(pt, data, lpar, names, pick, h=1e-4):
    """Derivative of DeePMD-kit's loss in one element of one parameter (d5)."""
    inv = {v: k for k, v in names.items()}
    prm = dict(pt.named_parameters())[inv[pick[0]]]
    idx = pick[1]
    with torch.no_grad():
        orig = prm[idx].item()

    def f(s):
        with torch.no_grad():
            prm[idx] = orig + s
        return float(loss_fn(pt, data, lpar, LR)[0].detach())

    d = d5(f, h)
    with torch.no_grad():
        prm[idx] = orig
    return d


def hand_written_losses(pt, data, losses, names, n, arrays):
    """The loss written out by hand (hand_grads), for each (label, loss parameters, DeePMD-kit's
    gradient) of `losses`: with f32(1/N) it must give DeePMD-kit's gradient (this proves the
    formula); with the float64 1/N that dpw uses, it gives the gradient dpw should match to 1e-12,
    stored in `arrays` as `grad_f64inv.` / `vgrad_f64inv.`."""
    inv32 = float(np.float32(1.0) / np.float32(n))
    hand = {}
    for lab, lp, ref in losses:
        l32, g32 = hand_grads(pt, data, lp, names, inv32)
        l64, g64 = hand_grads(pt, data, lp, names, 1.0 / n)
        pre = "grad_f64inv." if lab == "loss" else "vgrad_f64inv."
        for k in sorted(g64):
            arrays[pre + k] = g64[k]
        hand[lab] = {
            "value_f32_inv": l32,
            "value_f64_inv": l64,
            "grad_f32_inv_vs_deepmd_max_rel": grad_rel_diff(g32, ref),
            "grad_f64_inv_vs_deepmd_max_rel": grad_rel_diff(g64, ref),
        }
    return hand


def fd_check(pt, data, lpar, names, g, key, idx, label):
    """DeePMD-kit's loss `lpar` by finite differences in one parameter against autograd's `g`."""
    fd = fd_param(pt, data, lpar, names, (key, idx))
    auto = float(g[key][idx])
    return {"of": label, "tensor": key, "index": list(idx), "h": 1e-4,
            "scheme": "fourth-order central", "autograd": auto, "fd": fd,
            "rel_err": abs(fd - auto) / abs(auto)}


def fd_largest(pt, names, g, key, label, loss, h=1e-4):
    """The loss (`loss()`, a float) by finite differences in the parameter `key`'s entry of the
    largest autograd gradient `g[key]`, against that gradient (`names`: torch name → dpw name)."""
    inv = {v: k for k, v in names.items()}
    prm = dict(pt.named_parameters())[inv[key]]
    idx = tuple(int(i) for i in np.unravel_index(np.abs(g[key]).argmax(), g[key].shape))
    with torch.no_grad():
        orig = prm[idx].item()

    def f(s):
        with torch.no_grad():
            prm[idx] = orig + s
        return loss()

    fd = d5(f, h)
    with torch.no_grad():
        prm[idx] = orig
    auto = float(g[key][idx])
    return {"of": label, "tensor": key, "index": list(idx), "h": h,
            "scheme": "fourth-order central", "autograd": auto, "fd": fd,
            "rel_err": abs(fd - auto) / abs(auto)}


def save_train_step(out, data, pred, arrays, meta):
    """train_step.npz (the frames, labels, DeePMD-kit's predictions and the `arrays` of
    gradients) and train_step.json (`meta`)."""
    np.savez(os.path.join(out, "train_step.npz"), coord=data["coord"], box=data["box"],
             atype=data["atype"], energy_label=data["energy"], force_label=data["force"],
             **({"virial_label": data["virial"]} if "virial" in data else {}),
             energy=pred["energy"].detach().numpy().reshape(-1),
             force=pred["force"].detach().numpy(),
             virial=pred["virial"].detach().numpy().reshape(-1, 9), **arrays)
    with open(os.path.join(out, "train_step.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")


def train_step(out, pt, data, names, generator, system, frames, fd_keys, virial, periodic=None,
               params=None, extra_meta=None, more_checks=None, save=None):
    """One EnergyStdLoss step of the model `pt` (DeePMD-kit PT, or anything `loss_fn` drives) on
    `data`, written to `out`/train_step.{npz,json}: the step of dpa1.py, dpa2.py, dpa3.py and
    pairtab.py (this file's own run_case keeps its variant, with two losses in its fd checks).

    `names`: {torch parameter name: dpw name}. `virial`: the loss has a virial term (LOSS, and the
    virial term alone, LOSS_V, as `vgrad.`); else LOSS_NO_V. `periodic`: recorded when given.
    `params`: None writes every parameter as `param.<name>`; a {dpw name: array} instead asserts
    that the model's parameters are these, bit for bit, and writes none. `extra_meta` is added to
    the json after the loss values; `more_checks(g, arrays, hand, loss_value)` returns more json
    entries (added after `hand_written_loss`). Finite differences of DeePMD-kit's loss check the
    largest gradient entry of each tensor of `fd_keys`. `save(out, data, pred, arrays, meta)`
    writes the files (default save_train_step).

    Returns (loss value, train_step.json's dict).
    """
    lpar = LOSS if virial else LOSS_NO_V
    lval, tpred, more, g = grads(pt, data, lpar, names)
    n = data["coord"].shape[1]
    hl, prefs = hand_loss(tpred, data, lpar, LR, 1.0 / n)
    # DeePMD-kit 3.2.0 PT: EnergyStdLoss's 1/N is float32 (see run_case)
    hl32, _ = hand_loss(tpred, data, lpar, LR, float(np.float32(1.0) / np.float32(n)))
    arrays = {}
    params_now = {names[k]: p.detach().numpy().copy() for k, p in pt.named_parameters()
                  if k in names}
    for k in sorted(g):
        if params is None:
            arrays["param." + k] = params_now[k]
        else:
            assert np.array_equal(params_now[k], params[k]), k
        arrays["grad." + k] = g[k]
    tmeta = {
        "generator": generator,
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU; EnergyStdLoss, loss.backward()",
        "system": system,
    }
    if periodic is not None:
        tmeta["periodic"] = periodic
    tmeta.update({
        "frames": frames,
        "loss": lpar,
        "start_lr": START_LR,
        "lr": LR,
        "prefactors_at_lr": prefs,
        "loss_value": lval,
        "loss_value_formula_f32_inv": hl32,
        "loss_value_formula_f64_inv": hl,
        "more_loss": {k: float(v) for k, v in more.items()
                      if isinstance(v, (float, torch.Tensor)) and np.isfinite(float(v))},
        "n_tensors": len(g),
        "n_parameters": int(sum(v.size for v in g.values())),
    })
    tmeta.update(extra_meta or {})
    gv = None
    if virial:
        lv, _, _, gv = grads(pt, data, LOSS_V, names)
        for k in sorted(gv):
            arrays["vgrad." + k] = gv[k]
        tmeta["loss_virial_only"] = LOSS_V
        tmeta["loss_value_virial_only"] = lv
    hand = hand_written_losses(
        pt, data, [("loss", lpar, g)] + ([("loss_virial_only", LOSS_V, gv)] if virial else []),
        names, n, arrays)
    tmeta["hand_written_loss"] = hand
    if more_checks is not None:
        tmeta.update(more_checks(g, arrays, hand, lval))
    fds = []
    for key in fd_keys:
        idx = tuple(int(i) for i in np.unravel_index(np.abs(g[key]).argmax(), g[key].shape))
        fds.append(fd_check(pt, data, lpar, names, g, key, idx, "loss"))
    tmeta["fd_param_checks"] = fds
    (save or save_train_step)(out, data, tpred, arrays, tmeta)
    return lval, tmeta


def run_case(name, case):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    ev = load(case, case["eval_frames"])
    tr = load(case, case["train_frames"])
    params, ser = make_model(case, ev)
    nt = len(case["type_map"])
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {
        "backend": "dpmodel", "model": ser, "model_def_script": params, "@variables": {}})

    pt = pt_model(ser)
    dp = dp_model(ser)
    names = dpw_names(pt, ser)

    # ---- eval: PT, dpmodel, DeepPot on the converted .pth
    r = pt_eval(pt, ev["coord"], ev["box"], ev["atype"])
    nf = len(case["eval_frames"])
    pred = {
        "energy": r["energy"].detach().numpy().reshape(nf),
        "atom_energy": r["atom_energy"].detach().numpy().reshape(nf, -1),
        "force": r["force"].detach().numpy().reshape(nf, -1, 3),
        "virial": r["virial"].detach().numpy().reshape(nf, 9),
    }
    dpe, dpae = dp_energy(dp, ev["coord"], ev["box"], ev["atype"])
    with tempfile.TemporaryDirectory() as tmp:
        dpot, back = convert_and_deeppot(yaml_path, ev, tmp)
        rt = yaml_roundtrip_diff(ser, back)
    e_pt = lambda x, b: float(pt_eval(pt, x, b, ev["atype"])["energy"].detach().numpy().sum())
    e_dp = lambda x, b: float(dp_energy(dp, x, b, ev["atype"])[0].sum())
    n = ev["coord"].shape[1]
    fd_atoms = [0, n - 1]  # the first atom (type 0) and the last one (the last type)
    fdf_pt = fd_forces(e_pt, ev, fd_atoms)
    fdf_dp = fd_forces(e_dp, ev, fd_atoms)
    fdv = fd_virial(e_pt, ev)
    v0 = pred["virial"][0].reshape(3, 3)
    checks = {
        "pt_vs_dpmodel_energy_max_abs": float(np.abs(pred["energy"] - dpe).max()),
        "pt_vs_dpmodel_energy_max_rel": rel(pred["energy"], dpe),
        "pt_vs_dpmodel_atom_energy_max_abs": float(np.abs(pred["atom_energy"] - dpae).max()),
        "pt_vs_deeppot_pth_max_abs": {k: float(np.abs(pred[k] - dpot[k]).max()) for k in pred},
        "yaml_to_pth_to_yaml_max_abs_param_diff": rt,
        "fd_force": {
            "frame": 0, "atoms": fd_atoms, "h": 1e-4, "scheme": "fourth-order central",
            "force_pt": pred["force"][0, fd_atoms].tolist(),
            "fd_of_pt_energy": fdf_pt.tolist(),
            "fd_of_dpmodel_energy": fdf_dp.tolist(),
            "max_abs_err_pt": float(np.abs(fdf_pt - pred["force"][0, fd_atoms]).max()),
            "max_abs_err_dpmodel": float(np.abs(fdf_dp - pred["force"][0, fd_atoms]).max()),
        },
        "fd_virial": {
            "frame": 0, "h": 1e-4,
            "scheme": "−∂E/∂ε_ab, coord and box (rows) times (1+ε), fourth-order central; vs "
            "virial[3a+b]",
            "fd": fdv.reshape(-1).tolist(),
            "max_abs_err": float(np.abs(fdv - v0).max()),
            "max_abs_err_vs_transpose": float(np.abs(fdv - v0.T).max()),
        },
    }
    if ser["descriptor"]["type"] == "hybrid":
        checks["sub_descriptor_own_nlist_max_diff"] = hybrid_sub_check(ser, ev)
    etf = tf_energy(ser, ev)
    checks["tensorflow_backend_frame0"] = {
        "energy": etf,
        "minus_pt": etf - float(pred["energy"][0]),
        "first_fitting_layer_has_skip_in_pt": first_fit_layer_skips(ser),
        "note": "not a reference: TF never applies a skip on the first fitting layer",
    }
    ind = independent_atom_energy(ser, ev)
    checks["independent_numpy_vs_pt_atom_energy_max_abs"] = float(
        np.abs(ind - pred["atom_energy"]).max())
    checks["independent_numpy_vs_pt_energy_max_abs"] = float(
        np.abs(ind.sum(1) - pred["energy"]).max())
    np.savez(os.path.join(out, "eval.npz"), coord=ev["coord"], box=ev["box"], atype=ev["atype"],
             energy_label=ev["energy"], force_label=ev["force"],
             **({"virial_label": ev["virial"]} if "virial" in ev else {}),
             energy=pred["energy"], atom_energy=pred["atom_energy"], force=pred["force"],
             virial=pred["virial"], energy_dpmodel=dpe, atom_energy_dpmodel=dpae)
    meta = {
        "generator": "scripts/make-reference/descriptors.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"],
        "frames": case["eval_frames"],
        "atom_order": "type.raw's (the system is sorted by type already)",
        "type_map": case["type_map"],
        "descriptor": case["descriptor"],
        "fitting": FIT,
        "neighbour_list": neighbour_info(case, ev, ser),
        "stats": "davg/dstd by hand (see the script), out_bias from compute_output_stats on the "
        "eval frames",
        "davg_dstd_used": [
            {"type": sub["type"], "shape": list(sub["@variables"]["davg"].shape),
             "davg_per_type": sub["@variables"]["davg"][:, 0].tolist(),
             "dstd_per_type": sub["@variables"]["dstd"][:, 0].tolist()}
            for sub in leaf_descriptors(ser["descriptor"])],
        "deepmd_compute_input_stats_on_these_frames": deepmd_input_stats(ser, ev),
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
    print(f"{name}: eval PT−dpmodel {checks['pt_vs_dpmodel_energy_max_abs']:.1e}, "
          f"PT−pth {max(checks['pt_vs_deeppot_pth_max_abs'].values()):.1e}, "
          f"fd force {checks['fd_force']['max_abs_err_pt']:.1e}/"
          f"{checks['fd_force']['max_abs_err_dpmodel']:.1e}, "
          f"fd virial {checks['fd_virial']['max_abs_err']:.1e}, "
          f"independent {checks['independent_numpy_vs_pt_energy_max_abs']:.1e}, "
          f"TF−PT {checks['tensorflow_backend_frame0']['minus_pt']:.1e}", flush=True)

    # ---- train step
    lpar = LOSS if case["virial"] else LOSS_NO_V
    lval, tpred, more, g = grads(pt, tr, lpar, names)
    n = tr["coord"].shape[1]
    hl, prefs = hand_loss(tpred, tr, lpar, LR, 1.0 / n)
    # DeePMD-kit 3.2.0 PT: the model's "mask" is an integer tensor, so EnergyStdLoss's
    # inv = 1.0 / sum(mask) is float32; the energy and virial terms use f32(1/N).
    hl32, _ = hand_loss(tpred, tr, lpar, LR, float(np.float32(1.0) / np.float32(n)))
    l_start = float(loss_fn(pt, tr, lpar, START_LR)[0].detach())
    arrays = {}
    params_now = {names[k]: p.detach().numpy().copy() for k, p in pt.named_parameters()
                  if k in names}
    for k in sorted(g):
        arrays["param." + k] = params_now[k]
        arrays["grad." + k] = g[k]
    tmeta = {
        "generator": "scripts/make-reference/descriptors.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU; EnergyStdLoss, loss.backward()",
        "system": case["system"],
        "frames": case["train_frames"],
        "loss": lpar,
        "start_lr": START_LR,
        "lr": LR,
        "prefactors_at_lr": prefs,
        "loss_value": lval,
        "loss_value_formula_f32_inv": hl32,
        "loss_value_formula_f64_inv": hl,
        "loss_formula": "pref_e*mean_frames(dE^2*inv) + pref_f*mean(dF^2) "
        "+ pref_v*mean_frames(mean_9(dV^2)*inv), inv = f32(1/N) in DeePMD-kit 3.2.0 PT",
        "loss_value_at_start_lr": l_start,
        "more_loss": {k: float(v) for k, v in more.items()
                      if isinstance(v, (float, torch.Tensor)) and np.isfinite(float(v))},
        "n_tensors": len(g),
        "n_parameters": int(sum(v.size for v in g.values())),
    }
    if case["virial"]:
        lv, _, _, gv = grads(pt, tr, LOSS_V, names)
        for k in sorted(gv):
            arrays["vgrad." + k] = gv[k]
        tmeta["loss_virial_only"] = LOSS_V
        tmeta["loss_value_virial_only"] = lv
    tmeta["hand_written_loss"] = hand_written_losses(
        pt, tr, [("loss", lpar, g)] + ([("loss_virial_only", LOSS_V, gv)] if case["virial"] else []),
        names, n, arrays)
    # finite differences of DeePMD-kit's loss: the largest gradient element of the first
    # embedding layer's w (through the force's second derivatives) and of the first fitting w
    fds = []
    first_embed = sorted(k for k in g if ".embed." in "." + k and k.endswith("layer0.w"))[0]
    for key in [first_embed, "fit.t0.layer0.w"]:
        idx = tuple(int(i) for i in np.unravel_index(np.abs(g[key]).argmax(), g[key].shape))
        for lp, gg, lab in [(lpar, g, "loss")] + (
                [(LOSS_V, gv, "loss_virial_only")] if case["virial"] else []):
            fds.append(fd_check(pt, tr, lp, names, gg, key, idx, lab))
    tmeta["fd_param_checks"] = fds
    tmeta["fd_note"] = ("finite differences of DeePMD-kit's EnergyStdLoss (f32 1/N), so they "
                        "check `grad.`")
    save_train_step(out, tr, tpred, arrays, tmeta)
    print(f"{name}: loss {lval!r} (formula f32 inv {hl32!r}, f64 {hl!r}), {len(g)} tensors, "
          f"{tmeta['n_parameters']} parameters; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

"""DeePMD-kit 3.2.0's own numbers for DPA-1: se_atten and se_atten_v2 (issue 30).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu]==3.2.0"`, which
brings PyTorch) from the repository root: `python scripts/make-reference/dpa1.py [case ...]`
(no argument: every case of CASES). Like descriptors.py (whose helpers it imports), it runs
`dp convert-backend` (the `dp` beside the running python) to prove DeePMD-kit reads the
model.yaml it writes. A few minutes on 2 cores.
Writes tests/reference/dpa1/<case>/{input.json, model.yaml, eval.npz, eval.json,
train_step.npz, train_step.json}; tests/reference/dpa1/README.md describes them.

Per case: a small float64 se_atten / se_atten_v2 + ener model is initialised by DeePMD-kit's
numpy backend (`dpmodel`, seeded); every descriptor key whose `dpmodel` class default differs
from `argcheck`'s (what `dp train` and dpw apply) is spelled out in the case, so input.json means
the same model to both. davg/dstd are set by hand (close to DeePMD-kit's own statistics, which
are recorded beside them), the energy bias comes from DeePMD-kit's `compute_output_stats`.
- eval: the PyTorch model built from the serialization gives energy, atom_energy, force and
  virial; `dpmodel` (numpy) gives energy and atom_energy; `DeepPot` on the .pth that
  `dp convert-backend` made from model.yaml gives all four again; `independent_atom_energy`
  below recomputes the atomic energies from the README's formulas alone (numpy).
- train step: DeePMD-kit PT's `EnergyStdLoss`, `loss.backward()` (PyTorch double backward),
  `.grad` of every parameter, as descriptors.py does, with the float64-1/N variant
  (`grad_f64inv.`) that dpw should match.
"""

import copy
import json
import os
import sys
import tempfile

import deepmd
import numpy as np
import torch
from deepmd.dpmodel.utils.serialization import save_dp_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import descriptors as base  # noqa: E402  (the shared helpers of the other descriptor cases)

OUT = "tests/reference/dpa1"

WATER = dict(base.WATER, davg_r=[0.15, 0.17], dstd=[[0.12, 0.09], [0.11, 0.08]])
ALLOY = dict(base.ALLOY, davg_r=[0.09, 0.10, 0.085], dstd=[[0.11, 0.06], [0.115, 0.065],
                                                        [0.105, 0.062]])


def atten(kind, sel, rcut, **over):
    """A small se_atten / se_atten_v2. Every key whose dpmodel class default differs from
    argcheck's default is given, so get_model here and `dp train` / dpw build the same model."""
    d = {
        "type": kind, "sel": sel, "rcut": rcut, "rcut_smth": 0.5, "neuron": [4, 8, 16],
        "axis_neuron": 4, "tebd_dim": 8, "attn": 8, "attn_layer": 2, "attn_dotr": True,
        "attn_mask": False, "resnet_dt": False, "type_one_side": False,
        "set_davg_zero": kind == "se_atten", "scaling_factor": 1.0, "normalize": True,
        "temperature": None, "trainable_ln": True, "ln_eps": 1e-5,
        "concat_output_tebd": True, "use_econf_tebd": False, "use_tebd_bias": False,
        "activation_function": "tanh", "seed": 1, "precision": "float64",
    }
    if kind == "se_atten":
        d["tebd_input_mode"] = "concat"
        d["smooth_type_embedding"] = False  # argcheck's default (the class says True)
    d.update(over)
    if d["temperature"] is None:
        del d["temperature"]
    return d


# sel: at least the largest neighbour count within rcut on the frames used (checked and
# recorded), so no list is truncated and nothing hinges on ties in distance; there is padding
# for every atom, so the padding slots' contributions (see the README) are exercised.
CASES = {
    # no attention; the type embedding net is 2 → 4, which DeePMD-kit gives a [x, x] skip
    "se_atten_l0_water": dict(WATER, descriptor=atten("se_atten", 40, 4.0, attn_layer=0,
                                                      tebd_dim=4)),
    # two attention layers, concat, not smooth (argcheck's default), davg ≠ 0 so that the
    # padding slots' G (built from atom 0's type embedding) reaches the descriptor
    "se_atten_l2_alloy": dict(ALLOY, descriptor=atten("se_atten", 48, 4.0,
                                                      set_davg_zero=False)),
    # se_atten_v2: strip, smooth, two attention layers
    "se_atten_v2_alloy": dict(ALLOY, descriptor=atten("se_atten_v2", 48, 4.0)),
    # se_atten with the other options: smooth attention, type_one_side, no normalize, a
    # temperature, trainable_ln false, no tebd in the output, resnet_dt, tebd bias
    "se_atten_l2_opts_water": dict(WATER, descriptor=atten(
        "se_atten", 40, 4.0, smooth_type_embedding=True, type_one_side=True, normalize=False,
        temperature=0.7, trainable_ln=False, ln_eps=1e-3, concat_output_tebd=False,
        resnet_dt=True, use_tebd_bias=True, attn_layer=1, attn_dotr=False,
        set_davg_zero=False)),
}


def set_stats(d, case):
    """davg/dstd by hand, [ntypes, nnei, 4]: one row per centre type, every slot equal (as
    DeePMD-kit's statistics make them for a mixed-type list); angular davg 0."""
    nt, nnei = len(case["type_map"]), sum(d["sel"])
    davg = np.zeros((nt, 4))
    if not d["set_davg_zero"]:
        davg[:, 0] = case["davg_r"]
    dstd = np.array([[r, a, a, a] for r, a in case["dstd"]])
    d["@variables"]["davg"] = np.repeat(davg[:, None, :], nnei, axis=1)
    d["@variables"]["dstd"] = np.repeat(dstd[:, None, :], nnei, axis=1)


def make_model(case, data):
    from deepmd.dpmodel.model.model import get_model
    from deepmd.dpmodel.utils.stat import compute_output_stats

    nt = len(case["type_map"])
    params = {"type_map": case["type_map"], "descriptor": case["descriptor"],
              "fitting_net": base.FIT}
    ser = get_model(copy.deepcopy(params)).serialize()
    set_stats(ser["descriptor"], case)
    natoms = np.concatenate([[len(data["atype"])] * 2, np.bincount(data["atype"], minlength=nt)])
    sampled = [{
        "energy": data["energy"].reshape(-1, 1),
        "natoms": np.tile(natoms, (len(data["energy"]), 1)),
        "find_energy": np.float32(1.0),
    }]
    bias, _ = compute_output_stats(sampled, nt, ["energy"], rcond=None)
    ser["@variables"]["out_bias"] = bias["energy"].reshape(1, nt, 1)
    return params, ser


def dpw_names(pt):
    """{PyTorch parameter name: dpw's name}, for every parameter with elements (README)."""
    out = {}
    for name, p in pt.named_parameters():
        if p.numel() == 0:  # compress_data / compress_info placeholders
            continue
        parts = name.split(".")
        v = {"matrix": "w", "bias": "b", "idt": "idt"}[parts[-1]]
        if parts[1] == "fitting_net":
            assert parts[4] == "0", name  # mixed types: one fitting net for every type
            out[name] = f"fit.layer{parts[-2]}.{v}"
        elif parts[2] == "type_embedding":
            out[name] = f"tebd.layer{parts[-2]}.{v}"
        elif parts[3] in ("filter_layers", "filter_layers_strip"):
            assert parts[5] == "0", name  # ndim 0: one net
            net = "embed" if parts[3] == "filter_layers" else "embed_strip"
            out[name] = f"{net}.layer{parts[-2]}.{v}"
        else:
            assert parts[3] == "dpa1_attention", name
            k, sub = parts[5], parts[6]
            what = {"attention_layer": parts[7].replace("_proj", ""),
                    "attn_layer_norm": "ln"}[sub]
            out[name] = f"attn{k}.{what}.{v}"
    return out


def mixed_nlist_info(case, data, ser):
    d = ser["descriptor"]
    counts = base.neighbour_info(dict(case, type_map=["all"]), dict(
        data, atype=np.zeros_like(data["atype"])), {"descriptor": dict(d, sel=d["sel"])})
    info = counts["descriptors"][0]
    return {
        "rcut": d["rcut"], "rcut_smth": d["rcut_smth"], "sel": d["sel"],
        "max_neighbours_within_rcut_on_eval_frames":
            info["max_neighbours_within_rcut_on_eval_frames"][0],
        "order": "one section for all types: the neighbours within rcut nearest first, unused "
        "slots -1 (padding)",
    }


def nearest_to_rcut(case, data):
    """The pair distance (all images) of frame 0 nearest rcut, and its relative offset."""
    import itertools

    x, b = data["coord"][0], data["box"][0]
    shifts = np.array([np.array(s) @ b for s in itertools.product([-1, 0, 1], repeat=3)])
    r = np.linalg.norm(x[None, :, None, :] + shifts[None, None] - x[:, None, None, :], axis=-1)
    rc = case["descriptor"]["rcut"]
    rn = float(r.ravel()[np.argmin(np.abs(r.ravel() - rc))])
    return {"r": rn, "relative_to_rcut": (rn - rc) / rc}


def deepmd_input_stats(ser, data):
    """DeePMD-kit's own davg/dstd (`compute_input_stats`, the path of `dp train`, honouring
    set_davg_zero) on these frames, per centre type (every slot row is equal): not used by the
    model, recorded so that dpw's statistics for DPA-1 can be checked too."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor

    nf, n = data["coord"].shape[:2]
    nt = len(ser["type_map"])
    sample = [{
        "coord": data["coord"], "atype": np.tile(data["atype"], (nf, 1)),
        "box": data["box"].reshape(nf, 9),
        "natoms": np.tile(np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)]),
                          (nf, 1)),
    }]
    obj = BaseDescriptor.deserialize(copy.deepcopy(ser["descriptor"]))
    obj.compute_input_stats(sample)
    davg, dstd = (np.asarray(a) for a in obj.get_stat_mean_and_stddev())
    assert np.all(davg == davg[:, :1]) and np.all(dstd == dstd[:, :1])
    return {"shape": list(davg.shape), "davg_per_type": davg[:, 0].tolist(),
            "dstd_per_type": dstd[:, 0].tolist()}


def layer(lay, x):
    """One serialized Layer as DeePMD-kit's NativeLayer applies it (skip by widths)."""
    v = lay["@variables"]
    y = x @ v["w"]
    if v.get("b") is not None:
        y = y + v["b"]
    act = (lay["activation_function"] or "none").lower()
    if act == "tanh":
        y = np.tanh(y)
    else:
        assert act in ("none", "linear"), lay
    if v.get("idt") is not None:
        y = y * v["idt"]
    if lay["resnet"] and v["w"].shape[1] == v["w"].shape[0]:
        y = y + x
    elif lay["resnet"] and v["w"].shape[1] == 2 * v["w"].shape[0]:
        y = y + np.concatenate([x, x], axis=-1)
    return y


def net(n, x):
    for lay in n["layers"]:
        x = layer(lay, x)
    return x


def independent_atom_energy(ser, data):
    """Atomic energies from the README's formulas alone: numpy, an own mixed-type neighbour
    list over all periodic images, and the serialized model. Agreement with DeePMD-kit checks
    the definitions dpw follows, padding slots included."""
    d = ser["descriptor"]
    nt = len(ser["type_map"])
    rc, rs, nnei = d["rcut"], d["rcut_smth"], sum(d["sel"])
    davg, dstd = d["@variables"]["davg"], d["@variables"]["dstd"]
    concat = d.get("tebd_input_mode", "strip") == "concat" and d["type"] != "se_atten_v2"
    smooth = d.get("smooth_type_embedding", True) if d["type"] != "se_atten_v2" else True
    # T: the type embedding of each type (one-hot through the net), then a zero padding row
    tebd = net(d["type_embedding"]["embedding"], np.eye(nt))
    att = d["attention_layers"]["attention_layers"]

    def sw(r):
        u = np.clip((r - rs) / (rc - rs), 0.0, 1.0)
        return u**3 * (-6 * u**2 + 15 * u - 10) + 1

    out = []
    for x, box in zip(data["coord"], data["box"]):
        atype = data["atype"]
        n = len(x)
        frac = x @ np.linalg.inv(box)
        x = (frac - np.floor(frac)) @ box
        heights = abs(np.linalg.det(box)) / np.linalg.norm(
            np.cross(box[[1, 2, 0]], box[[2, 0, 1]]), axis=1)
        k = np.ceil(rc / heights).astype(int)
        shifts = np.array([np.array([a, b, c]) @ box for a in range(-k[0], k[0] + 1)
                           for b in range(-k[1], k[1] + 1) for c in range(-k[2], k[2] + 1)])
        ae = np.zeros(n)
        for i in range(n):
            ti = atype[i]
            dvec = (x[None, :, :] + shifts[:, None, :] - x[i]).reshape(-1, 3)
            typ = np.tile(atype, len(shifts))
            r = np.linalg.norm(dvec, axis=1)
            r[r == 0] = np.inf
            cand = np.where(r < rc)[0]
            cand = cand[np.argsort(r[cand], kind="stable")][:nnei]
            m = len(cand)
            env = np.zeros((nnei, 4))
            s_ = sw(r[cand])
            env[:m, 0] = s_ / r[cand]
            env[:m, 1:] = dvec[cand] * (s_ / r[cand] ** 2)[:, None]
            rt = (env - davg[ti]) / dstd[ti]
            swj = np.zeros(nnei)
            swj[:m] = s_
            real = np.arange(nnei) < m
            # a padding slot's neighbour index is 0 in DeePMD-kit's gather: atom 0's type
            tj = np.full(nnei, atype[0])
            tj[:m] = typ[cand]
            if concat:
                parts = [rt[:, :1], tebd[tj]]
                if not d["type_one_side"]:
                    parts.append(np.repeat(tebd[ti][None], nnei, axis=0))
                g = net(d["embeddings"]["networks"][0], np.concatenate(parts, axis=1))
            else:
                gs = net(d["embeddings"]["networks"][0], rt[:, :1])
                tin = tebd[tj] if d["type_one_side"] else np.concatenate(
                    [tebd[tj], np.repeat(tebd[ti][None], nnei, axis=0)], axis=1)
                gt = net(d["embeddings_strip"]["networks"][0], tin)
                if smooth:
                    gt = gt * swj[:, None]
                g = gs * gt + gs
            rr = rt[:, 1:]
            rhat = rr / np.maximum(np.linalg.norm(rr, axis=1, keepdims=True), 1e-12)
            for lay in att:
                a = lay["attention_layer"]
                h = a["hidden_dim"]
                qkv = layer(a["in_proj"], g)
                q, kk, v = qkv[:, :h], qkv[:, h:2 * h], qkv[:, 2 * h:]
                if a["normalize"]:
                    q, kk, v = (z / np.linalg.norm(z, axis=1, keepdims=True) for z in (q, kk, v))
                scale = ((h * a["scaling_factor"]) ** -0.5 if a["temperature"] is None
                         else a["temperature"])
                logit = (q * scale) @ kk.T
                if a["smooth"]:
                    logit = (logit + 20.0) * swj[:, None] * swj[None, :] - 20.0
                else:
                    logit = np.where(real[None, :], logit, -np.inf)
                w = np.exp(logit - logit.max(axis=1, keepdims=True))
                w = w / w.sum(axis=1, keepdims=True)
                w = np.where(real[:, None], w, 0.0)
                if a["smooth"]:
                    w = w * swj[:, None] * swj[None, :]
                if a["dotr"]:
                    w = w * (rhat @ rhat.T)
                o = layer(a["out_proj"], w @ v)
                y = g + o
                ln = lay["attn_layer_norm"]
                mu = y.mean(axis=1, keepdims=True)
                var = ((y - mu) ** 2).mean(axis=1, keepdims=True)
                y = (y - mu) / np.sqrt(var + ln["eps"])
                y = y * ln["@variables"]["w"] + ln["@variables"]["b"]
                g = y
            gr = g.T @ rt / nnei  # [M1, 4]
            desc = (gr @ gr[: d["axis_neuron"]].T).reshape(-1)
            if d["concat_output_tebd"]:
                desc = np.concatenate([desc, tebd[ti]])
            fit = ser["fitting"]
            ae[i] = (net(fit["nets"]["networks"][0], desc)[0]
                     + fit["@variables"]["bias_atom_e"][ti, 0]
                     + ser["@variables"]["out_bias"][0, ti, 0])
        out.append(ae)
    return np.array(out)


def run_case(name, case):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    ev = base.load(case, case["eval_frames"])
    tr = base.load(case, case["train_frames"])
    params, ser = make_model(case, ev)
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {
        "backend": "dpmodel", "model": ser, "model_def_script": params, "@variables": {}})

    pt = base.pt_model(ser)
    dp = base.dp_model(ser)
    names = dpw_names(pt)

    # ---- eval: PT, dpmodel, DeepPot on the converted .pth, independent numpy
    r = base.pt_eval(pt, ev["coord"], ev["box"], ev["atype"])
    nf = len(case["eval_frames"])
    pred = {
        "energy": r["energy"].detach().numpy().reshape(nf),
        "atom_energy": r["atom_energy"].detach().numpy().reshape(nf, -1),
        "force": r["force"].detach().numpy().reshape(nf, -1, 3),
        "virial": r["virial"].detach().numpy().reshape(nf, 9),
    }
    dpe, dpae = base.dp_energy(dp, ev["coord"], ev["box"], ev["atype"])
    with tempfile.TemporaryDirectory() as tmp:
        dpot, back = base.convert_and_deeppot(yaml_path, ev, tmp)
        rt = base.yaml_roundtrip_diff(ser, back)
    e_pt = lambda x, b: float(base.pt_eval(pt, x, b, ev["atype"])["energy"].detach().numpy().sum())
    n = ev["coord"].shape[1]
    fd_atoms = [0, n - 1]
    fdf_pt = base.fd_forces(e_pt, ev, fd_atoms)
    fdv = base.fd_virial(e_pt, ev)
    # Frame 0 of both systems has a pair within 6e-5·rcut of rcut, so strains of ±2e-4 move it
    # across: where DeePMD-kit's energy jumps there (concat with davg ≠ 0, README), only a
    # strain that stays on one side measures the virial.
    fdv_small = base.fd_virial(e_pt, ev, h=1e-6)
    near = nearest_to_rcut(case, ev)
    v0 = pred["virial"][0].reshape(3, 3)
    ind = independent_atom_energy(ser, ev)
    # A padding slot takes the type of atom 0 (README): with the last atom moved first, frame
    # 0's energy changes wherever padding reaches the descriptor (concat with davg ≠ 0).
    perm = np.r_[n - 1, np.arange(n - 1)]
    e_perm = float(base.pt_eval(pt, ev["coord"][:1, perm], ev["box"][:1], ev["atype"][perm])[
        "energy"].detach().numpy().sum())
    checks = {
        "pt_vs_dpmodel_energy_max_abs": float(np.abs(pred["energy"] - dpe).max()),
        "pt_vs_dpmodel_energy_max_rel": base.rel(pred["energy"], dpe),
        "pt_vs_dpmodel_atom_energy_max_abs": float(np.abs(pred["atom_energy"] - dpae).max()),
        "pt_vs_deeppot_pth_max_abs": {k: float(np.abs(pred[k] - dpot[k]).max()) for k in pred},
        "yaml_to_pth_to_yaml_max_abs_param_diff": rt,
        "independent_numpy_vs_pt_atom_energy_max_abs": float(
            np.abs(ind - pred["atom_energy"]).max()),
        "independent_numpy_vs_pt_energy_max_abs": float(np.abs(ind.sum(1) - pred["energy"]).max()),
        "atom_order": {
            "frame": 0, "permutation": "the last atom moved first",
            "energy": e_perm, "minus_energy": e_perm - float(pred["energy"][0]),
        },
        "fd_force": {
            "frame": 0, "atoms": fd_atoms, "h": 1e-4, "scheme": "fourth-order central",
            "force_pt": pred["force"][0, fd_atoms].tolist(),
            "fd_of_pt_energy": fdf_pt.tolist(),
            "max_abs_err_pt": float(np.abs(fdf_pt - pred["force"][0, fd_atoms]).max()),
        },
        "fd_virial": {
            "frame": 0, "h": 1e-4,
            "scheme": "−∂E/∂ε_ab, coord and box (rows) times (1+ε), fourth-order central; vs "
            "virial[3a+b]",
            "fd": fdv.reshape(-1).tolist(),
            "max_abs_err": float(np.abs(fdv - v0).max()),
            "pair_nearest_rcut": near,
        },
        "fd_virial_h_1e-6": {
            "frame": 0, "h": 1e-6, "note": "strains of at most 2e-6: no pair crosses rcut",
            "fd": fdv_small.reshape(-1).tolist(),
            "max_abs_err": float(np.abs(fdv_small - v0).max()),
        },
    }
    np.savez(os.path.join(out, "eval.npz"), coord=ev["coord"], box=ev["box"], atype=ev["atype"],
             energy_label=ev["energy"], force_label=ev["force"],
             **({"virial_label": ev["virial"]} if "virial" in ev else {}),
             energy=pred["energy"], atom_energy=pred["atom_energy"], force=pred["force"],
             virial=pred["virial"], energy_dpmodel=dpe, atom_energy_dpmodel=dpae)
    d = ser["descriptor"]
    meta = {
        "generator": "scripts/make-reference/dpa1.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"],
        "frames": case["eval_frames"],
        "atom_order": "type.raw's (the system is sorted by type already)",
        "type_map": case["type_map"],
        "descriptor": case["descriptor"],
        "descriptor_serialized_type": d["type"],
        "fitting": base.FIT,
        "fitting_nets": "one net for every type (the descriptor has mixed types)",
        "neighbour_list": mixed_nlist_info(case, ev, ser),
        "stats": "davg/dstd by hand (see the script), out_bias from compute_output_stats on the "
        "eval frames",
        "davg_dstd_used": {"shape": list(d["@variables"]["davg"].shape),
                           "davg_per_type": d["@variables"]["davg"][:, 0].tolist(),
                           "dstd_per_type": d["@variables"]["dstd"][:, 0].tolist()},
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
          f"fd force {checks['fd_force']['max_abs_err_pt']:.1e}, "
          f"fd virial {checks['fd_virial']['max_abs_err']:.1e} "
          f"(h 1e-6: {checks['fd_virial_h_1e-6']['max_abs_err']:.1e}), "
          f"independent {checks['independent_numpy_vs_pt_atom_energy_max_abs']:.1e}, "
          f"last atom first {checks['atom_order']['minus_energy']:.1e}, "
          f"max nei {meta['neighbour_list']['max_neighbours_within_rcut_on_eval_frames']}"
          f"/{sum(d['sel'])}", flush=True)

    # ---- train step (descriptors.train_step)
    # finite differences of DeePMD-kit's loss: the largest gradient element of the embedding
    # net's first w, of the last attention layer's in_proj w (if any) and of the first fitting w
    keys = ["embed.layer0.w", "tebd.layer0.w", "fit.layer0.w"]
    if d["attn_layer"] > 0:
        keys.insert(2, f"attn{d['attn_layer'] - 1}.in.w")
    lval, tmeta = base.train_step(out, pt, tr, names, "scripts/make-reference/dpa1.py",
                                  case["system"], case["train_frames"], keys, case["virial"])
    hand, fds = tmeta["hand_written_loss"], tmeta["fd_param_checks"]
    print(f"{name}: loss {lval!r}, {tmeta['n_tensors']} tensors, {tmeta['n_parameters']} "
          f"parameters; f64inv vs deepmd {hand['loss']['grad_f64_inv_vs_deepmd_max_rel']:.1e}, "
          f"f32inv {hand['loss']['grad_f32_inv_vs_deepmd_max_rel']:.1e}; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

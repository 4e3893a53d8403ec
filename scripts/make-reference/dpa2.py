"""DeePMD-kit 3.2.0's own numbers for DPA-2 (`"type": "dpa2"`: repinit + repformer; issue 55)
and for `se_e3_tebd` alone (the three-body block of DPA-2's repinit).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`)
from the repository root: `python scripts/make-reference/dpa2.py [case ...]` (no argument: every
case of CASES). It imports descriptors.py for the shared helpers (data loading, the loss and its
hand-written f32/f64 1/N variants, finite differences, the training step) and dpa3.py for the
DeePMD-kit calls that take a non-periodic frame, the synthetic small cell and the own neighbour
list; it runs the `dp` beside the running python (`dp convert-backend`). About 10 minutes on 2
cores. Writes tests/reference/dpa2/<case>/{input.json, model.yaml, eval.npz, eval.json,
train_step.npz, train_step.json} and tests/reference/dpa2/probes.json;
tests/reference/dpa2/README.md describes them, docs/deepmd-spec.md §20 the math.

Per case: a small float64 DPA-2 (or se_e3_tebd) + ener model initialised by DeePMD-kit's numpy
backend (`dpmodel`, seeded). Every repinit, repformer and descriptor key is written out in
input.json (argcheck's defaults except where the case says otherwise). davg/dstd of every block
are DeePMD-kit's own `compute_input_stats` on the eval frames (davg only where set_davg_zero is
false); "const" residual weights are replaced by seeded random values (a mix-up of the residual
vectors must not cancel out); the energy bias comes from DeePMD-kit's compute_output_stats.
- eval: the PyTorch model (from the serialization, the path of `dp convert-backend`) gives
  energy, atom_energy, force and virial; `dpmodel` on numpy gives energy and atom_energy;
  `dpmodel` on torch tensors (DeePMD-kit's `pt_expt` backend) gives all four; `DeepPot` on the
  .pth that `dp convert-backend` made from model.yaml gives all four again; `independent()` below
  recomputes all four from the formulas of docs/deepmd-spec.md §20 alone (its own neighbour lists
  over periodic images, torch only as an autodiff calculator).
- train step: descriptors.train_step (DeePMD-kit PT's EnergyStdLoss, `loss.backward()`, `.grad`
  of every parameter, with the float64-1/N variant `grad_f64inv.` that dpw should match); the
  same gradient from the dpmodel classes (pt_expt) and from `independent()` is compared with it.
"""

import copy
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
import dpa3  # noqa: E402  (box-None DeePMD-kit calls, the small cell, the own neighbour list)

OUT = "tests/reference/dpa2"
FIT = dict(base.FIT, neuron=[9])  # small: every tensor is in model.yaml and 2-4 times in
# train_step.npz, and the folder must stay under 2 MB
WATER = dict(base.WATER, eval_frames=[0, 1])
ALLOY = dict(base.ALLOY, eval_frames=[0, 1])
SMALL = dpa3.SMALL

# geometry (rcut, rcut_smth, nsel); most neighbours on the eval frames (recorded per case):
# water 36 within 4.0 Å, 23 within 3.5, 13 within 3.0 (12 without PBC); alloy 19 within 4.0,
# 12 within 3.0; the small cell 18 within 4.0, 12 within 3.0
W_INIT = (4.0, 0.5, 40)
W_FORM = (3.0, 2.5, 16)
W_3B = (3.5, 3.0, 24)
A_INIT = (4.0, 0.5, 24)
A_FORM = (3.0, 2.5, 14)
S_INIT = (4.0, 0.5, 20)
S_FORM = (3.0, 2.5, 14)

# the layers of a RepformerLayer ({name: has bias}), in DeePMD-kit's serialization
REPF_LINEARS = {"linear1": True, "linear2": True, "g1_self_mlp": True, "proj_g1g2": False,
                "proj_g1g1g2": False, "attn2g_map.mapqk": False, "attn2_mh_apply.mapv": False,
                "attn2_mh_apply.head_map": True, "attn2_lm": True,
                "attn2_ev_apply.head_map": False, "loc_attn.mapq": False,
                "loc_attn.mapkv": False, "loc_attn.head_map": True}


def dpa2(init, form, ri=None, rf=None, **over):
    """A small DPA-2 with every key written out: argcheck's defaults except the sizes (widths
    A2 2, A1 3, G2 4, G1 5, T 6, M1 8 and the fitting's 9, all different; three-body M3 7)
    and `nlayers` 2."""
    r_init = {
        "rcut": init[0], "rcut_smth": init[1], "nsel": init[2], "neuron": [4, 8],
        "axis_neuron": 3, "tebd_dim": 6, "tebd_input_mode": "concat", "set_davg_zero": True,
        "activation_function": "tanh", "type_one_side": False, "resnet_dt": False,
        "use_three_body": False, "three_body_neuron": [2, 4, 8], "three_body_rcut": 4.0,
        "three_body_rcut_smth": 0.5, "three_body_sel": 40,
    }
    r_init.update(ri or {})
    r_form = {
        "rcut": form[0], "rcut_smth": form[1], "nsel": form[2], "nlayers": 2, "g1_dim": 5,
        "g2_dim": 4, "axis_neuron": 2, "direct_dist": False, "update_g1_has_conv": True,
        "update_g1_has_drrd": True, "update_g1_has_grrg": True, "update_g1_has_attn": False,
        "update_g2_has_g1g1": False, "update_g2_has_attn": False, "use_sqrt_nnei": True,
        "g1_out_conv": True, "g1_out_mlp": True, "update_h2": False, "attn1_hidden": 64,
        "attn1_nhead": 4, "attn2_hidden": 16, "attn2_nhead": 4, "attn2_has_gate": False,
        "activation_function": "tanh", "update_style": "res_avg", "update_residual": 0.001,
        "update_residual_init": "norm", "set_davg_zero": True, "trainable_ln": True,
        "ln_eps": 1e-5,
    }
    r_form.update(rf or {})
    d = {
        "type": "dpa2", "repinit": r_init, "repformer": r_form, "concat_output_tebd": False,
        "precision": "float64", "smooth": True, "exclude_types": [], "env_protection": 0.0,
        "trainable": True, "seed": 1, "add_tebd_to_repinit_out": False,
        "use_econf_tebd": False, "use_tebd_bias": False,
    }
    d.update(over)
    return d


def three_body(geom):
    return {"use_three_body": True, "three_body_neuron": [2, 7], "three_body_rcut": geom[0],
            "three_body_rcut_smth": geom[1], "three_body_sel": geom[2]}


CASES = {
    # DeePMD-kit's examples/water/dpa2/input_torch_small.json scaled down: three-body repinit
    # on the repformer's list (same rcut and nsel: one shared sub-list), conv + grrg + drrd,
    # res_residual "norm" 0.01, attn2_has_gate (without attention it builds nothing),
    # concat_output_tebd (argcheck's default, which the example keeps), three layers
    "water_small": dict(WATER, descriptor=dpa2(
        W_INIT, W_FORM, three_body(W_FORM),
        {"nlayers": 3, "update_style": "res_residual", "update_residual": 0.01,
         "attn2_has_gate": True}, concat_output_tebd=True)),
    # every attention: g1 local attention, g2 gated self-attention (gate on), g1 x g1, res_avg
    # (argcheck's default); trainable_ln false and ln_eps 1e-3 on its layer norm. Widths (all
    # different): A2 2, N1 3, N2 4, A1 5, G1 6, G2 7, M1 8, fitting 9, H1 10, H2 11, T 12
    "water_attn": dict(WATER, descriptor=dpa2(
        W_INIT, W_FORM, {"tebd_dim": 12, "axis_neuron": 5}, {"update_g1_has_attn": True,
        "update_g2_has_attn": True, "update_g2_has_g1g1": True, "attn2_has_gate": True,
        "attn1_hidden": 10, "attn1_nhead": 3, "attn2_hidden": 11, "attn2_nhead": 4,
        "g1_dim": 6, "g2_dim": 7, "trainable_ln": False, "ln_eps": 1e-3})),
    # h2 update alone (the attention map exists for it, no g2 attention; N2 7, H2 10), res_incr;
    # smooth false: count-normalised sums, hard attention masks, no switch on g1 x g1
    "water_h2": dict(WATER, descriptor=dpa2(W_INIT, W_FORM, None, {
        "update_h2": True, "update_g2_has_g1g1": True, "attn2_hidden": 10, "attn2_nhead": 7,
        "update_style": "res_incr"}, smooth=False)),
    # direct distance input of g2/h2; the old layout (conv and self-MLP inside linear1),
    # 1/nnei instead of 1/sqrt(nnei); silu in the repformer (tanh in repinit); res_residual
    # "const" (replaced by seeded random weights)
    "water_direct_dist": dict(WATER, descriptor=dpa2(W_INIT, W_FORM, None, {
        "direct_dist": True, "g1_out_conv": False, "g1_out_mlp": False,
        "use_sqrt_nnei": False, "activation_function": "silu", "update_style": "res_residual",
        "update_residual": 0.1, "update_residual_init": "const"})),
    # the type embedding appended to the output and added to repinit's output; tebd bias
    "water_concat_tebd": dict(WATER, descriptor=dpa2(
        W_INIT, W_FORM, concat_output_tebd=True, add_tebd_to_repinit_out=True,
        use_tebd_bias=True)),
    # three-body repinit with its own list (3.5 Å, 24): three lists of different rcut/nsel
    "water_three_body": dict(WATER, descriptor=dpa2(W_INIT, W_FORM, three_body(W_3B))),
    # strip type embedding in repinit and in its three-body block
    "water_strip": dict(WATER, descriptor=dpa2(
        W_INIT, W_FORM, dict(three_body(W_3B), tebd_input_mode="strip"))),
    # three types, periodic, virial; pair exclusion; set_davg_zero false in both blocks (davg
    # from the statistics), repinit type_one_side and resnet_dt; res_residual "norm" 0.1
    "alloy": dict(ALLOY, descriptor=dpa2(
        A_INIT, A_FORM, {"set_davg_zero": False, "type_one_side": True, "resnet_dt": True},
        {"set_davg_zero": False, "update_g2_has_g1g1": True, "update_style": "res_residual",
         "update_residual": 0.1}, exclude_types=[[0, 1], [2, 2]])),
    # water without PBC; repformer nsel 10 below the most neighbours within its rcut (12): its
    # list keeps the 10 nearest
    "water_nopbc": dict(WATER, nopbc=True, descriptor=dpa2(W_INIT, (3.0, 2.5, 10))),
    # a 4-atom cell smaller than both cut-offs: every neighbour is a periodic image (the atom's
    # own ones included) and every g1 a ghost reads is its owner's
    "alloy_small_cell": dict(SMALL, descriptor=dpa2(S_INIT, S_FORM, None, {
        "update_g2_has_g1g1": True, "update_style": "res_residual", "update_residual": 0.1})),
    # se_e3_tebd alone: examples/water/se_e3_tebd/input_torch.json scaled down (rcut 3.5,
    # sel 24, tebd_dim 5); use_tebd_bias true is argcheck's default (the class says false)
    "se_e3_tebd_water": dict(WATER, descriptor={
        "type": "se_e3_tebd", "sel": 24, "rcut": 3.5, "rcut_smth": 0.5, "neuron": [2, 4, 8],
        "tebd_dim": 5, "tebd_input_mode": "concat", "resnet_dt": False, "set_davg_zero": True,
        "activation_function": "tanh", "env_protection": 0.0, "smooth": True,
        "exclude_types": [], "precision": "float64", "trainable": True, "seed": 1,
        "concat_output_tebd": True, "use_econf_tebd": False, "use_tebd_bias": True}),
}


# ---------------------------------------------------------------- the model


def blocks(d):
    """[(label, serialized block variables, rcut, rcut_smth, nsel, set_davg_zero)] of a
    serialized descriptor: the blocks that carry davg/dstd."""
    if d["type"] == "se_e3_tebd":
        return [("se_e3_tebd", d, d["rcut"], d["rcut_smth"], d["sel"][0], d["set_davg_zero"])]
    ri, rf = d["repinit_args"], d["repformer_args"]
    out = [("repinit", d["repinit_variable"], ri["rcut"], ri["rcut_smth"], ri["nsel"],
            ri["set_davg_zero"]),
           ("repformer", d["repformers_variable"], rf["rcut"], rf["rcut_smth"], rf["nsel"],
            rf["set_davg_zero"])]
    if ri["use_three_body"]:
        out.append(("three_body", d["repinit_three_body_variable"], ri["three_body_rcut"],
                    ri["three_body_rcut_smth"], ri["three_body_sel"], ri["set_davg_zero"]))
    return out


def stat_sample(ser, data):
    nf, n = data["coord"].shape[:2]
    nt = len(ser["type_map"])
    return [{
        "coord": data["coord"], "atype": np.tile(data["atype"], (nf, 1)),
        "box": None if data["box"] is None else data["box"].reshape(nf, 9),
        "natoms": np.tile(np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)]),
                          (nf, 1)),
    }]


def deepmd_stats(ser, data, davg_zero=None):
    """DeePMD-kit's compute_input_stats (the path of `dp train`) on these frames, per block:
    {label: (davg, dstd)}. davg_zero None honours each block's set_davg_zero; False computes davg
    for every block."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor

    d = copy.deepcopy(ser["descriptor"])
    if davg_zero is not None:
        if d["type"] == "se_e3_tebd":
            d["set_davg_zero"] = davg_zero
        else:
            d["repinit_args"]["set_davg_zero"] = davg_zero
            d["repformer_args"]["set_davg_zero"] = davg_zero
    for _, v, *_ in blocks(d):
        v["@variables"]["davg"] = 0.0 * v["@variables"]["davg"]
    obj = BaseDescriptor.deserialize(d)
    obj.compute_input_stats(stat_sample(ser, data))
    davg, dstd = obj.get_stat_mean_and_stddev()
    if d["type"] == "se_e3_tebd":
        davg, dstd = [davg], [dstd]
    labels = [b[0] for b in blocks(d)]
    return {lab: (np.asarray(a), np.asarray(s)) for lab, a, s in zip(labels, davg, dstd)}


def make_model(case, data):
    from deepmd.dpmodel.model.model import get_model
    from deepmd.dpmodel.utils.stat import compute_output_stats

    nt = len(case["type_map"])
    params = {"type_map": case["type_map"], "descriptor": case["descriptor"], "fitting_net": FIT}
    ser = get_model(copy.deepcopy(params)).serialize()
    d = ser["descriptor"]
    # davg/dstd: DeePMD-kit's own statistics on the eval frames
    st = deepmd_stats(ser, data)
    for lab, v, *_ in blocks(d):
        v["@variables"]["davg"], v["@variables"]["dstd"] = st[lab]
    if d["type"] == "dpa2" and d["repformer_args"]["update_residual_init"] == "const":
        # seeded random residual weights instead of DeePMD-kit's all-equal constants
        rng = np.random.default_rng(55)
        for lay in d["repformers_variable"]["repformer_layers"]:
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
    for blk, label in (("repinit", "repinit"), ("repinit_three_body", "three_body"),
                       ("se_ttebd", "embed")):
        if blk in parts:
            i = parts.index(blk)
            strip = parts[i + 1] in ("filter_layers_strip", "embeddings_strip")
            assert parts[i + 2] in ("networks", "_module_networks"), name
            assert parts[i + 3] == "0", name
            return f"{label}{'_strip' if strip else ''}.layer{parts[-2]}.{v}"
    if "g1_shape_tranform" in parts or "tebd_transform" in parts:
        return f"{parts[-2]}.{v}"
    i = parts.index("repformers")
    rest = parts[i + 1:]
    if rest[0] == "g2_embd":
        return f"g2_embd.{v}"
    assert rest[0] == "layers", name
    if rest[2].endswith("_residual"):
        return f"layer{rest[1]}.{rest[2]}.{rest[3]}"
    key = ".".join(rest[2:-1])
    assert key in REPF_LINEARS, name
    return f"layer{rest[1]}.{key}.{v}"


def model_params(ser):
    """{dpw name: array} of every trainable tensor of the serialized model."""
    d = ser["descriptor"]
    out = {}

    def lay(prefix, x):
        for k in ("w", "b", "idt"):
            if x["@variables"].get(k) is not None:
                out[f"{prefix}.{k}"] = np.asarray(x["@variables"][k])

    def net(prefix, x):
        for l, y in enumerate(x["networks"][0]["layers"]):
            lay(f"{prefix}.layer{l}", y)

    for l, x in enumerate(d["type_embedding"]["embedding"]["layers"]):
        lay(f"tebd.layer{l}", x)
    if d["type"] == "se_e3_tebd":
        net("embed", d["embeddings"])
        if "embeddings_strip" in d:
            net("embed_strip", d["embeddings_strip"])
    else:
        for label, key in (("repinit", "repinit_variable"),
                           ("three_body", "repinit_three_body_variable")):
            if key in d:
                net(label, d[key]["embeddings"])
                if "embeddings_strip" in d[key]:
                    net(label + "_strip", d[key]["embeddings_strip"])
        for key in ("g1_shape_tranform", "tebd_transform"):
            if key in d and d[key]["@class"] == "Layer":
                lay(key, d[key])
        rv = d["repformers_variable"]
        lay("g2_embd", rv["g2_embd"])
        for i, x in enumerate(rv["repformer_layers"]):
            for k in REPF_LINEARS:
                a, _, b = k.partition(".")
                y = x.get(a)
                if y is not None and b:
                    y = y.get(b)
                if y is not None:
                    lay(f"layer{i}.{k}", y)
            for k, vs in x.get("@variables", {}).items():
                for j, a in enumerate(vs):
                    out[f"layer{i}.{k}.{j}"] = np.asarray(a)
    for l, x in enumerate(ser["fitting"]["nets"]["networks"][0]["layers"]):
        lay(f"fit.layer{l}", x)
    return out


# ------------------------------------------- independent: docs/deepmd-spec.md §20, from scratch


def independent(ser, P, x, box, atype, keep_all=False):
    """Atomic energies [n] of one frame from docs/deepmd-spec.md §20 (P: {dpw name: tensor}).
    keep_all: the repformer list keeps every neighbour within its rcut (wider than nsel where
    nsel truncates; the normalisations still use nsel): what DeePMD-kit's pt_expt computes."""
    d = ser["descriptor"]
    n = x.shape[0]
    nt = len(ser["type_map"])
    f64 = torch.float64
    ti = torch.tensor(atype)
    lin = lambda k, y: y @ P[k + ".w"] + (P[k + ".b"] if k + ".b" in P else 0.0)

    def net_layer(k, spec, y):
        z = dpa3.act_fn(spec["activation_function"])(lin(k, y))
        if k + ".idt" in P:
            z = z * P[k + ".idt"]
        nin, nout = spec["@variables"]["w"].shape
        if spec["resnet"] and nout == nin:
            z = z + y
        elif spec["resnet"] and nout == 2 * nin:
            z = z + torch.cat([y, y], dim=-1)
        return z

    def net(prefix, spec, y):
        for l, s in enumerate(spec["networks"][0]["layers"]):
            y = net_layer(f"{prefix}.layer{l}", s, y)
        return y

    # type embedding: one-hot rows through the one linear layer
    tebd = torch.eye(nt, dtype=f64)
    for l, spec in enumerate(d["type_embedding"]["embedding"]["layers"]):
        tebd = net_layer(f"tebd.layer{l}", spec, tebd)
    excl = {tuple(p) for p in d["exclude_types"]} | {tuple(p[::-1]) for p in d["exclude_types"]}
    smooth = d["smooth"]

    def env(var, rc, rs, nsel, keep_all=False):
        """The block's list and normalised environment matrix: (owner [n, S] or -1, mask of
        real and not excluded slots, excluded, R̂ [n, S, 4] (excluded rows: the caller decides),
        switch [n, S] (0 where not mask), dvec, r)."""
        own, dv = dpa3.neighbours(x, box, rc, nsel)
        if keep_all:
            own, dv = dpa3.neighbours(x, box, rc, 10000)
            w = max(nsel, int((own >= 0).sum(1).max()))
            own, dv = own[:, :w], dv[:, :w]
        nsel = own.shape[1]
        real = own >= 0
        ex = np.zeros_like(real)
        for i in range(n):
            for j in range(nsel):
                if real[i, j] and (atype[i], atype[own[i, j]]) in excl:
                    ex[i, j] = True
        rm = torch.tensor(real, dtype=f64)
        r = torch.sqrt(torch.where(torch.tensor(real), (dv**2).sum(-1), torch.ones((), dtype=f64)))
        p = d["env_protection"]
        sw = dpa3.switch(r, rs, rc, False) * rm
        R = torch.cat([(1.0 / (r + p))[..., None], dv / ((r + p) ** 2)[..., None]], -1)
        R = R * sw[..., None]
        # every slot row of davg/dstd is the same (20.8): row 0 for every slot
        Rh = (R - torch.tensor(var["@variables"]["davg"])[ti][:, :1]) / torch.tensor(
            var["@variables"]["dstd"])[ti][:, :1]
        mask = real & ~ex
        return own, mask, ex, Rh, sw * torch.tensor(mask, dtype=f64), dv, r

    def nei_type(own, mask):
        # DeePMD-kit gathers index 0 (local atom 0) for padding and excluded slots
        return torch.tensor(np.where(mask, np.where(own >= 0, atype[np.maximum(own, 0)], 0),
                                     atype[0]))

    def three_body_block(prefix, var, rc, rs, nsel, mode):
        own, mask, ex, Rh, sw, _, _ = env(var, rc, rs, nsel)
        Rh = Rh * torch.tensor(~ex, dtype=f64)[..., None]  # excluded rows 0, padding kept
        h = Rh[..., 1:]
        e = h @ h.transpose(1, 2)  # [n, S, S], j = k included
        tj = nei_type(own, mask)
        S = nsel
        if mode == "concat":
            inp = torch.cat([e[..., None], tebd[tj][:, :, None, :].expand(-1, -1, S, -1),
                             tebd[tj][:, None, :, :].expand(-1, S, -1, -1)], -1)
            g = net(prefix, var["embeddings"], inp)
        else:
            gs = net(prefix, var["embeddings"], e[..., None])
            gt = net(prefix + "_strip", var["embeddings_strip"], torch.cat(
                [tebd[tj][:, :, None, :].expand(-1, -1, S, -1),
                 tebd[tj][:, None, :, :].expand(-1, S, -1, -1)], -1))
            if smooth:
                gt = gt * (sw[:, :, None] * sw[:, None, :])[..., None]
            g = gs * gt + gs
        return (e[..., None] * g).sum((1, 2)) / S**2

    if d["type"] == "se_e3_tebd":
        desc = three_body_block("embed", d, d["rcut"], d["rcut_smth"], d["sel"][0],
                                d["tebd_input_mode"])
        if d["concat_output_tebd"]:
            desc = torch.cat([desc, tebd[ti]], -1)
    else:
        ri, rf = d["repinit_args"], d["repformer_args"]
        # ---- repinit: se_atten without attention
        var = d["repinit_variable"]
        own, mask, ex, Rh, sw, _, _ = env(var, ri["rcut"], ri["rcut_smth"], ri["nsel"])
        Rh = Rh * torch.tensor(~ex, dtype=f64)[..., None]
        tj = nei_type(own, mask)
        S = ri["nsel"]
        t_i = tebd[ti][:, None, :].expand(-1, S, -1)
        if ri["tebd_input_mode"] == "concat":
            parts = [Rh[..., :1], tebd[tj]] + ([] if ri["type_one_side"] else [t_i])
            g = net("repinit", var["embeddings"], torch.cat(parts, -1))
        else:
            gs = net("repinit", var["embeddings"], Rh[..., :1])
            tin = tebd[tj] if ri["type_one_side"] else torch.cat([tebd[tj], t_i], -1)
            gt = net("repinit_strip", var["embeddings_strip"], tin)
            if smooth:
                gt = gt * sw[..., None]
            g = gs * gt + gs
        gr = g.transpose(1, 2) @ Rh / S  # [n, M1, 4], every slot (padding too)
        D = (gr @ gr[:, : ri["axis_neuron"]].transpose(1, 2)).reshape(n, -1)
        if ri["use_three_body"]:
            D = torch.cat([D, three_body_block(
                "three_body", d["repinit_three_body_variable"], ri["three_body_rcut"],
                ri["three_body_rcut_smth"], ri["three_body_sel"], ri["tebd_input_mode"])], -1)
        g1 = D @ P["g1_shape_tranform.w"] if "g1_shape_tranform.w" in P else D
        if d["add_tebd_to_repinit_out"]:
            g1 = g1 + tebd[ti] @ P["tebd_transform.w"]
        # ---- repformer
        act = dpa3.act_fn(rf["activation_function"])
        var = d["repformers_variable"]
        own, mask, ex, Rh, sw, dv, r = env(var, rf["rcut"], rf["rcut_smth"], rf["nsel"],
                                           keep_all)
        S, W = rf["nsel"], mask.shape[1]  # S normalises, W slots (W = S unless keep_all)
        m = torch.tensor(mask, dtype=f64)
        mb = torch.tensor(mask)
        # excluded slots are padding here: R̂ = −davg/dstd, dvec 0
        pad = torch.tensor(~mask)[..., None]
        Rh = torch.where(pad, -torch.tensor(var["@variables"]["davg"])[ti][:, :1] / torch.tensor(
            var["@variables"]["dstd"])[ti][:, :1], Rh)
        if rf["direct_dist"]:
            g2 = act(lin("g2_embd", (r * m)[..., None] / rf["rcut"]))
            h2 = dv * m[..., None] / rf["rcut"]
        else:
            g2 = act(lin("g2_embd", Rh[..., :1]))
            h2 = Rh[..., 1:]
        g1 = act(g1)
        idx = torch.tensor(np.where(mask, own, 0))  # padding and excluded: atom 0
        A2 = rf["axis_neuron"]
        nnorm = m.sum(-1)

        def sym(g):
            if smooth:
                gg = g * (m * sw)[..., None]
                inv = 1.0 / (S**0.5 if rf["use_sqrt_nnei"] else S)
                hg = h2.transpose(1, 2) @ gg * inv
            else:
                gg = g * m[..., None]
                den = torch.sqrt(nnorm) if rf["use_sqrt_nnei"] else nnorm
                hg = h2.transpose(1, 2) @ gg / (1e-4 + den)[:, None, None]
            return (hg[:, :, :A2].transpose(1, 2) @ hg / 3.0).reshape(n, -1)

        def softmax_masked(L, w_j, w_k, m_j, m_k):
            """DeePMD-kit's smooth (shift 20) or hard-masked softmax over the last axis."""
            if smooth:
                L = (L + 20.0) * w_j * w_k - 20.0
            else:
                L = torch.where(m_k, L, torch.tensor(-math.inf, dtype=f64))
            a = torch.softmax(L, -1)
            a = torch.where(m_k & m_j, a, torch.zeros((), dtype=f64))
            return a * w_j * w_k if smooth else a

        def update(kind, lst, L):
            style = rf["update_style"]
            if style == "res_avg":
                return sum(lst[1:], lst[0]) / len(lst) ** 0.5
            if style == "res_incr":
                return lst[0] + (sum(lst[1:]) / (len(lst) - 1) ** 0.5 if len(lst) > 1 else 0.0)
            out = lst[0]
            for j, u in enumerate(lst[1:]):
                out = out + P[f"{L}.{kind}_residual.{j}"] * u
            return out

        for li, lay in enumerate(var["repformer_layers"]):
            L = f"layer{li}"
            chnnl2 = lay["update_chnnl_2"]
            gg1 = g1[idx]  # the neighbours' owners' g1
            ws = (m * sw) if smooth else m
            u1 = [g1]
            mlp_in = [] if rf["g1_out_mlp"] else [g1]
            if rf["g1_out_mlp"]:
                u1.append(act(lin(f"{L}.g1_self_mlp", g1)))
            u2, uh = [g2], [h2]
            if chnnl2:
                u2.append(act(lin(f"{L}.linear2", g2)))
                if rf["update_g2_has_g1g1"]:
                    u2.append(lin(f"{L}.proj_g1g1g2", g1[:, None, :] * gg1 * ws[..., None]))
                if rf["update_g2_has_attn"] or rf["update_h2"]:
                    H, N = rf["attn2_hidden"], rf["attn2_nhead"]
                    qk = lin(f"{L}.attn2g_map.mapqk", g2).reshape(n, W, H, 2 * N)
                    q = qk[..., :N].permute(0, 3, 1, 2)  # [n, N, S, H]
                    k = qk[..., N:].permute(0, 3, 1, 2)
                    Lg = q @ k.transpose(-1, -2) / H**0.5
                    hh = h2 @ h2.transpose(1, 2)  # [n, S, S]
                    if rf["attn2_has_gate"]:
                        Lg = Lg * hh[:, None]
                    a = softmax_masked(Lg, sw[:, None, :, None], sw[:, None, None, :],
                                       mb[:, None, :, None], mb[:, None, None, :])
                    a = a * hh[:, None] / 3.0**0.5
                    if rf["update_g2_has_attn"]:
                        v = lin(f"{L}.attn2_mh_apply.mapv", g2).reshape(n, W, rf["g2_dim"], N)
                        o = a @ v.permute(0, 3, 1, 2)  # [n, N, S, G2]
                        o = o.permute(0, 2, 3, 1).reshape(n, W, -1)  # column c·N + h
                        o = lin(f"{L}.attn2_mh_apply.head_map", o)
                        mu = o.mean(-1, keepdim=True)
                        var_ = ((o - mu) ** 2).mean(-1, keepdim=True)
                        o = (o - mu) / torch.sqrt(var_ + lay["attn2_lm"]["eps"])
                        u2.append(o * P[f"{L}.attn2_lm.w"] + P[f"{L}.attn2_lm.b"])
                    if rf["update_h2"]:
                        eh = a @ h2[:, None]  # [n, N, S, 3]
                        uh.append(torch.einsum("nhsc,h->nsc", eh,
                                               P[f"{L}.attn2_ev_apply.head_map.w"][:, 0]))
            if rf["update_g1_has_conv"]:
                if rf["g1_out_conv"]:
                    c = lin(f"{L}.proj_g1g2", g2) * gg1 * ws[..., None]
                else:
                    c = g2 * lin(f"{L}.proj_g1g2", gg1) * ws[..., None]
                c = c.sum(1) / (S if smooth else (1e-4 + nnorm)[:, None])
                (u1 if rf["g1_out_conv"] else mlp_in).append(c)
            if rf["update_g1_has_grrg"]:
                mlp_in.append(sym(g2))
            if rf["update_g1_has_drrd"]:
                mlp_in.append(sym(gg1))
            u1.append(act(lin(f"{L}.linear1", torch.cat(mlp_in, -1))))
            if rf["update_g1_has_attn"]:
                H, N = rf["attn1_hidden"], rf["attn1_nhead"]
                q = lin(f"{L}.loc_attn.mapq", g1).reshape(n, H, N).transpose(1, 2)  # [n,N,H]
                kv = lin(f"{L}.loc_attn.mapkv", gg1).reshape(n, W, H + rf["g1_dim"], N)
                k, v = kv[:, :, :H].permute(0, 3, 1, 2), kv[:, :, H:].permute(0, 3, 1, 2)
                La = (k @ q[..., None])[..., 0] / H**0.5  # [n, N, S]
                a = softmax_masked(La, sw[:, None, :], 1.0, mb[:, None, :], mb[:, None, :])
                o = (a[..., None] * v).sum(2).reshape(n, -1)  # head-major: h·G1 + c
                u1.append(lin(f"{L}.loc_attn.head_map", o))
            if chnnl2:
                g2, h2 = update("g2", u2, L), update("h2", uh, L)
            g1 = update("g1", u1, L)
        desc = torch.cat([g1, tebd[ti]], -1) if d["concat_output_tebd"] else g1

    fit = ser["fitting"]
    y = desc
    for l, spec in enumerate(fit["nets"]["networks"][0]["layers"]):
        y = net_layer(f"fit.layer{l}", spec, y)
    return (y[:, 0] + torch.tensor(fit["@variables"]["bias_atom_e"][:, 0])[ti]
            + torch.tensor(ser["@variables"]["out_bias"][0, :, 0])[ti])


def independent_eval(ser, data, P=None, create_graph=False, keep_all=False):
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
        ae = independent(ser, P, x @ mm, box, data["atype"], keep_all)
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


def neighbour_info(ser, data):
    """Per block: rcut, nsel, the most and fewest neighbours within rcut on the frames, and
    where nsel truncates, the gap between the nsel-th and the next distance."""
    out = {}
    for label, _, rc, _, nsel, _ in blocks(ser["descriptor"]):
        counts, gaps = [], []
        for f in range(data["coord"].shape[0]):
            box = None if data["box"] is None else torch.tensor(data["box"][f])
            own, dv = dpa3.neighbours(torch.tensor(data["coord"][f]), box, rc, 10000)
            c = (own >= 0).sum(1)
            counts.append(c)
            if c.max() > nsel:
                rr = np.linalg.norm(dv.numpy(), axis=-1)
                over = c > nsel
                gaps.append(float((rr[over, nsel] - rr[over, nsel - 1]).min()))
        c = np.concatenate(counts)
        out[label] = {"rcut": rc, "nsel": nsel, "max_neighbours_within_rcut": int(c.max()),
                      "min_neighbours_within_rcut": int(c.min())}
        if gaps:
            out[label]["nsel_truncates"] = {
                "centres_truncated": int((c > nsel).sum()),
                "smallest_gap_between_nsel_th_and_next_distance": min(gaps)}
    out["order"] = ("one list for all types (mixed types), the neighbours within rcut nearest "
                    "first, unused slots -1; the model builds the repinit list (the largest "
                    "rcut and nsel) and each other block takes its first nsel slots, those "
                    "beyond its rcut set to -1")
    out["periodic"] = data["box"] is not None
    return out


def stats_record(ser, data):
    """The davg/dstd in the model (DeePMD-kit's statistics on these frames, honouring
    set_davg_zero), DeePMD-kit's davg had set_davg_zero been false, and the same σ and mean
    by hand from the environment matrix (own neighbour list; padding and excluded slots as zero
    rows, counted), per block and centre type."""
    d = ser["descriptor"]
    full = deepmd_stats(ser, data, davg_zero=False)
    nt = len(ser["type_map"])
    excl = {tuple(p) for p in d["exclude_types"]} | {tuple(p[::-1]) for p in d["exclude_types"]}
    out = {}
    for label, v, rc, rs, nsel, zero in blocks(d):
        davg, dstd = v["@variables"]["davg"], v["@variables"]["dstd"]
        assert np.all(davg == davg[:, :1]) and np.all(dstd == dstd[:, :1])
        rows = [[] for _ in range(nt)]
        for f in range(data["coord"].shape[0]):
            box = None if data["box"] is None else torch.tensor(data["box"][f])
            own, dv = dpa3.neighbours(torch.tensor(data["coord"][f]), box, rc, nsel)
            dv = dv.numpy()
            ok = own >= 0
            rr = np.where(ok, np.linalg.norm(dv, axis=-1), 1.0)
            s = dpa3.switch(torch.tensor(rr), rs, rc, False).numpy() * ok
            env = np.concatenate([(s / rr)[..., None], dv * (s / rr**2)[..., None]], -1)
            tj = data["atype"][np.where(ok, own, 0)]
            for a, b in excl:
                env[ok & (data["atype"][:, None] == a) & (tj == b)] = 0.0
            for t in range(nt):
                rows[t].append(env[data["atype"] == t].reshape(-1, 4))
        hand_avg, hand_std = [], []
        for t in range(nt):
            a = np.concatenate(rows[t])
            sd = lambda z: max(float(np.sqrt(max((z**2).mean() - z.mean() ** 2, 0.0))), 1e-2)
            hand_avg.append(float(a[:, 0].mean()))
            hand_std.append([sd(a[:, 0]), sd(a[:, 1:])])
        out[label] = {
            "shape": list(davg.shape), "set_davg_zero": zero,
            "davg_radial_per_type_used": davg[:, 0, 0].tolist(),
            "dstd_radial_angular_per_type_used": dstd[:, 0, :2].tolist(),
            "deepmd_davg_radial_per_type_if_set_davg_zero_false": full[label][0][:, 0, 0].tolist(),
            "by_hand_mean_radial": hand_avg, "by_hand_std_radial_angular": hand_std,
            "by_hand_vs_deepmd_max_abs": max(
                maxabs(np.array(hand_avg), full[label][0][:, 0, 0]),
                maxabs(np.array(hand_std), full[label][1][:, 0, :2])),
        }
    return out


maxabs = dpa3.maxabs


def dpmodel_route(ser):
    """Which path DeePMD-kit's dpmodel (numpy, and pt_expt) takes: its graph-native lower
    (`uses_graph_lower()`) or the dense one PT always takes."""
    m = base.dp_model(ser)
    return "graph" if m.atomic_model.uses_graph_lower() else "dense"


# ---------------------------------------------------------------- probes


def probes():
    """Small experiments on DeePMD-kit 3.2.0's DPA-2 whose findings docs/deepmd-spec.md §20
    states: trainable_ln under `dp train`'s constructor path, the g1_shape_tranform read-back,
    the padding slots in the smooth attention softmax (nsel dependence)."""
    import deepmd.pt.model.model as ptm
    from deepmd.dpmodel.descriptor.dpa2 import DescrptDPA2 as NpDPA2
    from deepmd.pt.model.descriptor.dpa2 import DescrptDPA2

    res = {"generator": "scripts/make-reference/dpa2.py", "deepmd_kit": deepmd.__version__}
    # (1) trainable_ln false: the layer norm's requires_grad as `dp train` builds the model
    # (get_model → the DescrptDPA2 constructor)
    desc = CASES["water_attn"]["descriptor"]
    pt = DescrptDPA2(2, **{k: v for k, v in copy.deepcopy(desc).items() if k != "type"})
    ln = pt.repformers.layers[0].attn2_lm
    built = ptm.get_model({"type_map": ["O", "H"], "descriptor": copy.deepcopy(desc),
                           "fitting_net": copy.deepcopy(FIT)})
    ln2 = built.atomic_model.descriptor.repformers.layers[0].attn2_lm
    res["trainable_ln_false"] = {
        "case": "water_attn's descriptor (trainable_ln false)",
        "layernorm_trainable_attribute": ln.trainable,
        "requires_grad_after_DescrptDPA2_constructor": [ln.matrix.requires_grad,
                                                        ln.bias.requires_grad],
        "requires_grad_after_get_model_as_dp_train": [ln2.matrix.requires_grad,
                                                      ln2.bias.requires_grad],
        "note": "LayerNorm(trainable=False) sets requires_grad False, then DescrptDPA2.__init__ "
        "ends with `for param in self.parameters(): param.requires_grad = trainable`",
    }
    # (2) g1_shape_tranform: deserialize compares repinit.dim_out (without the three-body
    # part) with g1_dim
    d3 = dpa2(W_INIT, W_FORM, dict(three_body(W_FORM), neuron=[3, 5], axis_neuron=1))
    obj = NpDPA2(2, **{k: v for k, v in d3.items() if k != "type"})
    ser3 = obj.serialize()
    ser3["g1_shape_tranform"]["@variables"]["w"] = 2.0 * ser3["g1_shape_tranform"][
        "@variables"]["w"]
    back = NpDPA2.deserialize(copy.deepcopy(ser3))
    w0 = ser3["g1_shape_tranform"]["@variables"]["w"]
    res["g1_shape_tranform_read_back"] = {
        "case": "repinit neuron [3, 5], axis_neuron 1 (5 wide) + three-body [2, 7] = 12 wide "
        "→ g1_dim 5; the serialized w doubled before reading it back",
        "serialized_w_shape": list(w0.shape),
        "repinit_dim_out": obj.repinit.dim_out, "g1_dim": obj.repformers.dim_in,
        "read_back_equals_serialized": bool(np.array_equal(back.g1_shape_tranform.w, w0)),
        "read_back_equals_constructor_weights": bool(np.array_equal(
            back.g1_shape_tranform.w, obj.g1_shape_tranform.w)),
        "note": "DescrptDPA2.deserialize (dpmodel and PT) loads g1_shape_tranform only if "
        "repinit.dim_out != g1_dim, but the layer exists whenever repinit.dim_out + "
        "three-body width != g1_dim",
    }
    # (3) the padding slots in the smooth softmax: a repformer whose only neighbour terms
    # are the g1 local attention, with repformer nsel 16 and 39 (more padding)
    case = CASES["water_attn"]
    ev = dpa3.load(case, [0])
    energies = {}
    for ns in (16, 39):
        dd = dpa2(W_INIT, (3.0, 2.5, ns), None, {
            "update_g1_has_conv": False, "update_g1_has_grrg": False,
            "update_g1_has_drrd": False, "g1_out_mlp": False, "update_g1_has_attn": True,
            "attn1_hidden": 10, "attn1_nhead": 3})
        params = {"type_map": case["type_map"], "descriptor": dd, "fitting_net": FIT}
        from deepmd.dpmodel.model.model import get_model

        ser = get_model(copy.deepcopy(params)).serialize()
        m = base.pt_model(ser)
        energies[ns] = float(dpa3.pt_eval(m, ev["coord"], ev["box"], ev["atype"])[
            "energy"].detach().sum())
    res["padding_in_smooth_softmax"] = {
        "case": "water frame 0; repformer with the g1 local attention as its only neighbour "
        "term (conv, grrg, drrd off; g1_out_mlp false), davg 0, dstd 1, same weights; "
        "repformer nsel 16 (at most 13 neighbours within 3.0 Å) and 39",
        "energy_nsel_16": energies[16], "energy_nsel_39": energies[39],
        "difference": energies[39] - energies[16],
        "note": "a padding slot's logit is (L + 20)·0 − 20 = −20, and it stays in the "
        "softmax's denominator: the energy depends on nsel by ~e^-20 per padding slot",
    }
    # (4) dpmodel on torch (pt_expt) and nsel truncation: water_nopbc, whose repformer nsel 10
    # truncates one centre's list in frame 1
    case = CASES["water_nopbc"]
    ev = dpa3.load(case, case["eval_frames"])
    _, ser = make_model(case, ev)
    nf = ev["coord"].shape[0]
    e_pt = dpa3.pt_eval(base.pt_model(ser), ev["coord"], None, ev["atype"])["energy"]
    rx = dpa3.ExptModel(ser)(torch.tensor(ev["coord"].reshape(nf, -1)),
                             torch.tensor(np.tile(ev["atype"], (nf, 1))))
    ind = independent_eval(ser, ev, keep_all=True)
    res["dpmodel_torch_ignores_nsel_truncation"] = {
        "case": "water_nopbc (repformer nsel 10; one centre of frame 1 has 12 neighbours "
        "within 3.0 Å)",
        "pt_minus_dpmodel_torch_energy_per_frame": (
            e_pt.detach().numpy().ravel() - rx["energy"].detach().numpy().ravel()).tolist(),
        "independent_with_untruncated_repformer_list_minus_dpmodel_torch": {
            "energy_per_frame": (ind["energy"].detach().numpy()
                                 - rx["energy"].detach().numpy().ravel()).tolist(),
            "force_max_abs": maxabs(ind["force"].detach().numpy(),
                                    rx["force"].detach().numpy().reshape(nf, -1, 3))},
        "note": "DeePMD-kit's pt_expt evaluates this model through its graph route, which "
        "keeps every neighbour within the repformer rcut (normalising by nsel still); PT (`dp "
        "train`) and dpmodel on numpy keep the nsel nearest",
    }
    return res


# ---------------------------------------------------------------- one case


def run_case(name, case):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    ev = dpa3.load(case, case["eval_frames"])
    tr = dpa3.load(case, case["train_frames"])
    params, ser = make_model(case, ev)
    d = ser["descriptor"]
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {
        "backend": "dpmodel", "model": ser, "model_def_script": params, "@variables": {}})

    pt = base.pt_model(ser)
    dp = base.dp_model(ser)
    ex = dpa3.ExptModel(ser)
    names = {k: dpw_name(k) for k, p in pt.named_parameters() if p.numel() > 0}
    assert sorted(names.values()) == sorted(model_params(ser)), "name map"

    # ---- eval
    nf = len(case["eval_frames"])
    keys = ["energy", "atom_energy", "force", "virial"]
    shape = {"energy": (nf,), "atom_energy": (nf, -1), "force": (nf, -1, 3), "virial": (nf, 9)}
    per = ev["box"] is not None
    r = dpa3.pt_eval(pt, ev["coord"], ev["box"], ev["atype"])
    pred = {k: r[k].detach().numpy().reshape(shape[k]) for k in keys}
    dpe, dpae = dpa3.dp_energy(dp, ev["coord"], ev["box"], ev["atype"])
    rx = ex(torch.tensor(ev["coord"].reshape(nf, -1)), torch.tensor(np.tile(ev["atype"], (nf, 1))),
            box=None if not per else torch.tensor(ev["box"].reshape(nf, 9)))
    expt = {k: rx[k].detach().numpy().reshape(shape[k]) for k in keys}
    ind = {k: v.detach().numpy().reshape(shape[k]) for k, v in independent_eval(ser, ev).items()}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dpot, back = dpa3.convert_and_deeppot(yaml_path, ev, tmp)
            rt = base.yaml_roundtrip_diff(ser, back)
        except subprocess.CalledProcessError as e:
            err = [x.strip() for x in e.stderr.decode().splitlines() if "Error" in x]
            dpot, rt = None, {"dp convert-backend failed": err[-4:]}
    evb = ev if per else dict(ev, box=np.zeros((nf, 3, 3)))
    e_pt = lambda x, b: float(dpa3.pt_eval(pt, x, b if per else None, ev["atype"])[
        "energy"].detach().numpy().sum())
    n = ev["coord"].shape[1]
    fd_atoms = [0, n - 1]
    fdf = base.fd_forces(e_pt, evb, fd_atoms)
    fdv = base.fd_virial(e_pt, evb)
    fdv_small = base.fd_virial(e_pt, evb, h=1e-6)
    v0 = pred["virial"][0].reshape(3, 3)
    checks = {
        "dpmodel_route": dpmodel_route(ser),
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
            "pairs_nearest_each_rcut": {lab: dpa3.nearest_to(ev, rc)
                                        for lab, _, rc, *_ in blocks(d)},
        },
        "fd_virial_h_1e-6": {"frame": 0, "h": 1e-6, "fd": fdv_small.reshape(-1).tolist(),
                             "max_abs_err": maxabs(fdv_small, v0)},
    }
    # the last atom moved first: padding slots read atom 0 (its g1, its type), which reaches
    # the energy only through repinit's padding rows when davg ≠ 0
    perm = np.r_[n - 1, np.arange(n - 1)]
    e_perm = float(dpa3.pt_eval(pt, ev["coord"][:1, perm], ev["box"][:1] if per else None,
                                ev["atype"][perm])["energy"].detach().numpy().sum())
    checks["atom_order"] = {"frame": 0, "permutation": "the last atom moved first",
                            "minus_energy": e_perm - float(pred["energy"][0])}
    np.savez_compressed(os.path.join(out, "eval.npz"), coord=ev["coord"],
                        **({"box": ev["box"]} if per else {}), atype=ev["atype"],
                        energy_label=ev["energy"], force_label=ev["force"],
                        **({"virial_label": ev["virial"]} if "virial" in ev else {}),
                        **pred, energy_dpmodel=dpe, atom_energy_dpmodel=dpae)
    dim_out = base.dp_model(ser).atomic_model.descriptor.get_dim_out()
    meta = {
        "generator": "scripts/make-reference/dpa2.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"],
        "periodic": per,
        "frames": case["eval_frames"],
        "atom_order": "type.raw's (the system is sorted by type already)",
        "type_map": case["type_map"],
        "descriptor": case["descriptor"],
        "fitting": FIT,
        "fitting_nets": "one net for every type (the descriptor has mixed types)",
        "descriptor_dim_out": dim_out,
        "neighbour_list": neighbour_info(ser, ev),
        "stats": "davg/dstd: DeePMD-kit's compute_input_stats on the eval frames (davg 0 where "
        "set_davg_zero); out_bias from compute_output_stats on the eval frames",
        "davg_dstd": stats_record(ser, ev),
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
    print(f"{name}: [{checks['dpmodel_route']}] PT−dpmodel(np) "
          f"{max(checks['pt_vs_dpmodel_numpy'].values()):.1e}, "
          f"PT−dpmodel(torch) {max(checks['pt_vs_dpmodel_torch'].values()):.1e}, "
          f"PT−pth {max((checks['pt_vs_deeppot_pth'] or {0: -1}).values()):.1e}, "
          f"PT−independent {max(checks['pt_vs_independent'].values()):.1e}, "
          f"fd F {checks['fd_force']['max_abs_err']:.1e}, "
          f"fd W {checks['fd_virial']['max_abs_err']:.1e} / "
          f"{checks['fd_virial_h_1e-6']['max_abs_err']:.1e}, "
          f"order {checks['atom_order']['minus_energy']:.1e}", flush=True)

    # ---- train step (descriptors.train_step), no `param.` arrays: they are model.yaml's
    n_at = tr["coord"].shape[1]
    lpar = base.LOSS if case["virial"] else base.LOSS_NO_V

    def more_checks(g, arrays, hand, lval):
        exn = {k: dpw_name(k) for k, p in ex.named_parameters() if p.numel() > 0}
        lx, _, _, gx = base.grads(ex, tr, lpar, exn)
        li, gi = independent_grads(ser, tr, lpar, 1.0 / n_at)
        ref64 = {k[len("grad_f64inv."):]: v for k, v in arrays.items()
                 if k.startswith("grad_f64inv.")}
        zero = sorted(k for k, v in g.items() if not np.any(v))
        # pt_expt keeps a layer norm with trainable_ln false as constants (PT trains it)
        common = {k: g[k] for k in g if k in gx}
        return {"dpmodel_torch_vs_pt": {
                    "loss_abs": abs(lx - lval), "grad_max_rel": base.grad_rel_diff(gx, common),
                    "pt_tensors_not_trainable_there": sorted(set(g) - set(gx))},
                "independent_f64inv_vs_pt_f64inv": {
                    "loss_abs": abs(li - hand["loss"]["value_f64_inv"]),
                    "grad_max_rel": base.grad_rel_diff(gi, ref64)},
                "tensors_with_zero_gradient": zero}

    if d["type"] == "se_e3_tebd":
        fkeys = ["embed.layer0.w", "tebd.layer0.w", "fit.layer0.w"]
    else:
        L = d["repformer_args"]["nlayers"] - 1
        fkeys = ["repinit.layer0.w", "tebd.layer0.w", "g2_embd.w", "layer0.linear1.w",
                 f"layer{L}.linear1.w", "fit.layer0.w"]
        if "three_body.layer0.w" in names.values():
            fkeys.insert(1, "three_body.layer0.w")
        for k in ("layer0.attn2g_map.mapqk.w", "layer0.loc_attn.mapkv.w", "layer0.g2_residual.0"):
            if k in names.values():
                fkeys.insert(-1, k)
    lval, tmeta = base.train_step(
        out, pt, tr, names, "scripts/make-reference/dpa2.py", case["system"],
        case["train_frames"], fkeys, case["virial"], periodic=tr["box"] is not None,
        params=model_params(ser), more_checks=more_checks, save=dpa3.save_train_step)
    hand, fds = tmeta["hand_written_loss"], tmeta["fd_param_checks"]
    print(f"{name}: loss {lval!r}, {tmeta['n_tensors']} tensors, "
          f"{tmeta['n_parameters']} parameters; "
          f"f64inv vs deepmd {hand['loss']['grad_f64_inv_vs_deepmd_max_rel']:.1e}, "
          f"f32inv {hand['loss']['grad_f32_inv_vs_deepmd_max_rel']:.1e}; dpmodel(torch) "
          f"{tmeta['dpmodel_torch_vs_pt']['grad_max_rel']:.1e}; independent "
          f"{tmeta['independent_f64inv_vs_pt_f64inv']['grad_max_rel']:.1e}; zero grad "
          f"{tmeta['tensors_with_zero_gradient']}; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    names = sys.argv[1:] or list(CASES) + ["probes"]
    for name in names:
        if name == "probes":
            with open(os.path.join(OUT, "probes.json"), "w") as fh:
                json.dump(probes(), fh, indent=1)
                fh.write("\n")
        else:
            run_case(name, CASES[name])


if __name__ == "__main__":
    main()

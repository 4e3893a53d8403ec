"""DeePMD-kit 3.2.0's own numbers for the `ener` fitting with frame and atomic parameters
(`numb_fparam`, `numb_aparam`; issue 53).

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root:
`python scripts/make-reference/fparam.py` (about a minute on 2 cores). Writes
tests/reference/fittings/fparam_water/{input.json, model.yaml, eval.npz, eval.json,
train_step.npz, train_step.json}; tests/reference/fittings/README.md describes them.

The descriptor and the rest are those of descriptors.py's water cases (whose helpers this
script imports): a small float64 se_e2_a on DeePMD-kit's water frames, davg/dstd by hand, the
energy bias from DeePMD-kit's `compute_output_stats`. The fitting takes 2 frame parameters and 1
atomic parameter, drawn here (seeded) for each frame and atom; their avg and inv_std are
DeePMD-kit's own `compute_input_stats` on the eval frames (protection 1e-2), so the model's
input is normalised with DeePMD-kit's statistics of these very parameters (eval.json records
them for dpw's statistics to be checked against).
- eval: the PyTorch model (from the serialization) with fparam and aparam: energy, atomic
  energy, force, virial; dpmodel (numpy) energies beside them; `dp convert-backend` to .pth and
  back proves DeePMD-kit reads model.yaml.
- train step: EnergyStdLoss's gradient (`grad.`) and the loss written out with a float64 1/N
  (`grad_f64inv.`), what dpw must match, as descriptors.py makes them.
"""

import copy
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import descriptors as D  # noqa: E402

import deepmd  # noqa: E402
from deepmd.dpmodel.utils.serialization import save_dp_model  # noqa: E402

OUT = "tests/reference/fittings/fparam_water"
NFP, NAP = 2, 1
CASE = dict(D.WATER, descriptor=D.se_a([46, 92], 6.0, True, 1))
FIT = dict(D.FIT, numb_fparam=NFP, numb_aparam=NAP)


def with_params(data, seed):
    """The frames with drawn parameters: fparam [nf, 2] (two scales far apart, so that a wrong
    normalisation shows), aparam [nf, natoms, 1]."""
    rng = np.random.default_rng(seed)
    nf, n = data["coord"].shape[:2]
    data = dict(data)
    data["fparam"] = np.stack([rng.uniform(0.5, 1.5, nf), rng.uniform(200, 400, nf)], axis=1)
    data["aparam"] = rng.normal(0.3, 0.2, (nf, n, NAP))
    return data


def model_inputs(data):
    nf = data["coord"].shape[0]
    return {
        "coord": torch.tensor(data["coord"].reshape(nf, -1), dtype=torch.float64),
        "atype": torch.tensor(np.tile(data["atype"], (nf, 1)), dtype=torch.int64),
        "box": torch.tensor(data["box"].reshape(nf, 9), dtype=torch.float64),
        "fparam": torch.tensor(data["fparam"], dtype=torch.float64),
        "aparam": torch.tensor(data["aparam"], dtype=torch.float64),
    }


def make_model(data):
    params = {"type_map": CASE["type_map"], "descriptor": CASE["descriptor"], "fitting_net": FIT}
    _, ser = D.make_model(dict(CASE, descriptor=CASE["descriptor"]), data)
    # D.make_model builds with D.FIT: rebuild the fitting with the parameters, same seed.
    from deepmd.dpmodel.model.model import get_model

    full = get_model(copy.deepcopy(params)).serialize()
    full["descriptor"] = ser["descriptor"]
    full["@variables"]["out_bias"] = ser["@variables"]["out_bias"]
    # DeePMD-kit's own input statistics of the parameters, on these frames.
    from deepmd.pt.model.task.ener import EnergyFittingNet

    fit = EnergyFittingNet.deserialize(copy.deepcopy(full["fitting"]))
    sampled = [{"fparam": torch.tensor(data["fparam"]), "aparam": torch.tensor(data["aparam"])}]
    fit.compute_input_stats(sampled, protection=1e-2)
    v = full["fitting"]["@variables"]
    for k in ["fparam_avg", "fparam_inv_std", "aparam_avg", "aparam_inv_std"]:
        v[k] = getattr(fit, k).detach().numpy().copy()
    return params, full


def pt_eval(pt, data, train=False):
    pt.train(train)
    i = model_inputs(data)
    return pt(i["coord"], i["atype"], box=i["box"], fparam=i["fparam"], aparam=i["aparam"])


def loss_fn(pt, data, lpar, lr):
    from deepmd.pt.loss.ener import EnergyStdLoss

    nf, n = data["coord"].shape[:2]
    loss = EnergyStdLoss(starter_learning_rate=D.START_LR, **lpar)
    label = {"energy": torch.tensor(data["energy"].reshape(nf, 1)),
             "force": torch.tensor(data["force"]), "find_energy": 1.0, "find_force": 1.0}
    pt.train(True)
    pred, l, more = loss(model_inputs(data), pt, label, n, lr)
    return l, pred


def grads(pt, data, lpar, names, inv=None):
    """DeePMD-kit's loss gradient (inv None), or the written-out loss's with `inv` for 1/N."""
    pt.zero_grad(set_to_none=True)
    if inv is None:
        loss, pred = loss_fn(pt, data, lpar, D.LR)
    else:
        coef = D.LR / D.START_LR
        p = lambda k: lpar["limit_pref_" + k] + (lpar["start_pref_" + k] - lpar["limit_pref_" + k]) * coef
        pred = pt_eval(pt, data, train=True)
        de = pred["energy"].reshape(-1) - torch.tensor(data["energy"])
        df = pred["force"].reshape(data["force"].shape) - torch.tensor(data["force"])
        loss = p("e") * torch.mean(de**2 * inv) + p("f") * torch.mean(df**2)
    loss.backward()
    g = {names[k]: (np.zeros(tuple(p.shape)) if p.grad is None else p.grad.detach().numpy().copy())
         for k, p in pt.named_parameters() if k in names}
    return float(loss.detach()), pred, g


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    ev = with_params(D.load(CASE, CASE["eval_frames"]), 7)
    tr = {k: (v[:1] if k not in ("atype",) else v) for k, v in ev.items()}
    params, ser = make_model(ev)
    with open(os.path.join(OUT, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(OUT, "model.yaml")
    save_dp_model(yaml_path, {"model": ser, "model_def_script": params, "backend": "dpmodel",
                              "software": "deepmd-kit", "version": deepmd.__version__})
    pt = D.pt_model(ser)
    dp = D.dp_model(ser)
    r = pt_eval(pt, ev)
    nf = len(CASE["eval_frames"])
    pred = {k: r[k].detach().numpy().reshape(nf, -1) for k in ["energy", "atom_energy", "force",
                                                              "virial"]}
    npd = dp(ev["coord"].reshape(nf, -1, 3), np.tile(ev["atype"], (nf, 1)),
             box=ev["box"].reshape(nf, 3, 3), fparam=ev["fparam"], aparam=ev["aparam"])
    # The parameters change the energy (else the test would not test them).
    zero = dict(ev, aparam=np.zeros_like(ev["aparam"]), fparam=np.zeros_like(ev["fparam"]))
    e_zero = pt_eval(pt, zero)["energy"].detach().numpy().reshape(-1)
    with tempfile.TemporaryDirectory() as tmp:
        pth = os.path.join(tmp, "model.pth")
        back = os.path.join(tmp, "back.yaml")
        dp_bin = os.path.join(os.path.dirname(sys.executable), "dp")
        subprocess.run([dp_bin, "convert-backend", yaml_path, pth], check=True)
        subprocess.run([dp_bin, "convert-backend", pth, back], check=True)
        roundtrip = D.yaml_roundtrip_diff(ser, back)
    np.savez(os.path.join(OUT, "eval.npz"), coord=ev["coord"], box=ev["box"], atype=ev["atype"],
             energy_label=ev["energy"], force_label=ev["force"], fparam=ev["fparam"],
             aparam=ev["aparam"].reshape(nf, -1), energy=pred["energy"].reshape(-1),
             atom_energy=pred["atom_energy"], force=pred["force"].reshape(nf, -1, 3),
             virial=pred["virial"], energy_dpmodel=npd["energy"].reshape(-1),
             atom_energy_dpmodel=npd["atom_energy"].reshape(nf, -1))
    v = ser["fitting"]["@variables"]
    meta = {
        "generator": "scripts/make-reference/fparam.py",
        "deepmd_kit": deepmd.__version__,
        "system": CASE["system"],
        "frames": CASE["eval_frames"],
        "fitting": FIT,
        "fit_input_stats_on_eval_frames": {k: np.asarray(v[k]).tolist() for k in
                                           ["fparam_avg", "fparam_inv_std", "aparam_avg",
                                            "aparam_inv_std"]},
        "checks": {
            "pt_vs_dpmodel_energy_max_rel": D.rel(pred["energy"], npd["energy"]),
            "energy_with_zero_params_minus_energy_max_abs": float(
                np.abs(e_zero - pred["energy"].reshape(-1)).max()),
            "yaml_to_pth_to_yaml_max_abs_param_diff": roundtrip,
        },
    }
    with open(os.path.join(OUT, "eval.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")

    names = D.dpw_names(pt, ser)
    lpar = D.LOSS_NO_V
    lval, tpred, g = grads(pt, tr, lpar, names)
    n = tr["coord"].shape[1]
    arrays = {"fparam": tr["fparam"], "aparam": tr["aparam"].reshape(1, -1)}
    for k in sorted(g):
        arrays["grad." + k] = g[k]
    l32, _, g32 = grads(pt, tr, lpar, names, float(np.float32(1.0) / np.float32(n)))
    l64, _, g64 = grads(pt, tr, lpar, names, 1.0 / n)
    for k in sorted(g64):
        arrays["grad_f64inv." + k] = g64[k]
    tmeta = {
        "generator": "scripts/make-reference/fparam.py",
        "deepmd_kit": deepmd.__version__,
        "system": CASE["system"],
        "frames": CASE["train_frames"],
        "loss": lpar,
        "start_lr": D.START_LR,
        "lr": D.LR,
        "loss_value": lval,
        "hand_written_loss": {"loss": {
            "value_f32_inv": l32, "value_f64_inv": l64,
            "grad_f32_inv_vs_deepmd_max_rel": D.grad_rel_diff(g32, g),
            "grad_f64_inv_vs_deepmd_max_rel": D.grad_rel_diff(g64, g)}},
        "n_tensors": len(g),
    }
    D.save_train_step(OUT, tr, tpred, arrays, tmeta)
    print(json.dumps(meta["checks"]), json.dumps(tmeta["hand_written_loss"]))


if __name__ == "__main__":
    main()

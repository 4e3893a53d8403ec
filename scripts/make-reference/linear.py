"""DeePMD-kit 3.2.0's own numbers for `linear_ener` models made of several DP models (no pair
table).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu]==3.2.0"`, which
brings PyTorch) from the repository root: `python scripts/make-reference/linear.py [case ...]`
(no argument: every case of CASES). Like pairtab.py it imports descriptors.py's helpers (data,
loss, finite differences) and dpa1.py's (the se_atten descriptor, the independent numpy
se_atten model, dpw's parameter names), and runs `dp convert-backend` (the `dp` beside the
running python) on the model.yaml it writes.
Writes tests/reference/linear/<case>/{input.json, model.yaml (not for the _nopbc case: the
same model as its periodic case), eval.npz, eval.json[, train_step.npz, train_step.json]};
tests/reference/linear/README.md describes them.

A linear model only takes mixed-type sub-models (LinearEnergyAtomicModel.__init__: "only
supports AtomicModel of mixed type"), so every member here is se_atten / se_atten_v2 + ener, and
the members differ from one another in every size (rcut, rcut_smth, sel, neuron, axis_neuron,
tebd_dim, attention layers, fitting neurons, seeds), so that swapping or sharing anything between
them changes the numbers.

Statistics: each member's davg/dstd are DeePMD-kit's own (`compute_input_stats` of the member's
descriptor on the case's eval frames, the path of `dp train`, honouring set_davg_zero); the
linear model's own out_bias comes from DeePMD-kit's `compute_output_stats` on the eval frames'
energy labels (set-by-statistic, as `dp train` fits it; the same as pairtab.py). `dp train`
leaves the members' out_bias at 0 (it calls their compute_or_load_stat with
compute_or_load_out_stat=False); linear_list_water and linear_mean3_water give them distinctive
non-zero values, which DeePMD-kit's serialization keeps and its PyTorch backend adds (each
member's forward_common_atomic applies its own out_bias, then the linear model's apply_out_stat
adds its own), so the two biases can be told apart.
- eval: the PyTorch model built from the serialization (LinearEnergyModel.deserialize) gives
  energy, atom_energy, force and virial; `dpmodel` (numpy) gives energy and atom_energy (it does
  NOT add the members' out_bias: its forward_atomic calls each member's forward_atomic; the
  check adds Σ_k w_k b_k back); `DeepPot` gives all four again on a .pth: `dp convert-backend`
  refuses the yaml ("Unknown model type: linear"), so the .pth is made by the very steps of its
  deserialize_to_file with the class named (LinearEnergyModel.deserialize, torch.jit.script,
  torch.jit.save), and `dp convert-backend` turns that .pth back into a yaml (compared);
  each member alone (PT, its out_bias zeroed) gives e_k, and dpa1.py's independent numpy
  se_atten model gives e_k again from the serialized member alone; finite differences of the PT
  energy check a few forces and the virial.
- train step (periodic cases): PT's `EnergyStdLoss`, `loss.backward()`, `.grad` of every
  parameter of every member, as dpa1.py / pairtab.py do.
"""

import copy
import itertools
import json
import os
import subprocess
import sys
import tempfile

import deepmd
import numpy as np
import torch
from deepmd.dpmodel.utils.serialization import load_dp_model, save_dp_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import descriptors as base  # noqa: E402
import dpa1  # noqa: E402

OUT = "tests/reference/linear"
GENERATOR = "scripts/make-reference/linear.py"
WATER = dpa1.WATER


def fit(neuron, seed):
    return {"type": "ener", "neuron": neuron, "resnet_dt": True, "seed": seed,
            "precision": "float64"}


# member 0: se_atten without attention (pairtab.py's DP part, smaller), set_davg_zero true
M0 = {"descriptor": dpa1.atten("se_atten", 40, 4.0, rcut_smth=0.5, attn_layer=0, tebd_dim=4,
                               neuron=[4, 8], axis_neuron=4, seed=1),
      "fitting_net": fit([8, 8], 2)}
# The members' rcut: se_atten's energy jumps where a pair crosses rcut when the attention is not
# smooth or davg ≠ 0 (concat), and within ~2e-4 Å inside rcut the normalised direction r̂ of the
# attention's dotr sits at its 1e-12 floor, where its derivatives are huge: the water frames
# have pair distances within 1e-4 of 3.0 and 3.5 (frame 0: 3.0 − 7.5e-5), so the rcut of the
# attention members are 2.977 and 3.528, whose nearest pairs on frames 0, 1, 2 are ≥ 1.2e-3 and
# ≥ 5.5e-4 away (eval.json: nearest_pair_to_rcut); member 0 (no attention, davg 0) keeps 4.0.
# member 1: shorter range, one attention layer, davg from the data (set_davg_zero false)
M1 = {"descriptor": dpa1.atten("se_atten", 24, 2.977, rcut_smth=0.3, attn_layer=1, attn=8,
                               tebd_dim=6, neuron=[6, 12], axis_neuron=3, set_davg_zero=False,
                               seed=3),
      "fitting_net": fit([10], 4)}
# member 2: se_atten_v2 (strip, smooth), type_one_side false, one attention layer
M2 = {"descriptor": dpa1.atten("se_atten_v2", 32, 3.528, rcut_smth=0.4, attn_layer=1, attn=6,
                               tebd_dim=5, neuron=[5, 10], axis_neuron=2, type_one_side=False,
                               seed=5),
      "fitting_net": fit([6, 6], 6)}


def linear(models, weights):
    return {"type": "linear_ener", "type_map": WATER["type_map"],
            "models": copy.deepcopy(models), "weights": weights}


CASES = {
    # weights "sum"; the members' out_bias 0, as `dp train` leaves them
    "linear_sum_water": dict(WATER, pbc=True, train=True, member_out_bias=None,
                             model=linear([M0, M1], "sum")),
    # the same members, weights a list; the members' out_bias set to distinctive values
    "linear_list_water": dict(WATER, pbc=True, train=True,
                              member_out_bias=[[0.3, -0.2], [-0.15, 0.25]],
                              model=linear([M0, M1], [0.7, 0.45])),
    # three members, weights "mean"; member 1's out_bias 0, the others' not
    "linear_mean3_water": dict(WATER, pbc=True, train=True,
                               member_out_bias=[[0.3, -0.2], [0.0, 0.0], [-0.4, 0.6]],
                               model=linear([M0, M1, M2], "mean")),
    # the same model (its model.yaml is linear_mean3_water's, not repeated), without a box
    "linear_mean3_water_nopbc": dict(WATER, pbc=False, train=False, yaml_of="linear_mean3_water",
                                     member_out_bias=[[0.3, -0.2], [0.0, 0.0], [-0.4, 0.6]],
                                     model=linear([M0, M1, M2], "mean")),
}


def sample_of(data, nt):
    nf, n = data["coord"].shape[:2]
    return {"coord": data["coord"], "atype": np.tile(data["atype"], (nf, 1)),
            "box": data["box"].reshape(nf, 9),
            "natoms": np.tile(np.concatenate([[n, n], np.bincount(data["atype"], minlength=nt)]),
                              (nf, 1))}


def set_input_stats(desc_ser, data, nt):
    """davg/dstd of one member's descriptor: DeePMD-kit's compute_input_stats (dpmodel) on the
    frames (every slot row of a type is equal, asserted), written into the serialization."""
    from deepmd.dpmodel.descriptor.base_descriptor import BaseDescriptor

    obj = BaseDescriptor.deserialize(copy.deepcopy(desc_ser))
    obj.compute_input_stats([sample_of(data, nt)])
    davg, dstd = (np.array(a, dtype=np.float64) for a in obj.get_stat_mean_and_stddev())
    assert np.all(davg == davg[:, :1]) and np.all(dstd == dstd[:, :1])
    assert davg.shape == desc_ser["@variables"]["davg"].shape
    desc_ser["@variables"]["davg"] = davg
    desc_ser["@variables"]["dstd"] = dstd


def build(case, data):
    """dpmodel's get_model, each member's davg/dstd from DeePMD-kit's statistics, the linear
    model's out_bias from compute_output_stats (the labels alone), the members' out_bias as the
    case says (0 as `dp train` leaves them, or distinctive values)."""
    from deepmd.dpmodel.model.model import get_model
    from deepmd.dpmodel.utils.stat import compute_output_stats

    params = copy.deepcopy(case["model"])
    ser = get_model(copy.deepcopy(params)).serialize()
    nt = len(params["type_map"])
    for k, sub in enumerate(ser["models"]):
        assert sub["type"] == "standard", sub["type"]
        set_input_stats(sub["descriptor"], data, nt)
        if case["member_out_bias"] is not None:
            sub["@variables"]["out_bias"] = np.array(
                case["member_out_bias"][k], dtype=np.float64).reshape(1, nt, 1)
    natoms = np.concatenate([[len(data["atype"])] * 2, np.bincount(data["atype"], minlength=nt)])
    sampled = [{
        "energy": data["energy"].reshape(-1, 1),
        "natoms": np.tile(natoms, (len(data["energy"]), 1)),
        "find_energy": np.float32(1.0),
    }]
    bias, _ = compute_output_stats(sampled, nt, ["energy"], rcond=None)
    ser["@variables"]["out_bias"] = bias["energy"].reshape(1, nt, 1)
    return params, ser


def weights_used(ser):
    ws, k = ser["weights"], len(ser["models"])
    if ws == "sum":
        return [1.0] * k
    if ws == "mean":
        return [1.0 / k] * k
    return [float(w) for w in ws]


def names_for(pt, nmodels):
    """dpw names of every member's parameters: PyTorch's `atomic_model.models.<k>.<x>` is
    `m<k>.` + dpa1.dpw_names' name of `atomic_model.<x>`."""
    out = {}
    for k in range(nmodels):
        pre = f"atomic_model.models.{k}."

        class Renamed:
            def named_parameters(self, pre=pre):
                for n, p in pt.named_parameters():
                    if n.startswith(pre):
                        yield "atomic_model." + n[len(pre):], p

        short = dpa1.dpw_names(Renamed())
        for n, _ in pt.named_parameters():
            if n.startswith(pre) and "atomic_model." + n[len(pre):] in short:
                out[n] = f"m{k}." + short["atomic_model." + n[len(pre):]]
    n_with_elements = sum(1 for _, p in pt.named_parameters() if p.numel() > 0)
    assert len(out) == n_with_elements, (len(out), n_with_elements)
    return out


def pt_model(ser):
    """PT's BaseModel registers the linear model as "linear_ener" only, while its serialization
    says "linear": BaseModel.deserialize refuses it ("Unknown model type: linear"), so the class
    is named."""
    from deepmd.pt.model.model import LinearEnergyModel

    assert ser["type"] == "linear"
    return LinearEnergyModel.deserialize(copy.deepcopy(ser))


def pt_eval(pt, coord, box, atype):
    nf = coord.shape[0]
    pt.train(False)
    return pt(torch.tensor(coord.reshape(nf, -1), dtype=torch.float64),
              torch.tensor(np.tile(atype, (nf, 1)), dtype=torch.int64),
              box=None if box is None else torch.tensor(box.reshape(nf, 9), dtype=torch.float64))


def dp_eval(dp, coord, box, atype):
    """dpmodel's energy and atomic energy (its LinearEnergyModel.call returns the internal names
    `energy` per atom and `energy_redu`; numpy has no autodiff: no forces)."""
    nf = coord.shape[0]
    r = dp(coord.reshape(nf, -1, 3), np.tile(atype, (nf, 1)),
           box=None if box is None else box.reshape(nf, 3, 3))
    if "energy_redu" in r:
        return {"energy": np.asarray(r["energy_redu"]).reshape(nf),
                "atom_energy": np.asarray(r["energy"]).reshape(nf, -1)}
    return {"energy": r["energy"].reshape(nf), "atom_energy": r["atom_energy"].reshape(nf, -1)}


def error_of(e):
    err = e.stderr.decode(errors="replace").strip().splitlines()
    return {"command": "dp " + " ".join(os.path.basename(a) for a in e.cmd[1:]),
            "last_line": err[-1] if err else ""}


def convert_and_deeppot(yaml_path, ser, params, coord, box, atype, tmp):
    """`dp convert-backend model.yaml model.pth` (refused for a linear model: its error is
    recorded); where it fails, the .pth is made by the steps of deepmd.pt.utils.serialization
    .deserialize_to_file with the class named. DeepPot on the .pth; `dp convert-backend
    model.pth back.yaml` (PT rebuilds the model from model_def_script and loads the state)."""
    from deepmd.infer import DeepPot

    pth = os.path.join(tmp, "model.pth")
    back = os.path.join(tmp, "back.yaml")
    dp = os.path.join(os.path.dirname(sys.executable), "dp")
    convert_error, pth_by = None, "dp convert-backend model.yaml model.pth"
    try:
        subprocess.run([dp, "convert-backend", yaml_path, pth], check=True, capture_output=True)
    except subprocess.CalledProcessError as e:
        convert_error = error_of(e)
        data = load_dp_model(yaml_path)
        m = pt_model(data["model"])
        m.model_def_script = json.dumps(data["model_def_script"])
        torch.jit.save(torch.jit.script(m), pth)
        pth_by = ("deserialize_to_file's steps with LinearEnergyModel named: "
                  "LinearEnergyModel.deserialize(model.yaml's model), model_def_script = "
                  "json(input.json's model), torch.jit.script, torch.jit.save")
    nf = coord.shape[0]
    e, f, v, ae, _ = DeepPot(pth).eval(
        coord.reshape(nf, -1), None if box is None else box.reshape(nf, 9), atype, atomic=True)
    dpot = {"energy": e.reshape(nf), "atom_energy": ae.reshape(nf, -1),
            "force": f.reshape(nf, -1, 3), "virial": v.reshape(nf, 9)}
    rt = {"pth_made_by": pth_by}
    try:
        subprocess.run([dp, "convert-backend", pth, back], check=True, capture_output=True)
        bm = load_dp_model(back)["model"]
        rt.update({"type": bm["type"], "max_abs_param_diff": base.array_diff(ser, bm),
                   "weights": bm.get("weights"),
                   "out_bias": np.asarray(bm["@variables"]["out_bias"]).reshape(-1).tolist(),
                   "member_out_bias": [np.asarray(s["@variables"]["out_bias"]).reshape(-1)
                                       .tolist() for s in bm["models"]]})
    except subprocess.CalledProcessError as e:
        rt["error"] = error_of(e)
    return dpot, convert_error, rt


def max_neighbours(data, rc, pbc):
    """The largest number of neighbours within rc (all types, all periodic images)."""
    mx = 0
    for f in range(data["coord"].shape[0]):
        x = data["coord"][f]
        shifts = np.zeros((1, 3)) if not pbc else np.array(
            [np.array(s) @ data["box"][f] for s in itertools.product([-1, 0, 1], repeat=3)])
        r = np.linalg.norm(x[None, :, None, :] + shifts[None, None] - x[:, None, None, :],
                           axis=-1)
        r[r == 0] = np.inf
        mx = max(mx, int((r < rc).sum(axis=(1, 2)).max()))
    return mx


def nearest_pair_to_rcut(data, rc, pbc):
    """Per frame, the pair distance (all images) nearest rc, minus rc."""
    out = []
    for f in range(data["coord"].shape[0]):
        x = data["coord"][f]
        shifts = np.zeros((1, 3)) if not pbc else np.array(
            [np.array(s) @ data["box"][f] for s in itertools.product([-1, 0, 1], repeat=3)])
        r = np.linalg.norm(x[None, :, None, :] + shifts[None, None] - x[:, None, None, :],
                           axis=-1).ravel()
        out.append(float(r[np.argmin(np.abs(r - rc))] - rc))
    return out


def member_alone(sub, zero_bias=True):
    """One member as a standalone PT standard model (its out_bias zeroed: e_k)."""
    s = copy.deepcopy(sub)
    if zero_bias:
        s["@variables"]["out_bias"] = np.zeros_like(s["@variables"]["out_bias"])
    return base.pt_model(s)


def run_case(name, case):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    pbc = case["pbc"]
    ev = base.load(case, case["eval_frames"])
    box = ev["box"] if pbc else None
    params, ser = build(case, ev)
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {
        "backend": "dpmodel", "model": ser, "model_def_script": params, "@variables": {}})
    # what DeePMD-kit reads back from the file is what the numbers below come from
    ser = load_dp_model(yaml_path)["model"]

    pt = pt_model(ser)
    dp = base.dp_model(ser)
    nf = len(case["eval_frames"])
    n = ev["coord"].shape[1]
    nmod = len(ser["models"])
    r = pt_eval(pt, ev["coord"], box, ev["atype"])
    pred = {"energy": r["energy"].detach().numpy().reshape(nf),
            "atom_energy": r["atom_energy"].detach().numpy().reshape(nf, -1),
            "force": r["force"].detach().numpy().reshape(nf, -1, 3),
            "virial": r["virial"].detach().numpy().reshape(nf, 9)}
    dpr = dp_eval(dp, ev["coord"], box, ev["atype"])
    with tempfile.TemporaryDirectory() as tmp:
        dpot, convert_error, rt = convert_and_deeppot(
            yaml_path, ser, params, ev["coord"], box, ev["atype"], tmp)

    # the pieces
    ws = weights_used(ser)
    lin_bias = ser["@variables"]["out_bias"][0, :, 0]
    mem_bias = np.array([s["@variables"]["out_bias"][0, :, 0] for s in ser["models"]])
    e_k = np.array([pt_eval(member_alone(s), ev["coord"], box, ev["atype"])["atom_energy"]
                    .detach().numpy().reshape(nf, -1) for s in ser["models"]])
    t = ev["atype"]
    recon = sum(ws[k] * (e_k[k] + mem_bias[k][t]) for k in range(nmod)) + lin_bias[t]
    member_bias_term = sum(ws[k] * mem_bias[k][t] for k in range(nmod))
    pieces = {"member_atom_energy_without_bias": e_k, "weights_used": np.array(ws),
              "out_bias": lin_bias, "member_out_bias": mem_bias}
    checks = {}
    if pbc:
        # dpa1.py's numpy se_atten model on each serialized member (its own neighbour search)
        ind = np.array([dpa1.independent_atom_energy(
            dict(s, **{"@variables": {"out_bias": np.zeros_like(s["@variables"]["out_bias"])}}),
            ev) for s in ser["models"]])
        pieces["member_atom_energy_independent"] = ind
        checks["independent_numpy_member_vs_pt_member_max_abs"] = [
            float(np.abs(ind[k] - e_k[k]).max()) for k in range(nmod)]
        checks["independent_numpy_recombined_vs_pt_atom_energy_max_abs"] = float(np.abs(
            sum(ws[k] * (ind[k] + mem_bias[k][t]) for k in range(nmod)) + lin_bias[t]
            - pred["atom_energy"]).max())

    e_pt = lambda x, b: float(pt_eval(pt, x, b if pbc else None, ev["atype"])[
        "energy"].detach().numpy().sum())
    fd_atoms = [0, n - 1]
    fdf = base.fd_forces(e_pt, ev, fd_atoms)
    fdv = base.fd_virial(e_pt, ev)
    v0 = pred["virial"][0].reshape(3, 3)
    checks.update({
        "pt_vs_dpmodel_max_abs": {k: float(np.abs(pred[k] - dpr[k]).max()) for k in dpr},
        "pt_vs_dpmodel_plus_member_bias_max_abs": {
            "atom_energy": float(np.abs(pred["atom_energy"] - dpr["atom_energy"]
                                        - member_bias_term).max()),
            "energy": float(np.abs(pred["energy"] - dpr["energy"]
                                   - member_bias_term.sum()).max())},
        "pt_vs_deeppot_pth_max_abs": {k: float(np.abs(pred[k] - dpot[k]).max()) for k in pred},
        "dp_convert_backend_yaml_to_pth_error": convert_error,
        "pth_to_yaml": rt,
        "pieces_recombined_vs_pt_atom_energy_max_abs": float(
            np.abs(recon - pred["atom_energy"]).max()),
        "atom_energy_sum_vs_energy_max_abs": float(
            np.abs(pred["atom_energy"].sum(1) - pred["energy"]).max()),
        "fd_force": {
            "frame": 0, "atoms": fd_atoms, "h": 1e-4, "scheme": "fourth-order central",
            "force_pt": pred["force"][0, fd_atoms].tolist(), "fd_of_pt_energy": fdf.tolist(),
            "max_abs_err_pt": float(np.abs(fdf - pred["force"][0, fd_atoms]).max()),
        },
        "fd_virial": {
            "frame": 0, "h": 1e-4, "scheme": "−∂E/∂ε_ab, coord and box (rows) times (1+ε), "
            "fourth-order central; vs virial[3a+b]" + ("" if pbc else
                                                      " (no box: the coordinates only)"),
            "fd": fdv.reshape(-1).tolist(), "max_abs_err": float(np.abs(fdv - v0).max())},
    })
    if not pbc:
        vv = np.einsum("ia,ib->ab", ev["coord"][0], pred["force"][0])
        checks["nopbc_virial_vs_sum_r_a_f_b_max_abs"] = float(np.abs(vv - v0).max())
    if case.get("yaml_of"):
        other = os.path.join(OUT, case["yaml_of"], "model.yaml")
        strip = lambda f: [ln for ln in open(f) if not ln.startswith("time:")]
        checks["model_yaml_identical_to"] = [case["yaml_of"], strip(yaml_path) == strip(other)]
        assert checks["model_yaml_identical_to"][1], name
        os.remove(yaml_path)

    np.savez(os.path.join(out, "eval.npz"), coord=ev["coord"],
             **({"box": ev["box"]} if pbc else {}), atype=ev["atype"],
             energy=pred["energy"], atom_energy=pred["atom_energy"], force=pred["force"],
             virial=pred["virial"], **{k + "_dpmodel": v for k, v in dpr.items()}, **pieces)
    members = []
    for k, (s, inp) in enumerate(zip(ser["models"], params["models"])):
        d = s["descriptor"]
        members.append({
            "descriptor_serialized_type": d["type"],
            "rcut": d["rcut"], "rcut_smth": d["rcut_smth"], "sel": d["sel"],
            "max_neighbours_within_rcut_on_eval_frames": max_neighbours(ev, d["rcut"], pbc),
            "nearest_pair_to_rcut_minus_rcut_per_frame": nearest_pair_to_rcut(ev, d["rcut"], pbc),
            "set_davg_zero": d["set_davg_zero"],
            "davg_dstd": {"shape": list(d["@variables"]["davg"].shape),
                          "davg_per_type": d["@variables"]["davg"][:, 0].tolist(),
                          "dstd_per_type": d["@variables"]["dstd"][:, 0].tolist(),
                          "from": "DeePMD-kit's compute_input_stats (dpmodel) on the eval "
                          "frames (the periodic ones also for the _nopbc case)"},
            "fitting_bias_atom_e": s["fitting"]["@variables"]["bias_atom_e"].reshape(-1).tolist(),
            "out_bias": s["@variables"]["out_bias"].reshape(-1).tolist(),
        })
    meta = {
        "generator": GENERATOR,
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"], "frames": case["eval_frames"], "pbc": pbc,
        "type_map": case["type_map"],
        "model_input": params,
        "serialized_type": ser["type"],
        "serialized_member_types": [s["type"] for s in ser["models"]],
        "weights": ser["weights"],
        "weights_used": ws,
        "out_bias": lin_bias.tolist(),
        "member_out_bias": mem_bias.tolist(),
        "atom_energy_formula": "E_i = Σ_k w_k (e_k,i + member_out_bias[k][t_i]) + "
        "out_bias[t_i] (PyTorch; dpmodel leaves out the member_out_bias term)",
        "members": members,
        "energy": pred["energy"].tolist(),
        "energy_dpmodel": dpr["energy"].tolist(),
        "virial": pred["virial"].tolist(),
        "checks": checks,
    }
    with open(os.path.join(out, "eval.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    print(f"{name}: PT−dpmodel {max(checks['pt_vs_dpmodel_max_abs'].values()):.1e} "
          f"(+Σ w b_k: {max(checks['pt_vs_dpmodel_plus_member_bias_max_abs'].values()):.1e}), "
          f"PT−pth {max(checks['pt_vs_deeppot_pth_max_abs'].values()):.1e}, "
          f"yaml→pth {convert_error}, pth→yaml {rt.get('max_abs_param_diff', rt.get('error'))}, "
          f"pieces {checks['pieces_recombined_vs_pt_atom_energy_max_abs']:.1e}, independent "
          f"{checks.get('independent_numpy_recombined_vs_pt_atom_energy_max_abs', float('nan')):.1e}"
          f", fd force {checks['fd_force']['max_abs_err_pt']:.1e}, fd virial "
          f"{checks['fd_virial']['max_abs_err']:.1e}, max nei "
          f"{[m['max_neighbours_within_rcut_on_eval_frames'] for m in members]}", flush=True)

    if not case["train"]:
        return
    tr = base.load(case, case["train_frames"])
    names = names_for(pt, nmod)
    fd_keys = ["m0.embed.layer0.w", "m0.tebd.layer0.w", "m0.fit.layer0.w"]
    for k, s in enumerate(ser["models"][1:], start=1):
        d = s["descriptor"]
        fd_keys.append(f"m{k}.embed.layer0.w")
        if d["type"] == "se_atten_v2" or d.get("tebd_input_mode") == "strip":
            fd_keys.append(f"m{k}.embed_strip.layer0.w")
        if d["attn_layer"] > 0:
            fd_keys.append(f"m{k}.attn{d['attn_layer'] - 1}.in.w")
        fd_keys.append(f"m{k}.fit.layer0.w")
    lval, tmeta = base.train_step(
        out, pt, tr, names, GENERATOR, case["system"], case["train_frames"], fd_keys, False,
        extra_meta={"torch_names": {v: k for k, v in names.items()},
                    "parameter_names": "m<k>. + tests/reference/dpa1's names for member k"})
    hand, fds = tmeta["hand_written_loss"], tmeta["fd_param_checks"]
    print(f"{name}: loss {lval!r}, {tmeta['n_tensors']} tensors, "
          f"{tmeta['n_parameters']} parameters; "
          f"f64inv vs deepmd {hand['loss']['grad_f64_inv_vs_deepmd_max_rel']:.1e}; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

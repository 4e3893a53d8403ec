"""DeePMD-kit 3.2.0's own numbers for pair tables, use_srtab (ZBL) and linear_ener models
(preparation for issue 57 item 4).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu]==3.2.0"`, which
brings PyTorch) from the repository root: `python scripts/make-reference/pairtab.py [case ...]`
(no argument: every case of CASES). Like dpa1.py it imports descriptors.py's helpers (data,
loss, finite differences) and dpa1.py's (the se_atten descriptor and its statistics) and runs
`dp convert-backend` (the `dp` beside the running python) on the model.yaml it writes.
Writes tests/reference/pairtab/{tab.txt, table_probe.json} and
tests/reference/pairtab/<case>/{input.json, model.yaml (not for zbl_water_nopbc: the same model
as zbl_water), eval.npz, eval.json[, train_step.npz, train_step.json]};
tests/reference/pairtab/README.md describes them.

DeePMD-kit 3.2.0 refuses a top-level `"type": "pairtab"` model ("Unknown model type: pairtab",
PT and dpmodel alike: argcheck registers it for TF only), and a linear or use_srtab model only
takes mixed-type sub-models (LinearEnergyAtomicModel.__init__: "only supports AtomicModel of
mixed type"), so se_e2_a cannot be one: the DP part here is dpa1.py's se_atten with
attn_layer 0 (the case se_atten_l0_water), and "pairtab alone" is a linear_ener holding the
pair table as its only model (weights "sum").
- eval: the PyTorch model built from the serialization gives energy, atom_energy, force and
  virial; `dpmodel` (numpy) gives energy and atom_energy (no forces: numpy has no autodiff);
  `DeepPot` on the .pth of `dp convert-backend` gives them again; finite differences of the PT
  energy check a few forces and the virial; `independent_pair_energy` recomputes the pair table's
  atomic energies from the serialized spline coefficients and the README's formulas.
- train step (cases with a DP part, periodic): PT's `EnergyStdLoss`, `loss.backward()`,
  `.grad` of every parameter, as descriptors.py / dpa1.py do.
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

OUT = "tests/reference/pairtab"
TAB = "tab.txt"  # written into OUT; input.json names it relative to its own folder (../tab.txt)

# The synthetic table: r from 0.4 to 3.5 step 0.1 (32 rows), columns O-O, O-H, H-H. The values
# do not decay to 0 at 3.5 < rcut 4.0, so PairTab extends the table by its cubic extrapolation
# (_extrapolate_table) to rcut.
TAB_R = np.round(np.linspace(0.4, 3.5, 32), 10)


def tab_values(r):
    return np.stack([
        2.0 * np.exp(-1.2 * r),
        1.5 * np.exp(-1.5 * r) - 0.05 * np.exp(-0.5 * r),
        0.8 * np.exp(-1.8 * r) + 0.02 * np.cos(r),
    ], axis=1)


WATER = dpa1.WATER
DESC = dpa1.atten("se_atten", 40, 4.0, attn_layer=0, tebd_dim=4)
FIT = base.FIT
PAIRTAB = {"type": "pairtab", "tab_file": "../" + TAB, "rcut": 4.0, "sel": 40}
DP_SUB = {"descriptor": DESC, "fitting_net": FIT}
# A table of a longer range than the DP model's descriptor (rcut 4.0, sel 40), as DeePMD-kit's
# water/d3 example has (rcut 10 beside 6): the table reads its own neighbour list. The eval
# frames' atoms have 68-102 neighbours within 6 Å: sel 110 keeps them all, sel 80 cuts many
# lists to their nearest 80 (and so the energy jumps where two distances swap at the cut: no
# finite-difference virial for that case).
PAIRTAB_FAR = dict(PAIRTAB, rcut=6.0, sel=110)

CASES = {
    # the pair table alone (inside a one-model linear_ener, see above)
    "pairtab_water": dict(WATER, pbc=True, train=False, model={
        "type": "linear_ener", "type_map": WATER["type_map"], "models": [PAIRTAB],
        "weights": "sum"}),
    # se_atten + use_srtab: DeePMD-kit's DP/ZBL mix (DPZBLModel); sw 0.8–1.2 puts the softmin
    # distance of every water atom (≈ its O–H bond, 0.9–1.1) inside the switch
    "zbl_water": dict(WATER, pbc=True, train=True, model={
        "type_map": WATER["type_map"], "descriptor": DESC, "fitting_net": FIT,
        "use_srtab": "../" + TAB, "smin_alpha": 0.1, "sw_rmin": 0.8, "sw_rmax": 1.2}),
    # the same model (its model.yaml is zbl_water's, not repeated), without a box
    "zbl_water_nopbc": dict(WATER, pbc=False, train=False, yaml_of="zbl_water", model={
        "type_map": WATER["type_map"], "descriptor": DESC, "fitting_net": FIT,
        "use_srtab": "../" + TAB, "smin_alpha": 0.1, "sw_rmin": 0.8, "sw_rmax": 1.2}),
    # linear_ener of se_atten and the pair table
    "linear_sum_water": dict(WATER, pbc=True, train=True, model={
        "type": "linear_ener", "type_map": WATER["type_map"], "models": [DP_SUB, PAIRTAB],
        "weights": "sum"}),
    "linear_list_water": dict(WATER, pbc=True, train=True, model={
        "type": "linear_ener", "type_map": WATER["type_map"], "models": [DP_SUB, PAIRTAB],
        "weights": [0.7, 0.4]}),
    # linear_ener of se_atten and the longer-range table
    "linear_far_water": dict(WATER, pbc=True, train=True, model={
        "type": "linear_ener", "type_map": WATER["type_map"], "models": [DP_SUB, PAIRTAB_FAR],
        "weights": "mean"}),
    "linear_far_sel_water": dict(WATER, pbc=True, train=False, model={
        "type": "linear_ener", "type_map": WATER["type_map"],
        "models": [DP_SUB, dict(PAIRTAB_FAR, sel=80)], "weights": "mean"}),
}


def write_table():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, TAB)
    np.savetxt(path, np.column_stack([TAB_R, tab_values(TAB_R)]), fmt="%.18e")
    return path


def build(case, data):
    """dpmodel's get_model in OUT/<any case folder> (the tab path is relative), the DP part's
    davg/dstd by hand (dpa1.set_stats), the combined model's out_bias from compute_output_stats;
    the sub-models' out_bias stay 0 as `dp train` leaves them (compute_or_load_out_stat=False)."""
    from deepmd.dpmodel.model.model import get_model
    from deepmd.dpmodel.utils.stat import compute_output_stats

    params = copy.deepcopy(case["model"])
    cwd = os.getcwd()
    os.makedirs(os.path.join(OUT, "_build"), exist_ok=True)
    os.chdir(os.path.join(OUT, "_build"))
    try:
        ser = get_model(copy.deepcopy(params)).serialize()
    finally:
        os.chdir(cwd)
        os.rmdir(os.path.join(OUT, "_build"))
    for sub in ser["models"]:
        if sub["type"] == "standard":
            dpa1.set_stats(sub["descriptor"], WATER)
    nt = len(params["type_map"])
    natoms = np.concatenate([[len(data["atype"])] * 2, np.bincount(data["atype"], minlength=nt)])
    sampled = [{
        "energy": data["energy"].reshape(-1, 1),
        "natoms": np.tile(natoms, (len(data["energy"]), 1)),
        "find_energy": np.float32(1.0),
    }]
    bias, _ = compute_output_stats(sampled, nt, ["energy"], rcond=None)
    ser["@variables"]["out_bias"] = bias["energy"].reshape(1, nt, 1)
    return params, plain_scalars(ser)


def plain_scalars(x):
    """numpy scalars → Python numbers: PairTab.serialize keeps rmin, rmax, hh, rcut as
    np.float64 (and ntypes, nspline as numpy ints), which DeePMD-kit's own save_dp_model cannot
    write ("cannot represent an object"); the values are unchanged."""
    if isinstance(x, dict):
        return {k: plain_scalars(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain_scalars(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def names_for(pt):
    """dpw names (dpa1.dpw_names) of the DP sub-model's parameters: PyTorch's
    `atomic_model.models.0.<x>` is dpa1's `atomic_model.<x>`."""
    class Renamed:
        def __init__(self, m):
            self.m = m

        def named_parameters(self):
            for k, p in self.m.named_parameters():
                yield k.replace("atomic_model.models.0.", "atomic_model."), p

    short = dpa1.dpw_names(Renamed(pt))
    return {k: short[k.replace("atomic_model.models.0.", "atomic_model.")]
            for k, _ in pt.named_parameters()
            if k.replace("atomic_model.models.0.", "atomic_model.") in short}


def pt_model(ser):
    """The PT model of a serialization. PT's BaseModel registers the linear model as
    "linear_ener" only, while its serialization (dpmodel's and PT's alike) says "linear":
    BaseModel.deserialize refuses it ("Unknown model type: linear"), so the class is named."""
    if ser["type"] == "linear":
        from deepmd.pt.model.model import LinearEnergyModel

        return LinearEnergyModel.deserialize(copy.deepcopy(ser))
    return base.pt_model(ser)


def pt_eval(pt, coord, box, atype):
    nf = coord.shape[0]
    pt.train(False)
    return pt(torch.tensor(coord.reshape(nf, -1), dtype=torch.float64),
              torch.tensor(np.tile(atype, (nf, 1)), dtype=torch.int64),
              box=None if box is None else torch.tensor(box.reshape(nf, 9), dtype=torch.float64))


def dp_eval(dp, coord, box, atype):
    """dpmodel's energy and atomic energy. Its LinearEnergyModel.call returns the internal
    names (`energy` per atom, `energy_redu`) and, numpy having no autodiff, empty derivatives;
    no dpmodel model gives forces on numpy."""
    nf = coord.shape[0]
    r = dp(coord.reshape(nf, -1, 3), np.tile(atype, (nf, 1)),
           box=None if box is None else box.reshape(nf, 3, 3))
    if "energy_redu" in r:
        return {"energy": np.asarray(r["energy_redu"]).reshape(nf),
                "atom_energy": np.asarray(r["energy"]).reshape(nf, -1)}
    return {"energy": r["energy"].reshape(nf), "atom_energy": r["atom_energy"].reshape(nf, -1)}


def convert_and_deeppot(yaml_path, coord, box, atype, tmp):
    """`dp convert-backend` yaml → .pth, DeepPot on the .pth, .pth → yaml; run inside the
    case folder: a .pth of a use_srtab model is rebuilt from its model_def_script, whose
    `use_srtab` path ("../tab.txt") is read relative to the working directory."""
    from deepmd.infer import DeepPot

    pth = os.path.join(tmp, "model.pth")
    back = os.path.join(tmp, "back.yaml")
    dp = os.path.join(os.path.dirname(sys.executable), "dp")
    cwd = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(yaml_path)))
    try:
        subprocess.run([dp, "convert-backend", os.path.abspath(os.path.join(cwd, yaml_path)),
                        pth], check=True, capture_output=True)
        nf = coord.shape[0]
        e, f, v, ae, _ = DeepPot(pth).eval(
            coord.reshape(nf, -1), None if box is None else box.reshape(nf, 9), atype,
            atomic=True)
        dpot = {"energy": e.reshape(nf), "atom_energy": ae.reshape(nf, -1),
                "force": f.reshape(nf, -1, 3), "virial": v.reshape(nf, 9)}
        try:
            subprocess.run([dp, "convert-backend", pth, back], check=True, capture_output=True)
        except subprocess.CalledProcessError as e:
            return dpot, None, error_of(e)
    finally:
        os.chdir(cwd)
    return dpot, back, None


def error_of(e):
    err = e.stderr.decode(errors="replace").strip().splitlines()
    return {"command": "dp " + " ".join(os.path.basename(a) for a in e.cmd[1:]),
            "last_line": err[-1] if err else ""}


def spline_energy(tab, ti, tj, r):
    """The pair energy E_{ti,tj}(r) from the serialized PairTab (README: uu, idx, clip, masks)."""
    info = tab["@variables"]["tab_info"]
    rmin, hh, nspline, ntypes = info[0], info[1], int(info[2] + 0.1), int(info[3])
    data = tab["@variables"]["tab_data"].reshape(ntypes, ntypes, nspline, 4)
    uu = (r - rmin) / hh
    idx = np.trunc(uu).astype(np.int64)  # C cast: toward zero
    uu = uu - idx
    c = data[ti, tj, np.clip(idx, 0, nspline - 1)]
    e = ((c[..., 0] * uu + c[..., 1]) * uu + c[..., 2]) * uu + c[..., 3]
    e = np.where(idx > nspline, 0.0, e)
    return np.where((r >= tab["rcut"]) | (r >= tab["rmin"] + nspline * tab["hh"]), 0.0, e)


def independent_pair_energy(pair_ser, coord, box, atype):
    """The pair table's atomic energies, ½ Σ_j E(r_ij) over the `sel` nearest neighbours (all
    periodic images) within rcut, from the serialized spline coefficients: no DeePMD-kit code."""
    tab, rc, sel = pair_ser["tab"], pair_ser["rcut"], pair_ser["sel"]
    sel = sum(sel) if isinstance(sel, list) else sel
    out = []
    for f in range(coord.shape[0]):
        x = coord[f]
        if box is None:
            shifts = np.zeros((1, 3))
        else:
            b = box[f]
            k = 2
            shifts = np.array([np.array(s) @ b for s in itertools.product(range(-k, k + 1),
                                                                         repeat=3)])
        ae = np.zeros(len(x))
        for i in range(len(x)):
            d = (x[None, :, :] + shifts[:, None, :] - x[i]).reshape(-1, 3)
            r = np.linalg.norm(d, axis=1)
            tj = np.tile(atype, len(shifts))
            m = (r > 0) & (r < rc)
            near = np.argsort(r[m], kind="stable")[:sel]
            ae[i] = 0.5 * spline_energy(tab, atype[i], tj[m][near], r[m][near]).sum()
        out.append(ae)
    return np.array(out)


def softmin_weight(ser, coord, box, atype):
    """The ZBL weight w_i (README) per atom, from all neighbours within the pair table's rcut."""
    a, lo, hi = ser["smin_alpha"], ser["sw_rmin"], ser["sw_rmax"]
    rc = ser["models"][1]["rcut"]
    out = []
    for f in range(coord.shape[0]):
        x = coord[f]
        shifts = np.zeros((1, 3)) if box is None else np.array(
            [np.array(s) @ box[f] for s in itertools.product(range(-2, 3), repeat=3)])
        w = np.zeros(len(x))
        for i in range(len(x)):
            r = np.linalg.norm((x[None] + shifts[:, None] - x[i]).reshape(-1, 3), axis=1)
            r = r[(r > 0) & (r < rc)]
            if len(r) == 0:
                continue
            s = (r * np.exp(-r / a)).sum() / np.exp(-r / a).sum()
            u = (s - lo) / (hi - lo)
            w[i] = 1.0 if s < lo else (0.0 if s >= hi else -6 * u**5 + 15 * u**4 - 10 * u**3 + 1)
        out.append(w)
    return np.array(out)


def table_probe():
    """dpmodel's PairTabAtomicModel._pair_tabulated_inter at chosen distances: below the first
    row (and below rmin − hh, where DeePMD-kit's index arithmetic folds), inside, in the
    extrapolated part, at/after rcut; and the PairTab serialization (expanded table)."""
    from deepmd.dpmodel.atomic_model.pairtab_atomic_model import PairTabAtomicModel

    m = PairTabAtomicModel(os.path.join(OUT, TAB), 4.0, 40, ["O", "H"])
    r = np.array([0.05, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.9573, 1.0, 1.234, 2.5, 3.45, 3.5,
                  3.55, 3.7, 3.9, 3.99, 4.0, 4.1, 4.5])
    res = {}
    for ti, tj in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        rr = r.reshape(1, 1, -1)
        nl = np.zeros(rr.shape, dtype=np.int64)
        e = m._pair_tabulated_inter(nl, np.array([[ti]]), np.full(rr.shape, tj), rr)
        res[f"{ti}{tj}"] = e.reshape(-1).tolist()
        mine = spline_energy(m.tab.serialize() | {"rcut": 4.0}, ti, tj, r)
        assert np.allclose(mine, e.reshape(-1), rtol=0, atol=1e-14), (ti, tj)
    s = m.tab.serialize()
    return {
        "generator": "scripts/make-reference/pairtab.py",
        "deepmd_kit": deepmd.__version__,
        "what": "PairTabAtomicModel(tab.txt, rcut=4.0, sel=40)._pair_tabulated_inter(r) per "
        "type pair (ti, tj): the pair energy E_ti,tj(r) before the ½ and the sum",
        "r": r.tolist(),
        "energy": res,
        "tab_file_rows": len(TAB_R),
        "pairtab": {k: v for k, v in s.items() if k != "@variables"},
        "tab_info": s["@variables"]["tab_info"].tolist(),
        "vdata_expanded": s["@variables"]["vdata"].tolist(),
        "tab_data_shape": [2, 2, int(s["nspline"]), 4],
        "tab_data": s["@variables"]["tab_data"].reshape(2, 2, -1, 4).tolist(),
    }


def run_case(name, case):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    ev = base.load(case, case["eval_frames"])
    box = ev["box"] if case["pbc"] else None
    params, ser = build(case, ev)
    with open(os.path.join(out, "input.json"), "w") as fh:
        json.dump({"model": params}, fh, indent=1)
        fh.write("\n")
    yaml_path = os.path.join(out, "model.yaml")
    save_dp_model(yaml_path, {
        "backend": "dpmodel", "model": ser, "model_def_script": params, "@variables": {}})

    pt = pt_model(ser)
    dp = base.dp_model(ser)
    nf = len(case["eval_frames"])
    r = pt_eval(pt, ev["coord"], box, ev["atype"])
    pred = {"energy": r["energy"].detach().numpy().reshape(nf),
            "atom_energy": r["atom_energy"].detach().numpy().reshape(nf, -1),
            "force": r["force"].detach().numpy().reshape(nf, -1, 3),
            "virial": r["virial"].detach().numpy().reshape(nf, 9)}
    dpr = dp_eval(dp, ev["coord"], box, ev["atype"])
    dpot, rt, back_type, convert_error = None, None, None, None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dpot, back, convert_error = convert_and_deeppot(
                yaml_path, ev["coord"], box, ev["atype"], tmp)
            if back is not None:
                rt = base.array_diff(ser, load_dp_model(back)["model"])
                back_type = load_dp_model(back)["model"]["type"]
    except subprocess.CalledProcessError as e:
        convert_error = error_of(e)
    e_pt = lambda x, b: float(pt_eval(pt, x, b if case["pbc"] else None, ev["atype"])[
        "energy"].detach().numpy().sum())
    n = ev["coord"].shape[1]
    fd_atoms = [0, n - 1]
    fdf = base.fd_forces(e_pt, ev, fd_atoms)
    fdv = base.fd_virial(e_pt, ev)
    v0 = pred["virial"][0].reshape(3, 3)

    # the pieces, from the serialized model alone
    bias = ser["@variables"]["out_bias"][0, ev["atype"], 0]
    pair_ser = [s for s in ser["models"] if s["type"] == "pairtab"][0]
    e_pair = independent_pair_energy(pair_ser, ev["coord"], box, ev["atype"])
    pieces = {"pair_atom_energy_independent": e_pair}
    if ser["type"] == "zbl":
        w = softmin_weight(ser, ev["coord"], box, ev["atype"])
        pieces["zbl_weight_independent"] = w
        # the DP part alone: the DP sub-model with the combined bias 0 (its own bias is 0)
        dp_sub = base.pt_model(dict(copy.deepcopy(ser["models"][0]), type="standard"))
        e_dp = pt_eval(dp_sub, ev["coord"], box, ev["atype"])["atom_energy"].detach().numpy()
        e_dp = e_dp.reshape(nf, -1) - ser["models"][0]["@variables"]["out_bias"][
            0, ev["atype"], 0]
        pieces["dp_atom_energy_without_bias"] = e_dp
        recon = (1 - w) * e_dp + w * e_pair + bias
    else:
        ws = ser["weights"]
        ws = [1.0] * len(ser["models"]) if ws == "sum" else (
            [1.0 / len(ser["models"])] * len(ser["models"]) if ws == "mean" else ws)
        recon = bias + ws[-1] * e_pair
        if len(ser["models"]) == 2:
            dp_sub = base.pt_model(dict(copy.deepcopy(ser["models"][0]), type="standard"))
            e_dp = pt_eval(dp_sub, ev["coord"], box, ev["atype"])["atom_energy"].detach().numpy()
            e_dp = e_dp.reshape(nf, -1)
            pieces["dp_atom_energy_without_bias"] = e_dp
            recon = recon + ws[0] * e_dp
    checks = {
        "pt_vs_dpmodel_max_abs": {k: float(np.abs(pred[k] - dpr[k]).max()) for k in dpr},
        "pt_vs_deeppot_pth_max_abs": None if dpot is None else {
            k: float(np.abs(pred[k] - dpot[k]).max()) for k in pred},
        "dp_convert_backend_error": convert_error,
        "yaml_to_pth_to_yaml_max_abs_param_diff": rt,
        "yaml_to_pth_to_yaml_type": back_type,
        "pieces_recombined_vs_pt_atom_energy_max_abs": float(
            np.abs(recon - pred["atom_energy"]).max()),
        "fd_force": {
            "frame": 0, "atoms": fd_atoms, "h": 1e-4, "scheme": "fourth-order central",
            "force_pt": pred["force"][0, fd_atoms].tolist(), "fd_of_pt_energy": fdf.tolist(),
            "max_abs_err_pt": float(np.abs(fdf - pred["force"][0, fd_atoms]).max()),
        },
    }
    checks["fd_virial"] = {
        "frame": 0, "h": 1e-4, "scheme": "−∂E/∂ε_ab, coord and box (rows) times (1+ε), "
        "fourth-order central; vs virial[3a+b]" + ("" if case["pbc"] else
                                                  " (no box: the coordinates only)"),
        "fd": fdv.reshape(-1).tolist(), "max_abs_err": float(np.abs(fdv - v0).max())}
    if not case["pbc"]:
        vv = np.einsum("ia,ib->ab", ev["coord"][0], pred["force"][0])
        checks["nopbc_virial_vs_sum_r_a_f_b_max_abs"] = float(np.abs(vv - v0).max())
    if len(ser["models"]) == 2:
        # PT applies each sub-model's out_bias (forward_common_atomic), dpmodel does not
        # (forward_atomic): with a non-zero sub-model bias the backends disagree.
        s2 = copy.deepcopy(ser)
        s2["models"][0]["@variables"]["out_bias"] = np.array([[[0.3], [-0.2]]])
        p2 = pt_eval(pt_model(s2), ev["coord"], box, ev["atype"])
        d2 = dp_eval(base.dp_model(s2), ev["coord"], box, ev["atype"])
        checks["sub_model_out_bias_0.3_-0.2"] = {
            "pt_energy_minus_unbiased": (p2["energy"].detach().numpy().reshape(nf)
                                         - pred["energy"]).tolist(),
            "dpmodel_energy_minus_unbiased": (d2["energy"] - dpr["energy"]).tolist(),
        }
    if case.get("yaml_of"):
        other = os.path.join(OUT, case["yaml_of"], "model.yaml")
        strip = lambda f: [ln for ln in open(f) if not ln.startswith("time:")]
        checks["model_yaml_identical_to"] = (case["yaml_of"], strip(yaml_path) == strip(other))
        os.remove(yaml_path)
    np.savez(os.path.join(out, "eval.npz"), coord=ev["coord"],
             **({"box": ev["box"]} if case["pbc"] else {}), atype=ev["atype"],
             energy=pred["energy"], atom_energy=pred["atom_energy"], force=pred["force"],
             virial=pred["virial"], **{k + "_dpmodel": v for k, v in dpr.items()}, **pieces)
    meta = {
        "generator": "scripts/make-reference/pairtab.py",
        "deepmd_kit": deepmd.__version__,
        "backend": f"pytorch {torch.__version__}, float64, CPU (dpmodel numpy {np.__version__})",
        "system": case["system"], "frames": case["eval_frames"], "pbc": case["pbc"],
        "type_map": case["type_map"],
        "model_input": params,
        "serialized_type": ser["type"],
        "serialized_sub_types": [s["type"] for s in ser["models"]],
        "weights": ser.get("weights"),
        "out_bias": ser["@variables"]["out_bias"].reshape(-1).tolist(),
        "sub_model_out_bias": [s["@variables"]["out_bias"].reshape(-1).tolist()
                               for s in ser["models"]],
        "energy": pred["energy"].tolist(),
        "virial": pred["virial"].tolist(),
        "checks": checks,
    }
    with open(os.path.join(out, "eval.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    print(f"{name}: PT−dpmodel {max(checks['pt_vs_dpmodel_max_abs'].values()):.1e}, "
          f"PT−pth {checks['pt_vs_deeppot_pth_max_abs']}, {convert_error}, "
          f"roundtrip {rt}, pieces {checks['pieces_recombined_vs_pt_atom_energy_max_abs']:.1e}"
          f", fd force {checks['fd_force']['max_abs_err_pt']:.1e}, fd virial "
          f"{checks.get('fd_virial', {}).get('max_abs_err', float('nan')):.1e}", flush=True)

    if not case["train"]:
        return
    tr = base.load(case, case["train_frames"])
    names = names_for(pt)
    lval, tmeta = base.train_step(
        out, pt, tr, names, "scripts/make-reference/pairtab.py", case["system"],
        case["train_frames"], ["embed.layer0.w", "tebd.layer0.w", "fit.layer0.w"], False,
        extra_meta={"torch_names": {v: k for k, v in names.items()}})
    hand, fds = tmeta["hand_written_loss"], tmeta["fd_param_checks"]
    print(f"{name}: loss {lval!r}, {tmeta['n_tensors']} tensors, "
          f"{tmeta['n_parameters']} parameters; "
          f"f64inv vs deepmd {hand['loss']['grad_f64_inv_vs_deepmd_max_rel']:.1e}; fd rel "
          + ", ".join(f"{c['rel_err']:.1e}" for c in fds), flush=True)


def main():
    torch.set_num_threads(1)
    write_table()
    with open(os.path.join(OUT, "table_probe.json"), "w") as fh:
        json.dump(table_probe(), fh, indent=1)
        fh.write("\n")
    for name in sys.argv[1:] or list(CASES):
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()

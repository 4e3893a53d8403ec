"""One training step's loss and full parameter gradient with virial labels, by DeePMD-kit 3.2.0
(TensorFlow backend, float64, CPU), for tests/deepmd_parity.rs.

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu]==3.2.0"`) from
the repository root: `python scripts/make-reference/virial_step.py`.
Writes tests/reference/virial_step/<case>.npz and <case>.json.

Per case: a small se_e2_a + ener model with `type_one_side: false` is initialised by DeePMD-kit's
numpy backend (`dpmodel`, seeded), with davg/dstd fixed by hand and the energy bias from
DeePMD-kit's own `compute_output_stats` on the batch; TensorFlow builds it from that
serialization (the path of `dp convert-backend`), DeePMD-kit's `EnerStdLoss` with virial
prefactors builds the loss at half the starting lr (so every prefactor is interpolated), and
`tf.gradients` differentiates it (the force and virial terms through DeePMD-kit's own gradient
ops for its force and virial kernels). The model's energy is also checked against `dpmodel`'s,
which computes it independently.

npz: `param.<name>`, `grad.<name>` and `vgrad.<name>` (the gradient of the virial term alone,
`loss_virial_only` in the json) per trainable tensor, named as dpw's layout names them
(`embed.c{centre}_n{neighbour}.layer{l}.{w,b}`, `fit.t{t}.layer{l}.{w,b,idt}`; w is [in, out]),
plus `davg`, `dstd` ([ntypes, 4]) and `out_bias` ([ntypes]).
"""

import json
import os

import deepmd
import numpy as np
from deepmd.dpmodel.model.model import get_model
from deepmd.dpmodel.utils.stat import compute_output_stats
from deepmd.tf.env import tf
from deepmd.tf.loss.ener import EnerStdLoss
from deepmd.tf.model.model import Model as TFModel

START_LR = 1e-3
LR = 5e-4  # coef = lr / start_lr = 0.5
LOSS = {
    "start_pref_e": 0.02,
    "limit_pref_e": 1.0,
    "start_pref_f": 1000.0,
    "limit_pref_f": 1.0,
    "start_pref_v": 0.5,
    "limit_pref_v": 2.0,
}
# The virial term alone: next to pref_f's force term its share of the full gradient is small, so
# a wrong virial gradient could hide inside the full one's tolerance.
LOSS_V = dict(LOSS, start_pref_e=0.0, limit_pref_e=0.0, start_pref_f=0.0, limit_pref_f=0.0)
CASES = {
    "water_virial": {
        "system": "tests/data/water_virial",
        "frames": [0, 1],
        "type_map": ["O", "H"],
        "sel": [46, 92],
        "rcut": 6.0,
        "davg_r": [0.05, 0.048],
        "dstd": [[0.14, 0.086], [0.124, 0.077]],
    },
    "alloy": {
        "system": "examples/alloy/data/train/Cu36Ni36Al36",
        "frames": [0, 1],
        "type_map": ["Cu", "Ni", "Al"],
        "sel": [40, 36, 24],
        "rcut": 5.0,
        "davg_r": [0.031, 0.030, 0.029],
        "dstd": [[0.073, 0.046], [0.074, 0.046], [0.069, 0.043]],
    },
}


def load(case):
    root = case["system"]
    names = open(os.path.join(root, "type_map.raw")).read().split()
    atype = np.loadtxt(os.path.join(root, "type.raw"), dtype=int).reshape(-1)
    atype = np.array([case["type_map"].index(names[t]) for t in atype])
    order = np.argsort(atype, kind="stable")  # DeePMD-kit sorts atoms by type
    fr = case["frames"]
    s = os.path.join(root, "set.000")
    get = lambda k: np.load(os.path.join(s, f"{k}.npy")).astype(np.float64)[fr]
    n = len(atype)
    coord = get("coord").reshape(len(fr), n, 3)[:, order].reshape(len(fr), -1)
    force = get("force").reshape(len(fr), n, 3)[:, order].reshape(len(fr), -1)
    return {
        "atype": atype[order],
        "coord": coord,
        "box": get("box").reshape(len(fr), 9),
        "energy": get("energy").reshape(len(fr)),
        "force": force,
        "virial": get("virial").reshape(len(fr), 9),
    }


def make_model(case, data):
    nt = len(case["type_map"])
    params = {
        "type_map": case["type_map"],
        "descriptor": {
            "type": "se_e2_a",
            "sel": case["sel"],
            "rcut": case["rcut"],
            "rcut_smth": 0.5,
            "neuron": [4, 8, 16],
            "axis_neuron": 4,
            "type_one_side": False,
            "resnet_dt": False,
            "seed": 1,
            "precision": "float64",
        },
        "fitting_net": {
            "type": "ener",
            "neuron": [16, 16, 16],
            "resnet_dt": True,
            "seed": 2,
            "precision": "float64",
        },
    }
    ser = get_model(params).serialize()
    davg = np.zeros((nt, 4))
    davg[:, 0] = case["davg_r"]
    dstd = np.array([[r, a, a, a] for r, a in case["dstd"]])
    nnei = sum(case["sel"])
    ser["descriptor"]["@variables"]["davg"] = np.repeat(davg[:, None, :], nnei, axis=1)
    ser["descriptor"]["@variables"]["dstd"] = np.repeat(dstd[:, None, :], nnei, axis=1)
    natoms = np.concatenate([[len(data["atype"])] * 2, np.bincount(data["atype"], minlength=nt)])
    sampled = [
        {
            "energy": data["energy"].reshape(-1, 1),
            "natoms": np.tile(natoms, (len(data["energy"]), 1)),
            "find_energy": np.float32(1.0),
        }
    ]
    bias, _ = compute_output_stats(sampled, nt, ["energy"], rcond=None)
    ser["@variables"]["out_bias"] = bias["energy"].reshape(1, nt, 1)
    return ser, davg, dstd, natoms


def named_tensors(ser):
    """dpw's names for the trainable tensors of a serialized model."""
    out = {}
    nets = ser["descriptor"]["embeddings"]["networks"]
    nt = ser["descriptor"]["embeddings"]["ntypes"]
    for k, net in enumerate(nets):
        for l, layer in enumerate(net["layers"]):
            for v in ["w", "b", "idt"]:
                if layer["@variables"].get(v) is not None:
                    out[f"embed.c{k % nt}_n{k // nt}.layer{l}.{v}"] = layer["@variables"][v]
    for t, net in enumerate(ser["fitting"]["nets"]["networks"]):
        for l, layer in enumerate(net["layers"]):
            for v in ["w", "b", "idt"]:
                if layer["@variables"].get(v) is not None:
                    out[f"fit.t{t}.layer{l}.{v}"] = layer["@variables"][v]
    return out


def tf_step(ser, data, natoms):
    nt = len(natoms) - 2
    tf.reset_default_graph()
    model = TFModel.deserialize(ser)
    f64 = tf.float64
    ph = {
        "coord": tf.placeholder(f64, [None], name="t_coord"),
        "box": tf.placeholder(f64, [None], name="t_box"),
        "type": tf.placeholder(tf.int32, [None], name="t_type"),
        "natoms": tf.placeholder(tf.int32, [nt + 2], name="t_natoms"),
        "mesh": tf.placeholder(tf.int32, [None], name="t_mesh"),
        "energy": tf.placeholder(f64, [None], name="t_energy"),
        "force": tf.placeholder(f64, [None], name="t_force"),
        "virial": tf.placeholder(f64, [None], name="t_virial"),
        "lr": tf.placeholder(f64, [], name="t_lr"),
    }
    out = model.build(
        ph["coord"], ph["type"], ph["natoms"], ph["box"], ph["mesh"], {}, reuse=False
    )
    one = tf.constant(1.0, dtype=f64)
    labels = {
        "energy": ph["energy"],
        "force": ph["force"],
        "virial": ph["virial"],
        "atom_ener": tf.zeros([0], dtype=f64),
        "atom_pref": tf.zeros([0], dtype=f64),
        "find_energy": one,
        "find_force": one,
        "find_virial": one,
        "find_atom_ener": 0.0 * one,
        "find_atom_pref": 0.0 * one,
    }
    l2, _ = EnerStdLoss(starter_learning_rate=START_LR, **LOSS).build(
        ph["lr"], ph["natoms"], out, labels, suffix=""
    )
    l2v, _ = EnerStdLoss(starter_learning_rate=START_LR, **LOSS_V).build(
        ph["lr"], ph["natoms"], out, labels, suffix="_v"
    )
    tvars = tf.trainable_variables()
    grads = tf.gradients(l2, tvars)
    # the output layer's bias does not move the virial: TF gives None, the gradient is 0
    vgrads = [
        tf.zeros_like(v) if g is None else g for g, v in zip(tf.gradients(l2v, tvars), tvars)
    ]
    nf = len(data["energy"])
    feed = {
        ph["coord"]: data["coord"].reshape(-1),
        ph["box"]: data["box"].reshape(-1),
        ph["type"]: np.tile(data["atype"], nf),
        ph["natoms"]: natoms,
        ph["mesh"]: np.array([0, 0, 0, 2, 2, 2], dtype=np.int32),
        ph["energy"]: data["energy"],
        ph["force"]: data["force"].reshape(-1),
        ph["virial"]: data["virial"].reshape(-1),
    }
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        res = {}
        for lr in [LR, START_LR]:
            feed[ph["lr"]] = lr
            res[lr] = sess.run(
                [l2, out["energy"], out["force"], out["virial"], grads, tvars, l2v, vgrads], feed
            )
    return res


def main():
    os.makedirs("tests/reference/virial_step", exist_ok=True)
    for name, case in CASES.items():
        data = load(case)
        ser, davg, dstd, natoms = make_model(case, data)
        params = named_tensors(ser)
        res = tf_step(ser, data, natoms)
        loss, energy, force, virial, grads, values, loss_v, vgrads = res[LR]
        # Each TF variable is one serialized tensor: match them by value (random init: unique).
        arrays = {}
        for g, gv, v in zip(grads, vgrads, values):
            hits = [k for k, p in params.items() if p.shape == v.shape and np.array_equal(p, v)]
            assert len(hits) == 1, (v.shape, hits)
            arrays["param." + hits[0]] = params[hits[0]]
            arrays["grad." + hits[0]] = g
            arrays["vgrad." + hits[0]] = gv
        assert len(arrays) == 3 * len(params), "every trainable tensor has a gradient"
        # dpmodel (numpy, no derivatives), independently of TF: the same energy.
        dp = get_model_from(ser)
        nf = len(data["energy"])
        r = dp(
            data["coord"].reshape(nf, -1, 3),
            np.tile(data["atype"], (nf, 1)),
            box=data["box"].reshape(nf, 3, 3),
        )
        de = np.abs(r["energy"].reshape(-1) - energy.reshape(-1)).max()
        print(f"{name}: TF vs dpmodel: energy {de:.1e}")
        assert de < 1e-9
        arrays["davg"], arrays["dstd"] = davg, dstd
        arrays["out_bias"] = ser["@variables"]["out_bias"].reshape(-1)
        np.savez(f"tests/reference/virial_step/{name}.npz", **arrays)
        meta = {
            "generator": "scripts/make-reference/virial_step.py",
            "deepmd_kit": deepmd.__version__,
            "backend": "tensorflow " + tf.__version__ + ", float64, CPU",
            "system": case["system"],
            "frames": case["frames"],
            "type_map": case["type_map"],
            "descriptor": {
                "sel": case["sel"], "rcut": case["rcut"], "rcut_smth": 0.5,
                "neuron": [4, 8, 16], "axis_neuron": 4, "type_one_side": False, "resnet_dt": False,
            },
            "fitting": {"neuron": [16, 16, 16], "resnet_dt": True},
            "loss": LOSS,
            "start_lr": START_LR,
            "lr": LR,
            "loss_value": float(loss),
            "loss_value_at_start_lr": float(res[START_LR][0]),
            "loss_virial_only": LOSS_V,
            "loss_value_virial_only": float(loss_v),
            "energy": energy.reshape(-1).tolist(),
            "virial": virial.reshape(-1).tolist(),
        }
        with open(f"tests/reference/virial_step/{name}.json", "w") as fh:
            json.dump(meta, fh, indent=1)
            fh.write("\n")
        print(f"{name}: loss {loss!r}, {len(params)} tensors")


def get_model_from(ser):
    from deepmd.dpmodel.model.model import BaseModel

    return BaseModel.deserialize(ser)


if __name__ == "__main__":
    main()

"""torch's own numbers for Adam's and AdamW's weight decay, as DeePMD-kit's PT backend steps
them (`optimizer.type` "Adam" / "AdamW", `weight_decay`; deepmd/pt/train/training.py builds
torch.optim.Adam / torch.optim.AdamW with betas, weight_decay and the scheduled lr, not fused on
the CPU).

Run with the DeePMD-kit 3.2.0 virtual environment's python (any torch ≥ 2.0 gives the same) from
the repository root: `python scripts/make-reference/weight_decay.py`. Writes
tests/reference/optimizer/weight_decay.json: per optimizer and precision, the starting
parameters, three steps' gradients and learning rates, and the parameters after each step.
Seeded: rerunning gives the same numbers.
"""

import json

import numpy as np
import torch

OUT = "tests/reference/optimizer/weight_decay.json"
N = 37
LRS = [1e-3, 8e-4, 6.4e-4]  # an exponential decay, set per step as DeePMD-kit's scheduler does


def run(cls, wd, dtype, p0, grads):
    p = torch.nn.Parameter(torch.tensor(p0, dtype=dtype))
    opt = cls([p], lr=LRS[0], betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, foreach=False)
    after = []
    for lr, g in zip(LRS, grads):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = torch.tensor(g, dtype=dtype)
        opt.step()
        after.append(p.detach().double().tolist())
    return after


def main():
    rng = np.random.default_rng(20261204)
    p0 = rng.normal(0.0, 1.0, N)
    grads = [rng.normal(0.0, 0.5, N) * 10.0 ** rng.uniform(-6, 0, N) for _ in LRS]
    cases = {}
    for name, cls, wd in [("AdamW", torch.optim.AdamW, 0.05), ("Adam", torch.optim.Adam, 0.05)]:
        for prec, dtype in [("float64", torch.float64), ("float32", torch.float32)]:
            q0 = torch.tensor(p0, dtype=dtype).double().tolist()
            gs = [torch.tensor(g, dtype=dtype).double().tolist() for g in grads]
            cases[f"{name}_{prec}"] = {
                "type": name, "weight_decay": wd, "precision": prec,
                "params": q0, "grads": gs, "params_after": run(cls, wd, dtype, q0, gs),
            }
    meta = {
        "generator": "scripts/make-reference/weight_decay.py",
        "torch": torch.__version__,
        "betas": [0.9, 0.999], "eps": 1e-8, "lr_per_step": LRS,
        "note": "torch.optim.<type>(weight_decay=λ, foreach=False): AdamW multiplies p by "
                "1 − lr·λ before the update, Adam adds λp to the gradient",
        "cases": cases,
    }
    with open(OUT, "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()

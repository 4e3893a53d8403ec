"""DeePMD-kit 3.2.0 reads dpw's out.json and trains the same model from it (issue 57, item 2).

Run with the DeePMD-kit 3.2.0 virtual environment from the repository root, after
`cargo build --release`:
`python scripts/make-reference/dp_reads_out_json.py [target/release/dpw]`.

For every DeePMD-kit example input dpw trains (tests/data/deepmd-kit/examples.tsv, `loads`), set
up as tests/deepmd_examples.rs sets it up (its `../data` from this repository, one step), it
1. runs `dpw train` on it, which writes out.json;
2. passes out.json through DeePMD-kit's `normalize` (its strict argcheck: what `dp train` does
   first), which must accept it unchanged but for DeePMD-kit's own spellings;
3. runs `dp --pt train out.json` for one step and compares the model DeePMD-kit built with dpw's:
   the parameter count DeePMD-kit logs ("Model Params: 1.027 M", to a thousand) against the count
   dpw logs.
It prints one line per example and exits non-zero if any fails. Nothing is written to the
repository; the runs happen in a temporary folder.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from deepmd.utils.argcheck import normalize

ROOT = Path(__file__).resolve().parents[2]
DPW = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "target/release/dpw").resolve()
EXAMPLES = ROOT / "tests/data/deepmd-kit/examples"


def link_data(tree):
    def link(src, dst):
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(src)

    for k in range(4):
        link(ROOT / f"examples/water/data_{k}", tree / f"water/data/data_{k}")
    link(ROOT / "tests/data/nopbc", tree / "nopbc/data")
    lmdb = EXAMPLES / "lmdb_downsample_data/water_validation.lmdb"
    for name in ["water_training.lmdb", "water_validation.lmdb"]:
        link(lmdb, tree / "lmdb_downsample_data" / name)


def one_step(example):
    d = json.loads((EXAMPLES / example).read_text())
    t = d["training"]
    if "num_epoch" in t:
        t["num_epoch"] = 0.001
    else:
        t["numb_steps"] = 1
    t["disp_freq"] = 1
    t["save_freq"] = 1
    return d


def dpw_parameters(log):
    m = re.search(r"; (\d+) parameters", log)
    return int(m.group(1)) if m else None


def dp_parameters(log):
    # DeePMD-kit 3.2.0 logs "Model Params:  1.027 M   (Trainable: 1.027 M)".
    m = re.search(r"Model Params:\s+([\d.]+) M", log)
    return float(m.group(1)) if m else None


def main():
    tsv = (ROOT / "tests/data/deepmd-kit/examples.tsv").read_text().splitlines()
    examples = [line.split("\t")[0] for line in tsv if line.split("\t")[1] == "loads"]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        link_data(tree)
        for example in examples:
            run = (tree / example).parent
            run.mkdir(parents=True, exist_ok=True)
            name = Path(example).name
            (run / name).write_text(json.dumps(one_step(example), indent=2))
            p = subprocess.run(
                [str(DPW), "train", name, "--backend", "cpu"],
                cwd=run, capture_output=True, text=True,
            )
            if p.returncode != 0:
                print(f"{example}: dpw train failed\n{p.stderr}")
                failed += 1
                continue
            ours = dpw_parameters(p.stderr)
            out = json.loads((run / "out.json").read_text())
            try:
                normalize(out, multi_task="model_dict" in out["model"])
            except Exception as e:  # noqa: BLE001 - the message is the result
                print(f"{example}: DeePMD-kit's normalize refuses dpw's out.json: {e}")
                failed += 1
                continue
            # In the input's folder: out.json names the systems as the input did.
            (run / "dpw_out.json").write_text(json.dumps(out, indent=2))
            q = subprocess.run(
                ["dp", "--pt", "train", "dpw_out.json", "--skip-neighbor-stat"],
                cwd=run, capture_output=True, text=True,
            )
            theirs = dp_parameters(q.stdout + q.stderr)
            if q.returncode != 0:
                print(f"{example}: dp train out.json failed\n{q.stderr[-2000:]}")
                failed += 1
            elif theirs is None or ours is None or round(ours / 1e6, 3) != theirs:
                print(f"{example}: dpw's model has {ours} parameters, DeePMD-kit's {theirs} M")
                failed += 1
            else:
                print(f"{example}: normalize accepts it; dp trains a model of {theirs} M parameters, as dpw's {ours}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

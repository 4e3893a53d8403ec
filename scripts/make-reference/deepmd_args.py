"""DeePMD-kit 3.2.0's input schema, as dpw reads it (issue 57).

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`)
from the repository root: `python scripts/make-reference/deepmd_args.py`. Writes

- src/config/deepmd-kit-args.json: the schema `dp doc-train-input --out-type json` prints (the
  arguments of `deepmd.utils.argcheck`), compacted: each argument keeps its name, aliases,
  types, whether it is optional, its default (as a one-element list, so that a default of null
  is told from no default), whether it repeats, the first sentence of its doc (dpw names a
  feature by it) and its sub-fields and variants. A subtree equal to one met before (the
  descriptors inside `hybrid`, the models inside `linear_ener` and `pairwise_dprc`) is written
  as {"same_as": "<path of the first one>"}. dpw embeds this file: every key DeePMD-kit knows
  is accepted at its default, refused naming the feature otherwise, and written to out.json.
- tests/data/deepmd-kit/out-<example>.json: DeePMD-kit's `normalize` (what `dp train` writes to
  out.json) of dpw's shipped examples, which tests/config_input.rs compares with dpw's out.json.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

from deepmd.utils.argcheck import normalize

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["water", "alloy"]


def first_sentence(doc: str) -> str:
    doc = re.sub(r"\s+", " ", doc or "").strip()
    doc = re.sub(r"^\(Supported Backend:[^)]*\)\s*", "", doc)
    return re.split(r"(?<=[.:])\s", doc, maxsplit=1)[0][:200]


class Compactor:
    """Two passes: the first (`canonical` None) finds, for every large subtree, the shortest path
    it appears at; the second writes the other appearances as references to that one. Each call
    returns the subtree in full (to compare) and as written."""

    def __init__(self, canonical=None):
        self.canonical = canonical
        self.paths = {}

    def shared(self, full: dict, written: dict, path: str):
        key = json.dumps(full, sort_keys=True)
        if len(key) <= 2000:
            return full, written
        if self.canonical is None:
            best = self.paths.get(key)
            if best is None or len(path) < len(best):
                self.paths[key] = path
            return full, written
        first = self.canonical[key]
        return full, (written if first == path else {"same_as": first})

    def argument(self, a: dict, path: str, tag=None):
        head = {} if tag is None else {"tag": tag}
        head["name"] = a["name"]
        if a["alias"]:
            head["alias"] = a["alias"]
        head["type"] = a["type"]
        if a["optional"]:
            head["optional"] = True
        if "default" in a:
            head["default"] = [a["default"]]
        if a.get("repeat"):
            head["repeat"] = True
        doc = first_sentence(a.get("doc", ""))
        if doc:
            head["doc"] = doc
        full, written = dict(head), dict(head)
        if a["sub_fields"]:
            pairs = [self.argument(f, f"{path}.{f['name']}") for f in a["sub_fields"].values()]
            full["fields"] = [p[0] for p in pairs]
            written["fields"] = [p[1] for p in pairs]
        if a["sub_variants"]:
            pairs = [self.variant(v, path) for v in a["sub_variants"].values()]
            full["variants"] = [p[0] for p in pairs]
            written["variants"] = [p[1] for p in pairs]
        return self.shared(full, written, path)

    def variant(self, v: dict, path: str):
        head = {
            "flag": v["flag_name"],
            "optional": v["optional"],
            "default_tag": v["default_tag"],
            "alias": v["choice_alias"],
        }
        pairs = [
            self.argument(c, f"{path}[{tag}]", tag) for tag, c in v["choice_dict"].items()
        ]
        return (
            {**head, "choices": [p[0] for p in pairs]},
            {**head, "choices": [p[1] for p in pairs]},
        )


def main():
    printed = subprocess.run(
        [str(Path(sys.executable).parent / "dp"), "doc-train-input", "--out-type", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    schema = json.loads(printed)
    finder = Compactor()
    for a in schema:
        finder.argument(a, a["name"])
    compactor = Compactor(finder.paths)
    args = [compactor.argument(a, a["name"])[1] for a in schema]
    out = ROOT / "src/config/deepmd-kit-args.json"
    out.write_text(json.dumps(args, separators=(",", ":")) + "\n")
    print(f"{out}: {out.stat().st_size} bytes")

    data = ROOT / "tests/data/deepmd-kit"
    data.mkdir(parents=True, exist_ok=True)
    for name in EXAMPLES:
        given = json.loads((ROOT / f"examples/{name}/input.json").read_text())
        (data / f"out-{name}.json").write_text(json.dumps(normalize(given), indent=1) + "\n")


if __name__ == "__main__":
    main()

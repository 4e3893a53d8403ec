"""LMDB training data with the labels of dpw's other fittings, for tests/data_lmdb.rs.

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`,
which brings `lmdb` and `msgpack`) from the repository root:
`python scripts/make-reference/lmdb_labels.py`. No random numbers: rerunning writes the same
frames (LMDB's page layout may differ byte for byte).

DeePMD-kit 3.2.0 has no writer of LMDB frames from npy data (its `merge_lmdb` only copies LMDB
records), so the frames are written as scripts/make-reference/lmdb_data.py writes them, in the
layout its reader expects (deepmd/dpmodel/utils/lmdb_data.py): one msgpack map per frame under
`format(i, "012d")`, each array as `{type, shape, data}` (the source files' dtype, float32), and
`__metadata__` with `nframes`, `frame_idx_fmt`, `frame_nlocs` and `type_map`. A label is a field
of its npy name (`decode_lmdb_frame` passes any field on under its name, `_canonical_lmdb_key`
renaming `atomic_*` to `atom_*`). Writes:
- tests/data/lmdb/dos_si32.lmdb: the 2 frames of tests/data/deepmd-kit/examples/dos/data/heat-221
  (32 Si, periodic): `coords`, `cells`, `dos` `[250]` and the atomic DOS as `atomic_dos`
  `[32, 250]` (the spelling DeePMD-kit renames to `atom_dos`);
- tests/data/lmdb/fparam_be54.lmdb: the 4 frames of
  tests/data/deepmd-kit/examples/fparam/data/e3000_i2000 (54 Be, periodic): `coords`, `cells`,
  `energies`, `forces`, `fparam` `[1]` and `aparam` `[54, 1]` (its aparam.npy is one row of
  every frame's values; here each frame holds its own).

Then it reads each file back with DeePMD-kit 3.2.0's own reader (`LmdbDataReader`, given the
data requirements its dos loss and fparam/aparam fitting register) and checks that every frame's
labels equal the source's, with `find_*` 1, so the files are ones DeePMD-kit reads as meant.
"""

from pathlib import Path
import shutil

import lmdb
import msgpack
import numpy as np

from deepmd.dpmodel.utils.lmdb_data import LmdbDataReader
from deepmd.utils.data import DataRequirementItem

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "tests/data/deepmd-kit/examples"


def encode(a):
    a = np.ascontiguousarray(a)
    return {"type": str(a.dtype), "shape": list(a.shape), "data": a.tobytes()}


def write(out, type_map, frames):
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = lmdb.open(str(out), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for k, f in enumerate(frames):
            record = {name: encode(v) for name, v in f.items()}
            txn.put(format(k, "012d").encode(), msgpack.packb(record))
        meta = {
            "nframes": len(frames),
            "frame_idx_fmt": "012d",
            "frame_nlocs": [len(f["atom_types"]) for f in frames],
            "type_map": type_map,
        }
        txn.put(b"__metadata__", msgpack.packb(meta))
    env.close()
    (out / "lock.mdb").unlink(missing_ok=True)


def check(out, type_map, frames, requirements, renamed):
    reader = LmdbDataReader(str(out), type_map, batch_size=1)
    reader.add_data_requirement(requirements)
    assert len(reader) == len(frames)
    for k, f in enumerate(frames):
        got = reader[k]
        for field, want in f.items():
            key = renamed.get(field, field)
            assert np.array_equal(np.asarray(got[key]).reshape(-1), want.reshape(-1)), key
            if key not in ("coord", "box", "atype"):
                assert got[f"find_{key}"] == 1.0, key
    print(f"wrote {out}: {len(frames)} frames; DeePMD-kit's LmdbDataReader reads them back equal")


def main():
    dos = EXAMPLES / "dos/data/heat-221"
    s = {k: np.load(dos / f"set.000/{k}.npy") for k in ("coord", "box", "dos", "atom_dos")}
    types = np.loadtxt(dos / "type.raw", dtype=np.int32, ndmin=1)
    n = len(types)
    frames = [
        {
            "atom_types": types,
            "coords": s["coord"][i].reshape(n, 3),
            "cells": s["box"][i].reshape(3, 3),
            "dos": s["dos"][i],
            "atomic_dos": s["atom_dos"][i].reshape(n, -1),
        }
        for i in range(len(s["coord"]))
    ]
    out = ROOT / "tests/data/lmdb/dos_si32.lmdb"
    write(out, ["Si"], frames)
    requirements = [
        DataRequirementItem("dos", ndof=250, atomic=False, must=False, high_prec=False),
        DataRequirementItem("atom_dos", ndof=250, atomic=True, must=False, high_prec=False),
    ]
    renamed = {"atom_types": "atype", "coords": "coord", "cells": "box", "atomic_dos": "atom_dos"}
    check(out, ["Si"], frames, requirements, renamed)

    fp = EXAMPLES / "fparam/data/e3000_i2000"
    s = {k: np.load(fp / f"set.000/{k}.npy") for k in ("coord", "box", "energy", "force", "fparam")}
    nf = len(s["coord"])
    aparam = np.load(fp / "set.000/aparam.npy").reshape(nf, -1)
    types = np.loadtxt(fp / "type.raw", dtype=np.int32, ndmin=1)
    n = len(types)
    frames = [
        {
            "atom_types": types,
            "coords": s["coord"][i].reshape(n, 3),
            "cells": s["box"][i].reshape(3, 3),
            "energies": s["energy"][i].reshape(()),
            "forces": s["force"][i].reshape(n, 3),
            "fparam": s["fparam"][i].reshape(1),
            "aparam": aparam[i].reshape(n, 1),
        }
        for i in range(nf)
    ]
    out = ROOT / "tests/data/lmdb/fparam_be54.lmdb"
    write(out, ["Be"], frames)
    requirements = [
        DataRequirementItem("fparam", ndof=1, atomic=False, must=True, high_prec=False),
        DataRequirementItem("aparam", ndof=1, atomic=True, must=True, high_prec=False),
    ]
    renamed = {
        "atom_types": "atype",
        "coords": "coord",
        "cells": "box",
        "energies": "energy",
        "forces": "force",
    }
    check(out, ["Be"], frames, requirements, renamed)


if __name__ == "__main__":
    main()

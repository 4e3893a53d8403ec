"""LMDB training data in DeePMD-kit's format, for tests/data_lmdb.rs.

Run with the DeePMD-kit 3.2.0 virtual environment (`pip install "deepmd-kit[cpu,torch]==3.2.0"`,
which brings `lmdb` and `msgpack`) from the repository root:
`python scripts/make-reference/lmdb_data.py`. No random numbers: rerunning writes the same
frames (LMDB's page layout may differ byte for byte).

Writes tests/data/lmdb/water_c4h3o1.lmdb, 19 frames of two systems, laid out as DeePMD-kit's own
example (`examples/lmdb_downsample_data/water_training.lmdb`): one msgpack map per frame under
the key `format(i, "012d")` with `atom_types` (int32), `coords`, `cells` (periodic frames only),
`energies`, `forces` (the source files' dtype, float32) and `atom_numbs`, each array as
`{type, shape, data}`; and `__metadata__` with `nframes`, `frame_idx_fmt`, `frame_nlocs`,
`type_map` and `frame_system_ids` (what DeePMD-kit's `merge_lmdb` writes for data of several
systems). The frames:
- system 0: frames 0-3 of examples/water/data_3 (192 atoms, O and H, periodic);
- system 1: the 15 frames of tests/data/nopbc/C4H3O1 (8 atoms, C H O, no cell), interleaved with
  system 0's (frames 0, 2, 4, 6 of the file are water), so grouping, not file order, makes the
  systems.
The atom types index the file's type_map ["O", "H", "C"], so the C4H3O1 frames' types are
renumbered from that system's own type_map.raw (C H O).

Then it reads the file back with DeePMD-kit 3.2.0's own reader (`LmdbDataReader`) and checks
that every frame equals its source frame, so the file is one DeePMD-kit reads as meant.
"""

from pathlib import Path
import shutil

import lmdb
import msgpack
import numpy as np

from deepmd.dpmodel.utils.lmdb_data import LmdbDataReader

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/lmdb/water_c4h3o1.lmdb"
TYPE_MAP = ["O", "H", "C"]


def system(path, frames):
    names = (path / "type_map.raw").read_text().split()
    types = np.loadtxt(path / "type.raw", dtype=np.int64, ndmin=1)
    types = np.array([TYPE_MAP.index(names[t]) for t in types], dtype=np.int32)
    s = path / "set.000"
    arrays = {
        k: np.load(s / f"{k}.npy")[frames]
        for k in ("coord", "box", "energy", "force")
        if (s / f"{k}.npy").exists()
    }
    return types, arrays


def encode(a):
    a = np.ascontiguousarray(a)
    return {"type": str(a.dtype), "shape": list(a.shape), "data": a.tobytes()}


def frame(types, arrays, i):
    n = len(types)
    out = {
        "atom_types": encode(types),
        "coords": encode(arrays["coord"][i].reshape(n, 3)),
        "energies": encode(arrays["energy"][i].reshape(())),
        "forces": encode(arrays["force"][i].reshape(n, 3)),
        "atom_numbs": [int((types == t).sum()) for t in range(len(TYPE_MAP))],
    }
    if "box" in arrays:
        out["cells"] = encode(arrays["box"][i].reshape(3, 3))
    return out


def main():
    water = system(ROOT / "examples/water/data_3", slice(0, 4))
    mol = system(ROOT / "tests/data/nopbc/C4H3O1", slice(0, 15))
    order = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3)] + [
        (1, i) for i in range(3, 15)
    ]
    systems = [water, mol]
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    env = lmdb.open(str(OUT), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for k, (sid, i) in enumerate(order):
            types, arrays = systems[sid]
            txn.put(format(k, "012d").encode(), msgpack.packb(frame(types, arrays, i)))
        meta = {
            "nframes": len(order),
            "frame_idx_fmt": "012d",
            "frame_nlocs": [len(systems[sid][0]) for sid, _ in order],
            "type_map": TYPE_MAP,
            "frame_system_ids": [sid for sid, _ in order],
        }
        txn.put(b"__metadata__", msgpack.packb(meta))
    env.close()
    (OUT / "lock.mdb").unlink(missing_ok=True)

    reader = LmdbDataReader(str(OUT), TYPE_MAP, batch_size=1)
    assert len(reader) == len(order)
    for k, (sid, i) in enumerate(order):
        types, arrays = systems[sid]
        got = reader[k]
        assert np.array_equal(got["atype"], types)
        assert np.array_equal(got["coord"].reshape(-1), arrays["coord"][i].reshape(-1))
        assert np.array_equal(got["force"].reshape(-1), arrays["force"][i].reshape(-1))
        assert got["energy"].reshape(()) == arrays["energy"][i]
        if "box" in arrays:
            assert np.array_equal(got["box"].reshape(-1), arrays["box"][i].reshape(-1))
        else:
            assert "box" not in got or got["box"] is None
    print(f"wrote {OUT}: {len(order)} frames; DeePMD-kit's LmdbDataReader reads them back equal")


if __name__ == "__main__":
    main()

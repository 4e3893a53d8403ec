"""Generates the alloy example: Cu/Ni/Al fcc solid solutions, 108 atoms (3x3x3 conventional
cells), energies, forces and virials from ASE's EMT potential, written as deepmd/npy systems.

Run with ASE 3.29.0 (`pip install ase==3.29.0`): `python -W ignore generate.py` in this folder. The
output is deterministic for a given ASE/numpy version (seeded random numbers).
Each frame: a random symmetric strain (up to 2%) of the Vegard's-law cell, atoms scaled with
it, then 20 Langevin MD steps (2 fs) at the system's temperature, and the frame is recorded.
The virial is W = -V * stress (DeePMD-kit's convention, W = -dE/d(strain)); the script checks
it against a finite difference of the energy under strain on the first frame of each system,
and every written frame's labels against a fresh EMT evaluation of its written coordinates.
"""

import os

import numpy as np
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

TYPE_MAP = ["Cu", "Ni", "Al"]
LATTICE = {"Cu": 3.61, "Ni": 3.52, "Al": 4.05}  # EMT's fcc lattice constants, Å

# name, (nCu, nNi, nAl), temperature K, frames, seed
SYSTEMS = [
    ("train/Cu65Ni32Al11_a", (65, 32, 11), 500, 30, 1),
    ("train/Cu65Ni32Al11_b", (65, 32, 11), 900, 30, 2),
    ("train/Cu36Ni36Al36", (36, 36, 36), 700, 30, 3),
    ("train/Cu27Ni54Al27", (27, 54, 27), 700, 30, 4),
    ("valid/Cu65Ni32Al11", (65, 32, 11), 700, 15, 5),
    ("valid/Cu48Ni30Al30", (48, 30, 30), 700, 15, 6),
]


def make_cell(counts, rng):
    n = sum(counts)
    a = sum(c * LATTICE[e] for c, e in zip(counts, TYPE_MAP)) / n
    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat((3, 3, 3))
    assert len(atoms) == n
    types = np.repeat(np.arange(3), counts)
    rng.shuffle(types)
    order = np.argsort(types, kind="stable")  # atoms sorted by type, as DeePMD-kit stores them
    atoms = atoms[order]
    atoms.set_chemical_symbols([TYPE_MAP[t] for t in types[order]])
    return atoms, types[order]


def strain_energy(atoms, eps):
    a = atoms.copy()
    a.calc = EMT()
    a.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
    return a.get_potential_energy()


def check_virial(atoms, virial, h=1e-6):
    for i in range(3):
        for j in range(i, 3):
            e = np.zeros((3, 3))
            e[i, j] = e[j, i] = h
            fd = -(strain_energy(atoms, e) - strain_energy(atoms, -e)) / (2 * h)
            fd = fd if i == j else fd / 2
            # EMT's energy has tiny steps where a pair crosses its hard cut-off, hence the loose bound
            assert abs(fd - virial[i, j]) < 1e-4 * max(1.0, abs(fd)), (i, j, fd, virial[i, j])


def generate(name, counts, temp, nframes, seed):
    rng = np.random.default_rng(seed)
    atoms, types = make_cell(counts, rng)
    cell0 = atoms.cell.array.copy()
    atoms.calc = EMT()
    MaxwellBoltzmannDistribution(atoms, temperature_K=temp, rng=rng)
    md = Langevin(atoms, 2 * units.fs, temperature_K=temp, friction=0.01 / units.fs, rng=rng)
    md.run(200)
    rec = {k: [] for k in ["coord", "box", "energy", "force", "virial"]}
    for f in range(nframes):
        eps = rng.uniform(-0.02, 0.02, (3, 3))
        atoms.set_cell(cell0 @ (np.eye(3) + (eps + eps.T) / 2), scale_atoms=True)
        md.run(20)
        virial = -atoms.get_volume() * atoms.get_stress(voigt=False)
        if f == 0:
            check_virial(atoms, virial)
        rec["coord"].append(atoms.get_positions().reshape(-1))  # a copy: MD moves atoms in place
        rec["box"].append(atoms.cell.array.copy().reshape(-1))
        rec["energy"].append(atoms.get_potential_energy())
        rec["force"].append(atoms.get_forces().reshape(-1))
        rec["virial"].append(virial.reshape(-1))
    out = os.path.join("data", name, "set.000")
    os.makedirs(out, exist_ok=True)
    for k, v in rec.items():
        # coordinates and forces in float32 (the bulk of the bytes), the rest in float64
        dt = np.float32 if k in ("coord", "force") else np.float64
        np.save(os.path.join(out, f"{k}.npy"), np.array(v, dtype=dt))
    root = os.path.join("data", name)
    np.savetxt(os.path.join(root, "type.raw"), types, fmt="%d")
    with open(os.path.join(root, "type_map.raw"), "w") as fh:
        fh.write("\n".join(TYPE_MAP) + "\n")
    verify(root)
    e = np.array(rec["energy"])
    print(f"{name}: {nframes} frames, E/atom {e.mean() / 108:.4f} ± {e.std() / 108:.4f} eV")


def verify(root):
    """The labels as written belong to the coordinates as written (float32 rounding aside)."""
    types = np.loadtxt(os.path.join(root, "type.raw"), dtype=int)
    s = {k: np.load(os.path.join(root, "set.000", f"{k}.npy")) for k in ["coord", "box", "energy", "force", "virial"]}
    for f in range(len(s["energy"])):
        a = Atoms([TYPE_MAP[t] for t in types], s["coord"][f].reshape(-1, 3), cell=s["box"][f].reshape(3, 3), pbc=True)
        a.calc = EMT()
        assert abs(a.get_potential_energy() - s["energy"][f]) < 1e-4
        assert np.abs(a.get_forces().reshape(-1) - s["force"][f]).max() < 1e-4
        assert np.abs(-a.get_volume() * a.get_stress(voigt=False).reshape(-1) - s["virial"][f]).max() < 1e-3


if __name__ == "__main__":
    for s in SYSTEMS:
        generate(*s)

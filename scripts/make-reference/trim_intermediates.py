"""Keeps of DeePMD-kit's `intermediates_frame0.npz` (3.3 MB) the three arrays the tests read.

Run from the repository root with DeePMD-kit's full reference folder as the argument:
`python3 scripts/make-reference/trim_intermediates.py PATH/deepmd-3.2.0/model_A/intermediates_frame0.npz`.
Writes tests/reference/deepmd-3.2.0/model_A/intermediates_frame0.npz. The members are copied as
they are (an npz is a zip of .npy files), only compressed, so no numpy is needed.
"""

import sys
import zipfile

# nlist_local_index: tests/geometry.rs; env_mat_normalized and descriptor: tests/suite/reference.rs.
KEEP = ["nlist_local_index.npy", "env_mat_normalized.npy", "descriptor.npy"]
OUT = "tests/reference/deepmd-3.2.0/model_A/intermediates_frame0.npz"

with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(OUT, "w", zipfile.ZIP_DEFLATED) as dst:
    for name in KEEP:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        dst.writestr(info, src.read(name))

//! DeePMD-kit's mixed-type systems (dpdata's `deepmd/npy/mixed`): one system holds frames of
//! different compositions with one atom count. Every set has `real_atom_types.npy`
//! `[nframes, natoms]`, each frame's atom types as indices into the system's `type_map.raw`
//! (or, without one, into the model's type_map), and `type.raw` holds one placeholder type for
//! every atom (dpdata writes 0s). DeePMD-kit's `DeepmdData` reads them (its `mixed_type`,
//! docs/deepmd-spec.md §1); what it does that dpw does not repeat is refused by name:
//!
//! - a system whose sets are partly mixed (DeePMD-kit asserts against it);
//! - a `type.raw` with more than one type: DeePMD-kit would sort the coordinates by it but not
//!   the frames' types, pairing types with the wrong atoms;
//! - virtual atoms (type −1, dpdata's padding to a common atom count), which DeePMD-kit
//!   masks out of the model and the loss; dpw has no such mask;
//! - any other index out of range, which DeePMD-kit maps silently (an index one past its
//!   type_map.raw becomes −1, and a negative one wraps around).

use super::error::DataError;
use super::source::Source;
use super::types::TypeIndex;

/// The file of a set that makes it mixed-type.
const REAL_TYPES: &str = "real_atom_types.npy";

/// Whether the system's sets are mixed-type: all of them, or none.
pub(super) fn is_mixed(src: &dyn Source, sets: &[String]) -> Result<bool, DataError> {
    let has = |set: &String| src.has_file(&format!("{set}/{REAL_TYPES}"));
    let mixed = sets.first().is_some_and(has);
    if let Some(other) = sets.iter().find(|s| has(s) != mixed) {
        let (with, without) = if mixed {
            (&sets[0], other)
        } else {
            (other, &sets[0])
        };
        return Err(DataError::Invalid {
            path: src.path(without),
            reason: format!(
                "has no {REAL_TYPES} but {} has: the sets of a mixed-type system must all have it",
                src.path(with).display()
            ),
        });
    }
    Ok(mixed)
}

/// The placeholder types of a mixed-type system's `type.raw` (as read), checked to be one type.
pub(super) fn check_placeholder(src: &dyn Source, raw: &[usize]) -> Result<(), DataError> {
    match raw.iter().position(|&t| t != raw[0]) {
        None => Ok(()),
        Some(atom) => Err(DataError::Invalid {
            path: src.path("type.raw"),
            reason: format!(
                "atom {atom} has type {} but atom 0 has {}: in a mixed-type system (sets with \
                 {REAL_TYPES}) type.raw must give every atom one type (dpdata writes 0s); \
                 DeePMD-kit would sort the coordinates by it but not the types of \
                 {REAL_TYPES}",
                raw[atom], raw[0]
            ),
        }),
    }
}

/// The model type of every atom of every frame of `set` (`nframes` frames, by coord.npy),
/// `[nframes][natoms]` in file order.
pub(super) fn set_types(
    src: &dyn Source,
    set: &str,
    natoms: usize,
    nframes: usize,
    index: &TypeIndex,
) -> Result<Vec<usize>, DataError> {
    let rel = format!("{set}/{REAL_TYPES}");
    let path = src.path(&rel);
    let (shape, values) = src.array(&rel)?;
    if shape != [nframes, natoms] {
        return Err(DataError::Shape {
            path,
            expected: format!(
                "[{nframes}, {natoms}] (the frames of coord.npy, the atoms of type.raw)"
            ),
            found: shape,
        });
    }
    (values.iter().enumerate())
        .map(|(k, &v)| {
            let (frame, atom) = (k / natoms, k % natoms);
            let at = || format!("frame {frame}, atom {atom}");
            if v == -1.0 {
                return Err(DataError::Invalid {
                    path: path.clone(),
                    reason: format!(
                        "{} is a virtual atom (type -1, dpdata's padding to a common atom count): \
                         not supported (DeePMD-kit masks them out of the model and the loss); \
                         write the system without atom_numb_pad",
                        at()
                    ),
                });
            }
            if v < 0.0 || v.fract() != 0.0 || v >= usize::MAX as f64 {
                return Err(DataError::Invalid {
                    path: path.clone(),
                    reason: format!("{} has type {v}, not a non-negative integer", at()),
                });
            }
            index.model_type(v as usize, &path, at)
        })
        .collect()
}

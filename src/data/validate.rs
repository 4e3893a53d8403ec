//! Checks on a system's frames that catch what would otherwise surface much later, or as an
//! abort: frames no model can learn from (a singular or collapsed cell, overlapping atoms, or a
//! cell needing too many periodic images for the cut-off). Each error names the system, the
//! frame and the atoms. (An npy file's size against its header is checked as it is read,
//! `npy::check_npy_size`.)

use super::error::DataError;
use super::system::System;
use crate::geometry::{wrapped, Cell, ImageGrid};

/// Atoms closer than this (Å) overlap: DeePMD-kit warns about such data, and the loss of a
/// frame holding them is NaN or huge.
pub const MIN_DIST: f64 = 0.1;

/// Every frame of `sys`: a cell with a volume and at least [`MIN_DIST`] thick, and no two atoms
/// (periodic images included) closer than [`MIN_DIST`]. Values are known finite already.
pub fn check_frames(sys: &System) -> Result<(), DataError> {
    for f in 0..sys.nframes {
        // Atoms are named by their row in type.raw (in the frame), as the user knows them.
        let row = |i: usize| sys.frame_orig_index(f)[i];
        let bad = |reason: String| DataError::Invalid {
            path: sys.path.clone(),
            reason: format!("frame {f}: {reason}"),
        };
        let cell = match sys.frame_cell(f) {
            None => None,
            Some(rows) => {
                let c = Cell::new(rows).ok_or_else(|| {
                    bad(format!(
                        "the cell (box.npy) {rows:?} is singular: its volume is zero"
                    ))
                })?;
                let d = c.face_distances();
                if let Some(k) = (0..3).find(|&k| d[k] < MIN_DIST) {
                    return Err(bad(format!(
                        "the cell (box.npy) is only {:.3e} Å thick along lattice vector {} \
                         (at least {MIN_DIST} Å is needed); is box.npy in Å?",
                        d[k],
                        ["a", "b", "c"][k]
                    )));
                }
                Some(c)
            }
        };
        if let Some((i, j, d)) = close_pair(sys.frame_coord(f), cell.as_ref()) {
            return Err(bad(format!(
                "atoms {} and {} (rows of type.raw) are {d:.4} Å apart, closer than {MIN_DIST} Å: \
                 overlapping atoms",
                row(i).min(row(j)),
                row(i).max(row(j))
            )));
        }
    }
    Ok(())
}

/// A pair of atoms closer than [`MIN_DIST`] (over periodic images), the one of the lowest first
/// atom, found with the binned image search of the neighbour statistics (a cut-off of
/// [`MIN_DIST`] needs only the 26 neighbouring images, most of them outside reach).
fn close_pair(coord: &[f64], cell: Option<&Cell>) -> Option<(usize, usize, f64)> {
    let pos = wrapped(coord, cell);
    let grid = ImageGrid::new(&pos, cell, MIN_DIST);
    for i in 0..pos.len() {
        // An atom's own images are at least a cell thickness (checked ≥ MIN_DIST) away.
        let mut closest: Option<(usize, f64)> = None;
        grid.neighbours(i, MIN_DIST * MIN_DIST, |_, j, _, d2| {
            let d = d2.sqrt();
            if j > i && d < MIN_DIST && closest.is_none_or(|c| (d, j) < (c.1, c.0)) {
                closest = Some((j, d));
            }
        });
        if let Some((j, d)) = closest {
            return Some((i, j, d));
        }
    }
    None
}

/// Every frame's cell needs at most [`Cell::MAX_IMAGES`] periodic images for `rcut`.
pub fn check_images(sys: &System, rcut: f64) -> Result<(), DataError> {
    for f in 0..sys.nframes {
        if let Some(c) = sys.frame_cell(f).and_then(Cell::new) {
            c.images(rcut).map_err(|reason| DataError::Invalid {
                path: sys.path.clone(),
                reason: format!("frame {f}: {reason}"),
            })?;
        }
    }
    Ok(())
}

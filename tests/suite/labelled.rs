//! The frames of a fitting's reference npz (`scripts/make-reference/{property,dos,tensor}.py`)
//! with their frame label `{name}_label` and, where the file has it, the atomic label
//! `atom_{name}_label`; the box where the file has one.

use std::path::Path;

use dpw::train::batch::Frame;

use crate::common::*;

pub struct LabelledFrames {
    pub atype: Vec<usize>,
    coord: Vec<Vec<f64>>,
    cell: Option<Vec<Vec<f64>>>,
    label: Vec<Vec<f64>>,
    atom_label: Option<Vec<Vec<f64>>>,
    zeros: Vec<f64>,
}

impl LabelledFrames {
    pub fn read(path: &Path, name: &str) -> Self {
        let mut z = npz(path);
        let rows = |a: ndarray::ArrayD<f64>| -> Vec<Vec<f64>> {
            a.outer_iter()
                .map(|r| r.iter().copied().collect())
                .collect()
        };
        let names = z.names().unwrap();
        let has = |n: &str| names.iter().any(|x| x == n || *x == format!("{n}.npy"));
        let (has_box, atom_key) = (has("box"), format!("atom_{name}_label"));
        let has_atomic = has(&atom_key);
        let atype: Vec<usize> = npz_i64(&mut z, "atype")
            .iter()
            .map(|&t| t as usize)
            .collect();
        LabelledFrames {
            zeros: vec![0.0; 3 * atype.len()],
            atype,
            coord: rows(npz_array(&mut z, "coord")),
            cell: has_box.then(|| rows(npz_array(&mut z, "box"))),
            label: rows(npz_array(&mut z, &format!("{name}_label"))),
            atom_label: has_atomic.then(|| rows(npz_array(&mut z, &atom_key))),
        }
    }

    /// The frames, with the frame labels where `frame` and the atomic ones where `atomic`.
    pub fn all(&self, frame: bool, atomic: bool) -> Vec<Frame<'_>> {
        (0..self.coord.len())
            .map(|f| Frame {
                coord: &self.coord[f],
                cell: self.cell.as_ref().map(|c| c[f].as_slice()),
                energy: 0.0,
                force: &self.zeros,
                virial: None,
                fparam: None,
                aparam: None,
                label: frame.then(|| self.label[f].as_slice()),
                atom_label: (self.atom_label.as_ref())
                    .filter(|_| atomic)
                    .map(|a| a[f].as_slice()),
            })
            .collect()
    }
}

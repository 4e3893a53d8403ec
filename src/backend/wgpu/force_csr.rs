//! The force gather lists, made on the host when a batch's neighbour lists arrive
//! (`device.rs`) and read by the force kernel (`ops.rs`).

use crate::backend::Dims;

/// Gather lists for the forces: per batch atom, `slot + 1` for the slots it is the centre of
/// and `−(slot + 1)` for the slots it owns, in the CPU's visiting order (cpu/scatter.rs), so
/// that each atom's force is summed in the same order as there. Padded slots are left out.
pub(super) fn force_csr(d: &Dims, owner: &[i32], centre_atom: &[i32]) -> (Vec<u32>, Vec<i32>) {
    let natoms = d.nbatch_atoms();
    let mut visit = Vec::new();
    for ti in 0..d.ntypes {
        for c in d.centres(ti) {
            for tj in d.sections() {
                let first = d.slot(ti, c, tj, 0);
                for (s, &o) in owner.iter().enumerate().skip(first).take(d.sel[tj]) {
                    if o >= 0 {
                        let e = i32::try_from(s + 1).expect("too many slots");
                        visit.push((centre_atom[c] as usize, e));
                        visit.push((o as usize, -e));
                    }
                }
            }
        }
    }
    let mut ptr = vec![0u32; natoms + 1];
    for &(a, _) in &visit {
        ptr[a + 1] += 1;
    }
    for a in 0..natoms {
        ptr[a + 1] += ptr[a];
    }
    let mut fill = ptr.clone();
    let mut ent = vec![0i32; visit.len()];
    for (a, e) in visit {
        ent[fill[a] as usize] = e;
        fill[a] += 1;
    }
    (ptr, ent)
}

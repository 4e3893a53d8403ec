//! Host-side geometry against DeePMD-kit: the neighbour list of frame 0 and the statistics.
mod common;

use common::*;
use dpw::data::load_system;
use dpw::geometry::{build_nlist, energy_bias, Cell, EnvStats};

#[test]
fn neighbour_list_matches_deepmd_exactly() {
    let (dir, rf, model) = (model_a_dir(), ref_frames(), model_a());
    let mut z = npz(&dir.join("intermediates_frame0.npz"));
    let want = npz_i64(&mut z, "nlist_local_index");
    let d = &model.spec.descriptor;
    let cell = Cell::new(&rf.cell[0]).unwrap();
    let nl = build_nlist(&rf.coord[0], Some(&cell), &rf.atype, d.rcut, &d.sel);
    let nnei = d.nnei();
    let mut mismatches = 0;
    for (i, &oi) in rf.perm.iter().enumerate() {
        for j in 0..nnei {
            let o = nl.owner[i * nnei + j];
            let mine = if o < 0 {
                -1
            } else {
                rf.perm[o as usize] as i64
            };
            if mine != want[[oi, j]] {
                mismatches += 1;
            }
        }
    }
    assert_eq!(
        mismatches, 0,
        "neighbour-list slots differing from DeePMD-kit's"
    );
    assert_eq!(nl.max_count.len(), 2);
}

#[test]
fn statistics_match_deepmd() {
    let model = model_a();
    let refj: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo("tests/reference/deepmd-3.2.0/stats_reference.json"))
            .unwrap(),
    )
    .unwrap();
    let d = &model.spec.descriptor;
    let tm = model.spec.type_map.clone();
    let mut st = EnvStats::new(2);
    let (mut counts, mut energy) = (vec![], vec![]);
    for sys in ["data_0", "data_1"] {
        let s = load_system(&repo("examples/water").join(sys), &tm).unwrap();
        for f in 0..10 {
            let cell = Cell::new(s.frame_cell(f).unwrap()).unwrap();
            st.add_frame(d, s.frame_coord(f), Some(&cell), &s.atype);
            counts.push(s.type_counts(f, 2).iter().map(|&c| c as f64).collect());
            energy.push(s.energy[f]);
        }
    }
    let raw = &refj["env_stat_raw_sums"];
    for (t, (r, a)) in st.r.iter().zip(&st.a).enumerate() {
        for (key, v) in [(format!("r_{t}"), r), (format!("a_{t}"), a)] {
            let want = [
                &raw[&key]["number"],
                &raw[&key]["sum"],
                &raw[&key]["squared_sum"],
            ]
            .map(|x| x.as_f64().unwrap());
            for k in 0..3 {
                let tol = 1e-10 * want[k].abs().max(1.0);
                assert!(
                    (v[k] - want[k]).abs() < tol,
                    "{key}[{k}]: {} vs {}",
                    v[k],
                    want[k]
                );
            }
        }
    }
    let (davg, dstd) = st.davg_dstd(false);
    let rows = |k: &str| -> Vec<f64> {
        refj[k]["value"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
            .collect()
    };
    assert!(max_abs_diff(&davg, &rows("davg_row_per_type")) < 1e-13);
    assert!(max_abs_diff(&dstd, &rows("dstd_row_per_type")) < 1e-13);
    let (bias, std) = energy_bias(&counts, &energy);
    assert!(
        max_abs_diff(&bias, &rows("energy_bias_lstsq")) < 1e-9,
        "{bias:?}"
    );
    let want_std = refj["energy_std_after_lstsq"]["value"][0].as_f64().unwrap();
    assert!((std - want_std).abs() < 1e-9, "{std} vs {want_std}");
}

#[test]
fn energy_bias_full_rank_is_exact() {
    let counts = vec![vec![1.0, 2.0], vec![3.0, 1.0], vec![2.0, 2.0]];
    let energy: Vec<f64> = counts
        .iter()
        .map(|c: &Vec<f64>| -2.0 * c[0] - 0.5 * c[1])
        .collect();
    let (bias, std) = energy_bias(&counts, &energy);
    assert!(max_abs_diff(&bias, &[-2.0, -0.5]) < 1e-12);
    assert!(std < 1e-12);
}

/// se_e3's davg/dstd are se_e2_a's (4 columns, the angular davg 0): dpw's statistics on the
/// eval frames of `tests/reference/descriptors/se_e3_*` against DeePMD-kit's own
/// `compute_input_stats` on them (`deepmd_compute_input_stats_on_these_frames` in eval.json).
#[test]
fn se_e3_statistics_match_deepmd() {
    for case in ["se_e3_water", "se_e3_alloy"] {
        let dir = repo(&format!("tests/reference/descriptors/{case}"));
        let model = dpw::model::read_deepmd_yaml(&dir.join("model.yaml")).unwrap();
        let eval: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("eval.json")).unwrap()).unwrap();
        let mut z = npz(&dir.join("eval.npz"));
        let atype: Vec<usize> = npz_i64(&mut z, "atype")
            .iter()
            .map(|&t| t as usize)
            .collect();
        let (coord, cell) = (npz_array(&mut z, "coord"), npz_array(&mut z, "box"));
        let nt = model.spec.ntypes();
        let mut st = EnvStats::new(nt);
        for (c, b) in coord.outer_iter().zip(cell.outer_iter()) {
            let c: Vec<f64> = c.iter().copied().collect();
            let b: Vec<f64> = b.iter().copied().collect();
            let cell = Cell::new(&b).unwrap();
            st.add_frame(&model.spec.descriptor, &c, Some(&cell), &atype);
        }
        let (davg, dstd) = st.davg_dstd(false);
        let want = &eval["deepmd_compute_input_stats_on_these_frames"][0];
        for (name, mine) in [("davg_per_type", &davg), ("dstd_per_type", &dstd)] {
            let rows: Vec<f64> = (want[name].as_array().unwrap().iter())
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect();
            assert_eq!(rows.len(), 4 * nt);
            let err = max_abs_diff(mine, &rows);
            eprintln!("{case}: {name} max |dpw − DeePMD-kit| = {err:.1e}");
            assert!(err < 1e-12, "{case}: {name} {mine:?} vs {rows:?}");
        }
    }
}

//! Pair tables (DeePMD-kit's `PairTab`) and the two ways a model mixes one into its DP model:
//! `use_srtab` (ZBL-style: a per-atom switch between the two by the softmin distance of the
//! neighbours) and `linear_ener` (constant weights). docs/deepmd-spec.md §19.

mod build;
pub(super) mod yaml;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

pub use super::linear::Weights;

/// A tabulated pair energy E_{ti,tj}(r) as clamped cubic splines on a uniform grid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairTable {
    pub rmin: f64,
    pub rmax: f64,
    pub hh: f64,
    pub ntypes: usize,
    pub rcut: f64,
    pub nspline: usize,
    /// Only the nearest `sel` neighbours within rcut count (DeePMD-kit's `sel`, summed).
    pub sel: usize,
    /// The table's rows after the extension to rcut, `[nrows][1 + nt(nt+1)/2]`: kept to be
    /// written back, as DeePMD-kit's serialization holds them.
    pub vdata: Vec<f64>,
    /// `[rmin, hh, nspline, ntypes]`, as DeePMD-kit evaluates from.
    pub tab_info: [f64; 4],
    /// `[nt][nt][nspline][4]`: a3, a2, a1, a0 of each interval in its unit parameter.
    pub tab_data: Vec<f64>,
}

impl PairTable {
    /// E(r) and dE/dr of the pair (ti, tj) at distance r, as DeePMD-kit's PyTorch evaluates
    /// them (`_pair_tabulated_inter`): 0 from rcut or the table's end on; `Err(r)` below the
    /// table, which DeePMD-kit's PyTorch refuses too.
    pub fn pair(&self, ti: usize, tj: usize, r: f64) -> Result<(f64, f64), f64> {
        let [rmin, hh, nspline, _] = self.tab_info;
        let nspline = (nspline + 0.1) as usize;
        let hi = 1.0 / hh;
        let uu = (r - rmin) * hi;
        if uu < 0.0 {
            return Err(r);
        }
        if r >= self.rcut || r >= rmin + nspline as f64 * hh {
            return Ok((0.0, 0.0));
        }
        let idx = uu as usize;
        if idx > nspline {
            return Ok((0.0, 0.0));
        }
        let t = uu - idx as f64;
        let at = ((ti * self.ntypes + tj) * nspline + idx.min(nspline - 1)) * 4;
        let [a3, a2, a1, a0] = self.tab_data[at..at + 4] else {
            unreachable!("four coefficients")
        };
        let e = ((a3 * t + a2) * t + a1) * t + a0;
        let de = ((3.0 * a3 * t + 2.0 * a2) * t + a1) * hi;
        Ok((e, de))
    }
}

/// How the table's atomic energies mix with the DP model's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Mix {
    /// `use_srtab`: e_i = (1 − w_i)·e_DP + w_i·e_table, w_i a smooth step of the softmin
    /// distance σ_i = Σ_j r_ij e^{−r_ij/α} / Σ_j e^{−r_ij/α} from 1 below sw_rmin to 0 above
    /// sw_rmax (spec §19.4).
    Zbl {
        sw_rmin: f64,
        sw_rmax: f64,
        smin_alpha: f64,
    },
    /// `linear_ener`: e_i = w_DP·e_DP + w_table·e_table.
    Linear { weights: Weights },
}

/// A pair table mixed into the model's DP energy (docs/deepmd-spec.md §19).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShortRange {
    pub table: PairTable,
    pub mix: Mix,
    /// The table's file as the input named it, kept for `model_def_script`.
    pub tab_file: String,
}

impl ShortRange {
    /// The table against the model it is mixed into: its types, and for a ZBL mix a neighbour
    /// list the descriptor's holds (its table reads the descriptor's slots; a linear model's
    /// table has a list of its own).
    pub fn check(&self, ntypes: usize, rcut: f64, nsel: usize) -> Result<()> {
        let t = &self.table;
        if t.ntypes != ntypes {
            bail!(
                "pair table {}: {} types, the model's type_map has {ntypes}",
                self.tab_file,
                t.ntypes
            );
        }
        if let Mix::Zbl {
            sw_rmin, sw_rmax, ..
        } = self.mix
        {
            if t.rcut > rcut || t.sel > nsel {
                bail!(
                    "pair table {}: its neighbour list (rcut {}, sel {}) reaches beyond the DP \
                     model's descriptor's (rcut {rcut}, sel {nsel}), which a ZBL mix \
                     (use_srtab) reads it on",
                    self.tab_file,
                    t.rcut,
                    t.sel
                );
            }
            if sw_rmax <= sw_rmin {
                bail!("sw_rmax ({sw_rmax}) must be greater than sw_rmin ({sw_rmin})");
            }
        }
        Ok(())
    }
}

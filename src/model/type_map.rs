//! A model's type map changed as DeePMD-kit's `change_type_map` changes it (docs/deepmd-spec.md
//! §21.5), for fine-tuning to another type_map: the pretrained elements in any order, some left
//! out, new ones added. Mixed-type descriptors only, as in DeePMD-kit (se_e2_a and its
//! siblings refuse).

use anyhow::{anyhow, bail, ensure, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Uniform};

use super::{DescriptorLayout, Model, ParamLayout, Skip, TebdLayout};

/// The elements of `new` that `old` lacks, by their index in `new`.
pub fn new_elements(old: &[String], new: &[String]) -> Vec<usize> {
    (new.iter().enumerate())
        .filter(|(_, t)| !old.contains(t))
        .map(|(i, _)| i)
        .collect()
}

impl Model {
    /// The same model for `type_map`: every tensor copied by name, the type embedding's rows
    /// (and the statistics' and bias's) taken in the new order, the embedding's skip (one-hot
    /// rows when its width is the number of types or twice it) corrected so that every kept
    /// element's embedding is unchanged. A new element's embedding row is drawn uniform in
    /// [0, 1) (DeePMD-kit's `torch.rand`, here from `seed`), its davg/dstd are 0 and 1 until
    /// the caller puts the new data's in ([`new_elements`]), its bias 0.
    pub fn with_type_map(&self, type_map: &[String], seed: u64) -> Result<Model> {
        let old = &self.spec.type_map;
        if old == type_map {
            return Ok(self.clone());
        }
        let d = &self.spec.descriptor;
        if !d.is_mixed() {
            bail!(
                "descriptor {} does not support changing the type map (DeePMD-kit refuses it \
                 too): give model.type_map as the pretrained model's, {old:?}",
                d.kind.as_str()
            );
        }
        let idx: Vec<Option<usize>> = (type_map.iter())
            .map(|t| old.iter().position(|o| o == t))
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let unit = Uniform::new(0.0, 1.0).expect("0 < 1");
        let mut spec = self.spec.clone();
        spec.type_map = type_map.to_vec();
        spec.check()?;
        let (lo, ln) = (self.layout(), ParamLayout::new(&spec));
        let (to, tn) = (tebd(&lo.descriptor), tebd(&ln.descriptor));
        let mut params = vec![0.0; ln.len];
        for t in &ln.tensors {
            let o = (lo.tensors.iter())
                .find(|x| x.name == t.name)
                .ok_or_else(|| anyhow!("tensor {} has no counterpart", t.name))?;
            let out = &mut params[t.offset..t.offset + t.len()];
            match (to, tn) {
                (Some(to), Some(tn)) if t.offset == tn.w => {
                    for (i, &j) in idx.iter().enumerate() {
                        for c in 0..tn.dim {
                            let w = match j {
                                Some(j) => self.params[to.w + j * to.dim + c] + skip(to, j, c),
                                None => unit.sample(&mut rng),
                            };
                            out[i * tn.dim + c] = w - skip(tn, i, c);
                        }
                    }
                }
                _ => {
                    ensure!(
                        o.shape == t.shape,
                        "tensor {}: its shape depends on the types",
                        t.name
                    );
                    out.copy_from_slice(&self.params[o.offset..o.offset + o.len()]);
                }
            }
        }
        let (nt, blocks) = (old.len(), d.stat_blocks());
        // Each block's rows in the new order; a new element's row `fill`.
        let rows = |a: &[f64], nblocks: usize, fill: f64| -> Vec<f64> {
            if a.is_empty() {
                return vec![];
            }
            let k = a.len() / (nblocks * nt);
            let idx = &idx;
            (0..nblocks)
                .flat_map(|b| {
                    idx.iter().flat_map(move |j| match j {
                        Some(j) => a[(b * nt + j) * k..(b * nt + j + 1) * k].to_vec(),
                        None => vec![fill; k],
                    })
                })
                .collect()
        };
        let m = Model {
            params,
            davg: rows(&self.davg, blocks, 0.0),
            dstd: rows(&self.dstd, blocks, 1.0),
            bias: rows(&self.bias, 1, 0.0),
            out_std: rows(&self.out_std, 1, 1.0),
            fit_input_avg: self.fit_input_avg.clone(),
            fit_input_inv_std: self.fit_input_inv_std.clone(),
            case_embd: self.case_embd.clone(),
            spec,
        };
        m.check()?;
        Ok(m)
    }
}

/// The type embedding's layout, where the descriptor has one.
fn tebd(l: &DescriptorLayout) -> Option<&TebdLayout> {
    (l.attn.as_ref().map(|a| &a.tebd))
        .or(l.dpa2.as_ref().map(|x| &x.tebd))
        .or(l.se_e3_tebd.as_ref().map(|x| &x.tebd))
        .or(l.dpa3.as_ref().map(|x| &x.tebd))
}

/// The one-hot skip of type t's embedding in column c: 1 or 0.
fn skip(l: &TebdLayout, t: usize, c: usize) -> f64 {
    let on = match l.skip {
        Skip::None => false,
        Skip::Identity => c == t,
        Skip::Double => c % l.ntypes == t,
    };
    if on {
        1.0
    } else {
        0.0
    }
}

//! A descriptor's own keys beside those every descriptor shares (rcut, sel, neuron, ...): one
//! variant per family, so that a spec or a config holds exactly the keys of its kind and a
//! reader matches once instead of asking each optional field in turn. `D` is the descriptor
//! type a hybrid lists (the config's or the spec's).

use super::dpa2::Dpa2Config;
use super::dpa3::Dpa3Config;
use super::se_e3_tebd::SeE3TebdConfig;
use super::{AttentionConfig, DescriptorType};

#[derive(Clone, Debug, PartialEq)]
pub enum OwnKeys<D> {
    /// se_e2_a, se_e2_r, se_e3: the shared keys are all their keys.
    Se,
    /// DPA-1 (se_atten, se_atten_v2): the attention and type-embedding keys.
    Attention(AttentionConfig),
    /// DPA-3: the repflow keys (the shared ones hold e_rcut, e_rcut_smth, e_sel and n_dim).
    Dpa3(Dpa3Config),
    /// DPA-2: the repformer's and the three-body block's keys (the shared ones hold the
    /// repinit's).
    Dpa2(Dpa2Config),
    /// se_e3_tebd: its type embedding and exclusions.
    SeE3Tebd(SeE3TebdConfig),
    /// hybrid: its sub-descriptors, in `list` order (none of them hybrid).
    Hybrid(Vec<D>),
}

impl<D> OwnKeys<D> {
    /// Whether these are the keys a descriptor of `kind` has.
    pub fn fit(&self, kind: DescriptorType) -> bool {
        use DescriptorType as K;
        match self {
            OwnKeys::Se => matches!(kind, K::SeE2A | K::SeE2R | K::SeE3),
            OwnKeys::Attention(_) => kind.is_attention(),
            OwnKeys::Dpa3(_) => kind == K::Dpa3,
            OwnKeys::Dpa2(_) => kind == K::Dpa2,
            OwnKeys::SeE3Tebd(_) => kind == K::SeE3Tebd,
            OwnKeys::Hybrid(_) => kind == K::Hybrid,
        }
    }

    pub fn attention(&self) -> Option<&AttentionConfig> {
        match self {
            OwnKeys::Attention(a) => Some(a),
            _ => None,
        }
    }

    pub fn dpa3(&self) -> Option<&Dpa3Config> {
        match self {
            OwnKeys::Dpa3(c) => Some(c),
            _ => None,
        }
    }

    pub fn dpa2(&self) -> Option<&Dpa2Config> {
        match self {
            OwnKeys::Dpa2(c) => Some(c),
            _ => None,
        }
    }

    pub fn se_e3_tebd(&self) -> Option<&SeE3TebdConfig> {
        match self {
            OwnKeys::SeE3Tebd(c) => Some(c),
            _ => None,
        }
    }

    /// M of the rotation matrix `[M][3]` per atom (DeePMD-kit's `get_dim_emb`) of a descriptor
    /// with these keys and embedding widths `neuron`, where its kind gives one: the width of
    /// the pair features it is made from (DPA-2's g2_dim, DPA-3's e_dim), else the embedding
    /// net's last.
    pub fn rot_width(&self, neuron: &[usize]) -> usize {
        match self {
            OwnKeys::Dpa3(c) => c.e_dim,
            OwnKeys::Dpa2(c) => c.repformer.g2_dim,
            _ => *neuron.last().expect("a descriptor has layers"),
        }
    }

    /// A hybrid's sub-descriptors; empty for every other descriptor.
    pub fn list(&self) -> &[D] {
        match self {
            OwnKeys::Hybrid(l) => l,
            _ => &[],
        }
    }

    /// The same keys over a hybrid list of another descriptor type.
    pub fn map_list<E>(&self, f: impl FnMut(&D) -> E) -> OwnKeys<E> {
        match self {
            OwnKeys::Se => OwnKeys::Se,
            OwnKeys::Attention(a) => OwnKeys::Attention(a.clone()),
            OwnKeys::Dpa3(c) => OwnKeys::Dpa3(c.clone()),
            OwnKeys::Dpa2(c) => OwnKeys::Dpa2(c.clone()),
            OwnKeys::SeE3Tebd(c) => OwnKeys::SeE3Tebd(c.clone()),
            OwnKeys::Hybrid(l) => OwnKeys::Hybrid(l.iter().map(f).collect()),
        }
    }
}

/// The checkpoint key that holds a `kind`'s own keys (none for se_e2_a, se_e2_r and se_e3).
pub(super) fn file_key(kind: DescriptorType) -> &'static str {
    use DescriptorType as K;
    match kind {
        K::SeE2A | K::SeE2R | K::SeE3 => "shared",
        K::SeAtten | K::SeAttenV2 => "attention",
        K::Dpa3 => "dpa3",
        K::Dpa2 => "dpa2",
        K::SeE3Tebd => "se_e3_tebd",
        K::Hybrid => "list",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::model::{AttentionConfig, DescriptorSpec, DescriptorType, OwnKeys, TebdInputMode};

    fn dpa1() -> DescriptorSpec {
        DescriptorSpec {
            kind: DescriptorType::SeAtten,
            rcut: 6.0,
            rcut_smth: 0.5,
            sel: vec![40],
            neuron: vec![4, 8],
            axis_neuron: 2,
            resnet_dt: false,
            type_one_side: false,
            env_protection: 0.0,
            set_davg_zero: true,
            own: OwnKeys::Attention(AttentionConfig {
                tebd_dim: 8,
                tebd_input_mode: TebdInputMode::Concat,
                attn: 16,
                attn_layer: 1,
                attn_dotr: true,
                scaling_factor: 1.0,
                normalize: true,
                temperature: None,
                trainable_ln: true,
                ln_eps: 1e-5,
                smooth_type_embedding: false,
                concat_output_tebd: true,
                use_tebd_bias: false,
            }),
        }
    }

    fn read(v: Value) -> Result<DescriptorSpec, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// A checkpoint holds each family's keys under its name, as before the keys were one value.
    #[test]
    fn a_spec_keeps_its_file_form() {
        let d = dpa1();
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["kind"], json!("se_atten"));
        assert_eq!(v["attention"]["attn"], json!(16));
        for absent in ["list", "dpa3", "dpa2", "se_e3_tebd"] {
            assert!(v.get(absent).is_none(), "{absent} written");
        }
        assert_eq!(read(v).unwrap(), d);
        let se = DescriptorSpec {
            kind: DescriptorType::SeE2A,
            own: OwnKeys::Se,
            ..dpa1()
        };
        let v = serde_json::to_value(&se).unwrap();
        assert!(v.get("kind").is_none() && v.get("attention").is_none());
        assert_eq!(read(v).unwrap(), se);
    }

    /// Keys that do not fit the kind are refused as the file is read, naming both.
    #[test]
    fn keys_of_another_kind_are_refused() {
        let v = serde_json::to_value(dpa1()).unwrap();
        let mut se = v.clone();
        se["kind"] = json!("se_e2_a");
        let e = read(se).unwrap_err();
        assert!(
            e.contains("se_e2_a descriptor has no attention keys"),
            "{e}"
        );
        let mut bare = v.clone();
        bare.as_object_mut().unwrap().remove("attention");
        let e = read(bare).unwrap_err();
        assert!(
            e.contains("se_atten descriptor needs its attention keys"),
            "{e}"
        );
        let mut two = v;
        two["list"] = json!([serde_json::to_value(dpa1()).unwrap()]);
        let e = read(two).unwrap_err();
        assert!(e.contains("has list, attention together"), "{e}");
    }
}

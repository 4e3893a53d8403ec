//! The descriptors dpw knows, found by DeePMD-kit's `type` and the aliases DeePMD-kit's
//! registry knows them by (`BaseDescriptor.register("se_e2_r")` and `register("se_r")`): the
//! one table input.json, `.yaml` files and messages read names from.

use serde_json::{Map, Value};

use super::layout::{Builder, DescriptorLayout};
use super::yaml::PartYaml;
use super::{DescriptorSpec, DescriptorType};
use crate::config::{ConfigError, DescriptorConfig};

/// A registered descriptor: its kind, its names (DeePMD-kit's canonical `type` first), its
/// input.json keys and its `.yaml` (its folder's).
pub struct Registered {
    pub kind: DescriptorType,
    pub names: &'static [&'static str],
    /// Whether a hybrid may list it.
    pub in_hybrid: bool,
    /// Its neighbour list: one section per type, or one mixed-type list (whose model has one
    /// fitting net for every type).
    pub mixed: bool,
    /// Whether it reads the slots' r_ij itself rather than R̂ (its training seed is ṙ_ij).
    pub reads_rij: bool,
    /// Whether it gives the rotation matrix a dipole or polar fitting reads (DeePMD-kit's
    /// `rot_mat`, `[M][3]` per atom, M its `get_dim_emb`: [`DescriptorSpec::rot_width`]).
    pub gives_rot: bool,
    /// Whether its embedding net runs on every pair of a centre's neighbour slots (se_e3), not
    /// on every slot: its rows grow as sel², which the memory budget says.
    pub embeds_pairs: bool,
    /// The columns of the environment rows its davg/dstd cover in DeePMD-kit's files (0 for a
    /// hybrid, whose parts have their own).
    pub env_columns: usize,
    /// Its keys in input.json at `path`, `ntypes` types (the kind tells a family's members
    /// apart); the config's `type` is its canonical name.
    pub(crate) parse: fn(
        kind: DescriptorType,
        v: &Value,
        path: &str,
        ntypes: usize,
    ) -> Result<DescriptorConfig, ConfigError>,
    /// Its keys as out.json writes them, every default filled in.
    pub(crate) to_json: fn(&DescriptorConfig) -> Value,
    /// Its own keys' ranges (`{key}.…` in its errors), `nt` types, after the ones every
    /// descriptor shares.
    pub(super) check: fn(d: &DescriptorSpec, nt: usize, key: &str) -> anyhow::Result<()>,
    /// Its keys as input.json gives them, read back from a spec (what
    /// `ModelSpec::differences` compares).
    pub(super) spec_keys: fn(&DescriptorSpec) -> Map<String, Value>,
    /// The width of its descriptor of one atom.
    pub(super) dim: fn(d: &DescriptorSpec) -> usize,
    /// The blocks that keep statistics of their own, in the order of its davg/dstd rows
    /// ([`super::each_part`] where each of its parts keeps its own).
    pub(super) stat_parts: fn(d: &DescriptorSpec) -> Vec<DescriptorSpec>,
    /// Where its tensors live in the parameter vector, allocated from `b` in its files' order.
    pub(super) layout: fn(d: &DescriptorSpec, nt: usize, b: &mut Builder) -> DescriptorLayout,
    /// Its line in the training log from `head` (its type, sel, rcut and neuron): the keys it
    /// has.
    pub(crate) describe: fn(d: &DescriptorSpec, head: String) -> String,
    pub(super) yaml: PartYaml,
}

/// Every descriptor, in the order messages list them.
pub static DESCRIPTORS: &[Registered] = &[
    Registered {
        kind: DescriptorType::SeE2A,
        names: &["se_e2_a", "se_a"],
        in_hybrid: true,
        mixed: false,
        reads_rij: false,
        gives_rot: true,
        embeds_pairs: false,
        env_columns: 4,
        parse: super::se::input::parse,
        to_json: super::se::input::to_json,
        spec_keys: super::se::input::spec_keys,
        check: super::se::input::check,
        dim: super::se::dim,
        stat_parts: super::each_part,
        layout: super::se::layout,
        describe: super::se::describe,
        yaml: PartYaml::One(&super::se::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::SeE2R,
        names: &["se_e2_r", "se_r"],
        in_hybrid: true,
        mixed: false,
        reads_rij: false,
        gives_rot: false,
        embeds_pairs: false,
        env_columns: 1,
        parse: super::se::input::parse,
        to_json: super::se::input::to_json,
        spec_keys: super::se::input::spec_keys,
        check: super::se::input::check,
        dim: super::se::dim,
        stat_parts: super::each_part,
        layout: super::se::layout,
        describe: super::se::describe,
        yaml: PartYaml::One(&super::se::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::SeE3,
        names: &["se_e3", "se_at", "se_a_3be", "se_t"],
        in_hybrid: true,
        mixed: false,
        reads_rij: false,
        gives_rot: false,
        embeds_pairs: true,
        env_columns: 4,
        parse: super::se::input::parse,
        to_json: super::se::input::to_json,
        spec_keys: super::se::input::spec_keys,
        check: super::se::input::check,
        dim: super::se::dim,
        stat_parts: super::each_part,
        layout: super::se::layout,
        describe: super::se::describe,
        yaml: PartYaml::One(&super::se::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::SeAtten,
        names: &["se_atten", "dpa1"],
        in_hybrid: false,
        mixed: true,
        reads_rij: false,
        gives_rot: true,
        embeds_pairs: false,
        env_columns: 4,
        parse: super::se_atten::input::parse,
        to_json: super::se_atten::input::to_json,
        spec_keys: super::se_atten::input::spec_keys,
        check: super::se_atten::input::check,
        dim: super::se_atten::dim,
        stat_parts: super::each_part,
        layout: super::se_atten::layout,
        describe: super::se_atten::describe,
        yaml: PartYaml::One(&super::se_atten::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::SeAttenV2,
        names: &["se_atten_v2"],
        in_hybrid: false,
        mixed: true,
        reads_rij: false,
        gives_rot: true,
        embeds_pairs: false,
        env_columns: 4,
        parse: super::se_atten::input::parse,
        to_json: super::se_atten::input::to_json,
        spec_keys: super::se_atten::input::spec_keys,
        check: super::se_atten::input::check,
        dim: super::se_atten::dim,
        stat_parts: super::each_part,
        layout: super::se_atten::layout,
        describe: super::se_atten::describe,
        yaml: PartYaml::One(&super::se_atten::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::Dpa3,
        names: &["dpa3"],
        in_hybrid: false,
        mixed: true,
        reads_rij: true,
        gives_rot: true,
        embeds_pairs: false,
        env_columns: 4,
        parse: super::dpa3::input::parse,
        to_json: super::dpa3::input::to_json,
        spec_keys: super::dpa3::input::spec_keys,
        check: super::dpa3::input::check,
        dim: super::dpa3::dim,
        stat_parts: super::each_part,
        layout: super::dpa3::layout,
        describe: super::dpa3::describe,
        yaml: PartYaml::One(&super::dpa3::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::Dpa2,
        names: &["dpa2"],
        in_hybrid: false,
        mixed: true,
        reads_rij: true,
        gives_rot: true,
        embeds_pairs: false,
        env_columns: 4,
        parse: super::dpa2::input::parse,
        to_json: super::dpa2::input::to_json,
        spec_keys: super::dpa2::input::spec_keys,
        check: super::dpa2::input::check,
        dim: super::dpa2::dim,
        stat_parts: super::dpa2::stat_parts,
        layout: super::dpa2::layout,
        describe: super::dpa2::describe,
        yaml: PartYaml::One(&super::dpa2::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::SeE3Tebd,
        names: &["se_e3_tebd"],
        in_hybrid: false,
        mixed: true,
        reads_rij: true,
        gives_rot: false,
        embeds_pairs: false,
        env_columns: 4,
        parse: super::se_e3_tebd::input::parse,
        to_json: super::se_e3_tebd::input::to_json,
        spec_keys: super::se_e3_tebd::input::spec_keys,
        check: super::se_e3_tebd::input::check,
        dim: super::se_e3_tebd::dim,
        stat_parts: super::each_part,
        layout: super::se_e3_tebd::layout,
        describe: super::se_e3_tebd::describe,
        yaml: PartYaml::One(&super::se_e3_tebd::yaml::YAML),
    },
    Registered {
        kind: DescriptorType::Hybrid,
        names: &["hybrid"],
        in_hybrid: false,
        mixed: false,
        reads_rij: false,
        gives_rot: false,
        embeds_pairs: false,
        env_columns: 0,
        parse: super::hybrid::input::parse,
        to_json: super::hybrid::input::to_json,
        spec_keys: super::hybrid::input::spec_keys,
        check: super::hybrid::input::check,
        dim: super::hybrid::dim,
        stat_parts: super::each_part,
        layout: super::hybrid::layout,
        describe: super::hybrid::describe,
        yaml: PartYaml::List(&super::hybrid::yaml::YAML),
    },
];

impl DescriptorType {
    /// The descriptor registered under `name` (a `type` or one of its aliases).
    pub fn from_name(name: &str) -> Option<Self> {
        (DESCRIPTORS.iter())
            .find(|r| r.names.contains(&name))
            .map(|r| r.kind)
    }

    /// Its entry in the registry.
    pub(crate) fn registered(self) -> &'static Registered {
        (DESCRIPTORS.iter())
            .find(|r| r.kind == self)
            .expect("every kind is registered")
    }

    /// Its names, the canonical `type` first.
    pub fn names(self) -> &'static [&'static str] {
        self.registered().names
    }

    /// DeePMD-kit's canonical `type`.
    pub fn as_str(self) -> &'static str {
        self.names()[0]
    }

    /// Its `.yaml`.
    pub(super) fn yaml(self) -> PartYaml {
        self.registered().yaml
    }
}

/// The mixed-type descriptors (one neighbour list of every type, one fitting net), as messages
/// list them.
pub fn mixed_type_names() -> String {
    (DESCRIPTORS.iter())
        .filter(|r| r.kind.is_mixed())
        .map(|r| r.names[0])
        .collect::<Vec<_>>()
        .join(", ")
}

/// A type DeePMD-kit's input takes for a model (`model.type`) or a fitting
/// (`model.fitting_net.type`): dpw builds some; the others are refused naming what they are.
pub struct KnownType {
    pub names: &'static [&'static str],
    /// What dpw lacks for it; `None` for the one it builds.
    pub lacks: Option<&'static str>,
}

/// DeePMD-kit's model types (its argcheck's `model` variants and `get_model`'s branches).
pub static MODELS: &[KnownType] = &[
    KnownType {
        names: &["standard"],
        lacks: None,
    },
    KnownType {
        names: &["DPA4", "dpa4", "SeZM", "sezm"],
        lacks: Some("DPA-4 (SeZM) is not supported"),
    },
    KnownType {
        names: &["linear_ener"],
        lacks: None,
    },
    KnownType {
        names: &["pairtab"],
        lacks: Some(
            "a pair table alone is not supported (DeePMD-kit's PyTorch refuses it too); a \
             linear_ener model mixes one with a DP model",
        ),
    },
    KnownType {
        names: &["frozen"],
        lacks: Some("frozen models as part of a model are not supported"),
    },
    KnownType {
        names: &["pairwise_dprc"],
        lacks: Some("DPRC's pairwise QM/MM models are not supported"),
    },
];

/// DeePMD-kit's fitting types (its argcheck's `fitting_net` variants) that dpw does not build
/// (those it builds: [`crate::fitting::registry`]). The fitting decides what a standard model
/// predicts, so it is checked with the model's type, before other keys.
pub static REFUSED_FITTINGS: &[KnownType] = &[
    KnownType {
        names: &["population"],
        lacks: Some("population fittings are not supported"),
    },
    KnownType {
        names: &["dpa4_ener", "sezm_ener"],
        lacks: Some("DPA-4's energy fitting is not supported"),
    },
];

/// The registered descriptors for a message: `se_e2_a (se_a), se_e2_r (se_r), ...`.
pub fn descriptor_names() -> String {
    let one = |r: &Registered| match r.names {
        [name] => name.to_string(),
        [name, aliases @ ..] => format!("{name} ({})", aliases.join(", ")),
        [] => unreachable!("a registered descriptor has a name"),
    };
    DESCRIPTORS.iter().map(one).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_finds_its_kind_and_no_name_is_taken_twice() {
        let mut seen = std::collections::HashSet::new();
        for r in DESCRIPTORS {
            assert_eq!(r.kind.as_str(), r.names[0]);
            for name in r.names {
                assert!(seen.insert(*name), "{name} registered twice");
                assert_eq!(DescriptorType::from_name(name), Some(r.kind));
            }
        }
        assert_eq!(DescriptorType::from_name("dpa4"), None);
        assert!(descriptor_names().starts_with("se_e2_a (se_a), se_e2_r (se_r), se_e3 ("));
    }

    /// An entry's flags agree with one another: what reads r_ij has a mixed-type list, a hybrid
    /// lists no mixed-type descriptor, and only a hybrid has no environment columns of its own.
    #[test]
    fn the_flags_of_each_entry_agree() {
        for r in DESCRIPTORS {
            let name = r.names[0];
            assert!(!r.reads_rij || r.mixed, "{name}");
            assert!(!(r.in_hybrid && r.mixed), "{name}");
            assert_eq!(
                r.env_columns == 0,
                r.kind == DescriptorType::Hybrid,
                "{name}"
            );
        }
        let mixed: Vec<_> = DESCRIPTORS
            .iter()
            .filter(|r| r.mixed)
            .map(|r| r.names[0])
            .collect();
        assert_eq!(
            mixed,
            ["se_atten", "se_atten_v2", "dpa3", "dpa2", "se_e3_tebd"]
        );
    }
}

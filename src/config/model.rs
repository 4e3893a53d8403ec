//! The `model` section: type map, the descriptor (se_e2_a, se_e2_r, se_e3, hybrid, se_atten,
//! se_atten_v2; dpa3, dpa2 and se_e3_tebd in their own files) and the fitting net (ener,
//! property, ...).

use std::path::Path;

use serde_json::{json, Map, Value};

use super::block_keys::activation;
use super::error::ConfigError;
use super::keys::{
    at_least_one, join, non_negative, positive, to_f64, to_list, to_str, to_usize, to_usize_list,
    wrong_type, Schema, Section,
};
use super::linear::LinearConfig;
use super::pairtab::PairConfig;
use crate::fitting::output::{FitContext, Registered};
use crate::fitting::registry;
use crate::fitting::tensor;
use crate::model::registry::{descriptor_names, KnownType, MODELS, REFUSED_FITTINGS};
use crate::model::{Activation, DescriptorSpec, DescriptorType, FitOutput, OwnKeys};
pub use crate::model::{AttentionConfig, TebdInputMode};

type Result<T> = std::result::Result<T, ConfigError>;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Element names; type index i of the data is `type_map[i]`.
    pub type_map: Vec<String>,
    pub descriptor: DescriptorConfig,
    pub fitting_net: FittingConfig,
    /// Batches per system used for the davg/dstd and energy-bias statistics.
    pub data_stat_nbatch: usize,
    /// Lower bound on a std in the fitting input statistics.
    pub data_stat_protect: f64,
    /// A pair table mixed into the energy (`use_srtab`, `linear_ener`).
    pub short_range: Option<PairConfig>,
    /// A `linear_ener` model's other DP models and the weights; `None` for one DP model.
    pub linear: Option<LinearConfig>,
    /// DeePMD-kit's `info`: what the model is (`description`, `observed_type`), for people and
    /// for `dp show`; kept in out.json, not read.
    pub info: Map<String, Value>,
}

/// Floating-point precision of a net's parameters. DeePMD-kit's `"default"` is float64 (unless
/// `DP_INTERFACE_PREC=low`, which dpw does not read), so it loads as [`Precision::F64`] and is
/// written back as `"float64"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    F64,
    F32,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F64 => "float64",
            Precision::F32 => "float32",
        }
    }

    fn parse(v: &Value, path: &str) -> Result<Self> {
        match to_str(v, path)? {
            "default" | "float64" => Ok(Precision::F64),
            "float32" => Ok(Precision::F32),
            other => Err(ConfigError::unsupported(
                path,
                format!("precision {other:?} is not supported; use \"default\", \"float64\" or \"float32\""),
            )),
        }
    }
}

/// Neighbours kept per type.
#[derive(Debug, Clone, PartialEq)]
pub enum Sel {
    /// `"auto"` (factor 1.1) or `"auto:<factor>"`: the trainer counts the largest number of
    /// neighbours of each type in the data and scales it by the factor.
    Auto(f64),
    /// One count per type, in `type_map` order.
    Fixed(Vec<usize>),
}

/// A neighbour list of DPA-2 or DPA-3 other than the descriptor's main one (`sel`, at `rcut`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelList {
    /// DPA-2's `repinit.three_body_sel`.
    Dpa2ThreeBody,
    /// DPA-2's `repformer.nsel`.
    Dpa2Repformer,
    /// DPA-3's `repflow.a_sel`.
    Dpa3Angle,
}

impl SelList {
    /// The key within the descriptor's section.
    pub fn key(self) -> &'static str {
        match self {
            SelList::Dpa2ThreeBody => "repinit.three_body_sel",
            SelList::Dpa2Repformer => "repformer.nsel",
            SelList::Dpa3Angle => "repflow.a_sel",
        }
    }

    /// The lists of a model's descriptor beside its main one: (list, rcut, size).
    pub fn of_descriptor(d: &DescriptorSpec) -> Vec<(SelList, f64, usize)> {
        let mut out = vec![];
        if let Some(c) = d.own.dpa2() {
            let (i, r) = (&c.repinit, &c.repformer);
            out.push((SelList::Dpa2ThreeBody, i.three_body_rcut, i.three_body_sel));
            out.push((SelList::Dpa2Repformer, r.rcut, r.nsel));
        }
        if let Some(c) = d.own.dpa3() {
            out.push((SelList::Dpa3Angle, c.a_rcut, c.a_sel));
        }
        out
    }

    /// The list's size in a model's descriptor that has the list.
    pub fn of_spec(self, d: &DescriptorSpec) -> Option<usize> {
        (Self::of_descriptor(d).into_iter()).find_map(|(l, _, n)| (l == self).then_some(n))
    }

    pub fn set(self, d: &mut DescriptorConfig, n: usize) {
        match (self, &mut d.own) {
            (SelList::Dpa2ThreeBody, OwnKeys::Dpa2(c)) => c.repinit.three_body_sel = n,
            (SelList::Dpa2Repformer, OwnKeys::Dpa2(c)) => c.repformer.nsel = n,
            (SelList::Dpa3Angle, OwnKeys::Dpa3(c)) => c.a_sel = n,
            (list, _) => unreachable!("{list:?} is a list of another descriptor"),
        }
    }

    /// Where out.json holds it: `(block, key)`.
    fn json_key(self) -> (&'static str, &'static str) {
        self.key().split_once('.').expect("block.key")
    }
}

/// A list of [`SelList`] given as `"auto[:factor]"`: DeePMD-kit's `update_sel` counts the
/// neighbours of all types together within its `rcut` in the training data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoList {
    pub list: SelList,
    pub rcut: f64,
    pub factor: f64,
}

impl AutoList {
    /// The size of `list` (cut-off `rcut`) as its key gave it: the number, or 0 with the list
    /// put on `auto` to be counted by the trainer.
    pub(crate) fn size(sel: Sel, list: SelList, rcut: f64, auto: &mut Vec<AutoList>) -> usize {
        match sel {
            Sel::Fixed(s) => s[0],
            Sel::Auto(factor) => {
                auto.push(AutoList { list, rcut, factor });
                0
            }
        }
    }

    /// The descriptor's out.json with the list still `"auto:<factor>"`.
    pub(super) fn write(&self, descriptor: &mut Value) {
        let (block, key) = self.list.json_key();
        descriptor[block][key] = Sel::Auto(self.factor).to_value();
    }
}

impl Sel {
    /// The size of one mixed-type list (DPA-2's, DPA-3's) at `key`: an integer or
    /// "auto[:factor]", `default` where left out (required without one).
    pub(crate) fn of_list(sec: &Section, key: &str, default: Option<usize>) -> Result<Self> {
        let path = sec.path_of(key);
        let v = match (sec.get(key), default) {
            (Some(v), _) => v,
            (None, Some(n)) => return Ok(Sel::Fixed(vec![n])),
            (None, None) => sec.required(key, "an integer or \"auto\"")?,
        };
        match v {
            Value::Number(_) => Ok(Sel::Fixed(vec![to_usize(v, &path)?])),
            Value::String(_) => Sel::parse(v, &path, 1),
            x => Err(wrong_type(&path, "an integer or \"auto\"", x)),
        }
    }

    pub(crate) fn parse(v: &Value, path: &str, ntypes: usize) -> Result<Self> {
        const EXPECTED: &str = "a list of integers (one per type), \"auto\" or \"auto:<factor>\"";
        match v {
            Value::String(s) if s == "auto" => Ok(Sel::Auto(1.1)),
            Value::String(s) => {
                let factor = s
                    .strip_prefix("auto:")
                    .and_then(|f| f.parse::<f64>().ok())
                    .filter(|f| f.is_finite() && *f > 0.0)
                    .ok_or_else(|| wrong_type(path, EXPECTED, v))?;
                Ok(Sel::Auto(factor))
            }
            Value::Array(_) => {
                let sel = to_usize_list(v, path)?;
                if sel.len() != ntypes {
                    return Err(ConfigError::invalid(
                        path,
                        format!(
                            "has {} entries but type_map has {ntypes} types; give one count per type",
                            sel.len()
                        ),
                    ));
                }
                Ok(Sel::Fixed(sel))
            }
            _ => Err(wrong_type(path, EXPECTED, v)),
        }
    }

    pub(crate) fn to_value(&self) -> Value {
        match self {
            Sel::Auto(f) => Value::from(format!("auto:{f}")),
            Sel::Fixed(sel) => json!(sel),
        }
    }
}

/// `se_e2_a` (alias `se_a`): the smooth two-body embedding with full relative coordinates;
/// `se_e2_r` (alias `se_r`): its radial-only sibling; `se_e3` (alias `se_t`): the three-body
/// embedding of neighbour-pair angles.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorConfig {
    pub kind: DescriptorType,
    /// The `type` key as given, e.g. `"se_e2_a"` or `"se_a"` (kept for out.json).
    pub r#type: String,
    pub sel: Sel,
    pub rcut: f64,
    pub rcut_smth: f64,
    /// Embedding-net widths.
    pub neuron: Vec<usize>,
    /// M2: how many rows of the embedding matrix form the second factor of the descriptor
    /// (se_e2_a); 1 for se_e2_r and se_e3, which have no second factor.
    pub axis_neuron: usize,
    pub resnet_dt: bool,
    /// true: one embedding net per neighbour type; false: one per (centre, neighbour) pair.
    pub type_one_side: bool,
    pub precision: Precision,
    pub trainable: bool,
    pub seed: Option<u64>,
    pub env_protection: f64,
    pub set_davg_zero: bool,
    /// The keys of its kind alone. DPA-1's and se_e3_tebd's sel is one mixed-type list: an
    /// integer given is kept as `Fixed([n])`, a list as given, of any length (DeePMD-kit uses
    /// only its sum). DPA-3's shared keys hold e_rcut, e_rcut_smth and e_sel as rcut, rcut_smth
    /// and sel, and n_dim as the one neuron; DPA-2's the repinit's rcut, rcut_smth, nsel,
    /// neuron, axis_neuron, type_one_side, resnet_dt and set_davg_zero. A hybrid's list has no
    /// hybrid and each sel given as numbers; its own sel and rcut are its list's largest, its
    /// precision and trainable those its list shares, its other keys empty or zero.
    pub own: OwnKeys<DescriptorConfig>,
    /// DPA-2's and DPA-3's lists beside the main one whose size input.json gives as
    /// `"auto[:factor]"`, until the trainer counts them (their fields hold 0 till then).
    pub auto_lists: Vec<AutoList>,
}

/// The fitting net: one net per atom type (one for all after a mixed-type descriptor) mapping
/// the descriptor to an atomic energy (`ener`) or property (`property`).
#[derive(Debug, Clone, PartialEq)]
pub struct FittingConfig {
    /// What the fitting predicts (`type`).
    pub output: FitOutput,
    pub neuron: Vec<usize>,
    pub resnet_dt: bool,
    /// The hidden layers' φ (`activation_function`).
    pub activation: Activation,
    pub precision: Precision,
    /// Cut-off ratio of the least-squares solve for the energy bias; `None` = machine default.
    pub rcond: Option<f64>,
    /// Fixed atomic energy per type (`null` = not fixed); empty = none fixed.
    pub atom_ener: Vec<Option<f64>>,
    pub trainable: bool,
    pub seed: Option<u64>,
    /// Frame parameters per frame (`fparam.npy`) and atomic parameters per atom
    /// (`aparam.npy`) the net takes beside the descriptor.
    pub numb_fparam: usize,
    pub numb_aparam: usize,
    /// The frame parameters of a system without `fparam.npy`.
    pub default_fparam: Option<Vec<f64>>,
    /// The width of the case embedding (a multi-task run's task, as a one-hot row).
    pub dim_case_embd: usize,
}

static MODEL: Schema = Schema {
    keys: &[&[
        "type",
        "type_map",
        "descriptor",
        "fitting_net",
        "data_stat_nbatch",
        "data_stat_protect",
        "info",
        "atom_exclude_types",
        "use_srtab",
        "smin_alpha",
        "sw_rmin",
        "sw_rmax",
        "srtab_add_bias",
    ]],
    unsupported: &[&[
        ("pair_exclude_types", "type exclusion is not implemented"),
        (
            "preset_out_bias",
            "the energy bias is always computed from data",
        ),
        ("modifier", "model modifiers are not implemented"),
        ("compress", "model compression is not implemented"),
        ("spin", "spin models are not implemented"),
        (
            "finetune_head",
            "a single-task input's finetune_head is not read: give the head with \
             --model-branch",
        ),
        (
            "type_embedding",
            "a model-level type embedding (TensorFlow's se_e2_a with type embedding) is not implemented",
        ),
    ]],
    ignored: &[],
    deepmd: "model",
};

/// Layer widths: a non-empty list of positive integers.
pub(crate) fn widths(sec: &Section, key: &str, default: &[usize]) -> Result<Vec<usize>> {
    let v = sec.usize_list_or(key, default)?;
    let path = sec.path_of(key);
    if v.is_empty() {
        return Err(ConfigError::invalid(
            path,
            "must list at least one layer width",
        ));
    }
    if let Some(i) = v.iter().position(|&n| n == 0) {
        return Err(ConfigError::invalid(
            format!("{path}[{i}]"),
            "a layer width must be >= 1",
        ));
    }
    Ok(v)
}

/// `exclude_types`: pairs of types below `ntypes` (absent or null: none).
pub(crate) fn type_pairs(sec: &Section, ntypes: usize) -> Result<Vec<[usize; 2]>> {
    let Some(v) = sec.get_nonnull("exclude_types") else {
        return Ok(vec![]);
    };
    let epath = sec.path_of("exclude_types");
    let items = to_list(v, &epath, "a list of pairs of types")?;
    (items.iter().enumerate())
        .map(|(i, p)| {
            let ipath = format!("{epath}[{i}]");
            match to_usize_list(p, &ipath)?[..] {
                [a, b] if a.max(b) < ntypes => Ok([a, b]),
                [_, _] => Err(ConfigError::invalid(
                    ipath,
                    format!("names a type beyond the {ntypes} of type_map"),
                )),
                _ => Err(ConfigError::invalid(ipath, "must be a pair of types")),
            }
        })
        .collect()
}

pub(crate) fn precision(sec: &Section) -> Result<Precision> {
    sec.get("precision").map_or(Ok(Precision::F64), |v| {
        Precision::parse(v, &sec.path_of("precision"))
    })
}

/// `model.type`, checked before any other key of the input: a model dpw lacks (DPA-4's
/// `"type": "DPA4"`) comes with keys of its own at every level, and the model is what to name.
pub(super) fn check_type(v: &Value, path: &str) -> Result<()> {
    // DeePMD-kit's multi-task input: another schema (model_dict, loss_dict, data_dict).
    if v.get("model_dict").is_some() {
        return Err(ConfigError::unsupported(
            join(path, "model_dict"),
            "a multi-task input (a model_dict of models sharing parts): `dpw train` reads \
             it whole (config::multitask); here one model is expected",
        ));
    }
    if let Some(t) = v.get("type") {
        check_known(
            t,
            &join(path, "type"),
            MODELS,
            "model",
            "\"standard\" models",
        )?;
    }
    if let Some(t) = v.get("fitting_net").and_then(|f| f.get("type")) {
        let type_path = join(&join(path, "fitting_net"), "type");
        if registry::find(Some(to_str(t, &type_path)?)).is_none() {
            let builds = format!("the {} fittings", registry::names());
            check_known(t, &type_path, REFUSED_FITTINGS, "fitting", &builds)?;
        }
    }
    if let Some(d) = v.get("descriptor").filter(|d| d.get("type").is_some()) {
        descriptor_type(d, &join(path, "descriptor"))?;
    }
    Ok(())
}

/// A `type` from one of the tables of [`crate::model::registry`].
fn check_known(
    t: &Value,
    type_path: &str,
    table: &[KnownType],
    what: &str,
    builds: &str,
) -> Result<()> {
    let name = to_str(t, type_path)?;
    match table.iter().find(|m| m.names.contains(&name)) {
        Some(KnownType { lacks: None, .. }) => Ok(()),
        Some(KnownType {
            lacks: Some(why), ..
        }) => Err(ConfigError::unsupported(
            type_path,
            format!("{what} type {name:?}: {why}; dpw trains {builds}"),
        )),
        None => Err(ConfigError::unsupported(
            type_path,
            format!("{what} type {name:?} is not known; dpw trains {builds}"),
        )),
    }
}

/// The model section, its type already checked by [`check_type`].
pub(super) fn parse(v: &Value, path: &str, base_dir: &Path) -> Result<ModelConfig> {
    if v.get("type").and_then(Value::as_str) == Some("linear_ener") {
        return super::linear::parse_linear(v, path, base_dir);
    }
    let sec = Section::new(v, path, &MODEL)?;
    // The fitting first: an input that asks for what dpw's fitting lacks (fparam, aparam) is
    // refused for that, not for a type_map it may leave to the data.
    let empty = json!({});
    let fitting_value = sec.get("fitting_net").unwrap_or(&empty);
    let fitting_path = sec.path_of("fitting_net");
    let (fitting_sec, fitting_type) = fitting_section(fitting_value, &fitting_path)?;
    let mut fitting_net = parse_fitting(&fitting_sec)?;
    let type_map = parse_type_map(&sec)?;
    let descriptor = parse_descriptor(
        sec.required("descriptor", "an object with \"type\": \"se_e2_a\"")?,
        &sec.path_of("descriptor"),
        type_map.len(),
        false,
    )?;
    let exclude_path = sec.path_of("atom_exclude_types");
    let atom_exclude_types = match sec.get_nonnull("atom_exclude_types") {
        Some(v) => tensor::config::types(v, &exclude_path, type_map.len())?,
        None => vec![],
    };
    let rot_width = (descriptor.kind.registered().gives_rot)
        .then(|| descriptor.own.rot_width(&descriptor.neuron));
    let ctx = FitContext {
        ntypes: type_map.len(),
        descriptor: descriptor.kind.as_str(),
        rot_width,
        atom_exclude_types: &atom_exclude_types,
        path: &fitting_path,
    };
    fitting_net.output = (fitting_type.parse)(&fitting_sec, &ctx)?;
    if !atom_exclude_types.is_empty() && !fitting_net.output.fitting().excludes_types() {
        return Err(ConfigError::unsupported(
            exclude_path,
            "type exclusion is implemented for the dipole and polar fittings only",
        ));
    }
    let data_stat_nbatch = sec.usize_or("data_stat_nbatch", 10)?;
    at_least_one(data_stat_nbatch, &sec.path_of("data_stat_nbatch"))?;
    let data_stat_protect = sec.f64_or("data_stat_protect", 0.01)?;
    non_negative(data_stat_protect, &sec.path_of("data_stat_protect"))?;
    let short_range = super::pairtab::srtab(&sec, base_dir, &descriptor)?;
    let info = match sec.get_nonnull("info") {
        Some(Value::Object(m)) => m.clone(),
        Some(v) => return Err(wrong_type(&sec.path_of("info"), "an object", v)),
        None => Map::new(),
    };
    Ok(ModelConfig {
        type_map,
        descriptor,
        fitting_net,
        data_stat_nbatch,
        data_stat_protect,
        short_range,
        linear: None,
        info,
    })
}

fn parse_type_map(sec: &Section) -> Result<Vec<String>> {
    let path = sec.path_of("type_map");
    let expected = "a non-empty list of element names, e.g. [\"O\", \"H\"]";
    let missing = "a non-empty list of element names, e.g. [\"O\", \"H\"] (dpw train takes \
                   them from the training systems: their type_map.raw files, as DeePMD-kit's \
                   TensorFlow backend does, or Type_0, Type_1, ... by index where they have \
                   none)";
    let items = to_list(sec.required("type_map", missing)?, &path, expected)?;
    if items.is_empty() {
        return Err(ConfigError::invalid(
            &path,
            format!("is empty; expected {expected}"),
        ));
    }
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let name = to_str(item, &p)?;
        if name.is_empty() {
            return Err(ConfigError::invalid(p, "an element name must not be empty"));
        }
        if names.iter().any(|n| n == name) {
            return Err(ConfigError::invalid(p, format!("{name:?} appears twice")));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// The descriptor `v`'s type, one dpw has, and its name as given.
fn descriptor_type<'v>(v: &'v Value, path: &str) -> Result<(DescriptorType, &'v str)> {
    let type_path = join(path, "type");
    let kind = match v.get("type") {
        Some(t) => to_str(t, &type_path)?,
        None if v.is_object() => {
            return Err(ConfigError::Missing {
                path: type_path,
                expected: "\"se_e2_a\" (or its alias \"se_a\")".into(),
            })
        }
        None => return Err(wrong_type(path, "an object", v)),
    };
    let descriptor = DescriptorType::from_name(kind).ok_or_else(|| {
        ConfigError::unsupported(
            type_path,
            format!(
                "descriptor type '{kind}' is not supported; dpw supports {}",
                descriptor_names()
            ),
        )
    })?;
    Ok((descriptor, kind))
}

/// One descriptor, read by its registered type; `in_hybrid` for an item of a hybrid's list.
pub(crate) fn parse_descriptor(
    v: &Value,
    path: &str,
    ntypes: usize,
    in_hybrid: bool,
) -> Result<DescriptorConfig> {
    // The type decides which keys are valid, so it is checked before the keys are.
    let (descriptor, name) = descriptor_type(v, path)?;
    let r = descriptor.registered();
    if in_hybrid && !r.in_hybrid {
        return Err(ConfigError::unsupported(
            join(path, "type"),
            match descriptor {
                DescriptorType::Hybrid => "a hybrid descriptor inside hybrid is not supported; \
                                           list its sub-descriptors in the outer hybrid's list"
                    .into(),
                _ => format!("{name} inside hybrid is not supported"),
            },
        ));
    }
    let mut d = (r.parse)(descriptor, v, path, ntypes)?;
    // out.json keeps the alias given.
    d.r#type = name.to_string();
    Ok(d)
}

/// A descriptor as out.json writes it: its keys, with their defaults filled in, and the sizes
/// of the lists given as "auto".
pub(crate) fn descriptor_json(d: &DescriptorConfig) -> Value {
    let mut v = (d.kind.registered().to_json)(d);
    (d.auto_lists.iter()).for_each(|a| a.write(&mut v));
    v
}

/// `rcut` and `rcut_smth`, at argcheck's defaults of the se_* descriptors (6.0, 0.5).
pub(crate) fn cutoffs(sec: &Section) -> Result<(f64, f64)> {
    let rcut = positive(sec.f64_or("rcut", 6.0)?, &sec.path_of("rcut"))?;
    let rcut_smth = non_negative(sec.f64_or("rcut_smth", 0.5)?, &sec.path_of("rcut_smth"))?;
    if rcut_smth >= rcut {
        return Err(ConfigError::invalid(
            sec.path_of("rcut_smth"),
            format!("must be smaller than rcut ({rcut:?}), found {rcut_smth:?}"),
        ));
    }
    Ok((rcut, rcut_smth))
}

/// The size of a mixed-type list at `sel` (DPA-1's, se_e3_tebd's): a number, or a list of
/// which DeePMD-kit uses only the sum (of any length: it serializes a number n as [n]), kept
/// as given; "auto[:factor]" also where left out.
pub(crate) fn mixed_sel(sec: &Section) -> Result<Sel> {
    let path = sec.path_of("sel");
    match sec.get("sel") {
        Some(v) if v.is_number() => Ok(Sel::Fixed(vec![to_usize(v, &path)?])),
        Some(v) if v.is_array() => {
            let sel = to_usize_list(v, &path)?;
            if sel.is_empty() {
                return Err(ConfigError::invalid(
                    path,
                    "is empty; give the number of neighbours",
                ));
            }
            Ok(Sel::Fixed(sel))
        }
        Some(v) => Sel::parse(v, &path, 1),
        None => Ok(Sel::Auto(1.1)),
    }
}

/// The fitting's section, its keys checked against those of its `type`, and its type.
fn fitting_section<'a>(v: &'a Value, path: &str) -> Result<(Section<'a>, &'static Registered)> {
    let name = v.get("type").and_then(Value::as_str);
    let Some(r) = registry::find(name) else {
        return Err(ConfigError::unsupported(
            join(path, "type"),
            format!(
                "fitting type {name:?} is not known; dpw trains the {} fittings",
                registry::names()
            ),
        ));
    };
    Ok((Section::new(v, path, r.schema)?, r))
}

/// The keys every fitting shares; its `type`'s own keys are read once the descriptor is known
/// ([`Registered::parse`]).
fn parse_fitting(sec: &Section) -> Result<FittingConfig> {
    let atom_ener = match sec.get("atom_ener") {
        None => vec![],
        Some(v) => {
            let p = sec.path_of("atom_ener");
            let items = to_list(v, &p, "a list of numbers or nulls, one per type")?;
            items
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::Null => Ok(None),
                    x => to_f64(x, &format!("{p}[{i}]")).map(Some),
                })
                .collect::<Result<_>>()?
        }
    };
    Ok(FittingConfig {
        // The type's own keys need the descriptor: the model's `parse` sets them.
        output: FitOutput::Ener,
        neuron: widths(sec, "neuron", &[120, 120, 120])?,
        resnet_dt: sec.bool_or("resnet_dt", true)?,
        activation: activation(sec, "tanh", "fitting net")?,
        precision: precision(sec)?,
        rcond: sec.opt_f64("rcond")?,
        atom_ener,
        trainable: sec.bool_or("trainable", true)?,
        seed: sec.opt_u64("seed")?,
        numb_fparam: sec.usize_or("numb_fparam", 0)?,
        numb_aparam: sec.usize_or("numb_aparam", 0)?,
        default_fparam: default_fparam(sec)?,
        dim_case_embd: sec.usize_or("dim_case_embd", 0)?,
    })
}

/// `default_fparam`: `numb_fparam` numbers, or absent (null).
fn default_fparam(sec: &Section) -> Result<Option<Vec<f64>>> {
    let Some(v) = sec.get_nonnull("default_fparam") else {
        return Ok(None);
    };
    let p = sec.path_of("default_fparam");
    let items = to_list(v, &p, "a list of numbers, one per frame parameter")?;
    let values = (items.iter().enumerate())
        .map(|(i, x)| to_f64(x, &format!("{p}[{i}]")))
        .collect::<Result<Vec<_>>>()?;
    let n = sec.usize_or("numb_fparam", 0)?;
    if values.len() != n {
        return Err(ConfigError::invalid(
            p,
            format!("{} values, but numb_fparam is {n}", values.len()),
        ));
    }
    Ok(Some(values))
}

impl ModelConfig {
    pub(super) fn to_json(&self) -> Value {
        let descriptor = descriptor_json(&self.descriptor);

        let f = &self.fitting_net;
        let mut fitting = json!({
            "neuron": f.neuron,
            "resnet_dt": f.resnet_dt,
            "activation_function": f.activation.name(),
            "precision": f.precision.as_str(),
            "trainable": f.trainable,
            "seed": f.seed,
            "numb_fparam": f.numb_fparam,
            "numb_aparam": f.numb_aparam,
            "default_fparam": f.default_fparam,
            "rcond": f.rcond,
            "atom_ener": f.atom_ener,
        });
        let keys = fitting.as_object_mut().expect("an object");
        // Written where set, so that the out.json of other models stays as it was.
        if f.dim_case_embd > 0 {
            keys.insert("dim_case_embd".into(), f.dim_case_embd.into());
        }
        f.output.fitting().input_json(keys);

        let atom_exclude_types = f.output.fitting().excluded_types();
        let mut standard = json!({
            "type": "standard",
            "type_map": self.type_map,
            "atom_exclude_types": atom_exclude_types,
            "descriptor": descriptor,
            "fitting_net": fitting,
            "data_stat_nbatch": self.data_stat_nbatch,
            "data_stat_protect": self.data_stat_protect,
        });
        if !self.info.is_empty() {
            standard["info"] = Value::Object(self.info.clone());
        }
        match (&self.short_range, &self.linear) {
            (Some(p), _) => p.to_json(standard),
            (None, Some(l)) => {
                let mut models = vec![standard];
                models.extend(l.more.iter().map(ModelConfig::to_json));
                super::linear::linear_json(&l.weights, models)
            }
            (None, None) => standard,
        }
    }
}

/// The map inside a `json!({...})` literal.
pub(crate) fn object(v: &mut Value) -> &mut Map<String, Value> {
    v.as_object_mut().expect("built from an object literal")
}

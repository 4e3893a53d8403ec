//! DeePMD-kit v3's own model file in YAML (docs/deepmd-spec.md §14): the dict of `model.serialize()` with every
//! array written as `{'@class': np.ndarray, '@is_variable': true, '@version': 1, dtype, value}`.
//! `dp convert-backend model.yaml model.pth` and `DeepPot("model.yaml")` read it, so this is how
//! dpw models go to and come from DeePMD-kit.
//!
//! Reading walks the tree once with [`At`], a value that remembers its path for error messages.
//! Writing builds the same tree as DeePMD-kit 3.2.0 does (checked key by key against
//! `reference/deepmd-3.2.0/model_A/model.yaml` in the tests) and prints it with a small emitter of
//! our own, because the file must be read by PyYAML, whose YAML 1.1 resolver treats `1e-5` (no
//! dot) and `1.5e16` (no exponent sign) as strings and `No` (nobelium) as `false`; the serde
//! emitter would print all three that way.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_yaml_ng::Value;

use crate::fitting::registry::{self as fittings, FITTINGS};
use crate::fitting::traits::YamlOut;
use crate::yaml_tree::{brief, ndarray, obj, At};

use super::pairtab;
use super::yaml_block::read_activation;
use super::{
    registry, Activation, DescriptorLayout, DescriptorSpec, DescriptorType, FittingSpec, Layer,
    Model, ModelSpec, Net, ParamLayout, Skip, TebdLayout,
};

/// The `.yaml` of a descriptor, held in its folder and found by its kind in the registry
/// ([`super::registry::Registered::yaml`]).
#[derive(Clone, Copy)]
pub(super) enum PartYaml {
    /// A descriptor of its own tensors.
    One(&'static DescriptorYaml),
    /// A composition (hybrid): a list of its parts' nodes.
    List(&'static ListYaml),
}

impl PartYaml {
    /// The `.yaml` of a descriptor that is not a composition.
    pub fn one(self) -> Option<&'static DescriptorYaml> {
        match self {
            PartYaml::One(y) => Some(y),
            PartYaml::List(_) => None,
        }
    }
}

/// A composition's `.yaml`: its parts, each read and written by its own [`DescriptorYaml`].
pub(super) struct ListYaml {
    /// The nodes of its parts in its node.
    pub parts: for<'a> fn(&At<'a>) -> Result<Vec<At<'a>>>,
    /// Its spec from its parts'.
    pub spec: fn(Vec<DescriptorSpec>) -> DescriptorSpec,
    /// Its tree and `model_def_script` section from its parts'.
    pub write: fn(Vec<Nodes>) -> Nodes,
}

/// A descriptor's node in the file and its section of `model_def_script`.
pub(super) type Nodes = (Value, Value);

/// A descriptor's own `.yaml`.
pub(super) struct DescriptorYaml {
    /// Its keys into a spec: the file's descriptor node, the kind its `type` names, the number
    /// of types.
    pub read_spec: fn(&At, DescriptorType, usize) -> Result<DescriptorSpec>,
    /// Its tensors into the parameter vector: its node, its spec, the model's layout and its
    /// index among a hybrid's parts (0 alone).
    pub read_params: fn(&At, &DescriptorSpec, &DescriptorLayout, usize, &mut [f64]) -> Result<()>,
    /// Its tree, and the `model_def_script` section that builds it, from the parameters and its
    /// davg/dstd rows.
    pub write: DescriptorTree,
    /// The nodes that hold its davg/dstd (under their `@variables`), each with its slots per
    /// type, in the order of dpw's rows ([`DescriptorSpec::stat_blocks`]): [`own_stats`] where
    /// they are the descriptor node's own.
    pub stat_nodes: StatNodes,
}

/// [`DescriptorYaml::stat_nodes`]: (its node, its spec) → the nodes and their slots per type.
pub(super) type StatNodes = for<'a> fn(&At<'a>, &DescriptorSpec) -> Result<Vec<(At<'a>, usize)>>;

/// [`DescriptorYaml::write`]: (spec, layout, index among a hybrid's parts, parameters,
/// davg/dstd rows, type map) → (file tree, model_def_script section).
pub(super) type DescriptorTree =
    fn(&DescriptorSpec, &DescriptorLayout, usize, &[f64], [&[f64]; 2], &[String]) -> Nodes;

/// Reads a DeePMD-kit v3 `.yaml` model: a `standard` model of a registered descriptor (or a
/// hybrid of se-family ones) and fitting, alone or in a `linear_ener` model with a pair table.
pub fn read_deepmd_yaml(path: &Path) -> Result<Model> {
    Ok(read_yaml_model(path)?.model)
}

/// A `.yaml` model and what of its file dpw evaluates but cannot train on.
pub struct YamlModel {
    pub model: Model,
    /// The fitting's `atom_ener` where it names an energy for some type: DeePMD-kit subtracts
    /// the fitting net's output on an all-zero descriptor from those types' atomic energies.
    /// For a fixed net that is a constant per type, taken off `model.bias` here (the same
    /// energies and forces); in training it moves with the net, which dpw does not model.
    pub atom_ener: Option<Vec<Option<f64>>>,
}

/// [`read_deepmd_yaml`], with what the file holds beyond the model dpw trains.
pub fn read_yaml_model(path: &Path) -> Result<YamlModel> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // PyYAML skips a UTF-8 byte-order mark; serde_yaml_ng would read a second document in it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let root: Value = serde_yaml_ng::from_str(text)
        .map_err(|e| incomplete(text, anyhow!(e)))
        .with_context(|| format!("{}: not valid YAML", path.display()))?;
    if let Some(key) = training_input_key(&root) {
        bail!(
            "{} is a training input (it has `{key}`), not a model: a DeePMD-kit .yaml model is \
             what `dp convert-backend` or `dpw freeze -o model.yaml` writes; train this input \
             with `dpw train`",
            path.display()
        );
    }
    model_from_tree(&root)
        .map_err(|e| incomplete(text, e))
        .with_context(|| format!("reading DeePMD-kit model {}", path.display()))
}

/// `e`, said to come from a truncated file where `text` lacks the `version` line DeePMD-kit
/// (and dpw) write last: a file cut short is still valid YAML more often than not, and would
/// otherwise be reported by the first key it lost.
fn incomplete(text: &str, e: anyhow::Error) -> anyhow::Error {
    if text.lines().any(|l| l.starts_with("version:")) {
        return e;
    }
    e.context(format!(
        "the file is truncated or incomplete: it ends at line {} without the `version` key \
         DeePMD-kit writes last",
        text.lines().count()
    ))
}

/// The key that makes `root` a training input (input.json's keys, here in YAML) rather than
/// a model.
fn training_input_key(root: &Value) -> Option<&'static str> {
    if root.get("training").is_some() {
        return Some("training");
    }
    let model = root.get("model")?;
    (model.get("@class").is_none() && model.get("fitting_net").is_some())
        .then_some("model.fitting_net")
}

/// Writes `model` as DeePMD-kit 3.2.0 would (`dp convert-backend x.pth out.yaml`). Atomic: the
/// text goes to a temporary file in the same directory, which is then renamed over `path`.
pub fn write_deepmd_yaml(model: &Model, path: &Path) -> Result<()> {
    let mut text = String::new();
    emit(&mut text, &model_to_tree(model), 0, true);
    super::file::write_atomic(path, text.as_bytes())
}

// ------------------------------------------------------------------------------------------------
// Reading

// The keys DeePMD-kit 3.2.0's dpmodel deserialisers accept in each node: the arguments of the
// class's constructor and the keys its `deserialize` takes out first.
#[rustfmt::skip]
const MODEL_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "descriptor", "fitting", "type_map",
    "atom_exclude_types", "pair_exclude_types", "rcond", "preset_out_bias", "data_stat_protect",
];
const MODEL_VARIABLES: &[&str] = &["out_bias", "out_std"];
/// Every descriptor dpw reads but a hybrid (which keeps its `list` and ignores the rest).
#[rustfmt::skip]
pub(super) const DESCRIPTOR_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "embeddings", "env_mat", "compress", "rcut",
    "rcut_smth", "sel", "ntypes", "neuron", "resnet_dt", "trainable", "exclude_types",
    "env_protection", "set_davg_zero", "activation_function", "precision", "type_map", "seed",
];
const DESCRIPTOR_VARIABLES: &[&str] = &["davg", "dstd", "avg", "data_avg", "std", "data_std"];
#[rustfmt::skip]
const FITTING_VARIABLES: &[&str] = &[
    "bias_atom_e", "fparam_avg", "fparam_inv_std", "aparam_avg", "aparam_inv_std", "case_embd",
    "scale", "default_fparam_tensor", "constant_matrix",
];
#[rustfmt::skip]
const COLLECTION_KEYS: &[&str] = &[
    "@class", "@version", "ndim", "ntypes", "network_type", "networks",
];
/// EmbeddingNet's and FittingNet's together.
#[rustfmt::skip]
pub(super) const NETWORK_KEYS: &[&str] = &[
    "@class", "@version", "layers", "in_dim", "out_dim", "neuron", "activation_function",
    "resnet_dt", "precision", "seed", "bias", "bias_out", "trainable",
];
#[rustfmt::skip]
pub(super) const LAYER_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "bias", "use_timestep", "activation_function", "resnet",
    "precision", "seed", "trainable",
];

pub(super) fn model_from_tree(root: &Value) -> Result<YamlModel> {
    let root = At {
        v: root,
        path: String::new(),
    };
    let m = root.key("model")?;
    m.expect("@class", &["Model"])?;
    if super::linear::yaml::is_linear_of_models(&m)? {
        return super::linear::yaml::read(&m);
    }
    if !matches!(
        m.opt("type").map(|t| t.str()).transpose()?,
        Some("zbl" | "linear")
    ) {
        return standard_model(&m);
    }
    // The table's file as the input named it, where the file keeps the input.
    let def = root.opt("model_def_script");
    let tab_file = def.as_ref().and_then(|d| {
        let s = d.opt("use_srtab").or_else(|| {
            let models = d.opt("models")?.seq().ok()?;
            models.into_iter().find_map(|x| x.opt("tab_file"))
        })?;
        s.str().ok()
    });
    let mixed = pairtab::yaml::read(&m, tab_file)?;
    let mut ym = standard_model(&mixed.dp)?;
    ensure!(
        ym.model.bias.iter().all(|&b| b == 0.0),
        "{}: the DP model's own out_bias and bias_atom_e must be 0 (as DeePMD-kit's training \
         leaves them; the combined model's out_bias is the model's bias)",
        mixed.dp.path
    );
    ensure!(
        ym.atom_ener.is_none(),
        "{}.fitting.atom_ener: not supported in a model with a pair table",
        mixed.dp.path
    );
    ym.model.bias = mixed.out_bias;
    ym.model.spec.short_range = Some(mixed.short_range);
    ym.model.check()?;
    Ok(ym)
}

/// A standard model (a descriptor and a fitting) at `m`.
pub(super) fn standard_model(m: &At) -> Result<YamlModel> {
    m.expect("@class", &["Model"])?;
    m.version(2..=2, Some(1))?;
    m.known(&[MODEL_KEYS])?;
    m.key("@variables")?.known(&[MODEL_VARIABLES])?;
    m.expect("type", &["standard"])?;
    m.expect_off("pair_exclude_types")?;
    let type_map: Vec<String> = (m.key("type_map")?.seq()?.iter())
        .map(|t| t.str().map(str::to_string))
        .collect::<Result<_>>()?;
    let nt = type_map.len();

    let d = m.key("descriptor")?;
    d.expect("@class", &["Descriptor"])?;
    // A composition's parts, each a descriptor of its own; else the descriptor alone.
    let kind = (d.opt("type").and_then(|t| t.str().ok())).and_then(DescriptorType::from_name);
    let (descriptor, items) = match kind.map(DescriptorType::yaml) {
        Some(PartYaml::List(l)) => {
            let items = (l.parts)(&d)?;
            let list = (items.iter())
                .map(|at| read_descriptor(at, &type_map))
                .collect::<Result<Vec<_>>>()?;
            ((l.spec)(list), items)
        }
        _ => (read_descriptor(&d, &type_map)?, vec![d]),
    };

    let f = m.key("fitting")?;
    f.expect("@class", &["Fitting"])?;
    let names: Vec<&str> = FITTINGS.iter().map(|r| r.names[0]).collect();
    f.expect("type", &names)?;
    let fitting_type = fittings::find(Some(f.key("type")?.str()?)).expect("a registered type");
    let output = (fitting_type.read_yaml)(&f, m, nt)?;
    let activation = match f.opt("activation_function") {
        Some(a) => read_activation(&a)?,
        None => Activation::Tanh,
    };
    // tot_ener_zero, layer_name and spin: DeePMD-kit's dpmodel raises NotImplementedError.
    for key in ["use_aparam_as_mask", "tot_ener_zero", "layer_name", "spin"] {
        f.expect_off(key)?;
    }
    // The fitting's exclude_types is DeePMD-kit's copy of the model's atom_exclude_types, which
    // only a tensor fitting reads.
    if !output.fitting().excludes_types() {
        m.expect_off("atom_exclude_types")?;
        f.expect_off("exclude_types")?;
    }
    same_type_map(&f, &type_map)?;
    // A mixed-type descriptor (DPA-1) gives the fitting `mixed_types: true` and one net.
    if !descriptor.is_mixed() {
        f.expect_off("mixed_types")?;
    }
    let count = |key| f.opt(key).map_or(Ok(0), |n| n.usize());
    let default_fparam = match f.opt("default_fparam") {
        Some(v) => Some(v.seq()?.iter().map(At::f64).collect::<Result<Vec<_>>>()?),
        None => None,
    };
    let fitting = FittingSpec {
        output,
        neuron: f.key("neuron")?.usizes()?,
        resnet_dt: f.key("resnet_dt")?.bool()?,
        activation,
        numb_fparam: count("numb_fparam")?,
        numb_aparam: count("numb_aparam")?,
        default_fparam,
        dim_case_embd: count("dim_case_embd")?,
    };
    let (nfp, nap) = (fitting.numb_fparam, fitting.numb_aparam);
    let spec = ModelSpec {
        type_map,
        descriptor,
        fitting,
        short_range: None,
        linear: None,
    };
    spec.check()?;
    let layout = ParamLayout::new(&spec);
    let mut params = vec![0.0; layout.len];

    let parts = spec.descriptor.parts();
    let dl = &layout.descriptor;
    let mut stats = Vec::new();
    for (k, (part, at)) in parts.iter().zip(&items).enumerate() {
        let y = part.kind.yaml().one().expect("a part is no composition");
        (y.read_params)(at, part, dl, k, &mut params)?;
        stats.push((y.stat_nodes)(at, part)?);
    }
    // One fitting net in a collection of ndim 0 for a mixed-type descriptor, else one per type.
    let fit_ndim = if spec.descriptor.is_mixed() { 0 } else { 1 };
    read_nets(
        &f.key("nets")?,
        &some(&layout.fitting.nets),
        fit_ndim,
        &mut params,
    )?;
    let (mut davg, mut dstd) = (Vec::new(), Vec::new());
    for (part, nodes) in parts.iter().zip(stats) {
        for (node, nnei) in nodes {
            let [a, s] = read_stats(&node, nt, nnei, env_columns(part.kind))?;
            davg.extend(a);
            dstd.extend(s);
        }
    }

    let fv = f.key("@variables")?;
    fv.known(&[FITTING_VARIABLES])?;
    let no = spec.fitting.dim_out();
    let bias_atom_e = fv.key("bias_atom_e")?.array(&[nt, no])?;
    let mv = m.key("@variables")?;
    let out_bias =
        mv.key("out_bias")?
            .array(&[1, nt, spec.fitting.output.fitting().label_width()])?;
    // A tensor's bias_atom_e is added to the nets' outputs, before gr: dpw's nets have none.
    ensure!(
        spec.fitting.output.tensor().is_none() || bias_atom_e.iter().all(|b| *b == 0.0),
        "{}.@variables.bias_atom_e: a non-zero bias of a dipole or polar fitting's nets is not \
         supported",
        f.path
    );
    // A property's atomic output is scaled by out_std (an energy's is not: see the writer).
    let out_std = match spec.fitting.output.fitting().keeps_out_std() {
        false => vec![],
        true => mv.key("out_std")?.array(&[1, nt, no])?,
    };
    // Adding a zero bias_atom_e (DeePMD's usual case) keeps out_bias bit-exact, even for -0.0.
    let mut bias: Vec<f64> = match spec.fitting.output.tensor() {
        Some(_) => out_bias,
        None => (out_bias.iter().zip(&bias_atom_e))
            .map(|(&o, &b)| if b == 0.0 { o } else { o + b })
            .collect(),
    };

    // DeePMD-kit's dpmodel (`GeneralFitting._call_common`, with `remove_vaccum_contribution`
    // from `InvarFitting`): where atom_ener names an energy for type t (or has no entry for
    // it), t's atomic energy is the net's output less its output on an all-zero descriptor;
    // with one net for all types (mixed_types), every type's is. The atom_ener values
    // themselves go nowhere. The net's output on zeros is a constant per type, so it is
    // taken off the bias: the same energies, the forces untouched.
    let atom_ener = read_atom_ener(&f)?;
    // Its net's output on an all-zero descriptor would then depend on each frame's parameters,
    // not a constant dpw can take off the bias.
    ensure!(
        atom_ener.is_none() || nfp + nap == 0,
        "{}.atom_ener with frame or atomic parameters is not supported",
        f.path
    );
    // DeePMD-kit's input statistics of the parameters: `*_avg` and `*_inv_std`, per parameter.
    let (mut fit_input_avg, mut fit_input_inv_std) = (Vec::new(), Vec::new());
    for (name, n) in [("fparam", nfp), ("aparam", nap)] {
        if n > 0 {
            fit_input_avg.extend(fv.key(&format!("{name}_avg"))?.array(&[n])?);
            fit_input_inv_std.extend(fv.key(&format!("{name}_inv_std"))?.array(&[n])?);
        }
    }
    let dim_case = spec.fitting.dim_case_embd;
    let case_embd = match dim_case {
        0 => Vec::new(),
        n => fv.key("case_embd")?.array(&[n])?,
    };
    if let Some(ae) = &atom_ener {
        for (t, b) in bias.iter_mut().enumerate() {
            if spec.descriptor.is_mixed() || ae.get(t).is_none_or(Option::is_some) {
                // DeePMD-kit's all-zero input keeps the case embedding.
                let net = layout.fitting.net(t);
                let mut x = vec![0.0; net.layers[0].nin - dim_case];
                x.extend_from_slice(&case_embd);
                *b -= net_output(net, &params, &x)[0];
            }
        }
    }

    let (bias, out_std) = match spec.fitting.output.property() {
        // Without distinguish_types every atom takes type 0's statistics.
        Some(p) if !p.distinguish_types => (type0_rows(&bias, nt), type0_rows(&out_std, nt)),
        _ => (bias, out_std),
    };
    let model = Model {
        spec,
        params,
        davg,
        dstd,
        bias,
        out_std,
        fit_input_avg,
        fit_input_inv_std,
        case_embd,
    };
    model.check()?;
    Ok(YamlModel { model, atom_ener })
}

/// The fitting's `atom_ener` where some entry is a number (DeePMD-kit: else it has none).
fn read_atom_ener(f: &At) -> Result<Option<Vec<Option<f64>>>> {
    let Some(at) = f.opt("atom_ener") else {
        return Ok(None);
    };
    let ae = (at.seq()?.iter())
        .map(|e| match e.v {
            Value::Null => Ok(None),
            _ => e.f64().map(Some),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ae.iter().any(Option::is_some).then_some(ae))
}

/// A net's output on input `x`, computed as DeePMD-kit's `NativeLayer` does layer by layer:
/// y = φ(x·W + b)·idt + skip(x).
fn net_output(net: &Net, p: &[f64], x: &[f64]) -> Vec<f64> {
    let mut x = x.to_vec();
    for l in &net.layers {
        let y = (0..l.nout)
            .map(|j| {
                let z = p[l.b + j]
                    + (0..l.nin)
                        .map(|i| x[i] * p[l.w + i * l.nout + j])
                        .sum::<f64>();
                let h = l.act.eval3(z).0;
                let y = l.idt.map_or(h, |o| h * p[o + j]);
                match l.skip {
                    Skip::None => y,
                    Skip::Identity => y + x[j],
                    Skip::Double => y + x[j % l.nin],
                }
            })
            .collect();
        x = y;
    }
    x
}

/// A section's own `type_map`, where it has one, must be the model's: DeePMD-kit keeps one per
/// section, and a file whose sections disagree cannot say which types its nets are for.
fn same_type_map(at: &At, type_map: &[String]) -> Result<()> {
    let Some(tm) = at.opt("type_map") else {
        return Ok(());
    };
    let names = (tm.seq()?.iter())
        .map(|t| t.str())
        .collect::<Result<Vec<_>>>()?;
    ensure!(
        names == type_map,
        "{}: {names:?} differs from the model's type_map {type_map:?}",
        tm.path
    );
    Ok(())
}

/// The keys of one descriptor that is no composition.
fn read_descriptor(d: &At, type_map: &[String]) -> Result<DescriptorSpec> {
    let nt = type_map.len();
    d.expect("@class", &["Descriptor"])?;
    same_type_map(d, type_map)?;
    if let Some(v) = d.opt("@variables") {
        v.known(&[DESCRIPTOR_VARIABLES])?;
    }
    // DeePMD-kit's registry finds a descriptor by its type or any alias.
    let names: Vec<&str> = (registry::DESCRIPTORS.iter())
        .filter(|r| r.yaml.one().is_some())
        .flat_map(|r| r.names.iter().copied())
        .collect();
    d.expect("type", &names)?;
    let kind = DescriptorType::from_name(d.key("type")?.str()?).expect("a registered name");
    let y = kind.yaml().one().expect("a descriptor of its own");
    (y.read_spec)(d, kind, nt)
}

/// A mixed-type block's one embedding net (`embeddings`) and, with tebd_input_mode strip, its
/// type net (`embeddings_strip`), each a collection of one net (ndim 0) under `d`.
pub(super) fn read_embeddings(
    d: &At,
    embed: &Net,
    strip: Option<&Net>,
    params: &mut [f64],
) -> Result<()> {
    read_nets(&d.key("embeddings")?, &[Some(embed)], 0, params)?;
    match (strip, d.opt("embeddings_strip")) {
        (Some(strip), Some(at)) => read_nets(&at, &[Some(strip)], 0, params),
        (Some(_), None) => bail!(
            "{}.embeddings_strip: missing (tebd_input_mode strip)",
            d.path
        ),
        (None, _) => d.expect_off("embeddings_strip"),
    }
}

/// The type embedding (`TypeEmbedNet`): one linear layer over the one-hot rows, into `params`.
pub(super) fn read_tebd(te: &At, t: &TebdLayout, params: &mut [f64]) -> Result<()> {
    te.expect("@class", &["TypeEmbedNet"])?;
    te.version(1..=2, Some(1))?;
    te.expect_off("use_econf_tebd")?;
    let net = te.key("embedding")?;
    net.version(1..=2, Some(1))?;
    net.known(&[NETWORK_KEYS])?;
    let layers = net.seq_of("layers", 1, "layer (neuron [tebd_dim])")?;
    let l = &layers[0];
    l.version(1..=2, Some(1))?;
    l.known(&[LAYER_KEYS])?;
    l.expect("activation_function", &["Linear", "linear", "none"])?;
    if t.skip != Skip::None {
        let resnet = l.key("resnet")?;
        ensure!(resnet.bool()?, "{}: unsupported value false", resnet.path);
    }
    let vars = l.key("@variables")?;
    let w = vars.key("w")?.array(&[t.ntypes, t.dim])?;
    params[t.w..t.w + w.len()].copy_from_slice(&w);
    match (t.b, vars.opt("b")) {
        (Some(off), Some(b)) => params[off..off + t.dim].copy_from_slice(&b.array(&[t.dim])?),
        (None, None) => {}
        (Some(_), None) => bail!("{}.b: missing (use_tebd_bias is true)", vars.path),
        (None, Some(_)) => bail!("{}.b: expected null (use_tebd_bias is false)", vars.path),
    }
    vars.expect_off("idt")?;
    Ok(())
}

/// [`DescriptorYaml::stat_nodes`] of a descriptor whose node holds its davg/dstd itself.
pub(super) fn own_stats<'a>(d: &At<'a>, spec: &DescriptorSpec) -> Result<Vec<(At<'a>, usize)>> {
    let node = At {
        v: d.v,
        path: d.path.clone(),
    };
    Ok(vec![(node, spec.nnei())])
}

/// One node's davg and dstd `[nt][nnei][ncol]`, one row of 4 per type.
///
/// DeePMD keeps one davg/dstd row per neighbour slot; its statistics make them equal per type,
/// and dpw stores only one. Refuse files where they differ rather than silently change them.
/// se_e2_r's rows are its radial column alone: dpw's rows are 4 wide for every descriptor
/// (one env_mat), with the mean 0 and std 1 of an unused column.
fn read_stats(d: &At, nt: usize, nnei: usize, ncol: usize) -> Result<[Vec<f64>; 2]> {
    let dv = d.key("@variables")?;
    let mut stats = [Vec::new(), Vec::new()];
    for ((name, out), unused) in ["davg", "dstd"].iter().zip(&mut stats).zip([0.0, 1.0]) {
        let at = dv.key(name)?;
        let full = at.array(&[nt, nnei, ncol])?;
        for t in 0..nt {
            let row0 = &full[t * nnei * ncol..t * nnei * ncol + ncol];
            for j in 1..nnei {
                let row = &full[(t * nnei + j) * ncol..(t * nnei + j) * ncol + ncol];
                let differs =
                    (row.iter().zip(row0)).any(|(a, b)| (a - b).abs() > 1e-12 * b.abs().max(1.0));
                ensure!(
                    !differs,
                    "{}: rows of type {t} differ (slot {j}: {row:?} vs slot 0: {row0:?}); dpw needs one row per type",
                    at.path
                );
            }
            out.extend_from_slice(row0);
            out.resize(out.len() + 4 - ncol, unused);
        }
    }
    Ok(stats)
}

pub(super) fn some(nets: &[Net]) -> Vec<Option<&Net>> {
    nets.iter().map(Some).collect()
}

/// Copies one `NetworkCollection` into `params`, checking every layer against the layout; the
/// nets given as `None` are skipped. `want_ndim` is 1 for one net per type (fitting, or
/// embedding with type_one_side) and 2 for one per type pair, stored at flat index ti + tj*nt,
/// which is how the layout orders them; 0 for one net of a mixed-type descriptor. A hidden
/// layer's activation is the layout's (the fitting's, DPA-2's repinit's, else tanh).
pub(super) fn read_nets(
    coll: &At,
    nets: &[Option<&Net>],
    want: usize,
    params: &mut [f64],
) -> Result<()> {
    coll.expect("@class", &["NetworkCollection"])?;
    coll.version(1..=1, Some(1))?;
    coll.known(&[COLLECTION_KEYS])?;
    // EmbeddingNet reads versions 1 and 2, FittingNet only 1.
    let fitting = coll.opt("network_type").and_then(|t| t.v.as_str()) == Some("fitting_network");
    let net_versions = if fitting { 1..=1 } else { 1..=2 };
    let ndim = coll.key("ndim")?;
    ensure!(
        ndim.usize()? == want,
        "{}: expected {want}, found {}",
        ndim.path,
        brief(ndim.v)
    );
    let networks = coll.seq_of("networks", nets.len(), "networks")?;
    for (net, at) in nets.iter().zip(&networks) {
        let Some(net) = net else { continue };
        at.version(net_versions.clone(), Some(1))?;
        at.known(&[NETWORK_KEYS])?;
        let layers = at.seq_of("layers", net.layers.len(), "layers")?;
        for (i, (l, at)) in net.layers.iter().zip(&layers).enumerate() {
            at.version(1..=2, Some(1))?;
            at.known(&[LAYER_KEYS])?;
            // Hidden layers have width-decided skips; the fitting output is linear.
            if !(fitting && i + 1 == layers.len()) {
                let a = at.key("activation_function")?;
                ensure!(
                    read_activation(&a)? == l.act,
                    "{}: expected {:?}, found {}",
                    a.path,
                    l.act.name(),
                    brief(a.v)
                );
                let resnet = at.key("resnet")?;
                ensure!(resnet.bool()?, "{}: unsupported value false", resnet.path);
            } else {
                at.expect("activation_function", &["none", "linear"])?;
                at.expect_off("resnet")?;
            }
            let vars = at.key("@variables")?;
            let w = vars.key("w")?.array(&[l.nin, l.nout])?;
            params[l.w..l.w + w.len()].copy_from_slice(&w);
            let Some(b) = vars.opt("b") else {
                bail!("{}.b: missing (dpw needs a bias)", vars.path)
            };
            params[l.b..l.b + l.nout].copy_from_slice(&b.array(&[l.nout])?);
            match (l.idt, vars.opt("idt")) {
                (Some(off), Some(idt)) => {
                    params[off..off + l.nout].copy_from_slice(&idt.array(&[l.nout])?)
                }
                (None, None) => {}
                (Some(_), None) => bail!(
                    "{}.idt: expected shape [{}] (resnet_dt), found null",
                    vars.path,
                    l.nout
                ),
                (None, Some(_)) => bail!(
                    "{}.idt: expected null (no resnet_dt timestep on this layer), found an array",
                    vars.path
                ),
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Writing

/// One `NetworkCollection` as DeePMD serializes it: embedding nets (`ndim` 1 or 2) or the
/// fitting nets (`ndim` 1; hidden layers, then a linear output layer).
pub(super) struct Nets<'a> {
    /// `None`: a net DeePMD-kit keeps and dpw has not (se_e3's, `se::yaml::file_nets`),
    /// written as zeros.
    pub nets: Vec<Option<&'a Net>>,
    pub ndim: usize,
    pub fitting: bool,
    pub neuron: &'a [usize],
    pub resnet_dt: bool,
    /// The hidden layers' activation (the fitting's, DPA-2's repinit's, else tanh).
    pub activation: &'a str,
}

pub(super) fn nets_tree(n: Nets, p: &[f64], nt: usize) -> Value {
    let layer = |(i, l): (usize, &Layer), net: &Net, p: &[f64]| {
        // Every layer is hidden but a fitting net's last, its linear output.
        let hidden = !(n.fitting && i + 1 == net.layers.len());
        obj! {
            "@class" => "Layer", "@version" => 2,
            "@variables" => obj! {
                "w" => ndarray(&[l.nin, l.nout], &p[l.w..]),
                "b" => ndarray(&[l.nout], &p[l.b..]),
                "idt" => l.idt.map_or(Value::Null, |o| ndarray(&[l.nout], &p[o..])),
            },
            "activation_function" => if hidden { n.activation } else { "none" },
            "bias" => true, "precision" => "float64", "resnet" => hidden, "trainable" => true,
            "use_timestep" => l.idt.is_some(),
        }
    };
    let template = n
        .nets
        .iter()
        .flatten()
        .next()
        .expect("a collection has a net");
    let zeros = vec![0.0; p.len()];
    let network = |net: &Option<&Net>| {
        let (net, p) = net.map_or((*template, &zeros[..]), |net| (net, p));
        let mut v = obj! {
            "@version" => if n.fitting { 1 } else { 2 },
            "activation_function" => n.activation, "in_dim" => net.layers[0].nin,
            "layers" => net.layers.iter().enumerate().map(|l| layer(l, net, p)).collect::<Vec<_>>(),
            "neuron" => n.neuron, "precision" => "float64", "resnet_dt" => n.resnet_dt,
        };
        let extra = if n.fitting {
            obj! { "@class" => "FittingNetwork", "bias_out" => true, "out_dim" => 1 }
        } else {
            obj! { "@class" => "EmbeddingNetwork", "bias" => true }
        };
        if let (Value::Mapping(m), Value::Mapping(e)) = (&mut v, extra) {
            m.extend(e);
        }
        v
    };
    obj! {
        "@class" => "NetworkCollection", "@version" => 1, "ndim" => n.ndim, "ntypes" => nt,
        "network_type" => if n.fitting { "fitting_network" } else { "embedding_network" },
        "networks" => n.nets.iter().map(network).collect::<Vec<_>>(),
    }
}

/// One embedding net as a collection of ndim 0: a mixed-type block's `embeddings` or
/// `embeddings_strip`, its hidden layers `activation`.
pub(super) fn one_net_tree(
    net: &Net,
    neuron: &[usize],
    resnet_dt: bool,
    activation: &str,
    p: &[f64],
    nt: usize,
) -> Value {
    let n = Nets {
        nets: vec![Some(net)],
        ndim: 0,
        fitting: false,
        neuron,
        resnet_dt,
        activation,
    };
    nets_tree(n, p, nt)
}

fn model_to_tree(model: &Model) -> Value {
    let (node, model_def_script) = match &model.spec.linear {
        Some(l) => {
            let members = model.members().iter().map(model_nodes).collect();
            let nt = model.spec.ntypes();
            let out_bias = ndarray(&[1, nt, 1], &model.bias);
            super::linear::yaml::write(members, &l.weights, out_bias, &model.spec.type_map)
        }
        None => model_nodes(model),
    };
    // The provenance keys of DeePMD's `save_dp_model`, but naming dpw as the writer.
    obj! {
        "backend" => "dpw",
        "model" => node,
        "model_def_script" => model_def_script,
        "software" => "dpw",
        "time" => utc_now(),
        "version" => env!("CARGO_PKG_VERSION"),
    }
}

/// The model node of a model of one DP model (with a pair table, the mixed model's), and its
/// input's model section.
fn model_nodes(model: &Model) -> Nodes {
    let spec = &model.spec;
    let (d, fit) = (&spec.descriptor, &spec.fitting);
    let nt = spec.ntypes();
    let layout = model.layout();
    let p = &model.params;
    let type_map = spec.type_map.as_slice();
    let none: &[usize] = &[];
    // Each part's tree (file and model_def_script), then a composition's of them.
    let mut stat_at = 0;
    let mut trees: Vec<Nodes> = (d.parts().iter().enumerate())
        .map(|(k, part)| {
            let rows = stat_at..stat_at + 4 * nt * part.stat_blocks();
            stat_at = rows.end;
            let stats = [&model.davg[rows.clone()], &model.dstd[rows]];
            let y = part.kind.yaml().one().expect("a part is no composition");
            (y.write)(part, &layout.descriptor, k, p, stats, type_map)
        })
        .collect();
    let (descriptor, def_descriptor) = match d.kind.yaml() {
        PartYaml::List(l) => (l.write)(trees),
        PartYaml::One(_) => trees.pop().expect("one part"),
    };

    let mixed = d.is_mixed();
    let nets = Nets {
        nets: some(&layout.fitting.nets),
        // One net for every type (a collection of ndim 0) for a mixed-type descriptor.
        ndim: if mixed { 0 } else { 1 },
        fitting: true,
        neuron: &fit.neuron,
        resnet_dt: fit.resnet_dt,
        activation: &fit.activation.name(),
    };
    // The parameters' statistics, DeePMD-kit's arrays of numb_fparam / numb_aparam (null
    // where there are none).
    let (nfp, nap) = (fit.numb_fparam, fit.numb_aparam);
    let stat = |from: usize, n: usize, of: &[f64]| match n {
        0 => Value::Null,
        n => ndarray(&[n], &of[from..from + n]),
    };
    let (avg, inv_std) = (&model.fit_input_avg, &model.fit_input_inv_std);
    let default_fparam = fit
        .default_fparam
        .as_ref()
        .map_or(Value::Null, |v| v[..].into());
    let no = fit.dim_out();
    // dpw keeps the whole energy bias in out_bias (as DeePMD v3 training does); bias_atom_e is 0.
    let mut fitting = obj! {
        "@class" => "Fitting", "@version" => 4,
        "@variables" => obj! {
            "aparam_avg" => stat(nfp, nap, avg), "aparam_inv_std" => stat(nfp, nap, inv_std),
            "bias_atom_e" => ndarray(&[nt, no], &vec![0.0; nt * no]),
            "case_embd" => stat(0, fit.dim_case_embd, &model.case_embd),
            "fparam_avg" => stat(0, nfp, avg),
            "fparam_inv_std" => stat(0, nfp, inv_std),
        },
        "activation_function" => fit.activation.name(), "atom_ener" => none,
        "default_fparam" => default_fparam.clone(),
        "dim_case_embd" => fit.dim_case_embd, "dim_descrpt" => spec.dim_descrpt(), "dim_out" => 1,
        "exclude_types" => none, "layer_name" => Value::Null, "mixed_types" => mixed,
        "nets" => nets_tree(nets, p, nt), "neuron" => &fit.neuron[..], "ntypes" => nt,
        "numb_aparam" => nap, "numb_fparam" => nfp, "precision" => "float64", "rcond" => Value::Null,
        "resnet_dt" => fit.resnet_dt, "spin" => Value::Null, "tot_ener_zero" => false,
        "trainable" => vec![true; fit.neuron.len() + 1], "type" => "ener", "type_map" => type_map,
        "use_aparam_as_mask" => false, "var_name" => "energy",
    };

    // The `model` section of a DeePMD input that builds this model: `dp convert-backend` to
    // `.pth` requires it (and stores it), and DeePMD rebuilds the model from it on the way back.
    let mut model_def_script = obj! {
        "type_map" => type_map,
        "descriptor" => def_descriptor,
        "fitting_net" => obj! {
            "type" => "ener", "neuron" => &fit.neuron[..], "resnet_dt" => fit.resnet_dt,
            "activation_function" => fit.activation.name(), "precision" => "float64",
        },
    };

    // The fitting's own keys, and the model's out_std.
    let out_std = fit.output.fitting().write_yaml(YamlOut {
        fitting: &mut fitting,
        model_def: &mut model_def_script,
        ntypes: nt,
        out_std: &model.out_std,
    });

    if nfp + nap > 0 {
        let f = &mut model_def_script["fitting_net"];
        f["numb_fparam"] = nfp.into();
        f["numb_aparam"] = nap.into();
        f["default_fparam"] = default_fparam;
    }
    if fit.dim_case_embd > 0 {
        model_def_script["fitting_net"]["dim_case_embd"] = fit.dim_case_embd.into();
    }

    let excluded = fit.output.fitting().excluded_types();
    let out_bias = ndarray(&[1, nt, fit.output.fitting().label_width()], &model.bias);
    let mut standard = obj! {
            "@class" => "Model", "@version" => 2,
            "@variables" => obj! { "out_bias" => out_bias.clone(), "out_std" => out_std },
            "atom_exclude_types" => excluded, "descriptor" => descriptor, "fitting" => fitting,
            "pair_exclude_types" => none, "preset_out_bias" => Value::Null, "rcond" => Value::Null,
            "type" => "standard", "type_map" => type_map,
    };
    if let Some(sr) = &spec.short_range {
        standard = pairtab::yaml::write(sr, standard, out_bias, type_map);
        model_def_script = pairtab::yaml::def_script(sr, model_def_script, type_map);
    }
    (standard, model_def_script)
}

/// Every type's row `[ntypes][k]` replaced by type 0's.
fn type0_rows(a: &[f64], nt: usize) -> Vec<f64> {
    let k = a.len() / nt.max(1);
    a[..k].repeat(nt)
}

/// The type embedding as DeePMD-kit serialises it (`TypeEmbedNet`: one linear layer over the
/// one-hot rows, with its width-decided skip).
pub(super) fn tebd_tree(t: &TebdLayout, bias: bool, p: &[f64], type_map: &[String]) -> Value {
    let nt = type_map.len();
    let tebd_layer = obj! {
        "@class" => "Layer", "@version" => 2,
        "@variables" => obj! {
            "w" => ndarray(&[t.ntypes, t.dim], &p[t.w..]),
            "b" => t.b.map_or(Value::Null, |o| ndarray(&[t.dim], &p[o..])),
            "idt" => Value::Null,
        },
        "activation_function" => "Linear", "bias" => bias, "precision" => "float64",
        "resnet" => true, "trainable" => true, "use_timestep" => false,
    };
    let tebd_dim = [t.dim];
    obj! {
        "@class" => "TypeEmbedNet", "@version" => 2, "activation_function" => "Linear",
        "embedding" => obj! {
            "@class" => "EmbeddingNetwork", "@version" => 2, "activation_function" => "Linear",
            "bias" => bias, "in_dim" => nt, "layers" => vec![tebd_layer],
            "neuron" => &tebd_dim[..], "precision" => "float64", "resnet_dt" => false,
        },
        "neuron" => &tebd_dim[..], "ntypes" => nt, "padding" => true, "precision" => "float64",
        "resnet_dt" => false, "trainable" => true, "type_map" => type_map,
        "use_econf_tebd" => false, "use_tebd_bias" => bias,
    }
}

/// A block's `@variables` davg and dstd as DeePMD-kit keeps them, `[nt][nnei][ncol]`: dpw's one
/// row `[nt][4]` per type repeated for every neighbour slot, of the descriptor's own columns.
pub(super) fn stats_tree(stats: [&[f64]; 2], nt: usize, nnei: usize, ncol: usize) -> Value {
    let per_slot = |rows: &[f64]| -> Vec<f64> {
        let row = |t: usize| rows[t * 4..t * 4 + ncol].iter().copied();
        (0..nt)
            .flat_map(|t| (0..nnei).flat_map(move |_| row(t)))
            .collect()
    };
    let [davg, dstd] = stats;
    obj! {
        "davg" => ndarray(&[nt, nnei, ncol], &per_slot(davg)),
        "dstd" => ndarray(&[nt, nnei, ncol], &per_slot(dstd)),
    }
}

/// How many columns of the environment rows a descriptor's davg/dstd cover in DeePMD-kit's files.
pub(super) fn env_columns(kind: DescriptorType) -> usize {
    let n = kind.registered().env_columns;
    assert!(n > 0, "a hybrid's parts have their own");
    n
}

/// Now in UTC as Python's `str(datetime.now(timezone.utc))`: `2026-11-22 04:59:50.455372+00:00`.
fn utc_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (days, secs) = ((now.as_secs() / 86400) as i64, now.as_secs() % 86400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:06}+00:00",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        now.subsec_micros()
    )
}

// ------------------------------------------------------------------------------------------------
// Emitting, in PyYAML's `safe_dump` block style: sorted keys, sequences inside mappings not
// indented, `- - x` for nested lists.

/// Writes `v` starting at column `col`; `fresh` says the cursor is at the start of a line (else
/// it is right after `- `, where the first entry continues the line).
fn emit(out: &mut String, v: &Value, col: usize, fresh: bool) {
    let pad = |out: &mut String, first: bool| {
        if !first || fresh {
            out.extend(std::iter::repeat_n(' ', col));
        }
    };
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            let mut entries: Vec<_> = m.iter().collect();
            entries.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
            for (i, (k, val)) in entries.into_iter().enumerate() {
                pad(out, i == 0);
                out.push_str(&scalar(k));
                out.push(':');
                match val {
                    Value::Mapping(c) if !c.is_empty() => {
                        out.push('\n');
                        emit(out, val, col + 2, true);
                    }
                    Value::Sequence(c) if !c.is_empty() => {
                        out.push('\n');
                        emit(out, val, col, true);
                    }
                    _ => {
                        out.push(' ');
                        out.push_str(&scalar(val));
                        out.push('\n');
                    }
                }
            }
        }
        Value::Sequence(s) if !s.is_empty() => {
            for (i, item) in s.iter().enumerate() {
                pad(out, i == 0);
                out.push_str("- ");
                match item {
                    Value::Mapping(c) if !c.is_empty() => emit(out, item, col + 2, false),
                    Value::Sequence(c) if !c.is_empty() => emit(out, item, col + 2, false),
                    _ => {
                        out.push_str(&scalar(item));
                        out.push('\n');
                    }
                }
            }
        }
        _ => {
            pad(out, true);
            out.push_str(&scalar(v));
            out.push('\n');
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if n.is_f64() => float(n.as_f64().expect("is f64")),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Sequence(_) => "[]".into(),
        Value::Mapping(_) => "{}".into(),
        Value::Tagged(_) => unreachable!("the writer builds no tagged values"),
    }
}

/// Shortest digits that parse back to the same f64 (Rust's `{:?}`), spelled so PyYAML's YAML 1.1
/// float pattern matches: a dot in the mantissa and a signed exponent (`1.0e-05`, `1.5e+16`).
/// Rust and Python switch to exponents at the same magnitudes (below 1e-4, from 1e16 on).
fn float(x: f64) -> String {
    if x.is_nan() {
        return ".nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    let s = format!("{x:?}");
    let Some((mant, exp)) = s.split_once('e') else {
        return s; // `{:?}` always prints a fractional part here: `6.0`, `-0.5`
    };
    let mut out = String::with_capacity(s.len() + 3);
    out.push_str(mant);
    if !mant.contains('.') {
        out.push_str(".0");
    }
    // Python's repr, which PyYAML uses, also pads the exponent to two digits: `1e-05`.
    let (sign, digits) = exp.strip_prefix('-').map_or(('+', exp), |d| ('-', d));
    let _ = write!(out, "e{sign}{digits:0>2}");
    out
}

/// Plain where PyYAML reads the text back as the same string, else quoted: single quotes like
/// PyYAML for printable text, JSON's double quotes (valid YAML) for anything else.
fn string(s: &str) -> String {
    const RESERVED: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
        "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL",
    ];
    let plain = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        && !RESERVED.contains(&s);
    if plain {
        s.into()
    } else if s.chars().all(|c| (' '..='~').contains(&c)) {
        format!("'{}'", s.replace('\'', "''"))
    } else {
        serde_json::to_string(s).expect("strings always serialize")
    }
}

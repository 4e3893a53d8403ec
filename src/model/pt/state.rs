//! One head of a state dict, with its `model_params`, as the serialization tree DeePMD-kit's
//! `model.serialize()` gives (`dp convert-backend model.pt model.yaml`, docs/deepmd-spec.md §14
//! and §21.1), so that the `.yaml` reader takes it unchanged. What comes from where: tensors
//! from the state dict under `model.<head>.`, the hyper-parameters from `model_params` (which
//! training normalized, every default written out), the rest DeePMD-kit's constants. Checked
//! key by key against DeePMD-kit 3.2.0's own serialization of every head in
//! tests/reference/multitask (tests/pt_reader.rs).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use serde_yaml_ng::Value;

use crate::yaml_tree::{ndarray, obj};

use super::archive::{Array, StateDict};

/// The descriptors this mapping covers, by the names `model_params` may give them.
pub(super) const DESCRIPTORS: &str = "se_e2_a (se_a), se_atten (dpa1), se_atten_v2";

/// The tree of head `head` (the state dict's `model.<head>.` keys), whose section of the input
/// is `mp`. `refuse` turns an unmapped descriptor, fitting or model type into the error that
/// says what to do instead.
pub(super) fn head_tree(
    sd: &StateDict,
    head: &str,
    mp: &Json,
    refuse: &dyn Fn(String) -> anyhow::Error,
) -> Result<Value> {
    let s = State {
        sd,
        prefix: format!("model.{head}."),
    };
    let model_type = opt_str(mp, "type")?.unwrap_or("standard");
    if model_type != "standard" {
        return Err(refuse(format!("the model type `{model_type}`")));
    }
    // A standard model's options that make it another model (DeePMD-kit's get_model).
    for key in ["use_srtab", "spin"] {
        if mp.get(key).is_some_and(|v| !v.is_null()) {
            return Err(refuse(format!("a model with `{key}`")));
        }
    }
    let d = key(mp, "descriptor")?;
    let dtype = opt_str(d, "type")?.unwrap_or("se_e2_a");
    let type_map = key(mp, "type_map")?;
    let nt = type_map
        .as_array()
        .ok_or_else(|| anyhow!("model_params.type_map: expected a list"))?
        .len();
    let (descriptor, mixed) = match dtype {
        "se_e2_a" | "se_a" => (se_e2_a(&s, d, type_map)?, false),
        "se_atten" | "dpa1" => (dpa1(&s, d, type_map, false)?, true),
        "se_atten_v2" => (dpa1(&s, d, type_map, true)?, true),
        other => return Err(refuse(format!("the descriptor `{other}`"))),
    };
    let f = key(mp, "fitting_net")?;
    let ftype = opt_str(f, "type")?.unwrap_or("ener");
    if ftype != "ener" {
        return Err(refuse(format!("the fitting `{ftype}`")));
    }
    let fitting = ener_fitting(&s, f, type_map, nt, mixed, mp)?;

    let mut variables = serde_yaml_ng::Mapping::new();
    if let Some(d) = s
        .get("min_nbor_dist")?
        .and_then(|a| a.data.first().copied())
    {
        variables.insert("min_nbor_dist".into(), d.into());
    }
    let model = obj! {
        "@class" => "Model", "@version" => 2,
        "@variables" => obj! {
            "out_bias" => s.need("atomic_model.out_bias")?,
            "out_std" => s.need("atomic_model.out_std")?,
        },
        "atom_exclude_types" => or(mp, "atom_exclude_types", Json::Array(vec![]))?,
        "descriptor" => descriptor, "fitting" => fitting,
        "pair_exclude_types" => or(mp, "pair_exclude_types", Json::Array(vec![]))?,
        "preset_out_bias" => preset_out_bias(mp.get("preset_out_bias"))?,
        "rcond" => or(mp, "rcond", Json::Null)?,
        "type" => "standard", "type_map" => yaml(type_map)?,
    };
    Ok(obj! {
        "@variables" => Value::Mapping(variables),
        "backend" => "PyTorch",
        "model" => model,
        "model_def_script" => yaml(mp)?,
    })
}

/// The tensors of one head.
struct State<'a> {
    sd: &'a StateDict,
    /// `model.<head>.`
    prefix: String,
}

impl State<'_> {
    fn name(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    fn get(&self, rel: &str) -> Result<Option<Array>> {
        self.sd.get(&self.name(rel))
    }

    /// The `np.ndarray` node of tensor `rel`, or null where the state dict has none (DeePMD-kit
    /// serializes an absent buffer, `fparam_avg` without fparam, as None).
    fn node(&self, rel: &str) -> Result<Value> {
        Ok(self.get(rel)?.map_or(Value::Null, |a| array(&a)))
    }

    fn need(&self, rel: &str) -> Result<Value> {
        Ok(array(&self.sd.need(&self.name(rel))?))
    }

    /// How many items a ModuleList under `rel` (ending in `.`) has: one past the largest index.
    fn count(&self, rel: &str) -> usize {
        let p = self.name(rel);
        (self.sd.names_under(&p))
            .filter_map(|n| n[p.len()..].split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |k| k + 1)
    }

    /// The precision DeePMD-kit writes for a module: its tensors' dtype (what its
    /// `RESERVED_PRECISION_DICT[prec]` gives).
    fn precision(&self, rel: &str) -> Result<&'static str> {
        Ok(self.sd.meta(&self.name(rel))?.1)
    }

    /// One `MLPLayer` under `rel`: `x @ matrix + bias`, times `idt` where it has one.
    fn layer(&self, rel: &str, activation: &str, resnet: bool, trainable: bool) -> Result<Value> {
        let w = self.sd.need(&self.name(&format!("{rel}matrix")))?;
        let b = self.node(&format!("{rel}bias"))?;
        let idt = self.node(&format!("{rel}idt"))?;
        Ok(obj! {
            "@class" => "Layer", "@version" => 2,
            "activation_function" => activation, "bias" => !b.is_null(),
            "precision" => w.dtype, "resnet" => resnet,
            "trainable" => trainable, "use_timestep" => !idt.is_null(),
            "@variables" => obj! { "w" => array(&w), "b" => b, "idt" => idt },
        })
    }

    /// An `EmbeddingNet` or `FittingNet` under `rel` (`….networks.k.`): hidden layers with
    /// `n.activation` and width-decided skips; a fitting net's last layer linear.
    fn network(&self, rel: &str, n: &NetKeys) -> Result<Value> {
        let nl = self.count(&format!("{rel}layers."));
        if nl == 0 {
            bail!(
                "the state dict has no tensor {}layers.0.matrix",
                self.name(rel)
            );
        }
        let layers = (0..nl)
            .map(|l| {
                let last = n.fitting && l + 1 == nl;
                let act = if last { "none" } else { &n.activation };
                self.layer(&format!("{rel}layers.{l}."), act, !last, n.trainable)
            })
            .collect::<Result<Vec<_>>>()?;
        let (shape, dtype) = self.sd.meta(&self.name(&format!("{rel}layers.0.matrix")))?;
        let mut net = obj! {
            "activation_function" => n.activation.as_str(), "in_dim" => shape.first().copied().unwrap_or(0),
            "layers" => layers, "neuron" => n.neuron.clone(), "precision" => dtype,
            "resnet_dt" => n.resnet_dt.clone(),
        };
        let extra = if n.fitting {
            obj! { "@class" => "FittingNetwork", "@version" => 1, "bias_out" => true, "out_dim" => 1 }
        } else {
            obj! { "@class" => "EmbeddingNetwork", "@version" => 2, "bias" => n.bias }
        };
        merge(&mut net, extra);
        Ok(net)
    }

    /// A `NetworkCollection` under `rel` (`…filter_layers.`): its nets in the order of their
    /// flat index, which is the state dict's `networks.k`.
    fn collection(&self, rel: &str, ndim: usize, nt: usize, n: &NetKeys) -> Result<Value> {
        let count = self.count(&format!("{rel}networks."));
        if count == 0 {
            bail!(
                "the state dict has no tensor under {}networks.",
                self.name(rel)
            );
        }
        let networks = (0..count)
            .map(|k| self.network(&format!("{rel}networks.{k}."), n))
            .collect::<Result<Vec<_>>>()?;
        Ok(obj! {
            "@class" => "NetworkCollection", "@version" => 1, "ndim" => ndim, "ntypes" => nt,
            "network_type" => if n.fitting { "fitting_network" } else { "embedding_network" },
            "networks" => networks,
        })
    }
}

/// What a net's serialization takes from outside its tensors.
struct NetKeys {
    fitting: bool,
    activation: String,
    resnet_dt: Value,
    neuron: Value,
    trainable: bool,
    /// An embedding net's `bias` key (a fitting net always has `bias_out`).
    bias: bool,
}

/// `DescrptSeA.serialize`.
fn se_e2_a(s: &State, d: &Json, type_map: &Json) -> Result<Value> {
    let p = "atomic_model.descriptor.sea.";
    let nt = type_map.as_array().map_or(0, Vec::len);
    let n = embedding_keys(d)?;
    let ndim = if bool_key(d, "type_one_side")? { 1 } else { 2 };
    Ok(obj! {
        "@class" => "Descriptor", "@version" => 2, "type" => "se_e2_a",
        "@variables" => obj! {
            "davg" => s.need(&format!("{p}mean"))?, "dstd" => s.need(&format!("{p}stddev"))?,
        },
        "activation_function" => n.activation.clone(), "axis_neuron" => val(d, "axis_neuron")?,
        "embeddings" => s.collection(&format!("{p}filter_layers."), ndim, nt, &n)?,
        "env_mat" => env_mat(d)?, "env_protection" => val(d, "env_protection")?,
        "exclude_types" => val(d, "exclude_types")?, "neuron" => n.neuron.clone(),
        "precision" => s.precision(&format!("{p}mean"))?, "rcut" => val(d, "rcut")?,
        "rcut_smth" => val(d, "rcut_smth")?, "resnet_dt" => n.resnet_dt.clone(),
        "sel" => val(d, "sel")?, "set_davg_zero" => val(d, "set_davg_zero")?,
        "spin" => Value::Null,
        // DeePMD-kit's se_e2_a writes true whatever the input said.
        "trainable" => true, "type_map" => yaml(type_map)?,
        "type_one_side" => val(d, "type_one_side")?,
    })
}

/// `DescrptDPA1.serialize` (`type: dpa1`), or `DescrptSeAttenV2.serialize` with `v2`: always
/// strip and smooth, and neither key written.
fn dpa1(s: &State, d: &Json, type_map: &Json, v2: bool) -> Result<Value> {
    let p = "atomic_model.descriptor.se_atten.";
    let nt = type_map.as_array().map_or(0, Vec::len);
    let n = embedding_keys(d)?;
    // The deprecated stripped_type_embedding, where set, decides the mode.
    let strip = v2
        || match d.get("stripped_type_embedding").and_then(Json::as_bool) {
            Some(s) => s,
            None => opt_str(d, "tebd_input_mode")?.unwrap_or("concat") == "strip",
        };
    // DeePMD-kit: null means 1e-5.
    let ln_eps = match d.get("ln_eps") {
        None | Some(Json::Null) => 1e-5.into(),
        Some(e) => yaml(e)?,
    };
    let sel: Vec<u64> = match key(d, "sel")? {
        Json::Array(a) => a.iter().filter_map(Json::as_u64).collect(),
        v => vec![v
            .as_u64()
            .ok_or_else(|| anyhow!("model_params.descriptor.sel: expected a count"))?],
    };
    let nnei: u64 = sel.iter().sum();
    let m1 = (n.neuron.as_sequence())
        .and_then(|v| v.last())
        .cloned()
        .ok_or_else(|| anyhow!("model_params.descriptor.neuron: expected a non-empty list"))?;
    let smooth = v2 || bool_key(d, "smooth_type_embedding")?;
    let trainable = bool_key(d, "trainable")?;
    let trainable_ln = val(d, "trainable_ln")?;
    // The keys every level of the attention block repeats.
    let common = || -> Result<Value> {
        Ok(obj! {
            "do_mask" => false, "dotr" => val(d, "attn_dotr")?, "embed_dim" => m1.clone(),
            "hidden_dim" => val(d, "attn")?, "nnei" => nnei, "normalize" => val(d, "normalize")?,
            "precision" => s.precision(&format!("{p}mean"))?,
            "scaling_factor" => val(d, "scaling_factor")?, "temperature" => or(d, "temperature", Json::Null)?,
        })
    };
    let a = format!("{p}dpa1_attention.attention_layers.");
    let layers = (0..s.count(&a))
        .map(|k| {
            let at = format!("{a}{k}.");
            let proj = |name: &str| s.layer(&format!("{at}attention_layer.{name}."), "none", false, trainable);
            let mut attention_layer = common()?;
            merge(
                &mut attention_layer,
                obj! {
                    "bias" => s.get(&format!("{at}attention_layer.in_proj.bias"))?.is_some(),
                    "in_proj" => proj("in_proj")?, "num_heads" => 1, "out_proj" => proj("out_proj")?,
                    "smooth" => smooth,
                },
            );
            let ln = format!("{at}attn_layer_norm.");
            let norm = obj! {
                "@class" => "LayerNorm", "@version" => 1,
                "@variables" => obj! {
                    "w" => s.need(&format!("{ln}matrix"))?, "b" => s.node(&format!("{ln}bias"))?,
                },
                "eps" => ln_eps.clone(), "precision" => s.precision(&format!("{ln}matrix"))?,
                "trainable" => trainable_ln.clone(),
            };
            let mut layer = common()?;
            merge(
                &mut layer,
                obj! {
                    "attention_layer" => attention_layer, "attn_layer_norm" => norm,
                    "ln_eps" => ln_eps.clone(), "trainable_ln" => trainable_ln.clone(),
                },
            );
            Ok(layer)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut attention_layers = common()?;
    merge(
        &mut attention_layers,
        obj! {
            "@class" => "NeighborGatedAttention", "@version" => 1, "attention_layers" => layers,
            "layer_num" => val(d, "attn_layer")?, "ln_eps" => ln_eps.clone(),
            "trainable_ln" => trainable_ln.clone(),
        },
    );

    let tebd_dim = val(d, "tebd_dim")?;
    let te = "atomic_model.descriptor.type_embedding.embedding.embedding_net.";
    let tebd_bias = s.get(&format!("{te}layers.0.bias"))?.is_some();
    let tebd_net = NetKeys {
        fitting: false,
        activation: "Linear".into(),
        resnet_dt: false.into(),
        neuron: vec![tebd_dim.clone()].into(),
        trainable,
        bias: tebd_bias,
    };
    let tebd_precision = s.precision(&format!("{te}layers.0.matrix"))?;
    let type_embedding = obj! {
        "@class" => "TypeEmbedNet", "@version" => 2, "activation_function" => "Linear",
        "embedding" => s.network(te, &tebd_net)?, "neuron" => vec![tebd_dim.clone()], "ntypes" => nt,
        "padding" => true, "precision" => tebd_precision, "resnet_dt" => false,
        "trainable" => trainable, "type_map" => yaml(type_map)?,
        "use_econf_tebd" => val(d, "use_econf_tebd")?, "use_tebd_bias" => val(d, "use_tebd_bias")?,
    };

    let mut descriptor = obj! {
        "@class" => "Descriptor", "@version" => 2, "type" => if v2 { "se_atten_v2" } else { "dpa1" },
        "@variables" => obj! {
            "davg" => s.need(&format!("{p}mean"))?, "dstd" => s.need(&format!("{p}stddev"))?,
        },
        "activation_function" => n.activation.clone(), "attention_layers" => attention_layers,
        "attn" => val(d, "attn")?, "attn_dotr" => val(d, "attn_dotr")?,
        "attn_layer" => val(d, "attn_layer")?, "attn_mask" => false,
        "axis_neuron" => val(d, "axis_neuron")?,
        "concat_output_tebd" => val(d, "concat_output_tebd")?,
        "embeddings" => s.collection(&format!("{p}filter_layers."), 0, nt, &n)?,
        "env_mat" => env_mat(d)?, "env_protection" => val(d, "env_protection")?,
        "exclude_types" => val(d, "exclude_types")?, "ln_eps" => ln_eps,
        "neuron" => n.neuron.clone(), "normalize" => val(d, "normalize")?, "ntypes" => nt,
        "precision" => s.precision(&format!("{p}mean"))?, "rcut" => val(d, "rcut")?,
        "rcut_smth" => val(d, "rcut_smth")?, "resnet_dt" => n.resnet_dt.clone(),
        "scaling_factor" => val(d, "scaling_factor")?, "sel" => sel,
        "set_davg_zero" => val(d, "set_davg_zero")?, "spin" => Value::Null,
        "tebd_dim" => tebd_dim, "temperature" => or(d, "temperature", Json::Null)?,
        "trainable" => trainable, "trainable_ln" => trainable_ln,
        "type_embedding" => type_embedding, "type_map" => yaml(type_map)?,
        "type_one_side" => val(d, "type_one_side")?,
        "use_econf_tebd" => val(d, "use_econf_tebd")?, "use_tebd_bias" => val(d, "use_tebd_bias")?,
    };
    if strip {
        let strip_nets = s.collection(&format!("{p}filter_layers_strip."), 0, nt, &n)?;
        merge(&mut descriptor, obj! { "embeddings_strip" => strip_nets });
    }
    if !v2 {
        merge(
            &mut descriptor,
            obj! {
                "tebd_input_mode" => if strip { "strip" } else { "concat" },
                "smooth_type_embedding" => smooth,
            },
        );
    }
    Ok(descriptor)
}

/// `EnergyFittingNet.serialize` (`InvarFitting`'s with `type: ener`); `mixed`: one net for
/// every type (a mixed-type descriptor).
fn ener_fitting(
    s: &State,
    f: &Json,
    type_map: &Json,
    nt: usize,
    mixed: bool,
    mp: &Json,
) -> Result<Value> {
    let p = "atomic_model.fitting_net.";
    // A list of per-layer flags trains only if all are set (GeneralFitting).
    let trainable = match key(f, "trainable")? {
        Json::Array(a) => a.iter().all(|t| t.as_bool() == Some(true)),
        t => t
            .as_bool()
            .ok_or_else(|| anyhow!("model_params.fitting_net.trainable: expected true or false"))?,
    };
    let n = NetKeys {
        fitting: true,
        activation: str_key(f, "activation_function")?.to_string(),
        resnet_dt: val(f, "resnet_dt")?,
        neuron: val(f, "neuron")?,
        trainable,
        bias: true,
    };
    let nets = s.collection(
        &format!("{p}filter_layers."),
        if mixed { 0 } else { 1 },
        nt,
        &n,
    )?;
    // The nets take the descriptor, then fparam, aparam and the case embedding.
    let first = s.name(&format!("{p}filter_layers.networks.0.layers.0.matrix"));
    let in_dim = s.sd.meta(&first)?.0.first().copied().unwrap_or(0);
    let extra: u64 = ["numb_fparam", "numb_aparam", "dim_case_embd"]
        .iter()
        .map(|k| f.get(*k).and_then(Json::as_u64).unwrap_or(0))
        .sum();
    let dim_descrpt = (in_dim as u64).checked_sub(extra).ok_or_else(|| {
        anyhow!(
            "{}: {in_dim} inputs, fewer than numb_fparam + numb_aparam + dim_case_embd",
            s.name(p)
        )
    })?;
    let nlayers = n.neuron.as_sequence().map_or(0, Vec::len) + 1;
    Ok(obj! {
        "@class" => "Fitting", "@version" => 4, "type" => "ener",
        "@variables" => obj! {
            "aparam_avg" => s.node(&format!("{p}aparam_avg"))?,
            "aparam_inv_std" => s.node(&format!("{p}aparam_inv_std"))?,
            "bias_atom_e" => s.need(&format!("{p}bias_atom_e"))?,
            "case_embd" => s.node(&format!("{p}case_embd"))?,
            "fparam_avg" => s.node(&format!("{p}fparam_avg"))?,
            "fparam_inv_std" => s.node(&format!("{p}fparam_inv_std"))?,
        },
        "activation_function" => n.activation.clone(), "atom_ener" => or(f, "atom_ener", Json::Array(vec![]))?,
        "default_fparam" => or(f, "default_fparam", Json::Null)?,
        "dim_case_embd" => or(f, "dim_case_embd", 0.into())?, "dim_descrpt" => dim_descrpt,
        "dim_out" => 1, "exclude_types" => or(mp, "atom_exclude_types", Json::Array(vec![]))?,
        "layer_name" => Value::Null, "mixed_types" => mixed, "nets" => nets,
        "neuron" => n.neuron.clone(), "ntypes" => nt,
        "numb_aparam" => or(f, "numb_aparam", 0.into())?,
        "numb_fparam" => or(f, "numb_fparam", 0.into())?,
        "precision" => s.precision(&format!("{p}bias_atom_e"))?, "rcond" => or(f, "rcond", Json::Null)?,
        "resnet_dt" => n.resnet_dt.clone(), "spin" => Value::Null, "tot_ener_zero" => false,
        "trainable" => vec![trainable; nlayers], "type_map" => yaml(type_map)?,
        "use_aparam_as_mask" => or(f, "use_aparam_as_mask", false.into())?,
        "var_name" => "energy",
    })
}

/// The embedding nets' keys of a descriptor's section.
fn embedding_keys(d: &Json) -> Result<NetKeys> {
    Ok(NetKeys {
        fitting: false,
        activation: str_key(d, "activation_function")?.to_string(),
        resnet_dt: val(d, "resnet_dt")?,
        neuron: val(d, "neuron")?,
        trainable: d.get("trainable").and_then(Json::as_bool).unwrap_or(true),
        bias: true,
    })
}

/// `EnvMat.serialize`: the descriptor's cut-offs and protection.
fn env_mat(d: &Json) -> Result<Value> {
    Ok(obj! {
        "protection" => val(d, "env_protection")?, "rcut" => val(d, "rcut")?,
        "rcut_smth" => val(d, "rcut_smth")?,
        "use_exp_switch" => or(d, "use_exp_switch", false.into())?,
    })
}

/// `preset_out_bias` as DeePMD-kit keeps it: each type's entry an array (a number becomes a
/// one-element array), null where none is preset.
fn preset_out_bias(v: Option<&Json>) -> Result<Value> {
    let Some(Json::Object(m)) = v else {
        return Ok(Value::Null);
    };
    let mut out = serde_yaml_ng::Mapping::new();
    for (k, entries) in m {
        let entries = (entries.as_array())
            .ok_or_else(|| anyhow!("model_params.preset_out_bias.{k}: expected a list"))?;
        let nodes = (entries.iter())
            .map(|e| match e {
                Json::Null => Ok(Value::Null),
                Json::Number(x) => Ok(ndarray(&[1], &[x.as_f64().unwrap_or(f64::NAN)])),
                Json::Array(a) => {
                    let v: Vec<f64> = a.iter().filter_map(Json::as_f64).collect();
                    Ok(ndarray(&[v.len()], &v))
                }
                _ => bail!("model_params.preset_out_bias.{k}: expected numbers, lists or null"),
            })
            .collect::<Result<Vec<_>>>()?;
        out.insert(k.as_str().into(), Value::Sequence(nodes));
    }
    Ok(Value::Mapping(out))
}

/// A tensor as an `np.ndarray` node of its dtype.
fn array(a: &Array) -> Value {
    let mut v = ndarray(&a.shape, &a.data);
    v["dtype"] = a.dtype.into();
    v
}

fn merge(v: &mut Value, extra: Value) {
    if let (Value::Mapping(m), Value::Mapping(e)) = (v, extra) {
        m.extend(e);
    }
}

fn yaml(v: &Json) -> Result<Value> {
    serde_yaml_ng::to_value(v).context("converting model_params")
}

fn key<'a>(v: &'a Json, k: &str) -> Result<&'a Json> {
    v.get(k)
        .ok_or_else(|| anyhow!("model_params: no key `{k}` in {}", brief(v)))
}

/// The value of key `k` of a section, as a tree node.
fn val(v: &Json, k: &str) -> Result<Value> {
    yaml(key(v, k)?)
}

/// [`val`], or `default` where the key is missing (older inputs).
fn or(v: &Json, k: &str, default: Json) -> Result<Value> {
    yaml(v.get(k).unwrap_or(&default))
}

fn str_key<'a>(v: &'a Json, k: &str) -> Result<&'a str> {
    key(v, k)?
        .as_str()
        .ok_or_else(|| anyhow!("model_params: `{k}` is not a string"))
}

fn opt_str<'a>(v: &'a Json, k: &str) -> Result<Option<&'a str>> {
    match v.get(k) {
        None | Some(Json::Null) => Ok(None),
        Some(s) => s
            .as_str()
            .map(Some)
            .ok_or_else(|| anyhow!("model_params: `{k}` is not a string")),
    }
}

fn bool_key(v: &Json, k: &str) -> Result<bool> {
    key(v, k)?
        .as_bool()
        .ok_or_else(|| anyhow!("model_params: `{k}` is not true or false"))
}

/// A section named by its `type`, for errors about its keys.
fn brief(v: &Json) -> String {
    match v.get("type").and_then(Json::as_str) {
        Some(t) => format!("the `{t}` section"),
        None => "the model section".into(),
    }
}

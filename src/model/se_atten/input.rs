//! DPA-1's keys in input.json (`se_atten`, alias `dpa1`, and `se_atten_v2`: DeePMD-kit 3.2.0's
//! `descrpt_se_atten_args` and `descrpt_se_atten_v2_args`), the se family's and its own, and
//! their out.json form.

use serde_json::{json, Map, Value};

use super::AttentionConfig;
use crate::config::error::ConfigError;
use crate::config::keys::{at_least_one, positive, to_bool, to_usize, Schema, Section};
use crate::config::model::{mixed_sel, object, DescriptorConfig};
use crate::model::check::{layer_count, own_widths, positive_number, shared_keys, with_own};
use crate::model::se::input::{shared, SE_KEYS, SE_UNSUPPORTED};
use crate::model::{DescriptorSpec, DescriptorType, OwnKeys, TebdInputMode};

type Result<T> = std::result::Result<T, ConfigError>;

/// What DeePMD-kit 3.2.0 itself refuses or dpw does not implement for se_atten / se_atten_v2,
/// beyond [`SE_UNSUPPORTED`].
const ATTEN_UNSUPPORTED: &[(&str, &str)] = &[
    (
        "attn_mask",
        "DeePMD-kit 3.2.0 itself refuses attn_mask true (NotImplementedError)",
    ),
    (
        "use_econf_tebd",
        "the electronic-configuration type embedding is not implemented",
    ),
];

/// The keys se_atten and se_atten_v2 share beyond [`SE_KEYS`] (`descrpt_se_atten_common_args`).
/// `lmax` is read and must be 1 (the only degree dpw implements).
const ATTEN_KEYS: &[&str] = &[
    "axis_neuron",
    "type_one_side",
    "lmax",
    "attn",
    "attn_layer",
    "attn_dotr",
    "trainable_ln",
    "ln_eps",
    "tebd_dim",
    "use_tebd_bias",
    "scaling_factor",
    "normalize",
    "temperature",
    "concat_output_tebd",
];

/// se_atten's keys (`descrpt_se_atten_common_args` + `descrpt_se_atten_args`; registered also
/// as `dpa1`).
static DESCRIPTOR_ATTEN: Schema = Schema {
    keys: &[
        SE_KEYS,
        ATTEN_KEYS,
        &[
            "stripped_type_embedding",
            "smooth_type_embedding",
            "tebd_input_mode",
        ],
    ],
    unsupported: &[SE_UNSUPPORTED, ATTEN_UNSUPPORTED],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// se_atten_v2's keys (`descrpt_se_atten_common_args` + `descrpt_se_atten_v2_args`): se_atten's
/// without stripped_type_embedding, smooth_type_embedding and tebd_input_mode (v2 is always
/// strip and smooth).
static DESCRIPTOR_ATTEN_V2: Schema = Schema {
    keys: &[SE_KEYS, ATTEN_KEYS],
    unsupported: &[SE_UNSUPPORTED, ATTEN_UNSUPPORTED],
    ignored: &[],
    deepmd: "model[standard].descriptor",
};

/// An se_atten or se_atten_v2 descriptor of input.json at `path`; its sel one mixed-type list.
pub(crate) fn parse(
    descriptor: DescriptorType,
    v: &Value,
    path: &str,
    _ntypes: usize,
) -> Result<DescriptorConfig> {
    let schema = match descriptor {
        DescriptorType::SeAttenV2 => &DESCRIPTOR_ATTEN_V2,
        _ => &DESCRIPTOR_ATTEN,
    };
    let sec = Section::new(v, path, schema)?;
    let mut d = shared(descriptor, &sec, mixed_sel(&sec)?)?;
    d.own = OwnKeys::Attention(parse_attention(&sec, descriptor)?);
    Ok(d)
}

/// se_atten / se_atten_v2's own keys (the schema has already refused the unsupported values).
fn parse_attention(sec: &Section, kind: DescriptorType) -> Result<AttentionConfig> {
    if let Some(v) = sec.get_nonnull("lmax") {
        let lmax = to_usize(v, &sec.path_of("lmax"))?;
        if lmax != 1 {
            return Err(ConfigError::unsupported(
                sec.path_of("lmax"),
                format!(
                    "lmax {lmax} (DeePMD-kit's higher-degree moment basis) is not supported; \
                     dpw implements lmax 1, the default"
                ),
            ));
        }
    }
    let v2 = kind == DescriptorType::SeAttenV2;
    let tebd_input_mode = if v2 {
        TebdInputMode::Strip
    } else {
        // DeePMD-kit: a given stripped_type_embedding (true/false) overrides tebd_input_mode.
        let stripped = match sec.get_nonnull("stripped_type_embedding") {
            Some(v) => Some(to_bool(v, &sec.path_of("stripped_type_embedding"))?),
            None => None,
        };
        let mode = sec.string_or("tebd_input_mode", "concat")?;
        match (stripped, mode.as_str()) {
            (Some(true), _) => TebdInputMode::Strip,
            (Some(false), _) => TebdInputMode::Concat,
            (None, "concat") => TebdInputMode::Concat,
            (None, "strip") => TebdInputMode::Strip,
            (None, other) => {
                return Err(ConfigError::invalid(
                    sec.path_of("tebd_input_mode"),
                    format!("must be \"concat\" or \"strip\", found {other:?}"),
                ))
            }
        }
    };
    let tebd_dim = sec.usize_or("tebd_dim", 8)?;
    at_least_one(tebd_dim, &sec.path_of("tebd_dim"))?;
    let attn = sec.usize_or("attn", 128)?;
    at_least_one(attn, &sec.path_of("attn"))?;
    let temperature = sec.opt_f64("temperature")?;
    if let Some(t) = temperature {
        positive(t, &sec.path_of("temperature"))?;
    }
    let ln_eps = match sec.opt_f64("ln_eps")? {
        Some(e) => positive(e, &sec.path_of("ln_eps"))?,
        None => 1e-5,
    };
    Ok(AttentionConfig {
        tebd_dim,
        tebd_input_mode,
        attn,
        attn_layer: sec.usize_or("attn_layer", 2)?,
        attn_dotr: sec.bool_or("attn_dotr", true)?,
        scaling_factor: positive(
            sec.f64_or("scaling_factor", 1.0)?,
            &sec.path_of("scaling_factor"),
        )?,
        normalize: sec.bool_or("normalize", true)?,
        temperature,
        trainable_ln: sec.bool_or("trainable_ln", true)?,
        ln_eps,
        smooth_type_embedding: v2 || sec.bool_or("smooth_type_embedding", false)?,
        concat_output_tebd: sec.bool_or("concat_output_tebd", true)?,
        use_tebd_bias: sec.bool_or("use_tebd_bias", false)?,
    })
}

/// DPA-1's keys as out.json writes them: the se family's and its own.
pub(crate) fn to_json(d: &DescriptorConfig) -> Value {
    let mut descriptor = crate::model::se::input::to_json(d);
    let a = d.own.attention().expect("parsed with its attention keys");
    let o = object(&mut descriptor);
    for (k, v) in [
        ("tebd_dim", json!(a.tebd_dim)),
        ("attn", json!(a.attn)),
        ("attn_layer", json!(a.attn_layer)),
        ("attn_dotr", json!(a.attn_dotr)),
        ("scaling_factor", json!(a.scaling_factor)),
        ("normalize", json!(a.normalize)),
        ("trainable_ln", json!(a.trainable_ln)),
        ("ln_eps", json!(a.ln_eps)),
        ("concat_output_tebd", json!(a.concat_output_tebd)),
        ("use_tebd_bias", json!(a.use_tebd_bias)),
        // null when not given, which out.json leaves out (DeePMD-kit refuses it).
        ("temperature", json!(a.temperature)),
    ] {
        o.insert(k.into(), v);
    }
    if d.kind == DescriptorType::SeAtten {
        // The mode resolved from tebd_input_mode and stripped_type_embedding.
        o.insert("tebd_input_mode".into(), json!(a.tebd_input_mode.as_str()));
        o.insert("stripped_type_embedding".into(), Value::Null);
        o.insert(
            "smooth_type_embedding".into(),
            json!(a.smooth_type_embedding),
        );
    }
    descriptor
}

/// Its keys as input.json gives them, read back from a spec (`ModelSpec::differences` compares
/// them): se's and its attention's; se_atten_v2's input.json fixes two of them.
pub(crate) fn spec_keys(d: &DescriptorSpec) -> Map<String, Value> {
    let mut m = with_own(shared_keys(d, true, true), json!(d.own.attention()));
    if d.kind == DescriptorType::SeAttenV2 {
        m.remove("tebd_input_mode");
        m.remove("smooth_type_embedding");
    }
    m
}

/// Its own keys' ranges, after the ones every descriptor shares (`ModelSpec::check`).
pub(crate) fn check(d: &DescriptorSpec, _: usize, key: &str) -> anyhow::Result<()> {
    let a = d.own.attention().expect("a DPA-1 spec holds its keys");
    own_widths(key, &[("tebd_dim", a.tebd_dim), ("attn", a.attn)])?;
    layer_count(&format!("{key}.attn_layer"), a.attn_layer)?;
    positive_number(&format!("{key}.ln_eps"), a.ln_eps)?;
    positive_number(&format!("{key}.scaling_factor"), a.scaling_factor)?;
    match a.temperature {
        Some(t) => positive_number(&format!("{key}.temperature"), t),
        None => Ok(()),
    }
}

//! The rules every model obeys whatever its source (input.json, a dpw model or checkpoint, a
//! DeePMD-kit `.yaml`), so a damaged or hand-edited file is refused with the key it breaks
//! instead of training or predicting garbage. Keys are named as in input.json and the yaml.

use anyhow::{bail, ensure, Result};
use serde_json::{json, Value};

use super::{DescriptorSpec, DescriptorType, Model, ModelSpec, OwnKeys};

/// Most neighbour slots per atom (Σsel). Dense matter within a 12 Å cut-off has about 1500
/// neighbours; far more only exhausts memory (every slot holds a row of the embedding).
pub const MAX_NNEI: usize = 4096;
/// Widest layer, and most layers of a net.
const MAX_WIDTH: usize = 1 << 16;
const MAX_LAYERS: usize = 64;
/// Most element types.
const MAX_TYPES: usize = 256;
/// Most trainable parameters (512 MiB in f64; DeePMD-kit's large models have a few million).
const MAX_PARAMS: f64 = (1u64 << 26) as f64;

impl ModelSpec {
    /// Checks the hyper-parameters; cheap, and done before anything is sized by them.
    pub fn check(&self) -> Result<()> {
        let nt = self.ntypes();
        ensure!(
            (1..=MAX_TYPES).contains(&nt),
            "model.type_map: {nt} types (1 to {MAX_TYPES} are supported)"
        );
        for (i, name) in self.type_map.iter().enumerate() {
            ensure!(!name.is_empty(), "model.type_map[{i}]: empty element name");
            ensure!(
                !self.type_map[..i].contains(name),
                "model.type_map[{i}]: {name:?} appears twice"
            );
        }
        let d = &self.descriptor;
        if let Some(sr) = &self.short_range {
            // DeePMD-kit's `LinearEnergyAtomicModel` takes mixed-type models only.
            ensure!(
                d.is_mixed(),
                "model: a pair table (use_srtab, linear_ener) mixes only with a mixed-type \
                 descriptor ({}), as in DeePMD-kit; not {}",
                super::registry::mixed_type_names(),
                d.kind.as_str()
            );
            ensure!(
                self.fitting.output.is_ener(),
                "model: a pair table mixes only into an `ener` fitting's energy"
            );
            sr.check(nt, d.rcut, d.nnei())?;
        }
        ensure!(
            d.own.fit(d.kind),
            "model.descriptor: a {} descriptor holds another kind's keys",
            d.kind.as_str()
        );
        if let OwnKeys::Hybrid(list) = &d.own {
            ensure!(
                !list.is_empty(),
                "model.descriptor.list: a hybrid descriptor needs at least one sub-descriptor"
            );
            for (k, p) in list.iter().enumerate() {
                let key = format!("model.descriptor.list[{k}]");
                ensure!(
                    p.kind != DescriptorType::Hybrid,
                    "{key}.type: a hybrid descriptor inside hybrid is not supported"
                );
                ensure!(
                    !p.is_mixed(),
                    "{key}.type: {} inside hybrid is not supported",
                    p.kind.as_str()
                );
                ensure!(
                    p.own.fit(p.kind),
                    "{key}: a {} descriptor holds another kind's keys",
                    p.kind.as_str()
                );
                check_descriptor(p, nt, &key)?;
            }
            ensure!(
                *d == DescriptorSpec::hybrid(list.clone()),
                "model.descriptor: a hybrid's rcut, rcut_smth and sel are its list's largest \
                 rcut, smallest rcut_smth and largest sel per type, and it has no other keys"
            );
            let nnei =
                (list.iter().flat_map(|p| &p.sel)).try_fold(0usize, |a, &s| a.checked_add(s));
            if nnei.is_none_or(|n| n > MAX_NNEI) {
                bail!(
                    "model.descriptor.list: the sub-descriptors ask for {} neighbour slots per \
                     atom together, more than dpw's limit of {MAX_NNEI}",
                    nnei.map_or("more than 2^64".into(), |n| n.to_string())
                );
            }
        } else {
            check_descriptor(d, nt, "model.descriptor")?;
        }
        widths("model.fitting_net.neuron", &self.fitting.neuron)?;
        for (key, n) in [
            ("numb_fparam", self.fitting.numb_fparam),
            ("numb_aparam", self.fitting.numb_aparam),
            ("dim_case_embd", self.fitting.dim_case_embd),
        ] {
            ensure!(
                n <= MAX_WIDTH,
                "model.fitting_net.{key}: at most {MAX_WIDTH} are supported, found {n}"
            );
        }
        if let Some(dflt) = &self.fitting.default_fparam {
            ensure!(
                dflt.len() == self.fitting.numb_fparam,
                "model.fitting_net.default_fparam: {} values, numb_fparam is {}",
                dflt.len(),
                self.fitting.numb_fparam
            );
        }
        let nparams = self.param_count_estimate();
        ensure!(
            nparams <= MAX_PARAMS,
            "the model would have {nparams:.3e} parameters, more than dpw's limit of \
             {MAX_PARAMS:.3e}; check the neuron widths"
        );
        Ok(())
    }

    /// The number of parameters, computed in f64 so that no width can overflow it.
    fn param_count_estimate(&self) -> f64 {
        let net = |nin: usize, widths: &[usize]| {
            let mut prev = nin as f64;
            let mut n = 0.0;
            for &w in widths {
                n += prev * w as f64 + 2.0 * w as f64;
                prev = w as f64;
            }
            n + prev + 1.0
        };
        let nt = self.ntypes() as f64;
        let fit_in = self.descriptor.dim() + self.fitting.extra_inputs();
        if let Some(a) = self.descriptor.attn() {
            // DPA-1: one embedding net (and strip's), the type embedding, the attention layers
            // and one fitting net; every input width counted at its largest.
            let (d, tebd) = (&self.descriptor, a.tebd_dim as f64);
            let m1 = d.neuron.last().map_or(0.0, |&m| m as f64);
            let (attn, layers) = (a.attn as f64, a.attn_layer as f64);
            let embed = 2.0 * net(1 + 2 * a.tebd_dim, &d.neuron);
            let attention = layers * (m1 * 3.0 * attn + 3.0 * attn + attn * m1 + 3.0 * m1);
            return nt * tebd + tebd + embed + attention + net(fit_in, &self.fitting.neuron);
        }
        let embed: f64 = (self.descriptor.parts().iter())
            .map(|d| {
                let nembed = if d.type_one_side { nt } else { nt * nt };
                nembed * net(1, &d.neuron)
            })
            .sum();
        embed + nt * net(fit_in, &self.fitting.neuron)
    }
}

/// The keys of one (not hybrid) descriptor, named under `key`.
fn check_descriptor(d: &DescriptorSpec, nt: usize, key: &str) -> Result<()> {
    positive_number(&format!("{key}.rcut"), d.rcut)?;
    ensure!(
        d.rcut_smth.is_finite() && d.rcut_smth >= 0.0 && d.rcut_smth < d.rcut,
        "{key}.rcut_smth: must be >= 0 and smaller than rcut ({}), found {}",
        d.rcut,
        d.rcut_smth
    );
    ensure!(
        d.env_protection.is_finite() && d.env_protection >= 0.0,
        "{key}.env_protection: must be >= 0, found {}",
        d.env_protection
    );
    if d.is_mixed() {
        // DPA-1, DPA-2, DPA-3: one mixed-type list of nnei slots.
        ensure!(
            d.sel.len() == 1,
            "{key}.sel: a mixed-type neighbour list ({}) has one number, nnei; found {} entries",
            super::registry::mixed_type_names(),
            d.sel.len()
        );
    }
    (d.kind.registered().check)(d, nt, key)?;
    let nnei = d.sel.iter().try_fold(0usize, |a, &s| a.checked_add(s));
    if nnei.is_none_or(|n| n > MAX_NNEI) {
        bail!(
            "{key}.sel: {:?} asks for {} neighbour slots per atom, more than dpw's \
                 limit of {MAX_NNEI} (sel counts neighbours within rcut, a few hundred at most \
                 in dense matter)",
            d.sel,
            nnei.map_or("more than 2^64".into(), |n| n.to_string())
        );
    }
    // No slot at all leaves the descriptor empty: the passes have nothing to size their rows by
    // and the statistics nothing to average.
    ensure!(
        nnei != Some(0),
        "{key}.sel: {:?} keeps no neighbour; give at least one type a positive sel (`dpw \
         neighbor-stat` prints the largest neighbour counts)",
        d.sel
    );
    widths(&format!("{key}.neuron"), &d.neuron)?;
    ensure!(
        (1..=d.m1()).contains(&d.axis_neuron),
        "{key}.axis_neuron: must be between 1 and the last embedding width ({}), \
             found {}",
        d.m1(),
        d.axis_neuron
    );
    Ok(())
}

/// Each width `(name, v)` of a descriptor's own keys, named `{key}.{name}`: 1 to MAX_WIDTH.
pub(super) fn own_widths(key: &str, widths: &[(&str, usize)]) -> Result<()> {
    for &(name, v) in widths {
        ensure!(
            (1..=MAX_WIDTH).contains(&v),
            "{key}.{name}: must be between 1 and {MAX_WIDTH}, found {v}"
        );
    }
    Ok(())
}

/// A layer count at `key`: at most MAX_LAYERS.
pub(super) fn layer_count(key: &str, n: usize) -> Result<()> {
    ensure!(
        n <= MAX_LAYERS,
        "{key}: at most {MAX_LAYERS} layers are supported, found {n}"
    );
    Ok(())
}

/// A number at `key` that must be finite and positive.
pub(super) fn positive_number(key: &str, v: f64) -> Result<()> {
    ensure!(
        v.is_finite() && v > 0.0,
        "{key}: must be a positive number, found {v}"
    );
    Ok(())
}

pub(super) fn widths(key: &str, w: &[usize]) -> Result<()> {
    ensure!(
        (1..=MAX_LAYERS).contains(&w.len()),
        "{key}: {} layers (1 to {MAX_LAYERS} are supported)",
        w.len()
    );
    if let Some(i) = w.iter().position(|&n| n == 0 || n > MAX_WIDTH) {
        bail!(
            "{key}[{i}]: a layer width must be between 1 and {MAX_WIDTH}, found {}",
            w[i]
        );
    }
    Ok(())
}

impl Model {
    /// Checks the hyper-parameters, the sizes of every array and that every number is finite
    /// (and every std non-zero): what a damaged file would break.
    pub fn check(&self) -> Result<()> {
        if self.spec.linear.is_some() {
            return self.check_linear();
        }
        self.spec.check()?;
        let (nt, np) = (self.spec.ntypes(), self.layout().len);
        let nstat = 4 * nt * self.spec.descriptor.stat_blocks();
        let nx = self.spec.fitting.param_inputs();
        let no = self.spec.fitting.dim_out();
        let nstd = match self.spec.fitting.output.fitting().keeps_out_std() {
            true => nt * no,
            false => 0,
        };
        ensure!(
            self.params.len() == np,
            "the file holds {} parameters, its model needs {np}",
            self.params.len()
        );
        for (name, a, len) in [
            ("davg", &self.davg, nstat),
            ("dstd", &self.dstd, nstat),
            (
                "bias",
                &self.bias,
                nt * self.spec.fitting.output.fitting().label_width(),
            ),
            ("out_std", &self.out_std, nstd),
            ("fit_input_avg", &self.fit_input_avg, nx),
            ("fit_input_inv_std", &self.fit_input_inv_std, nx),
            (
                "case_embd",
                &self.case_embd,
                self.spec.fitting.dim_case_embd,
            ),
        ] {
            ensure!(
                a.len() == len,
                "statistics {name}: {} values, the model needs {len}",
                a.len()
            );
        }
        for (name, a) in [
            ("parameters", &self.params),
            ("statistics davg", &self.davg),
            ("statistics dstd", &self.dstd),
            ("output bias", &self.bias),
            ("output std", &self.out_std),
            ("statistics fit_input_avg", &self.fit_input_avg),
            ("statistics fit_input_inv_std", &self.fit_input_inv_std),
            ("case embedding", &self.case_embd),
        ] {
            if let Some(i) = a.iter().position(|x| !x.is_finite()) {
                bail!("{name}[{i}] is {}: the model is damaged", a[i]);
            }
        }
        if let Some(i) = self.dstd.iter().position(|&x| x == 0.0) {
            bail!("statistics dstd[{i}] is 0: the model is damaged");
        }
        Ok(())
    }
}

impl ModelSpec {
    /// How `other` differs from this model, key by key in input.json's names and values
    /// (`model.descriptor.type: "se_e2_a" in input.json, "se_atten" in …`), for the error of a
    /// run that starts from a model of another shape. `mine` and `theirs` name the two sources.
    /// Where descriptor types differ, only that is said (their other keys are not comparable).
    /// Never empty when the two differ.
    pub fn differences(&self, other: &ModelSpec, mine: &str, theirs: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut push = |key: &str, a: Option<Value>, b: Option<Value>| {
            if a != b {
                let show = |v: Option<Value>| v.map_or("absent".into(), |v| v.to_string());
                out.push(format!(
                    "{key}: {} in {mine}, {} in {theirs}",
                    show(a),
                    show(b)
                ));
            }
        };
        push(
            "model.type_map",
            Some(json!(self.type_map)),
            Some(json!(other.type_map)),
        );
        descriptor_differences(
            &self.descriptor,
            &other.descriptor,
            "model.descriptor",
            &mut push,
        );
        for (key, a, b) in [
            (
                "neuron",
                json!(self.fitting.neuron),
                json!(other.fitting.neuron),
            ),
            (
                "resnet_dt",
                json!(self.fitting.resnet_dt),
                json!(other.fitting.resnet_dt),
            ),
            (
                "numb_fparam",
                json!(self.fitting.numb_fparam),
                json!(other.fitting.numb_fparam),
            ),
            (
                "numb_aparam",
                json!(self.fitting.numb_aparam),
                json!(other.fitting.numb_aparam),
            ),
            (
                "dim_case_embd",
                json!(self.fitting.dim_case_embd),
                json!(other.fitting.dim_case_embd),
            ),
        ] {
            push(&format!("model.fitting_net.{key}"), Some(a), Some(b));
        }
        // The fitting's type, or where the types agree its own keys (a dipole's
        // embedding_width, a property's task_dim, ...), as its checkpoint form names them.
        let (a, b) = (json!(self.fitting.output), json!(other.fitting.output));
        if a["type"] != b["type"] {
            let key = "model.fitting_net.type";
            push(key, Some(a["type"].clone()), Some(b["type"].clone()));
        } else if let (Some(ao), Some(bo)) = (a.as_object(), b.as_object()) {
            let keys: std::collections::BTreeSet<&String> = ao.keys().chain(bo.keys()).collect();
            for key in keys {
                let key_of = format!("model.fitting_net.{key}");
                push(&key_of, ao.get(key).cloned(), bo.get(key).cloned());
            }
        }
        if out.is_empty() && self != other {
            // Keys no input.json sets (a crafted file's): say so rather than list nothing.
            out.push(format!(
                "keys that input.json does not set: {} in {mine}, {} in {theirs}",
                json!(self),
                json!(other)
            ));
        }
        out
    }
}

/// The differences of two descriptors under `key`, to `push(key, mine, theirs)`.
fn descriptor_differences(
    a: &DescriptorSpec,
    b: &DescriptorSpec,
    key: &str,
    push: &mut impl FnMut(&str, Option<Value>, Option<Value>),
) {
    if a.kind != b.kind {
        let kind = |d: &DescriptorSpec| Some(json!(d.kind.as_str()));
        push(&format!("{key}.type"), kind(a), kind(b));
        return;
    }
    if let (OwnKeys::Hybrid(la), OwnKeys::Hybrid(lb)) = (&a.own, &b.own) {
        // A hybrid's own keys are its list's.
        for k in 0..la.len().max(lb.len()) {
            let item = format!("{key}.list[{k}]");
            match (la.get(k), lb.get(k)) {
                (Some(x), Some(y)) => descriptor_differences(x, y, &item, push),
                (x, y) => push(
                    &item,
                    x.map(|d| json!(d.kind.as_str())),
                    y.map(|d| json!(d.kind.as_str())),
                ),
            }
        }
        return;
    }
    let keys = |d: &DescriptorSpec| (d.kind.registered().spec_keys)(d);
    let (ka, kb) = (keys(a), keys(b));
    let mut names: Vec<&String> = ka.keys().chain(kb.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        push(
            &format!("{key}.{name}"),
            ka.get(name).cloned(),
            kb.get(name).cloned(),
        );
    }
}

/// The keys every descriptor but a hybrid shares as input.json gives them (its folder's
/// `spec_keys` adds its own): axis_neuron and type_one_side where its type has them, and a
/// mixed-type list's sel as the one number it is (the sum of a list).
pub(super) fn shared_keys(
    d: &DescriptorSpec,
    axis_neuron: bool,
    type_one_side: bool,
) -> serde_json::Map<String, Value> {
    let sel = match d.is_mixed() {
        true => json!(d.nnei()),
        false => json!(d.sel),
    };
    let mut m = serde_json::Map::new();
    for (k, v) in [
        ("rcut", json!(d.rcut)),
        ("rcut_smth", json!(d.rcut_smth)),
        ("sel", sel),
        ("neuron", json!(d.neuron)),
        ("resnet_dt", json!(d.resnet_dt)),
        ("env_protection", json!(d.env_protection)),
        ("set_davg_zero", json!(d.set_davg_zero)),
    ] {
        m.insert(k.into(), v);
    }
    if axis_neuron {
        m.insert("axis_neuron".into(), json!(d.axis_neuron));
    }
    if type_one_side {
        m.insert("type_one_side".into(), json!(d.type_one_side));
    }
    m
}

/// `m` with the keys of `own`, an object.
pub(super) fn with_own(
    mut m: serde_json::Map<String, Value>,
    own: Value,
) -> serde_json::Map<String, Value> {
    if let Value::Object(own) = own {
        m.extend(own);
    }
    m
}

//! DeePMD-kit 3.2.0's own input schema (`deepmd.utils.argcheck`, as `dp doc-train-input
//! --out-type json` prints it), embedded so that dpw knows every key DeePMD-kit knows.
//!
//! dpw's [`Schema`](super::keys::Schema)s list the keys dpw reads. Any other key DeePMD-kit
//! knows is accepted at DeePMD-kit's default (so DeePMD-kit's own out.json loads) and refused
//! otherwise, naming what dpw lacks; a key neither knows is a typo. [`fill_defaults`] writes
//! every default into out.json, as `dp train` does. `deepmd-kit-args.json` is made by
//! `scripts/make-reference/deepmd_args.py`, which says how it is compacted.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::{Map, Value};

/// One argument: a key, or (in [`Variant::choices`]) one choice of a variant.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Arg {
    tag: String,
    name: String,
    alias: Vec<String>,
    #[serde(rename = "type")]
    types: Vec<String>,
    optional: bool,
    /// The default as a one-element list: a default of `null` is not the same as none.
    default: Vec<Value>,
    repeat: bool,
    doc: String,
    fields: Vec<Arg>,
    variants: Vec<Variant>,
    /// The path of an argument equal to this one, written once.
    same_as: Option<String>,
}

/// Sub-fields chosen by the value of a flag key (`type` mostly).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Variant {
    flag: String,
    optional: bool,
    default_tag: String,
    alias: BTreeMap<String, String>,
    choices: Vec<Arg>,
}

/// The root: the top-level keys of input.json as the fields of one argument.
static ROOT: LazyLock<Arg> = LazyLock::new(|| Arg {
    fields: serde_json::from_str(include_str!("deepmd-kit-args.json"))
        .expect("src/config/deepmd-kit-args.json is valid (a test reads it)"),
    ..Arg::default()
});

impl Arg {
    /// Follows a `same_as` reference.
    fn resolved(&'static self) -> &'static Arg {
        match &self.same_as {
            Some(path) => node(path).unwrap_or_else(|| panic!("deepmd-kit-args.json: no {path}")),
            None => self,
        }
    }

    fn is_named(&self, key: &str) -> bool {
        self.name == key || self.alias.iter().any(|a| a == key)
    }

    pub(crate) fn doc(&self) -> &str {
        &self.doc
    }

    /// DeePMD-kit's default, if it has one.
    pub(crate) fn default_value(&self) -> Option<&Value> {
        self.default.first()
    }

    /// The sub-fields of this argument for an object `map`: its own and those of the choices
    /// `map`'s flags pick (the default tag when a flag is absent).
    fn fields_for(&'static self, map: &Map<String, Value>) -> Vec<&'static Arg> {
        let mut fields: Vec<&'static Arg> = self.fields.iter().map(Arg::resolved).collect();
        for variant in &self.variants {
            if let Some(choice) = variant.chosen(map) {
                fields.extend(choice.fields_for(map));
            }
        }
        fields
    }
}

impl Variant {
    fn chosen(&'static self, map: &Map<String, Value>) -> Option<&'static Arg> {
        let tag = match map.get(&self.flag) {
            Some(v) => v.as_str()?,
            None => &self.default_tag,
        };
        let tag = self.alias.get(tag).map_or(tag, String::as_str);
        // A choice written once elsewhere (`same_as`) has its tag there.
        self.choices
            .iter()
            .map(Arg::resolved)
            .find(|c| c.tag == tag)
    }
}

/// The argument at `path`: keys joined by `.`, a variant's choice in brackets
/// (`model[standard].descriptor`); `""` is the root.
pub(crate) fn node(path: &str) -> Option<&'static Arg> {
    let mut arg: &'static Arg = &ROOT;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (name, tag) = match segment.split_once('[') {
            Some((name, tag)) => (name, tag.strip_suffix(']')),
            None => (segment, None),
        };
        arg = arg.fields.iter().find(|f| f.is_named(name))?.resolved();
        if let Some(tag) = tag {
            arg = (arg.variants.iter().flat_map(|v| &v.choices))
                .map(Arg::resolved)
                .find(|c| c.tag == tag)?;
        }
    }
    Some(arg)
}

/// What DeePMD-kit knows of `key` in the object `map` described by `parent`.
pub(crate) enum Known {
    /// A key of its own.
    Field(&'static Arg),
    /// A variant's flag, with its default tag (`""`: none).
    Flag(&'static str),
    /// Not a key of DeePMD-kit's: inside an object DeePMD-kit knows, for messages.
    Unknown,
}

pub(crate) fn lookup(parent: &'static Arg, map: &Map<String, Value>, key: &str) -> Option<Known> {
    if let Some(variant) = parent.variants.iter().find(|v| v.flag == key) {
        return Some(Known::Flag(&variant.default_tag));
    }
    parent
        .fields_for(map)
        .into_iter()
        .find(|f| f.is_named(key))
        .map(Known::Field)
}

/// Where a value asks for more than DeePMD-kit's default: the path below the key (`""`: the
/// key itself, `.sub` for a key inside its object) and what DeePMD-kit knows of that key.
pub(crate) struct Departure<'v> {
    pub below: String,
    pub known: Known,
    pub value: &'v Value,
}

impl Known {
    /// `None` when `v` asks for nothing beyond DeePMD-kit's default: the default itself, null
    /// for a key without one, or an object whose every key is at its default.
    pub(crate) fn departure<'v>(self, v: &'v Value) -> Option<Departure<'v>> {
        let at_default = match &self {
            Known::Flag(tag) => !tag.is_empty() && v.as_str() == Some(*tag),
            Known::Field(arg) => {
                arg.default_value().is_some_and(|d| same(d, v))
                    || (v.is_null() && arg.default_value().is_none())
            }
            Known::Unknown => false,
        };
        if at_default {
            return None;
        }
        if let (Known::Field(arg), Value::Object(map)) = (&self, v) {
            if !arg.repeat && arg.types.iter().any(|t| t == "dict") {
                let inner = map
                    .iter()
                    .filter(|(k, _)| !k.starts_with('_'))
                    .find_map(|(k, x)| match lookup(arg, map, k) {
                        Some(known) => known.departure(x).map(|d| Departure {
                            below: format!(".{k}{}", d.below),
                            ..d
                        }),
                        None => Some(Departure {
                            below: format!(".{k}"),
                            known: Known::Unknown,
                            value: x,
                        }),
                    });
                return inner;
            }
        }
        Some(Departure {
            below: String::new(),
            known: self,
            value: v,
        })
    }

    /// The default, for messages.
    pub(crate) fn default_text(&self) -> String {
        match self {
            Known::Flag(tag) => Value::from(*tag).to_string(),
            Known::Field(arg) => match arg.default_value() {
                Some(d) => d.to_string(),
                None => "leaving it out".into(),
            },
            Known::Unknown => "leaving it out (DeePMD-kit does not know the key either)".into(),
        }
    }

    /// Whether this is the key `name` (by DeePMD-kit's canonical name).
    pub(crate) fn is(&self, name: &str) -> bool {
        matches!(self, Known::Field(arg) if arg.name == name)
    }

    /// DeePMD-kit's other names for the key.
    pub(crate) fn aliases(&self) -> &'static [String] {
        match self {
            Known::Field(arg) => &arg.alias,
            Known::Flag(_) | Known::Unknown => &[],
        }
    }

    pub(crate) fn doc(&self) -> &str {
        match self {
            Known::Field(arg) => arg.doc(),
            Known::Flag(_) | Known::Unknown => "",
        }
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

/// Adds DeePMD-kit's default of every key `map` lacks (and the default tag of an absent
/// optional flag), recursively, as DeePMD-kit's `normalize` does for out.json; a null for a
/// key DeePMD-kit gives no default is left out, as `normalize` leaves it (its argcheck refuses
/// some of those nulls).
pub(crate) fn fill_defaults(arg: &'static Arg, map: &mut Map<String, Value>) {
    for variant in &arg.variants {
        if variant.optional && !map.contains_key(&variant.flag) {
            map.insert(
                variant.flag.clone(),
                Value::from(variant.default_tag.clone()),
            );
        }
    }
    for field in arg.fields_for(map) {
        let given = map.keys().find(|k| field.is_named(k)).cloned();
        match given {
            None => {
                if let Some(d) = field.default_value() {
                    map.insert(field.name.clone(), d.clone());
                }
            }
            Some(key) => match map.get_mut(&key) {
                Some(Value::Null) if field.default_value().is_none() => {
                    map.remove(&key);
                }
                Some(Value::Object(sub)) => fill_defaults(field, sub),
                Some(Value::Array(items)) if field.repeat => {
                    for item in items.iter_mut().filter_map(Value::as_object_mut) {
                        fill_defaults(field, item);
                    }
                }
                _ => {}
            },
        }
    }
}

/// Where `input` breaks DeePMD-kit's schema, as its strict check (`normalize`, dargs) would
/// refuse it: keys it does not know, required keys missing, values of a type it does not take,
/// unknown variant tags. Keys starting with `_` are comments, as dargs trims them. Empty when
/// `dp train` would take the input.
pub fn deepmd_input_errors(input: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    match input {
        Value::Object(map) => check_object(&ROOT, map, "", &mut errors),
        _ => errors.push("the input is not an object".into()),
    }
    errors
}

fn check_object(arg: &'static Arg, map: &Map<String, Value>, path: &str, out: &mut Vec<String>) {
    let at = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    for variant in &arg.variants {
        match map.get(&variant.flag) {
            None if !variant.optional => out.push(format!("{}: required", at(&variant.flag))),
            Some(v) if variant.chosen(map).is_none() => out.push(format!(
                "{}: {v} is not one of DeePMD-kit's",
                at(&variant.flag)
            )),
            _ => {}
        }
    }
    let fields = arg.fields_for(map);
    // dargs: "no allowed keys defined, allow any keys" (`info`, `model_prob`).
    if fields.is_empty() && arg.variants.is_empty() {
        return;
    }
    for (k, v) in map.iter().filter(|(k, _)| !k.starts_with('_')) {
        if arg.variants.iter().any(|var| var.flag == *k) {
            continue;
        }
        match fields.iter().find(|f| f.is_named(k)) {
            None => out.push(format!("{}: not a key of DeePMD-kit's", at(k))),
            Some(field) => check_value(field, v, &at(k), out),
        }
    }
    for field in fields.iter().filter(|f| !f.optional) {
        if !map.keys().any(|k| field.is_named(k)) {
            out.push(format!("{}: required", at(&field.name)));
        }
    }
}

fn check_value(arg: &'static Arg, v: &Value, path: &str, out: &mut Vec<String>) {
    let takes = |t: &str| arg.types.iter().any(|x| x == t);
    let fits = match v {
        Value::Null => takes("NoneType"),
        // typeguard's numeric tower, which dargs checks with: a bool is an int, an int a float.
        Value::Bool(_) => takes("bool") || takes("int") || takes("float"),
        Value::Number(n) if n.is_f64() => takes("float"),
        Value::Number(_) => takes("int") || takes("float"),
        Value::String(_) => takes("str"),
        Value::Array(_) => takes("list"),
        Value::Object(_) => takes("dict"),
    };
    if !fits {
        out.push(format!(
            "{path}: {v} is not of type {}",
            arg.types.join(" or ")
        ));
        return;
    }
    match v {
        Value::Object(map) => check_object(arg, map, path, out),
        Value::Array(items) if arg.repeat => {
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::Object(map) => check_object(arg, map, &format!("{path}[{i}]"), out),
                    x => out.push(format!("{path}[{i}]: {x} is not an object")),
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_schema_reads_and_its_references_resolve() {
        fn walk(arg: &'static Arg, path: &str) {
            let arg = arg.resolved();
            for f in &arg.fields {
                walk(f, &format!("{path}.{}", f.name));
            }
            for v in &arg.variants {
                for c in &v.choices {
                    walk(c, &format!("{path}[{}]", c.tag));
                }
            }
        }
        walk(&ROOT, "");
        let se_a = node("model[standard].descriptor[se_e2_a]").unwrap();
        assert_eq!(se_a.name, "se_e2_a");
        assert!(se_a.fields.iter().any(|f| f.is_named("n_axis_neuron")));
    }
}

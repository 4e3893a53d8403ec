//! Reading one JSON object of input.json against the keys allowed there.
//!
//! Each section declares a [`Schema`]; [`Section::new`] rejects unknown keys and unsupported
//! values up front, and the typed getters turn values into Rust types with errors that name the
//! key's full path. Keys starting with `_` are comments, as in DeePMD-kit, and are skipped.

use serde_json::{Map, Value};

use super::deepmd_args;
use super::error::ConfigError;

type Result<T> = std::result::Result<T, ConfigError>;

/// The keys of one JSON object.
pub(crate) struct Schema {
    /// Keys read into the typed config (canonical DeePMD-kit names), in groups so that the
    /// keys several sections share are listed once.
    pub keys: &'static [&'static [&'static str]],
    /// `(key, what dpw lacks)`: DeePMD-kit keys dpw accepts only at DeePMD-kit's default,
    /// checked first and named in the refusal. Every other key DeePMD-kit knows here is
    /// accepted at its default too and refused with DeePMD-kit's own words otherwise. Grouped
    /// as `keys` is.
    pub unsupported: &'static [&'static [(&'static str, &'static str)]],
    /// Keys accepted and not used (any value).
    pub ignored: &'static [&'static str],
    /// Where this object is in DeePMD-kit's schema ([`deepmd_args::node`]).
    pub deepmd: &'static str,
}

impl Schema {
    fn valid_keys(&self) -> Vec<String> {
        let unsupported = self.unsupported_keys().map(|(k, _)| k);
        let mut v: Vec<String> = (self.keys.iter().copied().flatten())
            .chain(unsupported)
            .chain(self.ignored)
            .map(|k| k.to_string())
            .collect();
        v.sort();
        v
    }

    fn unsupported_keys(&self) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
        self.unsupported.iter().copied().flatten()
    }

    fn has_key(&self, key: &str) -> bool {
        self.keys.iter().any(|g| g.contains(&key))
    }

    pub(crate) fn deepmd_node(&self) -> &'static deepmd_args::Arg {
        deepmd_args::node(self.deepmd)
            .unwrap_or_else(|| panic!("{:?} is not in DeePMD-kit's schema", self.deepmd))
    }
}

/// `parent.key`, or `key` at the top level.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

fn display_path(path: &str) -> &str {
    if path.is_empty() {
        "<root>"
    } else {
        path
    }
}

/// A short description of a JSON value for "found ..." in messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

pub(crate) fn wrong_type(path: &str, expected: &str, found: &Value) -> ConfigError {
    ConfigError::WrongType {
        path: display_path(path).to_string(),
        expected: expected.to_string(),
        found: describe(found),
    }
}

pub(crate) fn to_f64(v: &Value, path: &str) -> Result<f64> {
    v.as_f64().ok_or_else(|| wrong_type(path, "a number", v))
}

/// A non-negative integer. An integral float such as `1e6` is accepted too: people write step
/// counts that way, and serde_json reads them as floats.
pub(crate) fn to_u64(v: &Value, path: &str) -> Result<u64> {
    const EXPECTED: &str = "a non-negative integer";
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    match v.as_f64() {
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) => Ok(x as u64),
        _ => Err(wrong_type(path, EXPECTED, v)),
    }
}

pub(crate) fn to_usize(v: &Value, path: &str) -> Result<usize> {
    let n = to_u64(v, path)?;
    usize::try_from(n).map_err(|_| ConfigError::invalid(path, format!("{n} is too large")))
}

pub(crate) fn to_bool(v: &Value, path: &str) -> Result<bool> {
    v.as_bool()
        .ok_or_else(|| wrong_type(path, "true or false", v))
}

pub(crate) fn to_str<'v>(v: &'v Value, path: &str) -> Result<&'v str> {
    v.as_str().ok_or_else(|| wrong_type(path, "a string", v))
}

pub(crate) fn to_list<'v>(v: &'v Value, path: &str, expected: &str) -> Result<&'v [Value]> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| wrong_type(path, expected, v))
}

pub(crate) fn to_usize_list(v: &Value, path: &str) -> Result<Vec<usize>> {
    let items = to_list(v, path, "a list of non-negative integers")?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| to_usize(x, &format!("{path}[{i}]")))
        .collect()
}

/// One JSON object of the input, checked against its [`Schema`].
pub(crate) struct Section<'a> {
    map: &'a Map<String, Value>,
    path: String,
    schema: &'static Schema,
    /// `(alias, canonical)` for the keys dpw reads: DeePMD-kit's other spellings of them.
    aliases: Vec<(&'static str, &'static str)>,
}

impl<'a> Section<'a> {
    pub(crate) fn new(value: &'a Value, path: &str, schema: &'static Schema) -> Result<Self> {
        let map = value
            .as_object()
            .ok_or_else(|| wrong_type(path, "an object", value))?;
        let node = schema.deepmd_node();
        let aliases = (schema.keys.iter().copied().flatten())
            .filter_map(|k| deepmd_args::lookup(node, map, k).map(|known| (*k, known)))
            .flat_map(|(k, known)| known.aliases().iter().map(move |a| (a.as_str(), k)))
            .collect();
        let sec = Section {
            map,
            path: path.to_string(),
            schema,
            aliases,
        };
        // What dpw lacks first: an unsupported `type` explains the keys that follow it.
        for (key, _) in schema.unsupported_keys() {
            if let Some(v) = map.get(*key) {
                sec.check_deepmd_key(key, v)?;
            }
        }
        for (key, v) in map {
            let ignored = schema.ignored.contains(&key.as_str());
            let checked = schema.unsupported_keys().any(|(k, _)| k == key);
            if !key.starts_with('_') && !sec.reads(key) && !ignored && !checked {
                sec.check_deepmd_key(key, v)?;
            }
        }
        for (alias, canonical) in &sec.aliases {
            if map.contains_key(*alias) && map.contains_key(*canonical) {
                return Err(ConfigError::invalid(
                    sec.path_of(alias),
                    format!("'{alias}' is an alias of '{canonical}'; give only one of them"),
                ));
            }
        }
        Ok(sec)
    }

    /// Whether dpw reads `key`, under its name or an alias.
    fn reads(&self, key: &str) -> bool {
        self.schema.has_key(key) || self.aliases.iter().any(|(a, _)| *a == key)
    }

    /// A key dpw does not read: accepted at DeePMD-kit's default, refused naming what dpw
    /// lacks (the schema's `unsupported` entry for the key or its canonical name, else
    /// DeePMD-kit's own description of the key) otherwise, and an unknown key when DeePMD-kit
    /// does not know it either.
    fn check_deepmd_key(&self, key: &str, v: &Value) -> Result<()> {
        let Some(known) = deepmd_args::lookup(self.schema.deepmd_node(), self.map, key) else {
            return Err(ConfigError::UnknownKey {
                key: key.to_string(),
                path: self.path_of(key),
                parent: display_path(&self.path).to_string(),
                valid: self.schema.valid_keys(),
            });
        };
        let lacks = (self.schema.unsupported_keys())
            .find(|(k, _)| *k == key || known.is(k))
            .map(|(_, l)| *l);
        let default = known.default_text();
        let Some(departure) = known.departure(v) else {
            return Ok(());
        };
        // A feature dpw lacks is named at its key; anything else at the key that departs from
        // DeePMD-kit's default, in DeePMD-kit's words.
        let (path, default, lacks, found) = match lacks {
            Some(lacks) => (self.path_of(key), default, lacks.to_string(), v),
            None => (
                format!("{}{}", self.path_of(key), departure.below),
                departure.known.default_text(),
                match departure.known.doc() {
                    "" => "not implemented in dpw".to_string(),
                    doc => format!(
                        "not implemented in dpw; DeePMD-kit: {:?}",
                        doc.trim_end_matches('.')
                    ),
                },
                departure.value,
            ),
        };
        Err(ConfigError::unsupported(
            path,
            format!(
                "dpw supports only {default} here ({lacks}); found {}",
                describe(found)
            ),
        ))
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The raw value of `key` (or of one of its aliases), `None` when absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        debug_assert!(self.schema.has_key(key), "{key} is not in the schema");
        self.map.get(key).or_else(|| {
            self.aliases
                .iter()
                .filter(|(_, c)| *c == key)
                .find_map(|(a, _)| self.map.get(*a))
        })
    }

    /// Like [`Section::get`], with an explicit `null` counted as absent: for keys whose
    /// DeePMD-kit default is `null`.
    pub(crate) fn get_nonnull(&self, key: &str) -> Option<&'a Value> {
        self.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn required(&self, key: &str, expected: &str) -> Result<&'a Value> {
        self.get(key).ok_or_else(|| ConfigError::Missing {
            path: self.path_of(key),
            expected: expected.to_string(),
        })
    }

    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        self.get(key)
            .map_or(Ok(default), |v| to_f64(v, &self.path_of(key)))
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get_nonnull(key)
            .map(|v| to_f64(v, &self.path_of(key)))
            .transpose()
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        self.get(key)
            .map_or(Ok(default), |v| to_usize(v, &self.path_of(key)))
    }

    pub(crate) fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get_nonnull(key)
            .map(|v| to_u64(v, &self.path_of(key)))
            .transpose()
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        self.get(key)
            .map_or(Ok(default), |v| to_bool(v, &self.path_of(key)))
    }

    pub(crate) fn string_or(&self, key: &str, default: &str) -> Result<String> {
        match self.get(key) {
            Some(v) => Ok(to_str(v, &self.path_of(key))?.to_string()),
            None => Ok(default.to_string()),
        }
    }

    pub(crate) fn usize_list_or(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        match self.get(key) {
            Some(v) => to_usize_list(v, &self.path_of(key)),
            None => Ok(default.to_vec()),
        }
    }

    /// Whether `key` was given at all (an ignored key, for a warning).
    pub(crate) fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }
}

/// Errors unless `x > 0`.
pub(crate) fn positive(x: f64, path: &str) -> Result<f64> {
    if x > 0.0 {
        Ok(x)
    } else {
        Err(ConfigError::invalid(
            path,
            format!("must be > 0, found {x:?}"),
        ))
    }
}

/// Errors unless `x >= 0`.
pub(crate) fn non_negative(x: f64, path: &str) -> Result<f64> {
    if x >= 0.0 {
        Ok(x)
    } else {
        Err(ConfigError::invalid(
            path,
            format!("must be >= 0, found {x:?}"),
        ))
    }
}

/// Errors unless `n >= 1`.
pub(crate) fn at_least_one(n: usize, path: &str) -> Result<usize> {
    if n >= 1 {
        Ok(n)
    } else {
        Err(ConfigError::invalid(path, "must be >= 1, found 0"))
    }
}

//! Reading one JSON object of input.json against the keys allowed there.
//!
//! Each section declares a [`Schema`]; [`Section::new`] rejects unknown keys and unsupported
//! values up front, and the typed getters turn values into Rust types with errors that name the
//! key's full path. Keys starting with `_` are comments, as in DeePMD-kit, and are skipped.

use serde_json::{Map, Value};

use super::ConfigError;

type Result<T> = std::result::Result<T, ConfigError>;

/// A value dpw accepts for a DeePMD-kit key only because it is that key's default: the key is
/// valid in DeePMD-kit, dpw does not implement other values, so anything else is an error
/// rather than being silently ignored.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fixed {
    /// A float key at 0.
    Zero,
    /// A count key at 0 (written back as the integer 0).
    ZeroCount,
    False,
    Null,
    /// A key DeePMD-kit gives no default (`training.mixed_precision`: any value it takes turns
    /// the feature on): accepted absent or null, and left out of out.json, where DeePMD-kit's
    /// argcheck refuses a null.
    Unset,
    EmptyList,
    Str(&'static str),
}

impl Fixed {
    fn matches(self, v: &Value) -> bool {
        match self {
            Fixed::Zero | Fixed::ZeroCount => v.as_f64() == Some(0.0),
            Fixed::False => v == &Value::Bool(false),
            Fixed::Null | Fixed::Unset => v.is_null(),
            Fixed::EmptyList => v.as_array().is_some_and(|a| a.is_empty()),
            Fixed::Str(s) => v.as_str() == Some(s),
        }
    }

    pub(crate) fn to_value(self) -> Value {
        match self {
            Fixed::Zero => Value::from(0.0),
            Fixed::ZeroCount => Value::from(0),
            Fixed::False => Value::Bool(false),
            Fixed::Null | Fixed::Unset => Value::Null,
            Fixed::EmptyList => Value::Array(vec![]),
            Fixed::Str(s) => Value::from(s),
        }
    }
}

/// The keys of one JSON object.
pub(crate) struct Schema {
    /// Keys read into the typed config (canonical DeePMD-kit names), in groups so that the
    /// keys several sections share are listed once.
    pub keys: &'static [&'static [&'static str]],
    /// `(alias, canonical)`: DeePMD-kit's alternative spellings.
    pub aliases: &'static [(&'static str, &'static str)],
    /// `(key, only accepted value, why)`: see [`Fixed`]. Checked when the section is opened and
    /// written back by [`Schema::write_fixed`] so out.json lists them like `dp train` does.
    /// Grouped as `keys` is.
    pub fixed: &'static [&'static [(&'static str, Fixed, &'static str)]],
    /// Keys accepted and not used (any value).
    pub ignored: &'static [&'static str],
}

impl Schema {
    fn valid_keys(&self) -> Vec<String> {
        let fixed = self.fixed_keys().map(|(k, _, _)| k);
        let mut v: Vec<String> = (self.keys.iter().copied().flatten())
            .chain(fixed)
            .chain(self.ignored)
            .map(|k| k.to_string())
            .collect();
        v.sort();
        v
    }

    fn fixed_keys(&self) -> impl Iterator<Item = &'static (&'static str, Fixed, &'static str)> {
        self.fixed.iter().copied().flatten()
    }

    fn has_key(&self, key: &str) -> bool {
        self.keys.iter().any(|g| g.contains(&key))
    }

    fn knows(&self, key: &str) -> bool {
        self.has_key(key)
            || self.aliases.iter().any(|(a, _)| *a == key)
            || self.fixed_keys().any(|(k, _, _)| *k == key)
            || self.ignored.contains(&key)
    }

    /// Adds the fixed keys with their one accepted value to an expanded-JSON object.
    pub(crate) fn write_fixed(&self, map: &mut Map<String, Value>) {
        for (key, value, _) in self.fixed_keys() {
            if !matches!(value, Fixed::Unset) {
                map.insert(key.to_string(), value.to_value());
            }
        }
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
}

impl<'a> Section<'a> {
    pub(crate) fn new(value: &'a Value, path: &str, schema: &'static Schema) -> Result<Self> {
        let map = value
            .as_object()
            .ok_or_else(|| wrong_type(path, "an object", value))?;
        let sec = Section {
            map,
            path: path.to_string(),
            schema,
        };
        // Fixed keys first: an unsupported `type` explains the unknown keys that follow it.
        for (key, only, why) in schema.fixed_keys() {
            if let Some(v) = map.get(*key) {
                if !only.matches(v) {
                    return Err(ConfigError::unsupported(
                        sec.path_of(key),
                        format!(
                            "dpw supports only {} here ({why}); found {}",
                            only.to_value(),
                            describe(v)
                        ),
                    ));
                }
            }
        }
        for key in map.keys() {
            if !key.starts_with('_') && !schema.knows(key) {
                return Err(ConfigError::UnknownKey {
                    key: key.clone(),
                    path: sec.path_of(key),
                    parent: display_path(path).to_string(),
                    valid: schema.valid_keys(),
                });
            }
        }
        for (alias, canonical) in schema.aliases {
            if map.contains_key(*alias) && map.contains_key(*canonical) {
                return Err(ConfigError::invalid(
                    sec.path_of(alias),
                    format!("'{alias}' is an alias of '{canonical}'; give only one of them"),
                ));
            }
        }
        Ok(sec)
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
            self.schema
                .aliases
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

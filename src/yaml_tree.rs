//! DeePMD-kit's serialised model tree (`model.serialize()` as YAML, docs/deepmd-spec.md §14):
//! reading a node with the path that names it in errors, and writing `np.ndarray` nodes. The
//! model's reader and writer (`model::yaml`) and each fitting's part of the tree use it.

use std::ops::RangeInclusive;

use anyhow::{anyhow, bail, ensure, Result};
use serde_yaml_ng::Value;

/// A node of the parsed tree and its path (`model.descriptor.sel[1]`), so that every error names
/// the key that was wrong.
pub(crate) struct At<'a> {
    pub v: &'a Value,
    pub path: String,
}

impl<'a> At<'a> {
    pub(crate) fn child(&self, v: &'a Value, key: &str) -> At<'a> {
        let path = if self.path.is_empty() {
            key.to_string()
        } else if key.starts_with('[') {
            format!("{}{key}", self.path)
        } else {
            format!("{}.{key}", self.path)
        };
        At { v, path }
    }

    /// The value under `key`; `null` counts as present.
    pub(crate) fn key(&self, key: &str) -> Result<At<'a>> {
        let v = self.v.as_mapping().and_then(|m| m.get(key));
        v.map(|v| self.child(v, key))
            .ok_or_else(|| anyhow!("{}: missing key `{key}`", self.display()))
    }

    /// The value under `key`, or `None` where it is missing or `null`.
    pub(crate) fn opt(&self, key: &str) -> Option<At<'a>> {
        let v = self.v.as_mapping().and_then(|m| m.get(key))?;
        (!v.is_null()).then(|| self.child(v, key))
    }

    pub(crate) fn display(&self) -> &str {
        if self.path.is_empty() {
            "<root>"
        } else {
            &self.path
        }
    }

    pub(crate) fn fail<T>(&self, what: &str) -> Result<T> {
        bail!(
            "{}: expected {what}, found {}",
            self.display(),
            brief(self.v)
        )
    }

    pub(crate) fn seq(&self) -> Result<Vec<At<'a>>> {
        match self.v {
            Value::Sequence(s) => Ok(s
                .iter()
                .enumerate()
                .map(|(i, v)| self.child(v, &format!("[{i}]")))
                .collect()),
            _ => self.fail("a list"),
        }
    }
    /// The list at `key`, which must hold `n` items (`what`: what they are, said with n).
    pub(crate) fn seq_of(&self, key: &str, n: usize, what: &str) -> Result<Vec<At<'a>>> {
        let items = self.key(key)?.seq()?;
        ensure!(
            items.len() == n,
            "{}.{key}: expected {n} {what}, found {}",
            self.path,
            items.len()
        );
        Ok(items)
    }
    pub(crate) fn str(&self) -> Result<&'a str> {
        self.v.as_str().map_or_else(|| self.fail("a string"), Ok)
    }
    pub(crate) fn bool(&self) -> Result<bool> {
        self.v
            .as_bool()
            .map_or_else(|| self.fail("true or false"), Ok)
    }
    pub(crate) fn f64(&self) -> Result<f64> {
        self.v.as_f64().map_or_else(|| self.fail("a number"), Ok)
    }
    pub(crate) fn u64(&self) -> Result<u64> {
        self.v
            .as_u64()
            .map_or_else(|| self.fail("a non-negative integer"), Ok)
    }
    pub(crate) fn usize(&self) -> Result<usize> {
        self.u64().map(|n| n as usize)
    }
    pub(crate) fn usizes(&self) -> Result<Vec<usize>> {
        self.seq()?.iter().map(At::usize).collect()
    }

    /// A string field that must have one of the values dpw implements.
    pub(crate) fn expect(&self, key: &str, allowed: &[&str]) -> Result<()> {
        let at = self.key(key)?;
        let s = at.str()?;
        ensure!(
            allowed.contains(&s),
            "{}: unsupported value {s:?} (dpw supports {})",
            at.path,
            allowed.join(", ")
        );
        Ok(())
    }

    /// A feature dpw does not implement must be absent, `null`, `false`, `0` or empty.
    pub(crate) fn expect_off(&self, key: &str) -> Result<()> {
        let Some(at) = self.opt(key) else {
            return Ok(());
        };
        let off = match at.v {
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::Sequence(s) => s.is_empty(),
            Value::Mapping(m) => m.is_empty(),
            _ => false,
        };
        ensure!(
            off,
            "{}: unsupported value {} (dpw supports only none)",
            at.path,
            brief(at.v)
        );
        Ok(())
    }

    /// DeePMD-kit's `check_version_compatibility(data.pop("@version", default), max, min)`:
    /// a file of a later format is refused rather than read as if it were this one.
    pub(crate) fn version(
        &self,
        versions: RangeInclusive<u64>,
        default: Option<u64>,
    ) -> Result<()> {
        let found = self.v.as_mapping().and_then(|m| m.get("@version"));
        let v = match (found, default) {
            (None, Some(d)) => d,
            (None, None) => bail!("{}: missing key `@version`", self.display()),
            (Some(v), _) => self.child(v, "@version").u64()?,
        };
        ensure!(
            versions.contains(&v),
            "{}.@version: version {v} is not supported (DeePMD-kit 3.2.0 reads versions {} to \
             {} here)",
            self.path,
            versions.start(),
            versions.end()
        );
        Ok(())
    }

    /// Every key of this mapping must be one of `lists`: DeePMD-kit's deserialisers pass the
    /// keys they do not take out to a constructor, which refuses any it does not know.
    pub(crate) fn known(&self, lists: &[&[&str]]) -> Result<()> {
        let Value::Mapping(m) = self.v else {
            return self.fail("a mapping");
        };
        for k in m.keys() {
            let ok = k
                .as_str()
                .is_some_and(|k| lists.iter().any(|l| l.contains(&k)));
            ensure!(
                ok,
                "{}: unknown key {} (DeePMD-kit 3.2.0 refuses it too)",
                self.display(),
                brief(k)
            );
        }
        Ok(())
    }

    /// An `np.ndarray` node of the given shape, flattened row-major.
    pub(crate) fn array(&self, shape: &[usize]) -> Result<Vec<f64>> {
        self.expect("@class", &["np.ndarray"])?;
        // float32 models are read exactly and then computed in f64 like everything in dpw.
        self.expect("dtype", &["float64", "float32"])?;
        let value = self.key("value")?;
        let mut found = Vec::new();
        let mut v = value.v;
        while let Value::Sequence(s) = v {
            found.push(s.len());
            match s.first() {
                Some(first) => v = first,
                None => break,
            }
        }
        ensure!(
            found == shape,
            "{}: expected shape {shape:?}, found {found:?}",
            self.path
        );
        let mut out = Vec::with_capacity(shape.iter().product());
        flatten(value.v, shape, &mut out).map_err(|e| anyhow!("{}{e}", value.path))?;
        Ok(out)
    }
}

/// The leaves of a nested list of the given shape, row-major. Paths are only built on error (as
/// the index suffix of the culprit), since arrays can hold millions of numbers.
fn flatten(v: &Value, shape: &[usize], out: &mut Vec<f64>) -> Result<(), String> {
    match (shape.split_first(), v) {
        (None, v) => out.push(
            v.as_f64()
                .ok_or_else(|| format!(": expected a number, found {}", brief(v)))?,
        ),
        (Some((&n, rest)), Value::Sequence(s)) if s.len() == n => {
            for (i, x) in s.iter().enumerate() {
                flatten(x, rest, out).map_err(|e| format!("[{i}]{e}"))?;
            }
        }
        (Some((&n, _)), v) => {
            return Err(format!(
                ": ragged array, expected a list of {n}, found {}",
                brief(v)
            ))
        }
    }
    Ok(())
}

/// A value shortened for error messages (arrays can be megabytes).
pub(crate) fn brief(v: &Value) -> String {
    match v {
        Value::Mapping(_) => "a mapping".into(),
        Value::Sequence(s) => format!("a list of {}", s.len()),
        Value::Tagged(_) => "a tagged value".into(),
        _ => serde_yaml_ng::to_string(v).map_or_else(|_| "?".into(), |s| s.trim().into()),
    }
}

/// `obj! { "key" => value, ... }`: a YAML mapping, each value converted with `Value::from`
/// (numbers, bools, strings, slices and vectors of them, or a `Value`). Key order does not matter:
/// the emitter sorts keys like PyYAML.
macro_rules! obj {
    ($($k:literal => $v:expr),* $(,)?) => {
        serde_yaml_ng::Value::Mapping(
            [$(($k.into(), serde_yaml_ng::Value::from($v))),*].into_iter().collect()
        )
    };
}
pub(crate) use obj;

/// An `np.ndarray` node: float64, row-major `data` nested to `shape`.
pub(crate) fn ndarray(shape: &[usize], data: &[f64]) -> Value {
    fn nest(shape: &[usize], data: &[f64]) -> Value {
        match shape.split_first() {
            None => data[0].into(),
            Some((&n, rest)) => {
                let step = rest.iter().product::<usize>();
                Value::Sequence((0..n).map(|i| nest(rest, &data[i * step..])).collect())
            }
        }
    }
    obj! {
        "@class" => "np.ndarray", "@is_variable" => true, "@version" => 1, "dtype" => "float64",
        "value" => nest(shape, data),
    }
}

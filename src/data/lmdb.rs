//! DeePMD-kit's LMDB training data (`"systems": "water.lmdb"`; its reader is
//! deepmd/dpmodel/utils/lmdb_data.py): one LMDB environment whose `__metadata__` record holds
//! the frame count, the key format (`frame_idx_fmt`, `012d`), the type_map and optionally each
//! frame's system id, and whose records `000000000000`, `000000000001`, ... hold one frame each,
//! a msgpack map of arrays (`{type, shape, data}`): `atom_types`, `coords`, `cells`, `energies`,
//! `forces`, `virials`, and any other label under its npy name (`fparam`, `aparam`, `dos`, a
//! property's `band_prop`, ...), `atomic_*` standing for `atom_*` (`atomic_dos`, `atom_dos.npy`).
//! DeePMD-kit reads each field as the label of its name so renamed (`decode_lmdb_frame`,
//! `_canonical_lmdb_key`), present where the frame holds an array or a number and no
//! `find_<label>` 0 says otherwise (`_frame_source_available`).
//!
//! dpw reads it as the deepmd/npy systems its frames would make: frames of one system id, one
//! sequence of atom types, periodic or not and with the same labels form one system, in order
//! of first appearance, named `file.lmdb#N`. Each is read through the reader of a folder
//! (system.rs, through [`Source`]), so it gives the statistics and batches of the npy form of the
//! same frames. (DeePMD-kit draws an LMDB's batches over its frames of one atom count rather
//! than system by system; for data of one system, as its example, the two draw alike.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions};
use rmpv::Value;

use super::error::DataError;
use super::source::{Location, Source};

/// The systems of the LMDB environment `file`, as the paths [`with_group`] reads.
pub fn system_groups(file: &Path) -> Result<Vec<PathBuf>, DataError> {
    let lmdb = open(file)?;
    tracing::info!(
        "{}: {} frames in {} system{} (frames of one system id, atom types and labels)",
        file.display(),
        lmdb.groups.iter().map(|g| g.keys.len()).sum::<usize>(),
        lmdb.groups.len(),
        if lmdb.groups.len() == 1 { "" } else { "s" },
    );
    Ok((0..lmdb.groups.len())
        .map(|g| group_path(file, g))
        .collect())
}

/// `file.lmdb#N`, the name of the environment's system `N`.
fn group_path(file: &Path, group: usize) -> PathBuf {
    Location::Lmdb {
        file: file.to_path_buf(),
        group,
    }
    .to_path()
}

/// Runs `f` on system `group` of the LMDB environment `file`.
pub fn with_group<R>(
    file: &Path,
    group: usize,
    f: impl FnOnce(&dyn Source) -> Result<R, DataError>,
) -> Result<R, DataError> {
    let lmdb = open(file)?;
    let g = lmdb.groups.get(group).ok_or_else(|| DataError::Invalid {
        path: group_path(file, group),
        reason: format!("the LMDB environment has {} systems", lmdb.groups.len()),
    })?;
    let source = GroupSource::read(&lmdb, g, group_path(file, group))?;
    f(&source)
}

/// An open environment and how its frames group into systems.
struct Lmdb {
    file: PathBuf,
    env: Env,
    db: Database<Bytes, Bytes>,
    type_map: Option<Vec<String>>,
    groups: Vec<Group>,
    /// When `data.mdb` was written and its size, to see a rewritten file.
    stamp: (Option<SystemTime>, u64),
}

/// The frames of one system.
struct Group {
    keys: Vec<String>,
    atype: Vec<usize>,
    pbc: bool,
    /// The labels its frames hold, by npy name (`energy`, `atom_dos`), sorted.
    labels: Vec<String>,
}

fn stamp(file: &Path) -> Result<(Option<SystemTime>, u64), DataError> {
    let data = file.join("data.mdb");
    let meta = std::fs::metadata(&data).map_err(|e| super::error::io_error(&data, e))?;
    Ok((meta.modified().ok(), meta.len()))
}

/// The environment at `file`, opened and grouped once per process (a system is read many times:
/// its statistics, its batches, again when the cache lets it go) unless it was rewritten since.
fn open(file: &Path) -> Result<Arc<Lmdb>, DataError> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Arc<Lmdb>>>> = OnceLock::new();
    let key = std::fs::canonicalize(file).map_err(|e| super::error::io_error(file, e))?;
    let now = stamp(file)?;
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .expect("not poisoned");
    if let Some(l) = open.get(&key).filter(|l| l.stamp == now) {
        return Ok(l.clone());
    }
    // The old environment closes before the new one opens: LMDB opens a path once per process.
    open.remove(&key);
    let lmdb = Arc::new(Lmdb::read(file, now)?);
    open.insert(key, lmdb.clone());
    Ok(lmdb)
}

fn lmdb_error(file: &Path, e: heed::Error) -> DataError {
    invalid(file, format!("cannot read as LMDB: {e}"))
}

fn invalid(file: &Path, reason: impl Into<String>) -> DataError {
    DataError::Invalid {
        path: file.to_path_buf(),
        reason: reason.into(),
    }
}

impl Lmdb {
    fn read(file: &Path, stamp: (Option<SystemTime>, u64)) -> Result<Self, DataError> {
        let lmdb_error = |e| lmdb_error(file, e);
        // Read-only and without the lock file, as DeePMD-kit opens it: the data may sit on a
        // read-only file system. The map must cover the file.
        let map_size = (stamp.1 as usize).next_multiple_of(1 << 20).max(1 << 20);
        // SAFETY: LMDB maps the file; heed's contract is that it is not opened twice in the
        // process (`open` keeps one per path) and that no one truncates it while mapped, which
        // a file being trained on is not.
        let mut options = EnvOpenOptions::new();
        options.map_size(map_size);
        let env = unsafe {
            options.flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK);
            options.open(file)
        }
        .map_err(lmdb_error)?;
        let rtxn = env.read_txn().map_err(lmdb_error)?;
        let db: Database<Bytes, Bytes> = env
            .open_database(&rtxn, None)
            .map_err(lmdb_error)?
            .ok_or_else(|| invalid(file, "has no unnamed database"))?;
        let meta = Record::read(db, &rtxn, file, "__metadata__")?;
        let nframes = meta.count("nframes")?;
        let format = match meta.get("frame_idx_fmt") {
            None => "012d".to_string(),
            Some(v) => meta.string(v, "frame_idx_fmt")?,
        };
        let width = frame_key_width(&format)
            .ok_or_else(|| meta.bad("frame_idx_fmt", "a zero-padded width such as \"012d\""))?;
        let type_map = match meta.get("type_map") {
            None | Some(Value::Nil) => None,
            Some(v) => Some(meta.strings(v, "type_map")?),
        };
        let system_ids = match meta.get("frame_system_ids") {
            None | Some(Value::Nil) => None,
            Some(v) => {
                let ids = meta.integers(v, "frame_system_ids")?;
                if ids.len() != nframes {
                    return Err(meta.bad(
                        "frame_system_ids",
                        &format!("one system id per frame ({nframes})"),
                    ));
                }
                Some(ids)
            }
        };
        type GroupKey = (i64, Vec<usize>, bool, Vec<String>);
        let mut groups: Vec<Group> = Vec::new();
        let mut found: HashMap<GroupKey, usize> = HashMap::new();
        for i in 0..nframes {
            let key = format!("{i:0width$}");
            let frame = Record::read(db, &rtxn, file, &key)?;
            let group_key = (
                system_ids.as_ref().map_or(0, |ids| ids[i]),
                frame.atom_types()?,
                frame.find("box").is_some_and(|f| frame.has(f)),
                frame.labels(),
            );
            let g = match found.get(&group_key) {
                Some(&g) => g,
                None => {
                    groups.push(Group {
                        keys: Vec::new(),
                        atype: group_key.1.clone(),
                        pbc: group_key.2,
                        labels: group_key.3.clone(),
                    });
                    found.insert(group_key, groups.len() - 1);
                    groups.len() - 1
                }
            };
            groups[g].keys.push(key);
        }
        if groups.is_empty() {
            return Err(invalid(file, "holds no frames (nframes is 0)"));
        }
        drop(rtxn);
        Ok(Lmdb {
            file: file.to_path_buf(),
            env,
            db,
            type_map,
            groups,
            stamp,
        })
    }
}

/// The key width of a Python format such as `012d`.
fn frame_key_width(format: &str) -> Option<usize> {
    let digits = format.strip_prefix('0')?.strip_suffix('d')?;
    digits.parse().ok()
}

/// A decoded msgpack map: the metadata or one frame, with its record named in errors.
struct Record<'a> {
    map: Vec<(Value, Value)>,
    file: &'a Path,
    key: String,
}

/// A map key as text (msgpack writers give strings or, in raw mode, bytes).
fn key_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => s.as_str(),
        Value::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

impl<'a> Record<'a> {
    /// The record `key` of the environment `file`.
    fn read(
        db: Database<Bytes, Bytes>,
        rtxn: &heed::RoTxn,
        file: &'a Path,
        key: &str,
    ) -> Result<Self, DataError> {
        let bytes = db
            .get(rtxn, key.as_bytes())
            .map_err(|e| lmdb_error(file, e))?
            .ok_or_else(|| invalid(file, format!("has no record {key:?}")))?;
        let value = rmpv::decode::read_value(&mut &bytes[..])
            .map_err(|e| invalid(file, format!("record {key:?} is not msgpack: {e}")))?;
        match value {
            Value::Map(map) => Ok(Record {
                map,
                file,
                key: key.to_string(),
            }),
            _ => Err(invalid(
                file,
                format!("record {key:?} is not a msgpack map"),
            )),
        }
    }

    fn bad(&self, field: &str, expected: &str) -> DataError {
        invalid(
            self.file,
            format!("record {:?}, {field}: expected {expected}", self.key),
        )
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.map
            .iter()
            .find(|(k, _)| key_text(k) == Some(field))
            .map(|(_, v)| v)
    }

    fn has(&self, field: &str) -> bool {
        self.get(field).is_some_and(|v| !v.is_nil())
    }

    fn count(&self, field: &str) -> Result<usize, DataError> {
        self.get(field)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.bad(field, "a non-negative integer"))
    }

    fn string(&self, v: &Value, field: &str) -> Result<String, DataError> {
        key_text(v)
            .map(str::to_string)
            .ok_or_else(|| self.bad(field, "a string"))
    }

    fn strings(&self, v: &Value, field: &str) -> Result<Vec<String>, DataError> {
        let items = v
            .as_array()
            .ok_or_else(|| self.bad(field, "a list of strings"))?;
        items.iter().map(|x| self.string(x, field)).collect()
    }

    fn integers(&self, v: &Value, field: &str) -> Result<Vec<i64>, DataError> {
        let bad = || self.bad(field, "a list of integers");
        match v {
            Value::Array(items) => items.iter().map(|x| x.as_i64().ok_or_else(bad)).collect(),
            _ => self
                .array(field)?
                .1
                .into_iter()
                .map(|x| (x.fract() == 0.0).then_some(x as i64).ok_or_else(bad))
                .collect(),
        }
    }

    /// An encoded numpy array (`{type, shape, data}`), or a plain number or list of numbers.
    fn array(&self, field: &str) -> Result<(Vec<usize>, Vec<f64>), DataError> {
        let expected = "a numpy array ({type, shape, data}) or numbers";
        let v = self.get(field).ok_or_else(|| self.bad(field, expected))?;
        let number = |x: &Value| x.as_f64().or_else(|| x.as_i64().map(|i| i as f64));
        match v {
            Value::Map(entries) => {
                let entry = |name: &str| {
                    entries
                        .iter()
                        .find(|(k, _)| key_text(k) == Some(name))
                        .map(|(_, v)| v)
                };
                let dtype = entry("type").and_then(key_text);
                let data = match entry("data") {
                    Some(Value::Binary(b)) => Some(b.as_slice()),
                    _ => None,
                };
                let (Some(dtype), Some(data)) = (dtype, data) else {
                    return Err(self.bad(field, expected));
                };
                let descr = numpy_descr(dtype)
                    .ok_or_else(|| self.bad(field, &format!("a number type, not {dtype:?}")))?;
                let size: usize = descr[2..].parse().expect("a size");
                let shape: Vec<usize> = match entry("shape") {
                    None => vec![data.len() / size],
                    Some(s) => s
                        .as_array()
                        .and_then(|d| {
                            d.iter()
                                .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                                .collect::<Option<_>>()
                        })
                        .ok_or_else(|| self.bad(field, "a shape of non-negative integers"))?,
                };
                let n = shape.iter().product();
                let values = super::npy::decode_items(&descr, data, n).ok_or_else(|| {
                    self.bad(
                        field,
                        &format!("{n} items of {dtype} for the shape {shape:?}"),
                    )
                })?;
                Ok((shape, values))
            }
            Value::Array(items) => {
                let values: Option<Vec<f64>> = items.iter().map(number).collect();
                let values = values.ok_or_else(|| self.bad(field, expected))?;
                Ok((vec![values.len()], values))
            }
            x => number(x)
                .map(|v| (vec![], vec![v]))
                .ok_or_else(|| self.bad(field, expected)),
        }
    }

    fn atom_types(&self) -> Result<Vec<usize>, DataError> {
        let types = self.integers(
            self.get("atom_types")
                .ok_or_else(|| self.bad("atom_types", "each atom's type"))?,
            "atom_types",
        )?;
        types
            .into_iter()
            .map(|t| usize::try_from(t).ok())
            .collect::<Option<_>>()
            .ok_or_else(|| {
                self.bad(
                    "atom_types",
                    "non-negative types (virtual atoms, type -1, are not supported)",
                )
            })
    }

    /// The field DeePMD-kit reads as `name` (its npy name: `coord`, `atom_dos`).
    fn find(&self, name: &str) -> Option<&str> {
        self.map
            .iter()
            .filter_map(|(k, _)| key_text(k))
            .find(|k| npy_name(k) == name)
    }

    /// The labels the frame holds, by npy name, sorted: its fields but the structure (atom
    /// types, coordinates, cell) and the bookkeeping DeePMD-kit drops, holding an array or a
    /// number (what DeePMD-kit counts as present), and not denied by a `find_<label>` 0.
    fn labels(&self) -> Vec<String> {
        let flag = |name: &str| {
            let v = self.get(self.find(&format!("find_{name}"))?)?;
            v.as_f64().or_else(|| v.as_i64().map(|i| i as f64))
        };
        let mut labels: Vec<String> = (self.map.iter())
            .filter_map(|(k, v)| Some((npy_name(key_text(k)?), v)))
            .filter(|(name, v)| {
                !NOT_LABELS.contains(&name.as_str())
                    && !name.starts_with("find_")
                    && (is_encoded_array(v) || v.is_number() || v.is_bool())
                    && flag(name) != Some(0.0)
            })
            .map(|(name, _)| name)
            .collect();
        labels.sort();
        labels
    }
}

/// The fields of a frame that are not labels: its structure, and what DeePMD-kit drops.
const NOT_LABELS: [&str; 6] = ["atype", "coord", "box", "atom_numbs", "atom_names", "orig"];

/// The LMDB fields DeePMD-kit renames, and their npy names (`_KEY_REMAP`).
const RENAMED: [(&str, &str); 6] = [
    ("coords", "coord"),
    ("cells", "box"),
    ("energies", "energy"),
    ("forces", "force"),
    ("atom_types", "atype"),
    ("virials", "virial"),
];

/// The npy name DeePMD-kit reads the LMDB field `field` as (`_canonical_lmdb_key`).
fn npy_name(field: &str) -> String {
    if let Some((_, name)) = RENAMED.iter().find(|(f, _)| *f == field) {
        return name.to_string();
    }
    match (
        field.strip_prefix("find_atomic_"),
        field.strip_prefix("atomic_"),
    ) {
        (Some(rest), _) => format!("find_atom_{rest}"),
        (None, Some(rest)) => format!("atom_{rest}"),
        _ => field.to_string(),
    }
}

/// The LMDB field of npy name `name` in DeePMD-kit's own LMDB files, to name one a frame lacks.
fn lmdb_field(name: &str) -> &str {
    RENAMED
        .iter()
        .find(|(_, n)| *n == name)
        .map_or(name, |(field, _)| field)
}

/// Whether `v` is an encoded numpy array, `{type, data, ...}` (`_is_encoded_array`).
fn is_encoded_array(v: &Value) -> bool {
    v.as_map().is_some_and(|m| {
        let has = |name| m.iter().any(|(k, _)| key_text(k) == Some(name));
        has("type") && has("data")
    })
}

/// numpy's name of a number type (`float32`, `<f4`) as an npy `descr` (`<f4`); little-endian,
/// the byte order of every machine DeePMD-kit writes these on.
fn numpy_descr(dtype: &str) -> Option<String> {
    let named = match dtype {
        "float16" => "f2",
        "float32" => "f4",
        "float64" => "f8",
        "int8" => "i1",
        "int16" => "i2",
        "int32" => "i4",
        "int64" => "i8",
        "uint8" => "u1",
        "uint16" => "u2",
        "uint32" => "u4",
        "uint64" => "u8",
        d => return matches!(d.as_bytes().first(), Some(b'<' | b'|' | b'=')).then(|| d.into()),
    };
    Some(format!("<{named}"))
}

/// One system of an environment as a deepmd/npy system: `type.raw`, the environment's
/// `type_map.raw`, `nopbc` when its frames have no cell, and one set of its frames, each
/// array stacked from the frames' field of its name when asked for, so that a field the model
/// does not read is neither converted nor checked (as DeePMD-kit reads its requirements).
struct GroupSource<'a> {
    path: PathBuf,
    lmdb: &'a Lmdb,
    group: &'a Group,
    frames: Vec<Record<'a>>,
}

/// One frame's shape of the array `name` (npy name) of a system of `natoms` atoms, where
/// DeePMD-kit reshapes it (`decode_lmdb_frame`); any other label keeps the frame's shape.
fn frame_shape(name: &str, natoms: usize) -> Option<Vec<usize>> {
    match name {
        "coord" | "force" => Some(vec![natoms, 3]),
        "box" | "virial" => Some(vec![9]),
        "energy" => Some(vec![]),
        _ => None,
    }
}

/// The npy name of the entry of the one set, `set.000/coord.npy` → `coord`.
fn set_entry(rel: &str) -> Option<&str> {
    rel.strip_prefix(SET)?
        .strip_prefix('/')?
        .strip_suffix(".npy")
}

impl<'a> GroupSource<'a> {
    fn read(lmdb: &'a Lmdb, group: &'a Group, path: PathBuf) -> Result<Self, DataError> {
        let file = &lmdb.file;
        let rtxn = lmdb.env.read_txn().map_err(|e| lmdb_error(file, e))?;
        let frames = (group.keys.iter())
            .map(|key| Record::read(lmdb.db, &rtxn, file, key))
            .collect::<Result<_, _>>()?;
        Ok(GroupSource {
            path,
            lmdb,
            group,
            frames,
        })
    }

    /// Whether the system's frames hold the array of npy name `name`.
    fn holds(&self, name: &str) -> bool {
        match name {
            "coord" => true,
            "box" => self.group.pbc,
            _ => self.group.labels.iter().any(|l| l == name),
        }
    }

    /// The frames' field `name` (npy name), stacked: `[nframes, ...]` of one frame's shape.
    fn stack(&self, name: &str) -> Result<(Vec<usize>, Vec<f64>), DataError> {
        let natoms = self.group.atype.len();
        let mut shape = frame_shape(name, natoms);
        let mut all = Vec::new();
        for frame in &self.frames {
            let field = frame.find(name).unwrap_or(lmdb_field(name));
            let (found, values) = frame.array(field)?;
            match &shape {
                // The first frame of a label gives its shape; the others must have it.
                None => shape = Some(found),
                Some(s) if frame_shape(name, natoms).is_some() => {
                    let n: usize = s.iter().product();
                    if values.len() != n {
                        return Err(frame.bad(field, &format!("{n} numbers")));
                    }
                }
                Some(s) if *s != found => {
                    let first = &self.group.keys[0];
                    return Err(frame.bad(field, &format!("the shape {s:?} of record {first:?}")));
                }
                Some(_) => {}
            }
            all.extend(values);
        }
        let mut shape = shape.expect("a system has frames");
        shape.insert(0, self.frames.len());
        Ok((shape, all))
    }
}

const SET: &str = "set.000";

impl Source for GroupSource<'_> {
    /// Messages name what the LMDB holds: `data.lmdb#1/atom_types`, `data.lmdb#1/coords`,
    /// `data.lmdb#__metadata__/type_map`, not the npy files it stands in for.
    fn path(&self, rel: &str) -> PathBuf {
        let field = match rel {
            "type.raw" => "atom_types",
            "type_map.raw" => {
                let file = self.lmdb.file.display();
                return PathBuf::from(format!("{file}#__metadata__/type_map"));
            }
            _ => match set_entry(rel) {
                Some(name) => self.frames[0].find(name).unwrap_or(lmdb_field(name)),
                None => rel,
            },
        };
        self.path.join(field)
    }

    fn has_file(&self, rel: &str) -> bool {
        match rel {
            "type.raw" => true,
            "type_map.raw" => self.lmdb.type_map.is_some(),
            "nopbc" => !self.group.pbc,
            _ => set_entry(rel).is_some_and(|name| self.holds(name)),
        }
    }

    fn sets(&self) -> Result<Vec<String>, DataError> {
        Ok(vec![SET.to_string()])
    }

    fn tokens(&self, rel: &str) -> Result<Vec<String>, DataError> {
        match (rel, &self.lmdb.type_map) {
            ("type.raw", _) => Ok(self.group.atype.iter().map(usize::to_string).collect()),
            ("type_map.raw", Some(names)) => Ok(names.clone()),
            _ => Err(DataError::Missing {
                path: self.path(rel),
            }),
        }
    }

    fn array(&self, rel: &str) -> Result<(Vec<usize>, Vec<f64>), DataError> {
        match set_entry(rel).filter(|name| self.holds(name)) {
            Some(name) => self.stack(name),
            None => Err(DataError::Missing {
                path: self.path(rel),
            }),
        }
    }
}

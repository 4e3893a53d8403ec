//! How a system's atom type indices become the model's: through the element names of its
//! `type_map.raw` where it has one, else as indices into the model's type_map (DeePMD-kit's
//! `DeepmdData`). One mapping for `type.raw` and for a mixed-type system's frames.

use std::path::{Path, PathBuf};

use super::error::DataError;
use super::source::Source;

pub(super) struct TypeIndex {
    /// The system's `type_map.raw`, and the model type of each of its elements (`None`: absent
    /// from the model's type_map).
    names: Option<(PathBuf, Vec<String>, Vec<Option<usize>>)>,
    type_map: Vec<String>,
}

impl TypeIndex {
    pub fn read(src: &dyn Source, type_map: &[String]) -> Result<Self, DataError> {
        let names = match src.has_file("type_map.raw") {
            false => None,
            true => {
                let names = src.tokens("type_map.raw")?;
                // Two types of one element would give both the same model type: every atom of
                // the second evaluated as the first's element.
                if let Some((i, n)) =
                    (names.iter().enumerate()).find(|(i, n)| names[..*i].contains(n))
                {
                    let first = names.iter().position(|m| m == n).expect("found before i");
                    return Err(DataError::Invalid {
                        path: src.path("type_map.raw"),
                        reason: format!(
                            "element {n:?} is listed twice (types {first} and {i}); list each \
                             element once"
                        ),
                    });
                }
                let model = (names.iter())
                    .map(|n| type_map.iter().position(|m| m == n))
                    .collect();
                Some((src.path("type_map.raw"), names, model))
            }
        };
        Ok(TypeIndex {
            names,
            type_map: type_map.to_vec(),
        })
    }

    /// The model type of data type `t`, found in `path` at `at` (an atom, or a frame's atom).
    pub fn model_type(
        &self,
        t: usize,
        path: &Path,
        at: impl Fn() -> String,
    ) -> Result<usize, DataError> {
        let Some((map_path, names, model)) = &self.names else {
            if t < self.type_map.len() {
                return Ok(t);
            }
            return Err(DataError::TypeOutOfRange {
                path: path.to_path_buf(),
                at: at(),
                index: t,
                type_map: self.type_map.clone(),
            });
        };
        match model.get(t) {
            None => Err(DataError::Invalid {
                path: path.to_path_buf(),
                reason: format!(
                    "{} has type {t}, but {} lists only {} elements",
                    at(),
                    map_path.display(),
                    names.len()
                ),
            }),
            Some(None) => Err(DataError::UnknownElement {
                path: map_path.clone(),
                element: names[t].clone(),
                type_map: self.type_map.clone(),
            }),
            Some(Some(m)) => Ok(*m),
        }
    }
}

/// The element names of the systems at `paths` where the model gives none, as DeePMD-kit's
/// TensorFlow backend takes them (`_check_type_map_consistency`): each system's `type_map.raw`
/// must begin as the others do, and the longest is the model's; `None` when no system has one.
pub fn systems_type_map(
    fs: &dyn super::Files,
    paths: &[PathBuf],
) -> Result<Option<Vec<String>>, DataError> {
    let mut names: Option<(PathBuf, Vec<String>)> = None;
    for path in paths {
        let found = super::open::with_source(fs, path, |src| match src.has_file("type_map.raw") {
            true => Ok(Some((
                src.path("type_map.raw"),
                src.tokens("type_map.raw")?,
            ))),
            false => Ok(None),
        })?;
        let Some((at, these)) = found else { continue };
        if let Some((first, known)) = &names {
            if !(known.iter().zip(&these)).all(|(a, b)| a == b) {
                return Err(DataError::Invalid {
                    path: at,
                    reason: format!(
                        "lists the elements {these:?}, which do not begin as {first}'s {known:?}: \
                         with no model.type_map the systems must agree; give model.type_map",
                        first = first.display()
                    ),
                });
            }
            if known.len() >= these.len() {
                continue;
            }
        }
        names = Some((at, these));
    }
    Ok(names.map(|(_, n)| n))
}

/// Names for the types of systems that name none (no `type_map.raw` anywhere): `Type_0`,
/// `Type_1`, … up to the largest index in their `type.raw` files, as dpdata names types it
/// cannot name (DeePMD-kit's TensorFlow backend trains such data by index).
pub fn unnamed_types(fs: &dyn super::Files, paths: &[PathBuf]) -> Result<Vec<String>, DataError> {
    let mut ntypes = 0;
    for path in paths {
        let types = super::open::with_source(fs, path, read_raw_types)?;
        ntypes = ntypes.max(types.iter().max().map_or(0, |t| t + 1));
    }
    Ok((0..ntypes).map(|t| format!("Type_{t}")).collect())
}

/// The integers of `type.raw`, at least one.
pub(super) fn read_raw_types(src: &dyn Source) -> Result<Vec<usize>, DataError> {
    let type_path = src.path("type.raw");
    let types = src
        .tokens("type.raw")?
        .iter()
        .map(|tok| {
            tok.parse::<usize>().map_err(|_| DataError::Invalid {
                path: type_path.clone(),
                reason: format!("{tok:?} is not a non-negative integer atom type"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if types.is_empty() {
        return Err(DataError::Invalid {
            path: type_path,
            reason: "no atoms".into(),
        });
    }
    Ok(types)
}

//! The one error type of the config module.

use std::path::{Path, PathBuf};

/// Everything that can be wrong with an input.json (or input.yaml). Every variant that is about
/// a key names its dotted path (`model.descriptor.rcut`, `training.training_data.batch_size[2]`),
/// so the user can find it without guessing.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cause is part of the message, not a source chain, which `{:#}` would print again.
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("malformed JSON in {} at line {line}, column {column}: {message}", file.display())]
    Json {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    /// serde_yaml_ng's message, which gives the line and column itself.
    #[error("malformed YAML in {}: {message}", file.display())]
    Yaml { file: PathBuf, message: String },

    /// A key-level error found while reading `file`. Not a `#[source]` chain on purpose: the
    /// message then reads whole with a plain `{}`, and nothing is printed twice with `{:#}`.
    #[error("{}: {error}", file.display())]
    InFile {
        file: PathBuf,
        error: Box<ConfigError>,
    },

    #[error("unknown key '{key}' at {path}; valid keys at {parent}: {}", valid.join(", "))]
    UnknownKey {
        key: String,
        /// Full path of the unknown key, e.g. `model.descriptor.nueron`.
        path: String,
        /// Path of the object holding it, `<root>` for the top level.
        parent: String,
        valid: Vec<String>,
    },

    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        path: String,
        expected: String,
        found: String,
    },

    #[error("{path}: required key is missing; expected {expected}")]
    Missing { path: String, expected: String },

    /// The value has the right type but is not allowed (0 where > 0 is needed, ...).
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },

    /// A valid DeePMD-kit setting that dpw does not implement.
    #[error("{path}: {message}")]
    Unsupported { path: String, message: String },
}

impl ConfigError {
    pub(crate) fn json(file: &Path, e: &serde_json::Error) -> Self {
        // serde_json's message ends in " at line L column C"; we print those fields ourselves.
        let text = e.to_string();
        let message = match text.rfind(" at line ") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        ConfigError::Json {
            file: file.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message,
        }
    }

    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn unsupported(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Unsupported {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The error itself, looking through the [`ConfigError::InFile`] wrapper.
    pub fn inner(&self) -> &ConfigError {
        match self {
            ConfigError::InFile { error, .. } => error.inner(),
            other => other,
        }
    }
}

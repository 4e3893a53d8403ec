//! The fitting nets other than `ener`, each a folder of its own: its spec, input keys,
//! statistics and the head that turns the nets' atomic outputs into what the loss reads
//! (docs/design.md §12). `ener` is the model's default and lives with the step.

pub mod property;

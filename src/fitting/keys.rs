//! The keys every fitting shares: in input.json (DeePMD-kit 3.2.0's `fitting_ener` arguments
//! that the other fittings take too) and in DeePMD-kit's serialisation of a fitting.

/// The input keys every fitting dpw builds reads.
pub const INPUT_KEYS: &[&str] = &[
    "neuron",
    "resnet_dt",
    "activation_function",
    "precision",
    "trainable",
    "seed",
    "numb_fparam",
    "numb_aparam",
    "default_fparam",
    "dim_case_embd",
];

/// `schema!(OWN_KEYS, "model[standard].fitting_net[dos]")`: the input schema of a fitting
/// type, its own keys beside those every fitting reads.
macro_rules! schema {
    ($own:expr, $deepmd:literal) => {
        $crate::config::keys::Schema {
            keys: &[$crate::fitting::keys::INPUT_KEYS, $own],
            unsupported: &[],
            ignored: &[],
            deepmd: $deepmd,
        }
    };
}
pub(crate) use schema;

// The keys DeePMD-kit 3.2.0's dpmodel deserialises in a fitting node (the arguments of the
// class's constructor and the keys its `deserialize` takes out first).
#[rustfmt::skip]
pub const YAML_KEYS: &[&str] = &[
    "@class", "@version", "@variables", "type", "var_name", "dim_out", "nets", "ntypes",
    "dim_descrpt", "neuron", "resnet_dt", "numb_fparam", "numb_aparam", "dim_case_embd", "rcond",
    "tot_ener_zero", "trainable", "atom_ener", "activation_function", "precision", "layer_name",
    "use_aparam_as_mask", "spin", "mixed_types", "exclude_types", "type_map", "seed",
    "default_fparam",
];

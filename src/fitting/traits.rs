//! What every fitting `type` is to dpw outside its nets (docs/design.md §12): its name, its
//! outputs and labels, its keys in out.json and in DeePMD-kit's `.yaml`, the statistics it starts
//! from and, where it is scored on the host, its head. Each fitting's folder implements these
//! traits; [`super::registry`] finds a fitting by its `type`.

use std::fmt::Write as _;

use serde_json::{Map, Value as Json};
use serde_yaml_ng::Value as Yaml;

use crate::config::loss::LossConfig;
use crate::data::Labels;
use crate::fitting::head::{HeadInputs, HeadLabels, HeadLoss, HeadStat, StepLoss};
use crate::fitting::property::PropertySpec;
use crate::fitting::Centres;
use crate::fmt::sci;

/// One fitting `type`: DeePMD-kit's `BaseFitting` with its atomic model's output and its loss.
pub trait FittingType {
    /// DeePMD-kit's `fitting_net.type`.
    fn type_name(&self) -> &'static str;

    /// DeePMD-kit's `loss.type` that trains it.
    fn loss_type(&self) -> &'static str {
        self.type_name()
    }

    /// The values per atom the nets put out.
    fn dim(&self) -> usize;

    /// The values per atom and per frame of its label (a tensor's 3 or 9; else [`Self::dim`]).
    fn label_width(&self) -> usize {
        self.dim()
    }

    /// The labels a model learns from under `loss` (`None`: every label the fitting can be
    /// scored on); `required` for training and validation data, read where present otherwise
    /// (dpw test).
    fn labels(&self, loss: Option<&LossConfig>, required: bool) -> Labels;

    /// Its loss's metrics, in lcurve.out's order.
    fn metrics(&self) -> &'static [&'static str];

    /// Whether it reads the model's `atom_exclude_types` (others refuse a non-empty one).
    fn excludes_types(&self) -> bool {
        false
    }

    /// The types whose atoms have no output (the model's `atom_exclude_types` it keeps).
    fn excluded_types(&self) -> &[usize] {
        &[]
    }

    /// Its keys in out.json: `fitting` holds the keys every fitting shares (with `rcond`,
    /// `atom_ener` and `trainable`, which some types do not take and remove).
    fn input_json(&self, fitting: &mut Map<String, Json>);

    /// Its part of DeePMD-kit's serialisation: the fitting node (written as `ener`'s) and the
    /// `model_def_script` fitting section, completed for its type; gives the model's `out_std`.
    fn write_yaml(&self, out: YamlOut) -> Yaml;

    /// Whether the model keeps an output std that scales its atomic outputs (a property's).
    fn keeps_out_std(&self) -> bool {
        false
    }

    /// The output statistics it starts from.
    fn output_stat(&self) -> OutputStat<'_>;

    /// Its head, where its outputs are reduced and scored on the host; `None` for `ener`, whose
    /// step runs whole on the backend.
    fn head(&self) -> Option<&dyn HeadType> {
        None
    }
}

/// A `loss.type` scored on the host (every loss but `ener`, whose sums the backend leaves):
/// DeePMD-kit's `TaskLoss` as the trainer sees it beside the head that computes it.
pub trait LossType {
    /// DeePMD-kit's `loss.type`.
    fn type_name(&self) -> &'static str;

    /// Its section in out.json.
    fn to_json(&self) -> Json;

    /// lcurve.out's values of a batch's loss sums, in its fitting's [`FittingType::metrics`]
    /// order (`None`: not shown), over `nvalues` frame values and `natoms` atoms a frame.
    fn metric_values(&self, sums: &[f64], nvalues: usize, natoms: usize) -> Vec<Option<f64>>;
}

/// What [`FittingType::write_yaml`] completes.
pub struct YamlOut<'a> {
    /// The `fitting` node of the serialisation.
    pub fitting: &'a mut Yaml,
    /// `model_def_script`: its `fitting_net` section (and a tensor's `atom_exclude_types`).
    pub model_def: &'a mut Yaml,
    pub ntypes: usize,
    /// The model's output std (`Model::out_std`; empty where it keeps none).
    pub out_std: &'a [f64],
}

/// The output statistics of a fitting, each kind computed by one function of `train::stats`
/// over the statistics frames.
pub enum OutputStat<'a> {
    /// `ener`: the energy bias by least squares over type counts, with the descriptor's.
    EnergyBias,
    /// The output bias of label `name` (DeePMD-kit's `compute_output_stats`): a DOS's and a
    /// tensor's, described in the log as `what`, the types `exclude` left out.
    LabelBias {
        name: &'static str,
        what: String,
        exclude: &'a [usize],
    },
    /// A property's bias and std.
    Property(&'a PropertySpec),
}

/// The head of a fitting scored on the host: the nets run on the backend, their outputs are
/// reduced and scored here, and the seeds go back into the dual pass.
pub trait HeadType: FittingType {
    /// Its statistics from the model's output bias and std: the bias and, where the fitting
    /// keeps it, the std (ones otherwise).
    fn stat(&self, bias: &[f64], out_std: &[f64]) -> HeadStat {
        HeadStat {
            bias: bias.to_vec(),
            std: match self.keeps_out_std() {
                true => out_std.to_vec(),
                false => vec![1.0; bias.len()],
            },
            diag_bias: vec![],
        }
    }

    /// The loss sums its loss leaves.
    fn nsums(&self) -> usize;

    /// Atomic outputs `[ncentres][label_width]` (centre order) and frame outputs
    /// `[nframes][label_width]` from what the head reads of a forward pass.
    fn outputs(&self, stat: &HeadStat, c: &Centres, x: &HeadInputs) -> (Vec<f64>, Vec<f64>);

    /// The loss of one batch and its seeds.
    fn loss(
        &self,
        stat: &HeadStat,
        loss: StepLoss,
        c: &Centres,
        x: &HeadInputs,
        labels: &HeadLabels,
    ) -> HeadLoss;

    /// `dp test`: the label's name in messages and detail files, and its data file.
    fn test_label(&self) -> (&'static str, String);

    /// `dp test`: the atoms of a frame its per-atom errors count (a tensor's: those of the
    /// types not excluded).
    fn test_natoms(&self, atype: &[usize]) -> usize {
        atype.len()
    }

    /// `dp test -d`: the columns of a tensor's one detail file of a row per frame
    /// (`x y z`, `pxx ... pzz`); `None` where each frame has a file of its own (a property's, a
    /// DOS's).
    fn detail_columns(&self) -> Option<&'static [&'static str]> {
        None
    }

    /// `dp test`'s lines for its errors `e` and per atom `per_atom`; `sqrt_n` is √N of one
    /// system (`None` for the weighted average over systems).
    fn test_report(&self, out: &mut String, e: &TestErr, per_atom: &TestErr, sqrt_n: Option<f64>);
}

/// An error of `dp test`: mean absolute and root mean square.
#[derive(Clone, Copy, Debug, Default)]
pub struct TestErr {
    pub mae: f64,
    pub rmse: f64,
}

/// One of `dp test`'s lines: `{name}: {x} {unit}`.
pub fn report_line(out: &mut String, name: &str, x: f64, unit: &str) {
    let _ = writeln!(out, "{name}: {} {unit}", sci(x, 6, 0));
}

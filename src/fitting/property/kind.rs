//! The property fitting as dpw finds it by its `type` (docs/design.md §12).

use serde_json::{Map, Value as Json};
use serde_yaml_ng::Value as Yaml;

use crate::config::error::ConfigError;
use crate::config::keys::{Schema, Section};
use crate::config::loss::LossConfig;
use crate::data::{Labels, Missing};
use crate::fitting::head::{HeadInputs, HeadLabels, HeadLoss, HeadStat, StepLoss};
use crate::fitting::keys::{schema, YAML_KEYS};
use crate::fitting::output::{FitContext, FitOutput, Registered};
use crate::fitting::traits::{
    report_line as line, FittingType, HeadType, OutputStat, TestErr, YamlOut,
};
use crate::fitting::{seed, Centres, OutStat};
use crate::yaml_tree::{ndarray, At};

use super::config::{output_json, parse_output, OUTPUT_KEYS};
use super::head::{loss, METRICS, NSUMS};
use super::PropertySpec;

static SCHEMA: Schema = schema!(OUTPUT_KEYS, "model[standard].fitting_net[property]");

pub static REGISTERED: Registered = Registered {
    names: &["property"],
    schema: &SCHEMA,
    parse,
    read_yaml,
};

/// The property fitting adds these to the shared keys of its serialisation.
const YAML_OWN_KEYS: &[&str] = &["task_dim", "intensive", "distinguish_types"];

fn parse(sec: &Section, _: &FitContext) -> Result<FitOutput, ConfigError> {
    Ok(FitOutput::Property(parse_output(sec)?))
}

fn read_yaml(f: &At, _: &At, _: usize) -> anyhow::Result<FitOutput> {
    f.version(1..=6, Some(1))?;
    f.known(&[YAML_KEYS, YAML_OWN_KEYS])?;
    Ok(FitOutput::Property(PropertySpec {
        property_name: f.key("var_name")?.str()?.to_string(),
        task_dim: f.key("task_dim")?.usize()?,
        intensive: f.opt("intensive").map_or(Ok(false), |v| v.bool())?,
        // DeePMD-kit's `PropertyFittingNet.deserialize` default.
        distinguish_types: f.opt("distinguish_types").map_or(Ok(false), |v| v.bool())?,
    }))
}

impl FittingType for PropertySpec {
    fn type_name(&self) -> &'static str {
        "property"
    }

    fn dim(&self) -> usize {
        self.task_dim
    }

    fn labels(&self, _: Option<&LossConfig>, required: bool) -> Labels {
        Labels::Frame {
            name: self.property_name.clone(),
            width: self.task_dim,
            frame: true,
            atomic: false,
            missing: if required {
                Missing::Refuse
            } else {
                Missing::Quiet
            },
            excluded: vec![],
        }
    }

    fn metrics(&self) -> &'static [&'static str] {
        METRICS
    }

    fn input_json(&self, fitting: &mut Map<String, Json>) {
        fitting.remove("rcond");
        fitting.remove("atom_ener");
        if let Json::Object(own) = output_json(self) {
            fitting.extend(own);
        }
    }

    // Its keys (DeePMD-kit's serialisation version 6) and its output std, which scales its
    // atomic output.
    fn write_yaml(&self, out: YamlOut) -> Yaml {
        let fitting = out.fitting;
        for (k, v) in [
            ("@version", Yaml::from(6)),
            ("type", "property".into()),
            ("var_name", self.property_name.as_str().into()),
            ("dim_out", self.task_dim.into()),
            ("task_dim", self.task_dim.into()),
            ("intensive", self.intensive.into()),
            ("distinguish_types", self.distinguish_types.into()),
        ] {
            fitting[k] = v;
        }
        let def = &mut out.model_def["fitting_net"];
        for k in ["type", "task_dim", "intensive", "distinguish_types"] {
            def[k] = fitting[k].clone();
        }
        def["property_name"] = self.property_name.as_str().into();
        ndarray(&[1, out.ntypes, self.task_dim], out.out_std)
    }

    fn keeps_out_std(&self) -> bool {
        true
    }

    fn output_stat(&self) -> OutputStat<'_> {
        OutputStat::Property(self)
    }

    fn head(&self) -> Option<&dyn HeadType> {
        Some(self)
    }
}

impl HeadType for PropertySpec {
    fn nsums(&self) -> usize {
        NSUMS
    }

    fn outputs(&self, stat: &HeadStat, c: &Centres, x: &HeadInputs) -> (Vec<f64>, Vec<f64>) {
        stat.reduce(self.task_dim, self.intensive, c, x)
    }

    fn loss(
        &self,
        stat: &HeadStat,
        step: StepLoss,
        c: &Centres,
        x: &HeadInputs,
        labels: &HeadLabels,
    ) -> HeadLoss {
        let StepLoss::Host {
            loss: LossConfig::Property(cfg),
            ..
        } = step
        else {
            unreachable!("a property model trained by {step:?}")
        };
        let k = self.task_dim;
        let (_, frame) = self.outputs(stat, c, x);
        // DeePMD-kit normalises every atom's by type 0's statistics.
        let type0 = OutStat {
            bias: &stat.bias[..k],
            std: &stat.std[..k],
        };
        let label = labels
            .frame
            .as_deref()
            .expect("training data have the label");
        let (sums, dframe) = loss(cfg, self, &type0, c.natoms, &frame, label);
        HeadLoss {
            sums: sums.to_vec(),
            ybar: seed(k, self.intensive, &stat.out_stat(), c, &dframe, None),
            abar: vec![],
        }
    }

    fn test_label(&self) -> (&'static str, String) {
        ("property", format!("{}.npy", self.property_name))
    }

    fn test_report(&self, out: &mut String, e: &TestErr, _: &TestErr, _: Option<f64>) {
        line(out, "PROPERTY MAE            ", e.mae, "units");
        line(out, "PROPERTY RMSE           ", e.rmse, "units");
    }
}

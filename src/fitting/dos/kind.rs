//! The DOS fitting as dpw finds it by its `type` (docs/design.md §12).

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
use crate::fitting::{seed, Centres};
use crate::yaml_tree::{ndarray, At};

use super::config::{output_json, parse_output, OUTPUT_KEYS};
use super::head::{loss, METRICS, NSUMS};
use super::DosSpec;

static SCHEMA: Schema = schema!(OUTPUT_KEYS, "model[standard].fitting_net[dos]");

pub static REGISTERED: Registered = Registered {
    names: &["dos"],
    schema: &SCHEMA,
    parse,
    read_yaml,
};

fn parse(sec: &Section, _: &FitContext) -> Result<FitOutput, ConfigError> {
    Ok(FitOutput::Dos(parse_output(sec)?))
}

fn read_yaml(f: &At, _: &At, _: usize) -> anyhow::Result<FitOutput> {
    f.version(1..=4, Some(1))?;
    f.known(&[YAML_KEYS])?;
    Ok(FitOutput::Dos(DosSpec {
        numb_dos: f.key("dim_out")?.usize()?,
    }))
}

impl FittingType for DosSpec {
    fn type_name(&self) -> &'static str {
        "dos"
    }

    fn dim(&self) -> usize {
        self.numb_dos
    }

    fn labels(&self, loss: Option<&LossConfig>, required: bool) -> Labels {
        let reads = |terms: [usize; 2]| match loss {
            Some(LossConfig::Dos(c)) => terms.iter().any(|&t| c.active(t)),
            _ => true,
        };
        Labels::Frame {
            name: "dos".into(),
            width: self.numb_dos,
            frame: reads([2, 3]),
            atomic: reads([0, 1]),
            missing: if required {
                Missing::Warn
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
        fitting.remove("atom_ener");
        if let Json::Object(own) = output_json(self) {
            fitting.extend(own);
        }
    }

    fn write_yaml(&self, out: YamlOut) -> Yaml {
        for (k, v) in [
            ("type", Yaml::from("dos")),
            ("var_name", "dos".into()),
            ("dim_out", self.numb_dos.into()),
        ] {
            out.fitting[k] = v;
        }
        let def = &mut out.model_def["fitting_net"];
        def["type"] = "dos".into();
        def["numb_dos"] = self.numb_dos.into();
        let (nt, no) = (out.ntypes, self.numb_dos);
        ndarray(&[1, nt, no], &vec![1.0; nt * no])
    }

    fn output_stat(&self) -> OutputStat<'_> {
        OutputStat::LabelBias {
            name: "dos",
            what: format!("DOS (numb_dos {})", self.numb_dos),
            exclude: &[],
        }
    }

    fn head(&self) -> Option<&dyn HeadType> {
        Some(self)
    }
}

impl HeadType for DosSpec {
    fn nsums(&self) -> usize {
        NSUMS
    }

    fn outputs(&self, stat: &HeadStat, c: &Centres, x: &HeadInputs) -> (Vec<f64>, Vec<f64>) {
        stat.reduce(self.numb_dos, false, c, x)
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
            loss: LossConfig::Dos(cfg),
            coef,
        } = step
        else {
            unreachable!("a DOS model trained by {step:?}")
        };
        let pref = cfg.prefactors(coef);
        let k = self.numb_dos;
        let (atomic, frame) = self.outputs(stat, c, x);
        let (sums, da, df) = loss(pref, k, &atomic, &frame, labels);
        HeadLoss {
            sums: sums.to_vec(),
            ybar: seed(k, false, &stat.out_stat(), c, &df, Some(&da)),
            abar: vec![],
        }
    }

    fn test_label(&self) -> (&'static str, String) {
        ("dos", "dos.npy".into())
    }

    fn test_report(&self, out: &mut String, e: &TestErr, per_atom: &TestErr, _: Option<f64>) {
        line(out, "DOS MAE            ", e.mae, "Occupation/eV");
        line(out, "DOS RMSE           ", e.rmse, "Occupation/eV");
        line(out, "DOS MAE/Natoms     ", per_atom.mae, "Occupation/eV");
        line(out, "DOS RMSE/Natoms    ", per_atom.rmse, "Occupation/eV");
    }
}

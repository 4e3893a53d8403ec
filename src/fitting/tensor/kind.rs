//! The dipole and polar fittings as dpw finds them by their `type` (docs/design.md §12).

use std::fmt::Write as _;

use serde_json::{Map, Value as Json};
use serde_yaml_ng::Value as Yaml;

use crate::config::error::ConfigError;
use crate::config::keys::{Schema, Section};
use crate::config::loss::LossConfig;
use crate::data::{Labels, Missing};
use crate::fitting::head::{HeadInputs, HeadLabels, HeadLoss, HeadStat, StepLoss};
use crate::fitting::keys::{schema, YAML_KEYS};
use crate::fitting::output::{FitContext, FitOutput, Registered};
use crate::fitting::traits::{FittingType, HeadType, OutputStat, TestErr, YamlOut};
use crate::fitting::Centres;
use crate::fmt::sci;
use crate::yaml_tree::{ndarray, At};

use super::config::{complete, output_json, parse_output, DIPOLE_KEYS, POLAR_KEYS};
use super::head::{loss, metrics, TensorHead, NSUMS};
use super::{needs_rot, DipoleTensor, PolarTensor, Tensor, TensorFitting, TensorKind, TensorSpec};

static DIPOLE_SCHEMA: Schema = schema!(DIPOLE_KEYS, "model[standard].fitting_net[dipole]");

static POLAR_SCHEMA: Schema = schema!(POLAR_KEYS, "model[standard].fitting_net[polar]");

pub static DIPOLE: Registered = Registered {
    names: &["dipole"],
    schema: &DIPOLE_SCHEMA,
    parse: parse::<DipoleTensor>,
    read_yaml: read_yaml::<DipoleTensor>,
};

pub static POLAR: Registered = Registered {
    names: &["polar"],
    schema: &POLAR_SCHEMA,
    parse: parse::<PolarTensor>,
    read_yaml: read_yaml::<PolarTensor>,
};

/// The dipole and polar fittings add these to the shared keys of their serialisation.
const YAML_OWN_KEYS: &[&str] = &[
    "embedding_width",
    "fit_diag",
    "shift_diag",
    "r_differentiable",
    "c_differentiable",
];

impl From<TensorFitting<DipoleTensor>> for FitOutput {
    fn from(t: TensorFitting<DipoleTensor>) -> Self {
        FitOutput::Dipole(t)
    }
}

impl From<TensorFitting<PolarTensor>> for FitOutput {
    fn from(t: TensorFitting<PolarTensor>) -> Self {
        FitOutput::Polar(t)
    }
}

/// The fitting of section `sec`, completed by the model's: gr's width from the descriptor,
/// which must give the rotation matrix, and the types without a tensor.
fn parse<K: TensorKind>(sec: &Section, ctx: &FitContext) -> Result<FitOutput, ConfigError>
where
    FitOutput: From<TensorFitting<K>>,
{
    let Some(width) = ctx.rot_width else {
        return Err(ConfigError::unsupported(
            ctx.path,
            needs_rot(ctx.descriptor),
        ));
    };
    let mut spec = parse_output(sec, K::TENSOR)?;
    complete(&mut spec, sec, ctx.ntypes, width, ctx.atom_exclude_types)?;
    Ok(TensorFitting::<K>::new(spec).into())
}

fn read_yaml<K: TensorKind>(f: &At, m: &At, nt: usize) -> anyhow::Result<FitOutput>
where
    FitOutput: From<TensorFitting<K>>,
{
    f.version(1..=5, Some(1))?;
    f.known(&[YAML_KEYS, YAML_OWN_KEYS])?;
    let polar = K::TENSOR == Tensor::Polar;
    let flag = |key| f.opt(key).map_or(Ok(true), |v| v.bool());
    let scale = match f.key("@variables")?.opt("scale") {
        Some(s) if polar => s.array(&[nt, 1])?,
        _ => vec![1.0; nt],
    };
    let exclude_types = match m.opt("atom_exclude_types") {
        Some(v) => v.usizes()?,
        None => vec![],
    };
    // The fitting's exclude_types is DeePMD-kit's copy of the model's atom_exclude_types.
    let fitting_excluded = match f.opt("exclude_types") {
        Some(v) => v.usizes()?,
        None => vec![],
    };
    anyhow::ensure!(
        fitting_excluded == exclude_types,
        "{}.exclude_types {fitting_excluded:?} differs from model.atom_exclude_types \
         {exclude_types:?}",
        f.path,
    );
    if let Some(c) = f.key("@variables")?.opt("constant_matrix") {
        anyhow::ensure!(
            c.array(&[nt])?.iter().all(|x| *x == 0.0),
            "{}.@variables.constant_matrix: a non-zero constant matrix (which DeePMD-kit's \
             PyTorch backend ignores and its dpmodel adds) is not supported",
            f.path
        );
    }
    let spec = TensorSpec {
        embedding_width: f.key("embedding_width")?.usize()?,
        fit_diag: polar && flag("fit_diag")?,
        scale,
        shift_diag: polar && flag("shift_diag")?,
        exclude_types,
    };
    Ok(TensorFitting::<K>::new(spec).into())
}

impl<K: TensorKind> FittingType for TensorFitting<K> {
    fn type_name(&self) -> &'static str {
        K::TENSOR.metric_name()
    }

    fn loss_type(&self) -> &'static str {
        "tensor"
    }

    fn dim(&self) -> usize {
        self.spec.dim(K::TENSOR)
    }

    fn label_width(&self) -> usize {
        K::TENSOR.size()
    }

    fn labels(&self, loss: Option<&LossConfig>, required: bool) -> Labels {
        let reads = |atomic: bool| match loss {
            Some(LossConfig::Tensor(c)) => {
                let (pa, pf) = c.prefactors();
                if atomic {
                    pa > 0.0
                } else {
                    pf > 0.0
                }
            }
            _ => true,
        };
        Labels::Frame {
            name: K::TENSOR.label_name().into(),
            width: K::TENSOR.size(),
            frame: reads(false),
            atomic: reads(true),
            missing: if required {
                Missing::Warn
            } else {
                Missing::Quiet
            },
            excluded: self.spec.exclude_types.clone(),
        }
    }

    fn metrics(&self) -> &'static [&'static str] {
        metrics(K::TENSOR)
    }

    fn excludes_types(&self) -> bool {
        true
    }

    fn excluded_types(&self) -> &[usize] {
        &self.spec.exclude_types
    }

    // DeePMD-kit's dipole and polar fittings take no `rcond`, `atom_ener` or `trainable`.
    fn input_json(&self, fitting: &mut Map<String, Json>) {
        for key in ["rcond", "atom_ener", "trainable"] {
            fitting.remove(key);
        }
        if let Json::Object(own) = output_json(K::TENSOR, &self.spec) {
            fitting.extend(own);
        }
    }

    fn write_yaml(&self, out: YamlOut) -> Yaml {
        let (tensor, s, nt) = (K::TENSOR, &self.spec, out.ntypes);
        let polar = tensor == Tensor::Polar;
        let fitting = out.fitting;
        let f = fitting.as_mapping_mut().expect("a mapping");
        f.remove("dim_out");
        f.remove("atom_ener");
        for (k, v) in [
            ("@version", Yaml::from(if polar { 5 } else { 4 })),
            ("type", tensor.metric_name().into()),
            ("var_name", tensor.metric_name().into()),
            ("embedding_width", s.embedding_width.into()),
            ("exclude_types", s.exclude_types[..].into()),
        ] {
            fitting[k] = v;
        }
        let def = &mut out.model_def["fitting_net"];
        def["type"] = tensor.metric_name().into();
        if polar {
            for (k, v) in [("fit_diag", s.fit_diag), ("shift_diag", s.shift_diag)] {
                fitting[k] = v.into();
                def[k] = v.into();
            }
            def["scale"] = s.scale[..].into();
            let vars = &mut fitting["@variables"];
            vars["scale"] = ndarray(&[nt, 1], &s.scale);
            vars["constant_matrix"] = ndarray(&[nt], &vec![0.0; nt]);
        } else {
            fitting["r_differentiable"] = true.into();
            fitting["c_differentiable"] = true.into();
        }
        out.model_def["atom_exclude_types"] = s.exclude_types[..].into();
        // PT's tensor models add out_bias alone (a polar's, shifting the diagonal).
        let k = tensor.size();
        ndarray(&[1, nt, k], &vec![1.0; nt * k])
    }

    fn output_stat(&self) -> OutputStat<'_> {
        let name = K::TENSOR.label_name();
        OutputStat::LabelBias {
            name,
            what: name.to_string(),
            exclude: &self.spec.exclude_types,
        }
    }

    fn head(&self) -> Option<&dyn HeadType> {
        Some(self)
    }
}

impl<K: TensorKind> TensorFitting<K> {
    fn tensor_head<'a>(&'a self, stat: &'a HeadStat) -> TensorHead<'a> {
        TensorHead {
            tensor: K::TENSOR,
            spec: &self.spec,
            diag_bias: &stat.diag_bias,
        }
    }
}

impl<K: TensorKind> HeadType for TensorFitting<K> {
    /// A polar's diagonal shift per type: the mean of the diagonal of the type's output bias.
    fn stat(&self, bias: &[f64], _: &[f64]) -> HeadStat {
        let diag_bias = match K::TENSOR {
            Tensor::Polar => (bias.chunks_exact(9))
                .map(|b| (b[0] + b[4] + b[8]) / 3.0)
                .collect(),
            Tensor::Dipole => vec![],
        };
        HeadStat {
            bias: bias.to_vec(),
            std: vec![1.0; bias.len()],
            diag_bias,
        }
    }

    fn nsums(&self) -> usize {
        NSUMS
    }

    fn outputs(&self, stat: &HeadStat, c: &Centres, x: &HeadInputs) -> (Vec<f64>, Vec<f64>) {
        self.tensor_head(stat).outputs(c, &x.y, &x.rot)
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
            loss: LossConfig::Tensor(cfg),
            ..
        } = step
        else {
            unreachable!("a tensor model trained by {step:?}")
        };
        let pref = cfg.prefactors();
        let t = self.tensor_head(stat);
        let (atomic, frame) = t.outputs(c, &x.y, &x.rot);
        let with_tensor: Vec<bool> = c.types.iter().map(|&ty| !self.spec.excluded(ty)).collect();
        let (sums, da, df) = loss(pref, &atomic, &frame, labels, &with_tensor);
        let (ybar, abar) = t.seed(c, &x.y, &x.rot, &da, &df);
        HeadLoss {
            sums: sums.to_vec(),
            ybar,
            abar,
        }
    }

    fn test_label(&self) -> (&'static str, String) {
        let name = K::TENSOR.label_name();
        (name, format!("{name}.npy"))
    }

    fn detail_columns(&self) -> Option<&'static [&'static str]> {
        Some(match K::TENSOR {
            Tensor::Dipole => &["x", "y", "z"],
            Tensor::Polar => &[
                "pxx", "pxy", "pxz", "pyx", "pyy", "pyz", "pzx", "pzy", "pzz",
            ],
        })
    }

    fn test_natoms(&self, atype: &[usize]) -> usize {
        atype.iter().filter(|&&a| !self.spec.excluded(a)).count()
    }

    fn test_report(&self, out: &mut String, e: &TestErr, per_atom: &TestErr, sqrt_n: Option<f64>) {
        let name = match K::TENSOR {
            Tensor::Dipole => "Dipole",
            Tensor::Polar => "Polarizability",
        };
        let mut rows = vec![("RMSE      ", e.rmse)];
        if let Some(s) = sqrt_n {
            rows.extend([("RMSE/sqrtN", e.rmse / s), ("RMSE/N    ", per_atom.rmse)]);
        }
        for (what, x) in rows {
            let _ = writeln!(out, "{name}  {what} : {}", sci(x, 6, 0));
        }
        let _ = writeln!(
            out,
            "The unit of error is the same as the unit of provided label."
        );
    }
}

//! The model as stages (docs/design.md §10): environment → descriptor → fitting, each with its
//! forward, backward, tangent and dual passes over the backend's ops; `train::step` composes
//! them with the loss.

pub mod descriptor;
pub mod embed;
pub mod env;
pub mod fitting;
pub mod net;

use crate::backend::{Backend, Real};
use crate::geometry::EnvParams;
use crate::model::{DescriptorType, Model, ParamLayout};

use embed::Nets;

/// Model state on the device: parameters in the backend's precision, statistics, Adam moments.
pub struct DeviceModel<T: Real, B: Backend<T>> {
    pub kind: DescriptorType,
    pub layout: ParamLayout,
    pub env: EnvParams,
    pub type_one_side: bool,
    pub params: B::Buf,
    pub davg: B::Buf,
    pub dstd: B::Buf,
    pub bias: B::Buf,
    pub grad: B::Buf,
    pub m: B::Buf,
    pub v: B::Buf,
}

fn to_t<T: Real>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

impl<T: Real, B: Backend<T>> DeviceModel<T, B> {
    pub fn new(b: &B, model: &Model) -> Self {
        let layout = model.layout();
        let d = &model.spec.descriptor;
        let n = layout.len;
        DeviceModel {
            kind: d.kind,
            env: EnvParams {
                rcut: d.rcut,
                rcut_smth: d.rcut_smth,
                protection: d.env_protection,
            },
            type_one_side: d.type_one_side,
            params: b.upload(&to_t(&model.params)),
            davg: b.upload(&to_t(&model.davg)),
            dstd: b.upload(&to_t(&model.dstd)),
            bias: b.upload(&to_t(&model.bias)),
            grad: b.zeros(n),
            m: b.zeros(n),
            v: b.zeros(n),
            layout,
        }
    }

    /// The parameters as f64, for checkpoints and model files.
    pub fn params_f64(&self, b: &B) -> Vec<f64> {
        b.download(&self.params).iter().map(|x| x.f64()).collect()
    }

    pub fn grad_f64(&self, b: &B) -> Vec<f64> {
        b.download(&self.grad).iter().map(|x| x.f64()).collect()
    }

    /// The embedding nets and which serves each block.
    pub fn nets(&self) -> Nets<'_> {
        Nets {
            layout: &self.layout,
            type_one_side: self.type_one_side,
        }
    }
}

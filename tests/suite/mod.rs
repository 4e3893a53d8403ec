//! One body per property, instantiated for every backend by [`backend_suite!`].
#![allow(dead_code)]

pub mod descriptors;
pub mod dos;
pub mod fd;
pub mod labelled;
pub mod parity;
pub mod plan;
pub mod property;
pub mod reference;
pub mod tensor;
pub mod virial;

use dpw::backend::Backend;

/// How close a backend's numbers come to DeePMD-kit 3.2.0's float64 ones: predictions relative
/// to their largest value, a loss relative to itself, its gradient per parameter tensor.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub pred: f64,
    pub loss: f64,
    pub grad: f64,
}

impl Tol {
    /// float64: the same numbers up to the sums' rounding.
    pub const F64: Tol = Tol {
        pred: 1e-10,
        loss: 1e-12,
        grad: 1e-12,
    };
    /// float32 (the model's weights and the passes in float32, the loss summed in float64),
    /// against DeePMD-kit's float64 numbers.
    pub const F32: Tol = Tol {
        pred: 1e-5,
        loss: 1e-5,
        grad: 2e-4,
    };
}

/// The five fittings of issue 53 (ener with frame and atomic parameters, property, dos,
/// dipole and polar) against DeePMD-kit's numbers in float32: their predictions and one step's
/// loss and gradient.
pub fn fittings_f32<B: Backend<f32>>(b: &B) {
    for case in descriptors::FITTING_CASES {
        descriptors::predictions_at(b, case, Tol::F32);
        descriptors::training_gradients_at(b, case, Tol::F32);
    }
    for case in property::PROPERTY_CASES {
        property::predictions_at(b, case, Tol::F32);
        property::training_gradients_at(b, case, Tol::F32);
    }
    dos::predictions_at(b, Tol::F32);
    dos::training_gradients_at(b, Tol::F32);
    for &case in tensor::TENSOR_CASES {
        tensor::predictions_at(b, case, Tol::F32);
        tensor::training_gradients_at(b, case, Tol::F32);
    }
}

/// Instantiates the whole suite for a backend expression implementing `Backend<f64>`; attributes
/// before it (e.g. `#[ignore = "..."]`) go on every test.
#[macro_export]
macro_rules! backend_suite {
    (@tests [$($attr:meta)?] $backend:expr) => {
        #[test]
        $(#[$attr])?
        fn reference_predictions() {
            $crate::suite::reference::predictions(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn fd_forces() {
            $crate::suite::fd::forces(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn fd_virial() {
            $crate::suite::fd::virial(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn fd_loss_gradient() {
            $crate::suite::fd::loss_gradient(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn fd_tensor_loss_gradient() {
            $crate::suite::fd::tensor_loss_gradient(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_env_mat_and_descriptor() {
            $crate::suite::reference::env_mat_and_descriptor(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_adam_steps() {
            $crate::suite::reference::adam_steps(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_weight_decay_steps() {
            $crate::suite::reference::weight_decay_steps::<f64, _>(&$backend, "float64");
        }
        #[test]
        $(#[$attr])?
        fn plan_buffers_stay_put() {
            $crate::suite::plan::buffers_stay_put(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn plan_write_and_copy() {
            $crate::suite::plan::write_and_copy(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn plan_resident_batches_match_host() {
            $crate::suite::plan::resident_batches_match_host(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn plan_adam_tail_counts_its_own_steps() {
            $crate::suite::plan::adam_tail_counts_its_own_steps(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn plan_clip_grad_norm() {
            $crate::suite::plan::clip_grad_norm(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_training_gradients() {
            $crate::suite::reference::training_gradients(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_virial_training_gradients() {
            $crate::suite::virial::training_gradients(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_se_e2_r_predictions() {
            $crate::suite::descriptors::predictions(&$backend, "se_e2_r_water");
            $crate::suite::descriptors::predictions(&$backend, "se_e2_r_alloy");
        }
        #[test]
        $(#[$attr])?
        fn reference_se_e2_r_training_gradients() {
            $crate::suite::descriptors::training_gradients(&$backend, "se_e2_r_water");
            $crate::suite::descriptors::training_gradients(&$backend, "se_e2_r_alloy");
        }
        #[test]
        $(#[$attr])?
        fn reference_se_e3_predictions() {
            $crate::suite::descriptors::predictions(&$backend, "se_e3_water");
            $crate::suite::descriptors::predictions(&$backend, "se_e3_alloy");
        }
        #[test]
        $(#[$attr])?
        fn reference_se_e3_training_gradients() {
            $crate::suite::descriptors::training_gradients(&$backend, "se_e3_water");
            $crate::suite::descriptors::training_gradients(&$backend, "se_e3_alloy");
        }
        #[test]
        $(#[$attr])?
        fn reference_hybrid_predictions() {
            $crate::suite::descriptors::predictions(&$backend, "hybrid_water");
            $crate::suite::descriptors::predictions(&$backend, "hybrid_alloy");
        }
        #[test]
        $(#[$attr])?
        fn reference_hybrid_training_gradients() {
            $crate::suite::descriptors::training_gradients(&$backend, "hybrid_water");
            $crate::suite::descriptors::training_gradients(&$backend, "hybrid_alloy");
        }
        #[test]
        $(#[$attr])?
        fn reference_se_atten_predictions() {
            for case in $crate::suite::descriptors::DPA1_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_dpa3_predictions() {
            for case in $crate::suite::descriptors::DPA3_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_dpa3_training_gradients() {
            for case in $crate::suite::descriptors::DPA3_CASES {
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_dpa2_predictions() {
            for case in $crate::suite::descriptors::DPA2_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_dpa2_training_gradients() {
            for case in $crate::suite::descriptors::DPA2_CASES {
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_se_e3_tebd_predictions() {
            for case in $crate::suite::descriptors::SE_E3_TEBD_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_se_e3_tebd_training_gradients() {
            for case in $crate::suite::descriptors::SE_E3_TEBD_CASES {
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_pairtab_predictions() {
            for case in $crate::suite::descriptors::PAIRTAB_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_pairtab_training_gradients() {
            for case in $crate::suite::descriptors::PAIRTAB_CASES {
                if $crate::suite::descriptors::PAIRTAB_EVAL_ONLY.contains(&case) {
                    continue;
                }
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_linear_predictions() {
            for case in $crate::suite::descriptors::LINEAR_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_linear_training_gradients() {
            for case in $crate::suite::descriptors::LINEAR_CASES {
                if $crate::suite::descriptors::LINEAR_EVAL_ONLY.contains(&case) {
                    continue;
                }
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_se_atten_training_gradients() {
            for case in $crate::suite::descriptors::DPA1_CASES {
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_fparam_predictions() {
            for case in $crate::suite::descriptors::FITTING_CASES {
                $crate::suite::descriptors::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_fparam_training_gradients() {
            for case in $crate::suite::descriptors::FITTING_CASES {
                $crate::suite::descriptors::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_property_predictions() {
            for case in $crate::suite::property::PROPERTY_CASES {
                $crate::suite::property::predictions(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_property_training_gradients() {
            for case in $crate::suite::property::PROPERTY_CASES {
                $crate::suite::property::training_gradients(&$backend, case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_dos_predictions() {
            $crate::suite::dos::predictions(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_dos_training_gradients() {
            $crate::suite::dos::training_gradients(&$backend);
        }
        #[test]
        $(#[$attr])?
        fn reference_tensor_predictions() {
            for case in $crate::suite::tensor::TENSOR_CASES {
                $crate::suite::tensor::predictions(&$backend, *case);
            }
        }
        #[test]
        $(#[$attr])?
        fn reference_tensor_training_gradients() {
            for case in $crate::suite::tensor::TENSOR_CASES {
                $crate::suite::tensor::training_gradients(&$backend, *case);
            }
        }
    };
    (#[$attr:meta] $backend:expr) => {
        $crate::backend_suite!(@tests [$attr] $backend);
    };
    ($backend:expr) => {
        $crate::backend_suite!(@tests [] $backend);
    };
}

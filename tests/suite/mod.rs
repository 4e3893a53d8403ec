//! One body per property, instantiated for every backend by [`backend_suite!`].
#![allow(dead_code)]

pub mod fd;
pub mod reference;

/// Instantiates the whole suite for a backend expression implementing `Backend<f64>`.
#[macro_export]
macro_rules! backend_suite {
    ($backend:expr) => {
        #[test]
        fn reference_predictions() {
            $crate::suite::reference::predictions(&$backend);
        }
        #[test]
        fn fd_forces() {
            $crate::suite::fd::forces(&$backend);
        }
        #[test]
        fn fd_virial() {
            $crate::suite::fd::virial(&$backend);
        }
        #[test]
        fn fd_loss_gradient() {
            $crate::suite::fd::loss_gradient(&$backend);
        }
        #[test]
        fn reference_env_mat_and_descriptor() {
            $crate::suite::reference::env_mat_and_descriptor(&$backend);
        }
        #[test]
        fn reference_adam_steps() {
            $crate::suite::reference::adam_steps(&$backend);
        }
        #[test]
        fn reference_training_gradients() {
            $crate::suite::reference::training_gradients(&$backend);
        }
    };
}

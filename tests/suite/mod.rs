//! One body per property, instantiated for every backend by [`backend_suite!`].
#![allow(dead_code)]

pub mod reference;

/// Instantiates the whole suite for a backend expression implementing `Backend<f64>`.
#[macro_export]
macro_rules! backend_suite {
    ($backend:expr) => {
        #[test]
        fn reference_predictions() {
            suite::reference::predictions(&$backend);
        }
        #[test]
        fn reference_training_gradients() {
            suite::reference::training_gradients(&$backend);
        }
    };
}

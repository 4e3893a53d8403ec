//! The backend suite on the CPU backend: its fused embedding path (the default) and the
//! per-layer path that GPU backends use.
mod common;
mod suite;

mod fused {
    crate::backend_suite!(dpw::backend::cpu::Cpu { fused: true });

    /// The suite's `fd_loss_gradient` moves a net's tensors together; here every tensor on its
    /// own, as the reference backend can afford.
    #[test]
    fn fd_loss_gradient_per_tensor() {
        use crate::suite::fd::{loss_gradient_along, Directions};
        loss_gradient_along(&dpw::backend::cpu::Cpu::default(), Directions::PerTensor);
    }
}

mod layered {
    crate::backend_suite!(dpw::backend::cpu::Cpu { fused: false });
}

/// The suite's weight decay test in float32 (the suite runs in float64).
#[test]
fn reference_weight_decay_steps_f32() {
    suite::reference::weight_decay_steps::<f32, _>(&dpw::backend::cpu::Cpu::default(), "float32");
}

/// The five fittings against DeePMD-kit's numbers in float32.
#[test]
fn reference_fittings_f32() {
    suite::fittings_f32(&dpw::backend::cpu::Cpu::default());
}

/// The profiling decorator forwards every op unchanged, the fused embedding ops included.
mod timed {
    crate::backend_suite!(dpw::backend::timed::Timed::new(dpw::backend::cpu::Cpu {
        fused: true
    }));

    /// One step per `adam` call, every op of a training step booked with FLOPs > 0.
    #[test]
    fn profile_counts_steps_and_ops() {
        use dpw::backend::timed::{Op, Timed};
        use dpw::backend::{AdamStep, Prefactors, TrainOps};
        use dpw::train::batch::assemble;
        use dpw::train::step::{forward, gradient, DeviceModel, Workspace};
        let model = crate::suite::fd::small_model(2, true, vec![6, 10], 7);
        let sys = crate::suite::fd::random_system(
            &[3, 5],
            Some([7.0, 0., 0., 0., 7.5, 0., 0., 0., 8.0]),
            3,
        );
        let b = Timed::new(dpw::backend::cpu::Cpu::default());
        let mut dm = DeviceModel::<f64, _>::new(&b, &model);
        let pref = Prefactors {
            e: 1.0,
            f: 10.0,
            v: 0.1,
        };
        let frame = sys.frame();
        for t in 1..=3 {
            let batch = assemble(&model.spec, &sys.atype, &[frame]).unwrap();
            let mut w = Workspace::for_batch(&b, &dm, &batch).unwrap();
            w.load(&b, &batch);
            forward(&b, &dm, &mut w);
            gradient(&b, &mut dm, &mut w, pref);
            let s = AdamStep {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                t,
                tail: None,
                decay: Default::default(),
            };
            TrainOps::<f64>::adam(&b, s, &mut dm.params, &dm.grad, &mut dm.m, &mut dm.v);
        }
        assert_eq!(b.steps(), 3);
        let p = b.profile(1);
        assert_eq!(p.steps, 2);
        for op in [
            Op::EnvMat,
            Op::EmbedForward,
            Op::ContractForward,
            Op::ContractEmbedDual,
            Op::DenseDualBackward,
            Op::Adam,
        ] {
            let o = p
                .ops
                .iter()
                .find(|o| o.op == op)
                .unwrap_or_else(|| panic!("{op:?} missing"));
            assert!(
                o.flops_per_step > 0.0 && o.s_per_step > 0.0,
                "{op:?}: {o:?}"
            );
        }
        let adam = p.ops.iter().find(|o| o.op == Op::Adam).unwrap();
        assert_eq!(adam.calls_per_step, 1.0);
    }
}

//! DPA-3's RepFlow block written on the tape (repflow_tape.rs: what a device runs) against
//! repflow.rs's hand-written passes (what the cpu backend runs), on the training frames of
//! every reference case (tests/reference/dpa3/, one or two options each, its README has the
//! table): the descriptor, the backward's ∂E/∂r_ij, the tangent's Ḋ and the dual reverse's
//! parameter gradient, in float64; each also with the rotation matrix a tensor fitting reads
//! (A after D, its adjoint in the seeds).
mod common;
mod suite;

use dpw::backend::block::BlockOpts;
use dpw::backend::cpu::block_in::BlockIn;
use dpw::backend::cpu::{repflow, repflow_tape};
use dpw::backend::keep::Keep;
use dpw::train::batch::assemble;

use suite::parity::Lcg;

/// max |a − b| over max |b|: a pass's numbers all in the units of its largest.
fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "a pass of all zeros tests nothing");
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

#[test]
fn repflow_on_the_tape_equals_repflow_by_hand() {
    let mut failures = Vec::new();
    let cases = suite::descriptors::DPA3_CASES.iter();
    for (case, rot) in cases.flat_map(|c| [(c, false), (c, true)]) {
        let (m, fr) = suite::descriptors::training_inputs(case);
        let batch = assemble(&m.spec, &fr.atype, &fr.all()).unwrap();
        let d = &batch.dims;
        let opts = BlockOpts::of(&m.spec.descriptor, m.spec.ntypes(), rot);
        let Some(BlockOpts::Repflow(o)) = &opts else {
            panic!("{case}: not a DPA-3 model");
        };
        let layout = m.layout();
        let out_len = (opts.as_ref().unwrap().host(&layout.descriptor)).out_len(d.ncentres());
        let case = format!("{case}{}", if rot { " with A" } else { "" });
        let x = BlockIn {
            o,
            l: layout.descriptor.own.dpa3().unwrap(),
            params: &m.params,
            davg: &m.davg,
            dstd: &m.dstd,
            rij: &batch.rij,
            owner: &batch.owner,
            nei_type: &batch.nei_type,
            centre_atom: &batch.centre_atom,
        };
        let (nd, nq) = (out_len, 3 * d.nslots());
        let mut rng = Lcg(54);
        let (dbar, ddotbar, rdot) = (rng.vec(nd), rng.vec(nd), rng.vec(nq));
        // Each pass on a keep of its own: the backward and the dual reverse take the state
        // their forward left.
        let hand = |keep: &Keep| {
            let (mut desc, mut q, mut ddot) = (vec![0.0; nd], vec![0.0; nq], vec![0.0; nd]);
            let mut grad = vec![0.0; m.params.len()];
            repflow::forward(d, &x, keep, &mut desc);
            repflow::backward(d, &x, keep, &dbar, &mut q);
            repflow::tangent(d, &x, keep, &rdot, &mut ddot);
            repflow::dual(d, &x, keep, &rdot, &dbar, &ddotbar, &mut grad);
            [desc, q, ddot, grad]
        };
        let tape = |keep: &Keep| {
            let (mut desc, mut q, mut ddot) = (vec![0.0; nd], vec![0.0; nq], vec![0.0; nd]);
            let mut grad = vec![0.0; m.params.len()];
            repflow_tape::forward(d, &x, keep, &mut desc);
            repflow_tape::backward(d, &x, keep, &dbar, &mut q);
            repflow_tape::tangent(d, &x, keep, &rdot, &mut ddot);
            repflow_tape::dual(d, &x, keep, &rdot, (&dbar, &ddotbar), &mut grad);
            [desc, q, ddot, grad]
        };
        let (want, got) = (hand(&Keep::default()), tape(&Keep::default()));
        let names = ["descriptor", "q", "tangent", "dual reverse's gradient"];
        let errs: Vec<f64> = (got.iter().zip(&want)).map(|(g, w)| rel(g, w)).collect();
        let shown: Vec<String> = (names.iter().zip(&errs))
            .map(|(n, e)| format!("{n} {e:.1e}"))
            .collect();
        eprintln!("{case}: {}", shown.join(", "));
        for (name, e) in names.iter().zip(&errs) {
            if e.is_nan() || *e > 1e-12 {
                failures.push(format!("{case}: {name} off by {e:.1e} relative"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! DeePMD-kit's initial distributions (docs/deepmd-spec.md §5): `W ~ N(0, 1/sqrt(n_in+n_out))`, `b ~ N(0, 1)`,
//! `idt ~ N(0.1, 0.001)`. DeePMD's own streams come from torch's RNG and cannot be reproduced,
//! so dpw draws from its own seeded generator: the same seed gives the same model everywhere.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::ParamLayout;

pub fn init_params(layout: &ParamLayout, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut p = vec![0.0; layout.len];
    for net in layout.embed.iter().chain(&layout.fit) {
        for l in &net.layers {
            let std_w = 1.0 / ((l.nin + l.nout) as f64).sqrt();
            fill(&mut p[l.w..l.w + l.nin * l.nout], 0.0, std_w, &mut rng);
            fill(&mut p[l.b..l.b + l.nout], 0.0, 1.0, &mut rng);
            if let Some(idt) = l.idt {
                fill(&mut p[idt..idt + l.nout], 0.1, 0.001, &mut rng);
            }
        }
    }
    p
}

fn fill(x: &mut [f64], mean: f64, std: f64, rng: &mut ChaCha8Rng) {
    let d = Normal::new(mean, std).expect("std is positive");
    x.iter_mut().for_each(|v| *v = d.sample(rng));
}

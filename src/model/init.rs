//! DeePMD-kit's initial distributions (docs/deepmd-spec.md §5): `W ~ N(0, 1/sqrt(n_in+n_out))`, `b ~ N(0, 1)`,
//! `idt ~ N(0.1, 0.001)`. DeePMD's own streams come from torch's RNG and cannot be reproduced,
//! so dpw draws from its own seeded generator: the same seed gives the same model everywhere.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::{Layer, ParamLayout, TensorInfo};

pub fn init_params(layout: &ParamLayout, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut p = vec![0.0; layout.len];
    for net in (layout.descriptor.embed.iter()).chain(&layout.fitting.nets) {
        for l in &net.layers {
            layer(&mut p, l, &mut rng);
        }
    }
    // DPA-1's other nets, after the others' (whose draws are thus as before): the type
    // embedding and projections as any layer, the layer norms at scale 1 and shift 0
    // (DeePMD-kit's LayerNorm starts there).
    if let Some(a) = &layout.descriptor.attn {
        let t = &a.tebd;
        let std_w = 1.0 / ((t.ntypes + t.dim) as f64).sqrt();
        fill(&mut p[t.w..t.w + t.ntypes * t.dim], 0.0, std_w, &mut rng);
        if let Some(b) = t.b {
            fill(&mut p[b..b + t.dim], 0.0, 1.0, &mut rng);
        }
        for l in a.strip.iter().flat_map(|n| &n.layers) {
            layer(&mut p, l, &mut rng);
        }
        for k in &a.layers {
            layer(&mut p, &k.proj_in, &mut rng);
            layer(&mut p, &k.proj_out, &mut rng);
            let m1 = k.proj_out.nout;
            p[k.ln_w..k.ln_w + m1].fill(1.0);
            p[k.ln_b..k.ln_b + m1].fill(0.0);
        }
    }
    // DPA-3's tensors (it has no embedding nets): the linears as any layer, the bias-free
    // weights alike, the residual vectors at update_residual or drawn around 0 with it as std.
    if let Some(d) = &layout.descriptor.dpa3 {
        let t = &d.tebd;
        let std_w = 1.0 / ((t.ntypes + t.dim) as f64).sqrt();
        fill(&mut p[t.w..t.w + t.ntypes * t.dim], 0.0, std_w, &mut rng);
        if let Some(b) = t.b {
            fill(&mut p[b..b + t.dim], 0.0, 1.0, &mut rng);
        }
        layer(&mut p, &d.edge_embd, &mut rng);
        let bias_free = |p: &mut [f64], at: usize, rng: &mut ChaCha8Rng| {
            let t = tensor_at(layout, at);
            let std_w = 1.0 / (t.shape.iter().sum::<usize>() as f64).sqrt();
            fill(&mut p[at..at + t.len()], 0.0, std_w, rng);
        };
        bias_free(&mut p, d.angle_embd, &mut rng);
        let (r, norm) = d.residual_init;
        for l in &d.layers {
            for x in [&l.node_self, &l.node_sym, &l.node_edge, &l.edge_self] {
                layer(&mut p, x, &mut rng);
            }
            if let Some(a) = &l.angle {
                for x in [&a.edge_angle1, &a.edge_angle2, &a.angle_self] {
                    layer(&mut p, x, &mut rng);
                }
                for w in [a.compress_n, a.compress_e].into_iter().flatten() {
                    bias_free(&mut p, w, &mut rng);
                }
            }
            for &o in l
                .n_residual
                .iter()
                .chain(&l.e_residual)
                .chain(&l.a_residual)
            {
                let w = tensor_at(layout, o).len();
                if norm && r != 0.0 {
                    fill(&mut p[o..o + w], 0.0, r.abs(), &mut rng);
                } else {
                    p[o..o + w].fill(r);
                }
            }
        }
    }
    p
}

/// The tensor starting at `offset`.
fn tensor_at(layout: &ParamLayout, offset: usize) -> &TensorInfo {
    (layout.tensors.iter())
        .find(|t| t.offset == offset)
        .expect("every offset of the layout starts a tensor")
}

fn layer(p: &mut [f64], l: &Layer, rng: &mut ChaCha8Rng) {
    let std_w = 1.0 / ((l.nin + l.nout) as f64).sqrt();
    fill(&mut p[l.w..l.w + l.nin * l.nout], 0.0, std_w, rng);
    fill(&mut p[l.b..l.b + l.nout], 0.0, 1.0, rng);
    if let Some(idt) = l.idt {
        fill(&mut p[idt..idt + l.nout], 0.1, 0.001, rng);
    }
}

fn fill(x: &mut [f64], mean: f64, std: f64, rng: &mut ChaCha8Rng) {
    let d = Normal::new(mean, std).expect("std is positive");
    x.iter_mut().for_each(|v| *v = d.sample(rng));
}

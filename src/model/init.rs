//! DeePMD-kit's initial distributions (docs/deepmd-spec.md §5): `W ~ N(0, 1/sqrt(n_in+n_out))`, `b ~ N(0, 1)`,
//! `idt ~ N(0.1, 0.001)`. DeePMD's own streams come from torch's RNG and cannot be reproduced,
//! so dpw draws from its own seeded generator: the same seed gives the same model everywhere.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::{Layer, Net, ParamLayout, TebdLayout, TensorInfo};

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
    if let Some(a) = layout.descriptor.own.attn() {
        tebd(&mut p, &a.tebd, &mut rng);
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
    if let Some(d) = layout.descriptor.own.dpa3() {
        tebd(&mut p, &d.tebd, &mut rng);
        layer(&mut p, &d.edge_embd, &mut rng);
        bias_free(layout, &mut p, d.angle_embd, &mut rng);
        for l in &d.layers {
            for x in [&l.node_self, &l.node_sym, &l.node_edge, &l.edge_self] {
                layer(&mut p, x, &mut rng);
            }
            if let Some(a) = &l.angle {
                for x in [&a.edge_angle1, &a.edge_angle2, &a.angle_self] {
                    layer(&mut p, x, &mut rng);
                }
                for w in [a.compress_n, a.compress_e].into_iter().flatten() {
                    bias_free(layout, &mut p, w, &mut rng);
                }
            }
            let rows = l
                .n_residual
                .iter()
                .chain(&l.e_residual)
                .chain(&l.a_residual);
            residuals(layout, &mut p, rows, d.residual_init, &mut rng);
        }
    }
    // DPA-2's, alike; its layer norms start at scale 1 and shift 0.
    if let Some(d) = layout.descriptor.own.dpa2() {
        tebd(&mut p, &d.tebd, &mut rng);
        let embedding = [Some(&d.repinit), d.repinit_strip.as_ref()]
            .into_iter()
            .chain([d.three_body.as_ref(), d.three_body_strip.as_ref()]);
        nets(&mut p, embedding.flatten(), &mut rng);
        for w in [d.shape_transform, d.tebd_transform].into_iter().flatten() {
            bias_free(layout, &mut p, w, &mut rng);
        }
        layer(&mut p, &d.g2_embd, &mut rng);
        for l in &d.layers {
            let linears = [Some(&l.linear1), l.linear2.as_ref(), l.g1_self_mlp.as_ref()]
                .into_iter()
                .chain([l.attn2_head_map.as_ref(), l.loc_head_map.as_ref()])
                .flatten();
            for x in linears {
                layer(&mut p, x, &mut rng);
            }
            let weights = [l.proj_g1g2, l.proj_g1g1g2, l.mapqk, l.mapv, l.ev_head_map]
                .into_iter()
                .chain([l.loc_mapq, l.loc_mapkv])
                .flatten();
            for w in weights {
                bias_free(layout, &mut p, w, &mut rng);
            }
            if let Some((w, b)) = l.attn2_lm {
                let n = tensor_at(layout, w).len();
                p[w..w + n].fill(1.0);
                p[b..b + n].fill(0.0);
            }
            let rows = l
                .g1_residual
                .iter()
                .chain(&l.g2_residual)
                .chain(&l.h2_residual);
            residuals(layout, &mut p, rows, d.residual_init, &mut rng);
        }
    }
    // se_e3_tebd's (it has no `embed` nets either).
    if let Some(d) = layout.descriptor.own.se_e3_tebd() {
        tebd(&mut p, &d.tebd, &mut rng);
        nets(
            &mut p,
            [Some(&d.embed), d.embed_strip.as_ref()]
                .into_iter()
                .flatten(),
            &mut rng,
        );
    }
    p
}

/// Every layer of `nets`, in order.
fn nets<'a>(p: &mut [f64], nets: impl Iterator<Item = &'a Net>, rng: &mut ChaCha8Rng) {
    for l in nets.flat_map(|n| &n.layers) {
        layer(p, l, rng);
    }
}

/// The tensor starting at `offset`.
fn tensor_at(layout: &ParamLayout, offset: usize) -> &TensorInfo {
    (layout.tensors.iter())
        .find(|t| t.offset == offset)
        .expect("every offset of the layout starts a tensor")
}

/// A type embedding's layer, as any layer.
fn tebd(p: &mut [f64], t: &TebdLayout, rng: &mut ChaCha8Rng) {
    let std_w = 1.0 / ((t.ntypes + t.dim) as f64).sqrt();
    fill(&mut p[t.w..t.w + t.ntypes * t.dim], 0.0, std_w, rng);
    if let Some(b) = t.b {
        fill(&mut p[b..b + t.dim], 0.0, 1.0, rng);
    }
}

/// A weight without bias at `at`, as a layer's.
fn bias_free(layout: &ParamLayout, p: &mut [f64], at: usize, rng: &mut ChaCha8Rng) {
    let t = tensor_at(layout, at);
    let std_w = 1.0 / (t.shape.iter().sum::<usize>() as f64).sqrt();
    fill(&mut p[at..at + t.len()], 0.0, std_w, rng);
}

/// Residual vectors at `r`, or drawn from N(0, r²) where `norm` (update_residual_init).
fn residuals<'a>(
    layout: &ParamLayout,
    p: &mut [f64],
    rows: impl Iterator<Item = &'a usize>,
    (r, norm): (f64, bool),
    rng: &mut ChaCha8Rng,
) {
    for &o in rows {
        let w = tensor_at(layout, o).len();
        if norm && r != 0.0 {
            fill(&mut p[o..o + w], 0.0, r.abs(), rng);
        } else {
            p[o..o + w].fill(r);
        }
    }
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

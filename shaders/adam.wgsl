// Adam as torch.optim.Adam computes it, with its weight decay (see cpu/adam.rs), one thread per
// parameter; and the gradient clipping before it (Backend::clip_grad_norm).

// VectorParams: src/backend/gpu_layout.rs; n is the number of parameters.
@group(0) @binding(0) var<uniform> u: VectorParams;
// [lr / (1 − β1^t), β1, β2, eps, sqrt(1 − β2^t), then the first and last for the tail's own t
// (entries from u.tail_from on), then p's factor before the update and the L2 term's λ (1 and
// 0 without decay: the same numbers), then the first and last for the tail's fitting part
// (entries from u.fit_from on)], rounded to `real` on the host as the CPU does
@group(0) @binding(1) var<storage, read> hyper: array<real>;
@group(0) @binding(2) var<storage, read> grad: array<real>;
@group(0) @binding(3) var<storage, read_write> params: array<real>;
@group(0) @binding(4) var<storage, read_write> m: array<real>;
@group(0) @binding(5) var<storage, read_write> v: array<real>;

@compute @workgroup_size(64)
fn adam(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.n) {
        return;
    }
    let tail = i >= u.tail_from;
    let fit = i >= u.fit_from;
    let step = select(select(hyper[0], hyper[5], tail), hyper[9], fit);
    let bc2 = select(select(hyper[4], hyper[6], tail), hyper[10], fit);
    let b1 = hyper[1];
    let b2 = hyper[2];
    let g = grad[i] + hyper[8] * params[i];
    params[i] = params[i] * hyper[7];
    let mi = m[i] * b1 + g * (real(1) - b1);
    let vi = v[i] * b2 + g * g * (real(1) - b2);
    m[i] = mi;
    v[i] = vi;
    let denom = sqrt_r(vi) / bc2 + hyper[3];
    params[i] -= step * mi / denom;
}

@group(0) @binding(6) var<storage, read_write> norm: array<real>;
@group(0) @binding(7) var<storage, read_write> g: array<real>;

const NORM_WG: u32 = 256u;
var<workgroup> part: array<real, 256>;

// norm[0] = sqrt(Σ g²), by one workgroup: strided partials, then a halving tree (the order of
// the loss sums: reproducible run to run).
@compute @workgroup_size(256)
fn grad_norm(@builtin(local_invocation_id) l: vec3<u32>) {
    var acc = real(0);
    for (var i = l.x; i < u.n; i += NORM_WG) {
        acc += g[i] * g[i];
    }
    part[l.x] = acc;
    workgroupBarrier();
    for (var w = NORM_WG / 2u; w > 0u; w /= 2u) {
        if (l.x < w) {
            part[l.x] += part[l.x + w];
        }
        workgroupBarrier();
    }
    if (l.x == 0u) {
        norm[0] = sqrt_r(part[0]);
    }
}

// g ×= max / (norm + eps) where that is below 1; hyper = [max, eps]. A NaN norm scales nothing
// (the trainer reports it at the next display step).
@compute @workgroup_size(64)
fn clip_scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.n) {
        return;
    }
    let coef = hyper[0] / (norm[0] + hyper[1]);
    if (coef < real(1)) {
        g[i] = g[i] * coef;
    }
}

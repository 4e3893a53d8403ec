// Adam as torch.optim.Adam computes it (see cpu/adam.rs), one thread per parameter.

struct Adam {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> u: Adam;
// [lr / (1 − β1^t), β1, β2, eps, sqrt(1 − β2^t)], rounded to `real` on the host as the CPU does
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
    let step = hyper[0];
    let b1 = hyper[1];
    let b2 = hyper[2];
    let g = grad[i];
    let mi = m[i] * b1 + g * (real(1) - b1);
    let vi = v[i] * b2 + g * g * (real(1) - b2);
    m[i] = mi;
    v[i] = vi;
    let denom = sqrt_r(vi) / hyper[4] + hyper[3];
    params[i] -= step * mi / denom;
}

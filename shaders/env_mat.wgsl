// Environment matrix R̂ = (R − davg)/dstd with its Jacobian ∂R̂/∂r_ij (see cpu/env_mat.rs), one
// thread per slot, launched once per centre type (that type's davg/dstd row).

// EnvMatParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: EnvMatParams;
@group(0) @binding(1) var<storage, read> rij: array<real>;
@group(0) @binding(2) var<storage, read> owner: array<i32>;
@group(0) @binding(3) var<storage, read> davg: array<real>;
@group(0) @binding(4) var<storage, read> dstd: array<real>;
// [rcut, rcut_smth, protection]
@group(0) @binding(5) var<storage, read> env: array<real>;
@group(0) @binding(6) var<storage, read_write> rhat: array<real>;
@group(0) @binding(7) var<storage, read_write> jac: array<real>;
@group(0) @binding(8) var<storage, read_write> s_out: array<real>;

@compute @workgroup_size(64)
fn env_mat(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nslots) {
        return;
    }
    let s = u.slot0 + id;
    var row = vec4<real>();
    // jr[k] = ∂R[k]/∂r_ij
    var jr = array<vec3<real>, 4>();
    if (owner[s] >= 0) {
        let x = vec3<real>(rij[3u * s], rij[3u * s + 1u], rij[3u * s + 2u]);
        let r = sqrt_r(x.x * x.x + x.y * x.y + x.z * x.z);
        let rr = r + env[2];
        let sw = switch_fn(r, env[0], env[1]);
        let dir = x / r;
        let rr2 = rr * rr;
        let d0 = sw.y / rr - sw.x / rr2;
        let dv = sw.y / rr2 - real(2) * sw.x / (rr2 * rr);
        row = vec4<real>(sw.x / rr, sw.x * x / rr2);
        jr[0] = d0 * dir;
        for (var k = 0u; k < 3u; k++) {
            var e = vec3<real>();
            e[k] = sw.x / rr2;
            jr[k + 1u] = x[k] * dv * dir + e;
        }
    }
    for (var k = 0u; k < 4u; k++) {
        let sd = dstd[4u * u.ti + k];
        rhat[4u * s + k] = (row[k] - davg[4u * u.ti + k]) / sd;
        for (var a = 0u; a < 3u; a++) {
            jac[12u * s + 3u * k + a] = jr[k][a] / sd;
        }
    }
    s_out[s] = (row[0] - davg[4u * u.ti]) / dstd[4u * u.ti];
}

// Loss residuals, their sums, and the virtual displacement Ṙ = J u of the gradient pass (see
// cpu/loss.rs). The sums use one workgroup and a fixed reduction tree: reproducible run to run.

// LossParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: LossParams;
// [2p_e/(N·nf), 2p_f/(3N·nf), 2p_v/(9N·nf)]
@group(0) @binding(1) var<storage, read> coef: array<real>;
@group(0) @binding(2) var<storage, read> pred: array<real>;
@group(0) @binding(3) var<storage, read> label: array<real>;
@group(0) @binding(4) var<storage, read_write> res: array<real>;
@group(0) @binding(5) var<storage, read> centre_atom: array<i32>;
@group(0) @binding(6) var<storage, read_write> sums: array<real>;
@group(0) @binding(7) var<storage, read> fres: array<real>;
@group(0) @binding(8) var<storage, read> vres: array<real>;
@group(0) @binding(9) var<storage, read> jac: array<real>;
@group(0) @binding(10) var<storage, read> rij: array<real>;
@group(0) @binding(11) var<storage, read> owner: array<i32>;
@group(0) @binding(12) var<storage, read_write> rdot: array<real>;
@group(0) @binding(13) var<storage, read_write> sdot: array<real>;
// The batch shape table (shape.wgsl)
@group(0) @binding(14) var<storage, read> dims: array<u32>;

// res = coef[which]·(pred − label), elementwise (forces, virials).
@compute @workgroup_size(64)
fn residual(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.n) {
        return;
    }
    res[i] = coef[u.which] * (pred[i] - label[i]);
}

// ∂L/∂E of each centre's frame.
@compute @workgroup_size(64)
fn energy_bar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let c = flat_id(wg, nwg, l);
    if (c >= u.n) {
        return;
    }
    let f = centre_frame(c);
    res[c] = coef[0] * (pred[f] - label[f]);
}

const SUM_WG: u32 = 256u;
var<workgroup> part: array<real, 256>;

// sums[which] = Σ (pred − label)², by one workgroup: strided partials, then a halving tree.
@compute @workgroup_size(256)
fn sumsq(@builtin(local_invocation_id) l: vec3<u32>) {
    var acc = real(0);
    for (var i = l.x; i < u.n; i += SUM_WG) {
        let d = pred[i] - label[i];
        acc += d * d;
    }
    part[l.x] = acc;
    workgroupBarrier();
    for (var w = SUM_WG / 2u; w > 0u; w /= 2u) {
        if (l.x < w) {
            part[l.x] += part[l.x + w];
        }
        workgroupBarrier();
    }
    if (l.x == 0u) {
        sums[u.which] = part[0];
    }
}

// u = fres_i − fres_owner − vres·r_ij of slot s of one block, thread id of its launch, owner o
// (a neighbour's, ≥ 0).
fn slot_seed(id: u32, s: u32, o: i32) -> vec3<real> {
    let c = u.centre0 + id / u.sel;
    let i = u32(centre_atom[c]);
    let f = i / u.natoms;
    let r = vec3<real>(rij[3u * s], rij[3u * s + 1u], rij[3u * s + 2u]);
    var uv = vec3<real>();
    for (var a = 0u; a < 3u; a++) {
        let v = 9u * f + 3u * a;
        let wr = vres[v] * r.x + vres[v + 1u] * r.y + vres[v + 2u] * r.z;
        uv[a] = fres[3u * i + a] - fres[3u * u32(o) + a] - wr;
    }
    return uv;
}

// Per slot of one block: u (slot_seed), Ṙ = J u, ṡ = Ṙ[0].
@compute @workgroup_size(64)
fn virtual_tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.n) {
        return;
    }
    let s = u.slot0 + id;
    let o = owner[s];
    if (o < 0) {
        for (var k = 0u; k < 4u; k++) {
            rdot[4u * s + k] = real(0);
        }
        sdot[s] = real(0);
        return;
    }
    let uv = slot_seed(id, s, o);
    for (var k = 0u; k < 4u; k++) {
        let j = 12u * s + 3u * k;
        rdot[4u * s + k] = jac[j] * uv.x + jac[j + 1u] * uv.y + jac[j + 2u] * uv.z;
    }
    sdot[s] = rdot[4u * s];
}

// Per slot of one block: ṙ_ij = u itself (slot_seed; 0 for padding) into `rdot` [slot][3], the
// seed of a descriptor that reads r_ij rather than R̂ (DPA-3, DPA-2, se_e3_tebd).
@compute @workgroup_size(64)
fn rij_tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.n) {
        return;
    }
    let s = u.slot0 + id;
    let o = owner[s];
    var uv = vec3<real>();
    if (o >= 0) {
        uv = slot_seed(id, s, o);
    }
    for (var a = 0u; a < 3u; a++) {
        rdot[3u * s + a] = uv[a];
    }
}

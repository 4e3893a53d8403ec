// se_e3's pair values e = r̃_j·r̃_k, its descriptor D_c = Σ_p w_p e_p G_p and their derivatives
// over the pair rows of Dims::pairs (see cpu/angle.rs). Per-row kernels are launched once per
// block (centre type, pair type), per-slot ones once per slot block, so that a row or a slot
// finds its centre by division; per-centre kernels run one thread per (centre, column of D)
// and visit the centre's rows in the CPU's order, as do the per-slot sums.

// AngleParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: AngleParams;
// The batch shape table (shape.wgsl)
@group(0) @binding(1) var<storage, read> dims: array<u32>;
// w_p per pair type, rounded to `real` on the host as the CPU rounds it
@group(0) @binding(2) var<storage, read> weight: array<real>;
@group(0) @binding(3) var<storage, read> rhat: array<real>;
@group(0) @binding(4) var<storage, read> rdot: array<real>;
@group(0) @binding(5) var<storage, read> e: array<real>;
@group(0) @binding(6) var<storage, read> edot: array<real>;
// G, G' [pair row][M1]
@group(0) @binding(7) var<storage, read> g: array<real>;
@group(0) @binding(8) var<storage, read> gp: array<real>;
// D̄, Ḋ̄ [centre][M1]
@group(0) @binding(9) var<storage, read> dbar: array<real>;
@group(0) @binding(10) var<storage, read> ddotbar: array<real>;
@group(0) @binding(11) var<storage, read> jac: array<real>;
// ē per pair row, written by angle_backward_pairs and read by angle_backward_slots
@group(0) @binding(12) var<storage, read_write> ebar_out: array<real>;
@group(0) @binding(13) var<storage, read> ebar: array<real>;
// e, ė, D, Ḋ, q or Ḡ
@group(0) @binding(14) var<storage, read_write> out: array<real>;
@group(0) @binding(15) var<storage, read_write> gdotbar: array<real>;

// r̃_s = R̂_s[1..4].
fn dir(s: u32) -> vec3<real> {
    return vec3<real>(rhat[4u * s + 1u], rhat[4u * s + 2u], rhat[4u * s + 3u]);
}

fn dir_dot(s: u32) -> vec3<real> {
    return vec3<real>(rdot[4u * s + 1u], rdot[4u * s + 2u], rdot[4u * s + 3u]);
}

// x·y summed as the CPU's dot3.
fn dot3(x: vec3<real>, y: vec3<real>) -> real {
    return x.x * y.x + x.y * y.y + x.z * y.z;
}

// First row of centre c (of type tc) of a pair type with n rows per centre, `before` rows per
// centre being those of the pair types before it (the block formula of AngleParams).
fn first_row(tc: u32, c: u32, before: u32, n: u32) -> u32 {
    let c0 = centre_start(tc);
    return c0 * u.pair_rows + (centre_start(tc + 1u) - c0) * before + (c - c0) * n;
}

// Pair row id of the launched block: (centre, slot j, slot k).
fn pair_slots(id: u32) -> vec3<u32> {
    let nk = sel_of(u.tj);
    let njk = sel_of(u.ti) * nk;
    let c = u.centre0 + id / njk;
    let jk = id % njk;
    return vec3<u32>(c, first_slot(u.tc, c, u.ti) + jk / nk, first_slot(u.tc, c, u.tj) + jk % nk);
}

@compute @workgroup_size(64)
fn angle_values(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows) {
        return;
    }
    let p = pair_slots(id);
    out[u.row0 + id] = dot3(dir(p.y), dir(p.z));
}

@compute @workgroup_size(64)
fn angle_values_tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows) {
        return;
    }
    let p = pair_slots(id);
    out[u.row0 + id] = dot3(dir_dot(p.y), dir(p.z)) + dot3(dir(p.y), dir_dot(p.z));
}

// out[c][i] = Σ_rows of c w e G[row][i] (D), or Σ w ė (G + e G')[row][i] (Ḋ), for id = c·M1 + i,
// over the pair types in order and each type's rows j-major, as the CPU sums. One function for
// D and Ḋ, so both entry points bind edot and gp: D's passes stand-ins.
fn pair_sum(id: u32, tangent: bool) {
    let c = id / u.m1;
    let i = id % u.m1;
    let tc = centre_type(c);
    var acc = real(0);
    var before = 0u;
    var p = 0u;
    for (var tj = 0u; tj < nsec(); tj++) {
        for (var ti = 0u; ti <= tj; ti++) {
            let n = sel_of(ti) * sel_of(tj);
            let r0 = first_row(tc, c, before, n);
            for (var r = r0; r < r0 + n; r++) {
                let x = r * u.m1 + i;
                if (tangent) {
                    acc += (weight[p] * edot[r]) * (g[x] + e[r] * gp[x]);
                } else {
                    acc += (weight[p] * e[r]) * g[x];
                }
            }
            before += n;
            p++;
        }
    }
    out[id] = acc;
}

@compute @workgroup_size(64)
fn angle_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id < u.ncentres * u.m1) {
        pair_sum(id, false);
    }
}

@compute @workgroup_size(64)
fn angle_tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id < u.ncentres * u.m1) {
        pair_sum(id, true);
    }
}

// Per pair row of one block: ē = w (D̄_c·G + e D̄_c·G'), each dot in the CPU's order (cpu
// contract.rs, dot: eight interleaved partial sums, then the tail).
@compute @workgroup_size(64)
fn angle_backward_pairs(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows) {
        return;
    }
    let r = u.row0 + id;
    let dc = (u.centre0 + id / (sel_of(u.ti) * sel_of(u.tj))) * u.m1;
    let gr = r * u.m1;
    var ag: array<real, 8>;
    var agp: array<real, 8>;
    let body = u.m1 - u.m1 % 8u;
    for (var i = 0u; i < body; i += 8u) {
        for (var k = 0u; k < 8u; k++) {
            ag[k] += dbar[dc + i + k] * g[gr + i + k];
            agp[k] += dbar[dc + i + k] * gp[gr + i + k];
        }
    }
    var tg = real(0);
    var tgp = real(0);
    for (var i = body; i < u.m1; i++) {
        tg += dbar[dc + i] * g[gr + i];
        tgp += dbar[dc + i] * gp[gr + i];
    }
    let sg = ((ag[0] + ag[4]) + (ag[1] + ag[5])) + ((ag[2] + ag[6]) + (ag[3] + ag[7])) + tg;
    let sgp = ((agp[0] + agp[4]) + (agp[1] + agp[5])) + ((agp[2] + agp[6]) + (agp[3] + agp[7])) + tgp;
    ebar_out[r] = weight[u.pair] * (sg + e[r] * sgp);
}

// Per slot of one slot block (neighbour type ti): r̃̄ = Σ ē_jk r̃_k over its rows as j, plus
// Σ ē_jk r̃_j over its rows as k, added in the CPU's row order (a row (m, m) gives both, j's
// first); then q = J[1..4]ᵀ r̃̄.
@compute @workgroup_size(64)
fn angle_backward_slots(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows) {
        return;
    }
    let s = u.row0 + id;
    let t = u.ti;
    let m = id % sel_of(t);
    let c = u.centre0 + id / sel_of(t);
    var xb = vec3<real>();
    var before = 0u;
    for (var tj = 0u; tj < nsec(); tj++) {
        for (var ti = 0u; ti <= tj; ti++) {
            let nj = sel_of(ti);
            let nk = sel_of(tj);
            if (ti == t || tj == t) {
                let r0 = first_row(u.tc, c, before, nj * nk);
                let sj0 = first_slot(u.tc, c, ti);
                let sk0 = first_slot(u.tc, c, tj);
                for (var j = 0u; j < nj; j++) {
                    if (ti == t && j == m) {
                        for (var k = 0u; k < nk; k++) {
                            let eb = ebar[r0 + j * nk + k];
                            xb += eb * dir(sk0 + k);
                            if (tj == t && k == m) {
                                xb += eb * dir(sj0 + j);
                            }
                        }
                    } else if (tj == t) {
                        xb += ebar[r0 + j * nk + m] * dir(sj0 + j);
                    }
                }
            }
            before += nj * nk;
        }
    }
    for (var x = 0u; x < 3u; x++) {
        let jx = 12u * s + x;
        out[3u * s + x] = jac[jx + 3u] * xb.x + jac[jx + 6u] * xb.y + jac[jx + 9u] * xb.z;
    }
}

// Per (pair row, i) of one block: Ḡ = (w e) D̄_c + (w ė) Ḋ̄_c, Ġ̄ = (w e) Ḋ̄_c.
@compute @workgroup_size(64)
fn angle_dual(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows * u.m1) {
        return;
    }
    let r = u.row0 + id / u.m1;
    let i = id % u.m1;
    let dc = (u.centre0 + (id / u.m1) / (sel_of(u.ti) * sel_of(u.tj))) * u.m1 + i;
    let a = weight[u.pair] * e[r];
    let b = weight[u.pair] * edot[r];
    out[r * u.m1 + i] = a * dbar[dc] + b * ddotbar[dc];
    gdotbar[r * u.m1 + i] = a * ddotbar[dc];
}

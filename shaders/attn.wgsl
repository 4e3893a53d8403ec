// DPA-1's element-wise ops (see backend/attn.rs, their host bodies): the switch σ and its slope
// per slot, the type-embedding rows and their adjoint, strip's G⁰ and its dual. The attention
// block itself runs on the host. The sums over rows (T̄, τ̄) are partial sums over fixed chunks
// of rows, each in row order, then added in chunk order by one thread per entry.

// AttnParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: AttnParams;
// [rcut, rcut_smth, protection]
@group(0) @binding(1) var<storage, read> env: array<real>;
@group(0) @binding(2) var<storage, read> rij: array<real>;
@group(0) @binding(3) var<storage, read> owner: array<i32>;
@group(0) @binding(4) var<storage, read> dstd: array<real>;
@group(0) @binding(5) var<storage, read_write> sw_out: array<real>;
@group(0) @binding(6) var<storage, read_write> dsw_out: array<real>;
// The model's parameters (the type embedding's W and b)
@group(0) @binding(7) var<storage, read> params: array<real>;
// One type list, [nrows]
@group(0) @binding(8) var<storage, read> types: array<i32>;
@group(0) @binding(9) var<storage, read> lead: array<real>;
// tebd_rows' output, [row][stride]
@group(0) @binding(10) var<storage, read_write> out: array<real>;
@group(0) @binding(11) var<storage, read> xbar: array<real>;
// Partial sums, [part][entries]
@group(0) @binding(12) var<storage, read_write> partial: array<real>;
@group(0) @binding(13) var<storage, read_write> grad: array<real>;
@group(0) @binding(14) var<storage, read> nei_type: array<i32>;
@group(0) @binding(15) var<storage, read> centre_type: array<i32>;
@group(0) @binding(16) var<storage, read> sw_in: array<real>;
@group(0) @binding(17) var<storage, read> dsw_in: array<real>;
// Per slot, written by strip_slots: its row of τ, and [c, c'] (c = σ or 1, c' = dc/dŝ). The
// strip kernels read these rather than the four buffers they come from, so that none binds
// more than 8 storage buffers (WebGPU's default limit).
@group(0) @binding(18) var<storage, read_write> slot_row: array<i32>;
@group(0) @binding(19) var<storage, read_write> slot_c: array<real>;
// G_s, G_s' and τ: [slot][M1], [slot][M1], [table row][M1]
@group(0) @binding(20) var<storage, read> gs: array<real>;
@group(0) @binding(21) var<storage, read> gsp: array<real>;
@group(0) @binding(22) var<storage, read> tau: array<real>;
// (G⁰, G⁰') from strip_forward, (Ḡ_s, Ġ̄_s) from strip_dual
@group(0) @binding(23) var<storage, read_write> g_out: array<real>;
@group(0) @binding(24) var<storage, read_write> gdot_out: array<real>;
@group(0) @binding(25) var<storage, read> sdot: array<real>;
@group(0) @binding(26) var<storage, read> g0bar: array<real>;
@group(0) @binding(27) var<storage, read> g0dotbar: array<real>;
@group(0) @binding(28) var<storage, read_write> taubar: array<real>;

// Per slot of centre type ti: σ and dσ/dŝ = (dσ/ds)·dstd[ti][0], s = σ/(r + p) the raw
// radial value (geometry::env_switch); 0 for padding and where ds/dr vanishes.
@compute @workgroup_size(64)
fn attn_switch(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows) {
        return;
    }
    let s = u.row0 + id;
    var value = real(0);
    var slope = real(0);
    if (owner[s] >= 0) {
        let x = vec3<real>(rij[3u * s], rij[3u * s + 1u], rij[3u * s + 2u]);
        let r = sqrt_r(x.x * x.x + x.y * x.y + x.z * x.z);
        let rr = r + env[2];
        let f = switch_fn(r, env[0], env[1]);
        let ds = f.y / rr - f.x / (rr * rr);
        value = f.x;
        if (ds != real(0)) {
            slope = f.y / ds;
        }
    }
    sw_out[s] = value;
    dsw_out[s] = slope * dstd[4u * u.ti];
}

// T[t][c] = W[t][c] (+ b[c]) (+ 1 where the skip connection maps c to t), in the host's order.
fn tebd_value(t: u32, c: u32) -> real {
    var v = params[u.w + t * u.width + c];
    if (u.has_b != 0u) {
        v += params[u.b + c];
    }
    if ((u.skip == 1u && c == t) || (u.skip == 2u && c % u.ntypes == t)) {
        v += real(1);
    }
    return v;
}

// Per (row, column) of one type list: out[row][col + c] = T[types[row]][c].
@compute @workgroup_size(64)
fn tebd_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nrows * u.width) {
        return;
    }
    let r = id / u.width;
    let c = id % u.width;
    out[r * u.stride + u.col + c] = tebd_value(u32(types[r]), c);
}

// Per row: the lead column, out[row][col] = lead[row].
@compute @workgroup_size(64)
fn tebd_rows_lead(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id < u.nrows) {
        out[id * u.stride + u.col] = lead[id];
    }
}

// Per (chunk, column c) of one type list: the chunk's rows summed per type, in row order, each
// type's sum kept in its partial, which only this thread reads and writes.
@compute @workgroup_size(64)
fn tebd_rows_backward_parts(@builtin(workgroup_id) wg: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nchunks * u.width) {
        return;
    }
    let chunk = id / u.width;
    let c = id % u.width;
    let part = (u.part0 + chunk) * u.ntypes * u.width + c;
    for (var t = 0u; t < u.ntypes; t++) {
        partial[part + t * u.width] = real(0);
    }
    let lo = chunk * u.chunk;
    let hi = min(u.nrows, lo + u.chunk);
    for (var r = lo; r < hi; r++) {
        partial[part + u32(types[r]) * u.width] += xbar[r * u.stride + u.col + c];
    }
}

// Per column c: T̄[t][c] from the partials of every list, in order; W̄[t][c] += T̄[t][c] and
// b̄[c] += T̄[t][c] type after type, as the host adds them.
@compute @workgroup_size(64)
fn tebd_rows_backward_sum(@builtin(workgroup_id) wg: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_id) l: vec3<u32>) {
    let c = flat_id(wg, nwg, l);
    if (c >= u.width) {
        return;
    }
    let entries = u.ntypes * u.width;
    for (var t = 0u; t < u.ntypes; t++) {
        var tb = real(0);
        for (var p = 0u; p < u.nparts; p++) {
            tb += partial[p * entries + t * u.width + c];
        }
        grad[u.w + t * u.width + c] += tb;
        if (u.has_b != 0u) {
            grad[u.b + c] += tb;
        }
    }
}

// Per slot: its row of τ and [c, c'].
@compute @workgroup_size(64)
fn strip_slots(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let s = flat_id(wg, nwg, l);
    if (s >= u.nrows) {
        return;
    }
    var row = nei_type[s];
    if (u.one_side == 0u) {
        row += centre_type[s] * i32(u.ntypes);
    }
    slot_row[s] = row;
    var c = vec2<real>(real(1), real(0));
    if (u.c_is_sw != 0u) {
        c = vec2<real>(sw_in[s], dsw_in[s]);
    }
    slot_c[2u * s] = c.x;
    slot_c[2u * s + 1u] = c.y;
}

// Per (slot, column): G⁰ = G_s (1 + c τ), G⁰' = G_s' (1 + c τ) + G_s τ c'.
@compute @workgroup_size(64)
fn strip_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.nrows * u.width) {
        return;
    }
    let s = i / u.width;
    let t = tau[u32(slot_row[s]) * u.width + i % u.width];
    let c = slot_c[2u * s];
    g_out[i] = gs[i] * (real(1) + c * t);
    gdot_out[i] = gsp[i] * (real(1) + c * t) + gs[i] * t * slot_c[2u * s + 1u];
}

// Per (slot, column): Ḡ_s = Ḡ⁰(1 + cτ) + Ġ̄⁰ τ ċ, Ġ̄_s = Ġ̄⁰(1 + cτ), ċ = c'ṡ.
@compute @workgroup_size(64)
fn strip_dual(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.nrows * u.width) {
        return;
    }
    let s = i / u.width;
    let t = tau[u32(slot_row[s]) * u.width + i % u.width];
    let cdot = slot_c[2u * s + 1u] * sdot[s];
    let one = real(1) + slot_c[2u * s] * t;
    g_out[i] = g0bar[i] * one + g0dotbar[i] * t * cdot;
    gdot_out[i] = g0dotbar[i] * one;
}

// Per (chunk, column k): τ̄ = Ḡ⁰ G_s c + Ġ̄⁰ (G_s' ṡ c + G_s ċ) over the chunk's slots, in slot
// order, each row of τ's sum kept in its partial, which only this thread reads and writes.
@compute @workgroup_size(64)
fn strip_dual_parts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nchunks * u.width) {
        return;
    }
    let chunk = id / u.width;
    let k = id % u.width;
    let part = chunk * u.table_rows * u.width + k;
    for (var row = 0u; row < u.table_rows; row++) {
        partial[part + row * u.width] = real(0);
    }
    let lo = chunk * u.chunk;
    let hi = min(u.nrows, lo + u.chunk);
    for (var s = lo; s < hi; s++) {
        let i = s * u.width + k;
        let c = slot_c[2u * s];
        let cdot = slot_c[2u * s + 1u] * sdot[s];
        let gsdot = gsp[i] * sdot[s];
        partial[part + u32(slot_row[s]) * u.width] +=
            g0bar[i] * gs[i] * c + g0dotbar[i] * (gsdot * c + gs[i] * cdot);
    }
}

// Per entry of τ̄: its partials added in chunk order.
@compute @workgroup_size(64)
fn strip_dual_sum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    let entries = u.table_rows * u.width;
    if (e >= entries) {
        return;
    }
    var acc = real(0);
    for (var p = 0u; p < u.nparts; p++) {
        acc += partial[p * entries + e];
    }
    taubar[e] = acc;
}

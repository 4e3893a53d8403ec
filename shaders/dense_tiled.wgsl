// The dense layers' matrix products as 16×16 tiles staged in workgroup memory, for hardware GPUs
// (appended to dense.wgsl, whose bindings and helpers they use). Each output still sums over k (or
// over the chunk's rows, for W̄) in the flat kernels' order; a tile's padding adds products of 0.
// On an H200 (Vulkan) the flat kernels took the water step from 6.5 to 11.1 ms; on software
// Vulkan (lavapipe, SwiftShader), which switches a workgroup's invocations at every barrier, the
// tiles are the slow ones. src/backend/wgpu/ops.rs picks by adapter (`DPW_WGPU_DENSE`).

const TS: u32 = 16u;

var<workgroup> ta: array<array<real, 16>, 16>;
var<workgroup> tb: array<array<real, 16>, 16>;
var<workgroup> tc: array<array<real, 16>, 16>;
var<workgroup> td: array<array<real, 16>, 16>;

// Row tiles run along y then z (65535 workgroups at most per dimension).
fn row_tile(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

// (xW)[r][n] for x = xin rows (forward, tangent); every thread of the workgroup calls it.
fn xw_tile(r: u32, n: u32, l: vec3<u32>) -> real {
    var acc = real(0);
    for (var k0 = 0u; k0 < u.nin; k0 += TS) {
        let ka = k0 + l.x;
        ta[l.y][l.x] = select(real(0), xin[(u.row0 + r) * u.nin + ka], r < u.nrows && ka < u.nin);
        let kb = k0 + l.y;
        tb[l.y][l.x] = select(real(0), params[u.w + kb * u.nout + n], kb < u.nin && n < u.nout);
        workgroupBarrier();
        for (var t = 0u; t < TS; t++) {
            acc += ta[l.y][t] * tb[t][l.x];
        }
        workgroupBarrier();
    }
    return acc;
}

@compute @workgroup_size(16, 16)
fn forward_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let r = row_tile(wg, nwg) * TS + l.y;
    let n = wg.x * TS + l.x;
    let acc = xw_tile(r, n, l);
    if (r < u.nrows && n < u.nout) {
        forward_out(acc, r, n);
    }
}

@compute @workgroup_size(16, 16)
fn tangent_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let r = row_tile(wg, nwg) * TS + l.y;
    let n = wg.x * TS + l.x;
    let acc = xw_tile(r, n, l);
    if (r < u.nrows && n < u.nout) {
        tangent_out(acc, r, n);
    }
}

// x̄ = (φ'(z)⊙(ȳ·idt))Wᵀ + skipᵀ(ȳ); z̄ is formed while its tile is loaded.
@compute @workgroup_size(16, 16)
fn backward_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let r = row_tile(wg, nwg) * TS + l.y;
    let k = wg.x * TS + l.x;
    var acc = real(0);
    for (var n0 = 0u; n0 < u.nout; n0 += TS) {
        let na = n0 + l.x;
        var zb = real(0);
        if (r < u.nrows && na < u.nout) {
            let g = (u.row0 + r) * u.nout + na;
            var yb = ybar[g];
            if (has_idt()) {
                yb = yb * params[u.idt + na];
            }
            zb = dphi(hin[g]) * yb;
        }
        ta[l.y][l.x] = zb;
        let nb = n0 + l.y;
        tb[l.y][l.x] = select(real(0), params[u.w + k * u.nout + nb], nb < u.nout && k < u.nin);
        workgroupBarrier();
        for (var t = 0u; t < TS; t++) {
            acc += ta[l.y][t] * tb[t][l.x];
        }
        workgroupBarrier();
    }
    if (r < u.nrows && k < u.nin) {
        let row = u.row0 + r;
        out0[row * u.nin + k] = acc + skip_adj(row * u.nout, k);
    }
}

// W̄ partials of chunk wg.z over a 16×16 tile of (input, output) pairs, rows in order. The tile
// row past the inputs' (wg.y = ⌈nin/16⌉) makes dual_bsum's b̄ and īdt partials instead, as the
// "inputs" nin and nin + 1: a column of ones against z̄ (ta) and one against the īdt terms (tc,
// td holding them): each a sum of 1·v + 0·w over the rows in order, dual_bsum's sums exactly, so
// the tiled path needs no dual_bsum dispatch (one thread walking a chunk's rows per column was a
// fifth of the wgpu step's kernel time on an H200).
@compute @workgroup_size(16, 16)
fn dual_wgrad_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let n = wg.x * TS + l.x;
    let sums = wg.y * TS >= u.nin;
    let i = select(wg.y * TS + l.y, u.nin + l.y, sums);
    let c = wg.z;
    let m = u.nrows * u.nout;
    let r_end = min((c + 1u) * u.chunk, u.nrows);
    var acc = real(0);
    for (var r0 = c * u.chunk; r0 < r_end; r0 += TS) {
        // Thread (x, y) stages row r0 + y: input column x of the i-tile, output column x of the n-tile.
        let r = r0 + l.y;
        let ok_z = r < r_end && n < u.nout;
        tb[l.y][l.x] = select(real(0), scratch[r * u.nout + n], ok_z);
        if (sums) {
            ta[l.y][l.x] = select(real(0), real(1), l.x == 0u);
            tc[l.y][l.x] = select(real(0), real(1), l.x == 1u);
            td[l.y][l.x] = select(real(0), scratch[2u * m + r * u.nout + n], ok_z);
        } else {
            let ia = wg.y * TS + l.x;
            let ok_x = r < r_end && ia < u.nin;
            let row = u.row0 + r;
            ta[l.y][l.x] = select(real(0), xin[row * u.nin + ia], ok_x);
            tc[l.y][l.x] = select(real(0), xdot[row * u.nin + ia] * row_scale(row), ok_x);
            td[l.y][l.x] = select(real(0), scratch[m + r * u.nout + n], ok_z);
        }
        workgroupBarrier();
        for (var t = 0u; t < TS; t++) {
            acc += ta[t][l.y] * tb[t][l.x] + tc[t][l.y] * td[t][l.x];
        }
        workgroupBarrier();
    }
    if (i < u.nin + select(0u, 2u, sums) && n < u.nout) {
        partial[(c * (u.nin + 2u) + i) * u.nout + n] = acc;
    }
}

// x̄ = z̄Wᵀ + skipᵀ(ȳ) and ẋ̄ = ż̄Wᵀ + skipᵀ(ẏ̄).
@compute @workgroup_size(16, 16)
fn dual_xbar_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let r = row_tile(wg, nwg) * TS + l.y;
    let k = wg.x * TS + l.x;
    let m = u.nrows * u.nout;
    var acc = real(0);
    var accd = real(0);
    for (var n0 = 0u; n0 < u.nout; n0 += TS) {
        let na = n0 + l.x;
        let ok = r < u.nrows && na < u.nout;
        ta[l.y][l.x] = select(real(0), scratch[r * u.nout + na], ok);
        tc[l.y][l.x] = select(real(0), scratch[m + r * u.nout + na], ok);
        let nb = n0 + l.y;
        tb[l.y][l.x] = select(real(0), params[u.w + k * u.nout + nb], nb < u.nout && k < u.nin);
        workgroupBarrier();
        for (var t = 0u; t < TS; t++) {
            acc += ta[l.y][t] * tb[t][l.x];
            accd += tc[l.y][t] * tb[t][l.x];
        }
        workgroupBarrier();
    }
    if (r < u.nrows && k < u.nin) {
        let row = u.row0 + r;
        out0[row * u.nin + k] = acc + skip_adj(row * u.nout, k);
        out1[row * u.nin + k] = accd + skip_adj_dot(row * u.nout, k);
    }
}

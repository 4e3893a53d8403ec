// Dense layers over a row range (see cpu/dense.rs): z = xW + b, h = tanh(z) or z, y = h·idt + skip(x).
// Matrix products are 16×16 tiles staged in workgroup memory; every output element is summed by
// one thread in a fixed order, so results are reproducible run to run.

const TS: u32 = 16u;

// DenseParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: DenseParams;
@group(0) @binding(1) var<storage, read> params: array<real>;
// x (forward, dual_wgrad) or ẋ (tangent)
@group(0) @binding(2) var<storage, read> xin: array<real>;
// h (forward), ż (tangent), x̄ (backward, dual_xbar)
@group(0) @binding(3) var<storage, read_write> out0: array<real>;
// y (forward), ẏ (tangent), ẋ̄ (dual_xbar)
@group(0) @binding(4) var<storage, read_write> out1: array<real>;
@group(0) @binding(5) var<storage, read> hin: array<real>;
@group(0) @binding(6) var<storage, read> ybar: array<real>;
@group(0) @binding(7) var<storage, read> ydotbar: array<real>;
@group(0) @binding(8) var<storage, read> zdot: array<real>;
@group(0) @binding(9) var<storage, read> scale: array<real>;
// [z̄ | ż̄ | īdt terms], each nrows×nout, rows relative to row0
@group(0) @binding(10) var<storage, read_write> scratch: array<real>;
@group(0) @binding(11) var<storage, read> xdot: array<real>;
// [nchunks][nin + 2][nout]: W̄ rows, then b̄, then īdt
@group(0) @binding(12) var<storage, read_write> partial: array<real>;
@group(0) @binding(13) var<storage, read_write> grad: array<real>;

var<workgroup> ta: array<array<real, 16>, 16>;
var<workgroup> tb: array<array<real, 16>, 16>;
var<workgroup> tc: array<array<real, 16>, 16>;
var<workgroup> td: array<array<real, 16>, 16>;

fn is_tanh() -> bool {
    return u.is_tanh != 0u;
}

fn has_idt() -> bool {
    return u.has_idt != 0u;
}

fn skip_kind() -> u32 {
    return u.skip;
}

fn dphi(h: real) -> real {
    return select(real(1), real(1) - h * h, is_tanh());
}

fn row_scale(row: u32) -> real {
    return select(real(1), scale[row], u.has_scale != 0u);
}

// Row tiles run along y then z (65535 workgroups at most per dimension).
fn row_tile(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

// skip(v) at column n of an output row, v being the row's input (x or ẋ) starting at `base`.
fn skip_fwd(base: u32, n: u32) -> real {
    switch skip_kind() {
        case 1u: {
            return xin[base + n];
        }
        case 2u: {
            return xin[base + n % u.nin];
        }
        default: {
            return real(0);
        }
    }
}

// Tiled c = a·W for a = xin rows (forward, tangent); each thread returns its element.
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
fn forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) l: vec3<u32>) {
    let r = row_tile(wg, nwg) * TS + l.y;
    let n = wg.x * TS + l.x;
    let acc = xw_tile(r, n, l);
    if (r < u.nrows && n < u.nout) {
        let row = u.row0 + r;
        let z = acc + params[u.b + n];
        let h = select(z, tanh_r(z), is_tanh());
        var y = h;
        if (has_idt()) {
            y = h * params[u.idt + n];
        }
        y += skip_fwd(row * u.nin, n);
        out0[row * u.nout + n] = h;
        out1[row * u.nout + n] = y;
    }
}

// ż = ẋW, ẏ = φ'(z)⊙ż·idt + skip(ẋ); `xin` holds ẋ.
@compute @workgroup_size(16, 16)
fn tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) l: vec3<u32>) {
    let r = row_tile(wg, nwg) * TS + l.y;
    let n = wg.x * TS + l.x;
    let acc = xw_tile(r, n, l);
    if (r < u.nrows && n < u.nout) {
        let row = u.row0 + r;
        let g = row * u.nout + n;
        var y = dphi(hin[g]) * acc;
        if (has_idt()) {
            y = y * params[u.idt + n];
        }
        y += skip_fwd(row * u.nin, n);
        out0[g] = acc;
        out1[g] = y;
    }
}

// The adjoint of the skip connection at input column k, from a row of ȳ (or of ẏ̄ below)
// starting at `base`. Two functions, so that `backward` does not reference ẏ̄ at all.
fn skip_adj(base: u32, k: u32) -> real {
    switch skip_kind() {
        case 1u: {
            return ybar[base + k];
        }
        case 2u: {
            return ybar[base + k] + ybar[base + k + u.nin];
        }
        default: {
            return real(0);
        }
    }
}

fn skip_adj_dot(base: u32, k: u32) -> real {
    switch skip_kind() {
        case 1u: {
            return ydotbar[base + k];
        }
        case 2u: {
            return ydotbar[base + k] + ydotbar[base + k + u.nin];
        }
        default: {
            return real(0);
        }
    }
}

// x̄ = (φ'(z)⊙(ȳ·idt))Wᵀ + skipᵀ(ȳ); z̄ is formed while its tile is loaded.
@compute @workgroup_size(16, 16)
fn backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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

// Dual reverse, step 1 (elementwise): z̄, ż̄ and the per-row īdt terms into `scratch`.
@compute @workgroup_size(64)
fn dual_z(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    let m = u.nrows * u.nout;
    if (i >= m) {
        return;
    }
    let n = i % u.nout;
    let row = u.row0 + i / u.nout;
    let g = row * u.nout + n;
    let so = row_scale(row);
    let h = hin[g];
    let zd = zdot[g] * so;
    let d1 = dphi(h);
    var hb = ybar[g];
    var hdb = ydotbar[g];
    var tidt = real(0);
    if (has_idt()) {
        let t = params[u.idt + n];
        tidt = ybar[g] * h + ydotbar[g] * d1 * zd;
        hb = ybar[g] * t;
        hdb = ydotbar[g] * t;
    }
    // tanh'' = −2h(1 − h²); the linear layer has no second-order term.
    let d2 = select(real(0), -(h + h) * d1, is_tanh());
    scratch[i] = d1 * hb + d2 * zd * hdb;
    scratch[m + i] = d1 * hdb;
    scratch[2u * m + i] = tidt;
}

// Dual reverse, step 2: W̄ partials of one chunk of rows, (xᵀz̄ + ẋᵀż̄) over a 16×16 tile of
// (input, output) pairs; rows are visited in order inside the chunk.
@compute @workgroup_size(16, 16)
fn dual_wgrad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let n = wg.x * TS + l.x;
    let i = wg.y * TS + l.y;
    let c = wg.z;
    let m = u.nrows * u.nout;
    let r_end = min((c + 1u) * u.chunk, u.nrows);
    var acc = real(0);
    for (var r0 = c * u.chunk; r0 < r_end; r0 += TS) {
        // Thread (x, y) stages row r0 + y: input column x of the i-tile, output column x of the n-tile.
        let r = r0 + l.y;
        let ia = wg.y * TS + l.x;
        let ok_x = r < r_end && ia < u.nin;
        let row = u.row0 + r;
        ta[l.y][l.x] = select(real(0), xin[row * u.nin + ia], ok_x);
        tc[l.y][l.x] = select(real(0), xdot[row * u.nin + ia] * row_scale(row), ok_x);
        let ok_z = r < r_end && n < u.nout;
        tb[l.y][l.x] = select(real(0), scratch[r * u.nout + n], ok_z);
        td[l.y][l.x] = select(real(0), scratch[m + r * u.nout + n], ok_z);
        workgroupBarrier();
        for (var t = 0u; t < TS; t++) {
            acc += ta[t][l.y] * tb[t][l.x] + tc[t][l.y] * td[t][l.x];
        }
        workgroupBarrier();
    }
    if (i < u.nin && n < u.nout) {
        partial[(c * (u.nin + 2u) + i) * u.nout + n] = acc;
    }
}

// Dual reverse, step 2b: b̄ and īdt partials of one chunk (one thread per (chunk, column)).
@compute @workgroup_size(64)
fn dual_bsum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let j = flat_id(wg, nwg, l);
    if (j >= u.nchunks * u.nout) {
        return;
    }
    let c = j / u.nout;
    let n = j % u.nout;
    let m = u.nrows * u.nout;
    var sb = real(0);
    var si = real(0);
    for (var r = c * u.chunk; r < min((c + 1u) * u.chunk, u.nrows); r++) {
        sb += scratch[r * u.nout + n];
        si += scratch[2u * m + r * u.nout + n];
    }
    partial[(c * (u.nin + 2u) + u.nin) * u.nout + n] = sb;
    partial[(c * (u.nin + 2u) + u.nin + 1u) * u.nout + n] = si;
}

// Dual reverse, step 3: chunk partials summed in chunk order and added to the gradient.
@compute @workgroup_size(64)
fn dual_wsum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let j = flat_id(wg, nwg, l);
    let width = (u.nin + 2u) * u.nout;
    if (j >= width) {
        return;
    }
    var s = real(0);
    for (var c = 0u; c < u.nchunks; c++) {
        s += partial[c * width + j];
    }
    let i = j / u.nout;
    let n = j % u.nout;
    if (i < u.nin) {
        grad[u.w + j] += s;
    } else if (i == u.nin) {
        grad[u.b + n] += s;
    } else if (has_idt()) {
        grad[u.idt + n] += s;
    }
}

// Dual reverse, step 4: x̄ = z̄Wᵀ + skipᵀ(ȳ) and ẋ̄ = ż̄Wᵀ + skipᵀ(ẏ̄).
@compute @workgroup_size(16, 16)
fn dual_xbar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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

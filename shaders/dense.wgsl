// Dense layers over a row range (see cpu/dense.rs): z = xW + b, y = φ(z)·idt + skip(x); a layer
// keeps h = tanh(z) of a tanh (or linear) layer's outputs for its passes, z of the others'.
// One thread per output element, summing in a fixed order (so results are reproducible run to
// run) with no workgroup memory or barriers: 16×16 tiles behind barriers ran software Vulkan
// (lavapipe, SwiftShader: CI and the browser test) at 0.02 GFLOP/s on small layers. Hardware GPUs
// run the tiled twins of the products in dense_tiled.wgsl (appended to this file).

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

// φ, φ' and φ'' (cpu/act.rs).
struct Phi {
    v: real,
    d1: real,
    d2: real,
}

fn silu3(x: real) -> Phi {
    let s = sigmoid_r(x);
    return Phi(x * s, s * (real(1) + x * (real(1) - s)),
               s * (real(1) - s) * (real(2) + x * (real(1) - s - s)));
}

// silut: silu below c, tanh(s·(x − c)) + silu(c) from c on, s = silu'(c).
fn silut3(x: real) -> Phi {
    let c = real(bitcast<f32>(u.silut_c0)) + real(bitcast<f32>(u.silut_c1))
        + real(bitcast<f32>(u.silut_c2));
    if (x < c) {
        return silu3(x);
    }
    let at_c = silu3(c);
    let sl = at_c.d1;
    let t = tanh_r(sl * (x - c));
    let d1 = sl * (real(1) - t * t);
    return Phi(t + at_c.v, d1, real(-2) * sl * t * d1);
}

// φ, φ' and φ'' from what the layer keeps of an output (its act: 0 linear, 1 tanh, 2 silu,
// 3 silut): tanh's are functions of h, the others' of z.
fn of_kept(s: real) -> Phi {
    switch u.act {
        case 1u: {
            let d1 = real(1) - s * s;
            return Phi(s, d1, -(s + s) * d1);
        }
        case 2u: {
            return silu3(s);
        }
        case 3u: {
            return silut3(s);
        }
        default: {
            return Phi(s, real(1), real(0));
        }
    }
}

fn has_idt() -> bool {
    return u.has_idt != 0u;
}

fn skip_kind() -> u32 {
    return u.skip;
}

fn dphi(kept: real) -> real {
    return of_kept(kept).d1;
}

fn row_scale(row: u32) -> real {
    return select(real(1), scale[row], u.has_scale != 0u);
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

// (xW)[r][n] for x = xin (forward, tangent), summed over k in order.
fn xw(r: u32, n: u32) -> real {
    let x0 = (u.row0 + r) * u.nin;
    var acc = real(0);
    for (var k = 0u; k < u.nin; k++) {
        acc += xin[x0 + k] * params[u.w + k * u.nout + n];
    }
    return acc;
}

// v·idt + skip(x) at column n of `row` (y from φ(z), or ẏ from φ'(z)⊙ż).
fn with_idt_skip(v: real, row: u32, n: u32) -> real {
    var y = v;
    if (has_idt()) {
        y = v * params[u.idt + n];
    }
    return y + skip_fwd(row * u.nin, n);
}

// Forward epilogue of output (r, n) from its xW: what the layer keeps, and y.
fn forward_out(xw_rn: real, r: u32, n: u32) {
    let row = u.row0 + r;
    let z = xw_rn + params[u.b + n];
    let kept = select(z, tanh_r(z), u.act == 1u);
    out0[row * u.nout + n] = kept;
    out1[row * u.nout + n] = with_idt_skip(of_kept(kept).v, row, n);
}

// Tangent epilogue of output (r, n) from its ż = ẋW: ż and ẏ = φ'(z)⊙ż·idt + skip(ẋ).
fn tangent_out(zdot_rn: real, r: u32, n: u32) {
    let row = u.row0 + r;
    let g = row * u.nout + n;
    out0[g] = zdot_rn;
    out1[g] = with_idt_skip(dphi(hin[g]) * zdot_rn, row, n);
}

@compute @workgroup_size(64)
fn forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.nrows * u.nout) {
        return;
    }
    forward_out(xw(i / u.nout, i % u.nout), i / u.nout, i % u.nout);
}

// `xin` holds ẋ.
@compute @workgroup_size(64)
fn tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.nrows * u.nout) {
        return;
    }
    tangent_out(xw(i / u.nout, i % u.nout), i / u.nout, i % u.nout);
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

// x̄ = (φ'(z)⊙(ȳ·idt))Wᵀ + skipᵀ(ȳ), z̄ formed on the fly.
@compute @workgroup_size(64)
fn backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.nrows * u.nin) {
        return;
    }
    let row = u.row0 + i / u.nin;
    let k = i % u.nin;
    var acc = real(0);
    for (var n = 0u; n < u.nout; n++) {
        let g = row * u.nout + n;
        var yb = ybar[g];
        if (has_idt()) {
            yb = yb * params[u.idt + n];
        }
        acc += (dphi(hin[g]) * yb) * params[u.w + k * u.nout + n];
    }
    out0[row * u.nin + k] = acc + skip_adj(row * u.nout, k);
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
    let phi = of_kept(hin[g]);
    let zd = zdot[g] * so;
    let d1 = phi.d1;
    var hb = ybar[g];
    var hdb = ydotbar[g];
    var tidt = real(0);
    if (has_idt()) {
        let t = params[u.idt + n];
        tidt = ybar[g] * phi.v + ydotbar[g] * d1 * zd;
        hb = ybar[g] * t;
        hdb = ydotbar[g] * t;
    }
    scratch[i] = d1 * hb + phi.d2 * zd * hdb;
    scratch[m + i] = d1 * hdb;
    scratch[2u * m + i] = tidt;
}

// Dual reverse, step 2: W̄ partials of one chunk of rows, xᵀz̄ + ẋᵀż̄ for one (input, output)
// pair per thread; rows are visited in order inside the chunk.
@compute @workgroup_size(64)
fn dual_wgrad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let j = flat_id(wg, nwg, l);
    if (j >= u.nchunks * u.nin * u.nout) {
        return;
    }
    let n = j % u.nout;
    let i = (j / u.nout) % u.nin;
    let c = j / (u.nout * u.nin);
    let m = u.nrows * u.nout;
    var acc = real(0);
    for (var r = c * u.chunk; r < min((c + 1u) * u.chunk, u.nrows); r++) {
        let row = u.row0 + r;
        let a = xin[row * u.nin + i];
        let cd = xdot[row * u.nin + i] * row_scale(row);
        acc += a * scratch[r * u.nout + n] + cd * scratch[m + r * u.nout + n];
    }
    partial[(c * (u.nin + 2u) + i) * u.nout + n] = acc;
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
@compute @workgroup_size(64)
fn dual_xbar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i >= u.nrows * u.nin) {
        return;
    }
    let r = i / u.nin;
    let k = i % u.nin;
    let m = u.nrows * u.nout;
    var acc = real(0);
    var accd = real(0);
    for (var n = 0u; n < u.nout; n++) {
        let w = params[u.w + k * u.nout + n];
        acc += scratch[r * u.nout + n] * w;
        accd += scratch[m + r * u.nout + n] * w;
    }
    let row = u.row0 + r;
    out0[row * u.nin + k] = acc + skip_adj(row * u.nout, k);
    out1[row * u.nin + k] = accd + skip_adj_dot(row * u.nout, k);
}

// The tape's ops (src/backend/cpu/tape.rs) on the device: a block written once as its forward
// (DPA-2's, se_e3_tebd's) runs here as the cpu runs it, each op of the recorded graph one or
// two of these kernels (src/backend/device_tape/walk.rs says which). Written once over `num`
// (shaders/num_real.wgsl, num_dual.wgsl): on reals they are the forward and the backward, on
// duals the tangent and the dual reverse, as the cpu's tape runs on `Num`.
//
// A tensor is a buffer of [rows][cols] numbers, NS reals each. Every kernel that writes y adds
// to it instead where u.acc is 1 (an adjoint reached before). One thread per entry written, so
// every sum runs in a fixed order.

// TapeParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: TapeParams;
// The tape's real constants (scales, the element functions' parameters), read at u.ci.
@group(0) @binding(1) var<storage, read> cst: array<real>;
// The model's parameters (reals).
@group(0) @binding(2) var<storage, read> params: array<real>;
@group(0) @binding(3) var<storage, read> a: array<real>;
@group(0) @binding(4) var<storage, read> b: array<real>;
// Indices, read from u.ix: a gather's (NONE reads 0), a scatter's CSR, a softmax's mask.
@group(0) @binding(5) var<storage, read> idx: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<real>;
// The map's slope; the parameters' gradient.
@group(0) @binding(7) var<storage, read_write> y2: array<real>;

const NONE: u32 = 0xffffffffu;

// A long sum (the three-body block's run over 10⁵-10⁶ rows) is split into u.nparts parts of
// u.chunk terms, one thread each, whose sums tape_sum_parts adds in order: one thread on all
// the terms would leave the device idle, and lavapipe (llvmpipe) stops a thread after 65535
// loop iterations.

// The terms [start, end) of part c of a sum over n.
fn stretch(c: u32, n: u32) -> vec2<u32> {
    return vec2<u32>(min(n, c * u.chunk), min(n, (c + 1u) * u.chunk));
}

// Part c of entry t: the entry itself where the sum is one part, else its place in the parts.
fn part_out(c: u32, t: u32, s: num) {
    if (u.nparts == 1u) {
        put(t, s);
    } else {
        sy(c * u.nout + t, s);
    }
}

// Entry t < nout of a sum: its parts (`a`, [nparts][nout]) in order.
fn parts_sum(t: u32) -> num {
    var s = nc(real(0));
    for (var c = 0u; c < u.nparts; c++) {
        s = nadd(s, la(c * u.nout + t));
    }
    return s;
}

// y[t] (+)= the sum of entry t's parts.
@compute @workgroup_size(64)
fn tape_sum_parts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let t = flat_id(wg, nwg, l);
    if (t >= u.nout) {
        return;
    }
    put(t, parts_sum(t));
}

fn la(i: u32) -> num {
    return npair(a[NS * i], a[NS * i + NS - 1u]);
}

fn lb(i: u32) -> num {
    return npair(b[NS * i], b[NS * i + NS - 1u]);
}

fn ly(i: u32) -> num {
    return npair(y[NS * i], y[NS * i + NS - 1u]);
}

fn sy(i: u32, x: num) {
    y[NS * i] = nv(x);
    if (NS == 2u) {
        y[NS * i + 1u] = nd(x);
    }
}

fn sy2(i: u32, x: num) {
    y2[NS * i] = nv(x);
    if (NS == 2u) {
        y2[NS * i + 1u] = nd(x);
    }
}

// Writes x, or adds it where the op accumulates.
fn put(i: u32, x: num) {
    if (u.acc != 0u) {
        sy(i, nadd(ly(i), x));
    } else {
        sy(i, x);
    }
}

// What a parameter's adjoint adds to its gradient: the value on reals; on duals the ε part,
// the dual reverse's cotangent being Ḋ̄ + εD̄ (src/backend/cpu/tape_block.rs).
fn grad_part(x: num) -> real {
    if (NS == 2u) {
        return nd(x);
    }
    return nv(x);
}

// y = x·W (+ b): x `a` [rows][cols], W at params[u.w] [cols][nn], b at params[u.b] if u.has_b.
@compute @workgroup_size(64)
fn tape_linear(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.nn) {
        return;
    }
    let r = e / u.nn;
    let o = e % u.nn;
    var s = nc(real(0));
    if (u.has_b != 0u) {
        s = nc(params[u.b + o]);
    }
    for (var i = 0u; i < u.cols; i++) {
        s = nadd(s, nscale(la(r * u.cols + i), params[u.w + i * u.nn + o]));
    }
    put(e, s);
}

// x̄ = ȳ·Wᵀ: ȳ `a` [rows][nn], x̄ `y` [rows][cols].
@compute @workgroup_size(64)
fn tape_linear_x(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    let r = e / u.cols;
    let i = e % u.cols;
    var s = nc(real(0));
    for (var o = 0u; o < u.nn; o++) {
        s = nadd(s, nscale(la(r * u.nn + o), params[u.w + i * u.nn + o]));
    }
    put(e, s);
}

// W̄ += xᵀ·ȳ and b̄ += Σ_rows ȳ into the gradient `y2`, entry t = (i, o) of nout = (cols +
// has_b)·nn, row i = cols the bias's.
fn add_grad(t: u32, s: num) {
    let i = t / u.nn;
    if (i < u.cols) {
        y2[u.w + t] += grad_part(s);
    } else {
        y2[u.b + t % u.nn] += grad_part(s);
    }
}

// Part c of entry t of W̄ and b̄ (see add_grad) over rows, x `a` [rows][cols], ȳ `b`
// [rows][nn]: into the gradient where it is the only part, else into the parts `y`.
@compute @workgroup_size(64)
fn tape_linear_w(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    let c = e / u.nout;
    let t = e % u.nout;
    if (c >= u.nparts) {
        return;
    }
    let i = t / u.nn;
    let o = t % u.nn;
    let rs = stretch(c, u.rows);
    var s = nc(real(0));
    for (var r = rs.x; r < rs.y; r++) {
        if (i < u.cols) {
            s = nadd(s, nmul(la(r * u.cols + i), lb(r * u.nn + o)));
        } else {
            s = nadd(s, lb(r * u.nn + o));
        }
    }
    if (u.nparts == 1u) {
        add_grad(t, s);
    } else {
        sy(e, s);
    }
}

// The gradient's W̄ and b̄ from tape_linear_w's parts `a`.
@compute @workgroup_size(64)
fn tape_linear_w_parts(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_id) l: vec3<u32>) {
    let t = flat_id(wg, nwg, l);
    if (t >= u.nout) {
        return;
    }
    add_grad(t, parts_sum(t));
}

// C = op(A)·op(B) per batch: A `a` [batch][m][k] ([k][m] if u.ta), B `b` [batch][k][nn]
// ([nn][k] if u.tb), C `y` [batch][m][nn].
@compute @workgroup_size(64)
fn tape_bmm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    let mn = u.m * u.nn;
    if (e >= u.rows * mn) {
        return;
    }
    let bi = e / mn;
    let p = (e % mn) / u.nn;
    let q = e % u.nn;
    let a0 = bi * u.m * u.k;
    let b0 = bi * u.k * u.nn;
    var s = nc(real(0));
    for (var t = 0u; t < u.k; t++) {
        var ai = a0 + p * u.k + t;
        if (u.ta != 0u) {
            ai = a0 + t * u.m + p;
        }
        var bj = b0 + t * u.nn + q;
        if (u.tb != 0u) {
            bj = b0 + q * u.k + t;
        }
        s = nadd(s, nmul(la(ai), lb(bj)));
    }
    put(e, s);
}

// silu and its two derivatives at x.
fn silu3(x: real) -> vec3<real> {
    let sg = sigmoid_r(x);
    return vec3<real>(x * sg, sg * (real(1) + x * (real(1) - sg)),
                      sg * (real(1) - sg) * (real(2) + x * (real(1) - sg - sg)));
}

// The element function u.op (Elem in tape.rs) and its two derivatives at x, its constants
// from cst[u.ci].
fn elem3(x: real) -> vec3<real> {
    let one = real(1);
    let two = real(2);
    switch u.op {
        case 0u: {
            let s = sqrt_r(x);
            return vec3<real>(s, one / (two * s), -one / (two * two * x * s));
        }
        case 1u: {
            let rs = cst[u.ci];
            let rc = cst[u.ci + 1u];
            if (x < rs) {
                return vec3<real>(one, real(0), real(0));
            }
            if (x >= rc) {
                return vec3<real>(real(0), real(0), real(0));
            }
            let w = rc - rs;
            let v = (x - rs) / w;
            let v2 = v * v;
            return vec3<real>(v2 * v * (real(-6) * v2 + real(15) * v - real(10)) + one,
                              v2 * (real(-30) * v2 + real(60) * v - real(30)) / w,
                              v * (real(-120) * v2 + real(180) * v - real(60)) / (w * w));
        }
        case 2u: {
            let i = one / (x + cst[u.ci]);
            return vec3<real>(i, -i * i, two * i * i * i);
        }
        case 3u: {
            let ve = x + cst[u.ci];
            let i = one / sqrt_r(ve);
            return vec3<real>(i, -i / (two * ve), real(3) * i / (two * two * ve * ve));
        }
        case 4u: {
            let t = tanh_r(x);
            return vec3<real>(t, one - t * t, -two * t * (one - t * t));
        }
        case 5u: {
            return silu3(x);
        }
        case 6u: {
            // silut: silu below the threshold c, tanh(s(x − c)) + silu(c) from it on, with
            // c, s and silu(c) = cst[ci..ci + 3] (computed in f64 as DeePMD-kit does).
            let c = cst[u.ci];
            if (x < c) {
                return silu3(x);
            }
            let sl = cst[u.ci + 1u];
            let t = tanh_r(sl * (x - c));
            return vec3<real>(t + cst[u.ci + 2u], sl * (one - t * t),
                              -two * sl * sl * t * (one - t * t));
        }
        case 8u: {
            // The exponential switch exp(−e^{k(x − rs)}), k = 20/rs (Elem::ExpSwitch): flat
            // outside (0, rc), as the cpu's switch3.
            let rs = cst[u.ci];
            let rc = cst[u.ci + 1u];
            let k = real(20) / rs;
            let xc = clamp(x, real(0), rc);
            let ea = exp_r(k * (xc - rs));
            let s = exp_nonpos_r(-ea);
            if (x <= real(0) || x >= rc) {
                return vec3<real>(s, real(0), real(0));
            }
            return vec3<real>(s, -k * ea * s, -k * k * ea * s * (one - ea));
        }
        default: {
            return vec3<real>(x, one, real(0));
        }
    }
}

// e^x of either sign from the preludes' e^x for x ≤ 0 (the f64 prelude has no other).
fn exp_r(x: real) -> real {
    if (x > real(0)) {
        return real(1) / exp_nonpos_r(-x);
    }
    return exp_nonpos_r(x);
}

// y = f(x) and its slope `y2` = f'(x), as numbers: on duals f(x) + εf'(x)ẋ and f'(x) + εf''(x)ẋ.
@compute @workgroup_size(64)
fn tape_map(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    let x = la(e);
    let f = elem3(nv(x));
    sy(e, npair(f.x, f.y * nd(x)));
    sy2(e, npair(f.y, f.z * nd(x)));
}

// Where b [br][bc], broadcast onto [rows][cols], is read for entry e.
fn bcast(e: u32) -> u32 {
    var i = e / u.cols;
    var j = e % u.cols;
    if (u.br == 1u) {
        i = 0u;
    }
    if (u.bc == 1u) {
        j = 0u;
    }
    return i * u.bc + j;
}

// y = s·(a ∘ b) with b broadcast, s = cst[u.ci]: ∘ by u.op, 0 a + b, 1 a − b, 2 a·b, 3 a alone,
// 4 b alone.
@compute @workgroup_size(64)
fn tape_zip(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    var v: num;
    switch u.op {
        case 0u: {
            v = nadd(la(e), lb(bcast(e)));
        }
        case 1u: {
            v = nsub(la(e), lb(bcast(e)));
        }
        case 2u: {
            v = nmul(la(e), lb(bcast(e)));
        }
        case 3u: {
            v = la(e);
        }
        default: {
            v = lb(bcast(e));
        }
    }
    put(e, nscale(v, cst[u.ci]));
}

// The sum onto b's shape [br][bc] of s·g over [rows][cols], g = a (u.op 0) or a ∘ b2 with b2
// `b` of the full shape (u.op 2): the adjoint of a broadcast operand. Part c of entry t over
// rows where br is 1 (see part_out).
@compute @workgroup_size(64)
fn tape_reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    let c = e / u.nout;
    let t = e % u.nout;
    if (c >= u.nparts) {
        return;
    }
    let ti = t / u.bc;
    let tj = t % u.bc;
    var ir = vec2<u32>(ti, ti + 1u);
    if (u.br == 1u) {
        ir = stretch(c, u.rows);
    }
    var j0 = tj;
    var j1 = tj + 1u;
    if (u.bc == 1u) {
        j0 = 0u;
        j1 = u.cols;
    }
    var s = nc(real(0));
    for (var i = ir.x; i < ir.y; i++) {
        for (var j = j0; j < j1; j++) {
            let f = i * u.cols + j;
            if (u.op == 2u) {
                s = nadd(s, nmul(la(f), lb(f)));
            } else {
                s = nadd(s, la(f));
            }
        }
    }
    part_out(c, t, nscale(s, cst[u.ci]));
}

// y[e] = a's entry e % k of unit idx[ix + e / k] (0 for NONE): units of u.k entries, single
// entries (k = 1) or rows.
@compute @workgroup_size(64)
fn tape_gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    let i = idx[u.ix + e / u.k];
    var v = nc(real(0));
    if (i != NONE) {
        v = la(i * u.k + e % u.k);
    }
    put(e, v);
}

// A gather's adjoint: x̄'s entry t = Σ ȳ over the units that read t's unit (t / k), from the
// CSR at u.ix (starts [nout / k + 1], then the units, in order); `a` is ȳ. Part c of entry t.
@compute @workgroup_size(64)
fn tape_scatter(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    let c = e / u.nout;
    let t = e % u.nout;
    if (c >= u.nparts) {
        return;
    }
    let s0 = t / u.k;
    let col = t % u.k;
    let p0 = idx[u.ix + s0];
    let ps = stretch(c, idx[u.ix + s0 + 1u] - p0);
    let list = u.ix + u.nout / u.k + 1u;
    var s = nc(real(0));
    for (var p = p0 + ps.x; p < p0 + ps.y; p++) {
        s = nadd(s, la(idx[list + p] * u.k + col));
    }
    part_out(c, t, s);
}

// y [rows][cols] = sums of u.k consecutive rows of a [rows·k][cols]: part c of entry t.
@compute @workgroup_size(64)
fn tape_sum_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    let c = e / u.nout;
    let t = e % u.nout;
    if (c >= u.nparts) {
        return;
    }
    let g = t / u.cols;
    let col = t % u.cols;
    let rs = stretch(c, u.k);
    var s = nc(real(0));
    for (var r = rs.x; r < rs.y; r++) {
        s = nadd(s, la((g * u.k + r) * u.cols + col));
    }
    part_out(c, t, s);
}

// y [rows][cols] = a's row r / k at each row r: the adjoint of sum_rows.
@compute @workgroup_size(64)
fn tape_spread_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    put(e, la((e / u.cols) / u.k * u.cols + e % u.cols));
}

// Softmax over each row of a [rows][cols], entries whose mask (idx from u.ix, where u.has_b)
// is 0 left out as 0; a row with none kept is 0. One thread per row.
@compute @workgroup_size(64)
fn tape_softmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let r = flat_id(wg, nwg, l);
    if (r >= u.rows) {
        return;
    }
    let e0 = r * u.cols;
    var kept = false;
    var mx = real(0);
    for (var j = 0u; j < u.cols; j++) {
        if (u.has_b == 0u || idx[u.ix + e0 + j] != 0u) {
            let v = nv(la(e0 + j));
            if (!kept || v > mx) {
                mx = v;
            }
            kept = true;
        }
    }
    var s = nc(real(0));
    for (var j = 0u; j < u.cols; j++) {
        var v = nc(real(0));
        if (u.has_b == 0u || idx[u.ix + e0 + j] != 0u) {
            v = nexp_nonpos(nsub(la(e0 + j), nc(mx)));
        }
        sy(e0 + j, v);
        s = nadd(s, v);
    }
    if (!kept) {
        return;
    }
    for (var j = 0u; j < u.cols; j++) {
        sy(e0 + j, ndiv(ly(e0 + j), s));
    }
}

// The softmax's adjoint: x̄ = y ∘ (ȳ − Σ_row y ȳ), y `a`, ȳ `b`. One thread per row.
@compute @workgroup_size(64)
fn tape_softmax_back(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_id) l: vec3<u32>) {
    let r = flat_id(wg, nwg, l);
    if (r >= u.rows) {
        return;
    }
    let e0 = r * u.cols;
    var dot = nc(real(0));
    for (var j = 0u; j < u.cols; j++) {
        dot = nadd(dot, nmul(la(e0 + j), lb(e0 + j)));
    }
    for (var j = 0u; j < u.cols; j++) {
        put(e0 + j, nmul(la(e0 + j), nsub(lb(e0 + j), dot)));
    }
}

// Columns: y[i][u.k + j] = a[i][u.m + j] for j < u.nn of rows i, a's rows u.cols wide and y's
// u.br: a piece of a concat, or its adjoint.
@compute @workgroup_size(64)
fn tape_copy_cols(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.nn) {
        return;
    }
    let i = e / u.nn;
    let j = e % u.nn;
    put(i * u.br + u.k + j, la(i * u.cols + u.m + j));
}

// y = params[u.w..][..rows·cols] as numbers.
@compute @workgroup_size(64)
fn tape_param(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    sy(e, nc(params[u.w + e]));
}

// The gradient `y2`[u.w..] += a parameter tensor's adjoint `a`.
@compute @workgroup_size(64)
fn tape_param_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    y2[u.w + e] += grad_part(la(e));
}

// y = a + ε b from two buffers of reals (b read where u.has_b, else 0): an input, or a seed.
@compute @workgroup_size(64)
fn tape_pair(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    var d = real(0);
    if (u.has_b != 0u) {
        d = b[e];
    }
    put(e, npair(a[e], d));
}

// Reals out of numbers: y[e] = the value of a[e] (u.op 0) or its ε part (u.op 1).
@compute @workgroup_size(64)
fn tape_part(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.rows * u.cols) {
        return;
    }
    let x = la(e);
    if (u.op == 0u) {
        y[e] = nv(x);
    } else {
        y[e] = nd(x);
    }
}

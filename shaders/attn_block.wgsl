// DPA-1's attention block per centre (docs/design.md §11.1 steps 5–6): from the embedding G⁰ of
// the centre's slots through the attention layers to the contraction and D = A A<ᵀ. Written
// once over `num` (shaders/num_real.wgsl, num_dual.wgsl), as the cpu's block is over `Num`
// (src/backend/cpu/attn.rs, whose steps these follow one for one): on reals the forward is the
// forward, on duals seeded with the tangent Ṙ it is the tangent pass.
//
// One workgroup per centre of a launch; each step spreads its entries over the workgroup's
// threads and ends at a barrier. A centre keeps everything in its stretch of `ws`, laid out for
// nnei slots. Like the cpu's, the block runs on n slots: up to the last neighbour and one copy
// of the padding after it, which stands for the rest (their values are equal; see `Centre` in
// cpu/attn.rs), each sum over slots counting that copy once per slot it stands for.

// AttnBlockParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: AttnBlockParams;
// The attention layers' parameters, packed layer after layer: W_in [M1][3H], b_in [3H],
// W_out [H][M1], b_out [M1], γ [M1], β [M1].
@group(0) @binding(1) var<storage, read> lp: array<real>;
// [α, ln_eps, 1/nnei, 1/M1]
@group(0) @binding(3) var<storage, read> cst: array<real>;
@group(0) @binding(4) var<storage, read_write> ws: array<real>;
// D (or Ḋ) [ncentres][stride], the first M1·M2 columns of each row.
@group(0) @binding(5) var<storage, read_write> out: array<real>;
// attn_block_load's inputs, per slot of the batch: G⁰ and G⁰' = ∂G⁰/∂ŝ [M1], R̂ and its tangent
// Ṙ [4] (the forward binds R̂ for Ṙ and reads none of it), σ and dσ/dŝ, the owner.
@group(0) @binding(6) var<storage, read> g0: array<real>;
@group(0) @binding(7) var<storage, read> g0p: array<real>;
@group(0) @binding(8) var<storage, read> rhat: array<real>;
@group(0) @binding(9) var<storage, read> rdot: array<real>;
@group(0) @binding(10) var<storage, read> sw: array<real>;
@group(0) @binding(11) var<storage, read> dsw: array<real>;
@group(0) @binding(12) var<storage, read> owner: array<i32>;
// The backward's seed [ncentres][stride] as a number's value and ε part: D̄ (the backward binds
// it for both), or the dual reverse's Ḋ̄ + εD̄.
@group(0) @binding(13) var<storage, read> seed: array<real>;
@group(0) @binding(14) var<storage, read> seed_eps: array<real>;
// Where each entry of a centre's packed parameter gradient goes in the model's (−1: nowhere,
// a frozen layer norm), and the model's gradient.
@group(0) @binding(16) var<storage, read> grad_at: array<i32>;
@group(0) @binding(17) var<storage, read_write> grad: array<real>;
// attn_block_q: the environment's Jacobian [slot][4][3] and the forces' q [slot][3];
// attn_block_g0bar: Ḡ⁰ and Ġ̄⁰ [slot][M1].
@group(0) @binding(18) var<storage, read> jac: array<real>;
@group(0) @binding(19) var<storage, read_write> q: array<real>;
@group(0) @binding(20) var<storage, read_write> g0bar: array<real>;
@group(0) @binding(21) var<storage, read_write> g0dotbar: array<real>;
// A tensor fitting's model: the forward's A [ncentres][4][M1] (rows 1..3 the rotation matrix),
// and the fitting's Ā [ncentres][4][M1] that the dual reverse adds to the contraction's.
@group(0) @binding(22) var<storage, read_write> rot: array<real>;
@group(0) @binding(23) var<storage, read> abar: array<real>;

// DeePMD-kit's attnw_shift, and the floor of torch's normalize.
const SHIFT = 20.0;
const NORM_FLOOR = 1e-12;

fn ws_ld(i: u32) -> num {
    return npair(ws[NS * i], ws[NS * i + NS - 1u]);
}

fn ws_st(i: u32, x: num) {
    ws[NS * i] = nv(x);
    if (NS == 2u) {
        ws[NS * i + 1u] = nd(x);
    }
}

// The launch's slots as numbers, into each centre's table (at o_slots, [slot][slot_w]): G⁰ +
// ε G⁰'ṡ [M1], R̂ + ε Ṙ [4], σ + ε σ'ṡ (ṡ = Ṙ[0]), and 1 for a neighbour (0 for padding); one
// thread per entry.
@compute @workgroup_size(64)
fn attn_block_load(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    let w = u.slot_w;
    if (id >= u.ncentres * u.nnei * w) {
        return;
    }
    let s = u.centre0 * u.nnei + id / w;
    let c = id % w;
    let cl = id / (u.nnei * w);
    let m = u.m1;
    let sdot = rdot[4u * s];
    var x: num;
    if (c < m) {
        x = npair(g0[s * m + c], g0p[s * m + c] * sdot);
    } else if (c < m + 4u) {
        x = npair(rhat[4u * s + c - m], rdot[4u * s + c - m]);
    } else if (c == m + 4u) {
        x = npair(sw[s], dsw[s] * sdot);
    } else {
        x = nc(select(real(0), real(1), owner[s] >= 0));
    }
    ws_st(cl * u.per_centre + u.o_slots + id % (u.nnei * w), x);
}

// Centre cl's slot j, entry c (see `slots`).
fn sv(cl: u32, j: u32, c: u32) -> num {
    return ws_ld(cl * u.per_centre + u.o_slots + j * u.slot_w + c);
}

fn is_real(cl: u32, j: u32) -> bool {
    return nv(sv(cl, j, u.m1 + 5u)) != real(0);
}

// The slots the block runs on: one past the last neighbour when the padding after it is
// copies of one slot, else all.
fn slots_taken(cl: u32) -> u32 {
    let nnei = u.nnei;
    var first_pad = 0u;
    for (var j = 0u; j < nnei; j++) {
        if (is_real(cl, j)) {
            first_pad = j + 1u;
        }
    }
    if (first_pad >= nnei) {
        return nnei;
    }
    for (var j = first_pad + 1u; j < nnei; j++) {
        for (var c = 0u; c < u.slot_w; c++) {
            let a = sv(cl, j, c);
            let b = sv(cl, first_pad, c);
            if (nv(a) != nv(b) || nd(a) != nd(b)) {
                return nnei;
            }
        }
    }
    return first_pad + 1u;
}

// How many of the nnei slots slot j of the n taken stands for.
fn copies(j: u32, n: u32) -> u32 {
    return select(1u, 1u + u.nnei - n, j + 1u == n);
}

// Where each of a centre's arrays starts in ws (offsets: AttnBlockParams).
fn at_rdir(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_rdir + 3u * j;
}
fn at_dotr(cl: u32, j: u32, k: u32) -> u32 {
    return cl * u.per_centre + u.o_dotr + j * u.nnei + k;
}
fn at_g(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_g + (l * u.nnei + j) * u.m1;
}
fn at_qkv(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_qkv + (l * u.nnei + j) * 3u * u.h;
}
fn at_nrm(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_nrm + (l * u.nnei + j) * 3u;
}
// The n × n arrays of layer l: the scaled logits, the softmax P and the weights A.
fn at_logit(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_logit + (l * u.nnei + j) * u.nnei;
}
fn at_p(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_p + (l * u.nnei + j) * u.nnei;
}
fn at_w(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_w + (l * u.nnei + j) * u.nnei;
}
fn at_o(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_o + (l * u.nnei + j) * u.h;
}
fn at_z(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_z + j * u.m1;
}
fn at_xhat(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_xhat + (l * u.nnei + j) * u.m1;
}
fn at_sinv(cl: u32, l: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_sinv + l * u.nnei + j;
}
fn at_a(cl: u32, k: u32) -> u32 {
    return cl * u.per_centre + u.o_a + k * u.m1;
}
fn at_desc(cl: u32) -> u32 {
    return cl * u.per_centre + u.o_desc;
}
fn at_dbar(cl: u32) -> u32 {
    return cl * u.per_centre + u.o_dbar;
}
fn at_abar(cl: u32, k: u32) -> u32 {
    return cl * u.per_centre + u.o_abar + k * u.m1;
}
fn at_abar_in(cl: u32) -> u32 {
    return cl * u.per_centre + u.o_abar_in;
}
fn at_gbar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_gbar + j * u.m1;
}
fn at_rbar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_rbar + 4u * j;
}
fn at_rdbar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_rdbar + 3u * j;
}
fn at_swbar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_swbar + j;
}
fn at_obar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_obar + j * u.h;
}
fn at_qkvbar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_qkvbar + j * 3u * u.h;
}
fn at_nn(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_nn + j * u.nnei;
}
fn at_cbar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_cbar + j * u.nnei;
}
fn at_ebar(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_ebar + j * u.nnei;
}
fn at_grad(cl: u32) -> u32 {
    return cl * u.per_centre + u.o_grad;
}
// What the backward gives back per slot (all nnei): Ḡ [M1], R̄ [4], σ̄.
fn at_adj(cl: u32, j: u32) -> u32 {
    return cl * u.per_centre + u.o_adj + j * (u.m1 + 5u);
}

// Layer l's tensors in lp.
fn lp_w_in(l: u32) -> u32 {
    return l * u.layer_len;
}
fn lp_b_in(l: u32) -> u32 {
    return lp_w_in(l) + 3u * u.h * u.m1;
}
fn lp_w_out(l: u32) -> u32 {
    return lp_b_in(l) + 3u * u.h;
}
fn lp_b_out(l: u32) -> u32 {
    return lp_w_out(l) + u.h * u.m1;
}
fn lp_gamma(l: u32) -> u32 {
    return lp_b_out(l) + u.m1;
}
fn lp_beta(l: u32) -> u32 {
    return lp_gamma(l) + u.m1;
}

// x / max(|x|, floor) in place over the k numbers at ws[at..]; returns the divisor.
fn normalize_at(at: u32, k: u32) -> num {
    var sq = nc(real(0));
    for (var e = 0u; e < k; e++) {
        let v = ws_ld(at + e);
        sq = nadd(sq, nmul(v, v));
    }
    var nr = nsqrt(sq);
    if (nv(nr) < real(NORM_FLOOR)) {
        nr = nc(real(NORM_FLOOR));
    }
    for (var e = 0u; e < k; e++) {
        ws_st(at + e, ndiv(ws_ld(at + e), nr));
    }
    return nr;
}

// Whether row j attends at all, and whether slot k enters a row's softmax (not smooth: only
// neighbours).
fn on(cl: u32, j: u32) -> bool {
    return u.is_smooth != 0u || is_real(cl, j);
}

// Row j of layer l's softmax P and weights A from its logits q̂_j·k̂_k (scaled by α in place).
fn softmax_row(cl: u32, l: u32, j: u32, n: u32) {
    let lg = at_logit(cl, l, j);
    let pr = at_p(cl, l, j);
    let wr = at_w(cl, l, j);
    if (!on(cl, j)) {
        for (var k = 0u; k < n; k++) {
            ws_st(pr + k, nc(real(0)));
            ws_st(wr + k, nc(real(0)));
        }
        return;
    }
    let m = u.m1;
    let is_smooth = u.is_smooth != 0u;
    let sj = sv(cl, j, m + 4u);
    let shift = nc(real(SHIFT));
    var mx = real(0);
    var seen = false;
    for (var k = 0u; k < n; k++) {
        if (!on(cl, k)) {
            continue;
        }
        let lv = nscale(ws_ld(lg + k), cst[0]);
        ws_st(lg + k, lv);
        var pv = lv;
        if (is_smooth) {
            pv = nsub(nmul(nmul(nadd(lv, shift), sj), sv(cl, k, m + 4u)), shift);
        }
        ws_st(pr + k, pv);
        if (!seen || nv(pv) > mx) {
            mx = nv(pv);
            seen = true;
        }
    }
    var sum = nc(real(0));
    for (var k = 0u; k < n; k++) {
        var e = nc(real(0));
        if (on(cl, k)) {
            e = nexp_nonpos(nsub(ws_ld(pr + k), nc(mx)));
        }
        ws_st(pr + k, e);
        sum = nadd(sum, e);
    }
    // The copies of the last slot left out.
    if (is_smooth) {
        for (var r = n; r < u.nnei; r++) {
            sum = nadd(sum, ws_ld(pr + n - 1u));
        }
    }
    let inv = ndiv(nc(real(1)), sum);
    for (var k = 0u; k < n; k++) {
        let pv = nmul(ws_ld(pr + k), inv);
        ws_st(pr + k, pv);
        var mv = pv;
        if (is_smooth) {
            mv = nmul(nmul(pv, sj), sv(cl, k, m + 4u));
        }
        if (u.use_dotr != 0u) {
            mv = nmul(mv, ws_ld(at_dotr(cl, j, k)));
        }
        ws_st(wr + k, mv);
    }
}

// Row i of layer l's layer norm over G + z: x̂ and 1/s kept, the next layer's G written.
fn layer_norm_row(cl: u32, l: u32, i: u32) {
    let m = u.m1;
    let gi = at_g(cl, l, i);
    let go = at_g(cl, l + 1u, i);
    let zi = at_z(cl, i);
    let xh = at_xhat(cl, l, i);
    var mu = nc(real(0));
    for (var c = 0u; c < m; c++) {
        let x = nadd(ws_ld(gi + c), ws_ld(zi + c));
        ws_st(xh + c, x);
        mu = nadd(mu, x);
    }
    mu = nscale(mu, cst[3]);
    var var_ = nc(real(0));
    for (var c = 0u; c < m; c++) {
        let x = nsub(ws_ld(xh + c), mu);
        ws_st(xh + c, x);
        var_ = nadd(var_, nmul(x, x));
    }
    let s = nsqrt(nadd(nscale(var_, cst[3]), nc(cst[1])));
    let sinv = ndiv(nc(real(1)), s);
    ws_st(at_sinv(cl, l, i), sinv);
    for (var c = 0u; c < m; c++) {
        let x = nmul(ws_ld(xh + c), sinv);
        ws_st(xh + c, x);
        ws_st(go + c, nadd(nscale(x, lp[lp_gamma(l) + c]), nc(lp[lp_beta(l) + c])));
    }
}

// Centre cl's forward on its n slots, thread t of the workgroup: leaves D [M1][M2] and what it
// passed through in ws.
fn forward(cl: u32, t: u32, n: u32) {
    let m = u.m1;
    let h = u.h;
    let h3 = 3u * h;
    for (var j = t; j < n; j += WG) {
        let rd = at_rdir(cl, j);
        for (var k = 0u; k < 3u; k++) {
            ws_st(rd + k, sv(cl, j, m + 1u + k));
        }
        normalize_at(rd, 3u);
    }
    storageBarrier();
    if (u.use_dotr != 0u) {
        for (var e = t; e < n * n; e += WG) {
            let j = e / n;
            let k = e % n;
            var c = nc(real(0));
            for (var x = 0u; x < 3u; x++) {
                c = nadd(c, nmul(ws_ld(at_rdir(cl, j) + x), ws_ld(at_rdir(cl, k) + x)));
            }
            ws_st(at_dotr(cl, j, k), c);
        }
    }
    for (var e = t; e < n * m; e += WG) {
        ws_st(at_g(cl, 0u, e / m) + e % m, sv(cl, e / m, e % m));
    }
    storageBarrier();
    for (var l = 0u; l < u.nlayers; l++) {
        // [q k v] = G W_in + b_in.
        for (var e = t; e < n * h3; e += WG) {
            let j = e / h3;
            let o = e % h3;
            let g = at_g(cl, l, j);
            var acc = nc(lp[lp_b_in(l) + o]);
            for (var c = 0u; c < m; c++) {
                acc = nadd(acc, nscale(ws_ld(g + c), lp[lp_w_in(l) + c * h3 + o]));
            }
            ws_st(at_qkv(cl, l, j) + o, acc);
        }
        storageBarrier();
        if (u.use_norm != 0u) {
            for (var e = t; e < n * 3u; e += WG) {
                let nr = normalize_at(at_qkv(cl, l, e / 3u) + (e % 3u) * h, h);
                ws_st(at_nrm(cl, l, e / 3u) + e % 3u, nr);
            }
            storageBarrier();
        }
        // q̂_j·k̂_k.
        for (var e = t; e < n * n; e += WG) {
            let q = at_qkv(cl, l, e / n);
            let k = at_qkv(cl, l, e % n) + h;
            var acc = nc(real(0));
            for (var x = 0u; x < h; x++) {
                acc = nadd(acc, nmul(ws_ld(q + x), ws_ld(k + x)));
            }
            ws_st(at_logit(cl, l, e / n) + e % n, acc);
        }
        storageBarrier();
        for (var j = t; j < n; j += WG) {
            softmax_row(cl, l, j, n);
        }
        storageBarrier();
        // O = A v̂.
        for (var e = t; e < n * h; e += WG) {
            let j = e / h;
            let x = e % h;
            let w = at_w(cl, l, j);
            var acc = nc(real(0));
            for (var k = 0u; k < n; k++) {
                acc = nadd(acc, nmul(ws_ld(w + k), ws_ld(at_qkv(cl, l, k) + 2u * h + x)));
            }
            ws_st(at_o(cl, l, j) + x, acc);
        }
        storageBarrier();
        // z = O W_out + b_out.
        for (var e = t; e < n * m; e += WG) {
            let j = e / m;
            let c = e % m;
            let o = at_o(cl, l, j);
            var acc = nc(lp[lp_b_out(l) + c]);
            for (var x = 0u; x < h; x++) {
                acc = nadd(acc, nscale(ws_ld(o + x), lp[lp_w_out(l) + x * m + c]));
            }
            ws_st(at_z(cl, j) + c, acc);
        }
        storageBarrier();
        for (var j = t; j < n; j += WG) {
            layer_norm_row(cl, l, j);
        }
        storageBarrier();
    }
    // A[k][c] = (1/nnei) Σ_j G[j][c] R̂[j][k]; D[c][b] = Σ_k A[k][c] A[k][b], b < M2.
    let inv_nnei = cst[2];
    for (var e = t; e < 4u * m; e += WG) {
        let k = e / m;
        let c = e % m;
        var acc = nc(real(0));
        for (var j = 0u; j < n; j++) {
            let x = nmul(ws_ld(at_g(cl, u.nlayers, j) + c), nscale(sv(cl, j, m + k), inv_nnei));
            for (var r = 0u; r < copies(j, n); r++) {
                acc = nadd(acc, x);
            }
        }
        ws_st(at_a(cl, k) + c, acc);
    }
    storageBarrier();
    for (var e = t; e < m * u.m2; e += WG) {
        let c = e / u.m2;
        let b = e % u.m2;
        var acc = nc(real(0));
        for (var k = 0u; k < 4u; k++) {
            acc = nadd(acc, nmul(ws_ld(at_a(cl, k) + c), ws_ld(at_a(cl, k) + b)));
        }
        ws_st(at_desc(cl) + e, acc);
    }
    storageBarrier();
}

var<workgroup> taken: u32;

// Centre cl's forward on the slots it takes (slots_taken, found by thread 0); returns n.
fn forward_taken(cl: u32, t: u32) -> u32 {
    if (t == 0u) {
        taken = slots_taken(cl);
    }
    let n = workgroupUniformLoad(&taken);
    forward(cl, t, n);
    return n;
}

// D per centre of the launch (on duals: Ḋ, the ε parts).
@compute @workgroup_size(64)
fn attn_block_forward(@builtin(workgroup_id) wg: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_id) l: vec3<u32>) {
    let cl = wg.x + wg.y * nwg.x;
    if (cl >= u.ncentres) {
        return;
    }
    _ = forward_taken(cl, l.x);
    let row = (u.centre0 + cl) * u.stride;
    for (var e = l.x; e < u.m1 * u.m2; e += WG) {
        let x = ws_ld(at_desc(cl) + e);
        out[row + e] = select(nv(x), nd(x), NS == 2u);
    }
}

// A of each centre of the launch, after attn_block_forward.
@compute @workgroup_size(64)
fn attn_block_rot(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    let am = 4u * u.m1;
    if (id >= u.ncentres * am) {
        return;
    }
    rot[u.centre0 * am + id] = nv(ws_ld(at_a(id / am, 0u) + id % am));
}

// The fitting's Ā of each centre of the launch into its scratch as the ε part of the dual
// reverse's cotangent (its value part, Ā's tangent, is 0), before attn_block_backward.
@compute @workgroup_size(64)
fn attn_block_abar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    let am = 4u * u.m1;
    if (id >= u.ncentres * am) {
        return;
    }
    ws_st(at_abar_in(id / am) + id % am, npair(real(0), abar[u.centre0 * am + id]));
}

// Adjoint of normalize_at from its output y (at `y`) and divisor nr, on ȳ at `yb` in place:
// x̄ = (ȳ − y⟨y, ȳ⟩)/n, or ȳ/n where the floor held (then n is a constant).
fn normalize_backward_at(y: u32, nr: num, yb: u32, k: u32) {
    var yy = nc(real(0));
    if (nv(nr) != real(NORM_FLOOR)) {
        for (var e = 0u; e < k; e++) {
            yy = nadd(yy, nmul(ws_ld(y + e), ws_ld(yb + e)));
        }
    }
    for (var e = 0u; e < k; e++) {
        ws_st(yb + e, ndiv(nsub(ws_ld(yb + e), nmul(ws_ld(y + e), yy)), nr));
    }
}

// Adjoint of softmax_row for row j, from Ā_att in the row of `nn`: through C, the switches,
// the softmax and the smoothing to α L̄ in place; each element's share of r̂̄ and σ̄ kept in C̄
// and Ē (summed by softmax_sums).
// A centre's rows in ws: row j's `width` numbers from at + j·stride.
struct Rows {
    at: u32,
    stride: u32,
    width: u32,
}

// The gradient of a dense layer y = x W + b over a centre's n rows into ws at w and b:
// W̄[a][c] = Σ_j x_j[a] ȳ_j[c], b̄[c] = Σ_j ȳ_j[c], the last row once per slot it stands for.
fn dense_grad(t: u32, n: u32, x: Rows, ybar: Rows, w: u32, b: u32) {
    for (var e = t; e < x.width * ybar.width; e += WG) {
        let a = e / ybar.width;
        let c = e % ybar.width;
        var s = nc(real(0));
        for (var j = 0u; j < n; j++) {
            s = nadd(s, nmul(ws_ld(x.at + j * x.stride + a), ws_ld(ybar.at + j * ybar.stride + c)));
        }
        ws_st(w + e, s);
    }
    for (var c = t; c < ybar.width; c += WG) {
        var s = nc(real(0));
        for (var j = 0u; j < n; j++) {
            for (var r = 0u; r < copies(j, n); r++) {
                s = nadd(s, ws_ld(ybar.at + j * ybar.stride + c));
            }
        }
        ws_st(b + c, s);
    }
}

fn softmax_backward_row(cl: u32, l: u32, j: u32, n: u32) {
    let br = at_nn(cl, j);
    let cb = at_cbar(cl, j);
    let eb = at_ebar(cl, j);
    let use_dotr = u.use_dotr != 0u;
    let is_smooth = u.is_smooth != 0u;
    if (!on(cl, j)) {
        for (var k = 0u; k < n; k++) {
            ws_st(br + k, nc(real(0)));
            if (use_dotr) {
                ws_st(cb + k, nc(real(0)));
            }
        }
        return;
    }
    let m = u.m1;
    let sj = sv(cl, j, m + 4u);
    let pr = at_p(cl, l, j);
    let lr = at_logit(cl, l, j);
    var pdot = nc(real(0));
    for (var k = 0u; k < n; k++) {
        if (!on(cl, k)) {
            ws_st(br + k, nc(real(0)));
            if (use_dotr) {
                ws_st(cb + k, nc(real(0)));
            }
            continue;
        }
        let ab = ws_ld(br + k);
        let pk = ws_ld(pr + k);
        var mbar = ab;
        if (use_dotr) {
            var mjk = pk;
            if (is_smooth) {
                mjk = nmul(nmul(pk, sj), sv(cl, k, m + 4u));
            }
            ws_st(cb + k, nmul(ab, mjk));
            mbar = nmul(ab, ws_ld(at_dotr(cl, j, k)));
        }
        var bv = mbar;
        if (is_smooth) {
            ws_st(eb + k, nmul(mbar, pk));
            bv = nmul(nmul(mbar, sj), sv(cl, k, m + 4u));
        }
        ws_st(br + k, bv);
        pdot = nadd(pdot, nmul(pk, bv));
    }
    for (var k = 0u; k < n; k++) {
        if (!on(cl, k)) {
            continue;
        }
        let lpbar = nmul(ws_ld(pr + k), nsub(ws_ld(br + k), pdot));
        var r = lpbar;
        if (is_smooth) {
            let lk = ws_ld(lr + k);
            ws_st(eb + k, nadd(ws_ld(eb + k), nmul(lpbar, nadd(lk, nc(real(SHIFT))))));
            r = nmul(nmul(lpbar, sj), sv(cl, k, m + 4u));
        }
        ws_st(br + k, nscale(r, cst[0]));
    }
}

// Centre cl's backward on its n slots after forward, from D̄ at at_dbar: leaves Ḡ, R̄ and σ̄
// of its slots in ws, and with want_grad its packed parameter gradient.
fn backward(cl: u32, t: u32, n: u32) {
    let m = u.m1;
    let m2 = u.m2;
    let h = u.h;
    let h3 = 3u * h;
    let inv_nnei = cst[2];
    let inv_m = cst[3];
    let nl = u.nlayers;
    let want_grad = u.want_grad != 0u;
    // Ā[k][c] = Σ_b D̄[c][b] A[k][b] + [c < M2] Σ_c' D̄[c'][c] A[k][c'], + a tensor
    // fitting's Ā.
    for (var e = t; e < 4u * m; e += WG) {
        let k = e / m;
        let c = e % m;
        let ak = at_a(cl, k);
        var s = nc(real(0));
        for (var b = 0u; b < m2; b++) {
            s = nadd(s, nmul(ws_ld(at_dbar(cl) + c * m2 + b), ws_ld(ak + b)));
        }
        if (c < m2) {
            for (var cp = 0u; cp < m; cp++) {
                s = nadd(s, nmul(ws_ld(at_dbar(cl) + cp * m2 + c), ws_ld(ak + cp)));
            }
        }
        if (u.with_abar != 0u) {
            s = nadd(s, ws_ld(at_abar_in(cl) + e));
        }
        ws_st(at_abar(cl, k) + c, s);
    }
    storageBarrier();
    for (var e = t; e < n * m; e += WG) {
        let j = e / m;
        let c = e % m;
        var s = nc(real(0));
        for (var k = 0u; k < 4u; k++) {
            s = nadd(s, nmul(ws_ld(at_abar(cl, k) + c), nscale(sv(cl, j, m + k), inv_nnei)));
        }
        ws_st(at_gbar(cl, j) + c, s);
    }
    for (var e = t; e < n * 4u; e += WG) {
        let j = e / 4u;
        let k = e % 4u;
        var s = nc(real(0));
        for (var c = 0u; c < m; c++) {
            s = nadd(s, nmul(ws_ld(at_abar(cl, k) + c), ws_ld(at_g(cl, nl, j) + c)));
        }
        ws_st(at_rbar(cl, j) + k, nscale(s, inv_nnei));
    }
    for (var j = t; j < n; j += WG) {
        ws_st(at_swbar(cl, j), nc(real(0)));
        for (var x = 0u; x < 3u; x++) {
            ws_st(at_rdbar(cl, j) + x, nc(real(0)));
        }
    }
    storageBarrier();
    for (var li = 0u; li < nl; li++) {
        let l = nl - 1u - li;
        let lg = at_grad(cl) + l * u.layer_len;
        // Layer norm: x̄ = (w − mean(w) − x̂ mean(x̂ w))/s, w = γ ȳ; the residual passes x̄ on.
        if (want_grad) {
            for (var c = t; c < m; c += WG) {
                var gg = nc(real(0));
                var gb = nc(real(0));
                for (var i = 0u; i < n; i++) {
                    let y = ws_ld(at_gbar(cl, i) + c);
                    let x = nmul(y, ws_ld(at_xhat(cl, l, i) + c));
                    for (var r = 0u; r < copies(i, n); r++) {
                        gg = nadd(gg, x);
                        gb = nadd(gb, y);
                    }
                }
                ws_st(lg + lp_gamma(0u) + c, gg);
                ws_st(lg + lp_beta(0u) + c, gb);
            }
            storageBarrier();
        }
        for (var i = t; i < n; i += WG) {
            let gb = at_gbar(cl, i);
            let zb = at_z(cl, i);
            let xh = at_xhat(cl, l, i);
            var mw = nc(real(0));
            var mxw = nc(real(0));
            for (var c = 0u; c < m; c++) {
                let w = nscale(ws_ld(gb + c), lp[lp_gamma(l) + c]);
                ws_st(zb + c, w);
                mw = nadd(mw, w);
                mxw = nadd(mxw, nmul(ws_ld(xh + c), w));
            }
            mw = nscale(mw, inv_m);
            mxw = nscale(mxw, inv_m);
            let sinv = ws_ld(at_sinv(cl, l, i));
            for (var c = 0u; c < m; c++) {
                let z = nmul(nsub(nsub(ws_ld(zb + c), mw), nmul(ws_ld(xh + c), mxw)), sinv);
                ws_st(zb + c, z);
                ws_st(gb + c, z);
            }
        }
        storageBarrier();
        // z = O W_out + b_out: Ō = z̄ W_outᵀ, W̄_out = Oᵀ z̄, b̄_out = Σ z̄.
        for (var e = t; e < n * h; e += WG) {
            let j = e / h;
            let x = e % h;
            var s = nc(real(0));
            for (var c = 0u; c < m; c++) {
                s = nadd(s, nscale(ws_ld(at_z(cl, j) + c), lp[lp_w_out(l) + x * m + c]));
            }
            ws_st(at_obar(cl, j) + x, s);
        }
        if (want_grad) {
            let o = Rows(at_o(cl, l, 0u), h, h);
            dense_grad(t, n, o, Rows(at_z(cl, 0u), m, m), lg + lp_w_out(0u), lg + lp_b_out(0u));
        }
        storageBarrier();
        // O = A v̂: Ā_att = Ō v̂ᵀ, v̂̄ = Aᵀ Ō.
        for (var e = t; e < n * n; e += WG) {
            let j = e / n;
            let k = e % n;
            var s = nc(real(0));
            for (var x = 0u; x < h; x++) {
                s = nadd(s, nmul(ws_ld(at_obar(cl, j) + x), ws_ld(at_qkv(cl, l, k) + 2u * h + x)));
            }
            ws_st(at_nn(cl, j) + k, s);
        }
        for (var e = t; e < n * h; e += WG) {
            let k = e / h;
            let x = e % h;
            var s = nc(real(0));
            for (var j = 0u; j < n; j++) {
                s = nadd(s, nmul(ws_ld(at_w(cl, l, j) + k), ws_ld(at_obar(cl, j) + x)));
            }
            ws_st(at_qkvbar(cl, k) + 2u * h + x, s);
        }
        storageBarrier();
        for (var j = t; j < n; j += WG) {
            softmax_backward_row(cl, l, j, n);
        }
        storageBarrier();
        // r̂̄_j += Σ_k (C̄_jk + C̄_kj) r̂_k, σ̄_j += Σ_k (Ē_jk + Ē_kj) σ_k.
        if (u.use_dotr != 0u) {
            for (var e = t; e < n * 3u; e += WG) {
                let j = e / 3u;
                let x = e % 3u;
                var s = ws_ld(at_rdbar(cl, j) + x);
                for (var k = 0u; k < n; k++) {
                    s = nadd(s, nmul(ws_ld(at_cbar(cl, j) + k), ws_ld(at_rdir(cl, k) + x)));
                }
                for (var k = 0u; k < n; k++) {
                    s = nadd(s, nmul(ws_ld(at_cbar(cl, k) + j), ws_ld(at_rdir(cl, k) + x)));
                }
                ws_st(at_rdbar(cl, j) + x, s);
            }
        }
        if (u.is_smooth != 0u) {
            for (var j = t; j < n; j += WG) {
                var s = ws_ld(at_swbar(cl, j));
                for (var k = 0u; k < n; k++) {
                    s = nadd(s, nmul(ws_ld(at_ebar(cl, j) + k), sv(cl, k, m + 4u)));
                }
                for (var k = 0u; k < n; k++) {
                    s = nadd(s, nmul(ws_ld(at_ebar(cl, k) + j), sv(cl, k, m + 4u)));
                }
                ws_st(at_swbar(cl, j), s);
            }
        }
        // q̂_j·k̂_k: q̂̄ = L̄ k̂, k̂̄ = L̄ᵀ q̂.
        for (var e = t; e < n * 2u * h; e += WG) {
            let j = e / (2u * h);
            let x = e % (2u * h);
            var s = nc(real(0));
            if (x < h) {
                for (var k = 0u; k < n; k++) {
                    s = nadd(s, nmul(ws_ld(at_nn(cl, j) + k), ws_ld(at_qkv(cl, l, k) + h + x)));
                }
            } else {
                for (var k = 0u; k < n; k++) {
                    s = nadd(s, nmul(ws_ld(at_nn(cl, k) + j), ws_ld(at_qkv(cl, l, k) + x - h)));
                }
            }
            ws_st(at_qkvbar(cl, j) + x, s);
        }
        storageBarrier();
        if (u.use_norm != 0u) {
            for (var e = t; e < n * 3u; e += WG) {
                let j = e / 3u;
                let part = (e % 3u) * h;
                let nr = ws_ld(at_nrm(cl, l, j) + e % 3u);
                normalize_backward_at(at_qkv(cl, l, j) + part, nr, at_qkvbar(cl, j) + part, h);
            }
            storageBarrier();
        }
        // [q k v] = G W_in + b_in: Ḡ += [q̄ k̄ v̄] W_inᵀ (after the residual's), W̄_in = Gᵀ [q̄ k̄ v̄],
        // b̄_in = Σ [q̄ k̄ v̄].
        for (var e = t; e < n * m; e += WG) {
            let j = e / m;
            let c = e % m;
            var s = nc(real(0));
            for (var o = 0u; o < h3; o++) {
                s = nadd(s, nscale(ws_ld(at_qkvbar(cl, j) + o), lp[lp_w_in(l) + c * h3 + o]));
            }
            ws_st(at_gbar(cl, j) + c, nadd(ws_ld(at_gbar(cl, j) + c), s));
        }
        if (want_grad) {
            let g = Rows(at_g(cl, l, 0u), m, m);
            let qkvbar = Rows(at_qkvbar(cl, 0u), h3, h3);
            dense_grad(t, n, g, qkvbar, lg + lp_w_in(0u), lg + lp_b_in(0u));
        }
        storageBarrier();
    }
    // r̂ = R̂[1:4] / max(|R̂[1:4]|, floor).
    for (var j = t; j < n; j += WG) {
        var sq = nc(real(0));
        for (var x = 0u; x < 3u; x++) {
            let v = sv(cl, j, m + 1u + x);
            sq = nadd(sq, nmul(v, v));
        }
        var nr = nsqrt(sq);
        if (nv(nr) < real(NORM_FLOOR)) {
            nr = nc(real(NORM_FLOOR));
        }
        normalize_backward_at(at_rdir(cl, j), nr, at_rdbar(cl, j), 3u);
        for (var x = 0u; x < 3u; x++) {
            let rb = at_rbar(cl, j) + 1u + x;
            ws_st(rb, nadd(ws_ld(rb), ws_ld(at_rdbar(cl, j) + x)));
        }
    }
    storageBarrier();
}

// Every centre of the launch forward then backward from its row of D̄ (on duals Ḋ̄ + εD̄):
// Ḡ, R̄ and σ̄ of each of its nnei slots (at_adj; a slot left out takes the copy's), and
// with want_grad its parameter gradient kept in ws.
@compute @workgroup_size(64)
fn attn_block_backward(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_id) l: vec3<u32>) {
    let cl = wg.x + wg.y * nwg.x;
    if (cl >= u.ncentres) {
        return;
    }
    let n = forward_taken(cl, l.x);
    let row = (u.centre0 + cl) * u.stride;
    for (var e = l.x; e < u.m1 * u.m2; e += WG) {
        ws_st(at_dbar(cl) + e, npair(seed[row + e], seed_eps[row + e]));
    }
    storageBarrier();
    backward(cl, l.x, n);
    let m = u.m1;
    let w = m + 5u;
    for (var e = l.x; e < u.nnei * w; e += WG) {
        let r = min(e / w, n - 1u);
        let c = e % w;
        var x: num;
        if (c < m) {
            x = ws_ld(at_gbar(cl, r) + c);
        } else if (c < m + 4u) {
            x = ws_ld(at_rbar(cl, r) + c - m);
        } else {
            x = ws_ld(at_swbar(cl, r));
        }
        ws_st(at_adj(cl, 0u) + e, x);
    }
}

// The forces' q = ∂E/∂r_ij of each slot of the launch from its R̄, with ŝ̄ = Ḡ·G⁰' and σ̄ dσ/dŝ
// added to R̄[0], through the environment's Jacobian.
@compute @workgroup_size(64)
fn attn_block_q(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.ncentres * u.nnei) {
        return;
    }
    let m = u.m1;
    let s = u.centre0 * u.nnei + id;
    let a = at_adj(id / u.nnei, id % u.nnei);
    var d = real(0);
    for (var c = 0u; c < m; c++) {
        d = d + nv(ws_ld(a + c)) * g0p[s * m + c];
    }
    var rb: array<real, 4>;
    for (var k = 0u; k < 4u; k++) {
        rb[k] = nv(ws_ld(a + m + k));
    }
    rb[0] = rb[0] + (d + nv(ws_ld(a + m + 4u)) * dsw[s]);
    for (var x = 0u; x < 3u; x++) {
        var acc = real(0);
        for (var k = 0u; k < 4u; k++) {
            acc = acc + jac[12u * s + 3u * k + x] * rb[k];
        }
        q[3u * s + x] = acc;
    }
}

// The dual reverse's Ḡ⁰ (the ε parts) and Ġ̄⁰ (the values) of each slot of the launch.
@compute @workgroup_size(64)
fn attn_block_g0bar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    let m = u.m1;
    if (id >= u.ncentres * u.nnei * m) {
        return;
    }
    let j = id / m;
    let x = ws_ld(at_adj(j / u.nnei, j % u.nnei) + id % m);
    let s = u.centre0 * u.nnei * m + id;
    g0bar[s] = nd(x);
    g0dotbar[s] = nv(x);
}

// The launch's centres' parameter gradients (the ε parts), summed centre by centre and added
// to the model's where each goes.
@compute @workgroup_size(64)
fn attn_block_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let e = flat_id(wg, nwg, l);
    if (e >= u.plen) {
        return;
    }
    var acc = real(0);
    for (var cl = 0u; cl < u.ncentres; cl++) {
        acc = acc + nd(ws_ld(at_grad(cl) + e));
    }
    let to = grad_at[e];
    if (to >= 0) {
        grad[to] = grad[to] + acc;
    }
}

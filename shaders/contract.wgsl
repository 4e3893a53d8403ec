// The descriptor contraction A = (1/nnei) Σ G ⊗ R̂, D = A A<ᵀ, and its derivatives (see
// cpu/contract.rs). Per-centre kernels run one thread per (centre, row of A) and visit the
// centre's slots in the CPU's order; per-slot kernels are launched once per (ti, tj) block.
// A-shaped buffers (A, Ȧ, Ā, Ǡ) are [4][M1] per centre, as on every backend.

// ContractParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: ContractParams;
// The batch shape table (shape.wgsl)
@group(0) @binding(1) var<storage, read> dims: array<u32>;
@group(0) @binding(2) var<storage, read> g: array<real>;
@group(0) @binding(3) var<storage, read> gp: array<real>;
@group(0) @binding(4) var<storage, read> rhat: array<real>;
@group(0) @binding(5) var<storage, read> rdot: array<real>;
@group(0) @binding(6) var<storage, read> a: array<real>;
@group(0) @binding(7) var<storage, read> adot: array<real>;
@group(0) @binding(8) var<storage, read> dbar: array<real>;
@group(0) @binding(9) var<storage, read> ddotbar: array<real>;
// A, Ȧ, Ā (a_backward) or the per-centre Ā of contract_dual; per slot: Ḡ
@group(0) @binding(10) var<storage, read_write> out_a: array<real>;
// D, Ḋ, or the per-centre Ǡ of contract_dual; per slot: Ġ̄
@group(0) @binding(11) var<storage, read_write> out_d: array<real>;
@group(0) @binding(12) var<storage, read> jac: array<real>;
// Ā (slot_backward) or the per-centre Ā of contract_dual
@group(0) @binding(13) var<storage, read> abar: array<real>;
@group(0) @binding(14) var<storage, read_write> q: array<real>;
// the per-centre Ǡ of contract_dual
@group(0) @binding(15) var<storage, read> adotbar: array<real>;

fn inv_nnei() -> real {
    return real(1) / real(u.nnei);
}

// Index of A[c][k][i], k = 0 for a row's first component (the others follow M1 apart).
fn a_index(c: u32, i: u32) -> u32 {
    return c * 4u * u.m1 + i;
}

// A slot's R̂ and Ṙ rows, and column i of a centre's Ā and Ǡ ([4][M1] from a_index's y).
fn rhat_of(s: u32) -> vec4<real> {
    return vec4<real>(rhat[4u * s], rhat[4u * s + 1u], rhat[4u * s + 2u], rhat[4u * s + 3u]);
}
fn rdot_of(s: u32) -> vec4<real> {
    return vec4<real>(rdot[4u * s], rdot[4u * s + 1u], rdot[4u * s + 2u], rdot[4u * s + 3u]);
}
fn abar_col(y: u32) -> vec4<real> {
    return vec4<real>(abar[y], abar[y + u.m1], abar[y + 2u * u.m1], abar[y + 3u * u.m1]);
}
fn adotbar_col(y: u32) -> vec4<real> {
    return vec4<real>(adotbar[y], adotbar[y + u.m1], adotbar[y + 2u * u.m1], adotbar[y + 3u * u.m1]);
}

// A[c][i][·] = (1/nnei) Σ_slots G[slot][i] R̂[slot][·]
@compute @workgroup_size(64)
fn a_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.ncentres * u.m1) {
        return;
    }
    let c = id / u.m1;
    let i = id % u.m1;
    let ti = centre_type(c);
    var acc = vec4<real>();
    for (var tj = 0u; tj < nsec(); tj++) {
        let s0 = first_slot(ti, c, tj);
        for (var s = s0; s < s0 + sel_of(tj); s++) {
            let gv = g[s * u.m1 + i];
            acc += gv * rhat_of(s);
        }
    }
    store_a(id, acc * inv_nnei());
}

// D[c][i][j] = Σ_k X[i][k] Y[j][k] for j < M2: D = A A<ᵀ (mode 0) or Ḋ = Ȧ A<ᵀ + A Ȧ<ᵀ (mode 1).
@compute @workgroup_size(64)
fn d_outer(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.ncentres * u.m1 * u.m2) {
        return;
    }
    let c = id / (u.m1 * u.m2);
    let i = (id / u.m2) % u.m1;
    let j = id % u.m2;
    let ai = a_index(c, i);
    let aj = a_index(c, j);
    var s = real(0);
    if (u.mode == 0u) {
        for (var k = 0u; k < 4u; k++) {
            s += a[ai + k * u.m1] * a[aj + k * u.m1];
        }
    } else {
        var s2 = real(0);
        for (var k = 0u; k < 4u; k++) {
            s += adot[ai + k * u.m1] * a[aj + k * u.m1];
            s2 += a[ai + k * u.m1] * adot[aj + k * u.m1];
        }
        s += s2;
    }
    out_d[id] = s;
}

// The adjoint B(X̄, Y) of D = A A<ᵀ at row i of centre c, for the three (X̄, Y) pairs used:
// Σ_j X̄[i][j] Y[j][·] + [i < M2] Σ_i' X̄[i'][i] Y[i'][·]. Three copies, since WGSL cannot pass a
// storage array to a function and each entry point should bind only what it reads.
fn b_dbar_a(c: u32, i: u32) -> vec4<real> {
    let dm = c * u.m1 * u.m2;
    let am = a_index(c, 0u);
    let m = u.m1;
    var out = vec4<real>();
    for (var j = 0u; j < u.m2; j++) {
        let y = am + j;
        out += dbar[dm + i * u.m2 + j] * vec4<real>(a[y], a[y + m], a[y + 2u * m], a[y + 3u * m]);
    }
    if (i < u.m2) {
        for (var i2 = 0u; i2 < u.m1; i2++) {
            let y = am + i2;
            out += dbar[dm + i2 * u.m2 + i] * vec4<real>(a[y], a[y + m], a[y + 2u * m], a[y + 3u * m]);
        }
    }
    return out;
}

fn b_ddotbar_a(c: u32, i: u32) -> vec4<real> {
    let dm = c * u.m1 * u.m2;
    let am = a_index(c, 0u);
    let m = u.m1;
    var out = vec4<real>();
    for (var j = 0u; j < u.m2; j++) {
        let y = am + j;
        out += ddotbar[dm + i * u.m2 + j] * vec4<real>(a[y], a[y + m], a[y + 2u * m], a[y + 3u * m]);
    }
    if (i < u.m2) {
        for (var i2 = 0u; i2 < u.m1; i2++) {
            let y = am + i2;
            out += ddotbar[dm + i2 * u.m2 + i] * vec4<real>(a[y], a[y + m], a[y + 2u * m], a[y + 3u * m]);
        }
    }
    return out;
}

fn b_ddotbar_adot(c: u32, i: u32) -> vec4<real> {
    let dm = c * u.m1 * u.m2;
    let am = a_index(c, 0u);
    let m = u.m1;
    var out = vec4<real>();
    for (var j = 0u; j < u.m2; j++) {
        let y = am + j;
        out += ddotbar[dm + i * u.m2 + j] * vec4<real>(adot[y], adot[y + m], adot[y + 2u * m], adot[y + 3u * m]);
    }
    if (i < u.m2) {
        for (var i2 = 0u; i2 < u.m1; i2++) {
            let y = am + i2;
            out += ddotbar[dm + i2 * u.m2 + i] * vec4<real>(adot[y], adot[y + m], adot[y + 2u * m], adot[y + 3u * m]);
        }
    }
    return out;
}

// Row i = id % M1 of centre c = id / M1 into out_a.
fn store_a(id: u32, v: vec4<real>) {
    let y = a_index(id / u.m1, id % u.m1);
    for (var k = 0u; k < 4u; k++) {
        out_a[y + k * u.m1] = v[k];
    }
}

// Ā = D̄ A< + [D̄ᵀ A] in the first M2 rows; one thread per (centre, row).
@compute @workgroup_size(64)
fn a_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.ncentres * u.m1) {
        return;
    }
    store_a(id, b_dbar_a(id / u.m1, id % u.m1));
}

// Per slot of one block: R̄ = (1/nnei)(Āᵀ G) + e₀ (1/nnei)(G'·Ā R̂), q = Jᵀ R̄.
@compute @workgroup_size(64)
fn slot_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nslots) {
        return;
    }
    let s = u.slot0 + id;
    let c = u.centre0 + id / u.sel;
    let ab = a_index(c, 0u);
    let rh = rhat_of(s);
    var rbar = vec4<real>();
    for (var i = 0u; i < u.m1; i++) {
        let y = ab + i;
        let arow = abar_col(y);
        rbar += arow * g[s * u.m1 + i];
        rbar.x += gp[s * u.m1 + i] * dot(arow, rh);
    }
    let f = inv_nnei();
    for (var x = 0u; x < 3u; x++) {
        let j = 12u * s + x;
        q[3u * s + x] = f * (jac[j] * rbar.x + jac[j + 3u] * rbar.y + jac[j + 6u] * rbar.z + jac[j + 9u] * rbar.w);
    }
}

// Ȧ[c][i][·] = (1/nnei) Σ_slots (G'[slot][i] ṡ R̂[slot][·] + G[slot][i] Ṙ[slot][·])
@compute @workgroup_size(64)
fn a_tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.ncentres * u.m1) {
        return;
    }
    let c = id / u.m1;
    let i = id % u.m1;
    let ti = centre_type(c);
    var acc = vec4<real>();
    for (var tj = 0u; tj < nsec(); tj++) {
        let s0 = first_slot(ti, c, tj);
        for (var s = s0; s < s0 + sel_of(tj); s++) {
            let rh = rhat_of(s);
            let rd = rdot_of(s);
            let gd = gp[s * u.m1 + i] * rd.x;
            acc += gd * rh + g[s * u.m1 + i] * rd;
        }
    }
    store_a(id, acc * inv_nnei());
}

// contract_dual, per centre: Ā = B(D̄, A) + B(Ḋ̄, Ȧ) into out_a, Ǡ = B(Ḋ̄, A) into out_d.
@compute @workgroup_size(64)
fn dual_centre(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.ncentres * u.m1) {
        return;
    }
    let c = id / u.m1;
    let i = id % u.m1;
    store_a(id, b_dbar_a(c, i) + b_ddotbar_adot(c, i));
    let adb = b_ddotbar_a(c, i);
    let y = a_index(c, i);
    for (var k = 0u; k < 4u; k++) {
        out_d[y + k * u.m1] = adb[k];
    }
}

// contract_dual, per (slot, i) of one block: Ḡ = (1/nnei)(Ā R̂ + Ǡ Ṙ), Ġ̄ = (1/nnei) Ǡ R̂.
@compute @workgroup_size(64)
fn dual_slot(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nslots * u.m1) {
        return;
    }
    let s = u.slot0 + id / u.m1;
    let i = id % u.m1;
    let c = u.centre0 + (id / u.m1) / u.sel;
    let y = a_index(c, i);
    let ab = abar_col(y);
    let adb = adotbar_col(y);
    let rh = rhat_of(s);
    let rd = rdot_of(s);
    let f = inv_nnei();
    out_a[s * u.m1 + i] = f * (dot(ab, rh) + dot(adb, rd));
    out_d[s * u.m1 + i] = f * dot(adb, rh);
}

// Ḡ[slot][i] += (1/nnei) Ā[c][·][i]·R̂[slot]: A's reverse into G from an Ā that reaches A from
// outside D (a tensor fitting's ∂L/∂gr).
@compute @workgroup_size(64)
fn gbar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nslots * u.m1) {
        return;
    }
    let s = u.slot0 + id / u.m1;
    let i = id % u.m1;
    let c = u.centre0 + (id / u.m1) / u.sel;
    let y = a_index(c, i);
    let ab = abar_col(y);
    let rh = rhat_of(s);
    out_a[s * u.m1 + i] += inv_nnei() * dot(ab, rh);
}

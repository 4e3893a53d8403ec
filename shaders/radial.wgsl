// se_e2_r's descriptor D_c = k Σ_{slots of c} G_s and its derivatives (see cpu/radial.rs).
// Per-centre kernels run one thread per (centre, column of D) and visit the centre's slots in
// the CPU's order; per-slot kernels are launched once per (ti, tj) block, as in contract.wgsl,
// so that a slot's centre needs no search.

// ContractParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: ContractParams;
// The batch shape table (shape.wgsl)
@group(0) @binding(1) var<storage, read> dims: array<u32>;
// [k], k = radial_scale rounded to `real` on the host, as the CPU rounds it
@group(0) @binding(2) var<storage, read> scale: array<real>;
// G (radial_forward) or G' (the others), [slot][M1]
@group(0) @binding(3) var<storage, read> g: array<real>;
@group(0) @binding(4) var<storage, read> sdot: array<real>;
@group(0) @binding(5) var<storage, read> dbar: array<real>;
@group(0) @binding(6) var<storage, read> ddotbar: array<real>;
@group(0) @binding(7) var<storage, read> jac: array<real>;
// D or Ḋ, [centre][M1]
@group(0) @binding(8) var<storage, read_write> desc: array<real>;
@group(0) @binding(9) var<storage, read_write> q: array<real>;
@group(0) @binding(10) var<storage, read_write> gbar: array<real>;
@group(0) @binding(11) var<storage, read_write> gdotbar: array<real>;

// desc[c][i] = k Σ_{slots s of c} w_s g[s][i] with w_s = ṡ_s or 1, for id = c·M1 + i. One
// function for D and Ḋ, so both entry points bind sdot: D's passes a stand-in.
fn slot_sum(id: u32, weighted: bool) {
    let c = id / u.m1;
    let i = id % u.m1;
    let ti = centre_type(c);
    var acc = real(0);
    for (var tj = 0u; tj < nsec(); tj++) {
        let s0 = first_slot(ti, c, tj);
        for (var s = s0; s < s0 + sel_of(tj); s++) {
            var w = real(1);
            if (weighted) {
                w = sdot[s];
            }
            acc += w * g[s * u.m1 + i];
        }
    }
    desc[id] = acc * scale[0];
}

@compute @workgroup_size(64)
fn radial_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id < u.ncentres * u.m1) {
        slot_sum(id, false);
    }
}

@compute @workgroup_size(64)
fn radial_tangent(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id < u.ncentres * u.m1) {
        slot_sum(id, true);
    }
}

// Per slot of one block: q = J[0] · k (G'·D̄_c), J's radial row.
@compute @workgroup_size(64)
fn radial_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nslots) {
        return;
    }
    let s = u.slot0 + id;
    let c = u.centre0 + id / u.sel;
    var acc = real(0);
    for (var i = 0u; i < u.m1; i++) {
        acc += g[s * u.m1 + i] * dbar[c * u.m1 + i];
    }
    let sbar = scale[0] * acc;
    for (var x = 0u; x < 3u; x++) {
        q[3u * s + x] = jac[12u * s + x] * sbar;
    }
}

// Per (slot, i) of one block: Ḡ = k D̄_c, Ġ̄ = k Ḋ̄_c.
@compute @workgroup_size(64)
fn radial_dual(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= u.nslots * u.m1) {
        return;
    }
    let s = u.slot0 + id / u.m1;
    let i = id % u.m1;
    let c = u.centre0 + (id / u.m1) / u.sel;
    let k = scale[0];
    gbar[s * u.m1 + i] = k * dbar[c * u.m1 + i];
    gdotbar[s * u.m1 + i] = k * ddotbar[c * u.m1 + i];
}

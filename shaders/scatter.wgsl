// Per-frame energies, forces and virials from the per-slot q = ∂E/∂r_ij (see cpu/scatter.rs).
// No atomics: forces are gathered per atom from a host-built list of the slots that touch it,
// in the CPU's visiting order; virials are summed per centre, then per frame in centre order.

// ScatterParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: ScatterParams;
// The batch shape table (shape.wgsl)
@group(0) @binding(1) var<storage, read> dims: array<u32>;
@group(0) @binding(2) var<storage, read> e_fit: array<real>;
@group(0) @binding(3) var<storage, read> bias: array<real>;
@group(0) @binding(4) var<storage, read_write> e_atom: array<real>;
@group(0) @binding(5) var<storage, read_write> energy: array<real>;
// CSR over batch atoms: entries ent[ptr[a]..ptr[a+1]] are slot + 1 (atom a is the centre, +q)
// or −(slot + 1) (atom a owns the neighbour, −q).
@group(0) @binding(6) var<storage, read> csr_ptr: array<u32>;
@group(0) @binding(7) var<storage, read> csr_ent: array<i32>;
@group(0) @binding(8) var<storage, read> q: array<real>;
@group(0) @binding(9) var<storage, read_write> force: array<real>;
@group(0) @binding(10) var<storage, read> rij: array<real>;
@group(0) @binding(11) var<storage, read> owner: array<i32>;
// Σ q ⊗ r_ij per centre, [ncentres][9]
@group(0) @binding(12) var<storage, read_write> wpart: array<real>;
@group(0) @binding(13) var<storage, read_write> virial: array<real>;

@compute @workgroup_size(64)
fn atom_energy(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) l: vec3<u32>) {
    let c = flat_id(wg, nwg, l);
    if (c >= u.ncentres) {
        return;
    }
    e_atom[c] = e_fit[c] + bias[centre_type(c)];
}

// One thread per frame, summing its centres type by type as the CPU does, in a WideSum: f64 as
// on the CPU, or exact fixed point in float32 (see the precision preludes).
@compute @workgroup_size(64)
fn frame_energy(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let f = flat_id(wg, nwg, l);
    if (f >= u.nframes) {
        return;
    }
    var acc = WideSum();
    for (var t = 0u; t < ntypes(); t++) {
        let end = frame_start(t, f + 1u);
        for (var c = frame_start(t, f); c < end; c++) {
            wide_add(&acc, e_atom[c]);
        }
    }
    energy[f] = wide_value(&acc);
}

@compute @workgroup_size(64)
fn gather_force(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let atom = flat_id(wg, nwg, l);
    if (atom >= u.nframes * u.natoms) {
        return;
    }
    var f = vec3<real>();
    for (var e = csr_ptr[atom]; e < csr_ptr[atom + 1u]; e++) {
        let v = csr_ent[e];
        let s = u32(abs(v)) - 1u;
        let qs = vec3<real>(q[3u * s], q[3u * s + 1u], q[3u * s + 2u]);
        if (v > 0) {
            f += qs;
        } else {
            f -= qs;
        }
    }
    for (var k = 0u; k < 3u; k++) {
        force[3u * atom + k] = f[k];
    }
}

// Σ q ⊗ r_ij over the real slots of one centre.
@compute @workgroup_size(64)
fn centre_virial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) l: vec3<u32>) {
    let c = flat_id(wg, nwg, l);
    if (c >= u.ncentres) {
        return;
    }
    let ti = centre_type(c);
    var w0 = vec3<real>();
    var w1 = vec3<real>();
    var w2 = vec3<real>();
    for (var tj = 0u; tj < nsec(); tj++) {
        let s0 = first_slot(ti, c, tj);
        for (var s = s0; s < s0 + sel_of(tj); s++) {
            if (owner[s] < 0) {
                continue;
            }
            let r = vec3<real>(rij[3u * s], rij[3u * s + 1u], rij[3u * s + 2u]);
            w0 += q[3u * s] * r;
            w1 += q[3u * s + 1u] * r;
            w2 += q[3u * s + 2u] * r;
        }
    }
    for (var b = 0u; b < 3u; b++) {
        wpart[9u * c + b] = w0[b];
        wpart[9u * c + 3u + b] = w1[b];
        wpart[9u * c + 6u + b] = w2[b];
    }
}

// W = −Σ over the frame's centres (type by type, in order) of the per-centre sums.
@compute @workgroup_size(64)
fn frame_virial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) l: vec3<u32>) {
    let id = flat_id(wg, nwg, l);
    if (id >= 9u * u.nframes) {
        return;
    }
    let f = id / 9u;
    let k = id % 9u;
    var acc = real(0);
    for (var t = 0u; t < ntypes(); t++) {
        let end = frame_start(t, f + 1u);
        for (var c = frame_start(t, f); c < end; c++) {
            acc += wpart[9u * c + k];
        }
    }
    virial[id] = -acc;
}

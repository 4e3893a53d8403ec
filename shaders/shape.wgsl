// Lookups in the batch shape table (src/backend/gpu_layout.rs, shape_table), put after the
// shaders that bind it: each declares it as `dims` and has `ntypes` in its uniform block `u`.

fn centre_start(t: u32) -> u32 {
    return dims[dims_centre_start_at(u.ntypes) + t];
}

fn sel_of(tj: u32) -> u32 {
    return dims[dims_sel_at(u.ntypes) + tj];
}

// Type of centre c: centres are ordered by type.
fn centre_type(c: u32) -> u32 {
    var t = 0u;
    while (t + 1u < u.ntypes && c >= centre_start(t + 1u)) {
        t++;
    }
    return t;
}

// First slot of centre c (of type ti) in section tj.
fn first_slot(ti: u32, c: u32, tj: u32) -> u32 {
    let nt = u.ntypes;
    return dims[dims_block_start_at(nt) + ti * nt + tj] + (c - centre_start(ti)) * sel_of(tj);
}

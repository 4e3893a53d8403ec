// Lookups in the batch shape table (src/backend/gpu_layout.rs, shape_table), put after the
// shaders that bind it: each declares it as `dims`. The head says where each section starts.

fn ntypes() -> u32 {
    return dims[DIMS_NTYPES];
}

// Neighbour sections per centre: ntypes, or 1 for DPA-1's mixed-type list.
fn nsec() -> u32 {
    return dims[DIMS_NSEC];
}

fn centre_start(t: u32) -> u32 {
    return dims[dims[DIMS_CENTRE_START_AT] + t];
}

// First centre of type t in frame f (f = nframes: the type's end); frames of a batch may differ
// in composition.
fn frame_start(t: u32, f: u32) -> u32 {
    return dims[dims[DIMS_FRAME_START_AT] + t * (dims[DIMS_NFRAMES] + 1u) + f];
}

fn sel_of(tj: u32) -> u32 {
    return dims[dims[DIMS_SEL_AT] + tj];
}

// Type of centre c: centres are ordered by type.
fn centre_type(c: u32) -> u32 {
    var t = 0u;
    while (t + 1u < ntypes() && c >= centre_start(t + 1u)) {
        t++;
    }
    return t;
}

// Frame of centre c: the last frame whose centres of c's type start at or before c (a frame
// without any starts where the next does), by bisection as Dims::centre_frame.
fn centre_frame(c: u32) -> u32 {
    let t = centre_type(c);
    var lo = 0u;
    var hi = dims[DIMS_NFRAMES];
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (frame_start(t, mid) <= c) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// First slot of centre c (of type ti) in section tj.
fn first_slot(ti: u32, c: u32, tj: u32) -> u32 {
    return dims[dims[DIMS_BLOCK_START_AT] + ti * nsec() + tj] + (c - centre_start(ti)) * sel_of(tj);
}

// Sets every element of a buffer to one value (Backend::fill with a nonzero value).

// VectorParams: src/backend/gpu_layout.rs.
@group(0) @binding(0) var<uniform> u: VectorParams;
@group(0) @binding(1) var<storage, read> value: array<real>;
@group(0) @binding(2) var<storage, read_write> buf: array<real>;

@compute @workgroup_size(64)
fn fill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) l: vec3<u32>) {
    let i = flat_id(wg, nwg, l);
    if (i < u.n) {
        buf[i] = value[0];
    }
}

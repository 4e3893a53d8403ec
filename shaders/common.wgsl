// Shared by every op shader (prepended after the precision prelude).

// Threads per workgroup of the one-dimensional kernels.
const WG: u32 = 64u;

// Flat thread index of a 1-D kernel. The host spreads large launches over y as well, since one
// dispatch dimension is limited to 65535 workgroups.
fn flat_id(wg: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + lid.x;
}

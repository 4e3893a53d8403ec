// se_e2_r's descriptor D_c = k Σ_{slots of c} G_s and its derivatives (CPU reference:
// src/backend/cpu/radial.rs). k is radial_scale, rounded to T on the host as the CPU rounds it.
// D-shaped buffers are [centre][M1], G-shaped ones [slot][M1].

// out[c][i] = k Σ_{slots s of c} w_s x[s][i] (w_s = 1 without weights), one thread per (c, i):
// neighbouring threads read neighbouring columns, and each sum runs in the CPU's slot order.
template <typename T>
__device__ __forceinline__ void slot_sum(const int* __restrict__ dims, T k, const T* __restrict__ x,
                                         const T* __restrict__ w, T* __restrict__ out) {
  Dims d(dims);
  int m1 = d.m1();
  i64 e = global_index();
  if (e >= (i64)d.ncentres() * m1) return;
  int c = (int)(e / m1), i = (int)(e % m1), ti = d.centre_type(c);
  T acc = T(0);
  for (int tj = 0; tj < d.nsec(); ++tj) {
    i64 first = d.first_slot(ti, c, tj);
    for (i64 s = first; s < first + d.sel(tj); ++s) acc += (w ? w[s] : T(1)) * x[s * m1 + i];
  }
  out[e] = acc * k;
}

#define RADIAL_FORWARD_PARAMS(T) \
  (const int* __restrict__ dims, T k, const T* __restrict__ g, T* __restrict__ desc)

template <typename T>
__device__ void radial_forward RADIAL_FORWARD_PARAMS(T) {
  slot_sum<T>(dims, k, g, nullptr, desc);
}
DPW_INSTANTIATE(radial_forward, RADIAL_FORWARD_PARAMS, (dims, k, g, desc))

#define RADIAL_TANGENT_PARAMS(T)                                                          \
  (const int* __restrict__ dims, T k, const T* __restrict__ gp, const T* __restrict__ sdot, \
   T* __restrict__ ddot)

template <typename T>
__device__ void radial_tangent RADIAL_TANGENT_PARAMS(T) {
  slot_sum<T>(dims, k, gp, sdot, ddot);
}
DPW_INSTANTIATE(radial_tangent, RADIAL_TANGENT_PARAMS, (dims, k, gp, sdot, ddot))

// Per slot: q = J[0] · k (G'·D̄_c), J's radial row. One warp per slot, so that G' and D̄ are
// read coalesced: lanes take the M1 columns, then a butterfly shuffle (a fixed tree, so
// deterministic) sums the lanes. Assumes blockDim.x is a multiple of 32.
#define RADIAL_BACKWARD_PARAMS(T)                                                           \
  (const int* __restrict__ dims, T k, const T* __restrict__ dbar, const T* __restrict__ gp, \
   const T* __restrict__ jac, T* __restrict__ q)

template <typename T>
__device__ void radial_backward RADIAL_BACKWARD_PARAMS(T) {
  Dims d(dims);
  int lane = threadIdx.x % 32;
  i64 s = global_index() / 32;
  if (s >= d.nslots()) return;
  int m1 = d.m1();
  const T* dc = dbar + (i64)d.slot_centre((int)s) * m1;
  T acc = T(0);
  for (int i = lane; i < m1; i += 32) acc += gp[s * m1 + i] * dc[i];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane < 3) q[3 * s + lane] = jac[12 * s + lane] * (k * acc);
}
DPW_INSTANTIATE(radial_backward, RADIAL_BACKWARD_PARAMS, (dims, k, dbar, gp, jac, q))

// Per (slot, i): Ḡ = k D̄_c, Ġ̄ = k Ḋ̄_c.
#define RADIAL_DUAL_PARAMS(T)                                                                  \
  (const int* __restrict__ dims, T k, const T* __restrict__ dbar, const T* __restrict__ ddotbar, \
   T* __restrict__ gbar, T* __restrict__ gdotbar)

template <typename T>
__device__ void radial_dual RADIAL_DUAL_PARAMS(T) {
  Dims d(dims);
  int m1 = d.m1();
  i64 e = global_index();
  if (e >= (i64)d.nslots() * m1) return;
  i64 from = (i64)d.slot_centre((int)(e / m1)) * m1 + e % m1;
  gbar[e] = k * dbar[from];
  gdotbar[e] = k * ddotbar[from];
}
DPW_INSTANTIATE(radial_dual, RADIAL_DUAL_PARAMS, (dims, k, dbar, ddotbar, gbar, gdotbar))

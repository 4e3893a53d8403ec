// The descriptor contraction A = (1/nnei) Σ_slots G ⊗ R̂, D = A A<ᵀ, and its derivatives (CPU
// reference: src/backend/cpu/contract.rs). One thread block per centre: a centre's slots are
// one run of sel[tj] rows in each block (ti, tj), visited section by section in slot order, and
// each thread owns whole rows of the per-centre matrices, so every sum has a fixed order.
// The centre's slots are visited section by section (tj), in slot order, as on the CPU.
// Per-centre matrices sit in dynamic shared memory: A, Ȧ, Ā, Ǡ are [M1][4], D, Ḋ [M1][M2]. In
// global memory the A-shaped buffers are [4][M1] per centre, the layout every backend shares
// (Backend::contract_forward): a row of threads writes and reads them coalesced.

template <typename T>
__device__ __forceinline__ T* shared_buffer() {
  extern __shared__ unsigned char dpw_shared[];
  return reinterpret_cast<T*>(dpw_shared);
}

// A centre's [4][M1] block of global memory into shared memory as [M1][4].
template <typename T>
__device__ __forceinline__ void load_rows(T* shared, const T* __restrict__ global, int m1) {
  for (int e = threadIdx.x; e < 4 * m1; e += blockDim.x) shared[4 * (e % m1) + e / m1] = global[e];
}

// out[a][b] = Σ_k x[a][k] y[b][k] for b < M2, summed from zero in k order (CPU: outer_m2).
template <typename T>
__device__ __forceinline__ T outer_entry(const T* x, const T* y, int a, int b) {
  T acc = T(0);
#pragma unroll
  for (int k = 0; k < 4; ++k) acc += x[4 * a + k] * y[4 * b + k];
  return acc;
}

// The adjoint of D = A A<ᵀ for row i of Ā: Σ_b D̄[i][b] A[b] + [i < M2] Σ_i' D̄[i'][i] A[i'].
template <typename T>
__device__ __forceinline__ void axis_backward_row(int m1, int m2, const T* __restrict__ dbar,
                                                  const T* a, int i, T out[4]) {
  for (int b = 0; b < m2; ++b) {
    T g = dbar[(i64)i * m2 + b];
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] += g * a[4 * b + k];
  }
  if (i < m2) {
    for (int i2 = 0; i2 < m1; ++i2) {
      T g = dbar[(i64)i2 * m2 + i];
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] += g * a[4 * i2 + k];
    }
  }
}

// A_c and D_c. Shared memory: A [M1][4].
#define CONTRACT_FORWARD_PARAMS(T)                                                        \
  (const int* __restrict__ dims, const T* __restrict__ g, const T* __restrict__ rhat,     \
   T* __restrict__ a_out, T* __restrict__ desc)

template <typename T>
__device__ void contract_forward CONTRACT_FORWARD_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2(), ti = d.centre_type(c);
  T inv = T(1.0 / (double)d.nnei());
  T* sa = shared_buffer<T>();
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T acc[4] = {T(0), T(0), T(0), T(0)};
    // The centre's slots, section by section, in slot order.
    for (int tj = 0; tj < d.ntypes(); ++tj) {
      i64 first = d.first_slot(ti, c, tj);
      for (i64 s = first; s < first + d.sel(tj); ++s) {
        T gv = g[s * m1 + i];
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[k] += gv * rhat[4 * s + k];
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      T v = acc[k] * inv;
      sa[4 * i + k] = v;
      a_out[(i64)c * 4 * m1 + k * m1 + i] = v;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < m1 * m2; e += blockDim.x)
    desc[(i64)c * m1 * m2 + e] = outer_entry(sa, sa, e / m2, e % m2);
}
DPW_INSTANTIATE(contract_forward, CONTRACT_FORWARD_PARAMS, (dims, g, rhat, a_out, desc))

// Ā = D̄ A< + [D̄ᵀ A] in the first M2 rows. Shared memory: A [M1][4].
#define CONTRACT_BACKWARD_PARAMS(T) \
  (const int* __restrict__ dims, const T* __restrict__ a, const T* __restrict__ dbar, T* __restrict__ abar)

template <typename T>
__device__ void contract_backward CONTRACT_BACKWARD_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2();
  T* sa = shared_buffer<T>();
  load_rows(sa, a + (i64)c * 4 * m1, m1);
  __syncthreads();
  const T* db = dbar + (i64)c * m1 * m2;
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T acc[4] = {T(0), T(0), T(0), T(0)};
    axis_backward_row(m1, m2, db, sa, i, acc);
#pragma unroll
    for (int k = 0; k < 4; ++k) abar[(i64)c * 4 * m1 + k * m1 + i] = acc[k];
  }
}
DPW_INSTANTIATE(contract_backward, CONTRACT_BACKWARD_PARAMS, (dims, a, dbar, abar))

// Per slot: R̄ = (1/nnei)(Āᵀ G) + e₀ (1/nnei)(G'·Ā R̂), q = Jᵀ R̄. One warp per slot: lanes take
// the M1 rows, then a butterfly shuffle (a fixed tree, so deterministic) sums the lanes.
// Shared memory: Ā [M1][4]. Assumes blockDim.x is a multiple of 32.
#define SLOT_BACKWARD_PARAMS(T)                                                            \
  (const int* __restrict__ dims, const T* __restrict__ abar, const T* __restrict__ g,      \
   const T* __restrict__ gp, const T* __restrict__ rhat, const T* __restrict__ jac,        \
   T* __restrict__ q)

template <typename T>
__device__ void slot_backward SLOT_BACKWARD_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1();
  T inv = T(1.0 / (double)d.nnei());
  T* sab = shared_buffer<T>();
  load_rows(sab, abar + (i64)c * 4 * m1, m1);
  __syncthreads();
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  int ti = d.centre_type(c);
  int local = 0;  // index of the slot among the centre's nnei slots
  for (int tj = 0; tj < d.ntypes(); ++tj) {
    int first = d.first_slot(ti, c, tj);
    for (int j = 0; j < d.sel(tj); ++j, ++local) {
      if (local % nwarps != warp) continue;
      i64 s = first + j;
      T rh[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) rh[k] = rhat[4 * s + k];
      T rb[4] = {T(0), T(0), T(0), T(0)};
      for (int i = lane; i < m1; i += 32) {
        const T* arow = sab + 4 * i;
        T gv = g[s * m1 + i];
        T dot = T(0);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          rb[k] += arow[k] * gv;
          dot += arow[k] * rh[k];
        }
        rb[0] += gp[s * m1 + i] * dot;
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2)
#pragma unroll
        for (int k = 0; k < 4; ++k) rb[k] += __shfl_xor_sync(0xffffffffu, rb[k], off);
      if (lane < 3) {
        T acc = T(0);
#pragma unroll
        for (int k = 0; k < 4; ++k) acc += jac[12 * s + 3 * k + lane] * rb[k];
        q[3 * s + lane] = inv * acc;
      }
    }
  }
}
DPW_INSTANTIATE(slot_backward, SLOT_BACKWARD_PARAMS, (dims, abar, g, gp, rhat, jac, q))

// Ȧ = (1/nnei) Σ (G' ṡ ⊗ R̂ + G ⊗ Ṙ) with ṡ = Ṙ[0], and Ḋ = Ȧ A<ᵀ + A Ȧ<ᵀ.
// Shared memory: Ȧ then A, [M1][4] each.
#define CONTRACT_TANGENT_PARAMS(T)                                                         \
  (const int* __restrict__ dims, const T* __restrict__ g, const T* __restrict__ gp,        \
   const T* __restrict__ rhat, const T* __restrict__ rdot, const T* __restrict__ a,        \
   T* __restrict__ adot, T* __restrict__ ddot)

template <typename T>
__device__ void contract_tangent CONTRACT_TANGENT_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2(), ti = d.centre_type(c);
  T inv = T(1.0 / (double)d.nnei());
  T* sad = shared_buffer<T>();
  T* sa = sad + 4 * m1;
  load_rows(sa, a + (i64)c * 4 * m1, m1);
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T acc[4] = {T(0), T(0), T(0), T(0)};
    for (int tj = 0; tj < d.ntypes(); ++tj) {
      i64 first = d.first_slot(ti, c, tj);
      for (i64 s = first; s < first + d.sel(tj); ++s) {
        T sdot = rdot[4 * s];
        T gv = g[s * m1 + i];
        T gd = gp[s * m1 + i] * sdot;
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[k] += gd * rhat[4 * s + k] + gv * rdot[4 * s + k];
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      T v = acc[k] * inv;
      sad[4 * i + k] = v;
      adot[(i64)c * 4 * m1 + k * m1 + i] = v;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < m1 * m2; e += blockDim.x) {
    int i = e / m2, b = e % m2;
    T v = T(0) + outer_entry(sad, sa, i, b);
    ddot[(i64)c * m1 * m2 + e] = v + outer_entry(sa, sad, i, b);
  }
}
DPW_INSTANTIATE(contract_tangent, CONTRACT_TANGENT_PARAMS, (dims, g, gp, rhat, rdot, a, adot, ddot))

// Dual reverse of the contraction down to the slots. Per centre, with B the adjoint of
// D = A A<ᵀ: Ā = B(D̄, A) + B(Ḋ̄, Ȧ), Ǡ = B(Ḋ̄, A); then per slot
// Ḡ = (1/nnei)(Ā R̂ + Ǡ Ṙ), Ġ̄ = (1/nnei) Ǡ R̂. Shared memory: A, Ȧ, Ā, Ǡ, [M1][4] each.
#define CONTRACT_DUAL_PARAMS(T)                                                            \
  (const int* __restrict__ dims, const T* __restrict__ a, const T* __restrict__ adot,      \
   const T* __restrict__ dbar, const T* __restrict__ ddotbar, const T* __restrict__ rhat,  \
   const T* __restrict__ rdot, T* __restrict__ gbar, T* __restrict__ gdotbar)

template <typename T>
__device__ void contract_dual CONTRACT_DUAL_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2();
  T inv = T(1.0 / (double)d.nnei());
  T* sa = shared_buffer<T>();
  T* sad = sa + 4 * m1;
  T* sab = sad + 4 * m1;
  T* sadb = sab + 4 * m1;
  load_rows(sa, a + (i64)c * 4 * m1, m1);
  load_rows(sad, adot + (i64)c * 4 * m1, m1);
  __syncthreads();
  const T* db = dbar + (i64)c * m1 * m2;
  const T* ddb = ddotbar + (i64)c * m1 * m2;
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T ab[4] = {T(0), T(0), T(0), T(0)};
    T adb[4] = {T(0), T(0), T(0), T(0)};
    axis_backward_row(m1, m2, db, sa, i, ab);
    axis_backward_row(m1, m2, ddb, sad, i, ab);
    axis_backward_row(m1, m2, ddb, sa, i, adb);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      sab[4 * i + k] = ab[k];
      sadb[4 * i + k] = adb[k];
    }
  }
  __syncthreads();
  int ti = d.centre_type(c);
  for (int tj = 0; tj < d.ntypes(); ++tj) {
    i64 first = d.first_slot(ti, c, tj);
    for (i64 s = first; s < first + d.sel(tj); ++s) {
      T rh[4], rd[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        rh[k] = rhat[4 * s + k];
        rd[k] = rdot[4 * s + k];
      }
      for (int i = threadIdx.x; i < m1; i += blockDim.x) {
        T gb = T(0), gdb = T(0);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          gb += sab[4 * i + k] * rh[k] + sadb[4 * i + k] * rd[k];
          gdb += sadb[4 * i + k] * rh[k];
        }
        gbar[s * m1 + i] = inv * gb;
        gdotbar[s * m1 + i] = inv * gdb;
      }
    }
  }
}
DPW_INSTANTIATE(contract_dual, CONTRACT_DUAL_PARAMS, (dims, a, adot, dbar, ddotbar, rhat, rdot, gbar, gdotbar))

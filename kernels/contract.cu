// The descriptor contraction A = (1/nnei) Σ_slots G ⊗ R̂, D = A A<ᵀ, and its derivatives (CPU
// reference: src/backend/cpu/contract.rs). One thread block per centre (slot_backward: several):
// a centre's slots are one run of sel[tj] rows in each block (ti, tj), visited section by
// section (tj) in slot order, as on the CPU, and each thread owns whole rows of the per-centre
// matrices, so every sum has a fixed order.
// Slot data is staged in shared memory a tile at a time (CONTRACT_TILE slots of G, G', R̂, Ṙ,
// generated from src/backend/gpu_layout.rs), loaded by the whole block with coalesced loads,
// and the row sums then run through the tile in slot order. Threads that loaded their slot's
// rows one at a time from global memory as they summed waited one load latency per slot: on an
// H100 (run 7, water, float64, batch 1) contract_forward took 65 µs, contract_tangent 79 µs,
// contract_dual 106 µs.
// Per-centre matrices sit in dynamic shared memory: A, Ȧ, Ā, Ǡ are [M1][4], D, Ḋ [M1][M2]. In
// global memory the A-shaped buffers are [4][M1] per centre, the layout every backend shares
// (Backend::contract_forward): a row of threads writes and reads them coalesced.

template <typename T>
__device__ __forceinline__ T* shared_buffer() {
  extern __shared__ unsigned char dpw_shared[];
  return reinterpret_cast<T*>(dpw_shared);
}

// n consecutive values of global memory into shared memory, by the whole block.
template <typename T>
__device__ __forceinline__ void load_tile(T* shared, const T* __restrict__ global, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) shared[e] = global[e];
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

// The adjoint of D = A A<ᵀ for row i of Ā: Σ_b D̄[i][b] A[b] + [i < M2] Σ_i' D̄[i'][i] A[i'],
// with the centre's D̄ [M1][M2] and A [M1][4] in shared memory.
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

// The per-centre sum shared by contract_forward and contract_tangent: rows [M1][4] of `sums` in
// shared memory are zeroed, then the centre's slots are visited section by section, a tile at a
// time in slot order: `load(s0, n)` stages slots s0..s0+n (called by the whole block), and
// `add(i, j, acc)` adds the tile's slot j to row i's running sums acc[4]. Finally each row is
// scaled by 1/nnei, kept in `sums` and written to `out`'s [4][M1] block of centre c.
template <typename T, typename Load, typename Add>
__device__ __forceinline__ void sum_slot_tiles(const Dims& d, int c, T* sums, T* __restrict__ out,
                                               Load load, Add add) {
  int m1 = d.m1(), ti = d.centre_type(c);
  T inv = T(1.0 / (double)d.nnei());
  // Rows of sums are only ever touched by the thread that owns them until the last barrier.
  for (int i = threadIdx.x; i < m1; i += blockDim.x)
#pragma unroll
    for (int k = 0; k < 4; ++k) sums[4 * i + k] = T(0);
  for (int tj = 0; tj < d.nsec(); ++tj) {
    i64 first = d.first_slot(ti, c, tj);
    int sel = d.sel(tj);
    for (int base = 0; base < sel; base += CONTRACT_TILE) {
      int n = min(CONTRACT_TILE, sel - base);
      __syncthreads();  // the last tile is read
      load(first + base, n);
      __syncthreads();
      for (int i = threadIdx.x; i < m1; i += blockDim.x) {
        T acc[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[k] = sums[4 * i + k];
        for (int j = 0; j < n; ++j) add(i, j, acc);
#pragma unroll
        for (int k = 0; k < 4; ++k) sums[4 * i + k] = acc[k];
      }
    }
  }
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      T v = sums[4 * i + k] * inv;
      sums[4 * i + k] = v;
      out[(i64)c * 4 * m1 + k * m1 + i] = v;
    }
  }
  __syncthreads();
}

// A_c and D_c. Shared memory: A [M1][4] (the running sums, then A), then a tile of slots:
// G [CONTRACT_TILE][M1], R̂ [CONTRACT_TILE][4].
#define CONTRACT_FORWARD_PARAMS(T)                                                        \
  (const int* __restrict__ dims, const T* __restrict__ g, const T* __restrict__ rhat,     \
   T* __restrict__ a_out, T* __restrict__ desc)

template <typename T>
__device__ void contract_forward CONTRACT_FORWARD_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2();
  T* sa = shared_buffer<T>();
  T* sg = sa + 4 * m1;
  T* sr = sg + CONTRACT_TILE * m1;
  sum_slot_tiles(
      d, c, sa, a_out,
      [&](i64 s0, int n) {
        load_tile(sg, g + s0 * m1, n * m1);
        load_tile(sr, rhat + 4 * s0, 4 * n);
      },
      [&](int i, int j, T acc[4]) {
        T gv = sg[j * m1 + i];
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[k] += gv * sr[4 * j + k];
      });
  for (int e = threadIdx.x; e < m1 * m2; e += blockDim.x)
    desc[(i64)c * m1 * m2 + e] = outer_entry(sa, sa, e / m2, e % m2);
}
DPW_INSTANTIATE(contract_forward, CONTRACT_FORWARD_PARAMS, (dims, g, rhat, a_out, desc))

// Ā = D̄ A< + [D̄ᵀ A] in the first M2 rows. Shared memory: A [M1][4], the centre's D̄ [M1][M2]
// (its columns are read down the rows: 11 µs from global memory on an H100, run 7).
#define CONTRACT_BACKWARD_PARAMS(T) \
  (const int* __restrict__ dims, const T* __restrict__ a, const T* __restrict__ dbar, T* __restrict__ abar)

template <typename T>
__device__ void contract_backward CONTRACT_BACKWARD_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2();
  T* sa = shared_buffer<T>();
  T* sdb = sa + 4 * m1;
  load_rows(sa, a + (i64)c * 4 * m1, m1);
  load_tile(sdb, dbar + (i64)c * m1 * m2, m1 * m2);
  __syncthreads();
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T acc[4] = {T(0), T(0), T(0), T(0)};
    axis_backward_row(m1, m2, sdb, sa, i, acc);
#pragma unroll
    for (int k = 0; k < 4; ++k) abar[(i64)c * 4 * m1 + k * m1 + i] = acc[k];
  }
}
DPW_INSTANTIATE(contract_backward, CONTRACT_BACKWARD_PARAMS, (dims, a, dbar, abar))

// Per slot: R̄ = (1/nnei)(Āᵀ G) + e₀ (1/nnei)(G'·Ā R̂), q = Jᵀ R̄. One warp per slot: lanes take
// the M1 rows, then a butterfly shuffle (a fixed tree, so deterministic) sums the lanes.
// gridDim.y blocks per centre share its slots, warp w of them taking the slots w, w + W, ...
// (W warps in all): one block of 4 warps per centre took 121 µs on an H100 (run 7, water,
// float64, batch 1: 6 warps per SM, each waiting on its loads slot after slot).
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
  int lane = threadIdx.x % 32, nwarps = gridDim.y * (blockDim.x / 32);
  int warp = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  int ti = d.centre_type(c);
  int local = 0;  // index of the slot among the centre's nnei slots
  for (int tj = 0; tj < d.nsec(); ++tj) {
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
// Shared memory: Ȧ (the running sums, then Ȧ) and A, [M1][4] each, then a tile of slots:
// G and G' [CONTRACT_TILE][M1] each, R̂ and Ṙ [CONTRACT_TILE][4] each.
#define CONTRACT_TANGENT_PARAMS(T)                                                         \
  (const int* __restrict__ dims, const T* __restrict__ g, const T* __restrict__ gp,        \
   const T* __restrict__ rhat, const T* __restrict__ rdot, const T* __restrict__ a,        \
   T* __restrict__ adot, T* __restrict__ ddot)

template <typename T>
__device__ void contract_tangent CONTRACT_TANGENT_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1(), m2 = d.m2();
  T* sad = shared_buffer<T>();
  T* sa = sad + 4 * m1;
  T* sg = sa + 4 * m1;
  T* sgp = sg + CONTRACT_TILE * m1;
  T* srh = sgp + CONTRACT_TILE * m1;
  T* srd = srh + 4 * CONTRACT_TILE;
  load_rows(sa, a + (i64)c * 4 * m1, m1);
  sum_slot_tiles(
      d, c, sad, adot,
      [&](i64 s0, int n) {
        load_tile(sg, g + s0 * m1, n * m1);
        load_tile(sgp, gp + s0 * m1, n * m1);
        load_tile(srh, rhat + 4 * s0, 4 * n);
        load_tile(srd, rdot + 4 * s0, 4 * n);
      },
      [&](int i, int j, T acc[4]) {
        T sdot = srd[4 * j];
        T gv = sg[j * m1 + i];
        T gd = sgp[j * m1 + i] * sdot;
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[k] += gd * srh[4 * j + k] + gv * srd[4 * j + k];
      });
  for (int e = threadIdx.x; e < m1 * m2; e += blockDim.x) {
    int i = e / m2, b = e % m2;
    T v = T(0) + outer_entry(sad, sa, i, b);
    ddot[(i64)c * m1 * m2 + e] = v + outer_entry(sa, sad, i, b);
  }
}
DPW_INSTANTIATE(contract_tangent, CONTRACT_TANGENT_PARAMS, (dims, g, gp, rhat, rdot, a, adot, ddot))

// Dual reverse of the contraction down to the slots. Per centre, with B the adjoint of
// D = A A<ᵀ: Ā = B(D̄, A) + B(Ḋ̄, Ȧ), Ǡ = B(Ḋ̄, A); then per slot
// Ḡ = (1/nnei)(Ā R̂ + Ǡ Ṙ), Ġ̄ = (1/nnei) Ǡ R̂, the block's threads spread over a tile's
// (slot, row) pairs. Shared memory: A, Ȧ, Ā, Ǡ, [M1][4] each; one [M1][M2] matrix, D̄ then Ḋ̄;
// R̂ and Ṙ of a tile of 4 · CONTRACT_TILE slots, [4 · CONTRACT_TILE][4] each.
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
  T* sdb = sadb + 4 * m1;
  T* srh = sdb + m1 * m2;
  T* srd = srh + 16 * CONTRACT_TILE;
  load_rows(sa, a + (i64)c * 4 * m1, m1);
  load_rows(sad, adot + (i64)c * 4 * m1, m1);
  load_tile(sdb, dbar + (i64)c * m1 * m2, m1 * m2);
  __syncthreads();
  // Ā's first term; a thread's rows of Ā wait in sab (only it touches them) for the rest.
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T ab[4] = {T(0), T(0), T(0), T(0)};
    axis_backward_row(m1, m2, sdb, sa, i, ab);
#pragma unroll
    for (int k = 0; k < 4; ++k) sab[4 * i + k] = ab[k];
  }
  __syncthreads();  // D̄ is read
  load_tile(sdb, ddotbar + (i64)c * m1 * m2, m1 * m2);
  __syncthreads();
  for (int i = threadIdx.x; i < m1; i += blockDim.x) {
    T ab[4], adb[4] = {T(0), T(0), T(0), T(0)};
#pragma unroll
    for (int k = 0; k < 4; ++k) ab[k] = sab[4 * i + k];
    axis_backward_row(m1, m2, sdb, sad, i, ab);
    axis_backward_row(m1, m2, sdb, sa, i, adb);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      sab[4 * i + k] = ab[k];
      sadb[4 * i + k] = adb[k];
    }
  }
  int ti = d.centre_type(c);
  for (int tj = 0; tj < d.nsec(); ++tj) {
    i64 first = d.first_slot(ti, c, tj);
    int sel = d.sel(tj);
    for (int base = 0; base < sel; base += 4 * CONTRACT_TILE) {
      int n = min(4 * CONTRACT_TILE, sel - base);
      i64 s0 = first + base;
      __syncthreads();  // Ā and Ǡ are written, the last tile is read
      load_tile(srh, rhat + 4 * s0, 4 * n);
      load_tile(srd, rdot + 4 * s0, 4 * n);
      __syncthreads();
      // The tile's outputs are the n · M1 consecutive values from s0 · M1 on.
      for (int e = threadIdx.x; e < n * m1; e += blockDim.x) {
        int j = e / m1, i = e % m1;
        T rh[4], rd[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          rh[k] = srh[4 * j + k];
          rd[k] = srd[4 * j + k];
        }
        T gb = T(0), gdb = T(0);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          gb += sab[4 * i + k] * rh[k] + sadb[4 * i + k] * rd[k];
          gdb += sadb[4 * i + k] * rh[k];
        }
        gbar[s0 * m1 + e] = inv * gb;
        gdotbar[s0 * m1 + e] = inv * gdb;
      }
    }
  }
}
DPW_INSTANTIATE(contract_dual, CONTRACT_DUAL_PARAMS, (dims, a, adot, dbar, ddotbar, rhat, rdot, gbar, gdotbar))

// Ḡ[slot] += (1/nnei) Ā R̂[slot] over the block's centre's slots: A's reverse into G from an Ā
// that reaches A from outside D (a tensor fitting's ∂L/∂gr). Shared memory: Ā [M1][4].
#define CONTRACT_GBAR_PARAMS(T) \
  (const int* __restrict__ dims, const T* __restrict__ abar, const T* __restrict__ rhat, T* __restrict__ gbar)

template <typename T>
__device__ void contract_gbar CONTRACT_GBAR_PARAMS(T) {
  Dims d(dims);
  int c = blockIdx.x, m1 = d.m1();
  T inv = T(1.0 / (double)d.nnei());
  T* sab = shared_buffer<T>();
  load_rows(sab, abar + (i64)c * 4 * m1, m1);
  __syncthreads();
  int ti = d.centre_type(c);
  for (int tj = 0; tj < d.nsec(); ++tj) {
    i64 first = d.first_slot(ti, c, tj);
    for (int e = threadIdx.x; e < d.sel(tj) * m1; e += blockDim.x) {
      int j = e / m1, i = e % m1;
      const T* rh = rhat + 4 * (first + j);
      T gb = T(0);
#pragma unroll
      for (int k = 0; k < 4; ++k) gb += sab[4 * i + k] * rh[k];
      gbar[first * m1 + e] += inv * gb;
    }
  }
}
DPW_INSTANTIATE(contract_gbar, CONTRACT_GBAR_PARAMS, (dims, abar, rhat, gbar))

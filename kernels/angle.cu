// se_e3's pair values e = r̃_j·r̃_k, its descriptor D_c = Σ_p w_p e_p G_p and their derivatives
// over the pair rows of Dims::pairs (CPU reference: src/backend/cpu/angle.rs). Per-row kernels
// are launched once per block (centre type, pair type), per-slot ones once per slot block
// (AngleParams, declared from src/backend/gpu_layout.rs), so that a row or a slot finds its
// centre by division; per-centre kernels run one thread per (centre, column of D) and visit the
// centre's rows in the CPU's order, as do the per-slot sums.

// w of pair type (ti, tj): 1/(sel_ti·sel_tj) in double, then rounded to T, as the CPU rounds it.
template <typename T>
__device__ __forceinline__ T pair_weight(const Dims& d, int ti, int tj) {
  return T(1.0 / (double)(d.sel(ti) * d.sel(tj)));
}

// r̃_s = R̂_s[1..4].
template <typename T>
__device__ __forceinline__ void dir(const T* __restrict__ rhat, i64 s, T out[3]) {
#pragma unroll
  for (int x = 0; x < 3; ++x) out[x] = rhat[4 * s + 1 + x];
}

// x·y summed as the CPU's dot3.
template <typename T>
__device__ __forceinline__ T dot3(const T x[3], const T y[3]) {
  return x[0] * y[0] + x[1] * y[1] + x[2] * y[2];
}

// First row of centre c (of type tc) of a pair type with n rows per centre, `before` rows per
// centre being those of the pair types before it (the block formula of AngleParams).
__device__ __forceinline__ i64 first_row(const Dims& d, const AngleParams& u, int tc, int c,
                                         int before, int n) {
  int c0 = d.centre_start(tc);
  return (i64)c0 * u.pair_rows + (i64)(d.centre_start(tc + 1) - c0) * before + (i64)(c - c0) * n;
}

// Row `id` of the launched pair block: its centre and the slots j and k.
__device__ __forceinline__ void pair_slots(const Dims& d, const AngleParams& u, int id, int& c,
                                           i64& sj, i64& sk) {
  int nk = d.sel(u.tj), njk = d.sel(u.ti) * nk;
  c = u.centre0 + id / njk;
  int jk = id % njk;
  sj = d.first_slot(u.tc, c, u.ti) + jk / nk;
  sk = d.first_slot(u.tc, c, u.tj) + jk % nk;
}

// The CPU's dot (cpu/contract.rs): eight interleaved partial sums, then the tail.
template <typename T>
__device__ __forceinline__ T dot_as_cpu(const T* __restrict__ x, const T* __restrict__ y, int n) {
  T acc[8] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
  int body = n - n % 8;
  for (int i = 0; i < body; i += 8) {
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += x[i + k] * y[i + k];
  }
  T tail = T(0);
  for (int i = body; i < n; ++i) tail += x[i] * y[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

#define ANGLE_VALUES_PARAMS(T) \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ rhat, T* __restrict__ e)

template <typename T>
__device__ void angle_values ANGLE_VALUES_PARAMS(T) {
  Dims d(dims);
  i64 id = global_index();
  if (id >= u.nrows) return;
  int c;
  i64 sj, sk;
  pair_slots(d, u, (int)id, c, sj, sk);
  T xj[3], xk[3];
  dir(rhat, sj, xj);
  dir(rhat, sk, xk);
  e[u.row0 + id] = dot3(xj, xk);
}
DPW_INSTANTIATE(angle_values, ANGLE_VALUES_PARAMS, (u, dims, rhat, e))

#define ANGLE_VALUES_TANGENT_PARAMS(T)                                                    \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ rhat,               \
   const T* __restrict__ rdot, T* __restrict__ edot)

template <typename T>
__device__ void angle_values_tangent ANGLE_VALUES_TANGENT_PARAMS(T) {
  Dims d(dims);
  i64 id = global_index();
  if (id >= u.nrows) return;
  int c;
  i64 sj, sk;
  pair_slots(d, u, (int)id, c, sj, sk);
  T xj[3], xk[3], vj[3], vk[3];
  dir(rhat, sj, xj);
  dir(rhat, sk, xk);
  dir(rdot, sj, vj);
  dir(rdot, sk, vk);
  edot[u.row0 + id] = dot3(vj, xk) + dot3(xj, vk);
}
DPW_INSTANTIATE(angle_values_tangent, ANGLE_VALUES_TANGENT_PARAMS, (u, dims, rhat, rdot, edot))

// out[c][i] = Σ_rows of c w e G[row][i] (D, edot null), or Σ w ė (G + e G')[row][i] (Ḋ), one
// thread per (c, i): neighbouring threads read neighbouring columns, and each sum runs over
// the pair types in order and each type's rows j-major, as on the CPU.
template <typename T>
__device__ __forceinline__ void pair_sum(const AngleParams& u, const int* __restrict__ dims,
                                         const T* __restrict__ e, const T* __restrict__ edot,
                                         const T* __restrict__ g, const T* __restrict__ gp,
                                         T* __restrict__ out) {
  Dims d(dims);
  int m1 = u.m1;
  i64 id = global_index();
  if (id >= (i64)u.ncentres * m1) return;
  int c = (int)(id / m1), i = (int)(id % m1), tc = d.centre_type(c);
  T acc = T(0);
  int before = 0;
  for (int tj = 0; tj < d.nsec(); ++tj) {
    for (int ti = 0; ti <= tj; ++ti) {
      int n = d.sel(ti) * d.sel(tj);
      T w = pair_weight<T>(d, ti, tj);
      i64 r0 = first_row(d, u, tc, c, before, n);
      for (i64 r = r0; r < r0 + n; ++r) {
        i64 x = r * m1 + i;
        if (edot)
          acc += (w * edot[r]) * (g[x] + e[r] * gp[x]);
        else
          acc += (w * e[r]) * g[x];
      }
      before += n;
    }
  }
  out[id] = acc;
}

#define ANGLE_FORWARD_PARAMS(T)                                                           \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ e,                  \
   const T* __restrict__ g, T* __restrict__ desc)

template <typename T>
__device__ void angle_forward ANGLE_FORWARD_PARAMS(T) {
  pair_sum<T>(u, dims, e, nullptr, g, nullptr, desc);
}
DPW_INSTANTIATE(angle_forward, ANGLE_FORWARD_PARAMS, (u, dims, e, g, desc))

#define ANGLE_TANGENT_PARAMS(T)                                                           \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ e,                  \
   const T* __restrict__ edot, const T* __restrict__ g, const T* __restrict__ gp,         \
   T* __restrict__ ddot)

template <typename T>
__device__ void angle_tangent ANGLE_TANGENT_PARAMS(T) {
  pair_sum<T>(u, dims, e, edot, g, gp, ddot);
}
DPW_INSTANTIATE(angle_tangent, ANGLE_TANGENT_PARAMS, (u, dims, e, edot, g, gp, ddot))

// Per pair row of one block: ē = w (D̄_c·G + e D̄_c·G'), each dot in the CPU's order.
#define ANGLE_BACKWARD_PAIRS_PARAMS(T)                                                    \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ e,                  \
   const T* __restrict__ g, const T* __restrict__ gp, const T* __restrict__ dbar,         \
   T* __restrict__ ebar)

template <typename T>
__device__ void angle_backward_pairs ANGLE_BACKWARD_PAIRS_PARAMS(T) {
  Dims d(dims);
  i64 id = global_index();
  if (id >= u.nrows) return;
  int m1 = u.m1;
  i64 r = u.row0 + id;
  const T* dc = dbar + (i64)(u.centre0 + id / (d.sel(u.ti) * d.sel(u.tj))) * m1;
  T sg = dot_as_cpu(dc, g + r * m1, m1), sgp = dot_as_cpu(dc, gp + r * m1, m1);
  ebar[r] = pair_weight<T>(d, u.ti, u.tj) * (sg + e[r] * sgp);
}
DPW_INSTANTIATE(angle_backward_pairs, ANGLE_BACKWARD_PAIRS_PARAMS, (u, dims, e, g, gp, dbar, ebar))

// Per slot of one slot block (neighbour type u.ti): r̃̄ = Σ ē_jk r̃_k over its rows as j, plus
// Σ ē_jk r̃_j over its rows as k, added in the CPU's row order (a row (m, m) gives both, j's
// first); then q = J[1..4]ᵀ r̃̄.
#define ANGLE_BACKWARD_SLOTS_PARAMS(T)                                                    \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ rhat,               \
   const T* __restrict__ jac, const T* __restrict__ ebar, T* __restrict__ q)

template <typename T>
__device__ void angle_backward_slots ANGLE_BACKWARD_SLOTS_PARAMS(T) {
  Dims d(dims);
  i64 id = global_index();
  if (id >= u.nrows) return;
  i64 s = u.row0 + id;
  int t = u.ti, m = (int)(id % d.sel(t)), c = u.centre0 + (int)(id / d.sel(t));
  T xb[3] = {T(0), T(0), T(0)}, x[3];
  int before = 0;
  for (int tj = 0; tj < d.nsec(); ++tj) {
    for (int ti = 0; ti <= tj; ++ti) {
      int nj = d.sel(ti), nk = d.sel(tj);
      if (ti == t || tj == t) {
        i64 r0 = first_row(d, u, u.tc, c, before, nj * nk);
        i64 sj0 = d.first_slot(u.tc, c, ti), sk0 = d.first_slot(u.tc, c, tj);
        for (int j = 0; j < nj; ++j) {
          if (ti == t && j == m) {
            for (int k = 0; k < nk; ++k) {
              T eb = ebar[r0 + (i64)j * nk + k];
              dir(rhat, sk0 + k, x);
#pragma unroll
              for (int a = 0; a < 3; ++a) xb[a] += eb * x[a];
              if (tj == t && k == m) {
                dir(rhat, sj0 + j, x);
#pragma unroll
                for (int a = 0; a < 3; ++a) xb[a] += eb * x[a];
              }
            }
          } else if (tj == t) {
            T eb = ebar[r0 + (i64)j * nk + m];
            dir(rhat, sj0 + j, x);
#pragma unroll
            for (int a = 0; a < 3; ++a) xb[a] += eb * x[a];
          }
        }
      }
      before += nj * nk;
    }
  }
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const T* jx = jac + 12 * s + k;
    q[3 * s + k] = jx[3] * xb[0] + jx[6] * xb[1] + jx[9] * xb[2];
  }
}
DPW_INSTANTIATE(angle_backward_slots, ANGLE_BACKWARD_SLOTS_PARAMS, (u, dims, rhat, jac, ebar, q))

// Per (pair row, i) of one block: Ḡ = (w e) D̄_c + (w ė) Ḋ̄_c, Ġ̄ = (w e) Ḋ̄_c.
#define ANGLE_DUAL_PARAMS(T)                                                              \
  (AngleParams u, const int* __restrict__ dims, const T* __restrict__ e,                  \
   const T* __restrict__ edot, const T* __restrict__ dbar, const T* __restrict__ ddotbar, \
   T* __restrict__ gbar, T* __restrict__ gdotbar)

template <typename T>
__device__ void angle_dual ANGLE_DUAL_PARAMS(T) {
  Dims d(dims);
  int m1 = u.m1;
  i64 id = global_index();
  if (id >= (i64)u.nrows * m1) return;
  i64 r = u.row0 + id / m1;
  int i = (int)(id % m1);
  i64 dc = (i64)(u.centre0 + (id / m1) / (d.sel(u.ti) * d.sel(u.tj))) * m1 + i;
  T w = pair_weight<T>(d, u.ti, u.tj);
  T a = w * e[r], b = w * edot[r];
  gbar[r * m1 + i] = a * dbar[dc] + b * ddotbar[dc];
  gdotbar[r * m1 + i] = a * ddotbar[dc];
}
DPW_INSTANTIATE(angle_dual, ANGLE_DUAL_PARAMS, (u, dims, e, edot, dbar, ddotbar, gbar, gdotbar))

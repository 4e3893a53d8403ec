// Dense layers on a row range [r0, r0 + rows) of row-major matrices (CPU reference:
// src/backend/cpu/dense.rs). The matrix products (xW, z̄Wᵀ, W̄ = xᵀz̄ + ẋᵀż̄) run in cuBLAS;
// these kernels are the element-wise parts around them and the bias / timestep reductions.
//
// Layer: z = xW + b, y = φ(z)·idt + skip(x), keeping h = tanh(z) of a tanh layer's outputs and z
// of the others' (of_kept, common.cuh), where
// skip is 0 (none), 1 (identity, nout == nin) or 2 (doubled [x, x], nout == 2 nin). `idt` is
// null when the layer has no timestep. Buffers indexed by global row (x, h, y, ...) are passed
// whole; "local" scratch buffers start at row r0. Every kernel takes the layer's scalars as one
// DenseParams (declared from src/backend/gpu_layout.rs).

// Value of skip(x) at output column k of a row (x_row points at the row's nin inputs).
template <typename T>
__device__ __forceinline__ T skip_value(int skip, const T* __restrict__ x_row, int nin, int k) {
  if (skip == 1) return x_row[k];
  if (skip == 2) return x_row[k % nin];  // y[:nin] += x and y[nin:] += x
  return T(0);
}

// Forward epilogue: on entry h holds xW for the rows; leaves in h what the layer keeps of
// z = xW + b, and y = φ(z)·idt + skip(x).
#define DENSE_FORWARD_PARAMS(T)                                                                \
  (DenseParams p, const T* __restrict__ b, const T* __restrict__ idt, const T* __restrict__ x, \
   T* __restrict__ h, T* __restrict__ y)

template <typename T>
__device__ void dense_forward DENSE_FORWARD_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)p.nrows * p.nout) return;
  i64 row = p.row0 + i / p.nout;
  int k = (int)(i % p.nout);
  i64 g = row * p.nout + k;
  T z = h[g] + b[k];
  T kept = p.act == 1 ? tanh(z) : z;
  h[g] = kept;
  T hv = of_kept(p, kept).v;
  T yv = idt ? hv * idt[k] : hv;
  y[g] = yv + skip_value(p.skip, x + row * p.nin, p.nin, k);
}
DPW_INSTANTIATE(dense_forward, DENSE_FORWARD_PARAMS, (p, b, idt, x, h, y))

// Backward, first half: z̄ = φ'(z) ⊙ (ȳ·idt) into local scratch (x̄ = z̄Wᵀ follows in cuBLAS).
#define DENSE_ZBAR_PARAMS(T)                                          \
  (DenseParams p, const T* __restrict__ idt, const T* __restrict__ h, \
   const T* __restrict__ ybar, T* __restrict__ zbar)

template <typename T>
__device__ void dense_zbar DENSE_ZBAR_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)p.nrows * p.nout) return;
  int k = (int)(i % p.nout);
  i64 g = (i64)p.row0 * p.nout + i;
  T yb = ybar[g];
  zbar[i] = of_kept(p, h[g]).d1 * (idt ? yb * idt[k] : yb);
}
DPW_INSTANTIATE(dense_zbar, DENSE_ZBAR_PARAMS, (p, idt, h, ybar, zbar))

// The adjoint of the skip connection, written into x̄ before the cuBLAS product adds z̄Wᵀ to it
// (beta = 1): identity gives ȳ, the doubled skip the sum of the two halves.
#define DENSE_SKIP_ADJOINT_PARAMS(T)                                \
  (DenseParams p, const T* __restrict__ ybar, T* __restrict__ xbar)

template <typename T>
__device__ void dense_skip_adjoint DENSE_SKIP_ADJOINT_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)p.nrows * p.nin) return;
  i64 row = p.row0 + i / p.nin;
  int k = (int)(i % p.nin);
  const T* yrow = ybar + row * p.nout;
  xbar[row * p.nin + k] = p.skip == 2 ? yrow[k] + yrow[k + p.nin] : yrow[k];
}
DPW_INSTANTIATE(dense_skip_adjoint, DENSE_SKIP_ADJOINT_PARAMS, (p, ybar, xbar))

// Tangent epilogue: on entry ż holds ẋW; writes ẏ = φ'(z) ż · idt + skip(ẋ).
#define DENSE_TANGENT_PARAMS(T)                                                 \
  (DenseParams p, const T* __restrict__ idt, const T* __restrict__ h,           \
   const T* __restrict__ xdot, const T* __restrict__ zdot, T* __restrict__ ydot)

template <typename T>
__device__ void dense_tangent DENSE_TANGENT_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)p.nrows * p.nout) return;
  i64 row = p.row0 + i / p.nout;
  int k = (int)(i % p.nout);
  i64 g = row * p.nout + k;
  T v = of_kept(p, h[g]).d1 * zdot[g];
  T yv = idt ? v * idt[k] : v;
  ydot[g] = yv + skip_value(p.skip, xdot + row * p.nin, p.nin, k);
}
DPW_INSTANTIATE(dense_tangent, DENSE_TANGENT_PARAMS, (p, idt, h, xdot, zdot, ydot))

// ẋ·scale[row] into local scratch (the embedding net stores tangents for a unit ṡ).
#define DENSE_SCALE_ROWS_PARAMS(T)                                                              \
  (DenseParams p, const T* __restrict__ xdot, const T* __restrict__ scale, T* __restrict__ out)

template <typename T>
__device__ void dense_scale_rows DENSE_SCALE_ROWS_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)p.nrows * p.nin) return;
  i64 row = p.row0 + i / p.nin;
  out[i] = xdot[(i64)p.row0 * p.nin + i] * scale[row];
}
DPW_INSTANTIATE(dense_scale_rows, DENSE_SCALE_ROWS_PARAMS, (p, xdot, scale, out))

// Dual reverse, element-wise part (docs/design.md §3.2 "dual reverse"), one thread per (row,
// output column k):
//   ż̄ = φ'(z) ⊙ ḣ̄,  z̄ = φ'(z) ⊙ h̄ + φ''(z) ⊙ ż ⊙ ḣ̄,  with h̄ = ȳ·idt, ḣ̄ = ẏ̄·idt,
// written to local scratch, and each row's term of īdt = Σ (ȳ h + ẏ̄ φ'(z) ż). dense_dual_sums
// then adds the rows of each chunk of `chunk` rows in row order (partials of b̄ = Σ z̄ and īdt),
// and dense_dual_finish the partials in chunk order: the CPU backend's summation order, with
// the same chunk size. (One kernel walking each chunk's rows per thread took 1.6 of the 3.8 ms
// of an H100's float64 step: a few hundred threads on the card.)
#define DENSE_DUAL_ELEMS_PARAMS(T)                                                     \
  (DenseParams p, const T* __restrict__ idt, const T* __restrict__ h,                  \
   const T* __restrict__ zdot, const T* __restrict__ scale, const T* __restrict__ ybar, \
   const T* __restrict__ ydotbar, T* __restrict__ zbar, T* __restrict__ zdbar,         \
   T* __restrict__ tidt)

template <typename T>
__device__ void dense_dual_elems DENSE_DUAL_ELEMS_PARAMS(T) {
  i64 l = global_index();
  if (l >= (i64)p.nrows * p.nout) return;
  int k = (int)(l % p.nout);
  i64 row = (i64)p.row0 + l / p.nout;
  i64 g = row * p.nout + k;
  Phi<T> phi = of_kept(p, h[g]);
  T zd = scale ? zdot[g] * scale[row] : zdot[g];
  T d1 = phi.d1;
  T hb = ybar[g], hdb = ydotbar[g];
  if (idt) {
    tidt[l] = hb * phi.v + hdb * d1 * zd;
    hb = hb * idt[k];
    hdb = hdb * idt[k];
  }
  zdbar[l] = d1 * hdb;
  zbar[l] = d1 * hb + phi.d2 * zd * hdb;
}
DPW_INSTANTIATE(dense_dual_elems, DENSE_DUAL_ELEMS_PARAMS,
                (p, idt, h, zdot, scale, ybar, ydotbar, zbar, zdbar, tidt))

#define DENSE_DUAL_SUMS_PARAMS(T)                                         \
  (DenseParams p, const T* __restrict__ zbar, const T* __restrict__ tidt, \
   T* __restrict__ part_b, T* __restrict__ part_idt)

// Σ over rows lo..hi of column k of x, in row order. The loads of ROWS rows are issued before
// their sums: the order of the additions is the cpu's, but a thread keeps ROWS loads in flight
// instead of one (there are only a few thousand threads, each walking a whole chunk).
template <typename T>
__device__ T column_sum(const T* __restrict__ x, int lo, int hi, int nout, int k) {
  constexpr int ROWS = 8;
  T s = T(0);
  int r = lo;
  for (; r + ROWS <= hi; r += ROWS) {
    T v[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; ++j) v[j] = x[(i64)(r + j) * nout + k];
#pragma unroll
    for (int j = 0; j < ROWS; ++j) s += v[j];
  }
  for (; r < hi; ++r) s += x[(i64)r * nout + k];
  return s;
}

template <typename T>
__device__ void dense_dual_sums DENSE_DUAL_SUMS_PARAMS(T) {
  int k = blockIdx.y * blockDim.x + threadIdx.x;
  if (k >= p.nout) return;
  int c = blockIdx.x;
  int lo = c * p.chunk, hi = min(p.nrows, lo + p.chunk);
  part_b[(i64)c * p.nout + k] = column_sum(zbar, lo, hi, p.nout, k);
  if (part_idt) part_idt[(i64)c * p.nout + k] = column_sum(tidt, lo, hi, p.nout, k);
}
DPW_INSTANTIATE(dense_dual_sums, DENSE_DUAL_SUMS_PARAMS, (p, zbar, tidt, part_b, part_idt))

// grad_b[k] += Σ_chunks part_b[chunk][k] in chunk order; the same for īdt when present.
#define DENSE_DUAL_FINISH_PARAMS(T)                                             \
  (DenseParams p, const T* __restrict__ part_b, const T* __restrict__ part_idt, \
   T* __restrict__ grad_b, T* __restrict__ grad_idt)

template <typename T>
__device__ void dense_dual_finish DENSE_DUAL_FINISH_PARAMS(T) {
  i64 k = global_index();
  if (k >= p.nout) return;
  T gb = grad_b[k];
  for (int c = 0; c < p.nchunks; ++c) gb += part_b[(i64)c * p.nout + k];
  grad_b[k] = gb;
  if (part_idt) {
    T gi = grad_idt[k];
    for (int c = 0; c < p.nchunks; ++c) gi += part_idt[(i64)c * p.nout + k];
    grad_idt[k] = gi;
  }
}
DPW_INSTANTIATE(dense_dual_finish, DENSE_DUAL_FINISH_PARAMS, (p, part_b, part_idt, grad_b, grad_idt))

// DPA-1's element-wise ops (CPU reference: their host bodies, src/backend/attn.rs): the switch
// σ and its slope per slot, the type-embedding rows and their adjoint, strip's G⁰ and its dual.
// The attention block itself runs on the host. The scalars come in an AttnParams (declared
// from src/backend/gpu_layout.rs). The sums over rows (T̄, τ̄) are partial sums over fixed
// chunks of rows, each in row order, then added in chunk order by one thread per entry.

// Per slot of centre type u.ti: σ and dσ/dŝ = (dσ/ds)·dstd[ti][0], s = σ/(r + p) the raw
// radial value (geometry::env_switch); 0 for padding and where ds/dr vanishes. In double for
// both precisions, then rounded to T, as the CPU does.
#define ATTN_SWITCH_PARAMS(T)                                                                 \
  (AttnParams u, double rcut, double rcut_smth, double protection, const T* __restrict__ rij, \
   const int* __restrict__ owner, const T* __restrict__ dstd, T* __restrict__ sw,             \
   T* __restrict__ dsw)

template <typename T>
__device__ void attn_switch ATTN_SWITCH_PARAMS(T) {
  i64 id = global_index();
  if (id >= u.nrows) return;
  i64 s = u.row0 + id;
  double value = 0.0, slope = 0.0;
  if (owner[s] >= 0) {
    double x[3] = {(double)rij[3 * s], (double)rij[3 * s + 1], (double)rij[3 * s + 2]};
    double r = sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]);
    double rr = r + protection;
    double dsw_dr;
    env_switch(r, rcut, rcut_smth, &value, &dsw_dr);
    double ds = dsw_dr / rr - value / (rr * rr);
    slope = ds == 0.0 ? 0.0 : dsw_dr / ds;
  }
  sw[s] = (T)value;
  dsw[s] = (T)(slope * (double)dstd[4 * u.ti]);
}
DPW_INSTANTIATE(attn_switch, ATTN_SWITCH_PARAMS,
                (u, rcut, rcut_smth, protection, rij, owner, dstd, sw, dsw))

// T[t][c] = W[t][c] (+ b[c]) (+ 1 where the skip connection maps c to t), in the host's order.
template <typename T>
__device__ __forceinline__ T tebd_value(const AttnParams& u, const T* __restrict__ params, int t,
                                        int c) {
  T v = params[u.w + t * u.width + c];
  if (u.has_b) v += params[u.b + c];
  if ((u.skip == 1 && c == t) || (u.skip == 2 && c % u.ntypes == t)) v += T(1);
  return v;
}

// Per (row, column) of one type list: out[row][col + c] = T[types[row]][c].
#define TEBD_ROWS_PARAMS(T)                                                   \
  (AttnParams u, const T* __restrict__ params, const int* __restrict__ types, \
   T* __restrict__ out)

template <typename T>
__device__ void tebd_rows TEBD_ROWS_PARAMS(T) {
  i64 id = global_index();
  if (id >= (i64)u.nrows * u.width) return;
  i64 r = id / u.width;
  int c = (int)(id % u.width);
  out[r * u.stride + u.col + c] = tebd_value(u, params, types[r], c);
}
DPW_INSTANTIATE(tebd_rows, TEBD_ROWS_PARAMS, (u, params, types, out))

// Per row: the lead column, out[row][col] = lead[row].
#define TEBD_ROWS_LEAD_PARAMS(T) (AttnParams u, const T* __restrict__ lead, T* __restrict__ out)

template <typename T>
__device__ void tebd_rows_lead TEBD_ROWS_LEAD_PARAMS(T) {
  i64 r = global_index();
  if (r < u.nrows) out[r * u.stride + u.col] = lead[r];
}
DPW_INSTANTIATE(tebd_rows_lead, TEBD_ROWS_LEAD_PARAMS, (u, lead, out))

// Per (chunk, column c) of one type list: the chunk's rows summed per type, in row order, each
// type's sum kept in its partial, which only this thread reads and writes.
#define TEBD_ROWS_BACKWARD_PARTS_PARAMS(T)                                  \
  (AttnParams u, const int* __restrict__ types, const T* __restrict__ xbar, \
   T* __restrict__ partial)

template <typename T>
__device__ void tebd_rows_backward_parts TEBD_ROWS_BACKWARD_PARTS_PARAMS(T) {
  i64 id = global_index();
  if (id >= (i64)u.nchunks * u.width) return;
  int chunk = (int)(id / u.width), c = (int)(id % u.width);
  T* part = partial + (i64)(u.part0 + chunk) * u.ntypes * u.width + c;
  for (int t = 0; t < u.ntypes; ++t) part[t * u.width] = T(0);
  i64 lo = (i64)chunk * u.chunk;
  i64 hi = min((i64)u.nrows, lo + u.chunk);
  for (i64 r = lo; r < hi; ++r) part[types[r] * u.width] += xbar[r * u.stride + u.col + c];
}
DPW_INSTANTIATE(tebd_rows_backward_parts, TEBD_ROWS_BACKWARD_PARTS_PARAMS,
                (u, types, xbar, partial))

// Per column c: T̄[t][c] from the partials of every list, in order; W̄[t][c] += T̄[t][c] and
// b̄[c] += T̄[t][c] type after type, as the host adds them.
#define TEBD_ROWS_BACKWARD_SUM_PARAMS(T) \
  (AttnParams u, const T* __restrict__ partial, T* __restrict__ grad)

template <typename T>
__device__ void tebd_rows_backward_sum TEBD_ROWS_BACKWARD_SUM_PARAMS(T) {
  i64 c = global_index();
  if (c >= u.width) return;
  int entries = u.ntypes * u.width;
  for (int t = 0; t < u.ntypes; ++t) {
    T tb = T(0);
    for (int p = 0; p < u.nparts; ++p) tb += partial[(i64)p * entries + t * u.width + c];
    grad[u.w + t * u.width + c] += tb;
    if (u.has_b) grad[u.b + c] += tb;
  }
}
DPW_INSTANTIATE(tebd_rows_backward_sum, TEBD_ROWS_BACKWARD_SUM_PARAMS, (u, partial, grad))

// Slot s's row of τ: t_j, or t_i·ntypes + t_j.
__device__ __forceinline__ int strip_row(const AttnParams& u, const int* __restrict__ nei_type,
                                         const int* __restrict__ centre_type, i64 s) {
  return u.one_side ? nei_type[s] : centre_type[s] * u.ntypes + nei_type[s];
}

// Slot s's c = σ (smooth) or 1, and c' = dc/dŝ.
template <typename T>
__device__ __forceinline__ void strip_c(const AttnParams& u, const T* __restrict__ sw,
                                        const T* __restrict__ dsw, i64 s, T& c, T& cp) {
  c = u.c_is_sw ? sw[s] : T(1);
  cp = u.c_is_sw ? dsw[s] : T(0);
}

// Per (slot, column): G⁰ = G_s (1 + c τ), G⁰' = G_s' (1 + c τ) + G_s τ c'.
#define STRIP_FORWARD_PARAMS(T)                                                              \
  (AttnParams u, const T* __restrict__ gs, const T* __restrict__ gsp,                        \
   const T* __restrict__ tau, const int* __restrict__ nei_type,                              \
   const int* __restrict__ centre_type, const T* __restrict__ sw, const T* __restrict__ dsw, \
   T* __restrict__ g0, T* __restrict__ g0p)

template <typename T>
__device__ void strip_forward STRIP_FORWARD_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)u.nrows * u.width) return;
  i64 s = i / u.width;
  T t = tau[(i64)strip_row(u, nei_type, centre_type, s) * u.width + i % u.width];
  T c, cp;
  strip_c(u, sw, dsw, s, c, cp);
  g0[i] = gs[i] * (T(1) + c * t);
  g0p[i] = gsp[i] * (T(1) + c * t) + gs[i] * t * cp;
}
DPW_INSTANTIATE(strip_forward, STRIP_FORWARD_PARAMS,
                (u, gs, gsp, tau, nei_type, centre_type, sw, dsw, g0, g0p))

// Per (slot, column): Ḡ_s = Ḡ⁰(1 + cτ) + Ġ̄⁰ τ ċ, Ġ̄_s = Ġ̄⁰(1 + cτ), ċ = c'ṡ.
#define STRIP_DUAL_PARAMS(T)                                                                 \
  (AttnParams u, const T* __restrict__ tau, const int* __restrict__ nei_type,                \
   const int* __restrict__ centre_type, const T* __restrict__ sw, const T* __restrict__ dsw, \
   const T* __restrict__ sdot, const T* __restrict__ g0bar, const T* __restrict__ g0dotbar,  \
   T* __restrict__ gsbar, T* __restrict__ gsdotbar)

template <typename T>
__device__ void strip_dual STRIP_DUAL_PARAMS(T) {
  i64 i = global_index();
  if (i >= (i64)u.nrows * u.width) return;
  i64 s = i / u.width;
  T t = tau[(i64)strip_row(u, nei_type, centre_type, s) * u.width + i % u.width];
  T c, cp;
  strip_c(u, sw, dsw, s, c, cp);
  T cdot = cp * sdot[s];
  T one = T(1) + c * t;
  gsbar[i] = g0bar[i] * one + g0dotbar[i] * t * cdot;
  gsdotbar[i] = g0dotbar[i] * one;
}
DPW_INSTANTIATE(strip_dual, STRIP_DUAL_PARAMS,
                (u, tau, nei_type, centre_type, sw, dsw, sdot, g0bar, g0dotbar, gsbar, gsdotbar))

// Per (chunk, column k): τ̄ = Ḡ⁰ G_s c + Ġ̄⁰ (G_s' ṡ c + G_s ċ) over the chunk's slots, in slot
// order, each row of τ's sum kept in its partial, which only this thread reads and writes.
#define STRIP_DUAL_PARTS_PARAMS(T)                                                   \
  (AttnParams u, const T* __restrict__ gs, const T* __restrict__ gsp,               \
   const int* __restrict__ nei_type, const int* __restrict__ centre_type,           \
   const T* __restrict__ sw, const T* __restrict__ dsw, const T* __restrict__ sdot, \
   const T* __restrict__ g0bar, const T* __restrict__ g0dotbar, T* __restrict__ partial)

template <typename T>
__device__ void strip_dual_parts STRIP_DUAL_PARTS_PARAMS(T) {
  i64 id = global_index();
  if (id >= (i64)u.nchunks * u.width) return;
  int chunk = (int)(id / u.width), k = (int)(id % u.width);
  T* part = partial + (i64)chunk * u.table_rows * u.width + k;
  for (int row = 0; row < u.table_rows; ++row) part[row * u.width] = T(0);
  i64 lo = (i64)chunk * u.chunk;
  i64 hi = min((i64)u.nrows, lo + u.chunk);
  for (i64 s = lo; s < hi; ++s) {
    i64 i = s * u.width + k;
    T c, cp;
    strip_c(u, sw, dsw, s, c, cp);
    T cdot = cp * sdot[s];
    T gsdot = gsp[i] * sdot[s];
    part[strip_row(u, nei_type, centre_type, s) * u.width] +=
        g0bar[i] * gs[i] * c + g0dotbar[i] * (gsdot * c + gs[i] * cdot);
  }
}
DPW_INSTANTIATE(strip_dual_parts, STRIP_DUAL_PARTS_PARAMS,
                (u, gs, gsp, nei_type, centre_type, sw, dsw, sdot, g0bar, g0dotbar, partial))

// Per entry of τ̄: its partials added in chunk order.
#define STRIP_DUAL_SUM_PARAMS(T) \
  (AttnParams u, const T* __restrict__ partial, T* __restrict__ taubar)

template <typename T>
__device__ void strip_dual_sum STRIP_DUAL_SUM_PARAMS(T) {
  i64 e = global_index();
  i64 entries = (i64)u.table_rows * u.width;
  if (e >= entries) return;
  T acc = T(0);
  for (int p = 0; p < u.nparts; ++p) acc += partial[p * entries + e];
  taubar[e] = acc;
}
DPW_INSTANTIATE(strip_dual_sum, STRIP_DUAL_SUM_PARAMS, (u, partial, taubar))

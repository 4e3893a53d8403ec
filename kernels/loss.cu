// Loss residuals and the virtual displacement that turns the force/virial terms of the loss
// into a tangent of the environment (CPU reference: src/backend/cpu/loss.rs; docs/design.md §3.2 "the
// second derivative").

// For one label array of n entries (LossParams): out[i] = T(num · (pred[i] − label[i]) / den),
// and per chunk of LOSS_CHUNK entries the sum of squared differences in double, in index order. The host adds the chunk
// sums in chunk order. num and den are the host's factors, e.g. 2·p_f and 3·N·nf, so the
// residual is rounded exactly as the CPU rounds it. num follows the learning rate: in a
// captured CUDA graph it is read from the device (num_at, written before each replay) so that
// the launch's arguments stay the same; otherwise num_at is null and num is used. One warp per
// chunk: lanes load 32 consecutive entries at a time (coalesced) and every lane adds the 32
// differences, fetched by shuffles, in index order (lane 0's sum is written). One thread per
// chunk of 256 took up to 43 µs on an H100 (run 7, water, batch 1: three threads for the forces).
#define LOSS_RESIDUAL_PARAMS(T)                                                              \
  (LossParams u, double num_arg, const double* __restrict__ num_at, double den,              \
   const T* __restrict__ pred, const T* __restrict__ label, T* __restrict__ out,             \
   double* __restrict__ part)

template <typename T>
__device__ void loss_residual LOSS_RESIDUAL_PARAMS(T) {
  i64 c = global_index() / 32;
  int lane = threadIdx.x % 32;
  i64 lo = c * LOSS_CHUNK;
  if (lo >= u.n) return;  // the whole warp
  i64 hi = min((i64)u.n, lo + LOSS_CHUNK);
  double num = num_at ? *num_at : num_arg;
  double acc = 0.0;
  for (i64 base = lo; base < hi; base += 32) {
    i64 i = base + lane;
    double diff = 0.0;
    if (i < hi) {
      diff = (double)pred[i] - (double)label[i];
      out[i] = (T)(num * diff / den);
    }
    int m = (int)min((i64)32, hi - base);
    for (int j = 0; j < m; ++j) {
      double dj = __shfl_sync(0xffffffffu, diff, j);
      acc += dj * dj;
    }
  }
  if (lane == 0) part[c] = acc;
}
DPW_INSTANTIATE(loss_residual, LOSS_RESIDUAL_PARAMS,
                (u, num_arg, num_at, den, pred, label, out, part))

// ebar[c] = ce[frame(c)]: ∂L/∂E of the centre's frame.
#define LOSS_EBAR_PARAMS(T) (const int* __restrict__ dims, const T* __restrict__ ce, T* __restrict__ ebar)

template <typename T>
__device__ void loss_ebar LOSS_EBAR_PARAMS(T) {
  Dims d(dims);
  i64 c = global_index();
  if (c >= d.ncentres()) return;
  ebar[c] = ce[d.centre_frame((int)c)];
}
DPW_INSTANTIATE(loss_ebar, LOSS_EBAR_PARAMS, (dims, ce, ebar))

// Per slot: u = fres_i − fres_owner − vres_frame · r_ij, Ṙ = J u, ṡ = Ṙ[0]; zero for padded
// slots. One thread per slot.
#define VIRTUAL_TANGENT_PARAMS(T)                                                           \
  (const int* __restrict__ dims, const T* __restrict__ fres, const T* __restrict__ vres,    \
   const T* __restrict__ jac, const T* __restrict__ rij, const int* __restrict__ owner,     \
   const int* __restrict__ centre_atom, T* __restrict__ rdot, T* __restrict__ sdot)

template <typename T>
__device__ void virtual_tangent VIRTUAL_TANGENT_PARAMS(T) {
  Dims d(dims);
  i64 s = global_index();
  if (s >= d.nslots()) return;
  int o = owner[s];
  if (o < 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) rdot[4 * s + k] = T(0);
    sdot[s] = T(0);
    return;
  }
  int c = d.slot_centre((int)s);
  i64 i = centre_atom[c];
  i64 fr = d.centre_frame(c);
  T u[3];
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    T wr = T(0);
#pragma unroll
    for (int b = 0; b < 3; ++b) wr += vres[9 * fr + 3 * a + b] * rij[3 * s + b];
    u[a] = fres[3 * i + a] - fres[3 * (i64)o + a] - wr;
  }
  T r0 = T(0);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    T acc = T(0);
#pragma unroll
    for (int a = 0; a < 3; ++a) acc += jac[12 * s + 3 * k + a] * u[a];
    rdot[4 * s + k] = acc;
    if (k == 0) r0 = acc;
  }
  sdot[s] = r0;
}
DPW_INSTANTIATE(virtual_tangent, VIRTUAL_TANGENT_PARAMS, (dims, fres, vres, jac, rij, owner, centre_atom, rdot, sdot))

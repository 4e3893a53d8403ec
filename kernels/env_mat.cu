// Environment matrix R̂ = (R − davg[t_i]) / dstd[t_i] and its derivative J = ∂R̂/∂r_ij
// (docs/deepmd-spec.md §3; CPU reference: src/backend/cpu/env_mat.rs). One thread per slot.
//
// The arithmetic runs in double for both precisions, then is rounded to T, exactly as the CPU
// backend does: the expressions below keep the CPU's order of operations.

#define ENV_MAT_PARAMS(T)                                                                  \
  (const int* __restrict__ dims, double rcut, double rcut_smth, double protection,         \
   const T* __restrict__ rij, const int* __restrict__ owner, const T* __restrict__ davg,   \
   const T* __restrict__ dstd, T* __restrict__ rhat, T* __restrict__ jac, T* __restrict__ s)

template <typename T>
__device__ void env_mat ENV_MAT_PARAMS(T) {
  Dims d(dims);
  i64 slot = global_index();
  if (slot >= d.nslots()) return;
  int ti = d.centre_type(d.slot_centre((int)slot));
  // Padded slots (owner < 0) have R = 0 and J = 0: they still get R̂ = −davg/dstd.
  double row[4] = {0.0, 0.0, 0.0, 0.0};
  double jc[4][3] = {{0.0, 0.0, 0.0}, {0.0, 0.0, 0.0}, {0.0, 0.0, 0.0}, {0.0, 0.0, 0.0}};
  if (owner[slot] >= 0) {
    double x[3] = {(double)rij[3 * slot], (double)rij[3 * slot + 1], (double)rij[3 * slot + 2]};
    double r = sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]);
    double rr = r + protection;
    double sw, dsw;
    env_switch(r, rcut, rcut_smth, &sw, &dsw);
    double unit[3] = {x[0] / r, x[1] / r, x[2] / r};
    row[0] = sw / rr;
    double d0 = dsw / rr - sw / (rr * rr);
    double dv = dsw / (rr * rr) - 2.0 * sw / (rr * rr * rr);
#pragma unroll
    for (int a = 0; a < 3; ++a) jc[0][a] = d0 * unit[a];
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      row[k + 1] = sw * x[k] / (rr * rr);
#pragma unroll
      for (int a = 0; a < 3; ++a)
        jc[k + 1][a] = x[k] * dv * unit[a] + (k == a ? sw / (rr * rr) : 0.0);
    }
  }
  T rh0 = T(0);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    double avg = (double)davg[4 * ti + k];
    double sd = (double)dstd[4 * ti + k];
    T rh = (T)((row[k] - avg) / sd);
    if (k == 0) rh0 = rh;
    rhat[4 * slot + k] = rh;
#pragma unroll
    for (int a = 0; a < 3; ++a) jac[12 * slot + 3 * k + a] = (T)(jc[k][a] / sd);
  }
  s[slot] = rh0;
}
DPW_INSTANTIATE(env_mat, ENV_MAT_PARAMS,
                (dims, rcut, rcut_smth, protection, rij, owner, davg, dstd, rhat, jac, s))

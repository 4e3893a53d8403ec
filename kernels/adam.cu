// Element-wise ops on whole vectors: Adam exactly as torch.optim.Adam computes it (CPU
// reference: src/backend/cpu/adam.rs; the host computes the bias corrections in double, as the
// CPU does), and fill.

#define ADAM_PARAMS(T)                                                                      \
  (i64 n, T step, T b1, T b2, T eps, T bc2, T* __restrict__ p, const T* __restrict__ grad,  \
   T* __restrict__ m, T* __restrict__ v)

template <typename T>
__device__ void adam ADAM_PARAMS(T) {
  i64 i = global_index();
  if (i >= n) return;
  T g = grad[i];
  T mi = m[i] * b1 + g * (T(1) - b1);
  T vi = v[i] * b2 + g * g * (T(1) - b2);
  m[i] = mi;
  v[i] = vi;
  T denom = sqrt(vi) / bc2 + eps;
  p[i] -= step * mi / denom;
}
DPW_INSTANTIATE(adam, ADAM_PARAMS, (n, step, b1, b2, eps, bc2, p, grad, m, v))

#define FILL_PARAMS(T) (i64 n, T value, T* __restrict__ out)

template <typename T>
__device__ void fill FILL_PARAMS(T) {
  i64 i = global_index();
  if (i < n) out[i] = value;
}
DPW_INSTANTIATE(fill, FILL_PARAMS, (n, value, out))

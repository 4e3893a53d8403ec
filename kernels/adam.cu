// Element-wise ops on whole vectors: Adam exactly as torch.optim.Adam computes it (CPU
// reference: src/backend/cpu/adam.rs; the host computes the bias corrections in double, as the
// CPU does), and fill. The vector's length comes in a VectorParams, the real scalars by value
// (rounded to T on the host, as the CPU rounds them).

// Entries from u.tail_from on take the tail's corrections (step_t, bc2_t), from u.fit_from on
// its fitting part's (step_f, bc2_f): a multi-task head's own step counts (AdamTail). Weight
// decay: p ×= keep before the update, g += l2·p (1 and 0 without decay: the same numbers).
#define ADAM_PARAMS(T)                                                                         \
  (VectorParams u, T step, T b1, T b2, T eps, T bc2, T step_t, T bc2_t, T step_f, T bc2_f,    \
   T keep, T l2, T* __restrict__ p, const T* __restrict__ grad, T* __restrict__ m,            \
   T* __restrict__ v)

template <typename T>
__device__ void adam ADAM_PARAMS(T) {
  i64 i = global_index();
  if (i >= u.n) return;
  T g = grad[i] + l2 * p[i];
  p[i] = p[i] * keep;
  T mi = m[i] * b1 + g * (T(1) - b1);
  T vi = v[i] * b2 + g * g * (T(1) - b2);
  m[i] = mi;
  v[i] = vi;
  bool fit = i >= u.fit_from, tail = i >= u.tail_from;
  T denom = sqrt(vi) / (fit ? bc2_f : tail ? bc2_t : bc2) + eps;
  p[i] -= (fit ? step_f : tail ? step_t : step) * mi / denom;
}
DPW_INSTANTIATE(adam, ADAM_PARAMS,
                (u, step, b1, b2, eps, bc2, step_t, bc2_t, step_f, bc2_f, keep, l2, p, grad, m,
                 v))

#define FILL_PARAMS(T) (VectorParams u, T value, T* __restrict__ out)

template <typename T>
__device__ void fill FILL_PARAMS(T) {
  i64 i = global_index();
  if (i < u.n) out[i] = value;
}
DPW_INSTANTIATE(fill, FILL_PARAMS, (u, value, out))

// Σ g² per chunk of LOSS_CHUNK values, in double, in index order: the partials of the gradient
// norm (Backend::clip_grad_norm), added in order by sum_parts.
#define GRAD_SQ_PARAMS(T) (VectorParams u, const T* __restrict__ g, double* __restrict__ part)

template <typename T>
__device__ void grad_sq GRAD_SQ_PARAMS(T) {
  i64 c = global_index();
  i64 lo = c * LOSS_CHUNK;
  if (lo >= u.n) return;
  i64 hi = min((i64)u.n, lo + LOSS_CHUNK);
  double acc = 0.0;
  for (i64 i = lo; i < hi; ++i) acc += (double)g[i] * (double)g[i];
  part[c] = acc;
}
DPW_INSTANTIATE(grad_sq, GRAD_SQ_PARAMS, (u, g, part))

// One thread: total = Σ part[0..nparts] in order, in double (its square root when `root`), kept
// in part[nparts] and written rounded to T into out[0]. The loss sums and the gradient norm stay
// on the device this way; the host reads them only when it displays them.
#define SUM_PARTS_PARAMS(T) (SumParams u, double* __restrict__ part, T* __restrict__ out)

template <typename T>
__device__ void sum_parts SUM_PARTS_PARAMS(T) {
  if (global_index() != 0) return;
  double acc = 0.0;
  for (i64 i = 0; i < u.nparts; ++i) acc += part[i];
  if (u.root) acc = sqrt(acc);
  part[u.nparts] = acc;
  out[0] = (T)acc;
}
DPW_INSTANTIATE(sum_parts, SUM_PARTS_PARAMS, (u, part, out))

// g ×= max / (norm + 1e-6) where that is below 1, the factor from the double norm rounded once
// to T, as the CPU does. A NaN norm scales nothing.
#define CLIP_SCALE_PARAMS(T) \
  (VectorParams u, double max, const double* __restrict__ norm, T* __restrict__ g)

template <typename T>
__device__ void clip_scale CLIP_SCALE_PARAMS(T) {
  i64 i = global_index();
  if (i >= u.n) return;
  double coef = max / (norm[0] + 1e-6);
  if (coef < 1.0) g[i] = g[i] * (T)coef;
}
DPW_INSTANTIATE(clip_scale, CLIP_SCALE_PARAMS, (u, max, norm, g))

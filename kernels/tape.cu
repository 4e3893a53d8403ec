// The tape's ops (src/backend/cpu/tape.rs) on the device: shaders/tape.wgsl's twin, kernel for
// kernel and of the same names (read that file's comments for the why of each; the walk that
// launches them is src/backend/device_tape, shared with wgpu). Written once over a number type
// N (common.cuh): on T they are the forward and the backward, on Dual<T> the tangent and the
// dual reverse, as the cpu's tape runs on `Num`. Each kernel NAME is instantiated as NAME_f32,
// NAME_f64 (reals) and NAME_dual_f32, NAME_dual_f64.
//
// A tensor is a buffer of [rows][cols] numbers, NS reals each. Every kernel that writes y adds
// to it instead where u.acc is 1 (an adjoint reached before). One thread per entry written, so
// every sum runs in a fixed order, the cpu's. No __restrict__: the walk binds one buffer as
// both a and b, and in place of a y it does not write.

#define TAPE_NONE 0xffffffffu

// One launch's view: its TapeParams, the run's constants `cst`, the model's parameters, the
// tensors a, b (read), y, y2 (written) and the indices `idx` (a gather's, where NONE reads 0,
// a scatter's CSR, a softmax's mask).
template <typename T, typename N>
struct Tk {
  using O = Num<T, N>;
  TapeParams u;
  const T* cst;
  const T* params;
  const T* a;
  const T* b;
  const unsigned* idx;
  T* y;
  T* y2;

  __device__ static N ld(const T* p, i64 i) { return O::pair(p[O::NS * i], p[O::NS * i + O::NS - 1]); }
  __device__ N la(i64 i) const { return ld(a, i); }
  __device__ N lb(i64 i) const { return ld(b, i); }
  __device__ N ly(i64 i) const { return ld(y, i); }
  __device__ static void st(T* p, i64 i, N x) {
    p[O::NS * i] = O::val(x);
    if (O::NS == 2) p[O::NS * i + 1] = O::tan(x);
  }
  __device__ void sy(i64 i, N x) const { st(y, i, x); }
  __device__ void sy2(i64 i, N x) const { st(y2, i, x); }
  __device__ N nc(T x) const { return O::pair(x, T(0)); }
  // Writes x, or adds it where the op accumulates.
  __device__ void put(i64 i, N x) const { sy(i, u.acc != 0 ? ly(i) + x : x); }
  // What a parameter's adjoint adds to its gradient: the value on reals; on duals the ε part,
  // the dual reverse's cotangent being Ḋ̄ + εD̄ (src/backend/cpu/tape_block.rs).
  __device__ static T grad_part(N x) { return O::NS == 2 ? O::tan(x) : O::val(x); }

  // The terms [start, end) of part c of a sum over n.
  __device__ void stretch(unsigned c, unsigned n, unsigned* s0, unsigned* s1) const {
    *s0 = min(n, c * u.chunk);
    *s1 = min(n, (c + 1u) * u.chunk);
  }
  // Part c of entry t: the entry itself where the sum is one part, else its place in the parts.
  __device__ void part_out(unsigned c, unsigned t, N s) const {
    if (u.nparts == 1u) put(t, s);
    else sy((i64)c * u.nout + t, s);
  }
  // Entry t < nout of a sum: its parts (`a`, [nparts][nout]) in order.
  __device__ N parts_sum(unsigned t) const {
    N s = nc(T(0));
    for (unsigned c = 0; c < u.nparts; ++c) s = s + la((i64)c * u.nout + t);
    return s;
  }
  // W̄ += xᵀ·ȳ and b̄ += Σ_rows ȳ into the gradient `y2`, entry t = (i, o) of (cols + has_b)·nn,
  // row i = cols the bias's.
  __device__ void add_grad(unsigned t, N s) const {
    if (t / u.nn < u.cols) y2[u.w + t] += grad_part(s);
    else y2[u.b + t % u.nn] += grad_part(s);
  }
  // Where b [br][bc], broadcast onto [rows][cols], is read for entry e.
  __device__ i64 bcast(i64 e) const {
    i64 i = u.br == 1u ? 0 : e / u.cols;
    i64 j = u.bc == 1u ? 0 : e % u.cols;
    return i * u.bc + j;
  }
};

// Threads past n return; the others get their entry.
#define TAPE_ENTRY(e, n)        \
  const i64 e = global_index(); \
  if (e >= (i64)(n)) return;

template <typename T, typename N>
__device__ void tape_sum_parts(const Tk<T, N>& k) {
  TAPE_ENTRY(t, k.u.nout);
  k.put(t, k.parts_sum(t));
}

// y = x·W (+ b): x `a` [rows][cols], W at params[u.w] [cols][nn], b at params[u.b] if u.has_b.
template <typename T, typename N>
__device__ void tape_linear(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.rows * u.nn);
  i64 r = e / u.nn, o = e % u.nn;
  N s = k.nc(u.has_b != 0u ? k.params[u.b + o] : T(0));
  for (unsigned i = 0; i < u.cols; ++i) s = s + k.la(r * u.cols + i) * k.params[u.w + (i64)i * u.nn + o];
  k.put(e, s);
}

// x̄ = ȳ·Wᵀ: ȳ `a` [rows][nn], x̄ `y` [rows][cols].
template <typename T, typename N>
__device__ void tape_linear_x(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.rows * u.cols);
  i64 r = e / u.cols, i = e % u.cols;
  N s = k.nc(T(0));
  for (unsigned o = 0; o < u.nn; ++o) s = s + k.la(r * u.nn + o) * k.params[u.w + i * u.nn + o];
  k.put(e, s);
}

// Part c of entry t of W̄ and b̄ over rows, x `a` [rows][cols], ȳ `b` [rows][nn]: into the
// gradient where it is the only part, else into the parts `y`.
template <typename T, typename N>
__device__ void tape_linear_w(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.nparts * u.nout);
  unsigned c = e / u.nout, t = e % u.nout;
  unsigned i = t / u.nn, o = t % u.nn, r0, r1;
  k.stretch(c, u.rows, &r0, &r1);
  N s = k.nc(T(0));
  for (unsigned r = r0; r < r1; ++r) {
    if (i < u.cols) s = s + k.la((i64)r * u.cols + i) * k.lb((i64)r * u.nn + o);
    else s = s + k.lb((i64)r * u.nn + o);
  }
  if (u.nparts == 1u) k.add_grad(t, s);
  else k.sy(e, s);
}

// The gradient's W̄ and b̄ from tape_linear_w's parts `a`.
template <typename T, typename N>
__device__ void tape_linear_w_parts(const Tk<T, N>& k) {
  TAPE_ENTRY(t, k.u.nout);
  k.add_grad(t, k.parts_sum(t));
}

// C = op(A)·op(B) per batch: A `a` [batch][m][k] ([k][m] if u.ta), B `b` [batch][k][nn]
// ([nn][k] if u.tb), C `y` [batch][m][nn].
template <typename T, typename N>
__device__ void tape_bmm(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  i64 mn = (i64)u.m * u.nn;
  TAPE_ENTRY(e, (i64)u.rows * mn);
  i64 bi = e / mn, p = (e % mn) / u.nn, q = e % u.nn;
  i64 a0 = bi * u.m * u.k, b0 = bi * u.k * u.nn;
  N s = k.nc(T(0));
  for (unsigned t = 0; t < u.k; ++t) {
    i64 ai = u.ta != 0u ? a0 + (i64)t * u.m + p : a0 + p * u.k + t;
    i64 bj = u.tb != 0u ? b0 + q * u.k + t : b0 + (i64)t * u.nn + q;
    s = s + k.la(ai) * k.lb(bj);
  }
  k.put(e, s);
}

// The element function u.op (Elem in tape.rs, numbered by device_tape/plan.rs's elem_id) and
// its two derivatives at x, its constants from cst[u.ci]: Elem::eval3's formulas.
template <typename T, typename N>
__device__ Phi<T> tape_elem3(const Tk<T, N>& k, T x) {
  const T one = T(1), two = T(2);
  const T* c = k.cst + k.u.ci;
  switch (k.u.op) {
    case 0: {
      T s = sqrt(x);
      return {s, one / (two * s), -one / (two * two * x * s)};
    }
    case 1: {
      T rs = c[0], rc = c[1];
      if (x < rs) return {one, T(0), T(0)};
      if (x >= rc) return {T(0), T(0), T(0)};
      T w = rc - rs, v = (x - rs) / w, v2 = v * v;
      return {v2 * v * (T(-6) * v2 + T(15) * v - T(10)) + one,
              v2 * (T(-30) * v2 + T(60) * v - T(30)) / w,
              v * (T(-120) * v2 + T(180) * v - T(60)) / (w * w)};
    }
    case 2: {
      T i = one / (x + c[0]);
      return {i, -i * i, two * i * i * i};
    }
    case 3: {
      T ve = x + c[0];
      T i = one / sqrt(ve);
      return {i, -i / (two * ve), T(3) * i / (two * two * ve * ve)};
    }
    case 4: {
      T t = tanh(x);
      return {t, one - t * t, -two * t * (one - t * t)};
    }
    case 5:
      return silu3(x);
    case 6: {
      // silut: silu below the threshold c, tanh(s(x − c)) + silu(c) from it on, with c, s and
      // silu(c) = c[0..3] (computed in f64 as DeePMD-kit does).
      if (x < c[0]) return silu3(x);
      T sl = c[1];
      T t = tanh(sl * (x - c[0]));
      return {t + c[2], sl * (one - t * t), -two * sl * sl * t * (one - t * t)};
    }
    case 8: {
      // The exponential switch exp(−e^{ks(x − rs)}), ks = 20/rs (Elem::ExpSwitch), rs and rc
      // from c[0..2]: flat outside (0, rc) at its value at 0 or rc, which the cpu's switch3
      // (repflow.rs) takes as exp(−e^{20(x − rs)/rs}), and so does this.
      T rs = c[0], rc = c[1];
      if (x <= T(0) || x >= rc) {
        T xc = x <= T(0) ? T(0) : rc;
        return {exp(-exp(T(20) * (xc - rs) / rs)), T(0), T(0)};
      }
      T ks = T(20) / rs;
      T ea = exp(ks * (x - rs));
      T s = exp(-ea);
      return {s, -ks * ea * s, -ks * ks * ea * s * (one - ea)};
    }
    default:
      return {x, one, T(0)};
  }
}

// y = f(x) and its slope `y2` = f'(x), as numbers: on duals f(x) + εf'(x)ẋ and f'(x) + εf''(x)ẋ.
template <typename T, typename N>
__device__ void tape_map(const Tk<T, N>& k) {
  using O = Num<T, N>;
  TAPE_ENTRY(e, (i64)k.u.rows * k.u.cols);
  N x = k.la(e);
  Phi<T> f = tape_elem3(k, O::val(x));
  k.sy(e, O::pair(f.v, f.d1 * O::tan(x)));
  k.sy2(e, O::pair(f.d1, f.d2 * O::tan(x)));
}

// y = s·(a ∘ b) with b broadcast, s = cst[u.ci]: ∘ by u.op, 0 a + b, 1 a − b, 2 a·b, 3 a alone,
// 4 b alone.
template <typename T, typename N>
__device__ void tape_zip(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.rows * u.cols);
  N v;
  switch (u.op) {
    case 0: v = k.la(e) + k.lb(k.bcast(e)); break;
    case 1: v = k.la(e) - k.lb(k.bcast(e)); break;
    case 2: v = k.la(e) * k.lb(k.bcast(e)); break;
    case 3: v = k.la(e); break;
    default: v = k.lb(k.bcast(e)); break;
  }
  k.put(e, v * k.cst[u.ci]);
}

// The sum onto b's shape [br][bc] of s·g over [rows][cols], g = a (u.op 0) or a ∘ b2 with b2
// `b` of the full shape (u.op 2): the adjoint of a broadcast operand. Part c of entry t over
// rows where br is 1.
template <typename T, typename N>
__device__ void tape_reduce(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.nparts * u.nout);
  unsigned c = e / u.nout, t = e % u.nout;
  unsigned ti = t / u.bc, tj = t % u.bc, i0 = ti, i1 = ti + 1u;
  if (u.br == 1u) k.stretch(c, u.rows, &i0, &i1);
  unsigned j0 = u.bc == 1u ? 0u : tj, j1 = u.bc == 1u ? u.cols : tj + 1u;
  N s = k.nc(T(0));
  for (unsigned i = i0; i < i1; ++i)
    for (unsigned j = j0; j < j1; ++j) {
      i64 f = (i64)i * u.cols + j;
      s = s + (u.op == 2u ? k.la(f) * k.lb(f) : k.la(f));
    }
  k.part_out(c, t, s * k.cst[u.ci]);
}

// y[e] = a's entry e % k of unit idx[ix + e / k] (0 for NONE): units of u.k entries.
template <typename T, typename N>
__device__ void tape_gather(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.rows * u.cols);
  unsigned i = k.idx[u.ix + e / u.k];
  k.put(e, i != TAPE_NONE ? k.la((i64)i * u.k + e % u.k) : k.nc(T(0)));
}

// A gather's adjoint: x̄'s entry t = Σ ȳ over the units that read t's unit (t / k), from the
// CSR at u.ix (starts [nout / k + 1], then the units, in order); `a` is ȳ. Part c of entry t.
template <typename T, typename N>
__device__ void tape_scatter(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.nparts * u.nout);
  unsigned c = e / u.nout, t = e % u.nout;
  unsigned s0 = t / u.k, col = t % u.k;
  unsigned p0 = k.idx[u.ix + s0], q0, q1;
  k.stretch(c, k.idx[u.ix + s0 + 1u] - p0, &q0, &q1);
  const unsigned* list = k.idx + u.ix + u.nout / u.k + 1u;
  N s = k.nc(T(0));
  for (unsigned p = p0 + q0; p < p0 + q1; ++p) s = s + k.la((i64)list[p] * u.k + col);
  k.part_out(c, t, s);
}

// y [rows][cols] = sums of u.k consecutive rows of a [rows·k][cols]: part c of entry t.
template <typename T, typename N>
__device__ void tape_sum_rows(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.nparts * u.nout);
  unsigned c = e / u.nout, t = e % u.nout;
  unsigned g = t / u.cols, col = t % u.cols, r0, r1;
  k.stretch(c, u.k, &r0, &r1);
  N s = k.nc(T(0));
  for (unsigned r = r0; r < r1; ++r) s = s + k.la(((i64)g * u.k + r) * u.cols + col);
  k.part_out(c, t, s);
}

// y [rows][cols] = a's row r / k at each row r: the adjoint of sum_rows.
template <typename T, typename N>
__device__ void tape_spread_rows(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.rows * u.cols);
  k.put(e, k.la((e / u.cols) / u.k * u.cols + e % u.cols));
}

// Softmax over each row of a [rows][cols], entries whose mask (idx from u.ix, where u.has_b)
// is 0 left out as 0; a row with none kept is 0. One thread per row.
template <typename T, typename N>
__device__ void tape_softmax(const Tk<T, N>& k) {
  using O = Num<T, N>;
  const TapeParams& u = k.u;
  TAPE_ENTRY(r, u.rows);
  i64 e0 = r * u.cols;
  bool kept = false;
  T mx = T(0);
  for (unsigned j = 0; j < u.cols; ++j)
    if (u.has_b == 0u || k.idx[u.ix + e0 + j] != 0u) {
      T v = O::val(k.la(e0 + j));
      if (!kept || v > mx) mx = v;
      kept = true;
    }
  N s = k.nc(T(0));
  for (unsigned j = 0; j < u.cols; ++j) {
    N v = k.nc(T(0));
    if (u.has_b == 0u || k.idx[u.ix + e0 + j] != 0u) v = O::exp_nonpos(k.la(e0 + j) - k.nc(mx));
    k.sy(e0 + j, v);
    s = s + v;
  }
  if (!kept) return;
  for (unsigned j = 0; j < u.cols; ++j) k.sy(e0 + j, k.ly(e0 + j) / s);
}

// The softmax's adjoint: x̄ = y ∘ (ȳ − Σ_row y ȳ), y `a`, ȳ `b`. One thread per row.
template <typename T, typename N>
__device__ void tape_softmax_back(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(r, u.rows);
  i64 e0 = r * u.cols;
  N dot = k.nc(T(0));
  for (unsigned j = 0; j < u.cols; ++j) dot = dot + k.la(e0 + j) * k.lb(e0 + j);
  for (unsigned j = 0; j < u.cols; ++j) k.put(e0 + j, k.la(e0 + j) * (k.lb(e0 + j) - dot));
}

// Columns: y[i][u.k + j] = a[i][u.m + j] for j < u.nn of rows i, a's rows u.cols wide and y's
// u.br: a piece of a concat, or its adjoint.
template <typename T, typename N>
__device__ void tape_copy_cols(const Tk<T, N>& k) {
  const TapeParams& u = k.u;
  TAPE_ENTRY(e, (i64)u.rows * u.nn);
  i64 i = e / u.nn, j = e % u.nn;
  k.put(i * u.br + u.k + j, k.la(i * u.cols + u.m + j));
}

// y = params[u.w..][..rows·cols] as numbers.
template <typename T, typename N>
__device__ void tape_param(const Tk<T, N>& k) {
  TAPE_ENTRY(e, (i64)k.u.rows * k.u.cols);
  k.sy(e, k.nc(k.params[k.u.w + e]));
}

// The gradient `y2`[u.w..] += a parameter tensor's adjoint `a`.
template <typename T, typename N>
__device__ void tape_param_grad(const Tk<T, N>& k) {
  TAPE_ENTRY(e, (i64)k.u.rows * k.u.cols);
  k.y2[k.u.w + e] += Tk<T, N>::grad_part(k.la(e));
}

// y = a + ε b from two buffers of reals (b read where u.has_b, else 0): an input, or a seed.
template <typename T, typename N>
__device__ void tape_pair(const Tk<T, N>& k) {
  using O = Num<T, N>;
  TAPE_ENTRY(e, (i64)k.u.rows * k.u.cols);
  k.put(e, O::pair(k.a[e], k.u.has_b != 0u ? k.b[e] : T(0)));
}

// Reals out of numbers: y[e] = the value of a[e] (u.op 0) or its ε part (u.op 1).
template <typename T, typename N>
__device__ void tape_part(const Tk<T, N>& k) {
  using O = Num<T, N>;
  TAPE_ENTRY(e, (i64)k.u.rows * k.u.cols);
  N x = k.la(e);
  k.y[e] = k.u.op == 0u ? O::val(x) : O::tan(x);
}

// Every kernel takes the same parameters, in the walk's binding order.
#define TAPE_PARAMS(T)                                                                          \
  (TapeParams u, const T* cst, const T* params, const T* a, const T* b, const unsigned* idx, \
   T* y, T* y2)
#define TAPE_KERNEL(NAME)                                                                 \
  extern "C" __global__ void NAME##_f32 TAPE_PARAMS(float) {                             \
    NAME(Tk<float, float>{u, cst, params, a, b, idx, y, y2});                            \
  }                                                                                       \
  extern "C" __global__ void NAME##_f64 TAPE_PARAMS(double) {                            \
    NAME(Tk<double, double>{u, cst, params, a, b, idx, y, y2});                          \
  }                                                                                       \
  extern "C" __global__ void NAME##_dual_f32 TAPE_PARAMS(float) {                        \
    NAME(Tk<float, Dual<float>>{u, cst, params, a, b, idx, y, y2});                      \
  }                                                                                       \
  extern "C" __global__ void NAME##_dual_f64 TAPE_PARAMS(double) {                       \
    NAME(Tk<double, Dual<double>>{u, cst, params, a, b, idx, y, y2});                    \
  }

TAPE_KERNEL(tape_linear)
TAPE_KERNEL(tape_linear_x)
TAPE_KERNEL(tape_linear_w)
TAPE_KERNEL(tape_linear_w_parts)
TAPE_KERNEL(tape_sum_parts)
TAPE_KERNEL(tape_bmm)
TAPE_KERNEL(tape_map)
TAPE_KERNEL(tape_zip)
TAPE_KERNEL(tape_reduce)
TAPE_KERNEL(tape_gather)
TAPE_KERNEL(tape_scatter)
TAPE_KERNEL(tape_sum_rows)
TAPE_KERNEL(tape_spread_rows)
TAPE_KERNEL(tape_softmax)
TAPE_KERNEL(tape_softmax_back)
TAPE_KERNEL(tape_copy_cols)
TAPE_KERNEL(tape_param)
TAPE_KERNEL(tape_param_grad)
TAPE_KERNEL(tape_pair)
TAPE_KERNEL(tape_part)

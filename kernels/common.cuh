// Helpers shared by every kernel file. NVRTC sees no file system, so the backend prepends this
// text to each .cu source before compiling it (src/backend/cuda/kernels.rs), after the layouts
// generated from src/backend/gpu_layout.rs.
//
// Conventions of all kernels:
// - Every op is a `template <typename T> __device__` function, instantiated for float and
//   double as the extern "C" kernels `op_f32` / `op_f64` by DPW_INSTANTIATE.
// - Buffers are row-major, laid out as src/backend/dims.rs and src/backend/mod.rs say; the
//   pointers a kernel gets never alias (they come from distinct Rust borrows), hence __restrict__.
// - Deterministic: no floating-point atomics. Every sum runs in a fixed order that depends only
//   on the shapes, never on scheduling, so two runs give the same bits.

typedef long long i64;

// `template <typename T> __device__ void NAME PARAMS(T)` as the kernels NAME_f32 and NAME_f64.
// PARAMS is a function-like macro giving the parameter list for a type, ARGS the argument list.
#define DPW_INSTANTIATE(NAME, PARAMS, ARGS)                                      \
  extern "C" __global__ void NAME##_f32 PARAMS(float) { NAME<float> ARGS; }    \
  extern "C" __global__ void NAME##_f64 PARAMS(double) { NAME<double> ARGS; }

// Global index of this thread in a 1-D grid.
__device__ __forceinline__ i64 global_index() {
  return (i64)blockIdx.x * blockDim.x + threadIdx.x;
}

// The batch layout (src/backend/dims.rs) as a table of ints in device memory, built once per
// batch shape by the backend (gpu_layout::shape_table, which also generates the DIMS_* offsets).
// A table rather than a by-value struct: no limit on the number of types, and lookups are
// uniform across a warp, so they hit the cache.
struct Dims {
  const int* p;
  __device__ explicit Dims(const int* table) : p(table) {}
  __device__ int ntypes() const { return __ldg(p + DIMS_NTYPES); }
  __device__ int nsec() const { return __ldg(p + DIMS_NSEC); }
  __device__ int nnei() const { return __ldg(p + DIMS_NNEI); }
  __device__ int m1() const { return __ldg(p + DIMS_M1); }
  __device__ int m2() const { return __ldg(p + DIMS_M2); }
  __device__ int nframes() const { return __ldg(p + DIMS_NFRAMES); }
  __device__ int natoms() const { return __ldg(p + DIMS_NATOMS); }
  __device__ int ncentres() const { return __ldg(p + DIMS_NCENTRES); }
  __device__ int nslots() const { return __ldg(p + DIMS_NSLOTS); }
  // The sections, where the head says they start.
  __device__ int sel(int t) const { return __ldg(p + __ldg(p + DIMS_SEL_AT) + t); }
  __device__ int centre_start(int t) const { return __ldg(p + __ldg(p + DIMS_CENTRE_START_AT) + t); }
  __device__ int block_start(int k) const { return __ldg(p + __ldg(p + DIMS_BLOCK_START_AT) + k); }
  // First centre of type t in frame f (f = nframes: the type's end); frames of a batch may
  // differ in composition.
  __device__ int frame_start(int t, int f) const {
    return __ldg(p + __ldg(p + DIMS_FRAME_START_AT) + t * (nframes() + 1) + f);
  }

  // Type of centre c (centres are ordered by type).
  __device__ int centre_type(int c) const {
    int t = 0;
    while (c >= centre_start(t + 1)) ++t;
    return t;
  }
  // Frame of centre c: inside a type, centres are ordered frame by frame. The last frame whose
  // centres of c's type start at or before c (a frame without any starts where the next does),
  // by bisection as Dims::centre_frame.
  __device__ int centre_frame(int c) const {
    int t = centre_type(c);
    int lo = 0, hi = nframes();
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (frame_start(t, mid) <= c) lo = mid; else hi = mid;
    }
    return lo;
  }
  // First slot of centre c (of type ti) in neighbour section tj.
  __device__ int first_slot(int ti, int c, int tj) const {
    return block_start(ti * nsec() + tj) + (c - centre_start(ti)) * sel(tj);
  }
  // The centre that owns slot s: find its block (ti, tj), then the row inside the block.
  // Empty blocks have block_start(k) == block_start(k + 1) and are stepped over.
  __device__ int slot_centre(int s) const {
    int k = 0;
    while (s >= block_start(k + 1)) ++k;
    int ns = nsec();
    int ti = k / ns, tj = k % ns;
    return centre_start(ti) + (s - block_start(k)) / sel(tj);
  }
};

// φ, φ' and φ'' (src/backend/cpu/act.rs).
template <typename T>
struct Phi {
  T v, d1, d2;
};

template <typename T>
__device__ __forceinline__ Phi<T> silu3(T x) {
  T s = T(1) / (T(1) + exp(-x));
  return {x * s, s * (T(1) + x * (T(1) - s)), s * (T(1) - s) * (T(2) + x * (T(1) - s - s))};
}

// silut: silu below c, tanh(s·(x − c)) + silu(c) from c on, s = silu'(c); c arrives as three
// f32 that sum to it exactly in double (DenseParams::silut_c0..2).
template <typename T>
__device__ __forceinline__ Phi<T> silut3(const DenseParams& p, T x) {
  T c = T(__int_as_float(p.silut_c0)) + T(__int_as_float(p.silut_c1)) +
        T(__int_as_float(p.silut_c2));
  if (x < c) return silu3(x);
  Phi<T> at_c = silu3(c);
  T sl = at_c.d1;
  T t = tanh(sl * (x - c));
  T d1 = sl * (T(1) - t * t);
  return {t + at_c.v, d1, T(-2) * sl * t * d1};
}

// φ, φ' and φ'' from what a dense layer keeps of an output (p.act: 0 linear, 1 tanh, 2 silu,
// 3 silut): tanh's are functions of h = tanh(z), the others' of z.
template <typename T>
__device__ __forceinline__ Phi<T> of_kept(const DenseParams& p, T s) {
  switch (p.act) {
    case 1: {
      T d1 = T(1) - s * s;
      return {s, d1, -(s + s) * d1};
    }
    case 2:
      return silu3(s);
    case 3:
      return silut3(p, s);
    default:
      return {s, T(1), T(0)};
  }
}

// The environment's switch, in double (env_mat.cu, and DPA-1's σ in attn.cu): its value and
// its derivative with respect to r (C2-smooth quintic), as geometry::env_row computes them.
__device__ __forceinline__ void env_switch(double r, double rcut, double rcut_smth, double* sw,
                                           double* dsw) {
  if (r <= rcut_smth) {
    *sw = 1.0;
    *dsw = 0.0;
    return;
  }
  if (r >= rcut) {
    *sw = 0.0;
    *dsw = 0.0;
    return;
  }
  double w = rcut - rcut_smth;
  double u = (r - rcut_smth) / w;
  *sw = u * u * u * (-6.0 * u * u + 15.0 * u - 10.0) + 1.0;
  *dsw = (3.0 * u * u * (-6.0 * u * u + 15.0 * u - 10.0) + u * u * u * (-12.0 * u + 15.0)) / w;
}

// Dual numbers v + εd (the arithmetic of src/backend/cpu/dual.rs): a pass written once over a
// number type N runs on T itself as the forward (or the backward) and on Dual<T> as the
// tangent (or the dual reverse). attn_block.cu and tape.cu are written so.
template <typename T>
struct Dual {
  T v, d;
};
template <typename T>
__device__ __forceinline__ Dual<T> operator+(Dual<T> a, Dual<T> b) {
  return {a.v + b.v, a.d + b.d};
}
template <typename T>
__device__ __forceinline__ Dual<T> operator-(Dual<T> a, Dual<T> b) {
  return {a.v - b.v, a.d - b.d};
}
template <typename T>
__device__ __forceinline__ Dual<T> operator*(Dual<T> a, Dual<T> b) {
  return {a.v * b.v, a.d * b.v + a.v * b.d};
}
template <typename T>
__device__ __forceinline__ Dual<T> operator*(Dual<T> a, T r) {
  return {a.v * r, a.d * r};
}
template <typename T>
__device__ __forceinline__ Dual<T> operator/(Dual<T> a, Dual<T> b) {
  T q = a.v / b.v;
  return {q, (a.d - q * b.d) / b.v};
}

// What a pass needs of its number type N over the reals T.
template <typename T, typename N>
struct Num;

template <typename T>
struct Num<T, T> {
  static constexpr int NS = 1;
  __device__ static T pair(T v, T) { return v; }
  __device__ static T val(T a) { return a; }
  __device__ static T tan(T) { return T(0); }
  __device__ static T root(T a) { return sqrt(a); }
  __device__ static T exp_nonpos(T a) { return exp(a); }
};

template <typename T>
struct Num<T, Dual<T>> {
  static constexpr int NS = 2;
  __device__ static Dual<T> pair(T v, T d) { return {v, d}; }
  __device__ static T val(Dual<T> a) { return a.v; }
  __device__ static T tan(Dual<T> a) { return a.d; }
  __device__ static Dual<T> root(Dual<T> a) {
    T s = sqrt(a.v);
    return {s, a.d / (s + s)};
  }
  __device__ static Dual<T> exp_nonpos(Dual<T> a) {
    T e = exp(a.v);
    return {e, a.d * e};
  }
};

// Per-frame energies, and forces and virials gathered from the per-slot q = ∂E/∂r_ij (CPU
// reference: src/backend/cpu/scatter.rs). Sums run in double, as on the CPU, and in a fixed
// order: forces are gathered per atom (no atomics), using the list of slots each atom owns
// (a CSR list built once per batch from `owner`, ordered by slot); virials are summed per
// centre, then per frame in centre order.

// e_atom[c] = e_fit[c] + bias[type(c)].
#define ENERGY_ATOMS_PARAMS(T)                                                             \
  (const int* __restrict__ dims, const T* __restrict__ e_fit, const T* __restrict__ bias,  \
   T* __restrict__ e_atom)

template <typename T>
__device__ void energy_atoms ENERGY_ATOMS_PARAMS(T) {
  Dims d(dims);
  i64 c = global_index();
  if (c >= d.ncentres()) return;
  e_atom[c] = e_fit[c] + bias[d.centre_type((int)c)];
}
DPW_INSTANTIATE(energy_atoms, ENERGY_ATOMS_PARAMS, (dims, e_fit, bias, e_atom))

// Per-frame sums (energy_frames, virial_frames) visit a frame's centres in chunks of
// FRAME_CHUNK: the block loads a chunk into shared memory with coalesced loads, then one thread
// per output adds it in order. One thread per frame that loaded as it added took 14 µs
// (energies) and 22 µs (virials) on an H100 (run 7, water, batch 1): one load latency per atom.
#define FRAME_CHUNK 128

// E_f = Σ atoms e_atom in double, type by type then atom by atom (the CPU's order). One block
// per frame; thread 0 adds.
#define ENERGY_FRAMES_PARAMS(T) \
  (const int* __restrict__ dims, const T* __restrict__ e_atom, T* __restrict__ energy)

template <typename T>
__device__ void energy_frames ENERGY_FRAMES_PARAMS(T) {
  __shared__ double chunk[FRAME_CHUNK];
  Dims d(dims);
  int f = blockIdx.x;
  double acc = 0.0;  // thread 0's is the sum
  for (int t = 0; t < d.ntypes(); ++t) {
    int first = d.frame_start(t, f);
    int count = d.frame_start(t, f + 1) - first;
    for (int base = 0; base < count; base += FRAME_CHUNK) {
      int n = min(FRAME_CHUNK, count - base);
      for (int e = threadIdx.x; e < n; e += blockDim.x) chunk[e] = (double)e_atom[first + base + e];
      __syncthreads();
      if (threadIdx.x == 0)
        for (int k = 0; k < n; ++k) acc += chunk[k];
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) energy[f] = (T)acc;
}
DPW_INSTANTIATE(energy_frames, ENERGY_FRAMES_PARAMS, (dims, e_atom, energy))

// One warp per centre c, atom i = centre_atom[c]:
//   F_i = Σ_{slots s of c} q_s − Σ_{slots s owned by i} q_s
// and the centre's share of the virial, W_c = −Σ_{slots s of c} q_s ⊗ r_s, into `wpart`
// [ncentres][9] (double). `owned_start` [n_owned + 1] and `owned_slot` list, for each atom
// index below the ScatterParams' n_owned, the slots it owns in increasing slot order.
// Each of the 12 sums is one lane's and runs in slot order (lanes 0-2: F, lanes 3-11: W row by
// row); the whole warp stages FORCE_CHUNK slots at a time in shared memory with coalesced
// loads. One thread per centre walking its slots with strided loads took 114 µs on an H100
// (run 7, water, batch 1: 192 threads in all). Launched with 32 * FORCE_WARPS threads a block
// (FORCE_WARPS is generated from src/backend/gpu_layout.rs).
#define FORCE_CHUNK 64
#define FORCE_CENTRES_PARAMS(T)                                                              \
  (ScatterParams u, const int* __restrict__ dims, const T* __restrict__ q,                   \
   const T* __restrict__ rij, const int* __restrict__ owner,                                 \
   const int* __restrict__ centre_atom, const int* __restrict__ owned_start,                 \
   const int* __restrict__ owned_slot, T* __restrict__ force, double* __restrict__ wpart)

template <typename T>
__device__ void force_centres FORCE_CENTRES_PARAMS(T) {
  __shared__ double s_q[FORCE_WARPS][3 * FORCE_CHUNK];
  __shared__ double s_r[FORCE_WARPS][3 * FORCE_CHUNK];
  __shared__ bool s_ok[FORCE_WARPS][FORCE_CHUNK];
  Dims d(dims);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  i64 c = (i64)blockIdx.x * FORCE_WARPS + warp;
  if (c >= d.ncentres()) return;  // the whole warp: only __syncwarp below
  double* sq = s_q[warp];
  double* sr = s_r[warp];
  bool* ok = s_ok[warp];
  int i = centre_atom[c];
  int ti = d.centre_type((int)c);
  // Lane 3 + 3a + b sums W[a][b]; lanes a < 3 sum F[a]; lanes from 12 only load.
  int wa = (lane - 3) / 3, wb = (lane - 3) % 3;
  double acc = 0.0;
  for (int tj = 0; tj < d.nsec(); ++tj) {
    i64 first = d.first_slot(ti, (int)c, tj);
    int sel = d.sel(tj);
    for (int base = 0; base < sel; base += FORCE_CHUNK) {
      int n = min(FORCE_CHUNK, sel - base);
      i64 s0 = first + base;
      for (int e = lane; e < 3 * n; e += 32) {
        sq[e] = (double)q[3 * s0 + e];
        sr[e] = (double)rij[3 * s0 + e];
      }
      for (int e = lane; e < n; e += 32) ok[e] = owner[s0 + e] >= 0;
      __syncwarp();
      if (lane < 3) {
        for (int j = 0; j < n; ++j)
          if (ok[j]) acc += sq[3 * j + lane];
      } else if (lane < 12) {
        for (int j = 0; j < n; ++j)
          if (ok[j]) acc -= sq[3 * j + wa] * sr[3 * j + wb];
      }
      __syncwarp();
    }
  }
  if (i < u.n_owned) {
    int lo = owned_start[i], hi = owned_start[i + 1];
    for (int base = lo; base < hi; base += FORCE_CHUNK) {
      int n = min(FORCE_CHUNK, hi - base);
      for (int e = lane; e < n; e += 32) {
        i64 s = owned_slot[base + e];
#pragma unroll
        for (int a = 0; a < 3; ++a) sq[3 * e + a] = (double)q[3 * s + a];
      }
      __syncwarp();
      if (lane < 3)
        for (int j = 0; j < n; ++j) acc -= sq[3 * j + lane];
      __syncwarp();
    }
  }
  if (lane < 3)
    force[3 * (i64)i + lane] = (T)acc;
  else if (lane < 12)
    wpart[9 * c + lane - 3] = acc;
}
DPW_INSTANTIATE(force_centres, FORCE_CENTRES_PARAMS,
                (u, dims, q, rij, owner, centre_atom, owned_start, owned_slot, force, wpart))

// W_f = Σ_{centres c of frame f} W_c, type by type then atom by atom. One block per frame;
// thread k < 9 adds component k.
#define VIRIAL_FRAMES_PARAMS(T) \
  (const int* __restrict__ dims, const double* __restrict__ wpart, T* __restrict__ virial)

template <typename T>
__device__ void virial_frames VIRIAL_FRAMES_PARAMS(T) {
  __shared__ double chunk[9 * FRAME_CHUNK];
  Dims d(dims);
  int f = blockIdx.x, k = threadIdx.x;
  double acc = 0.0;  // thread k < 9's is component k
  for (int t = 0; t < d.ntypes(); ++t) {
    int first = d.frame_start(t, f);
    int count = d.frame_start(t, f + 1) - first;
    for (int base = 0; base < count; base += FRAME_CHUNK) {
      int n = min(FRAME_CHUNK, count - base);
      const double* src = wpart + 9 * (i64)(first + base);
      for (int e = threadIdx.x; e < 9 * n; e += blockDim.x) chunk[e] = src[e];
      __syncthreads();
      if (k < 9)
        for (int j = 0; j < n; ++j) acc += chunk[9 * j + k];
      __syncthreads();
    }
  }
  if (k < 9) virial[9 * (i64)f + k] = (T)acc;
}
DPW_INSTANTIATE(virial_frames, VIRIAL_FRAMES_PARAMS, (dims, wpart, virial))

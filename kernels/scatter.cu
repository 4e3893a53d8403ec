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

// E_f = Σ atoms e_atom in double, type by type then atom by atom (the CPU's order). One thread
// per frame: a frame has few atoms and this runs once per step.
#define ENERGY_FRAMES_PARAMS(T) \
  (const int* __restrict__ dims, const T* __restrict__ e_atom, T* __restrict__ energy)

template <typename T>
__device__ void energy_frames ENERGY_FRAMES_PARAMS(T) {
  Dims d(dims);
  i64 f = global_index();
  if (f >= d.nframes()) return;
  double acc = 0.0;
  for (int t = 0; t < d.ntypes(); ++t) {
    int count = (d.centre_start(t + 1) - d.centre_start(t)) / d.nframes();
    int first = d.centre_start(t) + (int)f * count;
    for (int k = 0; k < count; ++k) acc += (double)e_atom[first + k];
  }
  energy[f] = (T)acc;
}
DPW_INSTANTIATE(energy_frames, ENERGY_FRAMES_PARAMS, (dims, e_atom, energy))

// One thread per centre c, atom i = centre_atom[c]:
//   F_i = Σ_{slots s of c} q_s − Σ_{slots s owned by i} q_s
// and the centre's share of the virial, W_c = −Σ_{slots s of c} q_s ⊗ r_s, into `wpart`
// [ncentres][9] (double). `owned_start` [n_owned + 1] and `owned_slot` list, for each atom
// index below n_owned, the slots it owns in increasing slot order.
#define FORCE_CENTRES_PARAMS(T)                                                              \
  (const int* __restrict__ dims, const T* __restrict__ q, const T* __restrict__ rij,         \
   const int* __restrict__ owner, const int* __restrict__ centre_atom, int n_owned,          \
   const int* __restrict__ owned_start, const int* __restrict__ owned_slot,                  \
   T* __restrict__ force, double* __restrict__ wpart)

template <typename T>
__device__ void force_centres FORCE_CENTRES_PARAMS(T) {
  Dims d(dims);
  i64 c = global_index();
  if (c >= d.ncentres()) return;
  int i = centre_atom[c];
  int ti = d.centre_type((int)c);
  double f[3] = {0.0, 0.0, 0.0};
  double w[9] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  for (int tj = 0; tj < d.ntypes(); ++tj) {
    i64 first = d.first_slot(ti, (int)c, tj);
    for (i64 s = first; s < first + d.sel(tj); ++s) {
      if (owner[s] < 0) continue;
#pragma unroll
      for (int a = 0; a < 3; ++a) {
        double qa = (double)q[3 * s + a];
        f[a] += qa;
#pragma unroll
        for (int b = 0; b < 3; ++b) w[3 * a + b] -= qa * (double)rij[3 * s + b];
      }
    }
  }
  if (i < n_owned) {
    for (int e = owned_start[i]; e < owned_start[i + 1]; ++e) {
      i64 s = owned_slot[e];
#pragma unroll
      for (int a = 0; a < 3; ++a) f[a] -= (double)q[3 * s + a];
    }
  }
#pragma unroll
  for (int a = 0; a < 3; ++a) force[3 * (i64)i + a] = (T)f[a];
#pragma unroll
  for (int k = 0; k < 9; ++k) wpart[9 * c + k] = w[k];
}
DPW_INSTANTIATE(force_centres, FORCE_CENTRES_PARAMS,
                (dims, q, rij, owner, centre_atom, n_owned, owned_start, owned_slot, force, wpart))

// W_f = Σ_{centres c of frame f} W_c, type by type then atom by atom. One thread per
// (frame, component).
#define VIRIAL_FRAMES_PARAMS(T) \
  (const int* __restrict__ dims, const double* __restrict__ wpart, T* __restrict__ virial)

template <typename T>
__device__ void virial_frames VIRIAL_FRAMES_PARAMS(T) {
  Dims d(dims);
  i64 e = global_index();
  if (e >= 9 * (i64)d.nframes()) return;
  int f = (int)(e / 9), k = (int)(e % 9);
  double acc = 0.0;
  for (int t = 0; t < d.ntypes(); ++t) {
    int count = (d.centre_start(t + 1) - d.centre_start(t)) / d.nframes();
    int first = d.centre_start(t) + f * count;
    for (int j = 0; j < count; ++j) acc += wpart[9 * (i64)(first + j) + k];
  }
  virial[e] = (T)acc;
}
DPW_INSTANTIATE(virial_frames, VIRIAL_FRAMES_PARAMS, (dims, wpart, virial))

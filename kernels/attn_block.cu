// DPA-1's attention block per centre: shaders/attn_block.wgsl's twin, step for step (read that
// file's comments for the why of each). Written once over a number type N: T itself, so the
// forward is the forward and the backward the force pass, or Dual<T> (common.cuh), so the
// forward is the tangent pass and the backward, seeded with Ḋ̄ + εD̄, the dual reverse. One 64-thread block per centre of a launch; a
// centre's arrays in its stretch of `ws`, laid out by AttnBlockParams.

#define ATTN_WG 64

// DeePMD-kit's attnw_shift, and the floor of torch's normalize.
#define ATTN_SHIFT 20.0
#define ATTN_NORM_FLOOR 1e-12

// One centre's view of the launch: the shape, the packed layers `lp`, the constants
// [α, ln_eps, 1/nnei, 1/M1] (by value: a captured step uploads nothing) and the scratch.
template <typename T, typename N>
struct Blk {
  using O = Num<T, N>;
  AttnBlockParams u;
  const T* lp;
  T cst[4];
  T* ws;

  __device__ N ld(i64 i) const { return O::pair(ws[O::NS * i], ws[O::NS * i + O::NS - 1]); }
  __device__ void st(i64 i, N x) const {
    ws[O::NS * i] = O::val(x);
    if (O::NS == 2) ws[O::NS * i + 1] = O::tan(x);
  }
  __device__ N c(T x) const { return O::pair(x, T(0)); }

  __device__ i64 base(int cl) const { return (i64)cl * u.per_centre; }
  __device__ N sv(int cl, int j, int c) const { return ld(base(cl) + u.o_slots + (i64)j * u.slot_w + c); }
  __device__ bool is_real(int cl, int j) const { return O::val(sv(cl, j, u.m1 + 5)) != T(0); }

  __device__ int slots_taken(int cl) const {
    int nnei = u.nnei, first_pad = 0;
    for (int j = 0; j < nnei; ++j)
      if (is_real(cl, j)) first_pad = j + 1;
    if (first_pad >= nnei) return nnei;
    for (int j = first_pad + 1; j < nnei; ++j)
      for (int c = 0; c < u.slot_w; ++c) {
        N a = sv(cl, j, c), b = sv(cl, first_pad, c);
        if (O::val(a) != O::val(b) || O::tan(a) != O::tan(b)) return nnei;
      }
    return first_pad + 1;
  }
  __device__ int copies(int j, int n) const { return j + 1 == n ? 1 + u.nnei - n : 1; }

  __device__ i64 at_rdir(int cl, int j) const { return base(cl) + u.o_rdir + 3 * j; }
  __device__ i64 at_dotr(int cl, int j, int k) const { return base(cl) + u.o_dotr + (i64)j * u.nnei + k; }
  __device__ i64 at_g(int cl, int l, int j) const { return base(cl) + u.o_g + ((i64)l * u.nnei + j) * u.m1; }
  __device__ i64 at_qkv(int cl, int l, int j) const { return base(cl) + u.o_qkv + ((i64)l * u.nnei + j) * 3 * u.h; }
  __device__ i64 at_nrm(int cl, int l, int j) const { return base(cl) + u.o_nrm + ((i64)l * u.nnei + j) * 3; }
  __device__ i64 at_logit(int cl, int l, int j) const { return base(cl) + u.o_logit + ((i64)l * u.nnei + j) * u.nnei; }
  __device__ i64 at_p(int cl, int l, int j) const { return base(cl) + u.o_p + ((i64)l * u.nnei + j) * u.nnei; }
  __device__ i64 at_w(int cl, int l, int j) const { return base(cl) + u.o_w + ((i64)l * u.nnei + j) * u.nnei; }
  __device__ i64 at_o(int cl, int l, int j) const { return base(cl) + u.o_o + ((i64)l * u.nnei + j) * u.h; }
  __device__ i64 at_z(int cl, int j) const { return base(cl) + u.o_z + (i64)j * u.m1; }
  __device__ i64 at_xhat(int cl, int l, int j) const { return base(cl) + u.o_xhat + ((i64)l * u.nnei + j) * u.m1; }
  __device__ i64 at_sinv(int cl, int l, int j) const { return base(cl) + u.o_sinv + (i64)l * u.nnei + j; }
  __device__ i64 at_a(int cl, int k) const { return base(cl) + u.o_a + (i64)k * u.m1; }
  __device__ i64 at_desc(int cl) const { return base(cl) + u.o_desc; }
  __device__ i64 at_dbar(int cl) const { return base(cl) + u.o_dbar; }
  __device__ i64 at_abar(int cl, int k) const { return base(cl) + u.o_abar + (i64)k * u.m1; }
  __device__ i64 at_abar_in(int cl) const { return base(cl) + u.o_abar_in; }
  __device__ i64 at_gbar(int cl, int j) const { return base(cl) + u.o_gbar + (i64)j * u.m1; }
  __device__ i64 at_rbar(int cl, int j) const { return base(cl) + u.o_rbar + 4 * (i64)j; }
  __device__ i64 at_rdbar(int cl, int j) const { return base(cl) + u.o_rdbar + 3 * (i64)j; }
  __device__ i64 at_swbar(int cl, int j) const { return base(cl) + u.o_swbar + j; }
  __device__ i64 at_obar(int cl, int j) const { return base(cl) + u.o_obar + (i64)j * u.h; }
  __device__ i64 at_qkvbar(int cl, int j) const { return base(cl) + u.o_qkvbar + (i64)j * 3 * u.h; }
  __device__ i64 at_nn(int cl, int j) const { return base(cl) + u.o_nn + (i64)j * u.nnei; }
  __device__ i64 at_cbar(int cl, int j) const { return base(cl) + u.o_cbar + (i64)j * u.nnei; }
  __device__ i64 at_ebar(int cl, int j) const { return base(cl) + u.o_ebar + (i64)j * u.nnei; }
  __device__ i64 at_grad(int cl) const { return base(cl) + u.o_grad; }
  __device__ i64 at_adj(int cl, int j) const { return base(cl) + u.o_adj + (i64)j * (u.m1 + 5); }

  __device__ int lp_w_in(int l) const { return l * u.layer_len; }
  __device__ int lp_b_in(int l) const { return lp_w_in(l) + 3 * u.h * u.m1; }
  __device__ int lp_w_out(int l) const { return lp_b_in(l) + 3 * u.h; }
  __device__ int lp_b_out(int l) const { return lp_w_out(l) + u.h * u.m1; }
  __device__ int lp_gamma(int l) const { return lp_b_out(l) + u.m1; }
  __device__ int lp_beta(int l) const { return lp_gamma(l) + u.m1; }

  __device__ N normalize_at(i64 at, int k) const {
    N sq = c(T(0));
    for (int e = 0; e < k; ++e) {
      N v = ld(at + e);
      sq = sq + v * v;
    }
    N nr = O::root(sq);
    if (O::val(nr) < T(ATTN_NORM_FLOOR)) nr = c(T(ATTN_NORM_FLOOR));
    for (int e = 0; e < k; ++e) st(at + e, ld(at + e) / nr);
    return nr;
  }

  __device__ bool on(int cl, int j) const { return u.is_smooth != 0 || is_real(cl, j); }

  __device__ void softmax_row(int cl, int l, int j, int n) const {
    i64 lg = at_logit(cl, l, j), pr = at_p(cl, l, j), wr = at_w(cl, l, j);
    if (!on(cl, j)) {
      for (int k = 0; k < n; ++k) {
        st(pr + k, c(T(0)));
        st(wr + k, c(T(0)));
      }
      return;
    }
    int m = u.m1;
    bool smooth = u.is_smooth != 0;
    N sj = sv(cl, j, m + 4);
    N shift = c(T(ATTN_SHIFT));
    T mx = T(0);
    bool seen = false;
    for (int k = 0; k < n; ++k) {
      if (!on(cl, k)) continue;
      N lv = ld(lg + k) * cst[0];
      st(lg + k, lv);
      N pv = lv;
      if (smooth) pv = (lv + shift) * sj * sv(cl, k, m + 4) - shift;
      st(pr + k, pv);
      if (!seen || O::val(pv) > mx) {
        mx = O::val(pv);
        seen = true;
      }
    }
    N sum = c(T(0));
    for (int k = 0; k < n; ++k) {
      N e = c(T(0));
      if (on(cl, k)) e = O::exp_nonpos(ld(pr + k) - c(mx));
      st(pr + k, e);
      sum = sum + e;
    }
    if (smooth)
      for (int r = n; r < u.nnei; ++r) sum = sum + ld(pr + n - 1);
    N inv = c(T(1)) / sum;
    for (int k = 0; k < n; ++k) {
      N pv = ld(pr + k) * inv;
      st(pr + k, pv);
      N mv = pv;
      if (smooth) mv = pv * sj * sv(cl, k, m + 4);
      if (u.use_dotr != 0) mv = mv * ld(at_dotr(cl, j, k));
      st(wr + k, mv);
    }
  }

  __device__ void layer_norm_row(int cl, int l, int i) const {
    int m = u.m1;
    i64 gi = at_g(cl, l, i), go = at_g(cl, l + 1, i), zi = at_z(cl, i), xh = at_xhat(cl, l, i);
    N mu = c(T(0));
    for (int k = 0; k < m; ++k) {
      N x = ld(gi + k) + ld(zi + k);
      st(xh + k, x);
      mu = mu + x;
    }
    mu = mu * cst[3];
    N var = c(T(0));
    for (int k = 0; k < m; ++k) {
      N x = ld(xh + k) - mu;
      st(xh + k, x);
      var = var + x * x;
    }
    N s = O::root(var * cst[3] + c(cst[1]));
    N sinv = c(T(1)) / s;
    st(at_sinv(cl, l, i), sinv);
    for (int k = 0; k < m; ++k) {
      N x = ld(xh + k) * sinv;
      st(xh + k, x);
      st(go + k, x * lp[lp_gamma(l) + k] + c(lp[lp_beta(l) + k]));
    }
  }

  __device__ void forward(int cl, int t, int n) const {
    int m = u.m1, h = u.h, h3 = 3 * h;
    for (int j = t; j < n; j += ATTN_WG) {
      i64 rd = at_rdir(cl, j);
      for (int k = 0; k < 3; ++k) st(rd + k, sv(cl, j, m + 1 + k));
      normalize_at(rd, 3);
    }
    __syncthreads();
    if (u.use_dotr != 0) {
      for (int e = t; e < n * n; e += ATTN_WG) {
        int j = e / n, k = e % n;
        N d = c(T(0));
        for (int x = 0; x < 3; ++x) d = d + ld(at_rdir(cl, j) + x) * ld(at_rdir(cl, k) + x);
        st(at_dotr(cl, j, k), d);
      }
    }
    for (int e = t; e < n * m; e += ATTN_WG) st(at_g(cl, 0, e / m) + e % m, sv(cl, e / m, e % m));
    __syncthreads();
    for (int l = 0; l < u.nlayers; ++l) {
      for (int e = t; e < n * h3; e += ATTN_WG) {
        int j = e / h3, o = e % h3;
        i64 g = at_g(cl, l, j);
        N acc = c(lp[lp_b_in(l) + o]);
        for (int k = 0; k < m; ++k) acc = acc + ld(g + k) * lp[lp_w_in(l) + k * h3 + o];
        st(at_qkv(cl, l, j) + o, acc);
      }
      __syncthreads();
      if (u.use_norm != 0) {
        for (int e = t; e < n * 3; e += ATTN_WG) {
          N nr = normalize_at(at_qkv(cl, l, e / 3) + (e % 3) * h, h);
          st(at_nrm(cl, l, e / 3) + e % 3, nr);
        }
        __syncthreads();
      }
      for (int e = t; e < n * n; e += ATTN_WG) {
        i64 q = at_qkv(cl, l, e / n), k = at_qkv(cl, l, e % n) + h;
        N acc = c(T(0));
        for (int x = 0; x < h; ++x) acc = acc + ld(q + x) * ld(k + x);
        st(at_logit(cl, l, e / n) + e % n, acc);
      }
      __syncthreads();
      for (int j = t; j < n; j += ATTN_WG) softmax_row(cl, l, j, n);
      __syncthreads();
      for (int e = t; e < n * h; e += ATTN_WG) {
        int j = e / h, x = e % h;
        i64 w = at_w(cl, l, j);
        N acc = c(T(0));
        for (int k = 0; k < n; ++k) acc = acc + ld(w + k) * ld(at_qkv(cl, l, k) + 2 * h + x);
        st(at_o(cl, l, j) + x, acc);
      }
      __syncthreads();
      for (int e = t; e < n * m; e += ATTN_WG) {
        int j = e / m, k = e % m;
        i64 o = at_o(cl, l, j);
        N acc = c(lp[lp_b_out(l) + k]);
        for (int x = 0; x < h; ++x) acc = acc + ld(o + x) * lp[lp_w_out(l) + x * m + k];
        st(at_z(cl, j) + k, acc);
      }
      __syncthreads();
      for (int j = t; j < n; j += ATTN_WG) layer_norm_row(cl, l, j);
      __syncthreads();
    }
    T inv_nnei = cst[2];
    for (int e = t; e < 4 * m; e += ATTN_WG) {
      int k = e / m, cc = e % m;
      N acc = c(T(0));
      for (int j = 0; j < n; ++j) {
        N x = ld(at_g(cl, u.nlayers, j) + cc) * (sv(cl, j, m + k) * inv_nnei);
        for (int r = 0; r < copies(j, n); ++r) acc = acc + x;
      }
      st(at_a(cl, k) + cc, acc);
    }
    __syncthreads();
    for (int e = t; e < m * u.m2; e += ATTN_WG) {
      int cc = e / u.m2, b = e % u.m2;
      N acc = c(T(0));
      for (int k = 0; k < 4; ++k) acc = acc + ld(at_a(cl, k) + cc) * ld(at_a(cl, k) + b);
      st(at_desc(cl) + e, acc);
    }
    __syncthreads();
  }

  // The centre's forward on the slots it takes (found by thread 0); returns n.
  __device__ int forward_taken(int cl, int t) const {
    __shared__ int taken;
    if (t == 0) taken = slots_taken(cl);
    __syncthreads();
    int n = taken;
    forward(cl, t, n);
    return n;
  }

  __device__ void normalize_backward_at(i64 y, N nr, i64 yb, int k) const {
    N yy = c(T(0));
    if (O::val(nr) != T(ATTN_NORM_FLOOR))
      for (int e = 0; e < k; ++e) yy = yy + ld(y + e) * ld(yb + e);
    for (int e = 0; e < k; ++e) st(yb + e, (ld(yb + e) - ld(y + e) * yy) / nr);
  }

  __device__ void softmax_backward_row(int cl, int l, int j, int n) const {
    i64 br = at_nn(cl, j), cb = at_cbar(cl, j), eb = at_ebar(cl, j);
    bool dotr = u.use_dotr != 0, smooth = u.is_smooth != 0;
    if (!on(cl, j)) {
      for (int k = 0; k < n; ++k) {
        st(br + k, c(T(0)));
        if (dotr) st(cb + k, c(T(0)));
      }
      return;
    }
    int m = u.m1;
    N sj = sv(cl, j, m + 4);
    i64 pr = at_p(cl, l, j), lr = at_logit(cl, l, j);
    N pdot = c(T(0));
    for (int k = 0; k < n; ++k) {
      if (!on(cl, k)) {
        st(br + k, c(T(0)));
        if (dotr) st(cb + k, c(T(0)));
        continue;
      }
      N ab = ld(br + k), pk = ld(pr + k);
      N mbar = ab;
      if (dotr) {
        N mjk = pk;
        if (smooth) mjk = pk * sj * sv(cl, k, m + 4);
        st(cb + k, ab * mjk);
        mbar = ab * ld(at_dotr(cl, j, k));
      }
      N bv = mbar;
      if (smooth) {
        st(eb + k, mbar * pk);
        bv = mbar * sj * sv(cl, k, m + 4);
      }
      st(br + k, bv);
      pdot = pdot + pk * bv;
    }
    for (int k = 0; k < n; ++k) {
      if (!on(cl, k)) continue;
      N lpbar = ld(pr + k) * (ld(br + k) - pdot);
      N r = lpbar;
      if (smooth) {
        st(eb + k, ld(eb + k) + lpbar * (ld(lr + k) + c(T(ATTN_SHIFT))));
        r = lpbar * sj * sv(cl, k, m + 4);
      }
      st(br + k, r * cst[0]);
    }
  }

  // A centre's rows in ws: row j's `width` numbers from at + j·stride.
  struct Rows {
    i64 at;
    int stride, width;
  };

  // The gradient of a dense layer y = x W + b over a centre's n rows into ws at w and b:
  // W̄[a][c] = Σ_j x_j[a] ȳ_j[c], b̄[c] = Σ_j ȳ_j[c], the last row once per slot it stands for.
  __device__ void dense_grad(int t, int n, Rows x, Rows ybar, i64 w, i64 b) const {
    for (int e = t; e < x.width * ybar.width; e += ATTN_WG) {
      int a = e / ybar.width, cc = e % ybar.width;
      N s = c(T(0));
      for (int j = 0; j < n; ++j)
        s = s + ld(x.at + (i64)j * x.stride + a) * ld(ybar.at + (i64)j * ybar.stride + cc);
      st(w + e, s);
    }
    for (int cc = t; cc < ybar.width; cc += ATTN_WG) {
      N s = c(T(0));
      for (int j = 0; j < n; ++j)
        for (int r = 0; r < copies(j, n); ++r) s = s + ld(ybar.at + (i64)j * ybar.stride + cc);
      st(b + cc, s);
    }
  }

  __device__ void backward(int cl, int t, int n) const {
    int m = u.m1, m2 = u.m2, h = u.h, h3 = 3 * h, nl = u.nlayers;
    T inv_nnei = cst[2], inv_m = cst[3];
    bool want_grad = u.want_grad != 0;
    for (int e = t; e < 4 * m; e += ATTN_WG) {
      int k = e / m, cc = e % m;
      i64 ak = at_a(cl, k);
      N s = c(T(0));
      for (int b = 0; b < m2; ++b) s = s + ld(at_dbar(cl) + cc * m2 + b) * ld(ak + b);
      if (cc < m2)
        for (int cp = 0; cp < m; ++cp) s = s + ld(at_dbar(cl) + cp * m2 + cc) * ld(ak + cp);
      // A tensor fitting's Ā (attn_block_abar).
      if (u.with_abar != 0) s = s + ld(at_abar_in(cl) + e);
      st(at_abar(cl, k) + cc, s);
    }
    __syncthreads();
    for (int e = t; e < n * m; e += ATTN_WG) {
      int j = e / m, cc = e % m;
      N s = c(T(0));
      for (int k = 0; k < 4; ++k) s = s + ld(at_abar(cl, k) + cc) * (sv(cl, j, m + k) * inv_nnei);
      st(at_gbar(cl, j) + cc, s);
    }
    for (int e = t; e < n * 4; e += ATTN_WG) {
      int j = e / 4, k = e % 4;
      N s = c(T(0));
      for (int cc = 0; cc < m; ++cc) s = s + ld(at_abar(cl, k) + cc) * ld(at_g(cl, nl, j) + cc);
      st(at_rbar(cl, j) + k, s * inv_nnei);
    }
    for (int j = t; j < n; j += ATTN_WG) {
      st(at_swbar(cl, j), c(T(0)));
      for (int x = 0; x < 3; ++x) st(at_rdbar(cl, j) + x, c(T(0)));
    }
    __syncthreads();
    for (int li = 0; li < nl; ++li) {
      int l = nl - 1 - li;
      i64 lg = at_grad(cl) + (i64)l * u.layer_len;
      if (want_grad) {
        for (int cc = t; cc < m; cc += ATTN_WG) {
          N gg = c(T(0)), gb = c(T(0));
          for (int i = 0; i < n; ++i) {
            N y = ld(at_gbar(cl, i) + cc);
            N x = y * ld(at_xhat(cl, l, i) + cc);
            for (int r = 0; r < copies(i, n); ++r) {
              gg = gg + x;
              gb = gb + y;
            }
          }
          st(lg + lp_gamma(0) + cc, gg);
          st(lg + lp_beta(0) + cc, gb);
        }
        __syncthreads();
      }
      for (int i = t; i < n; i += ATTN_WG) {
        i64 gb = at_gbar(cl, i), zb = at_z(cl, i), xh = at_xhat(cl, l, i);
        N mw = c(T(0)), mxw = c(T(0));
        for (int cc = 0; cc < m; ++cc) {
          N w = ld(gb + cc) * lp[lp_gamma(l) + cc];
          st(zb + cc, w);
          mw = mw + w;
          mxw = mxw + ld(xh + cc) * w;
        }
        mw = mw * inv_m;
        mxw = mxw * inv_m;
        N sinv = ld(at_sinv(cl, l, i));
        for (int cc = 0; cc < m; ++cc) {
          N z = (ld(zb + cc) - mw - ld(xh + cc) * mxw) * sinv;
          st(zb + cc, z);
          st(gb + cc, z);
        }
      }
      __syncthreads();
      for (int e = t; e < n * h; e += ATTN_WG) {
        int j = e / h, x = e % h;
        N s = c(T(0));
        for (int cc = 0; cc < m; ++cc) s = s + ld(at_z(cl, j) + cc) * lp[lp_w_out(l) + x * m + cc];
        st(at_obar(cl, j) + x, s);
      }
      if (want_grad) {
        Rows o{at_o(cl, l, 0), h, h}, z{at_z(cl, 0), m, m};
        dense_grad(t, n, o, z, lg + lp_w_out(0), lg + lp_b_out(0));
      }
      __syncthreads();
      for (int e = t; e < n * n; e += ATTN_WG) {
        int j = e / n, k = e % n;
        N s = c(T(0));
        for (int x = 0; x < h; ++x) s = s + ld(at_obar(cl, j) + x) * ld(at_qkv(cl, l, k) + 2 * h + x);
        st(at_nn(cl, j) + k, s);
      }
      for (int e = t; e < n * h; e += ATTN_WG) {
        int k = e / h, x = e % h;
        N s = c(T(0));
        for (int j = 0; j < n; ++j) s = s + ld(at_w(cl, l, j) + k) * ld(at_obar(cl, j) + x);
        st(at_qkvbar(cl, k) + 2 * h + x, s);
      }
      __syncthreads();
      for (int j = t; j < n; j += ATTN_WG) softmax_backward_row(cl, l, j, n);
      __syncthreads();
      if (u.use_dotr != 0) {
        for (int e = t; e < n * 3; e += ATTN_WG) {
          int j = e / 3, x = e % 3;
          N s = ld(at_rdbar(cl, j) + x);
          for (int k = 0; k < n; ++k) s = s + ld(at_cbar(cl, j) + k) * ld(at_rdir(cl, k) + x);
          for (int k = 0; k < n; ++k) s = s + ld(at_cbar(cl, k) + j) * ld(at_rdir(cl, k) + x);
          st(at_rdbar(cl, j) + x, s);
        }
      }
      if (u.is_smooth != 0) {
        for (int j = t; j < n; j += ATTN_WG) {
          N s = ld(at_swbar(cl, j));
          for (int k = 0; k < n; ++k) s = s + ld(at_ebar(cl, j) + k) * sv(cl, k, m + 4);
          for (int k = 0; k < n; ++k) s = s + ld(at_ebar(cl, k) + j) * sv(cl, k, m + 4);
          st(at_swbar(cl, j), s);
        }
      }
      for (int e = t; e < n * 2 * h; e += ATTN_WG) {
        int j = e / (2 * h), x = e % (2 * h);
        N s = c(T(0));
        if (x < h) {
          for (int k = 0; k < n; ++k) s = s + ld(at_nn(cl, j) + k) * ld(at_qkv(cl, l, k) + h + x);
        } else {
          for (int k = 0; k < n; ++k) s = s + ld(at_nn(cl, k) + j) * ld(at_qkv(cl, l, k) + x - h);
        }
        st(at_qkvbar(cl, j) + x, s);
      }
      __syncthreads();
      if (u.use_norm != 0) {
        for (int e = t; e < n * 3; e += ATTN_WG) {
          int j = e / 3, part = (e % 3) * h;
          N nr = ld(at_nrm(cl, l, j) + e % 3);
          normalize_backward_at(at_qkv(cl, l, j) + part, nr, at_qkvbar(cl, j) + part, h);
        }
        __syncthreads();
      }
      for (int e = t; e < n * m; e += ATTN_WG) {
        int j = e / m, cc = e % m;
        N s = c(T(0));
        for (int o = 0; o < h3; ++o) s = s + ld(at_qkvbar(cl, j) + o) * lp[lp_w_in(l) + cc * h3 + o];
        st(at_gbar(cl, j) + cc, ld(at_gbar(cl, j) + cc) + s);
      }
      if (want_grad) {
        Rows g{at_g(cl, l, 0), m, m}, qkvbar{at_qkvbar(cl, 0), h3, h3};
        dense_grad(t, n, g, qkvbar, lg + lp_w_in(0), lg + lp_b_in(0));
      }
      __syncthreads();
    }
    for (int j = t; j < n; j += ATTN_WG) {
      N sq = c(T(0));
      for (int x = 0; x < 3; ++x) {
        N v = sv(cl, j, m + 1 + x);
        sq = sq + v * v;
      }
      N nr = O::root(sq);
      if (O::val(nr) < T(ATTN_NORM_FLOOR)) nr = c(T(ATTN_NORM_FLOOR));
      normalize_backward_at(at_rdir(cl, j), nr, at_rdbar(cl, j), 3);
      for (int x = 0; x < 3; ++x) {
        i64 rb = at_rbar(cl, j) + 1 + x;
        st(rb, ld(rb) + ld(at_rdbar(cl, j) + x));
      }
    }
    __syncthreads();
  }
};

// Layer l's tensors into the packed layers, from their offsets in the model's parameters
// (W_in, b_in, W_out, b_out, γ, β; AttnOpts::layer_offsets), one thread per entry.
#define ATTN_BLOCK_PACK_PARAMS(T)                                                       \
  (AttnBlockParams u, const T* __restrict__ params, int l, int w_in, int b_in, int w_out, \
   int b_out, int gamma, int beta, T* __restrict__ lp)

template <typename T>
__device__ void attn_block_pack ATTN_BLOCK_PACK_PARAMS(T) {
  i64 e = global_index();
  if (e >= u.layer_len) return;
  int m = u.m1, h3 = 3 * u.h;
  int size[6] = {m * h3, h3, u.h * m, m, m, m};
  int from[6] = {w_in, b_in, w_out, b_out, gamma, beta};
  int k = 0, rel = (int)e;
  while (rel >= size[k]) rel -= size[k++];
  lp[(i64)l * u.layer_len + e] = params[from[k] + rel];
}
DPW_INSTANTIATE(attn_block_pack, ATTN_BLOCK_PACK_PARAMS,
                (u, params, l, w_in, b_in, w_out, b_out, gamma, beta, lp))

// The launch's slots as numbers into each centre's table (see attn_block.wgsl).
#define ATTN_BLOCK_LOAD_PARAMS(T)                                                        \
  (AttnBlockParams u, const T* __restrict__ g0, const T* __restrict__ g0p,               \
   const T* __restrict__ rhat, const T* __restrict__ rdot, const T* __restrict__ sw,     \
   const T* __restrict__ dsw, const int* __restrict__ owner, T* __restrict__ ws)

template <typename T, typename N>
__device__ void attn_block_load_n ATTN_BLOCK_LOAD_PARAMS(T) {
  using O = Num<T, N>;
  i64 id = global_index();
  int w = u.slot_w;
  if (id >= (i64)u.ncentres * u.nnei * w) return;
  i64 s = (i64)u.centre0 * u.nnei + id / w;
  int c = (int)(id % w);
  int cl = (int)(id / ((i64)u.nnei * w));
  int m = u.m1;
  T sdot = rdot[4 * s];
  N x;
  if (c < m) x = O::pair(g0[s * m + c], g0p[s * m + c] * sdot);
  else if (c < m + 4) x = O::pair(rhat[4 * s + c - m], rdot[4 * s + c - m]);
  else if (c == m + 4) x = O::pair(sw[s], dsw[s] * sdot);
  else x = O::pair(owner[s] >= 0 ? T(1) : T(0), T(0));
  Blk<T, N> b{u, nullptr, {}, ws};
  b.st(b.base(cl) + u.o_slots + id % ((i64)u.nnei * w), x);
}
template <typename T>
__device__ void attn_block_load ATTN_BLOCK_LOAD_PARAMS(T) {
  attn_block_load_n<T, T>(u, g0, g0p, rhat, rdot, sw, dsw, owner, ws);
}
template <typename T>
__device__ void attn_block_load_dual ATTN_BLOCK_LOAD_PARAMS(T) {
  attn_block_load_n<T, Dual<T>>(u, g0, g0p, rhat, rdot, sw, dsw, owner, ws);
}
DPW_INSTANTIATE(attn_block_load, ATTN_BLOCK_LOAD_PARAMS, (u, g0, g0p, rhat, rdot, sw, dsw, owner, ws))
DPW_INSTANTIATE(attn_block_load_dual, ATTN_BLOCK_LOAD_PARAMS,
                (u, g0, g0p, rhat, rdot, sw, dsw, owner, ws))

// D (on duals: Ḋ, the ε parts) of each centre of the launch, one block each.
#define ATTN_BLOCK_FORWARD_PARAMS(T)                                                   \
  (AttnBlockParams u, const T* __restrict__ lp, T alpha, T ln_eps, T inv_nnei, T inv_m, T* ws, \
   T* out)

template <typename T, typename N>
__device__ void attn_block_forward_n ATTN_BLOCK_FORWARD_PARAMS(T) {
  using O = Num<T, N>;
  int cl = blockIdx.x;
  if (cl >= u.ncentres) return;
  Blk<T, N> b{u, lp, {alpha, ln_eps, inv_nnei, inv_m}, ws};
  b.forward_taken(cl, threadIdx.x);
  i64 row = (i64)(u.centre0 + cl) * u.stride;
  for (int e = threadIdx.x; e < u.m1 * u.m2; e += ATTN_WG) {
    N x = b.ld(b.at_desc(cl) + e);
    out[row + e] = O::NS == 2 ? O::tan(x) : O::val(x);
  }
}
template <typename T>
__device__ void attn_block_forward ATTN_BLOCK_FORWARD_PARAMS(T) {
  attn_block_forward_n<T, T>(u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, out);
}
template <typename T>
__device__ void attn_block_tangent ATTN_BLOCK_FORWARD_PARAMS(T) {
  attn_block_forward_n<T, Dual<T>>(u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, out);
}
DPW_INSTANTIATE(attn_block_forward, ATTN_BLOCK_FORWARD_PARAMS,
                (u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, out))
DPW_INSTANTIATE(attn_block_tangent, ATTN_BLOCK_FORWARD_PARAMS,
                (u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, out))

// Forward then backward of each centre of the launch from its seed (value `seed`, ε part
// `seed_eps`): Ḡ, R̄, σ̄ of each of its nnei slots (at_adj), and with want_grad its gradient.
#define ATTN_BLOCK_BACKWARD_PARAMS(T)                                                   \
  (AttnBlockParams u, const T* __restrict__ lp, T alpha, T ln_eps, T inv_nnei, T inv_m, T* ws, \
   const T* __restrict__ seed, const T* __restrict__ seed_eps)

template <typename T, typename N>
__device__ void attn_block_backward_n ATTN_BLOCK_BACKWARD_PARAMS(T) {
  using O = Num<T, N>;
  int cl = blockIdx.x;
  if (cl >= u.ncentres) return;
  Blk<T, N> b{u, lp, {alpha, ln_eps, inv_nnei, inv_m}, ws};
  int t = threadIdx.x;
  int n = b.forward_taken(cl, t);
  i64 row = (i64)(u.centre0 + cl) * u.stride;
  for (int e = t; e < u.m1 * u.m2; e += ATTN_WG)
    b.st(b.at_dbar(cl) + e, O::pair(seed[row + e], seed_eps[row + e]));
  __syncthreads();
  b.backward(cl, t, n);
  int m = u.m1, w = m + 5;
  for (int e = t; e < u.nnei * w; e += ATTN_WG) {
    int r = min(e / w, n - 1), c = e % w;
    N x;
    if (c < m) x = b.ld(b.at_gbar(cl, r) + c);
    else if (c < m + 4) x = b.ld(b.at_rbar(cl, r) + c - m);
    else x = b.ld(b.at_swbar(cl, r));
    b.st(b.at_adj(cl, 0) + e, x);
  }
}
template <typename T>
__device__ void attn_block_backward ATTN_BLOCK_BACKWARD_PARAMS(T) {
  attn_block_backward_n<T, T>(u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, seed, seed_eps);
}
template <typename T>
__device__ void attn_block_dual ATTN_BLOCK_BACKWARD_PARAMS(T) {
  attn_block_backward_n<T, Dual<T>>(u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, seed, seed_eps);
}
DPW_INSTANTIATE(attn_block_backward, ATTN_BLOCK_BACKWARD_PARAMS,
                (u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, seed, seed_eps))
DPW_INSTANTIATE(attn_block_dual, ATTN_BLOCK_BACKWARD_PARAMS,
                (u, lp, alpha, ln_eps, inv_nnei, inv_m, ws, seed, seed_eps))

// The forces' q of each slot of the launch from its R̄, with ŝ̄ = Ḡ·G⁰' and σ̄ dσ/dŝ added to
// R̄[0], through the environment's Jacobian (after attn_block_backward).
#define ATTN_BLOCK_Q_PARAMS(T)                                                     \
  (AttnBlockParams u, const T* __restrict__ ws, const T* __restrict__ g0p,          \
   const T* __restrict__ dsw, const T* __restrict__ jac, T* __restrict__ q)

template <typename T>
__device__ void attn_block_q ATTN_BLOCK_Q_PARAMS(T) {
  i64 id = global_index();
  if (id >= (i64)u.ncentres * u.nnei) return;
  int m = u.m1;
  i64 s = (i64)u.centre0 * u.nnei + id;
  i64 a = (id / u.nnei) * (i64)u.per_centre + u.o_adj + (id % u.nnei) * (i64)(m + 5);
  T d = T(0);
  for (int c = 0; c < m; ++c) d = d + ws[a + c] * g0p[s * m + c];
  T rb[4];
  for (int k = 0; k < 4; ++k) rb[k] = ws[a + m + k];
  rb[0] = rb[0] + (d + ws[a + m + 4] * dsw[s]);
  for (int x = 0; x < 3; ++x) {
    T acc = T(0);
    for (int k = 0; k < 4; ++k) acc = acc + jac[12 * s + 3 * k + x] * rb[k];
    q[3 * s + x] = acc;
  }
}
DPW_INSTANTIATE(attn_block_q, ATTN_BLOCK_Q_PARAMS, (u, ws, g0p, dsw, jac, q))

// A [4][M1] of each centre of the launch, after attn_block_forward.
#define ATTN_BLOCK_ROT_PARAMS(T) (AttnBlockParams u, const T* __restrict__ ws, T* __restrict__ rot)

template <typename T>
__device__ void attn_block_rot ATTN_BLOCK_ROT_PARAMS(T) {
  i64 id = global_index();
  int am = 4 * u.m1;
  if (id >= (i64)u.ncentres * am) return;
  rot[(i64)u.centre0 * am + id] = ws[(id / am) * (i64)u.per_centre + u.o_a + id % am];
}
DPW_INSTANTIATE(attn_block_rot, ATTN_BLOCK_ROT_PARAMS, (u, ws, rot))

// A tensor fitting's Ā of each centre of the launch into its scratch, as the ε part of the
// dual reverse's cotangent (the value part, Ā's tangent, is 0), before attn_block_dual.
#define ATTN_BLOCK_ABAR_PARAMS(T) (AttnBlockParams u, T* __restrict__ ws, const T* __restrict__ abar)

template <typename T>
__device__ void attn_block_abar ATTN_BLOCK_ABAR_PARAMS(T) {
  i64 id = global_index();
  int am = 4 * u.m1;
  if (id >= (i64)u.ncentres * am) return;
  i64 at = (id / am) * (i64)u.per_centre + u.o_abar_in + id % am;
  ws[2 * at] = T(0);
  ws[2 * at + 1] = abar[(i64)u.centre0 * am + id];
}
DPW_INSTANTIATE(attn_block_abar, ATTN_BLOCK_ABAR_PARAMS, (u, ws, abar))

// The dual reverse's Ḡ⁰ (the ε parts) and Ġ̄⁰ (the values) of each slot of the launch.
#define ATTN_BLOCK_G0BAR_PARAMS(T) \
  (AttnBlockParams u, const T* __restrict__ ws, T* __restrict__ g0bar, T* __restrict__ g0dotbar)

template <typename T>
__device__ void attn_block_g0bar ATTN_BLOCK_G0BAR_PARAMS(T) {
  i64 id = global_index();
  int m = u.m1;
  if (id >= (i64)u.ncentres * u.nnei * m) return;
  i64 j = id / m;
  i64 a = (j / u.nnei) * (i64)u.per_centre + u.o_adj + (j % u.nnei) * (i64)(m + 5) + id % m;
  i64 s = (i64)u.centre0 * u.nnei * m + id;
  g0bar[s] = ws[2 * a + 1];
  g0dotbar[s] = ws[2 * a];
}
DPW_INSTANTIATE(attn_block_g0bar, ATTN_BLOCK_G0BAR_PARAMS, (u, ws, g0bar, g0dotbar))

// One tensor of the launch's centres' parameter gradients (the ε parts of entries `from..`
// of the packed layers), summed centre by centre and added to the model's from `to`.
#define ATTN_BLOCK_GRAD_PARAMS(T) \
  (AttnBlockParams u, const T* __restrict__ ws, int from, int to, int len, T* __restrict__ grad)

template <typename T>
__device__ void attn_block_grad ATTN_BLOCK_GRAD_PARAMS(T) {
  i64 e = global_index();
  if (e >= len) return;
  T acc = T(0);
  for (int cl = 0; cl < u.ncentres; ++cl)
    acc = acc + ws[2 * ((i64)cl * u.per_centre + u.o_grad + from + e) + 1];
  grad[to + e] = grad[to + e] + acc;
}
DPW_INSTANTIATE(attn_block_grad, ATTN_BLOCK_GRAD_PARAMS, (u, ws, from, to, len, grad))

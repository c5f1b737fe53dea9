// Sliced ReLU attention (arXiv 2512.11411) on CPU: one sorted sweep per (batch, head, slice).
//
// For one group (batch b, head h, slice m), with query scalars s (Tq), key scalars t (Tk),
// values v (Tk, D), the n valid keys of batch b and u_j = v_j - vbar (vbar: their mean value):
//
//     out_i += [s_i P_u(c_i) - P_tu(c_i)] / (M den_i),   den_i = sum_l |s_i - t_l|
//            = s_i (2 c_i - n) + P_t(n) - 2 P_t(c_i),
//
// with c_i = #{valid keys t_j < s_i} and P_x(c) the sum of x over the c smallest keys. Keys
// and queries are sorted once; one merge sweep over both, in ascending order, carries
// P_u, P_tu (D-wide) and P_t (scalar) from query to query, so that no prefix array is ever
// stored: the work is O((Tq + Tk) D) after the sorts, and the memory O(D) per thread beyond
// the inputs and outputs. The scalars are centred on the mean valid key (the kernel is
// shift-invariant), and every sum is accumulated in double.
//
// Backward, for output gradients g (Tq, D), w_i = 1 / (M den_i) (0 where den_i = 0), the gradient
// h_i of the loss in den_i itself (den is an output too: the shared normaliser of a local window
// reads it) and e_i = w_i (g_i . N_i) / den_i - h_i, N_i = s_i P_u(c_i) - P_tu(c_i):
//
//     dL/ds_i = w_i g_i . P_u(c_i) - e_i sum_l sign(s_i - t_l)            (ascending sweep)
//     dL/dt_j = sum_{s_i > t_j} e_i - sum_{s_i < t_j} e_i - u_j . S_w(j)    (both sweeps)
//     dL/du_j = S_sw(j) - t_j S_w(j),  S_w(j) = sum_{s_i > t_j} w_i g_i,  S_sw(j) = sum s_i w_i g_i
//                                                                         (descending sweep)
//     dL/dv_j = dL/du_j - mean over the valid keys of dL/du,
//
// that mean in closed form from the ascending sweep: sum_j dL/du_j = sum_i w_i g_i (c_i s_i - P_t(c_i))
// (key j is below query i in exactly the terms of S_w(j) and S_sw(j)), so that the descending sweep of
// the last slice writes dL/dv itself.
//
// (d den_i / d s_i = sum_l sign(s_i - t_l) and d den_i / d t_j = -sign(s_i - t_j), so h_i joins the
// terms of e_i.) Ties contribute 0 to the output; at a tie sign(0) = 0. A query whose denominator is
// 0 (all keys equal to it, or no valid key) gets 0, and so do its gradients. A group with a
// non-finite scalar gets NaN outputs and gradients (sorting needs finite scalars).
//
// Layouts: s (G, M, Tq) and t (G, M, Tk) double, G = B*H, contiguous; valid (B, Tk) uint8;
// v (B, H, Tk, D), out (B, H, Tq, D) and the gradients with any (batch, head, token) strides
// and a contiguous last dim (so that (B, T, H, D) buffers need no transposed copies); the
// forward also writes den (G, M, Tq) double, and for the backward key_order (G, M, Tk) int32
// (the valid keys in ascending order of t, then the padded keys), query_order (G, M, Tq) int32
// (ascending s) and value_mean (G, D) double (vbar); the backward reads den's gradient grad_den
// (G, M, Tq) double. The first slice's sweep writes each D-wide output row, the others add to it, so
// that no output is filled first. Groups are split over torch's intra-op threads (at::parallel_for).
// Entry points return 0, or 1 after an exception.
// The layouts, the sorting and the threads are shared with the bump kernel (sorted_sweep.h).

#include "sorted_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using namespace sorted_sweep;

// mean (D) = the mean value row over the valid keys (0 without any).
template <typename Scalar>
void valid_mean(const ValidKeys& keys, Rows<const Scalar> v, Index dim, double* __restrict mean) {
  std::fill(mean, mean + dim, 0.0);
  const Index n = keys.n();
  for (Index k = 0; k < n; ++k) {
    if (k + kAhead < n) prefetch_row(v[keys.index[k + kAhead]], dim);
    const Scalar* __restrict row = v[keys.index[k]];
#pragma omp simd
    for (Index d = 0; d < dim; ++d) mean[d] += row[d];
  }
  const double count = std::max<double>(1.0, static_cast<double>(keys.n()));
  for (Index d = 0; d < dim; ++d) mean[d] /= count;
}

// The ascending sweep's running sums: P_u, P_tu (D) and P_t over the c keys below a point.
template <typename Scalar>
struct RunningPrefix {
  std::vector<double> pu, ptu;
  double pt = 0.0;
  Index c = 0;

  void reset(Index dim) {
    pu.assign(dim, 0.0);
    ptu.assign(dim, 0.0);
    pt = 0.0;
    c = 0;
  }
  // Take in every key below `point`.
  void advance(double point, const SortedSlice& slice, Rows<const Scalar> v, const double* __restrict mean) {
    const Index dim = static_cast<Index>(pu.size());
    const Index n = static_cast<Index>(slice.ts.size());
    double* __restrict pu_ = pu.data();
    double* __restrict ptu_ = ptu.data();
    for (; c < n && slice.ts[c] < point; ++c) {
      if (c + kAhead < n) prefetch_row(v[slice.key_index[c + kAhead]], dim);
      const double tk = slice.ts[c];
      const Scalar* __restrict row = v[slice.key_index[c]];
#pragma omp simd
      for (Index d = 0; d < dim; ++d) {
        const double u = static_cast<double>(row[d]) - mean[d];
        pu_[d] += u;
        ptu_[d] += tk * u;
      }
      pt += tk;
    }
  }
};

template <typename Scalar>
void forward_group(const Shape& shape, Index g, const double* s, const double* t, const Scalar* v,
                   const std::uint8_t* valid, Scalar* out, std::int32_t* key_order, std::int32_t* query_order,
                   double* den, double* value_mean, const Index* strides) {
  const Index M = shape.slices, Tq = shape.q_len, Tk = shape.k_len, D = shape.dim;
  const Rows<const Scalar> vg = group_rows(v, strides, shape, g);
  const Rows<Scalar> og = group_rows(out, strides + 3, shape, g);
  thread_local ValidKeys keys;
  thread_local SortedSlice slice;
  thread_local RunningPrefix<Scalar> prefix;
  const std::uint8_t* valid_row = valid + (g / shape.heads) * Tk;
  keys.load(valid_row, Tk);
  double* mean = value_mean + g * D;
  valid_mean(keys, vg, D, mean);
  const Index n = keys.n();
  for (Index m = 0; m < M; ++m) {
    const Index gm = g * M + m;
    std::int32_t* ko = key_order + gm * Tk;
    std::int32_t* qo = query_order + gm * Tq;
    double* dg = den + gm * Tq;
    const bool sorted = slice.sort(s + gm * Tq, t + gm * Tk, keys.index, Tq);
    slice.save_orders(sorted, valid_row, Tk, Tq, ko, qo);
    if (!sorted) {
      fill_rows(og, Tq, D, std::numeric_limits<Scalar>::quiet_NaN());
      std::fill(dg, dg + Tq, std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    prefix.reset(D);
    for (Index q = 0; q < Tq; ++q) {
      if (q + kAhead < Tq) prefetch_row(og[slice.query_index[q + kAhead]], D);
      const double si = slice.ss[q];
      prefix.advance(si, slice, vg, mean);
      const Index i = slice.query_index[q];
      const double d_i = si * static_cast<double>(2 * prefix.c - n) + slice.total_t - 2.0 * prefix.pt;
      dg[i] = d_i;
      Scalar* __restrict row = og[i];
      if (!(d_i > 0.0)) {
        if (m == 0) std::fill(row, row + D, Scalar(0));
        continue;
      }
      const double w = 1.0 / (static_cast<double>(M) * d_i);
      const double* __restrict pu = prefix.pu.data();
      const double* __restrict ptu = prefix.ptu.data();
      if (m == 0) {
#pragma omp simd
        for (Index d = 0; d < D; ++d) row[d] = static_cast<Scalar>((si * pu[d] - ptu[d]) * w);
      } else {
#pragma omp simd
        for (Index d = 0; d < D; ++d) row[d] += static_cast<Scalar>((si * pu[d] - ptu[d]) * w);
      }
    }
  }
}

// Per-thread scratch of the backward: per sorted query e_i and w_i, the descending sweep's S_w and S_sw,
// sum_j dL/du_j over the slices so far (du_sum), and what the last slice subtracts from each row (shift).
struct BackwardScratch {
  std::vector<double> e, w, s_w, s_sw, du_sum, shift;
};

// Ascending sweep: dL/ds and e_i (per sorted query) for one slice, from the output's gradients gg and
// the denominators' gradients hg; fills scratch.e, scratch.w and adds sum_j dL/du_j into scratch.du_sum.
template <typename Scalar>
void scalar_gradients(const Shape& shape, const SortedSlice& slice, Index n, const double* mean,
                      Rows<const Scalar> vg, Rows<const Scalar> gg, const double* dg, const double* hg, double* ds,
                      BackwardScratch& scratch, RunningPrefix<Scalar>& prefix) {
  const Index M = shape.slices, Tq = shape.q_len, D = shape.dim;
  scratch.e.assign(Tq, 0.0);
  scratch.w.assign(Tq, 0.0);
  double* __restrict du_sum = scratch.du_sum.data();
  prefix.reset(D);
  Index at_or_below = 0;
  for (Index q = 0; q < Tq; ++q) {
    const double si = slice.ss[q];
    const Index i = slice.query_index[q];
    if (q + kAhead < Tq) prefetch_row(gg[slice.query_index[q + kAhead]], D);
    prefix.advance(si, slice, vg, mean);
    at_or_below = std::max(at_or_below, prefix.c);
    while (at_or_below < n && slice.ts[at_or_below] <= si) ++at_or_below;
    const double d_i = dg[i];
    ds[i] = 0.0;
    if (!(d_i > 0.0)) continue;
    const double w = 1.0 / (static_cast<double>(M) * d_i);
    const double below = w * (static_cast<double>(prefix.c) * si - prefix.pt);  // w_i (c_i s_i - P_t(c_i))
    const Scalar* __restrict grow = gg[i];
    const double* __restrict pu = prefix.pu.data();
    const double* __restrict ptu = prefix.ptu.data();
    double dot_u = 0.0, dot_tu = 0.0;
#pragma omp simd reduction(+ : dot_u, dot_tu)
    for (Index d = 0; d < D; ++d) {
      const double gd = grow[d];
      dot_u += gd * pu[d];
      dot_tu += gd * ptu[d];
      du_sum[d] += below * gd;
    }
    const double e = w * (si * dot_u - dot_tu) / d_i - hg[i];
    ds[i] = w * dot_u - e * static_cast<double>(prefix.c + at_or_below - n);
    scratch.e[q] = e;
    scratch.w[q] = w;
  }
}

// dL/dt from the denominators: sum_{s_i > t_j} e_i - sum_{s_i < t_j} e_i, written for the valid keys.
inline void key_sign_gradients(const SortedSlice& slice, const std::vector<double>& e, double* dt) {
  const Index n = static_cast<Index>(slice.ts.size()), Tq = static_cast<Index>(slice.ss.size());
  double total = 0.0;
  for (double x : e) total += x;
  double below = 0.0, at_or_below = 0.0;
  Index a = 0, b = 0;
  for (Index k = 0; k < n; ++k) {
    const double tk = slice.ts[k];
    for (; a < Tq && slice.ss[a] < tk; ++a) below += e[a];
    if (b < a) b = a, at_or_below = below;
    for (; b < Tq && slice.ss[b] <= tk; ++b) at_or_below += e[b];
    dt[slice.key_index[k]] = (total - at_or_below) - below;
  }
}

// Descending sweep: dL/du_j of this slice for the valid keys, written into du (Tk, D) by the first slice
// (``first``) and added by the others, less scratch.shift (the last slice's: the mean of dL/du over the
// slices, so that du ends as dL/dv); and -u_j . S_w(j) added into dt.
template <typename Scalar>
void value_gradients(const Shape& shape, const SortedSlice& slice, Index n, const double* __restrict mean,
                     Rows<const Scalar> vg, Rows<const Scalar> gg, Rows<Scalar> du, double* dt, bool first,
                     BackwardScratch& scratch) {
  const Index Tq = shape.q_len, D = shape.dim;
  scratch.s_w.assign(D, 0.0);
  scratch.s_sw.assign(D, 0.0);
  double* __restrict s_w = scratch.s_w.data();
  double* __restrict s_sw = scratch.s_sw.data();
  const double* __restrict shift = scratch.shift.data();
  Index q = Tq - 1;
  for (Index k = n - 1; k >= 0; --k) {
    if (k >= kAhead) {
      const Index ahead = slice.key_index[k - kAhead];
      prefetch_row(vg[ahead], D);
      prefetch_row(du[ahead], D);
    }
    const double tk = slice.ts[k];
    for (; q >= 0 && slice.ss[q] > tk; --q) {
      if (q >= kAhead) prefetch_row(gg[slice.query_index[q - kAhead]], D);
      const double w = scratch.w[q], sw = slice.ss[q] * w;
      if (w == 0.0) continue;
      const Scalar* __restrict grow = gg[slice.query_index[q]];
#pragma omp simd
      for (Index d = 0; d < D; ++d) {
        s_w[d] += w * grow[d];
        s_sw[d] += sw * grow[d];
      }
    }
    const Index j = slice.key_index[k];
    const Scalar* __restrict row = vg[j];
    Scalar* __restrict du_row = du[j];
    double dot = 0.0;
    if (first) {
#pragma omp simd reduction(+ : dot)
      for (Index d = 0; d < D; ++d) {
        du_row[d] = static_cast<Scalar>(s_sw[d] - tk * s_w[d] - shift[d]);
        dot += (static_cast<double>(row[d]) - mean[d]) * s_w[d];
      }
    } else {
#pragma omp simd reduction(+ : dot)
      for (Index d = 0; d < D; ++d) {
        du_row[d] = static_cast<Scalar>(du_row[d] + (s_sw[d] - tk * s_w[d] - shift[d]));
        dot += (static_cast<double>(row[d]) - mean[d]) * s_w[d];
      }
    }
    dt[j] -= dot;
  }
}

template <typename Scalar>
void backward_group(const Shape& shape, Index g, const Scalar* grad, const double* grad_den, const double* s,
                    const double* t, const Scalar* v, const std::uint8_t* valid, const std::int32_t* key_order,
                    const std::int32_t* query_order, const double* den, const double* value_mean, double* ds,
                    double* dt, Scalar* dv, const Index* strides) {
  const Index M = shape.slices, Tq = shape.q_len, Tk = shape.k_len, D = shape.dim;
  const Rows<const Scalar> gg = group_rows(grad, strides, shape, g);
  const Rows<const Scalar> vg = group_rows(v, strides + 3, shape, g);
  const Rows<Scalar> dvg = group_rows(dv, strides + 6, shape, g);
  thread_local ValidKeys keys;
  thread_local SortedSlice slice;
  thread_local RunningPrefix<Scalar> prefix;
  thread_local BackwardScratch scratch;
  const std::uint8_t* valid_row = valid + (g / shape.heads) * Tk;
  keys.load(valid_row, Tk);
  const Index n = keys.n();
  const double* mean = value_mean + g * D;
  for (Index j = 0; j < Tk; ++j)  // the sweeps write the valid keys' rows only
    if (!valid_row[j]) std::fill(dvg[j], dvg[j] + D, Scalar(0));
  scratch.du_sum.assign(D, 0.0);
  scratch.shift.assign(D, 0.0);
  bool finite = true;
  for (Index m = 0; m < M; ++m) {
    const Index gm = g * M + m;
    double* dtm = dt + gm * Tk;
    std::fill(dtm, dtm + Tk, 0.0);
    slice.load(s + gm * Tq, t + gm * Tk, keys.index, key_order + gm * Tk, query_order + gm * Tq, Tq);
    scalar_gradients(shape, slice, n, mean, vg, gg, den + gm * Tq, grad_den + gm * Tq, ds + gm * Tq, scratch,
                     prefix);
    for (Index i = 0; i < Tq; ++i) finite = finite && !std::isnan(den[gm * Tq + i]);
    key_sign_gradients(slice, scratch.e, dtm);
    if (m == M - 1 && n > 0)  // v enters through u = v - vbar: dL/dv is dL/du less its mean over the valid keys
      for (Index d = 0; d < D; ++d) scratch.shift[d] = scratch.du_sum[d] / static_cast<double>(n);
    value_gradients(shape, slice, n, mean, vg, gg, dvg, dtm, m == 0, scratch);
  }
  if (!finite) {
    fill_rows(dvg, Tk, D, std::numeric_limits<Scalar>::quiet_NaN());
    std::fill(ds + g * M * Tq, ds + (g + 1) * M * Tq, std::numeric_limits<double>::quiet_NaN());
    std::fill(dt + g * M * Tk, dt + (g + 1) * M * Tk, std::numeric_limits<double>::quiet_NaN());
  }
}

}  // namespace

// strides: (batch, head, token) element strides of v and out (forward), of grad, v and dv
// (backward); the last dim of each is contiguous.
#define SLICED_RELU_ENTRY_POINTS(SUFFIX, Scalar)                                                                  \
  SORTED_SWEEP_ENTRY_POINT(sliced_relu_forward_##SUFFIX, forward_group<Scalar>,                                   \
                           (const double* s, const double* t, const Scalar* v, const std::uint8_t* valid,         \
                            Scalar* out, std::int32_t* key_order, std::int32_t* query_order, double* den,         \
                            double* value_mean, const Index* strides),                                            \
                           (s, t, v, valid, out, key_order, query_order, den, value_mean, strides))               \
  SORTED_SWEEP_ENTRY_POINT(sliced_relu_backward_##SUFFIX, backward_group<Scalar>,                                 \
                           (const Scalar* grad, const double* grad_den, const double* s, const double* t,        \
                            const Scalar* v, const std::uint8_t* valid, const std::int32_t* key_order,            \
                            const std::int32_t* query_order, const double* den, const double* value_mean,         \
                            double* ds, double* dt, Scalar* dv, const Index* strides),                            \
                           (grad, grad_den, s, t, v, valid, key_order, query_order, den, value_mean, ds, dt, dv,  \
                            strides))

SLICED_RELU_ENTRY_POINTS(f32, float)
SLICED_RELU_ENTRY_POINTS(f64, double)

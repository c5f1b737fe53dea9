// Sliced ReLU bump attention (the second kernel of arXiv 2512.11411's code) on CPU: sorted sweeps
// per (batch, head, slice), in the design of sliced_relu_cpu.cpp (layouts, sorting and threads:
// sorted_sweep.h).
//
// For one group (batch b, head h, slice m), with query scalars s (Tq), key scalars t (Tk), values
// v (Tk, D), the slice's bandwidth b > 0, the n valid keys of batch b and q = 1 / (M n) (0 when
// n = 0):
//
//     out_i += q sum_j k(s_i - t_j) v_j,    k(d) = max(0, 1 - |d| / b).
//
// With the keys in ascending order of t, P(c) = sum_{p<c} v_p and P_t(c) = sum_{p<c} t_p v_p, and
// the window of a point s given by the ranks l = #{t <= s - b}, c = #{t < s}, r = #{t < s + b}:
//
//     sum_j k(s - t_j) v_j = (1 - s/b) (P(c) - P(l)) + (P_t(c) - P_t(l)) / b
//                          + (1 + s/b) (P(r) - P(c)) - (P_t(r) - P_t(c)) / b.
//
// One ascending sweep over the sorted queries moves three cursors l <= c <= r through the sorted
// keys, each carrying its running (P, P_t) in double, so that no prefix array is stored: the work
// is O((Tq + Tk) D) after the sorts (each key row is read by each cursor once), the memory O(D)
// per thread beyond the inputs and outputs. The scalars are centred on the mean valid key.
//
// Backward, for output gradients g (Tq, D) and, over the window of s_i,
// A_i = sum_{t>s_i} v - sum_{t<s_i} v = P(r) - 2 P(c) + P(l) - (the keys tied with s_i) and
// E_i = sum |s_i - t| v = P_t(l) - 2 P_t(c) + P_t(r) - s_i (P(r) - 2 P(c) + P(l)):
//
//     dL/ds_i = q/b g_i . A_i,    dL/db = q/b^2 sum_i g_i . E_i          (the forward's sweep again)
//     dL/dv_j = q sum_i k(s_i - t_j) g_i,
//     dL/dt_j = q/b v_j . (sum_{s_i>t_j} g_i - sum_{s_i<t_j} g_i)            (a sweep over the keys)
//
// the sums over i running over the queries within b of t_j: the kernel is symmetric, so the second
// sweep is the first with the roles swapped (cursors through the queries sorted by s, carrying
// sum g and sum s g). At a kink the gradient takes slope 0, as in the torch implementation: a key
// tied with a query counts with sign 0, and a key exactly at s +- b is outside the open window.
// A group with a non-finite scalar gets NaN outputs and gradients.
//
// Beyond sorted_sweep.h's layouts: bandwidth (H, M) double; the backward writes dL/ds (G, M, Tq),
// dL/dt (G, M, Tk) and dL/db (G, M) in double. The first slice's sweep writes each D-wide row of out and
// dL/dv, the others add to it (only the padded keys' rows of dL/dv are filled, with 0). Entry points
// return 0, or 1 after an exception.

#include "sorted_sweep.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using namespace sorted_sweep;

// A cursor through rows sorted by their scalars y (ascending): the number of rows taken, `at`,
// and the running sums P = sum x and P_y = sum y x over them (double, D).
struct Cursor {
  std::vector<double> p, py;
  Index at = 0;

  void reset(Index dim) {
    p.assign(dim, 0.0);
    py.assign(dim, 0.0);
    at = 0;
  }
  // Take in the rows x[index[at]] while at < limit and taken(ys[at]).
  template <typename Scalar, typename Predicate>
  void advance(const std::vector<double>& ys, const std::vector<std::int32_t>& index, Rows<const Scalar> x,
               Index limit, Predicate taken) {
    const Index dim = static_cast<Index>(p.size());
    double* __restrict p_ = p.data();
    double* __restrict py_ = py.data();
    for (; at < limit && taken(ys[at]); ++at) {
      if (at + kAhead < limit) prefetch_row(x[index[at + kAhead]], dim);
      const double y = ys[at];
      const Scalar* __restrict row = x[index[at]];
#pragma omp simd
      for (Index d = 0; d < dim; ++d) {
        const double value = static_cast<double>(row[d]);
        p_[d] += value;
        py_[d] += y * value;
      }
    }
  }
};

// The running sums of a window's three cursors, as its formulas read them: P and P_y at l, c, r.
struct WindowSums {
  const double *l, *c, *r, *yl, *yc, *yr;
};

// The window (point - b, point + b) of a point moving up through rows sorted by y: the cursors
// l, c, r above, and the sum of the rows tied with the point (y = point, the rows [c, c')).
struct Window {
  Cursor left, below, right;
  std::vector<double> tie;
  double tie_point = 0.0;
  bool tie_ready = false;

  WindowSums sums() const {
    return {left.p.data(), below.p.data(), right.p.data(), left.py.data(), below.py.data(), right.py.data()};
  }
  void reset(Index dim) {
    left.reset(dim);
    below.reset(dim);
    right.reset(dim);
    tie.assign(dim, 0.0);
    tie_ready = false;
  }
  // Move the cursors to the window of `point` (not below the previous point's). r >= c' and l <= c
  // even where point +- b rounds to point.
  template <typename Scalar>
  void advance(double point, double b, const std::vector<double>& ys, const std::vector<std::int32_t>& index,
               Rows<const Scalar> x) {
    const Index n = static_cast<Index>(ys.size());
    const double high = point + b, low = point - b;
    right.advance(ys, index, x, n, [&](double y) { return y < high || y <= point; });
    below.advance(ys, index, x, n, [&](double y) { return y < point; });
    left.advance(ys, index, x, below.at, [&](double y) { return y <= low; });
  }
  // The sum of the rows tied with `point`, or nullptr where none is. Each tie group is summed once:
  // the points come in ascending order.
  template <typename Scalar>
  const double* ties(double point, const std::vector<double>& ys, const std::vector<std::int32_t>& index,
                     Rows<const Scalar> x) {
    const Index n = static_cast<Index>(ys.size()), dim = static_cast<Index>(tie.size());
    if (below.at >= n || ys[below.at] != point) return nullptr;
    if (!tie_ready || tie_point != point) {
      std::fill(tie.begin(), tie.end(), 0.0);
      for (Index k = below.at; k < n && ys[k] == point; ++k) {
        const Scalar* row = x[index[k]];
        for (Index d = 0; d < dim; ++d) tie[d] += row[d];
      }
      tie_point = point, tie_ready = true;
    }
    return tie.data();
  }
};

// sum_j k(point - y_j) x_j over the window, times `scale`, written to out (D) where `first` (the first
// slice's sweep), else added to it.
template <typename Scalar>
inline void add_kernel_sum(const Window& w, double point, double b, double scale, bool first, Scalar* __restrict out) {
  const double ib = 1.0 / b, left = -(1.0 - point * ib), middle = -2.0 * point * ib, right = 1.0 + point * ib;
  const Index dim = static_cast<Index>(w.tie.size());
  const WindowSums p = w.sums();
  const auto sum = [&](Index d) {
    return scale * (left * p.l[d] + middle * p.c[d] + right * p.r[d] + ib * (2.0 * p.yc[d] - p.yl[d] - p.yr[d]));
  };
  if (first) {
#pragma omp simd
    for (Index d = 0; d < dim; ++d) out[d] = static_cast<Scalar>(sum(d));
  } else {
#pragma omp simd
    for (Index d = 0; d < dim; ++d) out[d] = static_cast<Scalar>(out[d] + sum(d));
  }
}

template <typename Scalar>
void forward_group(const Shape& shape, Index g, const double* s, const double* t, const Scalar* v,
                   const double* bandwidth, const std::uint8_t* valid, Scalar* out, std::int32_t* key_order,
                   std::int32_t* query_order, const Index* strides) {
  const Index M = shape.slices, Tq = shape.q_len, Tk = shape.k_len, D = shape.dim;
  const Rows<const Scalar> vg = group_rows(v, strides, shape, g);
  const Rows<Scalar> og = group_rows(out, strides + 3, shape, g);
  thread_local ValidKeys keys;
  thread_local SortedSlice slice;
  thread_local Window window;
  const std::uint8_t* valid_row = valid + (g / shape.heads) * Tk;
  keys.load(valid_row, Tk);
  const double q = keys.n() ? 1.0 / static_cast<double>(M * keys.n()) : 0.0;
  for (Index m = 0; m < M; ++m) {
    const Index gm = g * M + m;
    const double b = bandwidth[(g % shape.heads) * M + m];
    const bool sorted = slice.sort(s + gm * Tq, t + gm * Tk, keys.index, Tq);
    slice.save_orders(sorted, valid_row, Tk, Tq, key_order + gm * Tk, query_order + gm * Tq);
    if (!sorted) {
      fill_rows(og, Tq, D, std::numeric_limits<Scalar>::quiet_NaN());
      continue;
    }
    window.reset(D);
    for (Index k = 0; k < Tq; ++k) {
      if (k + kAhead < Tq) prefetch_row(og[slice.query_index[k + kAhead]], D);
      const double point = slice.ss[k];
      window.advance(point, b, slice.ts, slice.key_index, vg);
      add_kernel_sum(window, point, b, q, m == 0, og[slice.query_index[k]]);
    }
  }
}

// The forward's sweep again: dL/ds (per query) and g . E summed over the queries, for one slice.
template <typename Scalar>
double scalar_gradients(const SortedSlice& slice, Rows<const Scalar> vg, Rows<const Scalar> gg, double b,
                        double q, double* ds, Window& window) {
  const Index Tq = static_cast<Index>(slice.ss.size()), D = static_cast<Index>(window.tie.size());
  double g_dot_e = 0.0;
  for (Index k = 0; k < Tq; ++k) {
    if (k + kAhead < Tq) prefetch_row(gg[slice.query_index[k + kAhead]], D);
    const double point = slice.ss[k];
    window.advance(point, b, slice.ts, slice.key_index, vg);
    const Scalar* __restrict grow = gg[slice.query_index[k]];
    const WindowSums p = window.sums();
    // g . A before the ties, and g . E = g . (P_t(l) - 2 P_t(c) + P_t(r)) - s (g . A before the ties).
    double a = 0.0, e = 0.0;
#pragma omp simd reduction(+ : a, e)
    for (Index d = 0; d < D; ++d) {
      const double gd = static_cast<double>(grow[d]);
      a += gd * (p.r[d] - 2.0 * p.c[d] + p.l[d]);
      e += gd * (p.yl[d] - 2.0 * p.yc[d] + p.yr[d]);
    }
    g_dot_e += e - point * a;
    if (const double* tie = window.ties(point, slice.ts, slice.key_index, vg))
      for (Index d = 0; d < D; ++d) a -= grow[d] * tie[d];
    ds[slice.query_index[k]] = q / b * a;
  }
  return g_dot_e;
}

// The sweep over the keys: writes (``first``) or adds dL/dv_j into dv and writes dL/dt_j, for the valid keys
// of one slice.
template <typename Scalar>
void key_gradients(const SortedSlice& slice, Rows<const Scalar> vg, Rows<const Scalar> gg, Rows<Scalar> dv,
                   double b, double q, bool first, double* dt, Window& window) {
  const Index n = static_cast<Index>(slice.ts.size()), D = static_cast<Index>(window.tie.size());
  for (Index k = 0; k < n; ++k) {
    const Index j = slice.key_index[k];
    if (k + kAhead < n) {
      const Index ahead = slice.key_index[k + kAhead];
      prefetch_row(vg[ahead], D);
      prefetch_row(dv[ahead], D);
    }
    const double point = slice.ts[k];
    window.advance(point, b, slice.ss, slice.query_index, gg);
    add_kernel_sum(window, point, b, q, first, dv[j]);
    const Scalar* __restrict row = vg[j];
    const WindowSums p = window.sums();
    double a = 0.0;
#pragma omp simd reduction(+ : a)
    for (Index d = 0; d < D; ++d) a += static_cast<double>(row[d]) * (p.r[d] - 2.0 * p.c[d] + p.l[d]);
    if (const double* tie = window.ties(point, slice.ss, slice.query_index, gg))
      for (Index d = 0; d < D; ++d) a -= row[d] * tie[d];
    dt[j] = q / b * a;
  }
}

template <typename Scalar>
void backward_group(const Shape& shape, Index g, const Scalar* grad, const double* s, const double* t, const Scalar* v,
                    const double* bandwidth, const std::uint8_t* valid, const std::int32_t* key_order,
                    const std::int32_t* query_order, double* ds, double* dt, Scalar* dv, double* db,
                    const Index* strides) {
  const Index M = shape.slices, Tq = shape.q_len, Tk = shape.k_len, D = shape.dim;
  const Rows<const Scalar> gg = group_rows(grad, strides, shape, g);
  const Rows<const Scalar> vg = group_rows(v, strides + 3, shape, g);
  const Rows<Scalar> dvg = group_rows(dv, strides + 6, shape, g);
  thread_local ValidKeys keys;
  thread_local SortedSlice slice;
  thread_local Window window;
  const std::uint8_t* valid_row = valid + (g / shape.heads) * Tk;
  keys.load(valid_row, Tk);
  const double q = keys.n() ? 1.0 / static_cast<double>(M * keys.n()) : 0.0;
  for (Index j = 0; j < Tk; ++j)  // the key sweeps write the valid keys' rows only
    if (!valid_row[j]) std::fill(dvg[j], dvg[j] + D, Scalar(0));
  std::fill(dt + g * M * Tk, dt + (g + 1) * M * Tk, 0.0);
  bool finite = true;
  for (Index m = 0; m < M; ++m) {
    const Index gm = g * M + m;
    const double b = bandwidth[(g % shape.heads) * M + m];
    finite = slice.load(s + gm * Tq, t + gm * Tk, keys.index, key_order + gm * Tk, query_order + gm * Tq, Tq) && finite;
    window.reset(D);
    db[gm] = q / (b * b) * scalar_gradients(slice, vg, gg, b, q, ds + gm * Tq, window);
    window.reset(D);
    key_gradients(slice, vg, gg, dvg, b, q, m == 0, dt + gm * Tk, window);
  }
  if (!finite) {
    fill_rows(dvg, Tk, D, std::numeric_limits<Scalar>::quiet_NaN());
    std::fill(ds + g * M * Tq, ds + (g + 1) * M * Tq, std::numeric_limits<double>::quiet_NaN());
    std::fill(dt + g * M * Tk, dt + (g + 1) * M * Tk, std::numeric_limits<double>::quiet_NaN());
    std::fill(db + g * M, db + (g + 1) * M, std::numeric_limits<double>::quiet_NaN());
  }
}

}  // namespace

// strides: (batch, head, token) element strides of v and out (forward), of grad, v and dv
// (backward); the last dim of each is contiguous.
#define SLICED_RELU_BUMP_ENTRY_POINTS(SUFFIX, Scalar)                                                             \
  SORTED_SWEEP_ENTRY_POINT(sliced_relu_bump_forward_##SUFFIX, forward_group<Scalar>,                             \
                           (const double* s, const double* t, const Scalar* v, const double* bandwidth,          \
                            const std::uint8_t* valid, Scalar* out, std::int32_t* key_order,                     \
                            std::int32_t* query_order, const Index* strides),                                    \
                           (s, t, v, bandwidth, valid, out, key_order, query_order, strides))                    \
  SORTED_SWEEP_ENTRY_POINT(sliced_relu_bump_backward_##SUFFIX, backward_group<Scalar>,                           \
                           (const Scalar* grad, const double* s, const double* t, const Scalar* v,               \
                            const double* bandwidth, const std::uint8_t* valid, const std::int32_t* key_order,   \
                            const std::int32_t* query_order, double* ds, double* dt, Scalar* dv, double* db,     \
                            const Index* strides),                                                               \
                           (grad, s, t, v, bandwidth, valid, key_order, query_order, ds, dt, dv, db, strides))

SLICED_RELU_BUMP_ENTRY_POINTS(f32, float)
SLICED_RELU_BUMP_ENTRY_POINTS(f64, double)

// Softmax attention within a sliding window, with its log-normaliser, on CPU: one pass over the
// queries per (batch, head) group, in O(T w D) time and O(w D) memory per thread.
//
// For one group (batch b, head h), queries q, keys k, values v (T, D), the halo h = w - 1 of the
// sliding window w and the scaling c, query i sees the valid keys j (key_padding_mask true) with
// |i - j| <= h, W(i), with scores a_ij = c q_i . k_j:
//
//     lse_i = log sum_{j in W(i)} exp(a_ij),   P_ij = exp(a_ij - lse_i),   out_i = sum_{j in W(i)} P_ij v_j.
//
// A query with no valid key gets out_i = 0, lse_i = -inf and zero gradients.
//
// Backward, for the gradients dO (T, D) of out and g (T) of lse, with delta_i = dO_i . out_i:
//
//     dS_ij = P_ij (dO_i . v_j - delta_i + g_i),
//     dq_i = c sum_j dS_ij k_j,   dk_j = c sum_i dS_ij q_i,   dv_j = sum_i P_ij dO_i,
//
// P recomputed from q, k and the saved lse: nothing pair-sized is stored, and the only buffers
// are a thread's key tiles (D x (kBlock + 2 h)) and kRows queries' scores over their span.
//
// The queries go in blocks of kBlock; the keys any of them sees, [i0 - h, i1 + h) within [0, T),
// are copied transposed into a tile (d-major), so that a query's scores are D axpys along its
// window's keys (vectorised over the keys, no horizontal sums); the weighted sums of rows are
// axpys along D. Within a block, kRows consecutive queries go together over the span of their
// windows (2 h + kRows keys; each query's own window masked inside it): every key, value, dk and dv
// row loaded serves kRows queries, which is what bounds these loops. The exponentials of a float
// span are a branch-free polynomial that vectorises (fast_exp.h), not a libm call per key. float
// and double are computed in their own precision; the row statistics (max, sum, lse) in double.
//
// Layouts (sorted_sweep.h's Shape, with slices = 1 and q_len = k_len = T): q, k, v, out and the
// gradients (B, H, T, D) with any (batch, head, token) strides and a contiguous last dim; valid
// (B, T) uint8; lse and its gradient (G, T) contiguous, G = B * H, in the values' dtype. Groups
// are split over torch's intra-op threads. Entry points return 0, or 1 after an exception.

#include "fast_exp.h"
#include "sorted_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using namespace sorted_sweep;

// Queries per block: the key tile holds kBlock + 2 h keys, copied once per block.
constexpr Index kBlock = 128;
// Queries computed together: every key (or value) row loaded serves kRows queries at once.
constexpr Index kRows = 4;
// The padding of a tile's rows and of a query's scores: one register chunk (two vectors) of floats.
constexpr Index kChunk = 16;

// Two 256-bit vectors of Scalar (GCC/Clang vector extensions, AVX where -march has it): a register chunk
// of keys (of the scores) or dims (of a weighted sum of rows), kWidth = 16 floats or 8 doubles.
// (The vector types are spelled per scalar type: GCC drops vector_size from an alias of a dependent type.)
template <typename Scalar>
struct VectorOf;
template <>
struct VectorOf<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VectorOf<double> {
  typedef double type __attribute__((vector_size(32)));
};

template <typename Scalar>
struct Chunk {
  using Vec = typename VectorOf<Scalar>::type;
  static_assert(sizeof(Vec) == 32, "a chunk is two 256-bit vectors");
  static constexpr Index kLanes = 32 / sizeof(Scalar), kWidth = 2 * kLanes;
  static Vec load(const Scalar* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(Scalar* p, Vec v) { std::memcpy(p, &v, sizeof v); }
};

// The keys [begin, end) of one block's tile, transposed: tile[d * stride + (j - begin)], each dim's
// row zero-padded by kChunk so that scores can be summed a whole chunk past a window's end.
template <typename Scalar>
struct Tile {
  std::vector<Scalar> data;
  Index begin = 0, stride = 0;

  void load(Rows<const Scalar> rows, Index from, Index to, Index dim) {
    const Index size = to - from;
    begin = from, stride = size + kChunk;
    data.assign(dim * stride, Scalar(0));
    // kRun rows at a time: each read row stays in cache while its dims are scattered.
    constexpr Index kRun = 8;
    for (Index j0 = 0; j0 < size; j0 += kRun) {
      const Index run = std::min(kRun, size - j0);
      for (Index d = 0; d < dim; ++d)
        for (Index j = 0; j < run; ++j) data[d * stride + j0 + j] = rows[from + j0 + j][d];
    }
  }
  // scores[r * ld + (j - lo)] = sum_d x[r][d] tile[d][j] for R queries' rows x and the keys lo <= j < hi
  // of the tile, a register chunk of keys at a time (2 R vectors of sums; each tile load serves R
  // queries); ld >= hi - lo rounded up to kChunk.
  template <Index R>
  void dot(const Scalar* const* x, Index lo, Index hi, Index dim, Scalar* __restrict scores, Index ld) const {
    using C = Chunk<Scalar>;
    const Index n = hi - lo;
    const Scalar* __restrict first = data.data() + (lo - begin);
    for (Index j0 = 0; j0 < n; j0 += C::kWidth) {
      typename C::Vec sum[R][2] = {};
      for (Index d = 0; d < dim; ++d) {
        const Scalar* column = first + d * stride + j0;
        const typename C::Vec low = C::load(column), high = C::load(column + C::kLanes);
        for (Index r = 0; r < R; ++r) {
          const Scalar xd = x[r][d];
          sum[r][0] += xd * low;
          sum[r][1] += xd * high;
        }
      }
      for (Index r = 0; r < R; ++r) {
        C::store(scores + r * ld + j0, sum[r][0]);
        C::store(scores + r * ld + j0 + C::kLanes, sum[r][1]);
      }
    }
  }
};

// R consecutive queries i0 .. i0 + R - 1 and their windows: query r sees the keys [lo[r], hi[r]), clipped
// to the sequence; together they see [lo[0], hi[R - 1]) (the span), n keys.
template <Index R>
struct Queries {
  Index lo[R], hi[R], first, n;
  Queries(Index i0, Index halo, Index length) {
    for (Index r = 0; r < R; ++r)
      lo[r] = std::max<Index>(0, i0 + r - halo), hi[r] = std::min(length, i0 + r + halo + 1);
    first = lo[0], n = hi[R - 1] - lo[0];
  }
  // Whether query r may attend key span index a (key first + a): in its window and valid.
  bool sees(Index r, Index a, const std::uint8_t* valid_row) const {
    const Index j = first + a;
    return j >= lo[r] && j < hi[r] && valid_row[j];
  }
  // weights[a] = exp(weights[a] - shift) where query r sees key first + a, else 0 (the float case vectorised;
  // shift is at least every seen weight).
  template <typename Scalar>
  void exp_seen(Index r, Scalar* __restrict weights, Scalar shift, const std::uint8_t* valid_row) const {
    const Index begin = lo[r] - first, end = hi[r] - first;
    const std::uint8_t* __restrict valid = valid_row + first;
    for (Index a = 0; a < n; ++a) {
      const Scalar e = fast_exp(std::min(weights[a] - shift, Scalar(0)));
      weights[a] = (a >= begin && a < end && valid[a]) ? e : Scalar(0);
    }
  }
};

// What one thread keeps between groups: the key (and value) tiles, R queries' scaled rows, their
// scores (or weights) and second scores over the span, and R weighted sums.
template <typename Scalar>
struct Workspace {
  std::vector<Scalar> query, scores, extra, sum;
  Index ld = 0;  // the span's length rounded up to kChunk: a query's row in scores and extra
  Tile<Scalar> keys, values;

  void reset(Index dim, Index halo) {
    ld = (2 * halo + kRows + kChunk - 1) / kChunk * kChunk + kChunk;
    query.resize(kRows * dim);
    sum.resize(kRows * dim);
    scores.resize(kRows * ld);
    extra.resize(kRows * ld);
  }
};

// out[r] = sum_a weights[r * ld + a] rows[first + a] over the span's n keys, for R queries: a register
// chunk of dims at a time, each row loaded once for the R queries.
template <typename Scalar, Index R>
void weighted_rows(Rows<const Scalar> rows, const Scalar* weights, Index ld, Index first, Index n, Index dim,
                   Scalar* const* out) {
  using C = Chunk<Scalar>;
  Index d0 = 0;
  for (; d0 + C::kWidth <= dim; d0 += C::kWidth) {
    typename C::Vec sum[R][2] = {};
    for (Index a = 0; a < n; ++a) {
      const Scalar* row = rows[first + a] + d0;
      const typename C::Vec low = C::load(row), high = C::load(row + C::kLanes);
      for (Index r = 0; r < R; ++r) {
        const Scalar weight = weights[r * ld + a];
        sum[r][0] += weight * low;
        sum[r][1] += weight * high;
      }
    }
    for (Index r = 0; r < R; ++r) {
      C::store(out[r] + d0, sum[r][0]);
      C::store(out[r] + d0 + C::kLanes, sum[r][1]);
    }
  }
  for (Index r = 0; r < R; ++r) std::fill(out[r] + d0, out[r] + dim, Scalar(0));
  for (Index a = 0; a < n; ++a)
    for (Index r = 0; r < R; ++r) {
      const Scalar weight = weights[r * ld + a];
      const Scalar* __restrict row = rows[first + a];
      for (Index d = d0; d < dim; ++d) out[r][d] += weight * row[d];
    }
}

// target[first + a] += scale sum_r coefficients[r * ld + a] sources[r] over the span's n rows: the transpose of
// weighted_rows. A register chunk of dims at a time holds the R sources' chunks, so that each target row is
// read and written once per chunk for the R queries; rows whose R coefficients are all 0 are skipped.
template <typename Scalar, Index R>
void accumulate_rows(Rows<Scalar> target, const Scalar* coefficients, Index ld, Scalar scale, Index first, Index n,
                     const Scalar* const* sources, Index dim) {
  using C = Chunk<Scalar>;
  Index d0 = 0;
  for (; d0 + C::kWidth <= dim; d0 += C::kWidth) {
    typename C::Vec low[R], high[R];
    for (Index r = 0; r < R; ++r) low[r] = C::load(sources[r] + d0), high[r] = C::load(sources[r] + d0 + C::kLanes);
    for (Index a = 0; a < n; ++a) {
      Scalar* row = target[first + a] + d0;
      typename C::Vec sum_low = C::load(row), sum_high = C::load(row + C::kLanes);
      bool any = false;
      for (Index r = 0; r < R; ++r) {
        const Scalar coefficient = scale * coefficients[r * ld + a];
        any = any || coefficient != Scalar(0);
        sum_low += coefficient * low[r];
        sum_high += coefficient * high[r];
      }
      if (!any) continue;
      C::store(row, sum_low);
      C::store(row + C::kLanes, sum_high);
    }
  }
  for (Index a = 0; a < n; ++a) {
    Scalar* row = target[first + a];
    for (Index r = 0; r < R; ++r) {
      const Scalar coefficient = scale * coefficients[r * ld + a];
      for (Index d = d0; d < dim; ++d) row[d] += coefficient * sources[r][d];
    }
  }
}

// The scores c q . k of R queries over their span into ws.scores (from the block's key tile).
template <typename Scalar, Index R>
void span_scores(Workspace<Scalar>& ws, Rows<const Scalar> q, Index i0, double scaling, const Queries<R>& qs,
                 Index dim) {
  const Scalar* rows[R];
  for (Index r = 0; r < R; ++r) {
    Scalar* scaled = ws.query.data() + r * dim;
    for (Index d = 0; d < dim; ++d) scaled[d] = static_cast<Scalar>(scaling * q[i0 + r][d]);
    rows[r] = scaled;
  }
  ws.keys.template dot<R>(rows, qs.first, qs.first + qs.n, dim, ws.scores.data(), ws.ld);
}

// The block [i0, i1) of queries and the tile of keys they see.
inline Index tile_begin(Index i0, Index halo) { return std::max<Index>(0, i0 - halo); }
inline Index tile_end(Index i1, Index halo, Index length) { return std::min(length, i1 + halo); }

// Softmax of R queries over their windows: out and lse of queries i0 .. i0 + R - 1.
template <typename Scalar, Index R>
void forward_rows(Workspace<Scalar>& ws, Index i0, Index halo, double scaling, Rows<const Scalar> qg,
                  Rows<const Scalar> vg, const std::uint8_t* valid_row, Rows<Scalar> og, Scalar* lse_g, Index T,
                  Index D) {
  const Queries<R> qs(i0, halo, T);
  span_scores<Scalar, R>(ws, qg, i0, scaling, qs, D);
  Scalar* out[R];
  for (Index r = 0; r < R; ++r) {
    Scalar* p = ws.scores.data() + r * ws.ld;
    out[r] = og[i0 + r];
    double top = -std::numeric_limits<double>::infinity();
    for (Index a = 0; a < qs.n; ++a)
      if (qs.sees(r, a, valid_row)) top = std::max(top, static_cast<double>(p[a]));
    if (top == -std::numeric_limits<double>::infinity()) {  // no valid key: weights 0, out 0
      std::fill(p, p + qs.n, Scalar(0));
      lse_g[i0 + r] = -std::numeric_limits<Scalar>::infinity();
      continue;
    }
    qs.exp_seen(r, p, static_cast<Scalar>(top), valid_row);
    double total = 0.0;
    for (Index a = 0; a < qs.n; ++a) total += p[a];
    const Scalar inverse = static_cast<Scalar>(1.0 / total);
    for (Index a = 0; a < qs.n; ++a) p[a] *= inverse;
    lse_g[i0 + r] = static_cast<Scalar>(top + std::log(total));
  }
  weighted_rows<Scalar, R>(vg, ws.scores.data(), ws.ld, qs.first, qs.n, D, out);
}

template <typename Scalar>
void forward_group(const Shape& shape, Index g, Index halo, double scaling, const Scalar* q, const Scalar* k,
                   const Scalar* v, const std::uint8_t* valid, Scalar* out, Scalar* lse, const Index* strides) {
  const Index T = shape.q_len, D = shape.dim;
  halo = std::min(halo, T);
  const Rows<const Scalar> qg = group_rows(q, strides, shape, g), kg = group_rows(k, strides + 3, shape, g);
  const Rows<const Scalar> vg = group_rows(v, strides + 6, shape, g);
  const Rows<Scalar> og = group_rows(out, strides + 9, shape, g);
  const std::uint8_t* valid_row = valid + (g / shape.heads) * T;
  Scalar* lse_g = lse + g * T;
  thread_local Workspace<Scalar> ws;
  ws.reset(D, halo);
  for (Index i0 = 0; i0 < T; i0 += kBlock) {
    const Index i1 = std::min(T, i0 + kBlock);
    ws.keys.load(kg, tile_begin(i0, halo), tile_end(i1, halo, T), D);
    Index i = i0;
    for (; i + kRows <= i1; i += kRows)
      forward_rows<Scalar, kRows>(ws, i, halo, scaling, qg, vg, valid_row, og, lse_g, T, D);
    for (; i < i1; ++i) forward_rows<Scalar, 1>(ws, i, halo, scaling, qg, vg, valid_row, og, lse_g, T, D);
  }
}

// The gradients from R queries i0 .. i0 + R - 1: their dq rows, and their share of dk and dv over the span.
template <typename Scalar, Index R>
void backward_rows(Workspace<Scalar>& ws, Index i0, Index halo, double scaling, Rows<const Scalar> gog,
                   const Scalar* grad_lse_g, Rows<const Scalar> qg, Rows<const Scalar> kg, Rows<const Scalar> og,
                   const std::uint8_t* valid_row, const Scalar* lse_g, Rows<Scalar> dqg, Rows<Scalar> dkg,
                   Rows<Scalar> dvg, Index T, Index D) {
  const Queries<R> qs(i0, halo, T);
  const Scalar c = static_cast<Scalar>(scaling);
  span_scores<Scalar, R>(ws, qg, i0, scaling, qs, D);
  const Scalar* go[R];
  for (Index r = 0; r < R; ++r) go[r] = gog[i0 + r];
  ws.values.template dot<R>(go, qs.first, qs.first + qs.n, D, ws.extra.data(), ws.ld);  // dO_i . v_j
  for (Index r = 0; r < R; ++r) {
    Scalar* p = ws.scores.data() + r * ws.ld;
    Scalar* ds = ws.extra.data() + r * ws.ld;
    const double log_normaliser = static_cast<double>(lse_g[i0 + r]);
    if (log_normaliser == -std::numeric_limits<double>::infinity()) {  // no valid key: no gradient
      std::fill(p, p + qs.n, Scalar(0));
      std::fill(ds, ds + qs.n, Scalar(0));
      continue;
    }
    const Scalar* __restrict o = og[i0 + r];
    double delta = 0.0;
    for (Index d = 0; d < D; ++d) delta += static_cast<double>(go[r][d]) * o[d];
    const Scalar shift = static_cast<Scalar>(grad_lse_g[i0 + r] - delta);
    qs.exp_seen(r, p, static_cast<Scalar>(log_normaliser), valid_row);
    for (Index a = 0; a < qs.n; ++a) ds[a] = p[a] * (ds[a] + shift);
  }
  Scalar* sums[R];
  for (Index r = 0; r < R; ++r) sums[r] = ws.sum.data() + r * D;
  weighted_rows<Scalar, R>(kg, ws.extra.data(), ws.ld, qs.first, qs.n, D, sums);
  const Scalar* q_rows[R];
  for (Index r = 0; r < R; ++r) {
    Scalar* __restrict dq_row = dqg[i0 + r];
    for (Index d = 0; d < D; ++d) dq_row[d] = c * sums[r][d];
    q_rows[r] = qg[i0 + r];
  }
  // dk_j += c sum_r ds_rj q_r and dv_j += sum_r p_rj dO_r over the span.
  accumulate_rows<Scalar, R>(dkg, ws.extra.data(), ws.ld, c, qs.first, qs.n, q_rows, D);
  accumulate_rows<Scalar, R>(dvg, ws.scores.data(), ws.ld, Scalar(1), qs.first, qs.n, go, D);
}

template <typename Scalar>
void backward_group(const Shape& shape, Index g, Index halo, double scaling, const Scalar* grad_out,
                    const Scalar* grad_lse, const Scalar* q, const Scalar* k, const Scalar* v,
                    const std::uint8_t* valid, const Scalar* out, const Scalar* lse, Scalar* dq, Scalar* dk,
                    Scalar* dv, const Index* strides) {
  const Index T = shape.q_len, D = shape.dim;
  halo = std::min(halo, T);
  const Rows<const Scalar> gog = group_rows(grad_out, strides, shape, g), qg = group_rows(q, strides + 3, shape, g);
  const Rows<const Scalar> kg = group_rows(k, strides + 6, shape, g), vg = group_rows(v, strides + 9, shape, g);
  const Rows<const Scalar> og = group_rows(out, strides + 12, shape, g);
  const Rows<Scalar> dqg = group_rows(dq, strides + 15, shape, g), dkg = group_rows(dk, strides + 18, shape, g);
  const Rows<Scalar> dvg = group_rows(dv, strides + 21, shape, g);
  const std::uint8_t* valid_row = valid + (g / shape.heads) * T;
  const Scalar *lse_g = lse + g * T, *grad_lse_g = grad_lse + g * T;
  fill_rows(dkg, T, D, Scalar(0));
  fill_rows(dvg, T, D, Scalar(0));
  thread_local Workspace<Scalar> ws;
  ws.reset(D, halo);
  for (Index i0 = 0; i0 < T; i0 += kBlock) {
    const Index i1 = std::min(T, i0 + kBlock), begin = tile_begin(i0, halo), end = tile_end(i1, halo, T);
    ws.keys.load(kg, begin, end, D);
    ws.values.load(vg, begin, end, D);
    Index i = i0;
    for (; i + kRows <= i1; i += kRows)
      backward_rows<Scalar, kRows>(ws, i, halo, scaling, gog, grad_lse_g, qg, kg, og, valid_row, lse_g, dqg, dkg,
                                   dvg, T, D);
    for (; i < i1; ++i)
      backward_rows<Scalar, 1>(ws, i, halo, scaling, gog, grad_lse_g, qg, kg, og, valid_row, lse_g, dqg, dkg, dvg,
                               T, D);
  }
}

}  // namespace

// The sizes (B, H, 1, T, T, D) and, before the tensors, the window's halo h = w - 1 and the scaling.
// strides: (batch, head, token) element strides of q, k, v, out (forward), of grad_out, q, k, v,
// out, dq, dk, dv (backward); the last dim of each is contiguous.
#define WINDOWED_SOFTMAX_ENTRY_POINTS(SUFFIX, Scalar)                                                           \
  SORTED_SWEEP_ENTRY_POINT(windowed_softmax_forward_##SUFFIX, forward_group<Scalar>,                           \
                           (Index halo, double scaling, const Scalar* q, const Scalar* k, const Scalar* v,     \
                            const std::uint8_t* valid, Scalar* out, Scalar* lse, const Index* strides),        \
                           (halo, scaling, q, k, v, valid, out, lse, strides))                                 \
  SORTED_SWEEP_ENTRY_POINT(windowed_softmax_backward_##SUFFIX, backward_group<Scalar>,                         \
                           (Index halo, double scaling, const Scalar* grad_out, const Scalar* grad_lse,        \
                            const Scalar* q, const Scalar* k, const Scalar* v, const std::uint8_t* valid,      \
                            const Scalar* out, const Scalar* lse, Scalar* dq, Scalar* dk, Scalar* dv,          \
                            const Index* strides),                                                             \
                           (halo, scaling, grad_out, grad_lse, q, k, v, valid, out, lse, dq, dk, dv, strides))

WINDOWED_SOFTMAX_ENTRY_POINTS(f32, float)
WINDOWED_SOFTMAX_ENTRY_POINTS(f64, double)

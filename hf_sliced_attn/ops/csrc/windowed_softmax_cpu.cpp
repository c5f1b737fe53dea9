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
// are a thread's key tiles (D x (kBlock + 2 h)) and one query's scores (2 h + 1).
//
// The queries go in blocks of kBlock; the keys any of them sees, [i0 - h, i1 + h) within [0, T),
// are copied transposed into a tile (d-major), so that a query's scores are D axpys along its
// window's keys (vectorised over the keys, no horizontal sums); the weighted sums of rows are
// axpys along D. float and double are computed in their own precision; the row statistics (max,
// sum, lse) in double.
//
// Layouts (sorted_sweep.h's Shape, with slices = 1 and q_len = k_len = T): q, k, v, out and the
// gradients (B, H, T, D) with any (batch, head, token) strides and a contiguous last dim; valid
// (B, T) uint8; lse and its gradient (G, T) contiguous, G = B * H, in the values' dtype. Groups
// are split over torch's intra-op threads. Entry points return 0, or 1 after an exception.

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
// Keys (of a query's scores) or dims (of a weighted sum of rows) summed in registers at a time.
constexpr Index kChunk = 32;

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
  // scores[j - lo] = sum_d x[d] tile[d][j] for the keys lo <= j < hi of the tile, kChunk keys at a
  // time summed in registers; scores holds hi - lo rounded up to kChunk (the rest is not used).
  void dot(const Scalar* __restrict x, Index lo, Index hi, Index dim, Scalar* __restrict scores) const {
    const Index n = hi - lo;
    const Scalar* __restrict first = data.data() + (lo - begin);
    for (Index j0 = 0; j0 < n; j0 += kChunk) {
      Scalar sum[kChunk] = {};
      for (Index d = 0; d < dim; ++d) {
        const Scalar xd = x[d];
        const Scalar* __restrict column = first + d * stride + j0;
        for (Index j = 0; j < kChunk; ++j) sum[j] += xd * column[j];
      }
      std::copy(sum, sum + kChunk, scores + j0);
    }
  }
};

// One query's window: the keys [lo, hi), clipped to the sequence.
struct Window {
  Index lo, hi;
  Window(Index i, Index halo, Index length) : lo(std::max<Index>(0, i - halo)), hi(std::min(length, i + halo + 1)) {}
};

// What one thread keeps between groups: the scaled query, the key (and value) tiles, the scores.
template <typename Scalar>
struct Workspace {
  std::vector<Scalar> query, scores, extra, sum;
  Tile<Scalar> keys, values;

  void reset(Index dim, Index halo) {
    query.resize(dim);
    sum.resize(dim);
    scores.resize(2 * halo + 1 + kChunk);
    extra.resize(2 * halo + 1 + kChunk);
  }
};

// The scores c q_i . k_j of query i over its window into ws.scores (from the block's key tile).
template <typename Scalar>
void window_scores(Workspace<Scalar>& ws, const Scalar* q_row, double scaling, Window window, Index dim) {
  for (Index d = 0; d < dim; ++d) ws.query[d] = static_cast<Scalar>(scaling * q_row[d]);
  ws.keys.dot(ws.query.data(), window.lo, window.hi, dim, ws.scores.data());
}

// sum_j weights[j - lo] rows[j] over the window, into out (D), kChunk dims at a time summed in registers.
template <typename Scalar>
void weighted_rows(Rows<const Scalar> rows, const Scalar* weights, Window window, Index dim, Scalar* __restrict out) {
  Index d0 = 0;
  for (; d0 + kChunk <= dim; d0 += kChunk) {
    Scalar sum[kChunk] = {};
    for (Index j = window.lo; j < window.hi; ++j) {
      const Scalar weight = weights[j - window.lo];
      const Scalar* __restrict row = rows[j] + d0;
      for (Index d = 0; d < kChunk; ++d) sum[d] += weight * row[d];
    }
    std::copy(sum, sum + kChunk, out + d0);
  }
  std::fill(out + d0, out + dim, Scalar(0));
  for (Index j = window.lo; j < window.hi; ++j) {
    const Scalar weight = weights[j - window.lo];
    const Scalar* __restrict row = rows[j];
    for (Index d = d0; d < dim; ++d) out[d] += weight * row[d];
  }
}

// The block [i0, i1) of queries and the tile of keys they see.
inline Index tile_begin(Index i0, Index halo) { return std::max<Index>(0, i0 - halo); }
inline Index tile_end(Index i1, Index halo, Index length) { return std::min(length, i1 + halo); }

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
    for (Index i = i0; i < i1; ++i) {
      const Window window(i, halo, T);
      window_scores(ws, qg[i], scaling, window, D);
      Scalar* scores = ws.scores.data();
      double top = -std::numeric_limits<double>::infinity();
      for (Index j = window.lo; j < window.hi; ++j)
        if (valid_row[j]) top = std::max(top, static_cast<double>(scores[j - window.lo]));
      if (top == -std::numeric_limits<double>::infinity()) {
        std::fill(og[i], og[i] + D, Scalar(0));
        lse_g[i] = -std::numeric_limits<Scalar>::infinity();
        continue;
      }
      double total = 0.0;
      for (Index j = window.lo; j < window.hi; ++j) {
        Scalar& p = scores[j - window.lo];
        p = valid_row[j] ? std::exp(p - static_cast<Scalar>(top)) : Scalar(0);
        total += p;
      }
      const Scalar inverse = static_cast<Scalar>(1.0 / total);
      for (Index j = window.lo; j < window.hi; ++j) scores[j - window.lo] *= inverse;
      weighted_rows(vg, scores, window, D, og[i]);
      lse_g[i] = static_cast<Scalar>(top + std::log(total));
    }
  }
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
  const Scalar c = static_cast<Scalar>(scaling);
  for (Index i0 = 0; i0 < T; i0 += kBlock) {
    const Index i1 = std::min(T, i0 + kBlock), begin = tile_begin(i0, halo), end = tile_end(i1, halo, T);
    ws.keys.load(kg, begin, end, D);
    ws.values.load(vg, begin, end, D);
    for (Index i = i0; i < i1; ++i) {
      const double log_normaliser = static_cast<double>(lse_g[i]);
      if (log_normaliser == -std::numeric_limits<double>::infinity()) {
        std::fill(dqg[i], dqg[i] + D, Scalar(0));
        continue;
      }
      const Window window(i, halo, T);
      const Scalar* __restrict go = gog[i];
      const Scalar* __restrict o = og[i];
      double delta = 0.0;
      for (Index d = 0; d < D; ++d) delta += static_cast<double>(go[d]) * o[d];
      const Scalar shift = static_cast<Scalar>(grad_lse_g[i] - delta);
      window_scores(ws, qg[i], scaling, window, D);
      Scalar* p = ws.scores.data();
      Scalar* ds = ws.extra.data();
      ws.values.dot(go, window.lo, window.hi, D, ds);  // dO_i . v_j
      for (Index j = window.lo; j < window.hi; ++j) {
        const Index at = j - window.lo;
        p[at] = valid_row[j] ? std::exp(p[at] - static_cast<Scalar>(log_normaliser)) : Scalar(0);
        ds[at] = p[at] * (ds[at] + shift);
      }
      weighted_rows(kg, ds, window, D, ws.sum.data());
      Scalar* __restrict dq_row = dqg[i];
      const Scalar* __restrict q_row = qg[i];
      for (Index d = 0; d < D; ++d) dq_row[d] = c * ws.sum[d];
      for (Index j = window.lo; j < window.hi; ++j) {
        const Index at = j - window.lo;
        if (p[at] == Scalar(0)) continue;
        const Scalar dsc = c * ds[at], pj = p[at];
        Scalar* __restrict dk_row = dkg[j];
        Scalar* __restrict dv_row = dvg[j];
#pragma omp simd
        for (Index d = 0; d < D; ++d) {
          dk_row[d] += dsc * q_row[d];
          dv_row[d] += pj * go[d];
        }
      }
    }
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

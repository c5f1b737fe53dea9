// Rectified linear attention (ReLA) on CPU in cache-sized tiles, the tiles' products by torch's BLAS.
//
// For one (batch, head) group, queries Q (Tq, D), keys K and values V (Tk, D), the scaling c and the
// mask M (M_ij = 1 when key j is valid and, with a window of halo h = w - 1, |i - j| <= h):
//
//     S = c Q K^T,   A = ReLU(S) ⊙ M,   O = A V,   and each query's total weight N_i = sum_j A_ij.
//
// Backward, for the gradients dO (Tq, D) of O and dN (Tq) of N, recomputing A tile by tile (nothing
// pair-sized is kept):
//
//     dV = A^T dO,   dA_ij = dO_i . V_j + dN_i,   dS = dA ⊙ 1[A > 0],   dQ = c dS K,   dK = c dS^T Q.
//
// N is what a shared normaliser with another attention needs (ops/local_window.py); its row sums ride
// along with the tile passes the ReLU already makes.
//
// A softmax window beside it (band w >= 0, self-attention): each query's softmax over the valid keys with
// |i - j| <= w (window_row.h), its output local_i, log-normaliser lse_i and weights p_ij kept for the backward.
// Its backward takes dlocal_i and shift_i = dlse_i - dlocal_i . local_i (local_window_cpu.cpp's combination gives
// them) and adds the window's score gradients into ReLA's tiles before dQ's and dK's products,
//
//     dS_ij += p_ij (dlocal_i . v_j + shift_i),   dV_j += sum_i p_ij dlocal_i,
//
// so that one backward gives both attentions' gradients of q, k and v (the window's share of dQ and dK rides on
// the products ReLA makes anyway).
//
// ReLU needs no running maximum, so a query tile's output is a plain sum over key tiles,
// O_i = sum_j A_ij V_j, and nothing is rescaled. The queries go in tiles of kQueryTile rows and the
// keys in tiles of kKeyTile rows: a (kQueryTile, kKeyTile) score tile stays in the core's cache
// between the products that make and use it. Each product is one call of the Fortran BLAS sgemm_ /
// dgemm_ that libtorch_cpu exports (MKL's, in torch's x86 builds; where torch lacks them the library
// does not load, and _native.py warns and the torch implementation runs), reading the tensors in
// place through their token strides; the ReLU, the mask and dS are one pass over the tile. Key tiles
// that the window or the padding masks entirely are skipped (exact: their weights are 0), and a
// query tile's keys run from the first key its window reaches that is valid to the last such key (a
// sequence padded on its end costs its real length). In the backward, a query tile's rows shrink to the span from
// the first to the last row that carries a gradient (GradientRows): a row whose dO, dN (and dlocal, shift)
// are all 0 adds nothing to dQ, dK or dV, and gets dQ = 0. In a fine-tuned encoder the queries of a sequence's
// padding get no gradient, nor, under a pooler that reads one token ([CLS]), all but that token in the last layer.
//
// Threads: the forward shares (group, query tile) pairs out to torch's intra-op threads, the backward
// groups (its dK and dV sum over a group's query tiles), each thread taking the next when it is
// done; BLAS runs single-threaded inside (with one task, torch's threads are BLAS's).
// float and double are computed in their own precision.
//
// Layouts: q, k, v, out, grad_out and the gradients (B, H, T, D) with any (batch, head, token)
// element strides, a token stride >= D below 2^31 (BLAS's int) and a contiguous last dim; valid (B, Tk)
// uint8; N and dN (G, Tq) contiguous, G = B * H, in the values' dtype. Entry points return 0, or 1 after
// an exception.

#include <ATen/Parallel.h>

#include "window_row.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

// The Fortran BLAS products that libtorch_cpu exports (MKL's, in torch's x86 builds).
extern "C" {
void sgemm_(const char* trans_a, const char* trans_b, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* trans_a, const char* trans_b, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}

namespace {

using Index = std::int64_t;

constexpr Index kQueryTile = 256;
constexpr Index kKeyTile = 256;

struct Shape {
  Index batch, heads, q_len, k_len, dim, halo;  // halo < 0: no window
  Index band;  // the softmax window's halo w (< 0: none; needs q_len = k_len and no ReLA window, halo < 0)
  Index groups() const { return batch * heads; }
  Index span() const { return 2 * band + 1; }
  Index query_tiles() const { return (q_len + kQueryTile - 1) / kQueryTile; }
};

// Token rows of one group of a (B, H, T, D) tensor: row(i) points at token i's D values.
template <typename T>
struct Rows {
  T* base;
  Index stride;
  T* row(Index i) const { return base + i * stride; }
};

template <typename T>
Rows<T> group_rows(T* data, const Index* strides, const Shape& shape, Index g) {
  return {data + (g / shape.heads) * strides[0] + (g % shape.heads) * strides[1], strides[2]};
}

// Row-major C (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B) (k, n), leading dims the row
// strides: the column-major BLAS call on the transposes, C^T = op(B)^T op(A)^T.
inline void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                 const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                 const int* ldc) {
  sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                 const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                 const int* ldc) {
  dgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline int blas_int(Index x) {
  if (x > std::numeric_limits<int>::max()) throw std::length_error("a size or stride is beyond BLAS's int");
  return static_cast<int>(x);
}

template <typename Scalar>
void gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, Scalar alpha, const Scalar* a, Index lda,
          const Scalar* b, Index ldb, Scalar beta, Scalar* c, Index ldc) {
  const int mm = blas_int(m), nn = blas_int(n), kk = blas_int(k);
  const int la = blas_int(lda), lb = blas_int(ldb), lc = blas_int(ldc);
  blas(trans_b ? "T" : "N", trans_a ? "T" : "N", &nn, &mm, &kk, &alpha, b, &lb, a, &la, &beta, c, &lc);
}

// The keys a query tile [i0, i1) reaches: [lo, hi) within [0, Tk), trimmed to the span from the first to the last
// valid key (padding at either end costs nothing; hi <= lo when no key is valid).
struct KeyRange {
  Index lo, hi;
  KeyRange(const Shape& s, Index i0, Index i1, const std::uint8_t* valid)
      : lo(s.halo < 0 ? 0 : std::max<Index>(0, i0 - s.halo)),
        hi(s.halo < 0 ? s.k_len : std::min(s.k_len, i1 + s.halo)) {
    while (lo < hi && !valid[lo]) ++lo;
    while (hi > lo && !valid[hi - 1]) --hi;
  }
};

// One (query tile, key tile) pair: weights[r * cols + c] = M ⊙ ReLU(weights) for query i0 + r and
// key j0 + c, the scores computed in place before.
template <typename Scalar>
void rectify(Scalar* __restrict weights, Index i0, Index rows, Index j0, Index cols, const std::uint8_t* valid,
             Index halo) {
  const bool banded = halo >= 0 && std::max(i0 + rows - 1 - j0, j0 + cols - 1 - i0) > halo;
  bool padded = false;
  for (Index c = 0; c < cols; ++c) padded |= !valid[j0 + c];
  if (!banded && !padded) {
    for (Index at = 0; at < rows * cols; ++at) weights[at] = std::max(weights[at], Scalar(0));
    return;
  }
  for (Index r = 0; r < rows; ++r) {
    const Index i = i0 + r;
    Scalar* __restrict row = weights + r * cols;
    for (Index c = 0; c < cols; ++c) {
      const Index j = j0 + c;
      const bool keep = valid[j] && (halo < 0 || (i - j <= halo && j - i <= halo));
      row[c] = keep ? std::max(row[c], Scalar(0)) : Scalar(0);
    }
  }
}

// Whether some key of [j0, j0 + cols) is valid (a tile of padded keys is skipped).
inline bool any_valid(const std::uint8_t* valid, Index j0, Index cols) {
  return std::any_of(valid + j0, valid + j0 + cols, [](std::uint8_t x) { return x != 0; });
}

// sum_c row[c], in kLanes independent partial sums that the compiler vectorises (one running sum would
// fix the order of the float additions and keep the loop scalar).
template <typename Scalar>
Scalar row_sum(const Scalar* __restrict row, Index cols) {
  constexpr Index kLanes = 16;
  Scalar lanes[kLanes] = {};
  Index c = 0;
  for (; c + kLanes <= cols; c += kLanes)
    for (Index l = 0; l < kLanes; ++l) lanes[l] += row[c + l];
  Scalar sum = 0;
  for (; c < cols; ++c) sum += row[c];
  for (Index l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// What one thread keeps between tiles: the score tile, (forward) its rows' total weights so far and
// (backward) its gradient.
template <typename Scalar>
struct Workspace {
  std::vector<Scalar> scores, grad;
  std::vector<double> totals;
  void reset(bool backward) {
    scores.resize(kQueryTile * kKeyTile);
    if (backward) grad.resize(kQueryTile * kKeyTile);
    else totals.assign(kQueryTile, 0.0);
  }
};

// The softmax window's rows: per query its output (local), log-normaliser and weights.
template <typename Scalar>
struct Band {
  Scalar *local, *lse, *p;
};

// The window's scores out of a (query tile, key tile) pair's scores [i0, i0 + rows) x [j0, j0 + cols), before the
// ReLU: window[r * span + j - i + w] for query i = i0 + r and the valid keys j with |i - j| <= w in the tile.
template <typename Scalar>
void keep_window_scores(const Shape& s, Index i0, Index rows, Index j0, Index cols, const std::uint8_t* valid,
                        const Scalar* scores, Scalar* window) {
  for (Index r = 0; r < rows; ++r) {
    const Index i = i0 + r, lo = std::max(j0, i - s.band), hi = std::min(j0 + cols, i + s.band + 1);
    for (Index j = lo; j < hi; ++j)
      if (valid[j]) window[r * s.span() + j - i + s.band] = scores[r * cols + j - j0];
  }
}

// kDim: the head dim where it is compiled in (> 0; the window's row loops unrolled for it), else 0 (any).
template <typename Scalar, Index kDim>
void forward_tile(const Shape& s, Index g, Index tile, Scalar scaling, const Scalar* q, const Scalar* k,
                  const Scalar* v, const std::uint8_t* valid, Scalar* out, Scalar* total, const Band<Scalar>& band,
                  const Index* strides) {
  const Index D = kDim > 0 ? kDim : s.dim, i0 = tile * kQueryTile, rows = std::min(kQueryTile, s.q_len - i0);
  const Rows<const Scalar> qg = group_rows(q, strides, s, g), kg = group_rows(k, strides + 3, s, g);
  const Rows<const Scalar> vg = group_rows(v, strides + 6, s, g);
  const Rows<Scalar> og = group_rows(out, strides + 9, s, g);
  const std::uint8_t* valid_row = valid + (g / s.heads) * s.k_len;
  thread_local Workspace<Scalar> ws;
  ws.reset(false);
  Scalar* scores = ws.scores.data();
  const KeyRange keys(s, i0, i0 + rows, valid_row);
  Scalar* window = s.band < 0 ? nullptr : band.p + (g * s.q_len + i0) * s.span();
  if (window) std::fill(window, window + rows * s.span(), -std::numeric_limits<Scalar>::infinity());
  bool written = false;
  for (Index j0 = keys.lo; j0 < keys.hi; j0 += kKeyTile) {
    const Index cols = std::min(kKeyTile, keys.hi - j0);
    if (!any_valid(valid_row, j0, cols)) continue;
    gemm<Scalar>(false, true, rows, cols, D, scaling, qg.row(i0), qg.stride, kg.row(j0), kg.stride, 0, scores, cols);
    if (window) keep_window_scores(s, i0, rows, j0, cols, valid_row, scores, window);
    rectify(scores, i0, rows, j0, cols, valid_row, s.halo);
    for (Index r = 0; r < rows; ++r) ws.totals[r] += row_sum(scores + r * cols, cols);
    gemm<Scalar>(false, false, rows, D, cols, 1, scores, cols, vg.row(j0), vg.stride, written ? 1 : 0,
                 og.row(i0), og.stride);
    written = true;
  }
  if (!written)
    for (Index r = 0; r < rows; ++r) std::fill(og.row(i0 + r), og.row(i0 + r) + D, Scalar(0));
  for (Index r = 0; r < rows; ++r) total[g * s.q_len + i0 + r] = static_cast<Scalar>(ws.totals[r]);
  if (!window) return;
  const Rows<Scalar> local = group_rows(band.local, strides + 12, s, g);
  for (Index i = i0; i < i0 + rows; ++i) {
    const Index lo = std::max<Index>(0, i - s.band), hi = std::min(s.k_len, i + s.band + 1), at = g * s.q_len + i;
    band.lse[at] = window_row::softmax_of_scores([&](Index j) { return vg.row(j); }, i, lo, hi, s.band, D,
                                                 band.p + at * s.span(), local.row(i));
  }
}

// The softmax window's gradients into the backward: those of its output (dlocal rows), shift = dlse - dlocal .
// local per query, and its weights p from the forward.
template <typename Scalar>
struct BandGrad {
  const Scalar *dlocal, *shift, *p;
};

// The window's dS_ij = p_ij (dlocal_i . v_j + shift_i), added into the score gradients of the (query tile, key
// tile) pair [i0, i0 + rows) x [j0, j0 + cols) where the window reaches into it: dQ's and dK's products then carry
// the window's gradients with ReLA's.
template <typename Scalar>
inline __attribute__((always_inline)) void add_window_scores(const Shape& s, Index g, Index i0, Index rows, Index j0,
                                                             Index cols, Index D, const BandGrad<Scalar>& band,
                                                             const Rows<const Scalar>& dlocal,
                                                             const Rows<const Scalar>& vg, Scalar* grad) {
  for (Index r = 0; r < rows; ++r) {
    const Index i = i0 + r, at = g * s.q_len + i;
    const Index lo = std::max(j0, i - s.band), hi = std::min(j0 + cols, i + s.band + 1);
    const Scalar* p = band.p + at * s.span();
    for (Index j = lo; j < hi; ++j) {
      const Scalar weight = p[j - i + s.band];
      if (weight != Scalar(0))
        grad[r * cols + j - j0] += weight * (window_row::dot(dlocal.row(i), vg.row(j), D) + band.shift[at]);
    }
  }
}

// The rows of a query tile [i0, i1) that carry a gradient: [first, last) from the first to the last row whose dO
// (and, with the window, dlocal) row, dN (and shift) are not all 0; first = last when none does. A row without
// one has a dS row of 0 (exact for finite inputs), so the tile's products and the window's terms run on the span.
template <typename Scalar>
struct GradientRows {
  Index first, last;
  GradientRows(Index i0, Index i1, Index D, const Rows<const Scalar>& grad_out, const Scalar* grad_total,
               const Rows<const Scalar>& dlocal, const Scalar* shift)
      : first(i0), last(i1) {
    const auto carries = [&](Index i) {
      const auto nonzero = [](Scalar x) { return x != Scalar(0); };
      if (grad_total[i] != Scalar(0) || std::any_of(grad_out.row(i), grad_out.row(i) + D, nonzero)) return true;
      return shift != nullptr && (shift[i] != Scalar(0) || std::any_of(dlocal.row(i), dlocal.row(i) + D, nonzero));
    };
    while (first < last && !carries(first)) ++first;
    while (last > first && !carries(last - 1)) --last;
  }
};

template <typename Scalar, Index kDim>
void backward_group(const Shape& s, Index g, Scalar scaling, const Scalar* grad_out, const Scalar* grad_total,
                    const Scalar* q, const Scalar* k, const Scalar* v, const std::uint8_t* valid, Scalar* dq,
                    Scalar* dk, Scalar* dv, const BandGrad<Scalar>& band, const Index* strides) {
  const Index D = kDim > 0 ? kDim : s.dim;
  const Rows<const Scalar> gog = group_rows(grad_out, strides, s, g), qg = group_rows(q, strides + 3, s, g);
  const Rows<const Scalar> kg = group_rows(k, strides + 6, s, g), vg = group_rows(v, strides + 9, s, g);
  const Rows<Scalar> dqg = group_rows(dq, strides + 12, s, g), dkg = group_rows(dk, strides + 15, s, g);
  const Rows<Scalar> dvg = group_rows(dv, strides + 18, s, g);
  const std::uint8_t* valid_row = valid + (g / s.heads) * s.k_len;
  const Rows<const Scalar> dlocal = s.band < 0 ? Rows<const Scalar>{} : group_rows(band.dlocal, strides + 21, s, g);
  for (Index j = 0; j < s.k_len; ++j) {
    std::fill(dkg.row(j), dkg.row(j) + D, Scalar(0));
    std::fill(dvg.row(j), dvg.row(j) + D, Scalar(0));
  }
  thread_local Workspace<Scalar> ws;
  ws.reset(true);
  Scalar *weights = ws.scores.data(), *grad = ws.grad.data();
  const Scalar* shift = s.band < 0 ? nullptr : band.shift + g * s.q_len;
  for (Index tile = 0; tile < s.q_len; tile += kQueryTile) {
    const Index end = std::min(tile + kQueryTile, s.q_len);
    const GradientRows<Scalar> span(tile, end, D, gog, grad_total + g * s.q_len, dlocal, shift);
    for (Index i = tile; i < end; ++i)
      if (i < span.first || i >= span.last) std::fill(dqg.row(i), dqg.row(i) + D, Scalar(0));
    if (span.first == span.last) continue;
    const Index i0 = span.first, rows = span.last - span.first;
    const KeyRange keys(s, i0, i0 + rows, valid_row);
    bool written = false;
    for (Index j0 = keys.lo; j0 < keys.hi; j0 += kKeyTile) {
      const Index cols = std::min(kKeyTile, keys.hi - j0);
      if (!any_valid(valid_row, j0, cols)) continue;
      gemm<Scalar>(false, true, rows, cols, D, scaling, qg.row(i0), qg.stride, kg.row(j0), kg.stride, 0, weights,
                   cols);
      rectify(weights, i0, rows, j0, cols, valid_row, s.halo);
      gemm<Scalar>(true, false, cols, D, rows, 1, weights, cols, gog.row(i0), gog.stride, 1, dvg.row(j0), dvg.stride);
      gemm<Scalar>(false, true, rows, cols, D, 1, gog.row(i0), gog.stride, vg.row(j0), vg.stride, 0, grad, cols);
      const Scalar* grad_total_rows = grad_total + g * s.q_len + i0;
      for (Index r = 0; r < rows; ++r) {
        const Scalar extra = grad_total_rows[r];
        const Scalar* __restrict weight_row = weights + r * cols;
        Scalar* __restrict grad_row = grad + r * cols;
        for (Index c = 0; c < cols; ++c) grad_row[c] = weight_row[c] > Scalar(0) ? grad_row[c] + extra : Scalar(0);
      }
      if (s.band >= 0) add_window_scores(s, g, i0, rows, j0, cols, D, band, dlocal, vg, grad);
      gemm<Scalar>(false, false, rows, D, cols, scaling, grad, cols, kg.row(j0), kg.stride, written ? 1 : 0,
                   dqg.row(i0), dqg.stride);
      gemm<Scalar>(true, false, cols, D, rows, scaling, grad, cols, qg.row(i0), qg.stride, 1, dkg.row(j0), dkg.stride);
      written = true;
    }
    if (!written)
      for (Index r = 0; r < rows; ++r) std::fill(dqg.row(i0 + r), dqg.row(i0 + r) + D, Scalar(0));
    // The window's dV: dv_j += p_ij dlocal_i over the queries i that saw j.
    for (Index i = i0; i < i0 + rows && s.band >= 0; ++i) {
      const Index lo = std::max<Index>(0, i - s.band), hi = std::min(s.k_len, i + s.band + 1);
      const Scalar* p = band.p + (g * s.q_len + i) * s.span();
      for (Index j = lo; j < hi; ++j)
        if (p[j - i + s.band] != Scalar(0)) window_row::axpy(p[j - i + s.band], dlocal.row(i), dvg.row(j), D);
    }
  }
}

// step<Scalar, kDim>(args...) with kDim the head dim where it is compiled in (32, 64), else 0 (any).
#define RELA_DISPATCH(dim, step, Scalar, ...)                   \
  switch (dim) {                                                \
    case 32: step<Scalar, 32>(__VA_ARGS__); break;              \
    case 64: step<Scalar, 64>(__VA_ARGS__); break;              \
    default: step<Scalar, 0>(__VA_ARGS__);                      \
  }

// body(task) for task in [0, count), each a group's or a tile's worth of work, over torch's intra-op
// threads: each thread takes the next task when it is done with one, so that a thread slowed down
// (by another process on its core) takes fewer. 0, or 1 after an exception.
template <typename Body>
int parallel_tasks(Index count, Body body) {
  std::atomic<Index> next{0};
  try {
    at::parallel_for(0, std::min<Index>(count, at::get_num_threads()), 1, [&](Index, Index) {
      for (Index task = next++; task < count; task = next++) body(task);
    });
  } catch (...) {
    return 1;
  }
  return 0;
}

template <typename Scalar>
int forward(const Shape& s, double scaling, const Scalar* q, const Scalar* k, const Scalar* v,
            const std::uint8_t* valid, Scalar* out, Scalar* total, const Band<Scalar>& band, const Index* strides) {
  const Index tiles = s.query_tiles();
  return parallel_tasks(s.groups() * tiles, [&](Index task) {
    RELA_DISPATCH(s.dim, forward_tile, Scalar, s, task / tiles, task % tiles, static_cast<Scalar>(scaling), q, k, v,
                  valid, out, total, band, strides);
  });
}

template <typename Scalar>
int backward(const Shape& s, double scaling, const Scalar* grad_out, const Scalar* grad_total, const Scalar* q,
             const Scalar* k, const Scalar* v, const std::uint8_t* valid, Scalar* dq, Scalar* dk, Scalar* dv,
             const BandGrad<Scalar>& band, const Index* strides) {
  return parallel_tasks(s.groups(), [&](Index g) {
    RELA_DISPATCH(s.dim, backward_group, Scalar, s, g, static_cast<Scalar>(scaling), grad_out, grad_total, q, k, v,
                  valid, dq, dk, dv, band, strides);
  });
}

}  // namespace

// The sizes (B, H, Tq, Tk, D), the halo h = w - 1 of ReLA's window (-1: none), the softmax window's halo (-1:
// none) and the scaling, then the tensors (forward: q, k, v, valid, out, N, local, lse, p; backward: grad_out, dN,
// q, k, v, valid, dq, dk, dv, dlocal, shift, p) and the (batch, head, token) element strides of the (B, H, T, D)
// ones: of q, k, v, out, local (forward); of grad_out, q, k, v, dq, dk, dv, dlocal (backward). Without the softmax
// window, local, lse, p, dlocal and shift are not read (null), and local's and dlocal's strides any.
#define RELA_ENTRY_POINTS(SUFFIX, Scalar)                                                                    \
  extern "C" int rela_forward_##SUFFIX(Index batch, Index heads, Index q_len, Index k_len, Index dim,        \
                                       Index halo, Index band, double scaling, const Scalar* q,              \
                                       const Scalar* k, const Scalar* v, const std::uint8_t* valid,          \
                                       Scalar* out, Scalar* total, Scalar* local, Scalar* lse, Scalar* p,    \
                                       const Index* strides) {                                               \
    return forward<Scalar>({batch, heads, q_len, k_len, dim, halo, band}, scaling, q, k, v, valid, out,      \
                           total, {local, lse, p}, strides);                                                 \
  }                                                                                                          \
  extern "C" int rela_backward_##SUFFIX(Index batch, Index heads, Index q_len, Index k_len, Index dim,       \
                                        Index halo, Index band, double scaling, const Scalar* grad_out,      \
                                        const Scalar* grad_total, const Scalar* q, const Scalar* k,          \
                                        const Scalar* v, const std::uint8_t* valid, Scalar* dq, Scalar* dk,  \
                                        Scalar* dv, const Scalar* dlocal, const Scalar* shift,               \
                                        const Scalar* p, const Index* strides) {                             \
    return backward<Scalar>({batch, heads, q_len, k_len, dim, halo, band}, scaling, grad_out, grad_total, q, \
                            k, v, valid, dq, dk, dv, {dlocal, shift, p}, strides);                           \
  }

RELA_ENTRY_POINTS(f32, float)
RELA_ENTRY_POINTS(f64, double)

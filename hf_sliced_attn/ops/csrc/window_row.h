// One query's softmax over the keys of a small window, and the vectorised row products it is made of; shared by
// the window kernel (local_window_cpu.cpp) and ReLA's kernel (rela_cpu.cpp), which computes the window beside
// its own scores.
//
// For query i with row q, the halo w, the scaling c and the valid keys j in [lo, hi) (|i - j| <= w):
//
//     a_j = c q . k_j,   lse = log sum_j exp(a_j),   p_j = exp(a_j - lse),   local = sum_j p_j v_j,
//
// p stored at offset o = j - i + w of its 2 w + 1 entries (0 where no valid key). A query without a valid key in
// its window gets p = 0, local = 0 and lse = -inf.

#pragma once

#include "fast_exp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace window_row {

using Index = std::int64_t;

// Vectors of 16 Scalars and their halves and quarters (GCC/Clang vector extensions; spelled per type, as GCC drops
// vector_size from an alias of a dependent type).
template <typename Scalar>
struct Lanes;
template <>
struct Lanes<float> {
  typedef float full __attribute__((vector_size(64)));
  typedef float half __attribute__((vector_size(32)));
  typedef float quarter __attribute__((vector_size(16)));
};
template <>
struct Lanes<double> {
  typedef double full __attribute__((vector_size(128)));
  typedef double half __attribute__((vector_size(64)));
  typedef double quarter __attribute__((vector_size(32)));
};

// The two halves of a vector, added.
template <typename Whole, typename Part>
inline Part fold(const Whole& whole) {
  Part low, high;
  std::memcpy(&low, &whole, sizeof low);
  std::memcpy(&high, reinterpret_cast<const char*>(&whole) + sizeof low, sizeof high);
  return low + high;
}

// sum_d a[d] b[d]: 16 lanes of products, then folded in registers (a scalar loop over the lanes would go
// through memory, once per key).
template <typename Scalar>
inline __attribute__((always_inline)) Scalar dot(const Scalar* __restrict a, const Scalar* __restrict b, Index n) {
  using L = Lanes<Scalar>;
  typename L::full sum = {};
  Index d = 0;
  for (; d + 16 <= n; d += 16) {
    typename L::full x, y;
    std::memcpy(&x, a + d, sizeof x);
    std::memcpy(&y, b + d, sizeof y);
    sum += x * y;
  }
  const typename L::quarter four = fold<typename L::half, typename L::quarter>(fold<typename L::full,
                                                                                     typename L::half>(sum));
  Scalar total = (four[0] + four[2]) + (four[1] + four[3]);
  for (; d < n; ++d) total += a[d] * b[d];
  return total;
}

// y += a x over n entries.
template <typename Scalar>
inline __attribute__((always_inline)) void axpy(Scalar a, const Scalar* __restrict x, Scalar* __restrict y, Index n) {
  for (Index d = 0; d < n; ++d) y[d] += a * x[d];
}

// The header's softmax of query i over the scores a_j in p (at offset j - i + w; -inf where key j is not valid):
// value(j) gives value j's row. Rewrites p as the weights, writes local (D) and returns lse; the normaliser is
// summed in double.
template <typename Scalar, typename ValueRow>
Scalar softmax_of_scores(ValueRow value, Index i, Index lo, Index hi, Index w, Index D, Scalar* __restrict p,
                         Scalar* __restrict local) {
  constexpr Scalar kNone = -std::numeric_limits<Scalar>::infinity();
  const Index span = 2 * w + 1;
  std::fill(local, local + D, Scalar(0));
  const Scalar top = *std::max_element(p, p + span);
  if (top == kNone) {
    std::fill(p, p + span, Scalar(0));
    return kNone;
  }
  // The exponentials in one loop that vectorises, then the weights and their values.
  for (Index o = 0; o < span; ++o) p[o] = p[o] == kNone ? Scalar(0) : fast_exp(p[o] - top);
  double total = 0.0;
  for (Index o = 0; o < span; ++o) total += p[o];
  const Scalar inverse = static_cast<Scalar>(1.0 / total);
  for (Index j = lo; j < hi; ++j) {
    const Scalar weight = (p[j - i + w] *= inverse);
    if (weight != Scalar(0)) axpy(weight, value(j), local, D);
  }
  return static_cast<Scalar>(static_cast<double>(top) + std::log(total));
}

// The same from q: the scores a_j = c q . k_j of the valid keys of [lo, hi) (key(j) gives key j's row, valid[j]
// whether it is real), then their softmax.
template <typename Scalar, typename KeyRow, typename ValueRow>
Scalar softmax(const Scalar* __restrict q, KeyRow key, ValueRow value, const std::uint8_t* valid, Index i, Index lo,
               Index hi, Index w, Scalar c, Index D, Scalar* __restrict p, Scalar* __restrict local) {
  std::fill(p, p + 2 * w + 1, -std::numeric_limits<Scalar>::infinity());
  for (Index j = lo; j < hi; ++j)
    if (valid[j]) p[j - i + w] = c * dot(q, key(j), D);
  return softmax_of_scores(value, i, lo, hi, w, D, p, local);
}

}  // namespace window_row

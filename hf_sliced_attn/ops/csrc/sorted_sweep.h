// What the sorted-sweep CPU kernels share (sliced_relu_cpu.cpp, sliced_relu_bump_cpu.cpp): tensor
// layouts, torch's thread pool, the valid keys of a group, and the sorting of one slice's scalars.
//
// Every kernel works on (batch, head) groups g = b * H + h, each with M slices of query scalars
// s (Tq) and key scalars t (Tk) in double, values v (Tk, D) shared by the slices, and the keys of
// batch b marked valid or padded. Per slice it sorts the valid keys by t and the queries by s,
// centres both on the mean valid key (the kernels are shift-invariant, and centring keeps the
// running sums small), then sweeps the two sorted lists in ascending order, carrying D-wide running
// sums in double from point to point: no prefix array is ever stored.
//
// Layouts: s (G, M, Tq) and t (G, M, Tk) double, G = B*H, contiguous; valid (B, Tk) uint8; D-wide
// tensors (B, H, T, D) with any (batch, head, token) strides and a contiguous last dim; the orders a
// forward saves for its backward are key_order (G, M, Tk) int32 (the valid keys in ascending order
// of t, then the padded keys) and query_order (G, M, Tq) int32 (ascending s).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace sorted_sweep {

using Index = std::int64_t;

struct Shape {
  Index batch, heads, slices, q_len, k_len, dim;
  Index groups() const { return batch * heads; }
};

// The rows of one (batch, head) group of a (B, H, T, D) tensor whose last dim is contiguous:
// rows[i] points at token i's D values.
template <typename T>
struct Rows {
  T* base;
  Index stride;
  T* operator[](Index row) const { return base + row * stride; }
};

// Group g = b * H + h of a tensor with element strides (batch, head, token).
template <typename T>
Rows<T> group_rows(T* data, const Index* strides, const Shape& shape, Index g) {
  return {data + (g / shape.heads) * strides[0] + (g % shape.heads) * strides[1], strides[2]};
}

template <typename T>
void fill_rows(Rows<T> rows, Index count, Index dim, T value) {
  for (Index i = 0; i < count; ++i) std::fill(rows[i], rows[i] + dim, value);
}

// Rows are visited in sorted order, i.e. at random: fetch the row kAhead visits ahead into cache.
constexpr Index kAhead = 8;

template <typename Scalar>
inline void prefetch_row(const Scalar* row, Index dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (Index offset = 0; offset < dim * Index(sizeof(Scalar)); offset += 64) __builtin_prefetch(bytes + offset);
}

// Each thread takes groups worth at least this many D-wide element visits (a smaller call runs
// on one thread: starting the others would cost more than it saves).
constexpr Index kParallelWork = Index(1) << 16;

// body(g) for every group g, over torch's intra-op thread pool (the threads torch's own ops
// use, so none compete with them for the cores); 0, or 1 after an exception.
template <typename Body>
int parallel_groups(const Shape& shape, Body body) {
  const Index per_group = std::max<Index>(1, shape.slices * (shape.q_len + shape.k_len) * shape.dim);
  const Index grain = std::max<Index>(1, kParallelWork / per_group);
  try {
    at::parallel_for(0, shape.groups(), grain, [&](Index begin, Index end) {
      for (Index g = begin; g < end; ++g) body(g);
    });
  } catch (...) {
    return 1;
  }
  return 0;
}

// The valid keys of one group: their indices, ascending.
struct ValidKeys {
  std::vector<std::int32_t> index;

  void load(const std::uint8_t* valid_row, Index k_len) {
    index.clear();
    for (Index j = 0; j < k_len; ++j)
      if (valid_row[j]) index.push_back(static_cast<std::int32_t>(j));
  }
  Index n() const { return static_cast<Index>(index.size()); }
};

// Sorts n doubles stably, carrying an int32 index each, by order-preserving 64-bit keys: up to
// kInsertionMax keys (a sentence's tokens) an insertion sort, up to kBucketMax a bucket sort by value,
// else (or where the buckets would fill unevenly) an LSD radix sort, one byte a pass, skipping the
// bytes that all keys share (the low mantissa bytes of float32 values, the sign and exponent bytes of
// values of one scale). All three give the same order.
struct StableSort {
  std::vector<std::uint64_t> keys, keys_swap;
  std::vector<std::int32_t> index, index_swap;

  void assign(Index n) {
    keys.resize(n);
    index.resize(n);
    keys_swap.resize(n);
    index_swap.resize(n);
  }
  static std::uint64_t key(double x) {
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return (bits >> 63) ? ~bits : bits | (std::uint64_t(1) << 63);
  }
  static double value(std::uint64_t key) {
    const std::uint64_t bits = (key >> 63) ? key & ~(std::uint64_t(1) << 63) : ~key;
    double x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }
  void run() {
    const Index n = static_cast<Index>(keys.size());
    if (n < 2) return;
    if (n <= kInsertionMax) return insertion();
    if (n <= kBucketMax && buckets()) return;
    Index counts[8][256] = {};
    for (std::uint64_t k : keys)
      for (int byte = 0; byte < 8; ++byte) ++counts[byte][(k >> (8 * byte)) & 255];
    for (int byte = 0; byte < 8; ++byte) {
      Index* count = counts[byte];
      if (count[(keys[0] >> (8 * byte)) & 255] == n) continue;
      Index offset = 0;
      for (int digit = 0; digit < 256; ++digit) offset += std::exchange(count[digit], offset);
      for (Index k = 0; k < n; ++k) {
        const Index to = count[(keys[k] >> (8 * byte)) & 255]++;
        keys_swap[to] = keys[k];
        index_swap[to] = index[k];
      }
      keys.swap(keys_swap);
      index.swap(index_swap);
    }
  }

 private:
  // Up to this many keys an insertion sort is faster: the radix passes cost 8 x 256 counters and a
  // 256-digit scan per byte whatever n is, several times the sort itself on a sentence's tokens.
  static constexpr Index kInsertionMax = 64;
  // Up to this many keys a bucket sort is faster (2-3x on normal scalars), unless the scalars cluster.
  static constexpr Index kBucketMax = 512;
  // A bucket holding more keys than this sends the sort to the radix passes (clustered or tied scalars,
  // where the insertion sort within buckets would grow quadratic).
  static constexpr Index kBucketLimit = 16;

  std::vector<std::int32_t> bucket_of, bucket_start;

  // n buckets of equal width over [min, max] of the values, filled in input order, then the insertion
  // sort (stable, and short: no bucket holds more than kBucketLimit keys, and their order is the values').
  // False, with the keys untouched, where the values are all equal (+0 and -0 differ only in their keys),
  // their range overflows, or a bucket would hold too many.
  bool buckets() {
    const Index n = static_cast<Index>(keys.size());
    double lo = value(keys[0]), hi = lo;
    for (Index k = 1; k < n; ++k) {
      const double x = value(keys[k]);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const double range = hi - lo, scale = static_cast<double>(n - 1) / range;
    if (!(range > 0.0) || !std::isfinite(range) || !std::isfinite(scale)) return false;
    bucket_of.resize(n);
    bucket_start.assign(n + 1, 0);
    for (Index k = 0; k < n; ++k) {
      const Index b = std::min<Index>(n - 1, static_cast<Index>((value(keys[k]) - lo) * scale));
      bucket_of[k] = static_cast<std::int32_t>(b);
      if (++bucket_start[b + 1] > kBucketLimit) return false;
    }
    for (Index b = 0; b < n; ++b) bucket_start[b + 1] += bucket_start[b];
    for (Index k = 0; k < n; ++k) {
      const Index to = bucket_start[bucket_of[k]]++;
      keys_swap[to] = keys[k];
      index_swap[to] = index[k];
    }
    keys.swap(keys_swap);
    index.swap(index_swap);
    insertion();
    return true;
  }

  // Stable, like the radix passes: equal keys keep their input order.
  void insertion() {
    const Index n = static_cast<Index>(keys.size());
    for (Index k = 1; k < n; ++k) {
      const std::uint64_t key = keys[k];
      const std::int32_t at = index[k];
      Index to = k;
      for (; to > 0 && keys[to - 1] > key; --to) {
        keys[to] = keys[to - 1];
        index[to] = index[to - 1];
      }
      keys[to] = key;
      index[to] = at;
    }
  }
};

// The mean of the valid keys' scalars: the centre of a slice (the kernel is shift-invariant).
inline double centre_of(const double* t, const std::vector<std::int32_t>& valid) {
  double centre = 0.0;
  for (auto j : valid) centre += t[j];
  return centre / std::max<double>(1.0, static_cast<double>(valid.size()));
}

// One slice of one group in sorted order: centred key scalars ts (valid keys, ascending),
// centred query scalars ss (ascending) and the original indices of both.
struct SortedSlice {
  StableSort sorter;
  std::vector<double> ts, ss;
  std::vector<std::int32_t> key_index, query_index;
  double total_t = 0.0;  // the sum of ts

  // Sorts the slice; false if a scalar is not finite.
  bool sort(const double* s, const double* t, const std::vector<std::int32_t>& valid, Index q_len) {
    const Index n = static_cast<Index>(valid.size());
    const double centre = centre_of(t, valid);
    if (!std::isfinite(centre)) return false;
    sorter.assign(n);
    for (Index k = 0; k < n; ++k) sorter.keys[k] = StableSort::key(t[valid[k]]), sorter.index[k] = valid[k];
    sorter.run();
    key_index = sorter.index;
    centred(sorter, centre, ts);
    total_t = 0.0;
    for (double x : ts) total_t += x;
    sorter.assign(q_len);
    for (Index i = 0; i < q_len; ++i) {
      if (!std::isfinite(s[i])) return false;
      sorter.keys[i] = StableSort::key(s[i]), sorter.index[i] = static_cast<std::int32_t>(i);
    }
    sorter.run();
    query_index = sorter.index;
    centred(sorter, centre, ss);
    return true;
  }

  // Reload from the orders the forward saved (key_order holds the valid keys first); false if a
  // scalar is not finite (the forward gave that group NaN).
  bool load(const double* s, const double* t, const std::vector<std::int32_t>& valid, const std::int32_t* key_order,
            const std::int32_t* query_order, Index q_len) {
    const Index n = static_cast<Index>(valid.size());
    const double centre = centre_of(t, valid);
    key_index.assign(key_order, key_order + n);
    query_index.assign(query_order, query_order + q_len);
    ts.resize(n);
    total_t = 0.0;
    for (Index k = 0; k < n; ++k) total_t += (ts[k] = t[key_order[k]] - centre);
    ss.resize(q_len);
    bool finite = std::isfinite(centre);
    for (Index i = 0; i < q_len; ++i) finite = std::isfinite(ss[i] = s[query_order[i]] - centre) && finite;
    return finite;
  }

  // Writes the orders the backward reloads: the valid keys ascending then the padded keys, and the
  // queries ascending (after a successful sort), or the identity (after a failed one).
  void save_orders(bool sorted, const std::uint8_t* valid_row, Index k_len, Index q_len, std::int32_t* key_order,
                   std::int32_t* query_order) const {
    if (!sorted) {
      for (Index k = 0; k < k_len; ++k) key_order[k] = static_cast<std::int32_t>(k);
      for (Index i = 0; i < q_len; ++i) query_order[i] = static_cast<std::int32_t>(i);
      return;
    }
    std::copy(key_index.begin(), key_index.end(), key_order);
    for (Index j = 0, k = static_cast<Index>(key_index.size()); j < k_len; ++j)
      if (!valid_row[j]) key_order[k++] = static_cast<std::int32_t>(j);
    std::copy(query_index.begin(), query_index.end(), query_order);
  }

 private:
  // x - centre is non-decreasing in x, so the centred values stay sorted.
  static void centred(const StableSort& sorted, double centre, std::vector<double>& out) {
    out.resize(sorted.keys.size());
    for (size_t k = 0; k < out.size(); ++k) out[k] = StableSort::value(sorted.keys[k]) - centre;
  }
};

}  // namespace sorted_sweep

// extern "C" int NAME(B, H, M, Tq, Tk, D, <PARAMS>): a kernel step's C interface, running
// STEP(shape, g, <ARGS>) for every (batch, head) group g over torch's threads; 0, or 1 after an
// exception. PARAMS and ARGS are parenthesised lists: the step's other parameters and their names.
#define SORTED_SWEEP_LIST(...) __VA_ARGS__
#define SORTED_SWEEP_ENTRY_POINT(NAME, STEP, PARAMS, ARGS)                                                    \
  extern "C" int NAME(sorted_sweep::Index batch, sorted_sweep::Index heads, sorted_sweep::Index slices,       \
                      sorted_sweep::Index q_len, sorted_sweep::Index k_len, sorted_sweep::Index dim,          \
                      SORTED_SWEEP_LIST PARAMS) {                                                              \
    const sorted_sweep::Shape shape{batch, heads, slices, q_len, k_len, dim};                                 \
    return sorted_sweep::parallel_groups(shape,                                                               \
                                         [&](sorted_sweep::Index g) { STEP(shape, g, SORTED_SWEEP_LIST ARGS); }); \
  }

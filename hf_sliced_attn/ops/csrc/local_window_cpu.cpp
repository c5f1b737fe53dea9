// A small local softmax window combined with a global term on CPU, one pass over the tokens, each token's heads
// together, in O(T H w D) time and no pair-sized tensor. Two uses: the window computed here and combined with
// the sliced kernel's term (no norm); or the window given, as ReLA's kernel computes it beside its own scores
// (rela_cpu.cpp), combined with ReLA's term after its gated RMSNorm (the combination's entry points).
//
// For token i of batch b, heads h with queries q_h, keys k_hj and values v_hj (D each), the global term's
// rows x_h (D; all heads' F = H D features together x) and its normaliser den_h, the halo w, the scaling c:
//
//     W(i)      the valid keys j with |i - j| <= w,    a_hj = c q_h . k_hj,
//     lse_h     = log sum_{j in W(i)} exp(a_hj),        p_hj = exp(a_hj - lse_h),   local_h = sum_j p_hj v_hj,
//     y         = scale ⊙ x ⊙ r ⊙ sigmoid(gate ⊙ x),   r = (mean_f x_f^2 + eps)^(-1/2)   (with the norm),
//     y         = x                                                                    (without it),
//     alpha_h   = mix_h                                                   ("gate"),
//     alpha_h   = sigmoid(lse_h - log mix_h - log den_h)                  ("shared", LoLCATs' shared normaliser),
//     out_h     = alpha_h local_h + (1 - alpha_h) y_h.
//
// "shared" edge cases: den_h = 0 gives alpha_h = 1; lse_h = -inf (no valid key in the window) and den_h > 0
// give alpha_h = 0 (and local_h = 0). mix_h is clamped below at the smallest normal number.
//
// Backward, for the gradient G_h of out_h:
//
//     dalpha_h = G_h . (local_h - y_h),   dy_h = (1 - alpha_h) G_h,   dlocal_h = alpha_h G_h,
//     "gate":   dmix_h += dalpha_h;
//     "shared": e_h = dalpha_h alpha_h (1 - alpha_h):  dlse_h = e_h,  dden_h = -e_h / den_h,  dmix_h += -e_h / mix_h,
//     norm:     u_f = dy_f scale_f,  s_f = sigmoid(gate_f x_f),  R = sum_f u_f x_f s_f,
//               dx_f = u_f r (s_f + gate_f x_f s_f (1 - s_f)) - r^3 x_f R / F,
//               dscale_f += dy_f x_f r s_f,   dgate_f += u_f r x_f^2 s_f (1 - s_f),
//     window:   dS_hj = p_hj (dlocal_h . v_hj - dlocal_h . local_h + dlse_h),
//               dq_h = c sum_j dS_hj k_hj,   dk_hj += c dS_hj q_h,   dv_hj += p_hj dlocal_h.
//
// A given window's backward stops before its last line: it gives dlocal_h and shift_h = dlse_h - dlocal_h .
// local_h, from which ReLA's backward adds the window's dS into its own (rela_cpu.cpp).
//
// A token whose G_h are 0 for every head gives 0 for each of its gradients (exact for finite inputs), written
// without recomputing the token: in a fine-tuned encoder, the tokens of a sequence's padding, and all but the
// token a pooler reads ([CLS]) in the last layer.
//
// Everything of a token is recomputed in the backward from the inputs (a window of a few keys costs less
// to recompute than to store). The backward's first pass goes over the queries and keeps, per (group,
// query, offset j - i + w), the coefficients dS and alpha p; its second pass goes over the keys and gathers
// dk and dv from the 2 w + 1 queries that saw each, so that no two threads write one row. The parameters'
// gradients (scale, gate, mix) are summed per chunk of tokens, then over the chunks in a fixed order: the
// result does not depend on the number of threads.
//
// Layouts: q, k, v, x, out, the given window's output and their gradients (B, H, T, D) with any (batch, head,
// token) element strides and a contiguous last dim; valid (B, T) uint8; den, lse, shift and dden (B, H, T)
// contiguous; scale, gate (F) and mix (H) contiguous. float and double are computed in their own precision
// (float's exponentials by fast_exp.h); the sums of a row (mean square, softmax normaliser) in double, the
// parameters' gradients in Scalar over 32 tokens, then in double. Head dims 32 and 64 are compiled for their
// size, others for any size. Entry points return 0, or 1 after an exception.

#include <ATen/Parallel.h>

#include "fast_exp.h"
#include "window_row.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using Index = std::int64_t;
using window_row::axpy;
using window_row::dot;

// given: ReLA's use (the combination's entry points): the window's output and log-normaliser come in, not
// computed, and the global term goes through ReLA's norm; else the sliced kernel's (the window computed, no norm).
struct Shape {
  Index batch, heads, length, dim, halo;
  bool shared, given;
  Index features() const { return heads * dim; }
  Index span() const { return 2 * halo + 1; }
  Index tokens() const { return batch * length; }
};

// Row (b, h, t) of a (B, H, T, D) tensor with element strides (batch, head, token).
template <typename T>
struct Rows {
  T* base;
  const Index* strides;
  T* at(Index b, Index h, Index t) const { return base + b * strides[0] + h * strides[1] + t * strides[2]; }
};

// The head dim: kDim when it is compiled in (> 0), else the call's.
template <Index kDim>
inline Index head_dim(const Shape& shape) {
  return kDim > 0 ? kDim : shape.dim;
}

template <typename Scalar>
inline Scalar sigmoid(Scalar x) {
  return Scalar(1) / (Scalar(1) + fast_exp(-x));
}

// One head's D features of the norm's backward (restrict holds for parameters, so the loop vectorises):
// dx = u r (s + gate x s (1 - s)) - tail x with u = dy scale and tail = r^3 R / F; dscale += dy x r s and
// dgate += u r x^2 s (1 - s).
template <typename Scalar>
inline void norm_backward_rows(const Scalar* __restrict x, const Scalar* __restrict s, const Scalar* __restrict scale,
                               const Scalar* __restrict gate, const Scalar* __restrict dy, Scalar r, Scalar tail,
                               Scalar* __restrict dx, Scalar* __restrict dscale, Scalar* __restrict dgate, Index D) {
  for (Index d = 0; d < D; ++d) {
    const Scalar u = dy[d] * scale[d], slope = s[d] * (Scalar(1) - s[d]);
    dx[d] = u * r * (s[d] + gate[d] * x[d] * slope) - tail * x[d];
    dscale[d] += dy[d] * x[d] * r * s[d];
    dgate[d] += u * r * x[d] * x[d] * slope;
  }
}

// The inputs of one call. With the window given (the combination's entry points), local and lse hold each (b, h, i)'s
// window output and log-normaliser, and q, k, v are not read.
template <typename Scalar>
struct Inputs {
  Rows<const Scalar> q, k, v, x, local;
  const std::uint8_t* valid;
  const Scalar *den, *scale, *gate, *mix, *lse;
  double scaling, eps;
};

// One token's forward quantities, recomputed by the backward: per head the window's weights p (span entries,
// 0 outside W(i); computed windows only), its output (local_of[h]: a row of `local`, or of the given window),
// alpha and whether any key was seen; the norm's r and, per feature, its sigmoid s and y.
template <typename Scalar, Index kDim>
struct Token {
  std::vector<Scalar> p, local, y, s, alpha;
  std::vector<const Scalar*> local_of;
  std::vector<std::uint8_t> seen;
  double r = 1.0;

  void reset(const Shape& shape) {
    p.resize(shape.heads * shape.span());
    local.resize(shape.features());
    y.resize(shape.features());
    s.resize(shape.features());
    alpha.resize(shape.heads);
    local_of.resize(shape.heads);
    seen.resize(shape.heads);
  }

  // The window's softmax computed from q, k, v (given = false) or read from in.local, in.lse (given = true).
  void compute(const Shape& shape, const Inputs<Scalar>& in, Index b, Index i) {
    normalise(shape, in, b, i);
    const Index D = head_dim<kDim>(shape), w = shape.halo, span = shape.span();
    const Index lo = std::max<Index>(0, i - w), hi = std::min(shape.length, i + w + 1);
    const Scalar c = static_cast<Scalar>(in.scaling);
    for (Index h = 0; h < shape.heads; ++h) {
      Scalar lse;
      if (shape.given) {
        local_of[h] = in.local.at(b, h, i);
        lse = in.lse[(b * shape.heads + h) * shape.length + i];
      } else {
        Scalar* local_h = local.data() + h * D;
        lse = window_row::softmax(in.q.at(b, h, i), [&](Index j) { return in.k.at(b, h, j); },
                                  [&](Index j) { return in.v.at(b, h, j); }, in.valid + b * shape.length, i, lo, hi,
                                  w, c, D, p.data() + h * span, local_h);
        local_of[h] = local_h;
      }
      seen[h] = lse != -std::numeric_limits<Scalar>::infinity();
      alpha[h] = weight_of_window(shape, in, b, h, i, lse);
    }
  }

  // y: the norm of the token's global rows x, or x itself.
  void normalise(const Shape& shape, const Inputs<Scalar>& in, Index b, Index i) {
    const Index D = head_dim<kDim>(shape), H = shape.heads, F = H * D;
    if (shape.given) {
      double square = 0.0;
      for (Index h = 0; h < H; ++h) {
        const Scalar* x = in.x.at(b, h, i);
        square += static_cast<double>(dot(x, x, D));
      }
      r = 1.0 / std::sqrt(square / static_cast<double>(F) + in.eps);
    }
    const Scalar rr = static_cast<Scalar>(r);
    for (Index h = 0; h < H; ++h) {
      const Scalar* __restrict x = in.x.at(b, h, i);
      Scalar *__restrict y_h = y.data() + h * D, *__restrict s_h = s.data() + h * D;
      if (shape.given) {
        const Scalar *__restrict scale = in.scale + h * D, *__restrict gate = in.gate + h * D;
        for (Index d = 0; d < D; ++d) s_h[d] = sigmoid(gate[d] * x[d]);
        for (Index d = 0; d < D; ++d) y_h[d] = scale[d] * x[d] * rr * s_h[d];
      } else {
        std::copy(x, x + D, y_h);
      }
    }
  }

  // alpha_h of the header from the window's lse (seen[h] set): for "shared", sigmoid(lse - log mix - log den) =
  // 1 / (1 + mix den exp(-lse)), one exponential instead of two logarithms (exp(-lse) overflowing to inf gives the
  // limit 0).
  Scalar weight_of_window(const Shape& shape, const Inputs<Scalar>& in, Index b, Index h, Index i, Scalar lse) const {
    if (!shape.shared) return in.mix[h];
    const Scalar den = in.den[(b * shape.heads + h) * shape.length + i];
    if (!(den > Scalar(0))) return Scalar(1);
    if (!seen[h]) return Scalar(0);
    const double mix = std::max(in.mix[h], std::numeric_limits<Scalar>::min());
    return static_cast<Scalar>(1.0 / (1.0 + mix * static_cast<double>(den) * std::exp(-static_cast<double>(lse))));
  }
};

// body(begin, end, chunk) over the tokens [0, count) cut into `chunks` fixed ranges, on torch's intra-op
// threads; 0, or 1 after an exception.
template <typename Body>
int parallel_chunks(Index count, Index chunks, Body body) {
  try {
    at::parallel_for(0, chunks, 1, [&](Index first, Index last) {
      for (Index c = first; c < last; ++c) body(c * count / chunks, (c + 1) * count / chunks, c);
    });
  } catch (...) {
    return 1;
  }
  return 0;
}

// Chunks of tokens: enough for the threads to share out unevenly timed work, few enough that the per-chunk
// sums of the parameters' gradients stay small.
inline Index chunk_count(Index tokens) { return std::max<Index>(1, std::min<Index>(tokens, 64)); }

template <typename Scalar, Index kDim>
int forward(const Shape& shape, const Inputs<Scalar>& in, Rows<Scalar> out) {
  const Index D = head_dim<kDim>(shape), T = shape.length;
  return parallel_chunks(shape.tokens(), chunk_count(shape.tokens()), [&](Index begin, Index end, Index) {
    Token<Scalar, kDim> token;
    token.reset(shape);
    for (Index task = begin; task < end; ++task) {
      const Index b = task / T, i = task % T;
      token.compute(shape, in, b, i);
      for (Index h = 0; h < shape.heads; ++h) {
        const Scalar alpha = token.alpha[h];
        const Scalar *__restrict local = token.local_of[h], *__restrict y = token.y.data() + h * D;
        Scalar* __restrict o = out.at(b, h, i);
        for (Index d = 0; d < D; ++d) o[d] = alpha * local[d] + (Scalar(1) - alpha) * y[d];
      }
    }
  });
}

// The gradients a backward writes: with a computed window those of q, k, v; with a given one those of its output
// (dlocal) and, per (b, h, i), shift = dlse - dlocal . local (what the window's own backward needs with them).
template <typename Scalar>
struct Gradients {
  Rows<Scalar> dq, dk, dv, dx, dlocal;
  Scalar *dden, *dscale, *dgate, *dmix, *shift;
};

// A chunk's sums of the parameters' gradients: kept in Scalar over kFlush tokens at a time, then added into
// the chunk's double sums (float sums over a long chunk would lose the small terms).
template <typename Scalar>
struct ParameterSums {
  static constexpr Index kFlush = 32;
  std::vector<Scalar> recent;  // dscale, dgate (F each), dmix (H)
  double* total;
  Index count = 0;

  ParameterSums(double* chunk_total, Index size) : recent(size, Scalar(0)), total(chunk_total) {}
  Scalar* dscale() { return recent.data(); }
  void token_done() {
    if (++count % kFlush == 0) flush();
  }
  void flush() {
    for (std::size_t f = 0; f < recent.size(); ++f) total[f] += recent[f], recent[f] = Scalar(0);
  }
};

// Whether token i of batch b has no gradient: G_h = 0 for every head h.
template <typename Scalar>
bool without_gradient(const Shape& shape, Rows<const Scalar> grad_out, Index b, Index i) {
  for (Index h = 0; h < shape.heads; ++h) {
    const Scalar* G = grad_out.at(b, h, i);
    if (std::any_of(G, G + shape.dim, [](Scalar x) { return x != Scalar(0); })) return false;
  }
  return true;
}

// The gradients of a token without one, all 0: dx, dden and, with a computed window, dq and the coefficients; with
// a given one, dlocal and shift.
template <typename Scalar>
void zero_token(const Shape& shape, const Gradients<Scalar>& g, Index b, Index i, Scalar* coef_s, Scalar* coef_p) {
  const Index D = shape.dim, span = shape.span();
  for (Index h = 0; h < shape.heads; ++h) {
    const Index at = (b * shape.heads + h) * shape.length + i;
    g.dden[at] = Scalar(0);
    std::fill(g.dx.at(b, h, i), g.dx.at(b, h, i) + D, Scalar(0));
    if (shape.given) {
      std::fill(g.dlocal.at(b, h, i), g.dlocal.at(b, h, i) + D, Scalar(0));
      g.shift[at] = Scalar(0);
    } else {
      std::fill(g.dq.at(b, h, i), g.dq.at(b, h, i) + D, Scalar(0));
      std::fill(coef_s + at * span, coef_s + (at + 1) * span, Scalar(0));
      std::fill(coef_p + at * span, coef_p + (at + 1) * span, Scalar(0));
    }
  }
}

// The backward's first pass over the queries [begin, end): dx, dden, the parameters' sums and, with a computed
// window, dq and per (b, h, i, offset) the coefficients dS and alpha p for the keys' pass; with a given one,
// dlocal and shift.
template <typename Scalar, Index kDim>
void backward_queries(const Shape& shape, const Inputs<Scalar>& in, Rows<const Scalar> grad_out,
                      const Gradients<Scalar>& g, Index begin, Index end, Scalar* coef_s, Scalar* coef_p,
                      double* chunk_total) {
  const Index D = head_dim<kDim>(shape), H = shape.heads, F = H * D, T = shape.length, w = shape.halo;
  const Index span = shape.span();
  const Scalar c = static_cast<Scalar>(in.scaling);
  Token<Scalar, kDim> token;
  token.reset(shape);
  std::vector<Scalar> dy(F);
  ParameterSums<Scalar> sums(chunk_total, 2 * F + H);
  Scalar *dscale = sums.dscale(), *dgate = dscale + F, *dmix = dgate + F;
  for (Index task = begin; task < end; ++task) {
    const Index b = task / T, i = task % T;
    if (without_gradient(shape, grad_out, b, i)) {
      zero_token(shape, g, b, i, coef_s, coef_p);
      continue;
    }
    token.compute(shape, in, b, i);
    const Index lo = std::max<Index>(0, i - w), hi = std::min(T, i + w + 1);
    const std::uint8_t* valid = in.valid + b * T;
    for (Index h = 0; h < H; ++h) {
      const Scalar* __restrict G = grad_out.at(b, h, i);
      const Scalar *__restrict local = token.local_of[h], *__restrict y = token.y.data() + h * D;
      const Scalar alpha = token.alpha[h];
      const Scalar dalpha = dot(G, local, D) - dot(G, y, D), g_local = dot(G, local, D);
      for (Index d = 0; d < D; ++d) dy[h * D + d] = (Scalar(1) - alpha) * G[d];
      const Index at = (b * H + h) * T + i;
      Scalar dlse = 0, dden = 0;
      if (!shape.shared) {
        dmix[h] += dalpha;
      } else {
        const Scalar den = in.den[at];
        if (den > Scalar(0) && token.seen[h]) {
          const Scalar e = dalpha * alpha * (Scalar(1) - alpha);
          dlse = e, dden = -e / den;
          if (in.mix[h] > std::numeric_limits<Scalar>::min()) dmix[h] -= e / in.mix[h];
        }
      }
      g.dden[at] = dden;
      const Scalar shift = dlse - alpha * g_local;
      if (shape.given) {
        Scalar* __restrict dlocal = g.dlocal.at(b, h, i);
        for (Index d = 0; d < D; ++d) dlocal[d] = alpha * G[d];
        g.shift[at] = shift;
        continue;
      }
      // The window: dS over the span, dq; alpha p and dS kept for the keys' pass.
      const Scalar* __restrict p = token.p.data() + h * span;
      Scalar *__restrict ds = coef_s + at * span, *__restrict ap = coef_p + at * span;
      Scalar* __restrict dq = g.dq.at(b, h, i);
      std::fill(dq, dq + D, Scalar(0));
      std::fill(ds, ds + span, Scalar(0));
      std::fill(ap, ap + span, Scalar(0));
      for (Index j = lo; j < hi; ++j) {
        const Index o = j - i + w;
        if (!valid[j] || p[o] == Scalar(0)) continue;
        ds[o] = p[o] * (alpha * dot(G, in.v.at(b, h, j), D) + shift);
        ap[o] = alpha * p[o];
        axpy(c * ds[o], in.k.at(b, h, j), dq, D);
      }
    }
    // The global term's rows: through the norm, or straight.
    if (!shape.given) {
      for (Index h = 0; h < H; ++h) std::copy(dy.data() + h * D, dy.data() + (h + 1) * D, g.dx.at(b, h, i));
      sums.token_done();
      continue;
    }
    const Scalar r = static_cast<Scalar>(token.r);
    double sum = 0.0;
    for (Index h = 0; h < H; ++h) {
      const Scalar *__restrict x = in.x.at(b, h, i), *__restrict s = token.s.data() + h * D;
      const Scalar *__restrict scale = in.scale + h * D, *__restrict dy_h = dy.data() + h * D;
      Scalar part = 0;
      for (Index d = 0; d < D; ++d) part += dy_h[d] * scale[d] * x[d] * s[d];
      sum += part;
    }
    const Scalar tail = static_cast<Scalar>(token.r * token.r * token.r * sum / static_cast<double>(F));
    for (Index h = 0; h < H; ++h)
      norm_backward_rows(in.x.at(b, h, i), token.s.data() + h * D, in.scale + h * D, in.gate + h * D,
                         dy.data() + h * D, r, tail, g.dx.at(b, h, i), dscale + h * D, dgate + h * D, D);
    sums.token_done();
  }
  sums.flush();
}

// The backward's second pass over the keys [begin, end): dk_j = c sum_i dS_ij q_i and dv_j = sum_i alpha_i p_ij
// G_i over the queries i that saw j.
template <typename Scalar, Index kDim>
void backward_keys(const Shape& shape, const Inputs<Scalar>& in, Rows<const Scalar> grad_out,
                   const Gradients<Scalar>& g, Index begin, Index end, const Scalar* coef_s, const Scalar* coef_p) {
  const Index D = head_dim<kDim>(shape), H = shape.heads, T = shape.length, w = shape.halo, span = shape.span();
  const Scalar c = static_cast<Scalar>(in.scaling);
  for (Index task = begin; task < end; ++task) {
    const Index b = task / T, j = task % T;
    const Index lo = std::max<Index>(0, j - w), hi = std::min(T, j + w + 1);
    for (Index h = 0; h < H; ++h) {
      Scalar *__restrict dk = g.dk.at(b, h, j), *__restrict dv = g.dv.at(b, h, j);
      std::fill(dk, dk + D, Scalar(0));
      std::fill(dv, dv + D, Scalar(0));
      for (Index i = lo; i < hi; ++i) {
        const Index at = ((b * H + h) * T + i) * span + (j - i + w);
        if (coef_s[at] == Scalar(0) && coef_p[at] == Scalar(0)) continue;
        axpy(c * coef_s[at], in.q.at(b, h, i), dk, D);
        axpy(coef_p[at], grad_out.at(b, h, i), dv, D);
      }
    }
  }
}

template <typename Scalar, Index kDim>
int backward(const Shape& shape, const Inputs<Scalar>& in, Rows<const Scalar> grad_out, const Gradients<Scalar>& g) {
  const Index tokens = shape.tokens(), chunks = chunk_count(tokens), F = shape.features(), H = shape.heads;
  const Index coefficients = shape.given ? 0 : tokens * H * shape.span(), width = 2 * F + H;
  // The coefficients, written in full by the first pass before the second reads them, in a buffer the calling
  // thread keeps between calls: a fresh one would cost a page fault per 4 KiB, as much as the pass itself.
  thread_local std::vector<Scalar> buffer;
  if (static_cast<Index>(buffer.size()) < 2 * coefficients) buffer.resize(2 * coefficients);
  Scalar *coef_s = buffer.data(), *coef_p = coef_s + coefficients;
  std::vector<double> partial(chunks * width, 0.0);
  int status = parallel_chunks(tokens, chunks, [&](Index begin, Index end, Index chunk) {
    backward_queries<Scalar, kDim>(shape, in, grad_out, g, begin, end, coef_s, coef_p,
                                   partial.data() + chunk * width);
  });
  if (status) return status;
  if (!shape.given) {
    status = parallel_chunks(tokens, chunks, [&](Index begin, Index end, Index) {
      backward_keys<Scalar, kDim>(shape, in, grad_out, g, begin, end, coef_s, coef_p);
    });
    if (status) return status;
  }
  // The parameters' gradients: the chunks' sums, in chunk order (the norm's only with the norm).
  for (Index f = shape.given ? 0 : 2 * F; f < width; ++f) {
    double sum = 0.0;
    for (Index chunk = 0; chunk < chunks; ++chunk) sum += partial[chunk * width + f];
    Scalar* target = f < F ? g.dscale + f : f < 2 * F ? g.dgate + (f - F) : g.dmix + (f - 2 * F);
    *target = static_cast<Scalar>(sum);
  }
  return 0;
}

// step<Scalar, kDim>(args...) with kDim the head dim where it is compiled in (32, 64), else 0 (any).
#define LOCAL_WINDOW_DISPATCH(step, Scalar, dim, ...)                    \
  switch (dim) {                                                         \
    case 32: return step<Scalar, 32>(__VA_ARGS__);                       \
    case 64: return step<Scalar, 64>(__VA_ARGS__);                       \
    default: return step<Scalar, 0>(__VA_ARGS__);                        \
  }

}  // namespace

// The window computed (the sliced kernel's, no norm): the sizes (B, H, T, D), the halo w, the combination (1:
// "shared", 0: "gate") and the scaling; then the tensors (forward: q, k, v, valid, x, den, mix, out; backward:
// grad_out, q, k, v, valid, x, den, mix, dq, dk, dv, dx, dden, dmix) and the (batch, head, token) element strides of
// the (B, H, T, D) ones: of q, k, v, x, out (forward); of grad_out, q, k, v, x, dq, dk, dv, dx (backward).
//
// The window given, after ReLA's norm (the combination): the sizes (B, H, T, D), the combination and the norm's eps;
// then the tensors (forward: x, den, local, lse, scale, gate, mix, out; backward: grad_out, x, den, local, lse,
// scale, gate, mix, dx, dden, dscale, dgate, dmix, dlocal, shift) and the strides of x, local, out (forward); of
// grad_out, x, local, dx, dlocal (backward). lse, den, shift and dden are (B, H, T) contiguous.
#define LOCAL_WINDOW_ENTRY_POINTS(SUFFIX, Scalar)                                                              \
  extern "C" int local_window_forward_##SUFFIX(Index batch, Index heads, Index length, Index dim, Index halo,  \
                                               Index shared, double scaling, const Scalar* q, const Scalar* k, \
                                               const Scalar* v, const std::uint8_t* valid, const Scalar* x,    \
                                               const Scalar* den, const Scalar* mix, Scalar* out,              \
                                               const Index* strides) {                                         \
    const Shape shape{batch, heads, length, dim, halo, shared != 0, false};                             \
    const Inputs<Scalar> in{{q, strides}, {k, strides + 3}, {v, strides + 6}, {x, strides + 9}, {}, valid, den, \
                            nullptr, nullptr, mix, nullptr, scaling, 0.0};                                     \
    const Rows<Scalar> rows{out, strides + 12};                                                                \
    LOCAL_WINDOW_DISPATCH(forward, Scalar, dim, shape, in, rows)                                               \
  }                                                                                                            \
  extern "C" int local_window_backward_##SUFFIX(                                                               \
      Index batch, Index heads, Index length, Index dim, Index halo, Index shared, double scaling,             \
      const Scalar* grad_out, const Scalar* q, const Scalar* k, const Scalar* v, const std::uint8_t* valid,    \
      const Scalar* x, const Scalar* den, const Scalar* mix, Scalar* dq, Scalar* dk, Scalar* dv, Scalar* dx,   \
      Scalar* dden, Scalar* dmix, const Index* strides) {                                                      \
    const Shape shape{batch, heads, length, dim, halo, shared != 0, false};                             \
    const Inputs<Scalar> in{{q, strides + 3}, {k, strides + 6}, {v, strides + 9}, {x, strides + 12}, {}, valid, \
                            den, nullptr, nullptr, mix, nullptr, scaling, 0.0};                                \
    const Gradients<Scalar> g{{dq, strides + 15}, {dk, strides + 18}, {dv, strides + 21}, {dx, strides + 24},  \
                              {}, dden, nullptr, nullptr, dmix, nullptr};                                      \
    const Rows<const Scalar> rows{grad_out, strides};                                                          \
    LOCAL_WINDOW_DISPATCH(backward, Scalar, dim, shape, in, rows, g)                                           \
  }                                                                                                            \
  extern "C" int local_window_combine_forward_##SUFFIX(                                                        \
      Index batch, Index heads, Index length, Index dim, Index shared, double eps, const Scalar* x,             \
      const Scalar* den, const Scalar* local, const Scalar* lse, const Scalar* scale, const Scalar* gate,      \
      const Scalar* mix, Scalar* out, const Index* strides) {                                                  \
    const Shape shape{batch, heads, length, dim, 0, shared != 0, true};                                  \
    const Inputs<Scalar> in{{}, {}, {}, {x, strides}, {local, strides + 3}, nullptr, den, scale, gate, mix,    \
                            lse, 1.0, eps};                                                                    \
    const Rows<Scalar> rows{out, strides + 6};                                                                 \
    LOCAL_WINDOW_DISPATCH(forward, Scalar, dim, shape, in, rows)                                               \
  }                                                                                                            \
  extern "C" int local_window_combine_backward_##SUFFIX(                                                       \
      Index batch, Index heads, Index length, Index dim, Index shared, double eps, const Scalar* grad_out,     \
      const Scalar* x, const Scalar* den, const Scalar* local, const Scalar* lse, const Scalar* scale,         \
      const Scalar* gate, const Scalar* mix, Scalar* dx, Scalar* dden, Scalar* dscale, Scalar* dgate,          \
      Scalar* dmix, Scalar* dlocal, Scalar* shift, const Index* strides) {                                     \
    const Shape shape{batch, heads, length, dim, 0, shared != 0, true};                                  \
    const Inputs<Scalar> in{{}, {}, {}, {x, strides + 3}, {local, strides + 6}, nullptr, den, scale, gate,     \
                            mix, lse, 1.0, eps};                                                               \
    const Gradients<Scalar> g{{}, {}, {}, {dx, strides + 9}, {dlocal, strides + 12}, dden, dscale, dgate,      \
                              dmix, shift};                                                                    \
    const Rows<const Scalar> rows{grad_out, strides};                                                          \
    LOCAL_WINDOW_DISPATCH(backward, Scalar, dim, shape, in, rows, g)                                           \
  }

LOCAL_WINDOW_ENTRY_POINTS(f32, float)
LOCAL_WINDOW_ENTRY_POINTS(f64, double)

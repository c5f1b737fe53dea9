// exp(x) for float as a branch-free polynomial, so that loops over it vectorise (a libm call per element
// does not): x = n ln 2 + r with |r| <= ln 2 / 2, exp(r) by Cephes' degree-6 polynomial (within 2 ulp), 2^n
// written into the exponent bits. Arguments are clamped to [-87, 88], float's normal range: below, the result
// is < 2e-38 instead of a denormal or 0; above, 1.7e38 instead of inf. double keeps std::exp.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

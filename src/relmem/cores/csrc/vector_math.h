// Vectorisable σ, tanh and e^y (y <= 0) for the fused operators' own loops (the RMC's step,
// the DNC's memory step and recurrence). libm's expf and tanhf are calls the compiler cannot
// vectorise; these are inline arithmetic with branches the compiler turns into blends, so a
// loop over a gate's columns runs in vector lanes. In double (the tests' dtype) they are libm's.
// Included by path from each operator's source (each is compiled alone by
// torch.utils.cpp_extension; ninja rebuilds an operator when this header changes).

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace relmem_math {

// e^y for y <= 0, written so that the compiler can vectorise loops that call it: in float a
// Cody-Waite range reduction and Cephes' degree-6 polynomial (within 2 ulp of expf), exactly 0
// below the normal range (so σ(−∞) = 0 and a −∞ gate bias closes a gate bitwise), NaN kept;
// in double (the tests' dtype) std::exp.
template <typename scalar_t>
[[gnu::always_inline]] inline scalar_t exp_nonpositive(scalar_t y) {
  return std::exp(y);
}

template <>
[[gnu::always_inline]] inline float exp_nonpositive(float y) {
  const float clamped = y > -88.0f ? y : -88.0f;  // NaN -> -88: the arithmetic stays finite
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  const float r = (clamped - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y >= -87.3f ? p * scale : (y < -87.3f ? 0.0f : y);
}

// σ(x) from e^−|x|: no overflow, σ(±∞) exactly 1 and 0.
template <typename scalar_t>
[[gnu::always_inline]] inline scalar_t sigmoid(scalar_t x) {
  const scalar_t e = exp_nonpositive(-std::abs(x));
  const scalar_t s = scalar_t(1) / (scalar_t(1) + e);
  return x >= 0 ? s : e * s;
}

// tanh(x) = sign(x)·(1 − e^−2|x|)/(1 + e^−2|x|) in float; std::tanh in double.
template <typename scalar_t>
[[gnu::always_inline]] inline scalar_t tanh_of(scalar_t x) {
  return std::tanh(x);
}

template <>
[[gnu::always_inline]] inline float tanh_of(float x) {
  const float e = exp_nonpositive(-2.0f * std::abs(x));
  const float t = (1.0f - e) / (1.0f + e);
  return x >= 0 ? t : -t;
}

}  // namespace relmem_math

// The scale rule every recipe shares, written once for host and device.
//
//   s = (amax * 2^margin) / fp8_max        (fp32, IEEE division)
//   amax == 0 (or no finite value)        -> s = 1
//   s below the smallest normal float     -> s = 2^-126 (so x / s stays finite)
//   s infinite                             -> s = FLT_MAX
//   power_of_two                           -> s rounded up to a power of two
//   q = saturating_cast(x / s)             (fp32, IEEE division; dequant: q * s)
#pragma once

#include <cmath>

#include "fp8ext/fp8_format.h"

namespace fp8ext {

struct ScaleRule {
  Fp8Format format = Fp8Format::kE4M3;
  int margin = 0;             // scale headroom in powers of two (Transformer Engine's margin)
  bool power_of_two = false;  // round s up to 2^k (exact rescaling, DeepSeek-style UE8M0)
};

constexpr float kMinNormalScale = 1.17549435e-38f;  // 2^-126
constexpr float kMaxScale = 3.40282347e+38f;        // FLT_MAX

// Smallest power of two >= s, for a positive normal s; 2^127 at most.
FP8EXT_HD float round_up_to_power_of_two(float s) {
  uint32_t b = bits_of(s);
  if ((b & 0x7FFFFFu) != 0) {
    b = (b & 0x7F800000u) + 0x00800000u;  // next exponent, zero mantissa
    if (b >= 0x7F800000u) b = 0x7F000000u;
  }
  return float_of(b);
}

// 2^e as a float, for |e| small enough to be a normal float (margins are limited to +-64).
FP8EXT_HD float exp2_int(int e) { return float_of(static_cast<uint32_t>(e + 127) << 23); }

FP8EXT_HD float scale_from_amax(float amax, const ScaleRule& rule) {
  if (!(amax > 0.0f)) return 1.0f;  // zero, or nothing finite was seen
  // Two steps, each correctly rounded: the multiply is exact unless it
  // overflows, the division is IEEE (no reciprocal, no fast math).
  const float scaled_amax = amax * exp2_int(rule.margin);
  float s = scaled_amax / fp8_max(rule.format);
  if (!(s >= kMinNormalScale)) s = kMinNormalScale;
  if (s > kMaxScale) s = kMaxScale;
  if (rule.power_of_two) s = round_up_to_power_of_two(s);
  return s;
}

// |x| if x is finite, else 0: amax is taken over finite values only.
FP8EXT_HD float finite_abs(float x) {
  const uint32_t b = bits_of(x) & 0x7FFFFFFFu;
  return b < 0x7F800000u ? float_of(b) : 0.0f;
}

// The kernels' division, x / s from r = RN(1 / s) with a multiply and two FMAs
// (Markstein: q0 = x * r is within an ulp, one residual step rounds it
// correctly). Valid when fast_division_ok(s) and the result is neither zero
// nor NaN: then it is x / s exactly, or, where the residual underflows, a value
// of the same sign below 2^-17 that FP8 rounds to zero all the same. Zeros and
// NaNs (zero or non-finite inputs, overflow) must be redone with an IEEE
// division. The C++ harness checks this against x / s.
FP8EXT_HD bool fast_division_ok(float s) { return s >= 0x1p-60f && s <= 0x1p60f; }

FP8EXT_HD float fast_quotient(float x, float s, float r) {
  const float q0 = x * r;
  return fmaf(fmaf(-q0, s, x), r, q0);
}

// x / s rounded once, with a NaN operand passed through as it is, sign
// included (x's if both are NaN): what the CPU reference gets from x86, where
// CUDA's division would return its one canonical positive NaN. The sign shows
// in the FP8 code (0xFF against 0x7F), and PyTorch's vectorised bf16 arithmetic
// does make negative NaNs (0xFFFF), so the FP8 encodes' IEEE divisions go
// through this. A NaN the division makes (0/0, Inf/Inf) stays CUDA's positive
// one, where x86 gives a negative default NaN: only a caller's scale of 0 or
// Inf gets there.
FP8EXT_HD float ieee_quotient(float x, float s) {
#if defined(__CUDA_ARCH__)
  return x != x ? x : s != s ? s : __fdiv_rn(x, s);
#else
  return x / s;
#endif
}

FP8EXT_HD uint8_t quantize_value(float x, float scale, Fp8Format f) {
  return encode_fp8_saturate(ieee_quotient(x, scale), f);
}

}  // namespace fp8ext

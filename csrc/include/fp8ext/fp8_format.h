// FP8 encodings (E4M3 "fn" and E5M2), bit-exact with torch.float8_e4m3fn and
// torch.float8_e5m2. Host and device code share these functions, so the CPU
// reference and the CUDA kernels round identically by construction.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8EXT_HD __host__ __device__ __forceinline__
#else
#define FP8EXT_HD inline
#endif

namespace fp8ext {

enum class Fp8Format : int { kE4M3 = 0, kE5M2 = 1 };

// Largest finite magnitude of each format.
constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

FP8EXT_HD constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::kE4M3 ? kE4M3Max : kE5M2Max; }

FP8EXT_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FP8EXT_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Layout of one format: exponent bits, mantissa bits, bias, the largest finite
// code (without sign), and the codes used for overflow and NaN.
struct Fp8Layout {
  int man_bits;
  int bias;
  uint32_t max_code;       // 0x7E for E4M3 (448), 0x7B for E5M2 (57344)
  uint32_t overflow_code;  // what a non-saturating cast gives past the max: NaN (E4M3) / Inf (E5M2)
  uint32_t nan_code;       // 0x7F in both formats
};

FP8EXT_HD Fp8Layout fp8_layout(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Fp8Layout{3, 7, 0x7Eu, 0x7Fu, 0x7Fu}
                               : Fp8Layout{2, 15, 0x7Bu, 0x7Cu, 0x7Fu};
}

// Round-to-nearest-even encoding of a float32 whose magnitude is finite.
// Codes past max_code (a non-saturating overflow) map to overflow_code.
FP8EXT_HD uint8_t encode_magnitude_rne(uint32_t abs_bits, const Fp8Layout& L) {
  const int min_normal_exp = 1 - L.bias;  // unbiased exponent of the smallest normal
  const uint32_t min_normal_bits = static_cast<uint32_t>(min_normal_exp + 127) << 23;
  uint32_t code;
  if (abs_bits < min_normal_bits) {
    // Subnormal range: the spacing is 2^(min_normal_exp - man_bits). Scaling by
    // its inverse is exact; adding 2^23 then rounds to an integer with RNE.
    const float scaled = float_of(abs_bits) *
                         float_of(static_cast<uint32_t>(127 - min_normal_exp + L.man_bits) << 23);
    code = static_cast<uint32_t>((scaled + 8388608.0f) - 8388608.0f);
    // code == 2^man_bits lands exactly on the smallest normal's encoding.
  } else {
    const int shift = 23 - L.man_bits;
    const uint32_t lsb = (abs_bits >> shift) & 1u;
    const uint32_t rounded = (abs_bits + ((1u << (shift - 1)) - 1u) + lsb) >> shift;
    // Re-bias the exponent field from float32's 127 to the format's bias.
    code = rounded - (static_cast<uint32_t>(127 - L.bias) << L.man_bits);
  }
  return static_cast<uint8_t>(code > L.max_code ? L.overflow_code : code);
}

// torch's `.to(float8)`: RNE, overflow to NaN (E4M3) or Inf (E5M2), sign kept.
FP8EXT_HD uint8_t encode_fp8(float x, Fp8Format f) {
  const Fp8Layout L = fp8_layout(f);
  const uint32_t bits = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | static_cast<uint8_t>(L.nan_code);
  if (abs_bits == 0x7F800000u) return sign | static_cast<uint8_t>(L.overflow_code);
  return sign | encode_magnitude_rne(abs_bits, L);
}

// The saturating cast (our default): clamp to +-max, then RNE. A finite input
// or an infinity never becomes NaN or Inf; NaN stays NaN (sign kept, as torch).
FP8EXT_HD uint8_t encode_fp8_saturate(float x, Fp8Format f) {
  const Fp8Layout L = fp8_layout(f);
  const uint32_t bits = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | static_cast<uint8_t>(L.nan_code);
  const uint32_t max_bits = bits_of(fp8_max(f));
  if (abs_bits > max_bits) abs_bits = max_bits;
  return sign | encode_magnitude_rne(abs_bits, L);
}

FP8EXT_HD float decode_fp8(uint8_t code, Fp8Format f) {
  const Fp8Layout L = fp8_layout(f);
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7Fu;
  const int exp_field = static_cast<int>(mag >> L.man_bits);
  const uint32_t man = mag & ((1u << L.man_bits) - 1u);
  if (f == Fp8Format::kE4M3 && mag == 0x7Fu) return float_of(sign | 0x7FC00000u);
  if (f == Fp8Format::kE5M2 && exp_field == 31) {
    return float_of(sign | (man == 0 ? 0x7F800000u : 0x7FC00000u));
  }
  if (exp_field == 0) {
    // Subnormal: man * 2^(1 - bias - man_bits), exact in float32.
    const float spacing = float_of(static_cast<uint32_t>(127 + 1 - L.bias - L.man_bits) << 23);
    return float_of(sign | bits_of(static_cast<float>(man) * spacing));
  }
  return float_of(sign | (static_cast<uint32_t>(exp_field - L.bias + 127) << 23) |
                  (man << (23 - L.man_bits)));
}

}  // namespace fp8ext

// Host-side reads of bf16 / fp16 / fp32 elements as float (all exact).
#pragma once

#include <cstdint>

#include "fp8ext/fp8_format.h"
#include "fp8ext/types.h"

namespace fp8ext::cpu {

inline float bf16_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return float_of(sign | 0x7F800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float32.
    return float_of(sign | bits_of(static_cast<float>(man) * 5.9604644775390625e-8f));
  }
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

// Calls fn(row_pointer_reader) with a reader for row r: reader(c) -> float.
template <typename Fn>
void with_row_reader(const ConstMatrix& x, Fn&& fn) {
  switch (x.dtype) {
    case DType::kFloat32: {
      const float* base = static_cast<const float*>(x.data);
      fn([base, &x](int64_t r, int64_t c) { return base[r * x.row_stride + c]; });
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* base = static_cast<const uint16_t*>(x.data);
      fn([base, &x](int64_t r, int64_t c) { return bf16_to_float(base[r * x.row_stride + c]); });
      break;
    }
    case DType::kFloat16: {
      const uint16_t* base = static_cast<const uint16_t*>(x.data);
      fn([base, &x](int64_t r, int64_t c) { return fp16_to_float(base[r * x.row_stride + c]); });
      break;
    }
  }
}

}  // namespace fp8ext::cpu

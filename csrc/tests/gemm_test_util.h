// Helpers the GEMM harnesses share: random FP8 operands, the output dtypes'
// encoding (bf16 and fp32; fp16 outputs are covered by pytest), the error
// against a float64 reference and its tolerance, and the shapes swept.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "fp8ext/fp8_format.h"
#include "fp8ext/types.h"

namespace fp8ext::test {

inline std::vector<uint8_t> random_codes(int64_t count, Fp8Format f, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<uint8_t> v(count);
  for (auto& c : v) c = encode_fp8_saturate(nd(rng) * 4.0f, f);
  return v;
}

// Values as the output dtype would hold them (the reference's bias is rounded the same way).
inline float round_to(DType d, float x) {
  if (d == DType::kFloat32) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (d == DType::kBFloat16) {
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // RNE to bf16 (finite inputs)
    std::memcpy(&x, &u, 4);
    return x;
  }
  return static_cast<float>(static_cast<double>(x));  // fp16 is not tested here (pytest covers it)
}

inline std::vector<uint8_t> encode_out(DType d, const std::vector<float>& v) {
  const size_t bytes = d == DType::kFloat32 ? 4 : 2;
  std::vector<uint8_t> out(v.size() * bytes);
  for (size_t i = 0; i < v.size(); ++i) {
    const float x = round_to(d, v[i]);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if (bytes == 4) std::memcpy(&out[i * 4], &u, 4);
    else {
      const uint16_t h = static_cast<uint16_t>(u >> 16);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

inline std::vector<double> decode_out(DType d, const std::vector<uint8_t>& raw, int64_t count) {
  std::vector<double> v(count);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u = 0;
    if (d == DType::kFloat32) std::memcpy(&u, &raw[i * 4], 4);
    else {
      uint16_t h;
      std::memcpy(&h, &raw[i * 2], 2);
      u = uint32_t{h} << 16;
    }
    float x;
    std::memcpy(&x, &u, 4);
    v[i] = x;
  }
  return v;
}

// The error of an m x n row-major output against ref(i, j), its float64
// reference, as one figure to hold against gemm_tolerance: the larger of the
// whole output's relative (Frobenius) error and half the worst row's or
// column's (slices get twice the whole output's tolerance, as the pytest
// checks' SLICE_TOLERANCE). One value off by a typical value in a 300 x 520
// output is 0.0025 of the whole, under the bf16 tolerance, but 0.044 of its
// row. A slice's norm is floored at a typical slice's, so that a short slice
// holding a value near 0 (a column of an M = 1 output is one value) does not
// turn rounding into error.
template <class Ref>
double gemm_error(const std::vector<double>& got, int64_t m, int64_t n, Ref&& ref) {
  std::vector<double> diff2(m * n), ref2(m * n);
  double err = 0.0, norm = 0.0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double r = ref(i, j), d = got[i * n + j] - r;
      diff2[i * n + j] = d * d;
      ref2[i * n + j] = r * r;
      err += d * d;
      norm += r * r;
    }
  double worst = std::sqrt(err / norm);
  auto slices = [&](int64_t count, int64_t len, int64_t outer_stride, int64_t inner_stride) {
    const double typical2 = norm * len / (m * n);
    for (int64_t s = 0; s < count; ++s) {
      double e = 0.0, r = 0.0;
      for (int64_t t = 0; t < len; ++t) {
        e += diff2[s * outer_stride + t * inner_stride];
        r += ref2[s * outer_stride + t * inner_stride];
      }
      worst = std::max(worst, 0.5 * std::sqrt(e / std::max(r, typical2)));
    }
  };
  slices(m, n, n, 1);  // rows
  slices(n, m, 1, n);  // columns
  return worst;
}

// Hopper's FP8 MMA accumulates with ~14 bits between the kernels' fp32
// promotions (every 128 of K): ~1-2.5e-4 relative error even with fp32 output.
inline double gemm_tolerance(DType d) { return d == DType::kFloat32 ? 1e-3 : 6e-3; }

struct GemmCase {
  int64_t m, n, k;
};

// FP8EXT_TEST_QUICK=1 (set for the compute-sanitizer run, where kernels are
// ~100x slower) keeps a representative subset: M = 1 and 129.
inline bool quick() { return std::getenv("FP8EXT_TEST_QUICK") != nullptr; }
inline bool in_quick_subset(const GemmCase& c) { return c.m == 1 || c.m == 129; }

}  // namespace fp8ext::test

// divide_by_scale (the kernels' reciprocal + FMA-correction division) must give
// the IEEE quotient x / s bit for bit, since the CPU reference divides.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "fp8ext/scaling.h"
#include "harness.h"

namespace {

float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

void check(float x, float s) {
  const float got = fp8ext::divide_by_scale(x, s, 1.0f / s);
  const float want = x / s;
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got));
    return;
  }
  if (std::fabs(want) < 0x1p-100f) {  // documented: any value this small with the right sign
    EXPECT_TRUE(std::fabs(got) < 0x1p-99f && std::signbit(got) == std::signbit(want));
    return;
  }
  char ctx[96];
  std::snprintf(ctx, sizeof ctx, "x=%a s=%a", x, s);
  EXPECT_EQ_CTX(bits_of(got), bits_of(want), std::string(ctx));
}

}  // namespace

// The quotient's mantissa depends only on the operands' mantissas (exponents
// shift it) while nothing over/underflows: every bf16 mantissa, at both
// exponent parities, against every 241st fp32 scale mantissa (an exhaustive sweep
// of all 2^23 mantissas passed when this was written, for bf16 and fp16).
FP8EXT_TEST(bf16_mantissas_times_scale_mantissas) {
  for (uint32_t sm = 0; sm < (1u << 23); sm += 241)
    for (uint32_t xm = 0; xm < 128; ++xm)
      for (uint32_t e = 0; e < 2; ++e) check(float_of(((127u + e) << 23) | (xm << 16)), float_of((127u << 23) | sm));
}

FP8EXT_TEST(fp16_mantissas_times_scale_mantissas) {
  for (uint32_t sm = 7; sm < (1u << 23); sm += 2039)
    for (uint32_t xm = 0; xm < 1024; ++xm) check(float_of((128u << 23) | (xm << 13)), float_of((127u << 23) | sm));
}

FP8EXT_TEST(random_fp32_over_the_whole_range) {
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 500000; ++i) {
    const uint64_t u = rng();
    // Any x (including NaN, Inf, subnormals); s positive, any exponent.
    check(float_of(static_cast<uint32_t>(u)), float_of(static_cast<uint32_t>(u >> 32) & 0x7FFFFFFFu));
  }
}

FP8EXT_TEST(random_fp32_typical_quantization_range) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> log_mag(-40.0f, 40.0f);
  for (int i = 0; i < 500000; ++i) {
    const float x = std::exp2(log_mag(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    const float s = std::exp2(log_mag(rng));
    check(x, s);
    check(std::nextafter(x, 0.0f), s);
  }
}

FP8EXT_TEST(specials) {
  const float inf = INFINITY, tiny = float_of(1), big = 3.4028235e38f;
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, tiny, -tiny, big, -big, 1e-38f, 448.0f})
    for (float s : {1.0f, 0x1p-126f, tiny, big, inf, 0.5f, 3.0f, 1e-30f, 1e30f}) check(x, s);
}

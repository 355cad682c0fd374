// fast_quotient (the kernels' reciprocal + FMA-correction division) must agree
// with the CPU reference's IEEE quotient x / s wherever the kernels use it: a
// nonzero, non-NaN result for a scale with fast_division_ok is x / s bit for bit,
// or (below 2^-17, where the residual may underflow) encodes to the same FP8 code.
#include <cmath>
#include <cstdio>
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

// Returns whether (x, s) was compared: the sweeps count them, so that a
// fast_division_ok or fast_quotient that flagged everything would fail.
bool check(float x, float s) {
  if (!fp8ext::fast_division_ok(s)) return false;  // the kernels divide exactly
  const float got = fp8ext::fast_quotient(x, s, 1.0f / s);
  if (!(std::fabs(got) > 0.0f)) return false;  // zero or NaN: the kernels redo the chunk exactly
  const float want = x / s;
  char ctx[96];
  std::snprintf(ctx, sizeof ctx, "x=%a s=%a", x, s);
  if (std::fabs(want) >= 0x1p-17f) EXPECT_EQ_CTX(bits_of(got), bits_of(want), std::string(ctx));
  for (auto f : {fp8ext::Fp8Format::kE4M3, fp8ext::Fp8Format::kE5M2})
    EXPECT_EQ_CTX(int(fp8ext::encode_fp8_saturate(got, f)), int(fp8ext::encode_fp8_saturate(want, f)), std::string(ctx));
  return true;
}

}  // namespace

// The quotient's mantissa depends only on the operands' mantissas (exponents
// shift it) while nothing over/underflows: every bf16 mantissa, at both
// exponent parities, against every 241st fp32 scale mantissa (an exhaustive sweep
// of all 2^23 mantissas passed when this was written, for bf16 and fp16).
// Every case there is a normal quotient near 1: all must be compared.
FP8EXT_TEST(bf16_mantissas_times_scale_mantissas) {
  long cases = 0, compared = 0;
  for (uint32_t sm = 0; sm < (1u << 23); sm += 241)
    for (uint32_t xm = 0; xm < 128; ++xm)
      for (uint32_t e = 0; e < 2; ++e, ++cases)
        compared += check(float_of(((127u + e) << 23) | (xm << 16)), float_of((127u << 23) | sm));
  EXPECT_EQ(compared, cases);
}

FP8EXT_TEST(fp16_mantissas_times_scale_mantissas) {
  long cases = 0, compared = 0;
  for (uint32_t sm = 7; sm < (1u << 23); sm += 2039)
    for (uint32_t xm = 0; xm < 1024; ++xm, ++cases)
      compared += check(float_of((128u << 23) | (xm << 13)), float_of((127u << 23) | sm));
  EXPECT_EQ(compared, cases);
}

FP8EXT_TEST(random_fp32_over_the_whole_range) {
  std::mt19937_64 rng(std::random_device{}());
  long compared = 0;
  for (int i = 0; i < 500000; ++i) {
    const uint64_t u = rng();
    // Any x (including NaN, Inf, subnormals); s positive, exponents around the fast range.
    const uint32_t s_bits = (static_cast<uint32_t>(u >> 32) & 0x807FFFFFu) | ((60u + (static_cast<uint32_t>(u >> 55) % 136u)) << 23);
    compared += check(float_of(static_cast<uint32_t>(u)), float_of(s_bits & 0x7FFFFFFFu));
  }
  std::printf("    random_fp32_over_the_whole_range: %ld of 500000 compared\n", compared);
  EXPECT_TRUE(compared > 350000);  // ~82% are (the rest: zero, NaN or slow-path scales)
}

FP8EXT_TEST(random_fp32_typical_quantization_range) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> log_mag(-60.0f, 60.0f);
  long compared = 0;
  for (int i = 0; i < 500000; ++i) {
    const float x = std::exp2(log_mag(rng) * 2.0f) * ((rng() & 1) ? -1.0f : 1.0f);
    const float s = std::exp2(log_mag(rng));
    compared += check(x, s);
    compared += check(std::nextafter(x, 0.0f), s);
  }
  std::printf("    random_fp32_typical_quantization_range: %ld of 1000000 compared\n", compared);
  EXPECT_TRUE(compared > 850000);  // ~94% are
}

FP8EXT_TEST(specials_are_flagged_or_exact) {
  const float inf = INFINITY, tiny = float_of(1), big = 3.4028235e38f;
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, tiny, -tiny, big, -big, 1e-38f, 448.0f, 0x1p-77f})
    for (float s : {1.0f, 0x1p-60f, 0x1p60f, 0.5f, 3.0f, 1e-18f, 1e18f}) check(x, s);
  // Zeros lose their sign and non-finite inputs give NaN: both must be flagged.
  EXPECT_TRUE(!(std::fabs(fp8ext::fast_quotient(-0.0f, 3.0f, 1.0f / 3.0f)) > 0.0f));
  EXPECT_TRUE(std::isnan(fp8ext::fast_quotient(inf, 3.0f, 1.0f / 3.0f)));
  EXPECT_TRUE(std::isnan(fp8ext::fast_quotient(big, 0x1p-60f, 0x1p60f)));
  EXPECT_TRUE(!fp8ext::fast_division_ok(0x1p-61f) && !fp8ext::fast_division_ok(NAN) && !fp8ext::fast_division_ok(-1.0f));
  EXPECT_TRUE(fp8ext::fast_division_ok(1.0f) && check(3.0f, 1.0f) && check(-448.0f, 0x1p-20f));
}

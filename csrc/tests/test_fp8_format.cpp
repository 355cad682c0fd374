// FP8 encode/decode against an independent oracle: values computed from the
// format's definition, and nearest-value search over all codes.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "fp8ext/fp8_format.h"
#include "harness.h"

using fp8ext::Fp8Format;

namespace {

struct Spec {
  Fp8Format f;
  int exp_bits, man_bits, bias;
  double max;
};
const Spec kSpecs[] = {{Fp8Format::kE4M3, 4, 3, 7, 448.0}, {Fp8Format::kE5M2, 5, 2, 15, 57344.0}};

bool is_nan_code(const Spec& s, int code) {
  const int mag = code & 0x7F;
  if (s.f == Fp8Format::kE4M3) return mag == 0x7F;
  return (mag >> 2) == 31 && (mag & 3) != 0;
}
bool is_inf_code(const Spec& s, int code) { return s.f == Fp8Format::kE5M2 && (code & 0x7F) == 0x7C; }

// Value of a code from the definition (double precision).
double oracle_decode(const Spec& s, int code) {
  const int e = (code & 0x7F) >> s.man_bits;
  const int m = code & ((1 << s.man_bits) - 1);
  const double mag = e == 0 ? std::ldexp(m, 1 - s.bias - s.man_bits)
                            : std::ldexp(1.0 + std::ldexp(m, -s.man_bits), e - s.bias);
  return (code & 0x80) ? -mag : mag;
}

// Nearest finite code to |x| (ties to the even code), searching all codes;
// values past the max round against a virtual next step (max + spacing at max).
int oracle_encode_magnitude(const Spec& s, double ax, bool saturate, bool* overflow) {
  *overflow = false;
  const int max_code = s.f == Fp8Format::kE4M3 ? 0x7E : 0x7B;
  if (saturate && ax > s.max) ax = s.max;
  const double step_at_max = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(s.max))) - s.man_bits);
  const double overflow_at = s.max + step_at_max / 2;
  // At the tie the even code wins: E4M3's max (0x7E) is even, E5M2's (0x7B) is odd.
  if (ax > overflow_at || (ax == overflow_at && (max_code & 1))) {
    *overflow = true;
    return -1;
  }
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= max_code; ++c) {
    const double err = std::fabs(oracle_decode(s, c) - ax);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

void check_encode(const Spec& s, float x) {
  const uint8_t got_sat = fp8ext::encode_fp8_saturate(x, s.f);
  const uint8_t got_raw = fp8ext::encode_fp8(x, s.f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  std::ostringstream ctx;
  ctx << "x=" << x << " fmt=" << static_cast<int>(s.f);
  if (std::isnan(x)) {
    EXPECT_EQ_CTX(got_sat, sign | 0x7F, ctx.str());
    EXPECT_EQ_CTX(got_raw, sign | 0x7F, ctx.str());
    return;
  }
  bool overflow = false;
  const int want_sat = oracle_encode_magnitude(s, std::fabs(static_cast<double>(x)), true, &overflow);
  EXPECT_EQ_CTX(int(got_sat), sign | want_sat, ctx.str());
  const int want_raw = oracle_encode_magnitude(s, std::fabs(static_cast<double>(x)), false, &overflow);
  const int overflow_code = s.f == Fp8Format::kE4M3 ? 0x7F : 0x7C;
  EXPECT_EQ_CTX(int(got_raw), sign | (overflow || std::isinf(x) ? overflow_code : want_raw), ctx.str());
}

}  // namespace

FP8EXT_TEST(decode_matches_definition_on_all_codes) {
  for (const Spec& s : kSpecs)
    for (int code = 0; code < 256; ++code) {
      const float got = fp8ext::decode_fp8(static_cast<uint8_t>(code), s.f);
      if (is_nan_code(s, code)) {
        EXPECT_TRUE(std::isnan(got));
      } else if (is_inf_code(s, code)) {
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == bool(code & 0x80));
      } else {
        EXPECT_EQ_CTX(static_cast<double>(got), oracle_decode(s, code), std::to_string(code));
        EXPECT_EQ(std::signbit(got), bool(code & 0x80));
      }
    }
}

FP8EXT_TEST(constants) {
  EXPECT_EQ(fp8ext::fp8_max(Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8ext::fp8_max(Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(fp8ext::decode_fp8(0x01, Fp8Format::kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8ext::decode_fp8(0x08, Fp8Format::kE4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8ext::decode_fp8(0x01, Fp8Format::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8ext::decode_fp8(0x04, Fp8Format::kE5M2), std::ldexp(1.0f, -14));
}

FP8EXT_TEST(encode_roundtrips_every_code) {
  for (const Spec& s : kSpecs)
    for (int code = 0; code < 256; ++code) {
      if (is_nan_code(s, code) || is_inf_code(s, code)) continue;
      const float v = fp8ext::decode_fp8(static_cast<uint8_t>(code), s.f);
      EXPECT_EQ_CTX(int(fp8ext::encode_fp8_saturate(v, s.f)), code, std::to_string(code));
    }
}

FP8EXT_TEST(encode_midpoints_and_neighbours) {
  // Every midpoint between adjacent codes (the ties), and the floats just around it.
  for (const Spec& s : kSpecs) {
    const int max_code = s.f == Fp8Format::kE4M3 ? 0x7E : 0x7B;
    for (int c = 0; c <= max_code; ++c) {
      const double lo = oracle_decode(s, c);
      const double hi = c < max_code ? oracle_decode(s, c + 1) : s.max + (s.max - oracle_decode(s, c - 1));
      const float mid = static_cast<float>((lo + hi) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), static_cast<float>(lo),
                      static_cast<float>(hi)}) {
        check_encode(s, x);
        check_encode(s, -x);
      }
    }
  }
}

FP8EXT_TEST(encode_specials) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Spec& s : kSpecs) {
    for (float x : {0.0f, -0.0f, inf, -inf, nan, -nan, 1e-45f, -1e-45f, 1e-30f, 3.4e38f, -3.4e38f,
                    1e6f, 464.0f, 465.0f, 479.9f, 480.0f, 61439.0f, 61440.0f, 65536.0f})
      check_encode(s, x);
    EXPECT_EQ(int(fp8ext::encode_fp8_saturate(inf, s.f)), s.f == Fp8Format::kE4M3 ? 0x7E : 0x7B);
    EXPECT_EQ(int(fp8ext::encode_fp8_saturate(-inf, s.f)), s.f == Fp8Format::kE4M3 ? 0xFE : 0xFB);
  }
}

FP8EXT_TEST(encode_random_floats) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> log_mag(-25.0f, 20.0f);
  for (const Spec& s : kSpecs)
    for (int i = 0; i < 20000; ++i) {
      const float x = std::exp2(log_mag(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
      check_encode(s, x);
    }
}

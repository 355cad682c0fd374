// The CPU quantization recipes against hand-computed expectations: scale rule,
// layouts, padding, non-finite inputs and the delayed-scaling history.
#include <cmath>
#include <limits>
#include <vector>

#include "fp8ext/quantize.h"
#include "harness.h"

using namespace fp8ext;

namespace {

ConstMatrix view(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return ConstMatrix{v.data(), DType::kFloat32, rows, cols, cols};
}

struct Out {
  std::vector<uint8_t> data;
  Fp8Matrix m;
  Out(int64_t rows, int64_t cols, int64_t padded, Fp8Format f = Fp8Format::kE4M3)
      : data(rows * padded, 0xAA), m{nullptr, f, rows, cols, padded} {
    m.data = data.data();
  }
  float at(int64_t r, int64_t c) const { return decode_fp8(data[r * m.padded_cols + c], m.format); }
};

}  // namespace

FP8EXT_TEST(scale_rule) {
  ScaleRule rule;
  EXPECT_EQ(scale_from_amax(448.0f, rule), 1.0f);
  EXPECT_EQ(scale_from_amax(896.0f, rule), 2.0f);
  EXPECT_EQ(scale_from_amax(0.0f, rule), 1.0f);
  EXPECT_EQ(scale_from_amax(1e-44f, rule), kMinNormalScale);
  rule.margin = 2;
  EXPECT_EQ(scale_from_amax(448.0f, rule), 4.0f);
  rule.margin = 0;
  rule.power_of_two = true;
  EXPECT_EQ(scale_from_amax(449.0f, rule), 2.0f);
  EXPECT_EQ(scale_from_amax(448.0f, rule), 1.0f);
  EXPECT_EQ(scale_from_amax(3.0e38f, ScaleRule{Fp8Format::kE4M3, 64, true}), std::ldexp(1.0f, 127));
  rule = ScaleRule{Fp8Format::kE5M2, 0, false};
  EXPECT_EQ(scale_from_amax(57344.0f, rule), 1.0f);
  EXPECT_EQ(scale_from_amax(1.0f, rule), 1.0f / 57344.0f);
}

FP8EXT_TEST(per_tensor_scale_and_values) {
  std::vector<float> x = {896.0f, -2.0f, 1.0f, 0.5f, -896.0f, 3.0f};
  Out q(2, 3, 16);
  float s = 0;
  cpu::quantize_per_tensor(view(x, 2, 3), ScaleRule{}, q.m, &s);
  EXPECT_EQ(s, 2.0f);
  EXPECT_EQ(q.at(0, 0), 448.0f);
  EXPECT_EQ(q.at(0, 1), -1.0f);
  EXPECT_EQ(q.at(1, 1), -448.0f);
  for (int r = 0; r < 2; ++r)
    for (int c = 3; c < 16; ++c) EXPECT_EQ(int(q.data[r * 16 + c]), 0);  // K padding zeroed
}

FP8EXT_TEST(non_finite_inputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan, inf, -inf, 4.0f};
  Out q(1, 4, 4);
  float s = 0;
  cpu::quantize_per_tensor(view(x, 1, 4), ScaleRule{}, q.m, &s);
  EXPECT_EQ(s, 4.0f / 448.0f);  // amax over finite values only
  EXPECT_TRUE(std::isnan(q.at(0, 0)));
  EXPECT_EQ(q.at(0, 1), 448.0f);  // +-Inf saturate
  EXPECT_EQ(q.at(0, 2), -448.0f);
  EXPECT_EQ(q.at(0, 3), 448.0f);
  std::vector<float> all_bad = {nan, inf};
  Out q2(1, 2, 2);
  cpu::quantize_per_tensor(view(all_bad, 1, 2), ScaleRule{}, q2.m, &s);
  EXPECT_EQ(s, 1.0f);
}

FP8EXT_TEST(per_row_zero_row_gets_unit_scale) {
  std::vector<float> x = {0, 0, 0, 1, -224, 2};
  Out q(2, 3, 3);
  float s[2];
  cpu::quantize_per_row(view(x, 2, 3), ScaleRule{}, q.m, s);
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 0.5f);
  EXPECT_EQ(q.at(0, 1), 0.0f);
  EXPECT_EQ(q.at(1, 1), -448.0f);
}

FP8EXT_TEST(group_scales_are_m_major_and_padded) {
  const int64_t rows = 3, cols = 200;  // 2 groups, the second partial; rows padded to 4
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = (c < 128 ? 1.0f : 10.0f) * float(r + 1) * (c % 7 == 0 ? 448.0f : 1.0f);
  Out q(rows, cols, 208);
  std::vector<float> s(2 * 4, -1.0f);
  cpu::quantize_per_group(view(x, rows, cols), ScaleRule{}, q.m, s.data());
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(s[0 * 4 + r], float(r + 1));
    EXPECT_EQ(s[1 * 4 + r], 10.0f * float(r + 1));
  }
  EXPECT_EQ(s[3], 0.0f);  // padding row
  EXPECT_EQ(s[7], 0.0f);
  EXPECT_EQ(q.at(2, 0), 448.0f);
  EXPECT_EQ(q.at(2, 1), 1.0f);
}

FP8EXT_TEST(block_scales_row_major) {
  const int64_t rows = 130, cols = 129;  // 2x2 blocks, partial on both sides
  std::vector<float> x(rows * cols, 1.0f);
  x[129 * cols + 128] = 896.0f;  // lone element of block (1, 1)
  x[0] = 4480.0f;                // block (0, 0)
  Out q(rows, cols, cols);
  std::vector<float> s(4);
  cpu::quantize_per_block(view(x, rows, cols), ScaleRule{}, q.m, s.data());
  EXPECT_EQ(s[0], 10.0f);
  EXPECT_EQ(s[1], 1.0f / 448.0f);
  EXPECT_EQ(s[2], 1.0f / 448.0f);
  EXPECT_EQ(s[3], 2.0f);
  EXPECT_EQ(q.at(129, 128), 448.0f);
  EXPECT_EQ(q.at(0, 0), 448.0f);
}

FP8EXT_TEST(delayed_history_rolls_and_rescales) {
  std::vector<float> hist(3, 0.0f);
  float scale = 1.0f, used = 0.0f;
  std::vector<float> a = {896.0f, 1.0f};
  std::vector<float> b = {44.8f, 1.0f};
  Out q(1, 2, 2);
  cpu::quantize_delayed(view(a, 1, 2), ScaleRule{}, true, hist.data(), 3, &scale, q.m, &used);
  EXPECT_EQ(used, 1.0f);  // first call quantizes with the initial scale
  EXPECT_EQ(q.at(0, 0), 448.0f);  // and saturates
  EXPECT_EQ(hist[0], 896.0f);
  EXPECT_EQ(scale, 2.0f);
  cpu::quantize_delayed(view(b, 1, 2), ScaleRule{}, true, hist.data(), 3, &scale, q.m, &used);
  EXPECT_EQ(used, 2.0f);
  EXPECT_EQ(hist[0], 44.8f);
  EXPECT_EQ(hist[1], 896.0f);
  EXPECT_EQ(scale, 2.0f);  // max over the history
  cpu::quantize_delayed(view(b, 1, 2), ScaleRule{}, false, hist.data(), 3, &scale, q.m, &used);
  EXPECT_EQ(scale, 44.8f / 448.0f);  // most recent
  EXPECT_EQ(hist[2], 896.0f);
}

FP8EXT_TEST(cast_saturates_e5m2_where_torch_overflows) {
  std::vector<float> x = {70000.0f, -1e30f, 61440.0f};
  Out sat(1, 3, 3, Fp8Format::kE5M2), raw(1, 3, 3, Fp8Format::kE5M2);
  cpu::cast_to_fp8(view(x, 1, 3), sat.m, true);
  cpu::cast_to_fp8(view(x, 1, 3), raw.m, false);
  EXPECT_EQ(sat.at(0, 0), 57344.0f);
  EXPECT_EQ(sat.at(0, 1), -57344.0f);
  EXPECT_EQ(sat.at(0, 2), 57344.0f);
  EXPECT_TRUE(std::isinf(raw.at(0, 0)));
  EXPECT_TRUE(std::isinf(raw.at(0, 2)));
}

FP8EXT_TEST(half_and_bfloat16_inputs) {
  // 1.5 and -3.0 in fp16 (0x3E00, 0xC200) and bf16 (0x3FC0, 0xC040); a fp16 subnormal (0x0001).
  std::vector<uint16_t> h = {0x3E00, 0xC200, 0x0001};
  std::vector<uint16_t> b = {0x3FC0, 0xC040, 0x0000};
  Out qh(1, 3, 3), qb(1, 3, 3);
  cpu::quantize_with_scale(ConstMatrix{h.data(), DType::kFloat16, 1, 3, 3}, 1.0f, qh.m);
  cpu::quantize_with_scale(ConstMatrix{b.data(), DType::kBFloat16, 1, 3, 3}, 1.0f, qb.m);
  EXPECT_EQ(qh.at(0, 0), 1.5f);
  EXPECT_EQ(qh.at(0, 1), -3.0f);
  EXPECT_EQ(qh.at(0, 2), 0.0f);  // 2^-24 rounds to zero in E4M3
  EXPECT_EQ(qb.at(0, 0), 1.5f);
  EXPECT_EQ(qb.at(0, 1), -3.0f);
  EXPECT_EQ(cpu::amax_finite(ConstMatrix{h.data(), DType::kFloat16, 1, 3, 3}), 3.0f);
}

// CPU reference implementations of every quantization recipe. They define the
// numerics (see fp8ext/scaling.h) that the CUDA kernels must match bit for bit.
#include <algorithm>
#include <cmath>

#include "element_cpu.h"
#include "fp8ext/quantize.h"

namespace fp8ext::cpu {
namespace {

struct Rect {
  int64_t r0, r1, c0, c1;
};

template <typename Reader>
float rect_amax(const Reader& read, const Rect& t) {
  float amax = 0.0f;
  for (int64_t r = t.r0; r < t.r1; ++r)
    for (int64_t c = t.c0; c < t.c1; ++c) amax = std::max(amax, finite_abs(read(r, c)));
  return amax;
}

template <typename Reader>
void rect_quantize(const Reader& read, const Rect& t, float scale, const Fp8Matrix& q) {
  for (int64_t r = t.r0; r < t.r1; ++r)
    for (int64_t c = t.c0; c < t.c1; ++c)
      q.data[r * q.padded_cols + c] = quantize_value(read(r, c), scale, q.format);
}

void zero_k_padding(const Fp8Matrix& q) {
  for (int64_t r = 0; r < q.rows; ++r)
    std::fill(q.data + r * q.padded_cols + q.cols, q.data + (r + 1) * q.padded_cols, uint8_t{0});
}

Rect whole(const ConstMatrix& x) { return {0, x.rows, 0, x.cols}; }

}  // namespace

void cast_to_fp8(const ConstMatrix& x, const Fp8Matrix& q, bool saturate) {
  with_row_reader(x, [&](auto read) {
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) {
        const float v = read(r, c);
        q.data[r * q.padded_cols + c] =
            saturate ? encode_fp8_saturate(v, q.format) : encode_fp8(v, q.format);
      }
  });
  zero_k_padding(q);
}

float amax_finite(const ConstMatrix& x) {
  float amax = 0.0f;
  with_row_reader(x, [&](auto read) { amax = rect_amax(read, whole(x)); });
  return amax;
}

void quantize_with_scale(const ConstMatrix& x, float scale, const Fp8Matrix& q) {
  with_row_reader(x, [&](auto read) { rect_quantize(read, whole(x), scale, q); });
  zero_k_padding(q);
}

void quantize_per_tensor(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                         float* scale_out) {
  const float s = scale_from_amax(amax_finite(x), rule);
  quantize_with_scale(x, s, q);
  *scale_out = s;
}

void quantize_delayed(const ConstMatrix& x, const ScaleRule& rule, bool use_history_max,
                      float* amax_history, int64_t history_len, float* scale,
                      const Fp8Matrix& q, float* scale_used) {
  const float s = *scale;
  quantize_with_scale(x, s, q);
  *scale_used = s;
  if (history_len <= 0) return;
  std::copy_backward(amax_history, amax_history + history_len - 1, amax_history + history_len);
  amax_history[0] = amax_finite(x);
  // As the CUDA kernel: a max from 0 that skips NaN (fmax), whatever a caller wrote into the history.
  float amax = amax_history[0];
  if (use_history_max) {
    amax = 0.0f;
    for (int64_t i = 0; i < history_len; ++i) amax = std::fmax(amax, amax_history[i]);
  }
  *scale = scale_from_amax(amax, rule);
}

void quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                      float* row_scales) {
  with_row_reader(x, [&](auto read) {
    for (int64_t r = 0; r < x.rows; ++r) {
      const Rect row{r, r + 1, 0, x.cols};
      const float s = scale_from_amax(rect_amax(read, row), rule);
      rect_quantize(read, row, s, q);
      row_scales[r] = s;
    }
  });
  zero_k_padding(q);
}

void quantize_per_group(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                        float* group_scales) {
  const int64_t groups = ceil_div(x.cols, kGroupSize);
  const int64_t padded_rows = round_up(x.rows, kGroupScaleRowAlign);
  std::fill(group_scales, group_scales + groups * padded_rows, 0.0f);
  with_row_reader(x, [&](auto read) {
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const Rect group{r, r + 1, g * kGroupSize, std::min(x.cols, (g + 1) * kGroupSize)};
        const float s = scale_from_amax(rect_amax(read, group), rule);
        rect_quantize(read, group, s, q);
        group_scales[g * padded_rows + r] = s;
      }
  });
  zero_k_padding(q);
}

void quantize_per_block(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                        float* block_scales) {
  const int64_t block_rows = ceil_div(x.rows, kGroupSize);
  const int64_t block_cols = ceil_div(x.cols, kGroupSize);
  with_row_reader(x, [&](auto read) {
    for (int64_t br = 0; br < block_rows; ++br)
      for (int64_t bc = 0; bc < block_cols; ++bc) {
        const Rect block{br * kGroupSize, std::min(x.rows, (br + 1) * kGroupSize),
                         bc * kGroupSize, std::min(x.cols, (bc + 1) * kGroupSize)};
        const float s = scale_from_amax(rect_amax(read, block), rule);
        rect_quantize(read, block, s, q);
        block_scales[br * block_cols + bc] = s;
      }
  });
  zero_k_padding(q);
}

}  // namespace fp8ext::cpu

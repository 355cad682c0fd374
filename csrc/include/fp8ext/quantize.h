// Quantization entry points of the torch-free kernel library.
//
// Scale layouts (fp32):
//   per-tensor          1 value
//   per-row             [rows]
//   1x128 groups        logical [rows, ceil(cols/128)], stored M-major:
//                       scale(r, g) = scales[g * padded_rows + r],
//                       padded_rows = round_up(rows, 4); padding entries are 0
//   128x128 blocks      [ceil(rows/128), ceil(cols/128)] row-major
// Partial groups and blocks take their amax over the elements that exist.
#pragma once

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cpu {

// Element-wise cast of a matrix to FP8 (saturating or torch's overflow rules).
void cast_to_fp8(const ConstMatrix& x, const Fp8Matrix& q, bool saturate);

// Largest finite |x| (0 when there is none).
float amax_finite(const ConstMatrix& x);

// q = saturating_cast(x / scale) with one scale for the whole matrix.
void quantize_with_scale(const ConstMatrix& x, float scale, const Fp8Matrix& q);

// Current scaling: amax, scale and quantization of the live tensor.
void quantize_per_tensor(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                         float* scale_out);

// Delayed scaling: quantize with *scale (derived from the history so far), push
// this tensor's amax to the front of amax_history (newest first), then set
// *scale from max(history) or history[0] (use_history_max = false).
// *scale_used receives the scale this call quantized with.
void quantize_delayed(const ConstMatrix& x, const ScaleRule& rule, bool use_history_max,
                      float* amax_history, int64_t history_len, float* scale,
                      const Fp8Matrix& q, float* scale_used);

void quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                      float* row_scales);

void quantize_per_group(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                        float* group_scales);

void quantize_per_block(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                        float* block_scales);

}  // namespace fp8ext::cpu

// CUDA quantization entry points (torch-free). Same numerics and scale layouts
// as fp8ext::cpu (quantize.h); every pointer is device memory, scales included,
// and nothing synchronises with the host, so all of these are graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda {

cudaError_t cast_to_fp8(const ConstMatrix& x, const Fp8Matrix& q, bool saturate, cudaStream_t stream);

// q = saturating_cast(x / *scale).
cudaError_t quantize_with_scale(const ConstMatrix& x, const float* scale, const Fp8Matrix& q,
                                cudaStream_t stream);

// Current scaling, two passes: a grid-wide amax into *amax_workspace (one float),
// then quantization with the scale derived from it. Two passes because a tensor
// larger than L2 cannot be held on chip while the grid agrees on its amax.
cudaError_t quantize_per_tensor(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                float* scale_out, float* amax_workspace, cudaStream_t stream);

// Delayed scaling: one pass quantizes with *scale and reduces this tensor's amax;
// a one-block kernel then rolls the history and recomputes *scale.
cudaError_t quantize_delayed(const ConstMatrix& x, const ScaleRule& rule, bool use_history_max,
                             float* amax_history, int64_t history_len, float* scale,
                             const Fp8Matrix& q, float* scale_used, float* amax_workspace,
                             cudaStream_t stream);

cudaError_t quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                             float* row_scales, cudaStream_t stream);

// Scales M-major: scale(r, g) at group_scales[g * round_up(rows, 4) + r]; padding rows written as 0.
cudaError_t quantize_per_group(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                               float* group_scales, cudaStream_t stream);

cudaError_t quantize_per_block(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                               float* block_scales, cudaStream_t stream);

}  // namespace fp8ext::cuda

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

// Scratch the per-tensor recipes need in device memory: the grid-wide amax and
// counters (32-bit words, zeroed by the call itself): delayed scaling's
// finished blocks, or the one-launch current scaling's claimed and reduced shares.
constexpr int kAmaxWorkspaceFloats = 4;

// Current scaling. A small tensor (<= kOnePassMaxElements, on sm_90) takes one
// pass: a cluster of blocks holds it in registers and agrees on the amax
// through distributed shared memory. Otherwise two passes: a grid-wide amax
// into the workspace, then quantization with the scale derived from it. With
// FP8EXT_QUANT_KEEP=1 or auto (contiguous input, sm_90), one launch keeps the
// last 224 KB of each SM's share in shared memory across a grid barrier on the
// amax and reads only the rest twice (off by default: not faster yet).
//
// ZeroedAmaxSlots lets a caller skip the two passes' workspace zeroing (a
// kernel in the chain: ~0.7 us of a 168-us call at 16384 x 8192 bf16 on the
// H200). The caller keeps two amax slots per stream and passes them in turn:
// `amax` must be zero on entry, and the quantize pass zeroes `zero_next` (the
// slot the call before on the stream used) after its PDL wait, once every
// earlier call on the stream has completed (as long as every kernel launched
// with PDL in between waits before it finishes, as fp8ext's and CUTLASS's
// do). So a pair serves calls on one stream only, in the order they were
// launched, and never a CUDA graph (its replays would reuse one slot without
// zeroing it). `used` says whether the
// call took the two passes and launched both; if not, the slots are as they
// were (the other paths zero amax_workspace as before), unless the amax pass
// launched and the quantize pass did not (an error is returned then, and the
// caller must zero both slots before their next use).
struct ZeroedAmaxSlots {
  float* amax = nullptr;       // zero on entry; holds this call's amax afterwards
  float* zero_next = nullptr;  // zeroed by this call, in stream order
  bool used = false;           // set by the call
};

constexpr int64_t kOnePassMaxElements = 131072;
cudaError_t quantize_per_tensor(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                float* scale_out, float* amax_workspace, cudaStream_t stream,
                                ZeroedAmaxSlots* slots = nullptr);

// Delayed scaling: one pass quantizes with *scale and reduces this tensor's amax;
// the last block to finish rolls the history and recomputes *scale (a history_len
// of 0 leaves both alone, as the CPU op does).
cudaError_t quantize_delayed(const ConstMatrix& x, const ScaleRule& rule, bool use_history_max,
                             float* amax_history, int64_t history_len, float* scale,
                             const Fp8Matrix& q, float* scale_used, float* amax_workspace,
                             cudaStream_t stream);

cudaError_t quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                             float* row_scales, cudaStream_t stream);

// quantize_per_row of y = weight * T(x * rsqrt(mean(x^2) + eps)), RMSNorm as
// Hugging Face's Llama rounds it (fp32, then x's type T, then the weight
// multiply rounded to T); weight [x.cols] in x's type, contiguous.
cudaError_t rms_norm_quantize_per_row(const ConstMatrix& x, const void* weight, float eps, const ScaleRule& rule,
                                      const Fp8Matrix& q, float* row_scales, cudaStream_t stream);

// rms_norm_quantize_per_row of h = T(x + residual), also written to sum_out:
// a decoder's residual add fused with the next norm. residual and sum_out are
// [rows, cols] contiguous, of x's dtype; sum_out 16-byte aligned and apart from
// x and residual (cudaErrorInvalidValue if it is either of them).
cudaError_t add_rms_norm_quantize_per_row(const ConstMatrix& x, const void* residual, void* sum_out,
                                          const void* weight, float eps, const ScaleRule& rule, const Fp8Matrix& q,
                                          float* row_scales, cudaStream_t stream);

// quantize_per_row of y = T(T(silu(gate)) * up) with x = [gate | up] ([rows,
// 2 * I], as a SwiGLU gate_up projection writes it); q has I columns (padded).
cudaError_t silu_mul_quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                      float* row_scales, cudaStream_t stream);

// Scales M-major: scale(r, g) at group_scales[g * round_up(rows, 4) + r]; padding rows written as 0.
cudaError_t quantize_per_group(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                               float* group_scales, cudaStream_t stream);

cudaError_t quantize_per_block(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                               float* block_scales, cudaStream_t stream);

}  // namespace fp8ext::cuda

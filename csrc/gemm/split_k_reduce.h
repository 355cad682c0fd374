// The second half of a split-K GEMM (kSplitK in scaled_mm_dispatch.cu):
// the CUTLASS kernel leaves one fp32 partial product per slice of K, already
// scaled, and this kernel sums them, adds the bias and rounds to D's dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp8ext/types.h"

namespace fp8ext::cuda::gemm {

// The most slices the reduction takes (and scaled_mm_dispatch.cu cuts).
constexpr int kMaxSplitK = 8;

// D[i, j] = sum_s partials[s][i][j] + bias[j], summed in order of s (the same
// bits on every run), rounded once to d_dtype. partials: fp32 [splits, m, n],
// contiguous, 1 <= splits <= kMaxSplitK; bias: [n] in d_dtype or nullptr; D:
// [m, n] with row stride ldd.
// n and ldd multiples of 4; partials, D and bias 16-byte aligned (what the
// GEMM's TMA store already asks of them). Launched with PDL.
cudaError_t reduce_split_k(const float* partials, int splits, int64_t m, int64_t n, const void* bias, void* d,
                           DType d_dtype, int64_t ldd, cudaStream_t stream);

}  // namespace fp8ext::cuda::gemm

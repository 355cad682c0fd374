// The second half of a split-K GEMM (kSplitK in scaled_mm_dispatch.cu and
// blockwise_mm_dispatch.cu): the CUTLASS kernel leaves one fp32 partial
// product per slice of K, already scaled, and this kernel sums them, adds the
// bias and rounds to D's dtype. Also what both dispatchers share about the
// split: the FP8EXT_GEMM_SPLITS setting and the partials' size.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "fp8ext/types.h"

namespace fp8ext::cuda::gemm {

// The most slices the reduction takes (and the dispatchers cut).
constexpr int kMaxSplitK = 8;

// FP8EXT_GEMM_SPLITS (read at each call, for tuning in one process): a whole
// positive count forces that many slices (at most kMaxSplitK) wherever split-K
// runs; unset, "auto" or anything else: 0, the dispatcher's rule.
inline int split_k_setting() {
  const char* v = std::getenv("FP8EXT_GEMM_SPLITS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 1 ? static_cast<int>(std::min<long>(n, kMaxSplitK)) : 0;
}

// Workspace bytes of `splits` fp32 partial products of an [m, n] D (whole 256
// bytes, so what follows them stays aligned).
inline size_t split_k_partial_bytes(int64_t m, int64_t n, int splits) {
  return static_cast<size_t>(round_up(int64_t{splits} * m * n * 4, 256));
}

// D[i, j] = sum_s partials[s][i][j] + bias[j], summed in order of s (the same
// bits on every run), rounded once to d_dtype. partials: fp32 [splits, m, n],
// contiguous, 1 <= splits <= kMaxSplitK; bias: [n] in d_dtype or nullptr; D:
// [m, n] with row stride ldd.
// n and ldd multiples of 4; partials, D and bias 16-byte aligned (what the
// GEMM's TMA store already asks of them). Launched with PDL.
cudaError_t reduce_split_k(const float* partials, int splits, int64_t m, int64_t n, const void* bias, void* d,
                           DType d_dtype, int64_t ldd, cudaStream_t stream);

// Workspace of a split-K GEMM: the partials, then what `Partials` (the CUTLASS
// kernel that writes them, in batch mode) needs of its own.
template <typename Partials, typename Problem>
size_t split_k_workspace_bytes(const Problem& p, int splits) {
  return split_k_partial_bytes(p.m, p.n, splits) + Partials::workspace_bytes(p, splits);
}

// Both dispatchers' kSplitK (Problem: ScaledMmProblem or BlockwiseMmProblem):
// Partials::run leaves the slices' partial products in the workspace's front,
// then reduce_split_k sums them into D. The partials are the TMA store's
// destination and the sum's 16-byte loads, hence the alignment.
template <typename Partials, typename Problem>
cudaError_t run_split_k(const Problem& p, int splits, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  if (splits < 2 || splits > kMaxSplitK || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      workspace_bytes < split_k_workspace_bytes<Partials>(p, splits))
    return cudaErrorInvalidValue;
  auto* partials = static_cast<float*>(workspace);
  auto* own = static_cast<uint8_t*>(workspace) + split_k_partial_bytes(p.m, p.n, splits);
  const cudaError_t err = Partials::run(p, splits, partials, own, stream);
  if (err != cudaSuccess) return err;
  return reduce_split_k(partials, splits, p.m, p.n, p.bias, p.d, p.d_dtype, p.ldd, stream);
}

}  // namespace fp8ext::cuda::gemm

// The instantiated block-wise GEMM kernels, one per (D dtype, config), as the
// dispatcher sees them: plain declarations, no CUTLASS. The definitions are in
// sm90_blockwise_mm.cuh, instantiated in the blockwise_mm_*.cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "fp8ext/scaled_mm_blockwise.h"

namespace fp8ext::cuda::gemm {

template <DType D, BlockwiseConfig C>
struct BlockwiseKernel {
  static size_t workspace_bytes(const BlockwiseMmProblem& p);
  static cudaError_t run(const BlockwiseMmProblem& p, void* workspace, cudaStream_t stream);
};

// The first half of block-wise split-K: the fp32 kernel of config C in batch
// mode, batch s multiplying the s-th of `splits` equal slices of K (whole
// 128-column groups) and writing its partial product, without the bias, to
// partials[s] ([M, N] row-major, back to back). Instantiated for kSwapMedium
// (blockwise_mm_f16_f32.cu), whose device kernel is BlockwiseKernel<kFloat32,
// kSwapMedium>'s: no instantiation of its own.
template <BlockwiseConfig C>
struct BlockwiseSplitKPartials {
  static size_t workspace_bytes(const BlockwiseMmProblem& p, int splits);
  static cudaError_t run(const BlockwiseMmProblem& p, int splits, float* partials, void* workspace,
                         cudaStream_t stream);
};

}  // namespace fp8ext::cuda::gemm

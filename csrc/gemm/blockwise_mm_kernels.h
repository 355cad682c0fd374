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

}  // namespace fp8ext::cuda::gemm

// The instantiated GEMM kernels, one per (A format, B format, D dtype, config),
// as the dispatcher sees them: plain declarations, no CUTLASS. The definitions
// are in sm90_scaled_mm.cuh, instantiated in the scaled_mm_*.cu files (several
// files so the build compiles them in parallel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "fp8ext/scaled_mm.h"

namespace fp8ext::cuda::gemm {

template <Fp8Format A, Fp8Format B, DType D, GemmConfig C>
struct Kernel {
  static size_t workspace_bytes(const ScaledMmProblem& p);
  static cudaError_t run(const ScaledMmProblem& p, void* workspace, cudaStream_t stream);
};

}  // namespace fp8ext::cuda::gemm

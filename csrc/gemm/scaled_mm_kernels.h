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

// The fp32-output kernel of config C run on `splits` slices of K at once (its
// batch mode): partials[s] = scaled product of the s-th K / splits columns of A
// and B, [M, N] fp32 each, no bias; split_k_reduce.h sums them. K must be a
// multiple of 16 * splits. Instantiated for kSwapMedium (scaled_mm_e4m3_f32.cu:
// the device kernel of Kernel<E4M3, E4M3, kFloat32, kSwapMedium>) and
// kLargeClusterN (scaled_mm_e4m3_f32_split_k.cu: its only fp32 instantiation).
template <Fp8Format A, Fp8Format B, GemmConfig C>
struct SplitKPartials {
  static size_t workspace_bytes(const ScaledMmProblem& p, int splits);
  static cudaError_t run(const ScaledMmProblem& p, int splits, float* partials, void* workspace, cudaStream_t stream);
};

}  // namespace fp8ext::cuda::gemm

// What the CUTLASS sm_90a GEMM families (sm90_scaled_mm.cuh, sm90_blockwise_mm.cuh)
// share: the CUTLASS includes, the element types of our enums, and how a
// CUTLASS status becomes a CUDA error.
#pragma once

// The GEMMs launch with programmatic dependent launch (fp8ext/cuda_launch.h):
// this makes CUTLASS's kernels wait for the previous kernel before they read
// their operands. Without it a PDL launch would race. (CUTLASS 4.2's stream-K
// scheduler does not compile with it: is_last_tile, a const member, binds a
// member to a non-const reference.)
#define CUTLASS_ENABLE_GDC_FOR_SM90 1

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include <type_traits>

#include "fp8ext/cuda_launch.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda::gemm::detail {

template <Fp8Format F>
using Fp8Element = std::conditional_t<F == Fp8Format::kE4M3, cutlass::float_e4m3_t, cutlass::float_e5m2_t>;

template <DType D>
using OutElement = std::conditional_t<D == DType::kBFloat16, cutlass::bfloat16_t,
                                      std::conditional_t<D == DType::kFloat16, cutlass::half_t, float>>;

// can_implement / initialize refusals are argument errors; a failed run keeps
// the CUDA error of its launch.
inline cudaError_t refusal(cutlass::Status) { return cudaErrorInvalidValue; }
inline cudaError_t launch_result(cutlass::Status status) {
  const cudaError_t err = cudaGetLastError();
  if (status == cutlass::Status::kSuccess) return err;
  return err != cudaSuccess ? err : cudaErrorLaunchFailure;
}

// Checks, initializes and launches a CUTLASS device GEMM (with PDL when on).
template <class Gemm>
cudaError_t run_gemm(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  Gemm gemm;
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess) return refusal(status);
  status = gemm.initialize(args, workspace, stream);
  if (status != cutlass::Status::kSuccess) return refusal(status);
  return launch_result(gemm.run(stream, nullptr, pdl_enabled()));
}

}  // namespace fp8ext::cuda::gemm::detail

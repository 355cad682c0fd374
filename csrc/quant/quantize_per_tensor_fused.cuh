// Per-tensor current scaling of a large tensor in one cooperative launch, see
// quantize_per_tensor_fused.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda::detail {

// `partials` holds at least max_partials floats (one per block of the grid).
// Returns cudaErrorCooperativeLaunchTooLarge, launching nothing, where the
// device cannot hold the grid; the caller then takes the two-kernel path.
cudaError_t quantize_per_tensor_fused(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                      float* scale_out, float* partials, int max_partials, cudaStream_t stream);

}  // namespace fp8ext::cuda::detail

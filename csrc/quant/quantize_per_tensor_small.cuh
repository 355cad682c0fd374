// One-pass per-tensor current scaling for tensors that fit on chip (decode-sized
// activations), see quantize_per_tensor_small.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda::detail {

bool per_tensor_fits_one_pass(const ConstMatrix& x, const Fp8Matrix& q);

cudaError_t quantize_per_tensor_one_pass(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                         float* scale_out, cudaStream_t stream);

}  // namespace fp8ext::cuda::detail

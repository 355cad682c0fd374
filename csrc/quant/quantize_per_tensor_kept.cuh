// One-launch per-tensor current scaling for tensors larger than the one-pass
// cluster's registers: each block keeps the last part of its share in shared
// memory across a grid barrier, see quantize_per_tensor_kept.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda::detail {

// Whether the kept-share kernel takes x: turned on (FP8EXT_QUANT_KEEP=1 in the
// environment: at any size past the one-pass cluster kernel's; =auto: from 16
// MiB; off by default; read at each call, so an A/B or a test runs both ways in
// one process), contiguous, 16-byte aligned, no padded columns in q, sm_90.
bool per_tensor_fits_kept_pass(const ConstMatrix& x, const Fp8Matrix& q);

// amax_workspace: kAmaxWorkspaceFloats words (the amax, the shares claimed,
// the shares reduced), zeroed by the caller in the same stream.
cudaError_t quantize_per_tensor_kept(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                     float* scale_out, float* amax_workspace, cudaStream_t stream);

}  // namespace fp8ext::cuda::detail

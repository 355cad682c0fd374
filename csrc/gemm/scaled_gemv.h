// The CUDA-core GEMV path of scaled_mm for decode-sized M (scaled_gemv.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "fp8ext/scaled_mm.h"

namespace fp8ext::cuda {

// Rows of A one launch takes; larger M runs in groups of this many.
constexpr int64_t kGemvMaxM = 4;

// E4M3 x E4M3 only; K a multiple of 16 and 16-byte aligned rows (as the TMA
// kernels need). No workspace.
cudaError_t scaled_gemv(const ScaledMmProblem& p, cudaStream_t stream);

}  // namespace fp8ext::cuda

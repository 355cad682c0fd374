// The FP8 GEMM with per-tensor or row-wise scales (torch-free):
//
//   D[m, n] = (scale_a[m] * scale_b[n]) * sum_k A[m, k] * B[n, k] + bias[n]
//
// A [M, K] and B [N, K] are FP8, row-major (B is the weight, K-major); each scale
// is either one fp32 value or a vector (A: one per row, B: one per row of B,
// i.e. per output column), all in device memory. D is bf16, fp16 or fp32,
// row-major with row stride ldd; bias (optional) has D's dtype.
//
// Alignment the kernels need (the torch op pads anything else): K, lda and ldb
// multiples of 16; N and ldd multiples of 16 bytes of D (8 elements of bf16/fp16,
// 4 of fp32: the TMA store's contiguous extent, also with swap-AB); A, B, D and
// the bias 16-byte aligned. M is free; the scales need no alignment.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fp8ext/types.h"

namespace fp8ext::cuda {

struct ScaledMmProblem {
  const void* a;
  Fp8Format a_format;
  int64_t lda;
  const void* b;
  Fp8Format b_format;
  int64_t ldb;
  int64_t m, n, k;
  const float* scale_a;
  bool scale_a_per_row;  // else one value
  const float* scale_b;
  bool scale_b_per_row;  // one per row of B (= per column of D), else one value
  const void* bias;      // [n] in d_dtype, or nullptr
  void* d;
  DType d_dtype;
  int64_t ldd;
  // Allow FP8 fast accumulation (no periodic fp32 promotion of the tensor
  // cores' partial sums) with bf16 output: every tensor-core kernel then sums
  // over all of K without promoting, and kAuto picks kPingpongFastAccum or
  // kWideFastAccum for large M.
  // The CUDA-core GEMV (M = 1) sums in fp32 either way.
  bool allow_fast_accum = false;
};

// The tile configurations (chosen by M; see the table in scaled_mm_dispatch.cu).
enum class GemmConfig : int {
  kAuto = 0,       // choose by shape
  kLarge = 1,      // 128x128x128 tile, 2x1 cluster, cooperative
  kMedium = 2,     // 64x96x128 tile, 2x1 cluster (the two 64-row halves of M <= 128 share each
                   // weight tile by multicast: cuBLASLt's 128x6144x4096 shape), ping-pong;
                   // bf16 output only (fp16 takes kSwapMedium there)
  kSwapSmall = 3,  // swap-AB (D^T = B A^T): 64 columns of N x 16 rows of M per tile (K 128)
  kSwapMedium = 4, // swap-AB: 64 x 64 (K 128)
  // bf16 output only:
  kWideFastAccum = 5,  // 128x256x128 tile, 2x1 cluster, cooperative, FP8 fast accumulation
                       // (no periodic fp32 promotion: cuBLAS's use_fast_accum class)
  kLargeN192 = 6,      // 128x192x128 tile, 2x1 cluster, cooperative (fewer, larger tiles than kLarge)
  kLargeClusterN = 7,  // 128x128x128 tile, 1x2 cluster (the pair shares A): M of one tile row
  // E4M3 x E4M3, any output dtype:
  kGemv = 8,  // no tensor cores: a warp streams 2 rows of B against up to 4 rows of A (decode;
              // larger M in groups of 4). kAuto takes it at M = 1 (FP8EXT_GEMV=0: never;
              // scaled_mm_dispatch.cu has the measurements)
  kSplitK = 9,  // slices of K at once (fp32 partials in the workspace), then a kernel sums them:
                // kSwapMedium's tiles for M <= 64, 128x128 tiles in 1x2 clusters above (problems
                // with too few tiles of N to fill the GPU; see scaled_mm_dispatch.cu). M <= 16
                // runs whole K.
  // bf16 output only:
  kPingpongFastAccum = 10,  // 128x128x128 tile, 2x1 cluster, ping-pong (one warp group's epilogue
                            // runs under the other's MMAs), FP8 fast accumulation
  kLastConfig = kPingpongFastAccum,
};

const char* gemm_config_name(GemmConfig config);

// Why a problem cannot run as given (nullptr if it can): alignment, formats.
const char* scaled_mm_unsupported_reason(const ScaledMmProblem& p);

// Whether `config` is instantiated for the problem's formats and output dtype.
bool scaled_mm_has_config(const ScaledMmProblem& p, GemmConfig config);

// The configuration kAuto resolves to for this problem.
GemmConfig scaled_mm_auto_config(const ScaledMmProblem& p);

// Device workspace the call needs (bytes; may be 0). Pass it 16-byte aligned
// (cudaMalloc's and torch's allocations are 256-byte aligned).
size_t scaled_mm_workspace_bytes(const ScaledMmProblem& p, GemmConfig config);

// What the GEMMs return when CUTLASS reports a failed launch but the runtime
// holds no error: GemmUniversalAdapter::run reads and clears the runtime's
// last error itself, so the launch's own reason is lost (a sticky error, left
// by a kernel that faulted before, is returned as it is instead).
inline constexpr cudaError_t kGemmLaunchRefused = cudaErrorUnknown;

// Runs on `stream` without synchronising; cudaErrorInvalidValue for an
// unsupported problem (see scaled_mm_unsupported_reason), kGemmLaunchRefused
// for a launch CUDA refused.
cudaError_t scaled_mm(const ScaledMmProblem& p, GemmConfig config, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

}  // namespace fp8ext::cuda

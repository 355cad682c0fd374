// The block-wise scaled FP8 GEMM (DeepSeek-V3's recipe), torch-free:
//
//   D[m, n] = sum_kb scale_a[m, kb] * scale_b[n / 128, kb] * sum_{k in block kb} A[m, k] * B[n, k] + bias[n]
//
// A [M, K] E4M3 (activations, one fp32 scale per row and 128 columns of K: 1x128
// groups) and B [N, K] E4M3 (the weight, one fp32 scale per 128x128 block), both
// row-major (K contiguous). The tensor cores' partial sums of each 128 of K are
// multiplied by their two scales and added to an fp32 accumulator, so nothing
// is summed across blocks before it is scaled.
//
// Scale layouts (those of fp8ext's quantize_per_group / quantize_per_block):
//   scale_a: element (m, kb) at scale_a[kb * ld_scale_a + m], i.e. [ceil(K/128)]
//            columns of M values (M-major); ld_scale_a >= M and a multiple of 4
//            (the TMA loads a column in whole 16 bytes, so it reads M rounded up
//            to 4 values of each column: they must be allocated), scale_a
//            16-byte aligned.
//   scale_b: element (nb, kb) at scale_b[nb * ld_scale_b + kb], row-major
//            [ceil(N/128), ceil(K/128)]; ld_scale_b >= ceil(K/128).
//
// Alignment the kernels need (the torch op pads anything else): K, lda and ldb
// multiples of 16; N and ldd multiples of 16 bytes of D; A, B, D and the bias
// 16-byte aligned. M is free: rows past M (zero rows of A, as the TMA fills them)
// are computed with whatever the padding scales hold and are not stored.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fp8ext/types.h"

namespace fp8ext::cuda {

struct BlockwiseMmProblem {
  const void* a;  // E4M3 [M, K]
  int64_t lda;
  const void* b;  // E4M3 [N, K]
  int64_t ldb;
  int64_t m, n, k;
  const float* scale_a;
  int64_t ld_scale_a;
  const float* scale_b;
  int64_t ld_scale_b;
  const void* bias;  // [n] in d_dtype, or nullptr
  void* d;
  DType d_dtype;
  int64_t ldd;
};

// Tile configurations (chosen by M; the table is in blockwise_mm_dispatch.cu).
// The weight's 128-row scale blocks fix the tile side along N at 128 (swap-AB:
// the kernel's M) or a multiple of it.
enum class BlockwiseConfig : int {
  kAuto = 0,
  kLarge = 1,       // 128x128x128 tile, 1x2 cluster, cooperative
  kMedium = 2,      // 64x128x128 tile, ping-pong (bf16 only)
  kSwapSmall = 3,   // swap-AB (D^T = B A^T): 128 rows of N x 16 of M per tile, ping-pong (bf16 only)
  kSwapMedium = 4,  // swap-AB: 128 x 64, cooperative
  kSplitK = 5,      // slices of K at once (the fp32 kSwapMedium kernel's batch mode, partials in the
                    // workspace), then a kernel sums them; one slice: the whole-K kernel kAuto takes
  kLastConfig = kSplitK,
};

const char* blockwise_config_name(BlockwiseConfig config);

// Why a problem cannot run as given (nullptr if it can).
const char* blockwise_mm_unsupported_reason(const BlockwiseMmProblem& p);

// Whether `config` is instantiated for the problem's output dtype (kAuto: always).
bool blockwise_mm_has_config(const BlockwiseMmProblem& p, BlockwiseConfig config);

// The configuration kAuto resolves to for this problem.
BlockwiseConfig blockwise_mm_auto_config(const BlockwiseMmProblem& p);

// Device workspace the call needs (bytes; may be 0).
size_t blockwise_mm_workspace_bytes(const BlockwiseMmProblem& p, BlockwiseConfig config);

// Runs on `stream` without synchronising; cudaErrorInvalidValue for an
// unsupported problem (see blockwise_mm_unsupported_reason).
cudaError_t blockwise_mm(const BlockwiseMmProblem& p, BlockwiseConfig config, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream);

}  // namespace fp8ext::cuda

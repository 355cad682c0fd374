// Chooses and runs a block-wise scaled_mm kernel: checks what the kernels
// need, picks a tile configuration by M and maps the output dtype to one of the
// instantiated kernels (blockwise_mm_*.cu).
//
// The weight's scale blocks are 128 rows of N, so a tile covers 128 (or 2 x 64
// with ping-pong) of N: the small-M kernels are swap-AB (N fills the MMA's 128
// rows, M is the tile's 16 or 64 columns).
//
//   M <= 16   kSwapSmall   swap-AB, 128 x 16 tiles (bf16; fp16/fp32: kSwapMedium)
//   M <= 64   kSwapMedium  swap-AB, 128 x 64 tiles
//   M <= 128  kMedium      64 x 128 tiles, ping-pong (bf16; else kLarge)
//   M  > 128  kLarge       128 x 128 tiles, 1x2 cluster, cooperative
//
// Budget: 8 instantiations (CI compiles them all): bf16 has all four, fp16 and
// fp32 kLarge and kSwapMedium.
#include <cstdint>
#include <type_traits>

#include "blockwise_mm_kernels.h"
#include "fp8ext/cuda_launch.h"
#include "gemm_shape_checks.h"
#include "fp8ext/scaled_mm_blockwise.h"

namespace fp8ext::cuda {
namespace {

using gemm::BlockwiseKernel;

bool has_config(const BlockwiseMmProblem& p, BlockwiseConfig c) {
  if (c == BlockwiseConfig::kLarge || c == BlockwiseConfig::kSwapMedium) return true;
  return p.d_dtype == DType::kBFloat16 && (c == BlockwiseConfig::kMedium || c == BlockwiseConfig::kSwapSmall);
}

// Calls fn(BlockwiseKernel<...>) for the problem's dtype and config; false if not instantiated.
template <typename Fn>
bool with_kernel(const BlockwiseMmProblem& p, BlockwiseConfig c, Fn&& fn) {
  if (!has_config(p, c)) return false;
  auto by_config = [&](auto d) {
    constexpr DType D = decltype(d)::value;
    if (c == BlockwiseConfig::kLarge) fn(BlockwiseKernel<D, BlockwiseConfig::kLarge>{});
    if (c == BlockwiseConfig::kSwapMedium) fn(BlockwiseKernel<D, BlockwiseConfig::kSwapMedium>{});
    if constexpr (D == DType::kBFloat16) {
      if (c == BlockwiseConfig::kMedium) fn(BlockwiseKernel<D, BlockwiseConfig::kMedium>{});
      if (c == BlockwiseConfig::kSwapSmall) fn(BlockwiseKernel<D, BlockwiseConfig::kSwapSmall>{});
    }
  };
  switch (p.d_dtype) {
    case DType::kBFloat16: by_config(std::integral_constant<DType, DType::kBFloat16>{}); break;
    case DType::kFloat16: by_config(std::integral_constant<DType, DType::kFloat16>{}); break;
    case DType::kFloat32: by_config(std::integral_constant<DType, DType::kFloat32>{}); break;
  }
  return true;
}

}  // namespace

const char* blockwise_config_name(BlockwiseConfig config) {
  switch (config) {
    case BlockwiseConfig::kAuto: return "auto";
    case BlockwiseConfig::kLarge: return "block_large_128x128_coop_cluster_1x2";
    case BlockwiseConfig::kMedium: return "block_medium_64x128_pingpong";
    case BlockwiseConfig::kSwapSmall: return "block_swap_ab_128x16";
    case BlockwiseConfig::kSwapMedium: return "block_swap_ab_128x64";
  }
  return "unknown";
}

const char* blockwise_mm_unsupported_reason(const BlockwiseMmProblem& p) {
  if (const char* why = tma_gemm_unsupported_reason(p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.d_dtype, p.a, p.b, p.d,
                                                     p.bias))
    return why;
  if (!p.scale_a || !p.scale_b) return "both scales are required";
  if (p.ld_scale_a < p.m || p.ld_scale_a % kGroupScaleRowAlign != 0 || !aligned16(p.scale_a))
    return "scale_a must be M-major with a column stride >= M and a multiple of 4, 16-byte aligned";
  if (p.ld_scale_b < ceil_div(p.k, kGroupSize)) return "scale_b's row stride must be at least ceil(K / 128)";
  if (p.ld_scale_a * ceil_div(p.k, kGroupSize) > INT32_MAX || p.ld_scale_b * ceil_div(p.n, kGroupSize) > INT32_MAX)
    return "the scale tensors must hold fewer than 2^31 values";
  return nullptr;
}

bool blockwise_mm_has_config(const BlockwiseMmProblem& p, BlockwiseConfig config) {
  return config == BlockwiseConfig::kAuto || has_config(p, config);
}

BlockwiseConfig blockwise_mm_auto_config(const BlockwiseMmProblem& p) {
  BlockwiseConfig c = BlockwiseConfig::kLarge;
  if (p.m <= 16) c = BlockwiseConfig::kSwapSmall;
  else if (p.m <= 64) c = BlockwiseConfig::kSwapMedium;
  else if (p.m <= 128) c = BlockwiseConfig::kMedium;
  if (!has_config(p, c)) c = p.m <= 64 ? BlockwiseConfig::kSwapMedium : BlockwiseConfig::kLarge;
  return c;
}

size_t blockwise_mm_workspace_bytes(const BlockwiseMmProblem& p, BlockwiseConfig config) {
  if (config == BlockwiseConfig::kAuto) config = blockwise_mm_auto_config(p);
  size_t bytes = 0;
  with_kernel(p, config, [&](auto kernel) { bytes = decltype(kernel)::workspace_bytes(p); });
  return bytes;
}

cudaError_t blockwise_mm(const BlockwiseMmProblem& p, BlockwiseConfig config, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
  if (blockwise_mm_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (config == BlockwiseConfig::kAuto) config = blockwise_mm_auto_config(p);
  cudaError_t err = cudaErrorInvalidValue;
  const bool found = with_kernel(p, config, [&](auto kernel) {
    using K = decltype(kernel);
    if (K::workspace_bytes(p) > workspace_bytes) return;  // err stays InvalidValue
    err = K::run(p, workspace, stream);
  });
  return found ? err : cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

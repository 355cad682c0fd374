// Chooses and runs a block-wise scaled_mm kernel: checks what the kernels
// need, picks a tile configuration by M and maps the output dtype to one of the
// instantiated kernels (blockwise_mm_*.cu).
//
// The weight's scale blocks are 128 rows of N, so a tile covers 128 of N: the
// small-M kernels are swap-AB (N fills the MMA's 128 rows, M is the tile's 16
// or 64 columns).
//
//   M <= 16   kSwapSmall   swap-AB, 128 x 16 tiles (bf16; fp16/fp32: kSwapMedium)
//   M <= 64   kSplitK      slices of K through the fp32 kSwapMedium kernel, when
//                          the rule below cuts K (else kSwapMedium itself)
//   M <= 128  kMedium      64 x 128 tiles, ping-pong (bf16; else kLarge)
//   M  > 128  kLarge       128 x 128 tiles, 1x2 cluster, cooperative
//
// Budget: 8 instantiations (CI compiles them all): bf16 has all four, fp16 and
// fp32 kLarge and kSwapMedium (split-K runs the last in batch mode).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "blockwise_mm_kernels.h"
#include "fp8ext/cuda_launch.h"
#include "gemm_shape_checks.h"
#include "fp8ext/scaled_mm_blockwise.h"
#include "split_k_reduce.h"

namespace fp8ext::cuda {
namespace {

using gemm::BlockwiseKernel;
using SplitKPartials = gemm::BlockwiseSplitKPartials<BlockwiseConfig::kSwapMedium>;

// Split-K (kSplitK). The weight's 128-row blocks give the swap-AB kernels one
// CTA per 128 rows of N: 32 at N = 4096 for 132 SMs, each taking in its
// operands at ~70-85 GB/s, and at M = 64 a 64-row activation tile comes with
// every weight tile (H200, 64x4096x4096: 11.5 us against 6.8 at M = 16).
// Slices of K give every SM a share in one launch; split_k_reduce.cu then sums
// the fp32 partials. Measured on the H200 with the ping-pong 128x64 kernel of
// 5e2acc0, graph-timed, weights past L2, us, whole K -> 2 / 4 slices
// (bench/results/gemm_blockwise_split_k_ab_2026-12-04_h200_5e2acc0.json):
//   64x4096x4096   11.51 -> 10.23 / 9.79     64x4096x14336  33.41 -> 21.91 / 21.57
//   but 64x6144x4096 11.97 -> 12.89 / 13.92 (48 tiles), 64x8192x8192 22.23 ->
//   24.08 / 25.17 (64 tiles), and slower at every M <= 16 (16x4096x4096 6.86
//   -> 9.70 / 9.18) and at M = 128 but 128x4096x14336 (28.89 -> 27.28 / 27.96).
int64_t split_k_tiles(const BlockwiseMmProblem& p) { return ceil_div(p.n, kGroupSize) * ceil_div(p.m, 64); }

// The rule: at 16 < M <= 64, where the tiles fill at most a third of the SMs,
// enough slices to fill them once, each at least 8 groups (1024 of K), at most
// kMaxSplitK.
int split_k_rule(const BlockwiseMmProblem& p) {
  if (p.m <= 16 || p.m > 64 || p.n <= 0) return 1;
  const int64_t fill = current_device_info().sm_count / split_k_tiles(p);
  if (fill < 3) return 1;
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({fill, ceil_div(p.k, kGroupSize) / 8, gemm::kMaxSplitK})));
}

// Slices kSplitK cuts K into (1: the problem runs whole): FP8EXT_GEMM_SPLITS's
// count (kAuto takes kSplitK at M <= 128 only) or the rule, fewer until every
// slice is whole groups of 128 (each slice's scales start at a group).
int split_k_count(const BlockwiseMmProblem& p) {
  const int setting = gemm::split_k_setting();
  int s = setting > 0 ? setting : split_k_rule(p);
  while (s > 1 && p.k % (kGroupSize * s) != 0) --s;
  return s;
}

bool has_config(const BlockwiseMmProblem& p, BlockwiseConfig c) {
  if (c == BlockwiseConfig::kLarge || c == BlockwiseConfig::kSwapMedium || c == BlockwiseConfig::kSplitK)
    return true;
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

// kAuto's choice among the kernels that take K whole.
BlockwiseConfig whole_k_config(const BlockwiseMmProblem& p) {
  BlockwiseConfig c = BlockwiseConfig::kLarge;
  if (p.m <= 16) c = BlockwiseConfig::kSwapSmall;
  else if (p.m <= 64) c = BlockwiseConfig::kSwapMedium;
  else if (p.m <= 128) c = BlockwiseConfig::kMedium;
  if (!has_config(p, c)) c = p.m <= 64 ? BlockwiseConfig::kSwapMedium : BlockwiseConfig::kLarge;
  return c;
}

// The slices kSplitK cuts K into; with one, `config` becomes the whole-K kernel
// kAuto would take.
int resolve_split_k(const BlockwiseMmProblem& p, BlockwiseConfig& config) {
  if (config != BlockwiseConfig::kSplitK) return 1;
  const int splits = split_k_count(p);
  if (splits < 2) config = whole_k_config(p);
  return splits;
}

}  // namespace

const char* blockwise_config_name(BlockwiseConfig config) {
  switch (config) {
    case BlockwiseConfig::kAuto: return "auto";
    case BlockwiseConfig::kLarge: return "block_large_128x128_coop_cluster_1x2";
    case BlockwiseConfig::kMedium: return "block_medium_64x128_pingpong";
    case BlockwiseConfig::kSwapSmall: return "block_swap_ab_128x16";
    case BlockwiseConfig::kSwapMedium: return "block_swap_ab_128x64";
    case BlockwiseConfig::kSplitK: return "block_split_k";
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
  if (p.m <= 128 && split_k_count(p) > 1) return BlockwiseConfig::kSplitK;
  return whole_k_config(p);
}

size_t blockwise_mm_workspace_bytes(const BlockwiseMmProblem& p, BlockwiseConfig config) {
  if (config == BlockwiseConfig::kAuto) config = blockwise_mm_auto_config(p);
  if (const int splits = resolve_split_k(p, config); splits > 1)
    return gemm::split_k_workspace_bytes<SplitKPartials>(p, splits);
  size_t bytes = 0;
  with_kernel(p, config, [&](auto kernel) { bytes = decltype(kernel)::workspace_bytes(p); });
  return bytes;
}

cudaError_t blockwise_mm(const BlockwiseMmProblem& p, BlockwiseConfig config, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
  if (blockwise_mm_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (config == BlockwiseConfig::kAuto) config = blockwise_mm_auto_config(p);
  if (const int splits = resolve_split_k(p, config); splits > 1)
    return gemm::run_split_k<SplitKPartials>(p, splits, workspace, workspace_bytes, stream);
  cudaError_t err = cudaErrorInvalidValue;
  const bool found = with_kernel(p, config, [&](auto kernel) {
    using K = decltype(kernel);
    if (K::workspace_bytes(p) > workspace_bytes) return;  // err stays InvalidValue
    err = K::run(p, workspace, stream);
  });
  return found ? err : cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

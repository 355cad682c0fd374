// The fp32 kernel behind split-K above M = 64 (kSplitK, scaled_mm_dispatch.cu):
// 128x128 tiles in 1x2 clusters, run in batch mode over the slices of K. Only
// split-K uses it (kLargeClusterN itself stays bf16-only for kAuto).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct SplitKPartials<Fp8Format::kE4M3, Fp8Format::kE4M3, GemmConfig::kLargeClusterN>;
}  // namespace fp8ext::cuda::gemm

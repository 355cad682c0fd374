// Instantiations: kSwapMedium's and kLarge's tiles with the fp32 promotion one
// K tile behind (sm90_deferred_promotion.cuh), E4M3 x E4M3 -> BFloat16; tuning
// configurations (see scaled_mm_dispatch.cu).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kSwapMediumDeferred>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kLargeDeferred>;
}  // namespace fp8ext::cuda::gemm

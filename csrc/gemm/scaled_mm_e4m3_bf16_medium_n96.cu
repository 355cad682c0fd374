// Instantiation: 64x96 tiles in 2x1 clusters, E4M3 x E4M3 -> BFloat16 (a tuning
// configuration for 65 <= M <= 128; see scaled_mm_dispatch.cu).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kMediumN96>;
}  // namespace fp8ext::cuda::gemm

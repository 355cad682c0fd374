// Instantiations: the swap-AB kernels in thread-block clusters, E4M3 x E4M3 -> BFloat16
// (tuning configurations; see scaled_mm_dispatch.cu).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kSwapSmallCluster4>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kSwapNarrowPair>;
}  // namespace fp8ext::cuda::gemm

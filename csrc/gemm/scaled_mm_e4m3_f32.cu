// Instantiations: E4M3 x E4M3 -> Float32 (see scaled_mm_dispatch.cu for when each runs).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kFloat32, GemmConfig::kLarge>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kFloat32, GemmConfig::kSwapMedium>;
template struct SplitKPartials<Fp8Format::kE4M3, Fp8Format::kE4M3, GemmConfig::kSwapMedium>;  // no new kernel
}  // namespace fp8ext::cuda::gemm

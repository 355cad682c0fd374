// Instantiations: E4M3 x E4M3 -> Float16 (see scaled_mm_dispatch.cu for when each
// runs; kMedium is bf16 only since the fast ping-pong kernel took its place in
// issue 4's budget of 16).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kFloat16, GemmConfig::kLarge>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kFloat16, GemmConfig::kSwapSmall>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kFloat16, GemmConfig::kSwapMedium>;
}  // namespace fp8ext::cuda::gemm

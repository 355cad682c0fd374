// Kernels instantiated for bf16 output only (E4M3 x E4M3): 128x192 tiles,
// 128x256 tiles and ping-pong 128x128 tiles with FP8 fast accumulation, and
// 128x128 tiles in 1x2 clusters.
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kWideFastAccum>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kLargeN192>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kLargeClusterN>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kPingpongFastAccum>;
}  // namespace fp8ext::cuda::gemm

// Tuning candidates (E4M3 x E4M3 -> bf16): not chosen by kAuto until measured (bench/bench_gemm.py --configs).
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kWideFastAccum>;
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kLargeN192>;
}  // namespace fp8ext::cuda::gemm

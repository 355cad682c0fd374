// Instantiations with E5M2 operands (rare in inference: gradients, wide-range
// activations): fp32 output only; the op casts to bf16/fp16 afterwards.
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE5M2, DType::kFloat32, GemmConfig::kLarge>;
template struct Kernel<Fp8Format::kE5M2, Fp8Format::kE5M2, DType::kFloat32, GemmConfig::kLarge>;
}  // namespace fp8ext::cuda::gemm

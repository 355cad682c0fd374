// Block-wise instantiations, bf16 output, M > 64 (see blockwise_mm_dispatch.cu).
#include "sm90_blockwise_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct BlockwiseKernel<DType::kBFloat16, BlockwiseConfig::kLarge>;
template struct BlockwiseKernel<DType::kBFloat16, BlockwiseConfig::kMedium>;
}  // namespace fp8ext::cuda::gemm

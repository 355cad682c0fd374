// Block-wise instantiations, bf16 output, swap-AB for M <= 64 (see blockwise_mm_dispatch.cu).
#include "sm90_blockwise_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct BlockwiseKernel<DType::kBFloat16, BlockwiseConfig::kSwapSmall>;
template struct BlockwiseKernel<DType::kBFloat16, BlockwiseConfig::kSwapMedium>;
}  // namespace fp8ext::cuda::gemm

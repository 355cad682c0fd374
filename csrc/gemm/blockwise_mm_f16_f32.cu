// Block-wise instantiations, fp16 and fp32 output: one large-M and one swap-AB
// kernel each; split-K's partials run the fp32 swap-AB kernel in batch mode.
#include "sm90_blockwise_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct BlockwiseKernel<DType::kFloat16, BlockwiseConfig::kLarge>;
template struct BlockwiseKernel<DType::kFloat16, BlockwiseConfig::kSwapMedium>;
template struct BlockwiseKernel<DType::kFloat32, BlockwiseConfig::kLarge>;
template struct BlockwiseKernel<DType::kFloat32, BlockwiseConfig::kSwapMedium>;
template struct BlockwiseSplitKPartials<BlockwiseConfig::kSwapMedium>;
}  // namespace fp8ext::cuda::gemm

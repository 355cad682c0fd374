// The split-K swap-AB decode kernel, E4M3 x E4M3 -> bf16. Its own file: CUTLASS
// 4.2's stream-K scheduler fails to compile with the grid-dependency wait
// (is_last_tile, a const member, binds a member to a non-const reference), so
// this kernel launches without PDL.
#define FP8EXT_GEMM_WITHOUT_PDL 1
#include "sm90_scaled_mm.cuh"

namespace fp8ext::cuda::gemm {
template struct Kernel<Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, GemmConfig::kSwapSplitK>;
}  // namespace fp8ext::cuda::gemm

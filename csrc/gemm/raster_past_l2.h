// Whether a GEMM's tile order re-reads an operand larger than L2: shared by the
// kernels' swizzle choice (sm90_gemm_common.cuh) and the dispatcher's choice of
// the fast ping-pong kernel (scaled_mm_dispatch.cu), which includes no CUTLASS.
#pragma once

#include <cstdint>

#include "fp8ext/types.h"

namespace fp8ext::cuda::gemm {

// Whether the operand that CUTLASS's heuristic raster order walks over is
// larger than L2 (Hopper: 50 MB), for tiles of tile_m x tile_n. The scheduler
// walks along M when there are more tiles of N than of M, so each column of
// tiles reads all of A ([M, K], FP8), else each row of tiles reads all of B:
// past L2, that operand comes from DRAM again for every column (or row) unless
// the tiles go in swizzled groups.
inline bool raster_sweeps_past_l2(int64_t m, int64_t n, int64_t k, int64_t tile_m, int64_t tile_n) {
  constexpr int64_t kL2Bytes = int64_t{50} << 20;
  return (ceil_div(n, tile_n) > ceil_div(m, tile_m) ? m : n) * k > kL2Bytes;
}

}  // namespace fp8ext::cuda::gemm

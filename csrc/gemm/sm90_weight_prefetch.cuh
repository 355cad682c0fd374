// A CUTLASS sm90 mainloop that can start the weight stream before the
// kernel's PDL wait (weight_prefetch.h says why and when): the swap-AB
// kernels' mainloop with a load_init that first asks L2 for the weight rows of
// this CTA's first tiles and, if asked, lets the next kernel launch. load_init
// is where every thread of the CTA passes before the producer's
// wait_on_dependent_grids (CUTLASS's warp-specialized kernels call it right
// after setting up their pipelines).
//
// With swap-AB the weight is the kernel's A ([M', K] rows). The persistent
// tile scheduler gives CTA b the tiles b, b + G, b + 2G, ... (G CTAs); with one
// tile along N' (the activation's rows, M <= the tile's N) tile t covers
// weight rows [t * kTileRows, (t + 1) * kTileRows). With more tiles along N'
// nothing is prefetched. A CTA whose guess is wrong only wastes a hint. In
// batch mode (split-K) the plan covers the first slice of K only: the CTAs of
// the other slices prefetch nothing.
#pragma once

#include <algorithm>
#include <cstdint>

#include "fp8ext/cuda_launch.h"
#include "sm90_gemm_common.cuh"
#include "weight_prefetch.h"

namespace fp8ext::cuda::gemm::detail {

struct WeightPrefetchPlan {
  const uint8_t* weight = nullptr;  // row r starts at weight + r * ld
  int64_t ld = 0;                   // bytes (FP8: elements)
  int64_t rows = 0;
  int tiles_per_cta = 0;            // 0: prefetch nothing
  uint32_t row_bytes = 0;           // prefetched from the start of each row (a multiple of 16)
  bool early_launch = false;
};

// kDefaultBudgetMiB: the prefetch budget when FP8EXT_GEMM_PREFETCH_MB is unset.
template <class Mainloop, int kDefaultBudgetMiB>
struct WeightPrefetchingMainloop : Mainloop {
  static constexpr int kTileRows = cute::size<0>(typename Mainloop::TileShape{});
  static constexpr int kTileCols = cute::size<1>(typename Mainloop::TileShape{});
  static_assert(sizeof(typename Mainloop::ElementA) == 1, "the weight operand is FP8");

  struct Params : Mainloop::Params {
    WeightPrefetchPlan prefetch;
  };

  // Host: the base parameters plus the plan, from the launch-time policy.
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, typename Mainloop::Arguments const& args,
                                        void* workspace) {
    return {Mainloop::to_underlying_arguments(shape, args, workspace), plan(shape, args)};
  }

  template <class ProblemShape>
  static WeightPrefetchPlan plan(ProblemShape const& shape, typename Mainloop::Arguments const& args) {
    const WeightPrefetchPolicy policy = weight_prefetch_policy(kDefaultBudgetMiB);
    auto shape_mnkl = cute::append<4>(shape, 1);
    const int64_t m = cute::get<0>(shape_mnkl), n = cute::get<1>(shape_mnkl), k = cute::get<2>(shape_mnkl);
    WeightPrefetchPlan p;
    p.weight = reinterpret_cast<const uint8_t*>(args.ptr_A);
    p.ld = cute::get<0>(args.dA);
    p.rows = m;
    p.early_launch = policy.early_launch;
    const int64_t tiles = (m + kTileRows - 1) / kTileRows;
    if (policy.budget_bytes == 0 || n > kTileCols || tiles == 0 || k <= 0) return p;
    const int64_t ctas = std::min<int64_t>(tiles, current_device_info().sm_count);  // the persistent grid
    const int64_t per_cta = policy.budget_bytes / ctas;
    const int64_t tile_bytes = kTileRows * k;
    if (per_cta >= tile_bytes) {
      p.tiles_per_cta = static_cast<int>(std::min(per_cta / tile_bytes, (tiles + ctas - 1) / ctas));
      p.row_bytes = static_cast<uint32_t>(k);
    } else {
      p.tiles_per_cta = 1;
      p.row_bytes = static_cast<uint32_t>(per_cta / kTileRows / 16 * 16);
      if (p.row_bytes == 0) p.tiles_per_cta = 0;
    }
    return p;
  }

  // Device: every thread of the CTA calls this before the producer waits.
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params) const {
    const WeightPrefetchPlan& w = params.prefetch;
    if (w.tiles_per_cta > 0) {
      const int64_t cta = blockIdx.x + int64_t{blockIdx.y} * gridDim.x;
      const int64_t ctas = int64_t{gridDim.x} * gridDim.y;
      for (int i = threadIdx.x; i < w.tiles_per_cta * kTileRows; i += blockDim.x) {
        const int64_t row = (cta + (i / kTileRows) * ctas) * kTileRows + i % kTileRows;
        if (row < w.rows) prefetch_l2_bulk(w.weight + row * w.ld, w.row_bytes);
      }
    }
    if (w.early_launch) allow_next_kernel_launch();
    return Mainloop::load_init(shape, params);
  }
};

}  // namespace fp8ext::cuda::gemm::detail

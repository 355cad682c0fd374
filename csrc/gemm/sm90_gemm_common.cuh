// What the CUTLASS sm_90a GEMM families (sm90_scaled_mm.cuh, sm90_blockwise_mm.cuh)
// share: the CUTLASS includes, the element types of our enums, and how a
// CUTLASS status becomes a CUDA error.
#pragma once

// The GEMMs launch with programmatic dependent launch (fp8ext/cuda_launch.h):
// this makes CUTLASS's kernels wait for the previous kernel before they read
// their operands (but for the cooperative kernel's scale-copying warp, which
// DeferredBlockwiseMainloop::load_auxiliary makes wait). Without it a PDL
// launch would race. (CUTLASS 4.2's stream-K
// scheduler does not compile with it: is_last_tile, a const member, binds a
// member to a non-const reference.)
#define CUTLASS_ENABLE_GDC_FOR_SM90 1

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "fp8ext/cuda_launch.h"
#include "fp8ext/scaled_mm.h"
#include "fp8ext/types.h"
#include "raster_past_l2.h"

namespace fp8ext::cuda::gemm::detail {

template <Fp8Format F>
using Fp8Element = std::conditional_t<F == Fp8Format::kE4M3, cutlass::float_e4m3_t, cutlass::float_e5m2_t>;

template <DType D>
using OutElement = std::conditional_t<D == DType::kBFloat16, cutlass::bfloat16_t,
                                      std::conditional_t<D == DType::kFloat16, cutlass::half_t, float>>;

// An fp32 promotion interval (MMAs of K = 32) that no K reaches: the tensor
// cores' partial sums are never promoted (fast accumulation); a multiple of 4.
constexpr uint32_t kNeverPromote = 1u << 30;

// Queues one K tile's MMAs (pipeline stage `stage` of the shared-memory
// operands tCrA / tCrB) into the accumulator `acc`, as one committed batch
// that warpgroup_wait<N> can wait for. With `from_zero` the first MMA
// overwrites `acc` instead of adding to it. The deferred mainloops
// (sm90_deferred_promotion.cuh, sm90_deferred_blockwise.cuh) issue all their
// MMAs through it.
template <class TiledMma, class FragA, class FragB, class Acc>
CUTLASS_DEVICE void queue_k_tile_mmas(TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB, int stage, Acc& acc,
                                      bool from_zero) {
  using namespace cute;
  if (from_zero) tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  CUTLASS_PRAGMA_UNROLL
  for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
    cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
}

// can_implement / initialize refusals are argument errors. A failed run: a
// sticky error (a kernel before it faulted) is still in the runtime and is
// returned as it is; a refused launch's reason is not (GemmUniversalAdapter::run
// reads and clears it), so it becomes kGemmLaunchRefused (fp8ext/scaled_mm.h),
// not "unspecified launch failure", which reads as a crash. (run_gemm returns an
// error already pending before the launch itself: run() would fail on it too.)
inline cudaError_t refusal(cutlass::Status) { return cudaErrorInvalidValue; }
inline cudaError_t launch_result(cutlass::Status status) {
  const cudaError_t err = cudaGetLastError();
  if (status == cutlass::Status::kSuccess) return err;
  return err != cudaSuccess ? err : kGemmLaunchRefused;
}

// Run-time knobs for dispatch tuning only (environment, read at each launch so
// that one process can time several settings; 0 = the built-in choice):
// FP8EXT_GEMM_SWIZZLE (tile scheduler swizzle, 1/2/4/8), FP8EXT_GEMM_RASTER
// (0 heuristic, 1 along M, 2 along N), FP8EXT_GEMM_PROMOTION (MMAs of K = 32
// between fp32 promotions).
struct TuningOverrides {
  int swizzle = 0, raster = 0, promotion = 0;
};
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
inline TuningOverrides tuning_overrides() {
  return {env_int("FP8EXT_GEMM_SWIZZLE", 0), env_int("FP8EXT_GEMM_RASTER", 0), env_int("FP8EXT_GEMM_PROMOTION", 0)};
}

// The tiles of Tile's M x N shape that cover an [m, n] D: {along M, along N}.
template <class Tile>
std::pair<int64_t, int64_t> tile_counts(int64_t m, int64_t n) {
  return {fp8ext::ceil_div(m, int64_t{cute::size<0>(Tile{})}), fp8ext::ceil_div(n, int64_t{cute::size<1>(Tile{})})};
}

// CUTLASS's scheduler rounds both tile counts up to a multiple of swizzle x
// cluster and gives the padding tiles their own slots: with 2 tile rows
// (M = 256) swizzle 4 doubled the work (256x8192x8192: 63 us, cuBLAS 28).
// The largest swizzle <= `wanted` that adds at most 3% of idle tiles.
template <class Tile, class Cluster>
int swizzle_without_idle_tiles(int m, int n, int wanted) {
  const auto [tiles_m, tiles_n] = tile_counts<Tile>(m, n);
  constexpr int kClusterM = cute::size<0>(Cluster{}), kClusterN = cute::size<1>(Cluster{});
  const int64_t base = fp8ext::round_up(tiles_m, kClusterM) * fp8ext::round_up(tiles_n, kClusterN);
  for (int s = wanted; s > 1; s /= 2) {
    if (fp8ext::round_up(tiles_m, s * kClusterM) * fp8ext::round_up(tiles_n, s * kClusterN) * 100 <= base * 103)
      return s;
  }
  return 1;
}

// raster_past_l2.h's test for Tile's M x N shape.
template <class Tile>
bool raster_sweeps_past_l2(int64_t m, int64_t n, int64_t k) {
  return gemm::raster_sweeps_past_l2(m, n, k, cute::size<0>(Tile{}), cute::size<1>(Tile{}));
}

// Checks, initializes and launches a CUTLASS device GEMM (with PDL when on).
// What the adapter's initialize() does, but with the kernel's shared-memory
// opt-in made once per device instead of at every launch.
template <class Gemm>
cudaError_t run_gemm(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  Gemm gemm;
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess) return refusal(status);
  status = Kernel::initialize_workspace(args, workspace, stream);
  if (status != cutlass::Status::kSuccess) return refusal(status);
  status = gemm.update(args, workspace);
  if (status != cutlass::Status::kSuccess) return refusal(status);
  if constexpr (Kernel::SharedStorageSize >= (48 << 10)) {
    const cudaError_t err = set_attributes_once<Kernel>([] {
      return cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(Kernel::SharedStorageSize));
    });
    if (err != cudaSuccess) return err;
  }
  // An error left pending by other code would make run() report a failure after
  // enqueuing the kernel, which launch_result could not tell from a refused launch.
  if (const cudaError_t pending = cudaPeekAtLastError(); pending != cudaSuccess) return pending;
  return launch_result(gemm.run(stream, nullptr, pdl_enabled()));
}

}  // namespace fp8ext::cuda::gemm::detail

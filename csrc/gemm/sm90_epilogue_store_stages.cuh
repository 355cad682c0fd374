// A CUTLASS sm90 TMA epilogue (as its CollectiveBuilder made it) with more
// shared-memory buffers for the output's subtiles.
//
// Why: the builder gives the TMA epilogue two store buffers (StagesD = 2).
// A cooperative tile's epilogue writes 128x32 subtiles (4 for 128x128 tiles, 6
// for 128x192, 8 for 128x256), and before writing a subtile into a buffer it
// waits until the TMA store of the subtile that last used that buffer has
// read it, one subtile earlier: each subtile waits on the TMA unit while the
// tensor cores idle. With one buffer per subtile (or 4) the waits fall on
// stores issued a tile earlier, long done. On the H200 (bench/NOTES.md,
// session 25) our 128x192 and 128x256 kernels paid ~1-2 us a tile that
// cuBLAS does not (time against K at 8192x8192 met cuBLAS's slope with a
// fixed cost 35-50 us higher).
//
// The mainloop's stage count is computed from the epilogue's shared storage
// (StageCountAutoCarveout), so it adapts; 4 buffers of 128x32 bf16 (32 KB)
// leave 128x128 and 128x256 tiles their mainloop stages.
#pragma once

#include "sm90_gemm_common.cuh"

namespace fp8ext::cuda::gemm::detail {

template <class Epilogue, int MaxStoreStages>
struct WithStoreStagesImpl {
  using type = Epilogue;  // not a TMA warp-specialized epilogue: as built
};

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class CtaTile,
          class EpilogueTile, class... Rest, int MaxStoreStages>
struct WithStoreStagesImpl<
    cutlass::epilogue::collective::CollectiveEpilogue<
        cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>, CtaTile,
        EpilogueTile, Rest...>,
    MaxStoreStages> {
  // Reusing the source's buffers for the output ties the two counts together;
  // our epilogues read no source (C is void).
  static_assert(!ReuseSmemC, "the epilogue reuses C's shared memory for D");
  // Subtiles per tile, as the builder counts them: more buffers would never be used.
  static constexpr int kSubtiles = cute::size(cute::shape_div(cute::take<0, 2>(CtaTile{}), EpilogueTile{}));
  static constexpr int kStoreStages = kSubtiles < MaxStoreStages ? kSubtiles : MaxStoreStages;
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, kStoreStages, FragmentSize, ReuseSmemC, DelayTmaStore>,
      CtaTile, EpilogueTile, Rest...>;
};

// The epilogue with min(subtiles, MaxStoreStages) output buffers.
template <class Epilogue, int MaxStoreStages>
using WithStoreStages = typename WithStoreStagesImpl<Epilogue, MaxStoreStages>::type;

}  // namespace fp8ext::cuda::gemm::detail

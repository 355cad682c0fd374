// A CUTLASS sm90 FP8 mainloop whose fp32 promotion never drains the tensor
// cores: each K tile's MMAs go into one of two partial accumulators, and the
// other partial (the K tile before) is added to the fp32 total while they run.
//
// Why: CUTLASS's FP8 mainloop promotes by waiting for every MMA in flight
// (warpgroup_wait<0>) and then adding. Where one warp group computes a whole
// tile (the swap-AB and 64-row kernels) each wait leaves the tensor cores idle:
// on the H200, 128x4096x4096 took 10.23 us promoting every K tile, 9.31 every
// other and 8.70 never (bench/NOTES.md, session 21). Promoting one K tile
// behind keeps a tile of MMAs queued during every add, at the precision of
// promoting every K tile (128 of K).
//
// Measured on the H200 against the base promoting every 256 of K (bench/NOTES.md,
// session 22): faster on 11 of 12 8B layers at M = 32-128 (up to 14%; 3% slower
// at 32x4096x14336) and on all 18 rows at M >= 1024 (0.1-6%), with the error of
// promoting every 128 of K (cuBLAS's default, to its fourth digit).
//
// With fast accumulation (an interval of kNeverPromote) it runs the base's
// loop, which then never promotes. Other intervals (FP8EXT_GEMM_PROMOTION)
// are ignored: it always promotes every K tile.
//
// Costs a third accumulator's registers (64x64 per warp group: 32 more a
// thread; 64x128: 64), so 64x192 per warp group (kLargeN192) would spill.
// The rest of the contract is the base mainloop's: it
// consumes k_tile_count stages from smem_pipe_read and releases all but the
// last, which the base's mma_tail releases.
#pragma once

#include "sm90_gemm_common.cuh"

namespace fp8ext::cuda::gemm::detail {

template <class Base>
struct DeferredPromotionMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    using namespace cute;

    constexpr int kWarpGroup = cutlass::NumThreadsPerWarpGroup;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    TiledMma tiled_mma;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / kWarpGroup, 0);
    auto thread_mma = tiled_mma.get_slice(warp_group * kWarpGroup);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor even = make_fragment_like(accum);  // partial sums of the even K tiles
    Tensor odd = make_fragment_like(accum);   // and of the odd ones

    clear(accum);
    if (k_tile_count <= 0) return;

    // Waits for the next stage and queues its MMAs into `partial` (from zero).
    auto issue = [&](auto& partial) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      queue_k_tile_mmas(tiled_mma, tCrA, tCrB, smem_pipe_read.index(), partial, true);
      ++smem_pipe_read;
      --k_tile_count;
    };
    // Once all but the newest batch of MMAs are done: adds the older partial to
    // the total and hands its stage back to the producer.
    PipelineState smem_pipe_release = smem_pipe_read;
    auto promote_older = [&](auto& partial) {
      warpgroup_wait<1>();
      warpgroup_fence_operand(partial);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
      warpgroup_fence_operand(accum);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };
    auto promote_last = [&](auto& partial) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(partial);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
      warpgroup_fence_operand(accum);
    };

    // Fast accumulation: every K tile's MMAs into the total, none promoted. (Not
    // the base's loop: inlined beside this one, it made ptxas spill.)
    if (params.mma_promotion_interval >= kNeverPromote) {
      auto issue_into_total = [&](bool first) {
        pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
        queue_k_tile_mmas(tiled_mma, tCrA, tCrB, smem_pipe_read.index(), accum, first);
        ++smem_pipe_read;
        --k_tile_count;
      };
      issue_into_total(true);
      while (k_tile_count > 0) {
        issue_into_total(false);
        warpgroup_wait<1>();  // the K tile before is done: its stage goes back
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(accum);
      return;
    }

    // Two K tiles a trip, so that which partial a tile uses is known at compile time.
    issue(even);
    while (k_tile_count > 0) {
      issue(odd);
      promote_older(even);
      if (k_tile_count == 0) {
        promote_last(odd);
        return;
      }
      issue(even);
      promote_older(odd);
    }
    promote_last(even);
  }
};

}  // namespace fp8ext::cuda::gemm::detail

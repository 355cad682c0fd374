// CUTLASS's sm90 FP8 block-wise mainloop with the scaling deferred by one K
// tile, so that the tensor cores never drain: each K tile's MMAs go into one of
// two partial accumulators, and while they run the other partial (the K tile
// before) is multiplied by its block scales and added to the fp32 total.
//
// Why: CUTLASS's loop waits for every MMA in flight (warpgroup_wait<0>) after
// each K tile to scale its partial sums; sm90_deferred_promotion.cuh does the
// same for the per-tensor kernels, where it was faster on 29 of 30 rows (up to
// 14%; bench/NOTES.md, session 22). The arithmetic is CUTLASS's: total +=
// partial * (scale_a * scale_b) per K tile, in the same order.
//
// The scales of a K tile live in its pipeline stage (shared memory), so they
// are copied to registers when the stage is waited for, before it is released.
// The rest of the contract is the base mainloop's: it consumes k_tile_count
// stages from smem_pipe_read and releases all but the last, which the base's
// mma_tail releases.
#pragma once

#include "sm90_gemm_common.cuh"

namespace fp8ext::cuda::gemm::detail {

template <class Base>
struct DeferredBlockwiseMainloop : Base {
  using typename Base::ElementBlockScale;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  static constexpr int kScalesM = Base::ScaleMsPerTile;  // distinct A scales along the tile's M
  static constexpr int kScalesN = Base::ScaleNsPerTile;  // distinct B scales along its N
  static_assert(Base::ScalePromotionInterval == 4, "one scale per K tile of 128");

  // The warp that copies scales too few for a TMA load (the weight's 128x128
  // block scales) into the stages runs this. CUTLASS 4.2's cooperative kernel
  // calls it without waiting for the kernel before (PDL), unlike its ping-pong
  // kernel and every other producer warp, so the first stages' scales could be
  // read before a quantize kernel just before had written them (helper-36's
  // review, bench/NOTES.md session 45). A second wait costs nothing.
  template <class... Args>
  CUTLASS_DEVICE void load_auxiliary(Args&&... args) {
    cutlass::arch::wait_on_dependent_grids();
    Base::load_auxiliary(static_cast<Args&&>(args)...);
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    constexpr int kWarpGroup = cutlass::NumThreadsPerWarpGroup;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    // Each stage's scales seen as (BLK_M, BLK_N, (K, PIPE)) tensors, broadcast
    // along the other operand's axis, so that partitioning them like the
    // accumulator gives each thread the scale of each of its elements.
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                               make_shape(get<1>(shape(SmemLayoutSFA{})), get<2>(shape(SmemLayoutSFA{})))),
                    make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                make_stride(get<1>(stride(SmemLayoutSFA{})), get<2>(stride(SmemLayoutSFA{}))))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), get<0>(shape(SmemLayoutSFB{})),
                               make_shape(get<1>(shape(SmemLayoutSFB{})), get<2>(shape(SmemLayoutSFB{})))),
                    make_stride(_0{}, get<0>(stride(SmemLayoutSFB{})),
                                make_stride(get<1>(stride(SmemLayoutSFB{})), get<2>(stride(SmemLayoutSFB{}))))));

    TiledMma tiled_mma;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / kWarpGroup, 0);
    auto thread_mma = tiled_mma.get_slice(warp_group * kWarpGroup);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);    // (MMA, MMA_M, MMA_N, (K, PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);

    Tensor even = make_fragment_like(accum);  // partial sums of the even K tiles
    Tensor odd = make_fragment_like(accum);   // and of the odd ones
    // The combined scale of each accumulator element for the even and odd
    // partials: A's (per row) times B's (per column), one side a single value
    // where the tile holds one block of it.
    Tensor even_sfa = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor even_sfb = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));
    Tensor odd_sfa = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor odd_sfb = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

    clear(accum);
    if (k_tile_count <= 0) return;

    // Waits for the next stage, reads its scales and queues its MMAs into
    // `partial` (from zero).
    auto issue = [&](auto& partial, auto& sfa, auto& sfb) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), sfa);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), sfb);
      queue_k_tile_mmas(tiled_mma, tCrA, tCrB, stage, partial, true);
      fold_scales(sfa, sfb);
      ++smem_pipe_read;
      --k_tile_count;
    };
    // total += partial * scale, element by element.
    auto add_scaled = [&](auto& partial, auto& sfa, auto& sfb) {
      warpgroup_fence_operand(partial);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        if constexpr (kScalesM > 1 && kScalesN > 1) {
          accum(i) += partial(i) * sfa(i) * sfb(i);
        } else if constexpr (kScalesN > 1) {
          accum(i) += partial(i) * sfb(i);
        } else {
          accum(i) += partial(i) * sfa(i);
        }
      }
      warpgroup_fence_operand(accum);
    };
    // Once all but the newest batch of MMAs are done: scales and adds the
    // older partial and hands its stage back to the producer.
    PipelineState smem_pipe_release = smem_pipe_read;
    auto promote_older = [&](auto& partial, auto& sfa, auto& sfb) {
      warpgroup_wait<1>();
      add_scaled(partial, sfa, sfb);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };
    auto promote_last = [&](auto& partial, auto& sfa, auto& sfb) {
      warpgroup_wait<0>();
      add_scaled(partial, sfa, sfb);
    };

    // Two K tiles a trip, so that which partial a tile uses is known at compile time.
    issue(even, even_sfa, even_sfb);
    while (k_tile_count > 0) {
      issue(odd, odd_sfa, odd_sfb);
      promote_older(even, even_sfa, even_sfb);
      if (k_tile_count == 0) {
        promote_last(odd, odd_sfa, odd_sfb);
        return;
      }
      issue(even, even_sfa, even_sfb);
      promote_older(odd, odd_sfa, odd_sfb);
    }
    promote_last(even, even_sfa, even_sfb);
  }

 private:
  // Folds the single-valued side's scale into the other side's (CUTLASS's
  // order of multiplication: (scale_a * scale_b) * partial), so that the add
  // is one multiply per element.
  template <class SfA, class SfB>
  CUTLASS_DEVICE static void fold_scales(SfA& sfa, SfB& sfb) {
    using namespace cute;
    if constexpr (kScalesM == 1 && kScalesN == 1) {
      sfa(_0{}) = sfa(_0{}) * sfb(_0{});
    } else if constexpr (kScalesM > 1 && kScalesN == 1) {
      const ElementBlockScale b = sfb(_0{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(sfa)); ++i) filter_zeros(sfa)(i) = filter_zeros(sfa)(i) * b;
    } else if constexpr (kScalesM == 1 && kScalesN > 1) {
      const ElementBlockScale a = sfa(_0{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(sfb)); ++i) filter_zeros(sfb)(i) = filter_zeros(sfb)(i) * a;
    }
  }
};

}  // namespace fp8ext::cuda::gemm::detail

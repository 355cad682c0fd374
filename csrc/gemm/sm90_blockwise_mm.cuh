// The CUTLASS 3.x sm_90a kernel behind every block-wise scaled_mm
// configuration: CUTLASS's FP8 blockwise mainloop (TMA + wgmma; after every
// 128 of K the tensor cores' partial sums are multiplied by the A-group and
// B-block scales and added into fp32 registers, one K tile behind the MMAs:
// sm90_deferred_blockwise.cuh), then an epilogue that adds the bias:
// D = acc + bias.
//
// With swap-AB the kernel computes D^T = B A^T: the weight's 128-row blocks
// become the kernel's M granularity, the activations' per-row group scales its
// N granularity (one per column), and D^T is stored column-major (= D row-major).
#pragma once

#include "blockwise_mm_kernels.h"
#include "sm90_deferred_blockwise.cuh"
#include "sm90_gemm_common.cuh"
#include "sm90_weight_prefetch.cuh"

namespace fp8ext::cuda::gemm {
namespace detail {

using namespace cute;

template <class Tile_, class Cluster_, class Mainloop_, class Epilogue_, bool kSwap_>
struct BlockwiseTileConfig {
  using Tile = Tile_;
  using Cluster = Cluster_;
  using MainloopSchedule = Mainloop_;
  using EpilogueSchedule = Epilogue_;
  static constexpr bool kSwap = kSwap_;
};

using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise;

template <BlockwiseConfig C>
struct BlockwiseConfigOf;
template <>
struct BlockwiseConfigOf<BlockwiseConfig::kLarge>
    : BlockwiseTileConfig<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Cooperative,
                          cutlass::epilogue::TmaWarpSpecializedCooperative, false> {};
template <>
struct BlockwiseConfigOf<BlockwiseConfig::kMedium>
    : BlockwiseTileConfig<Shape<_64, _128, _128>, Shape<_1, _1, _1>, Pingpong,
                          cutlass::epilogue::TmaWarpSpecialized, false> {};
template <>
struct BlockwiseConfigOf<BlockwiseConfig::kSwapSmall>
    : BlockwiseTileConfig<Shape<_128, _16, _128>, Shape<_1, _1, _1>, Pingpong,
                          cutlass::epilogue::TmaWarpSpecialized, true> {};
// Cooperative (two warp groups, 64 weight rows each): a CTA here has one or
// two tiles, so ping-pong's second warp group mostly idled. On the H200
// (graph-timed, us, cooperative / ping-pong; bench/results/
// gemm_blockwise_swap_cooperative_ab_2026-12-04_h200_5cc50d0.json against
// gemm_blockwise_split_k_ab_2026-12-04_h200_5e2acc0.json): split-K, 4 slices,
// 64x4096x4096 9.32 / 9.79 and 64x4096x14336 20.99 / 21.57; whole K
// 64x6144x4096 12.59 / 11.97, 64x28672x4096 34.05 / 34.55, 64x8192x8192
// 22.34 / 22.23. Not the doubling a compute bound would give: one tile per SM
// takes in operands at ~70-85 GB/s whatever the schedule. Ping-pong's kernel
// spilled 8 bytes; this one does not.
template <>
struct BlockwiseConfigOf<BlockwiseConfig::kSwapMedium>
    : BlockwiseTileConfig<Shape<_128, _64, _128>, Shape<_1, _1, _1>, Cooperative,
                          cutlass::epilogue::TmaWarpSpecializedCooperative, true> {};

// The scale-factor layouts, as CUTLASS's blockwise mainloop reads them: for
// each operand ((granularity, blocks) along M or N, (128, blocks) along K, L).
// `MnMajor`: consecutive M/N blocks are adjacent in memory (the activations'
// M-major group scales); else consecutive K blocks are (the weight's
// row-major block scales).
template <int kGranularity, bool kMnMajor>
struct ScaleLayout {
  using Type = Layout<Shape<Shape<Int<kGranularity>, int32_t>, Shape<_128, int32_t>, int32_t>,
                      conditional_t<kMnMajor, Stride<Stride<_0, _1>, Stride<_0, int32_t>, int32_t>,
                                    Stride<Stride<_0, int32_t>, Stride<_0, _1>, int32_t>>>;
  // `blocks`: scales along M/N; `k_blocks`: along K (a slice's, with
  // `slices` > 1: batch s starts s * k_blocks groups in); `ld`: the stride of
  // the slower axis.
  static Type make(int32_t blocks, int32_t k_blocks, int32_t ld, int32_t slices = 1) {
    const auto shape = make_shape(make_shape(Int<kGranularity>{}, blocks), make_shape(_128{}, k_blocks), slices);
    const int32_t batch = kMnMajor ? ld * k_blocks : k_blocks;
    if constexpr (kMnMajor) {
      return make_layout(shape, make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, ld), batch));
    } else {
      return make_layout(shape, make_stride(make_stride(_0{}, ld), make_stride(_0{}, _1{}), batch));
    }
  }
};

template <class ElementD, class Cfg>
struct Sm90BlockwiseMm {
  static constexpr bool kSwap = Cfg::kSwap;
  using Tile = typename Cfg::Tile;
  using Element = cutlass::float_e4m3_t;
  using LayoutA = cutlass::layout::RowMajor;     // [M', K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // [K, N'] with K contiguous: [N', K] row-major
  using LayoutD = conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // Activations: one scale per row (group of 1 along M); weight: 128-row blocks.
  using ActivationScales = ScaleLayout<1, true>;
  using WeightScales = ScaleLayout<128, false>;
  using ScalesA = conditional_t<kSwap, WeightScales, ActivationScales>;
  using ScalesB = conditional_t<kSwap, ActivationScales, WeightScales>;

  // The bias runs along N: the kernel's columns, or its rows when swapped. A
  // null pointer reads as zeros.
  using Bias = conditional_t<kSwap,
                             cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, ElementD, float, Stride<_1, _0, int64_t>>,
                             cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElementD, float, Stride<_0, _1, int64_t>>>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, ElementD, LayoutD,
      kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cute::tuple<LayoutA, typename ScalesA::Type>,
      kAlignAB, Element, cute::tuple<LayoutB, typename ScalesB::Type>, kAlignAB, float, Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::MainloopSchedule>::CollectiveOp;
  // Swapped (decode-sized M), the weight's stream can start before the PDL
  // wait (weight_prefetch.h: measured no gain here, so off unless
  // FP8EXT_GEMM_PREFETCH_MB asks for it).
  using PrefetchingMainloop = conditional_t<kSwap, WeightPrefetchingMainloop<BuiltMainloop, 0>, BuiltMainloop>;
  using CollectiveMainloop = DeferredBlockwiseMainloop<PrefetchingMainloop>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // With splits > 1 (split-K; only BlockwiseSplitKPartials asks, with fp32 D)
  // the kernel runs its batch mode: batch s multiplies the s-th slice of K (A,
  // B and both scales advance K / splits per batch) and writes its partial
  // product, without the bias, to partials[s] ([M, N] row-major, back to back).
  static typename CollectiveMainloop::Arguments mainloop_arguments(const BlockwiseMmProblem& p, int splits) {
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    const auto k_blocks = static_cast<int32_t>(fp8ext::ceil_div(p.k / splits, kGroupSize));
    const int64_t k_step = splits > 1 ? p.k / splits : 0;
    // The TMA reads a column of group scales in whole 16 bytes: M rounded up to
    // 4 (ld_scale_a >= that; rows past M scale zero rows of A and are not stored).
    const auto m4 = static_cast<int32_t>(fp8ext::round_up(p.m, kGroupScaleRowAlign));
    const auto act = ActivationScales::make(m4, k_blocks, static_cast<int32_t>(p.ld_scale_a), splits);
    const auto weight = WeightScales::make(static_cast<int32_t>(fp8ext::ceil_div(p.n, kGroupSize)), k_blocks,
                                           static_cast<int32_t>(p.ld_scale_b), splits);
    const auto* a = static_cast<const Element*>(p.a);
    const auto* b = static_cast<const Element*>(p.b);
    if constexpr (kSwap) {  // the weight is the kernel's A
      return {b, StrideA{p.ldb, Int<1>{}, k_step}, a, StrideB{p.lda, Int<1>{}, k_step},
              p.scale_b, weight, p.scale_a, act};
    } else {
      return {a, StrideA{p.lda, Int<1>{}, k_step}, b, StrideB{p.ldb, Int<1>{}, k_step},
              p.scale_a, act, p.scale_b, weight};
    }
  }

  static typename Gemm::Arguments arguments(const BlockwiseMmProblem& p, int splits = 1, float* partials = nullptr) {
    using StrideD = typename GemmKernel::StrideD;
    const bool split = splits > 1;
    const int m = static_cast<int>(kSwap ? p.n : p.m);
    const int n = static_cast<int>(kSwap ? p.m : p.n);
    const int k = static_cast<int>(p.k / splits);
    const int64_t ldd = split ? p.n : p.ldd;
    const int64_t d_step = split ? p.m * p.n : 0;
    StrideD stride_d{};
    if constexpr (kSwap) {
      stride_d = StrideD{Int<1>{}, ldd, d_step};
    } else {
      stride_d = StrideD{ldd, Int<1>{}, d_step};
    }
    const auto* bias = split ? nullptr : static_cast<const ElementD*>(p.bias);  // added once, after the sum
    auto* d = split ? reinterpret_cast<ElementD*>(partials) : static_cast<ElementD*>(p.d);
    typename Bias::Arguments bias_args{bias, ElementD(0), {}};
    typename Fusion::Arguments fusion{{}, bias_args, {}};
    cutlass::KernelHardwareInfo hw;
    hw.device_id = current_device_info().device;
    hw.sm_count = current_device_info().sm_count;
    typename Gemm::Arguments args{split ? cutlass::gemm::GemmUniversalMode::kBatched
                                        : cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, splits},
                                  mainloop_arguments(p, splits),
                                  {fusion, nullptr, stride_d, d, stride_d},
                                  hw};
    // Swizzled groups of tiles keep long-K panels in L2 (FP8EXT_GEMM_SWIZZLE /
    // FP8EXT_GEMM_RASTER override, for tuning). H200, bf16, TFLOP/s with
    // swizzle 1 / 4 / 8 (bench/results/gemm_blockwise_tuning_2026-11-29_h200):
    // 8192^3 1106 / 1181 / 1231; 4096x8192x8192 1219 / 1244 / 1258;
    // 4096x4096x14336 1236 / 1224 / 1256; at K = 4096 swizzle 8 lost up to 2%.
    const TuningOverrides tune = tuning_overrides();
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size =
        tune.swizzle ? tune.swizzle : (k >= 8192 ? swizzle_without_idle_tiles<Tile, typename Cfg::Cluster>(m, n, 8) : 1);
    args.scheduler.raster_order = tune.raster == 1 ? Raster::AlongM : tune.raster == 2 ? Raster::AlongN : Raster::Heuristic;
    return args;
  }
};

template <DType D, BlockwiseConfig C>
using BlockwiseImpl = Sm90BlockwiseMm<OutElement<D>, BlockwiseConfigOf<C>>;

}  // namespace detail

template <DType D, BlockwiseConfig C>
size_t BlockwiseKernel<D, C>::workspace_bytes(const BlockwiseMmProblem& p) {
  using Impl = detail::BlockwiseImpl<D, C>;
  return Impl::Gemm::get_workspace_size(Impl::arguments(p));
}

template <BlockwiseConfig C>
size_t BlockwiseSplitKPartials<C>::workspace_bytes(const BlockwiseMmProblem& p, int splits) {
  using Impl = detail::BlockwiseImpl<DType::kFloat32, C>;
  return Impl::Gemm::get_workspace_size(Impl::arguments(p, splits, nullptr));
}

template <BlockwiseConfig C>
cudaError_t BlockwiseSplitKPartials<C>::run(const BlockwiseMmProblem& p, int splits, float* partials,
                                            void* workspace, cudaStream_t stream) {
  using Impl = detail::BlockwiseImpl<DType::kFloat32, C>;
  // Every slice whole groups of 128 (its scales start at a group), so a multiple of the TMA's 16 bytes.
  if (splits < 2 || p.k % (int64_t{kGroupSize} * splits) != 0) return cudaErrorInvalidValue;
  return detail::run_gemm<typename Impl::Gemm>(Impl::arguments(p, splits, partials), workspace, stream);
}

template <DType D, BlockwiseConfig C>
cudaError_t BlockwiseKernel<D, C>::run(const BlockwiseMmProblem& p, void* workspace, cudaStream_t stream) {
  using Impl = detail::BlockwiseImpl<D, C>;
  return detail::run_gemm<typename Impl::Gemm>(Impl::arguments(p), workspace, stream);
}

}  // namespace fp8ext::cuda::gemm

// The CUTLASS 3.x sm_90a kernel behind every scaled_mm configuration: a
// warp-specialized TMA + wgmma mainloop and an epilogue visitor tree computing
//
//   D = (row_scale * col_scale) * acc + bias
//
// where row_scale / col_scale are CUTLASS's dynamic broadcasts (a vector or a
// single value, chosen at run time from the stride flag), so per-tensor and
// row-wise scaling share one kernel. With swap-AB the kernel computes
// D^T = B A^T (the small M becomes the MMA's N) and stores D^T column-major,
// which is D row-major; the scales and the bias trade axes accordingly.
#pragma once

#include <cstdlib>
#include <type_traits>

#include "sm90_deferred_promotion.cuh"
#include "sm90_gemm_common.cuh"
#include "sm90_weight_prefetch.cuh"
#include "scaled_mm_kernels.h"

namespace fp8ext::cuda::gemm {
namespace detail {

using namespace cute;

// Tile shape (M, N, K of the kernel's own problem), cluster shape, mainloop and
// epilogue schedules, whether the problem is swapped, and whether the mainloop
// promotes one K tile behind (sm90_deferred_promotion.cuh: every kernel whose
// three accumulators fit) instead of CUTLASS's every promotion_interval MMAs.
// K tiles are 128: the FP8 mainloop's fp32 promotion interval
// (promotion_interval below) must be a whole number of K tiles.
template <class Tile_, class Cluster_, class Mainloop_, class Epilogue_, bool kSwap_, bool kDeferred_>
struct TileConfig {
  using Tile = Tile_;
  using Cluster = Cluster_;
  using MainloopSchedule = Mainloop_;
  using EpilogueSchedule = Epilogue_;
  static constexpr bool kSwap = kSwap_;
  static constexpr bool kDeferredPromotion = kDeferred_;
};

// MMAs of K = 32 between two promotions of the tensor cores' partial sums to
// the fp32 total, for CUTLASS's own FP8 mainloop (kLargeN192 only; the
// deferred mainloop promotes every K tile, or never with kNeverPromote). It
// waits for every MMA in flight at each promotion, so a short interval starves
// the tensor cores.
// - 16-bit D: every 8 (256 of K): 6-10% faster than every 4 on the large
//   kernels, the error after rounding to bf16 in cuBLAS's default class
//   (bench/results/gemm_promotion_sweep_2026-12-03_h200_998f711.json).
// - fp32 D (and the split-K partials of an fp32 result): every 4, where the
//   extra error shows (2.1e-4 vs cuBLAS's 1.3e-4 at 8).
// - bf16 D with fast accumulation allowed: never (the partial sums stay in
//   the tensor cores' accumulator over all of K, cuBLAS's use_fast_accum class:
//   2.12e-3 vs its 2.12e-3), 1-8% faster than promoting at M <= 128.
inline uint32_t promotion_interval(const ScaledMmProblem& p) {
  if (p.d_dtype == DType::kFloat32) return 4;
  return p.allow_fast_accum && p.d_dtype == DType::kBFloat16 ? kNeverPromote : 8;
}

template <GemmConfig C>
struct ConfigOf;
template <>
struct ConfigOf<GemmConfig::kLarge>
    : TileConfig<Shape<_128, _128, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                 cutlass::epilogue::TmaWarpSpecializedCooperative, false, true> {};
// cuBLASLt's tile at 128x6144x4096: 64 tiles of 96 weight rows for two 64-row
// halves of M, each pair multicasting its weight tile (128 CTAs; 64x128 tiles
// make 96). On the H200 at M = 128 (row-wise, us): 6144x4096 9.84 against
// 64x128 tiles' 10.82, 4096x14336 22.92 / 24.14, 4096x4096 8.97 / 9.07,
// 28672x4096 37.15 / 36.76 (bench/NOTES.md, session 22).
template <>
struct ConfigOf<GemmConfig::kMedium>
    : TileConfig<Shape<_64, _96, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                 cutlass::epilogue::TmaWarpSpecialized, false, true> {};
template <>
struct ConfigOf<GemmConfig::kSwapSmall>
    : TileConfig<Shape<_64, _16, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                 cutlass::epilogue::TmaWarpSpecialized, true, true> {};
template <>
struct ConfigOf<GemmConfig::kSwapMedium>
    : TileConfig<Shape<_64, _64, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                 cutlass::epilogue::TmaWarpSpecialized, true, true> {};


// With fp32 promotion a warp group holds two accumulators (the tensor cores'
// partial sums and the fp32 total), so 64x256 per warp group would spill;
// fast accumulation keeps one.
template <>
struct ConfigOf<GemmConfig::kWideFastAccum>
    : TileConfig<Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                 cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                 cutlass::epilogue::TmaWarpSpecializedCooperative, false, false> {};
// Each warp group owns a whole 128x128 tile (one 128-register accumulator:
// fast accumulation only) and the two alternate, so one's epilogue runs while
// the other's MMAs do: the per-tile cost the cooperative kernels expose
// (bench/NOTES.md, session 27). In 2x2 clusters it was slower everywhere.
template <>
struct ConfigOf<GemmConfig::kPingpongFastAccum>
    : TileConfig<Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                 cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                 cutlass::epilogue::TmaWarpSpecialized, false, false> {};
// 64x192 per warp group: CUTLASS's two accumulators of 96 registers each still
// fit, the deferred mainloop's three would not.
template <>
struct ConfigOf<GemmConfig::kLargeN192>
    : TileConfig<Shape<_128, _192, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                 cutlass::epilogue::TmaWarpSpecializedCooperative, false, false> {};

// With one row of 128-row tiles (M <= 128) a 2x1 cluster leaves half its CTAs
// without a tile; 1x2 pairs tiles along N and multicasts their shared A.
template <>
struct ConfigOf<GemmConfig::kLargeClusterN>
    : TileConfig<Shape<_128, _128, _128>, Shape<_1, _2, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                 cutlass::epilogue::TmaWarpSpecializedCooperative, false, true> {};

// Whether a mainloop's arguments carry the fp32 promotion interval (the FP8
// mainloop without fast accumulation).
template <class Args, class = void>
struct HasPromotionInterval : std::false_type {};
template <class Args>
struct HasPromotionInterval<Args, std::void_t<decltype(Args{}.mma_promotion_interval)>> : std::true_type {};

template <class ElementA, class ElementB, class ElementD, class Cfg>
struct Sm90ScaledMm {
  static constexpr bool kSwap = Cfg::kSwap;
  using Tile = typename Cfg::Tile;
  // The kernel's own operands: swapped, B (the weight) is its A.
  using KernelA = conditional_t<kSwap, ElementB, ElementA>;
  using KernelB = conditional_t<kSwap, ElementA, ElementB>;
  using LayoutA = cutlass::layout::RowMajor;     // [M', K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // [K, N'] with K contiguous: [N', K] row-major
  using LayoutD = conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;  // FP8 elements in 16 bytes (TMA)
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // One scale per row / per column of the kernel's D, or one value (bool stride).
  // Under PDL nothing may read the scales before the producer's wait: these
  // broadcasts' constructors read a one-value scale's ptr[0] for is_zero_, which
  // only a tree with a source fetch (Sm90SrcFetch) uses; this one has none, and
  // the compiled kernels load nothing before the wait (SASS, session 51).
  using RowScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, float, float, Stride<bool, _0, int64_t>>;
  using ColScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, float, float, Stride<_0, bool, int64_t>>;
  // The bias runs along N: the kernel's columns, or its rows when swapped. A
  // null pointer reads as zeros.
  using Bias = conditional_t<kSwap,
                             cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, ElementD, float, Stride<_1, _0, int64_t>>,
                             cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElementD, float, Stride<_0, _1, int64_t>>>;
  // The scale product is formed first, so swapped and plain kernels round alike.
  using ScaleProduct = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, RowScale, ColScale>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float, kRound>,
      ScaleProduct, cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, ElementD, LayoutD,
      kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, KernelA, LayoutA, kAlignAB, KernelB, LayoutB, kAlignAB,
      float, Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::MainloopSchedule>::CollectiveOp;
  // Swapped (decode-sized M), the weight is the kernel's A, and its first 4 MiB
  // (over the grid) are prefetched before the PDL wait (weight_prefetch.h).
  using PrefetchingMainloop = conditional_t<kSwap, WeightPrefetchingMainloop<BuiltMainloop, 4>, BuiltMainloop>;
  using CollectiveMainloop = conditional_t<Cfg::kDeferredPromotion, DeferredPromotionMainloop<PrefetchingMainloop>,
                                           PrefetchingMainloop>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // With splits > 1 (split-K; only SplitKPartials asks, with fp32 D) the kernel runs its batch mode:
  // batch s multiplies the s-th slice of K (A and B advance K / splits
  // elements per batch) and writes its scaled partial product, without the
  // bias, to partials[s] ([M, N] row-major, splits of them back to back).
  static typename Gemm::Arguments arguments(const ScaledMmProblem& p, int splits = 1, float* partials = nullptr) {
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    using StrideD = typename GemmKernel::StrideD;
    const bool split = splits > 1;
    const int m = static_cast<int>(kSwap ? p.n : p.m);
    const int n = static_cast<int>(kSwap ? p.m : p.n);
    const int k = static_cast<int>(p.k / splits);
    const int64_t ldd = split ? p.n : p.ldd;
    const int64_t k_step = split ? k : 0, d_step = split ? p.m * p.n : 0;
    const auto* a = static_cast<const KernelA*>(kSwap ? p.b : p.a);
    const auto* b = static_cast<const KernelB*>(kSwap ? p.a : p.b);
    StrideA stride_a{kSwap ? p.ldb : p.lda, Int<1>{}, k_step};
    StrideB stride_b{kSwap ? p.lda : p.ldb, Int<1>{}, k_step};
    // D row-major [M, N] is the swapped kernel's D^T column-major [N, M].
    StrideD stride_d{};
    if constexpr (kSwap) {
      stride_d = StrideD{Int<1>{}, ldd, d_step};
    } else {
      stride_d = StrideD{ldd, Int<1>{}, d_step};
    }
    const float* row_scale = kSwap ? p.scale_b : p.scale_a;
    const bool row_vector = kSwap ? p.scale_b_per_row : p.scale_a_per_row;
    const float* col_scale = kSwap ? p.scale_a : p.scale_b;
    const bool col_vector = kSwap ? p.scale_a_per_row : p.scale_b_per_row;
    const auto* bias = split ? nullptr : static_cast<const ElementD*>(p.bias);  // added once, after the sum
    auto* d = split ? reinterpret_cast<ElementD*>(partials) : static_cast<ElementD*>(p.d);

    typename RowScale::Arguments row_args{row_scale, 1.0f, {row_vector, _0{}, int64_t{0}}};
    typename ColScale::Arguments col_args{col_scale, 1.0f, {_0{}, col_vector, int64_t{0}}};
    typename Bias::Arguments bias_args{bias, ElementD(0), {}};
    typename Fusion::Arguments fusion{{row_args, col_args, {}}, {}, bias_args, {}};

    const TuningOverrides tune = tuning_overrides();
    typename CollectiveMainloop::Arguments mainloop{a, stride_a, b, stride_b};
    if constexpr (HasPromotionInterval<typename CollectiveMainloop::Arguments>::value) {
      mainloop.mma_promotion_interval = tune.promotion ? static_cast<uint32_t>(tune.promotion) : promotion_interval(p);
    }
    cutlass::KernelHardwareInfo hw;
    hw.device_id = current_device_info().device;
    hw.sm_count = current_device_info().sm_count;
    typename Gemm::Arguments args{split ? cutlass::gemm::GemmUniversalMode::kBatched
                                        : cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, splits},
                                  mainloop,
                                  {fusion, nullptr, stride_d, d, stride_d},
                                  hw};
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    // Tiles in swizzled groups keep panels in L2. On the H200 (bench/NOTES.md,
    // sessions 3 and 24): groups of 4 at K >= 8192 (+9% at 8192^3, +2.5% at
    // K = 14336; 8 lost 4-10% at 4096x8192x8192 and 16384x8192x8192); at
    // K = 4096 none (+-2%) unless the operand the raster walks over is larger
    // than L2, then 8 (16384x28672x4096 graph-timed back to back: 3816 -> 3418
    // us; bench_gemm's event-timed ratio to cuBLAS did not move, 0.893 -> 0.889).
    const int wanted = k >= 8192 ? 4 : raster_sweeps_past_l2<Tile>(m, n, k) ? 8 : 1;
    args.scheduler.max_swizzle_size =
        tune.swizzle ? tune.swizzle : swizzle_without_idle_tiles<Tile, typename Cfg::Cluster>(m, n, wanted);
    args.scheduler.raster_order = tune.raster == 1 ? Raster::AlongM : tune.raster == 2 ? Raster::AlongN : Raster::Heuristic;
    return args;
  }
};

template <Fp8Format A, Fp8Format B, DType D, GemmConfig C>
using Impl = Sm90ScaledMm<Fp8Element<A>, Fp8Element<B>, OutElement<D>, ConfigOf<C>>;

}  // namespace detail

template <Fp8Format A, Fp8Format B, GemmConfig C>
size_t SplitKPartials<A, B, C>::workspace_bytes(const ScaledMmProblem& p, int splits) {
  using Impl = detail::Impl<A, B, DType::kFloat32, C>;
  return Impl::Gemm::get_workspace_size(Impl::arguments(p, splits, nullptr));
}

template <Fp8Format A, Fp8Format B, GemmConfig C>
cudaError_t SplitKPartials<A, B, C>::run(const ScaledMmProblem& p, int splits, float* partials, void* workspace,
                                         cudaStream_t stream) {
  using Impl = detail::Impl<A, B, DType::kFloat32, C>;
  // The batch (L) stride, K / splits FP8 bytes, must be a multiple of the TMA's 16 bytes.
  if (splits < 2 || p.k % (16 * splits) != 0) return cudaErrorInvalidValue;
  return detail::run_gemm<typename Impl::Gemm>(Impl::arguments(p, splits, partials), workspace, stream);
}

template <Fp8Format A, Fp8Format B, DType D, GemmConfig C>
size_t Kernel<A, B, D, C>::workspace_bytes(const ScaledMmProblem& p) {
  using Impl = detail::Impl<A, B, D, C>;
  return Impl::Gemm::get_workspace_size(Impl::arguments(p));
}

template <Fp8Format A, Fp8Format B, DType D, GemmConfig C>
cudaError_t Kernel<A, B, D, C>::run(const ScaledMmProblem& p, void* workspace, cudaStream_t stream) {
  using Impl = detail::Impl<A, B, D, C>;
  return detail::run_gemm<typename Impl::Gemm>(Impl::arguments(p), workspace, stream);
}

}  // namespace fp8ext::cuda::gemm

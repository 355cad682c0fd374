// Chooses and runs a scaled_mm kernel: checks what the kernels need, picks a
// tile configuration by M, and maps the runtime formats/dtype to one of the
// instantiated kernels (scaled_mm_*.cu).
//
// Configuration by M for E4M3 x E4M3, from H200 measurements (2026-11-29,
// scripts/device/tune_gemm.py and bench/bench_gemm.py --configs; row-wise scales,
// bf16 out, graph-timed, weights rotated past L2; us):
//
//   M <= 16      kSwapSmall   swap-AB, 64 x 16 x 128 tiles: N fills the MMA's 64 rows
//                             16x6144x4096: 10.6 (swap_medium 13.3, medium 14.2, stream-K 14.4)
//                             16x8192x8192: 20.5 (25.0, 25.5, 25.3)
//                             With PDL (run c1d075d): 16x4096x4096 7.8 us; a split-K 128 x 16
//                             swap kernel (CUTLASS stream-K scheduler, 4 splits, 128 CTAs)
//                             took 14.0 there and 24.2 vs 19.8 at 16x4096x14336 (run 3d7a393)
//   M <= 64      kSwapMedium  swap-AB, 64 x 64 x 128 tiles
//                             64x6144x4096: 11.4 (swap_small 18.4, medium 14.7)
//   M <= 128     kSwapMedium  when its tiles (N/64 x M/64) fit in one wave on the SMs, else kMedium
//                             (then 64 x 128 tiles, ping-pong): 128x4096x4096 12.5 vs 15.7,
//                             128x4096x14336 27.3 vs 39.0; 128x6144x4096 17.5 vs 15.0,
//                             128x8192x8192 33.2 vs 27.7 (kMedium is bf16 only now: fp16
//                             stays on kSwapMedium, see one_tile_row_config)
//                kLargeClusterN for N >= 8192 (bf16): 128 x 128 tiles in 1x2 clusters (run
//                             c1d075d: 128x28672x4096 36.4 vs medium 45.0, cuBLAS 35.5;
//                             128x8192x8192 26.6 vs 27.0; 128x6144x4096 14.2 vs 13.6)
//   16 < M <= 128, K >= 12288, few tiles of N (N = 4096): kSplitK, slices of K (below)
//   M  > 128     kLarge       128 x 128 tiles, 2x1 cluster, cooperative, fp32 promotion
//                             every 256 of K (4096x6144x4096: 171 us = 1208 TFLOP/s)
//                kLargeN192   128 x 192 tiles for M >= 4096 and N >= 6144 (bf16):
//                             4096x57344x8192 3076 us vs 3296, 4096x8192x28672 1495 vs 1612,
//                             4096x6144x4096 165 vs 172; but 4096x4096x14336 379 vs 358
//                kWideFastAccum with allow_fast_accum (bf16): 128 x 256 tiles, no promotion
//                             (4096x6144x4096: 156 us = 1323 TFLOP/s), unless the last wave
//                             would be > 10% idle (see large_m_config)
//                kPingpongFastAccum with allow_fast_accum (bf16; session 27): 128 x 128 tiles,
//                             ping-pong, at K < 8192 unless the raster re-reads an operand past L2
//                             (2-6% faster there: pingpong_fast_wins), and where 128 x 256 tiles
//                             would idle a wave
//
//   M == 1       kGemv        CUDA cores, a warp per 2 rows of B (scaled_gemv.cu). Alone it beats
//                             kSwapSmall on every 8B decode layer (run 7740452,
//                             scripts/device/time_gemv.py, us): 1x6144x4096 9.5 vs 9.9, 1x4096x4096
//                             6.5 vs 7.7, 1x28672x4096 32.0 vs 32.5, 1x4096x14336 17.3 vs 19.8. In
//                             the engine's batch-1 decode step (W8A8 + FP8 KV, 4096 context, one
//                             process, three rounds; run ba2fc51, scripts/device/ab_serve_env.py)
//                             3.632-3.659 ms with it, 3.758-3.772 without. (Session 11 compared two
//                             processes, 3.646 vs 3.608, and kept it opt-in: the process-to-process
//                             spread is larger than the gain.) At M = 2 to 4 kSwapSmall wins outright
//                             (2x4096x4096 8.7 vs 7.7, 4x28672x4096 57.1 vs 33.0). FP8EXT_GEMV=0
//                             turns it off.
//
// The swap-AB kernels ask L2 for the first 4 MiB (over the grid) of their weight
// before their PDL wait: behind the activation quantization that took
// bench_linear's M = 16 stack from 83.2 to 80.7 us (weight_prefetch.h).
//
// The times above predate sessions 21 and 22. Every kernel but kLargeN192 and
// the fast-only kWideFastAccum and kPingpongFastAccum now promotes its partial sums to fp32 one K tile behind
// (sm90_deferred_promotion.cuh), so the tensor cores never drain for it; in
// session 22's first run (scripts/device/ab_deferred.py, then as separate
// configurations) that was faster than promoting every 256 of K on 29 of 30
// rows (0.1-14%): 8b_o at M = 64 8.02 -> 7.39 us, 8b_down at M = 64 22.37 -> 19.59, 8b_gate_up
// at M = 1024 221.1 -> 207.8 (row-wise), 8b_qkv at M = 4096 178.8 -> 173.1.
//
// kMedium's tiles are now cuBLASLt's at 128x6144x4096: 64x96 in 2x1 clusters,
// both promoting one K tile behind, in session 22's second run
// (gemm_deferred_promotion_configs_2026-12-03_h200_1aad5c3.json): 9.84 us
// against 64x128 tiles' 10.82 there (auto's choice), 22.92 vs 24.14 at 128x4096x14336
// (where auto's split-K took 23.58), 8.97 vs 9.07 at 4096x4096 (auto: kSwapMedium,
// 8.81), 37.15 vs 36.76 at 28672x4096 (auto: kLargeClusterN, 36.14).
// (Session 21's swap-AB kernels in clusters, cuBLASLt's M = 16 shapes, won
// 1.5-3% on some rows and lost up to 38% on others: removed.)
//
// Instantiations (16, issue 4's budget): bf16 has every config (8); fp16 kLarge,
// kSwapSmall, kSwapMedium (kMedium made room for kPingpongFastAccum in session 27);
// fp32 kLarge, kSwapMedium (and kGemv, CUDA cores) and kLargeClusterN's split-K
// partials; E5M2 operands (fp32 output) kLarge only.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fp8ext/cuda_launch.h"
#include "gemm_shape_checks.h"
#include "fp8ext/scaled_mm.h"
#include "raster_past_l2.h"
#include "scaled_gemv.h"
#include "scaled_mm_kernels.h"
#include "split_k_reduce.h"

namespace fp8ext::cuda {
namespace {

using gemm::Kernel;

// kAuto takes the CUDA-core GEMV at M = 1 unless FP8EXT_GEMV=0 (the table
// above). Read at each call, so a benchmark can compare both ways in one process.
bool gemv_enabled() {
  const char* v = std::getenv("FP8EXT_GEMV");
  return !(v && std::strcmp(v, "0") == 0);
}

// FP8EXT_GEMM_FAST_PINGPONG (tuning, read at each call): 0 never takes the
// ping-pong fast kernel, 1 takes it at every M > 128 with fast accumulation;
// unset (or anything else): pingpong_fast_wins decides.
int fast_pingpong_setting() {
  const char* v = std::getenv("FP8EXT_GEMM_FAST_PINGPONG");
  return v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0) ? v[0] - '0' : -1;
}

// SMs of the current device (132 on an H200).
int64_t sm_count() { return current_device_info().sm_count; }

int64_t tiles(const ScaledMmProblem& p, int64_t tile_m, int64_t tile_n) {
  return ((p.m + tile_m - 1) / tile_m) * ((p.n + tile_n - 1) / tile_n);
}

// Split-K (kSplitK): the CTAs of a decode-sized GEMM each stream a few tiles of
// the weight, and with N = 4096 there are 64 tiles of 64 rows (32 of 128) for
// 132 SMs. Slicing K gives every SM a share, in one launch (the fp32 kernel's
// batch mode); the slices' fp32 partials (splits x M x N x 4 bytes, in L2) are
// then summed by a second kernel, which costs ~2-3 us of latency. So it pays
// only on long K. One process, H200, graph-timed, weights past L2, us, whole K
// -> split (6f4a70b, bench/results/gemm_split_k_ab_2026-12-03_h200_6f4a70b.json):
//   64x4096x14336   25.6 -> 21.2 (2 slices; cuBLAS per-tensor 18.9)
//   128x4096x14336  30.3 -> 25.1 (4 slices of 128x128 cluster tiles; cuBLAS 24.7)
//   but 16x4096x4096 7.5 -> 10.3, 16x4096x14336 20.5 -> 25.0 (the 64x64 fp32
//   tile is slower than the 64x16 one at M <= 16), 64x4096x4096 8.8 -> 9.5,
//   128x4096x4096 10.3 -> 11.5, 128x6144x4096 13.9 -> 14.6, 128x8192x8192
//   29.6 -> 30.0 (2 slices of 4096).

// Which fp32 kernel runs the slices (its batch mode, gemm::SplitKPartials):
// swap-AB 64x64 tiles up to M = 64, 128x128 tiles in 1x2 clusters above
// (FP8EXT_GEMM_SPLIT_TILE=128: those at every M, for tuning).
bool split_k_swapped(const ScaledMmProblem& p) {
  const char* v = std::getenv("FP8EXT_GEMM_SPLIT_TILE");
  return p.m <= 64 && !(v && std::strcmp(v, "128") == 0);
}

// CTAs one slice of K takes.
int64_t split_k_tiles(const ScaledMmProblem& p) {
  if (split_k_swapped(p)) return tiles(p, 64, 64);
  return ceil_div(p.m, 128) * round_up(ceil_div(p.n, 128), 2);  // the cluster pairs tiles along N
}

// The split count the rule picks (1: none), from the measurements above: for
// M <= 128 and K >= 12288 only, enough slices for the tiles to fill the SMs
// once, each at least 3584 of K, at most 4 (the most measured).
int split_k_rule(const ScaledMmProblem& p) {
  if (p.m <= 0 || p.n <= 0 || p.m > 128 || p.k < 12288) return 1;  // no tiles: nothing to split (and no / 0)
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({sm_count() / split_k_tiles(p), p.k / 3584, 4})));
}

// Slices kSplitK cuts K into (1: the problem runs whole, as kAuto would
// without splitting): FP8EXT_GEMM_SPLITS's count (gemm::split_k_setting; kAuto
// takes kSplitK at 16 < M <= 128 only) or the rule, fewer until each slice is
// a multiple of 16 (the TMA's unit). M <= 16 never splits, even when forced:
// slower at every size measured (the 64x16 whole-K kernel streams as fast,
// without the second kernel).
int split_k_count(const ScaledMmProblem& p) {
  if (p.m <= 16) return 1;
  const int setting = gemm::split_k_setting();
  int s = setting > 0 ? setting : split_k_rule(p);
  while (s > 1 && p.k % (16 * s) != 0) --s;
  return s;
}

// Calls fn(gemm::SplitKPartials<...>{}) for the problem's tile family.
template <typename Fn>
auto with_split_kernel(const ScaledMmProblem& p, Fn&& fn) {
  constexpr auto E4 = Fp8Format::kE4M3;
  if (split_k_swapped(p)) return fn(gemm::SplitKPartials<E4, E4, GemmConfig::kSwapMedium>{});
  return fn(gemm::SplitKPartials<E4, E4, GemmConfig::kLargeClusterN>{});
}

// The configurations instantiated for each type combination (see the header).
bool has_config(const ScaledMmProblem& p, GemmConfig c) {
  const bool e4m3 = p.a_format == Fp8Format::kE4M3 && p.b_format == Fp8Format::kE4M3;
  if (c == GemmConfig::kGemv || c == GemmConfig::kSplitK) return e4m3;
  const bool bf16_only = c == GemmConfig::kMedium || c == GemmConfig::kWideFastAccum ||
                         c == GemmConfig::kLargeN192 || c == GemmConfig::kLargeClusterN ||
                         c == GemmConfig::kPingpongFastAccum;
  if (bf16_only) return e4m3 && p.d_dtype == DType::kBFloat16;
  if (e4m3 && p.d_dtype != DType::kFloat32) return c != GemmConfig::kAuto;
  if (e4m3) return c == GemmConfig::kLarge || c == GemmConfig::kSwapMedium;
  return p.d_dtype == DType::kFloat32 && c == GemmConfig::kLarge &&
         (p.a_format == Fp8Format::kE4M3 || p.b_format == Fp8Format::kE5M2);
}

// Calls fn(Kernel<...>) for the problem's types and config; false if not instantiated.
template <typename Fn>
bool with_kernel(const ScaledMmProblem& p, GemmConfig c, Fn&& fn) {
  if (!has_config(p, c)) return false;
  constexpr auto E4 = Fp8Format::kE4M3;
  constexpr auto E5 = Fp8Format::kE5M2;
  if (p.a_format == E4 && p.b_format == E4) {
    auto by_config = [&](auto d) {
      constexpr DType D = decltype(d)::value;
      switch (c) {
        case GemmConfig::kLarge: fn(Kernel<E4, E4, D, GemmConfig::kLarge>{}); return;
        case GemmConfig::kSwapMedium: fn(Kernel<E4, E4, D, GemmConfig::kSwapMedium>{}); return;
        default: break;
      }
      if constexpr (D != DType::kFloat32) {
        if (c == GemmConfig::kSwapSmall) fn(Kernel<E4, E4, D, GemmConfig::kSwapSmall>{});
      }
      if constexpr (D == DType::kBFloat16) {
        if (c == GemmConfig::kMedium) fn(Kernel<E4, E4, D, GemmConfig::kMedium>{});
        if (c == GemmConfig::kWideFastAccum) fn(Kernel<E4, E4, D, GemmConfig::kWideFastAccum>{});
        if (c == GemmConfig::kLargeN192) fn(Kernel<E4, E4, D, GemmConfig::kLargeN192>{});
        if (c == GemmConfig::kLargeClusterN) fn(Kernel<E4, E4, D, GemmConfig::kLargeClusterN>{});
        if (c == GemmConfig::kPingpongFastAccum) fn(Kernel<E4, E4, D, GemmConfig::kPingpongFastAccum>{});
      }
    };
    switch (p.d_dtype) {
      case DType::kBFloat16: by_config(std::integral_constant<DType, DType::kBFloat16>{}); break;
      case DType::kFloat16: by_config(std::integral_constant<DType, DType::kFloat16>{}); break;
      case DType::kFloat32: by_config(std::integral_constant<DType, DType::kFloat32>{}); break;
    }
  } else if (p.a_format == E4) {
    fn(Kernel<E4, E5, DType::kFloat32, GemmConfig::kLarge>{});
  } else {
    fn(Kernel<E5, E5, DType::kFloat32, GemmConfig::kLarge>{});
  }
  return true;
}

// Share of the SMs' tile slots that `tiles` keep busy over the waves they need.
double wave_efficiency(int64_t tiles) {
  const int64_t sms = sm_count();
  return static_cast<double>(tiles) / static_cast<double>(((tiles + sms - 1) / sms) * sms);
}

// Fast accumulation, M > 128: where the ping-pong 128x128 kernel beats the
// cooperative 128x256 one. Its epilogue hides under the other warp group's
// MMAs, which pays at K = 4096 (a tile's mainloop is short) but not at K >= 8192,
// where the wider tile's fewer loads per MMA win. One process, graph-timed,
// rotated weights, us, cooperative -> ping-pong, per-tensor / row-wise
// (bench/results/gemm_fast_pingpong_ab_2026-12-04_h200_f79c77b.json, ..._2x2_..._fc4140f.json):
//   4096x6144x4096 168.7 -> 163.0 / 166.9 -> 162.0; 16384x6144x4096 704.6 -> 677.5 / 705.9 -> 678.2
//   16384x4096x4096 444.6 -> 432.1 / 449.4 -> 431.8; 4096x28672x4096 801 -> 774 / 799 -> 770
//   but 4096x8192x8192 448 -> 464, 16384x4096x14336 1547 -> 1624, and 16384x28672x4096 3202 -> 3242
//   (past L2: the raster re-reads the 64 MB A for every column of tiles).
// Where the 128x256 tiles would leave a wave idle (kLarge's 128x128 cooperative tiles
// ran instead) it won at K = 8192 too: 1024x10240x8192 144.1 -> 137.3 / 143.7 -> 134.7.
bool pingpong_fast_wins(const ScaledMmProblem& p) {
  return p.k < 8192 && !gemm::raster_sweeps_past_l2(p.m, p.n, p.k, 128, 128);
}

// M > 128. Promoted: 128x192 tiles for M >= 4096 and N >= 6144 (3-9% faster
// than 128x128 there, slower at N = 4096 and M = 1024), else 128x128. With fast
// accumulation allowed (bf16): ping-pong 128x128 tiles where pingpong_fast_wins,
// else 128x256 tiles (~10% faster per tile than cooperative 128x128) unless they
// leave more than a tenth of the last wave idle (1024x6144: 192 tiles on 132
// SMs, 50.4 us against 128x128's 44.3), else ping-pong 128x128 again. That last
// choice was measured against the cooperative 128x128 kernel only (1024x10240x8192,
// above); it also takes rows where kLargeN192 ran before (M >= 4096, N >= 6144
// with idle 128x256 waves, K >= 8192) and long-K rows past L2 with few tiles.
GemmConfig large_m_config(const ScaledMmProblem& p) {
  if (p.allow_fast_accum && has_config(p, GemmConfig::kPingpongFastAccum)) {
    const int setting = fast_pingpong_setting();
    if (setting == 1 || (setting < 0 && pingpong_fast_wins(p))) return GemmConfig::kPingpongFastAccum;
    if (wave_efficiency(tiles(p, 128, 256)) >= 0.9) return GemmConfig::kWideFastAccum;
    if (setting < 0) return GemmConfig::kPingpongFastAccum;
  }
  if (p.m >= 4096 && p.n >= 6144 && has_config(p, GemmConfig::kLargeN192)) return GemmConfig::kLargeN192;
  return GemmConfig::kLarge;
}

// 64 < M <= 128: swap-AB 64x64 while its tiles fit in one wave; else 128x128
// tiles in 1x2 clusters for N >= 8192, else 64x96 in 2x1 clusters (both bf16).
// fp16 has neither (issue 4's budget of 16 went to the fast ping-pong kernel):
// 64x64 swap tiles over several waves (two at N = 6144, seven at N = 28672),
// 15-20% slower than kMedium's tiles of then (64x128) in the table above
// (128x6144x4096 17.5 vs 15.0 us, 128x8192x8192 33.2 vs 27.7); wider N not
// measured. fp32 keeps kLarge there (not measured either).
GemmConfig one_tile_row_config(const ScaledMmProblem& p) {
  if (tiles(p, 64, 64) <= sm_count()) return GemmConfig::kSwapMedium;
  if (p.n >= 8192 && has_config(p, GemmConfig::kLargeClusterN)) return GemmConfig::kLargeClusterN;
  if (has_config(p, GemmConfig::kMedium)) return GemmConfig::kMedium;
  return p.d_dtype == DType::kFloat16 ? GemmConfig::kSwapMedium : GemmConfig::kLarge;
}

// kAuto's choice among the kernels that take K whole.
GemmConfig whole_k_config(const ScaledMmProblem& p) {
  GemmConfig c = large_m_config(p);
  if (p.m == 1 && gemv_enabled() && has_config(p, GemmConfig::kGemv)) return GemmConfig::kGemv;
  if (p.m <= 16) c = GemmConfig::kSwapSmall;
  else if (p.m <= 64) c = GemmConfig::kSwapMedium;
  else if (p.m <= 128) c = one_tile_row_config(p);
  if (!has_config(p, c)) c = p.m <= 64 && has_config(p, GemmConfig::kSwapMedium) ? GemmConfig::kSwapMedium
                                                                                 : GemmConfig::kLarge;
  return c;
}

// The slices an explicit or automatic kSplitK cuts K into; with one slice,
// `config` becomes the whole-K kernel kAuto would take.
int resolve_split_k(const ScaledMmProblem& p, GemmConfig& config) {
  if (config != GemmConfig::kSplitK || !has_config(p, config)) return 1;
  const int splits = split_k_count(p);
  if (splits < 2) config = whole_k_config(p);
  return splits;
}

}  // namespace

const char* gemm_config_name(GemmConfig config) {
  switch (config) {
    case GemmConfig::kAuto: return "auto";
    case GemmConfig::kLarge: return "large_128x128_coop";
    case GemmConfig::kMedium: return "medium_64x96_cluster_2x1";
    case GemmConfig::kSwapSmall: return "swap_ab_64x16";
    case GemmConfig::kSwapMedium: return "swap_ab_64x64";
    case GemmConfig::kWideFastAccum: return "wide_128x256_coop_fast_accum";
    case GemmConfig::kLargeN192: return "large_128x192_coop";
    case GemmConfig::kLargeClusterN: return "large_128x128_coop_cluster_1x2";
    case GemmConfig::kGemv: return "gemv_cuda_cores";
    case GemmConfig::kSplitK: return "split_k";
    case GemmConfig::kPingpongFastAccum: return "pingpong_128x128_fast_accum";
  }
  return "unknown";
}

const char* scaled_mm_unsupported_reason(const ScaledMmProblem& p) {
  if (const char* why = tma_gemm_unsupported_reason(p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.d_dtype, p.a, p.b, p.d,
                                                     p.bias))
    return why;
  if (!p.scale_a || !p.scale_b) return "both scales are required";
  if (p.a_format == Fp8Format::kE5M2 && p.b_format == Fp8Format::kE4M3)
    return "E5M2 x E4M3 is not instantiated (swap the operands: D^T = B A^T)";
  if (p.a_format != Fp8Format::kE4M3 || p.b_format != Fp8Format::kE4M3) {
    if (p.d_dtype != DType::kFloat32) return "E5M2 operands are instantiated with fp32 output only";
  }
  return nullptr;
}

bool scaled_mm_has_config(const ScaledMmProblem& p, GemmConfig config) {
  return config == GemmConfig::kAuto || has_config(p, config);
}

GemmConfig scaled_mm_auto_config(const ScaledMmProblem& p) {
  if (p.m <= 128 && has_config(p, GemmConfig::kSplitK) && split_k_count(p) > 1)  // never at M = 1 (M <= 16)
    return GemmConfig::kSplitK;
  return whole_k_config(p);
}

size_t scaled_mm_workspace_bytes(const ScaledMmProblem& p, GemmConfig config) {
  if (config == GemmConfig::kAuto) config = scaled_mm_auto_config(p);
  if (const int splits = resolve_split_k(p, config); splits > 1)
    return with_split_kernel(p, [&](auto k) { return gemm::split_k_workspace_bytes<decltype(k)>(p, splits); });
  size_t bytes = 0;
  with_kernel(p, config, [&](auto kernel) { bytes = decltype(kernel)::workspace_bytes(p); });
  return bytes;
}

cudaError_t scaled_mm(const ScaledMmProblem& p, GemmConfig config, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  if (scaled_mm_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (config == GemmConfig::kAuto) config = scaled_mm_auto_config(p);
  if (const int splits = resolve_split_k(p, config); splits > 1)
    return with_split_kernel(p, [&](auto kernel) {
      return gemm::run_split_k<decltype(kernel)>(p, splits, workspace, workspace_bytes, stream);
    });
  if (config == GemmConfig::kGemv) return has_config(p, config) ? scaled_gemv(p, stream) : cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  const bool found = with_kernel(p, config, [&](auto kernel) {
    using K = decltype(kernel);
    if (K::workspace_bytes(p) > workspace_bytes) return;  // err stays InvalidValue
    err = K::run(p, workspace, stream);
  });
  return found ? err : cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

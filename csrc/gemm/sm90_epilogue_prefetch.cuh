// A CUTLASS sm90 mainloop whose producer warp, once it has issued a tile's
// operand loads, asks L1 for the lines of that tile's epilogue vectors: the
// per-row and per-column scales (or the one value of a per-tensor scale) and
// the bias.
//
// Why: CUTLASS's broadcast nodes (Sm90RowBroadcast, Sm90ColBroadcast) load a
// tile's vectors from global memory when its epilogue begins, and the row
// broadcast then waits on a barrier: an L2 round trip (~600-800 cycles) that
// the tensor cores spend idle at every tile (bench/NOTES.md, session 23: our
// row-wise and per-tensor times are equal where cuBLAS's per-tensor path is 2%
// cheaper, and row-wise fast accumulation costs us 4% more than per-tensor).
// The producer finishes issuing a tile's loads `stages` K tiles before the
// consumers finish its MMAs, so the lines are in L1 (shared by the CTA's
// warps; the TMA traffic bypasses it) when the epilogue reads them.
//
// The producer runs after the kernel's PDL wait, so the lines are never stale.
// A prefetch is a hint: nothing depends on it. FP8EXT_GEMM_EPILOGUE_PREFETCH=0
// (read at each launch) turns it off, for A/B timing in one process.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "sm90_gemm_common.cuh"

namespace fp8ext::cuda::gemm::detail {

// The epilogue's vectors in the kernel's own axes (swap-AB: the weight's rows
// are its M). A null pointer prefetches nothing.
struct EpilogueVectors {
  const float* row_scale = nullptr;  // along M: one value, or M of them when row_vector
  bool row_vector = false;
  const float* col_scale = nullptr;  // along N: one value, or N of them when col_vector
  bool col_vector = false;
  const uint8_t* bias = nullptr;     // bias_bytes a value, along M (bias_along_m) or N
  int bias_bytes = 0;
  bool bias_along_m = false;
  int64_t m = 0, n = 0;              // the kernel's problem: no line past a vector's end
};

inline bool epilogue_prefetch_enabled() {
  const char* v = std::getenv("FP8EXT_GEMM_EPILOGUE_PREFETCH");
  return !(v && std::strcmp(v, "0") == 0);
}

__device__ __forceinline__ void prefetch_l1(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#endif
}

template <class Mainloop>
struct EpiloguePrefetchingMainloop : Mainloop {
  static constexpr int kTileM = cute::size<0>(typename Mainloop::TileShape{});
  static constexpr int kTileN = cute::size<1>(typename Mainloop::TileShape{});
  static constexpr int kLine = 128;  // bytes

  struct Arguments : Mainloop::Arguments {
    EpilogueVectors epilogue{};
  };
  struct Params : Mainloop::Params {
    EpilogueVectors epilogue{};
  };

  // Host: the base parameters plus the vectors (none when turned off).
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    EpilogueVectors v = epilogue_prefetch_enabled() ? args.epilogue : EpilogueVectors{};
    auto shape_mnkl = cute::append<4>(shape, 1);
    v.m = cute::get<0>(shape_mnkl);
    v.n = cute::get<1>(shape_mnkl);
    return {Mainloop::to_underlying_arguments(shape, args, workspace), v};
  }

  // Device, the producer warp (every lane), per tile: the base's loads, then
  // one lane per line of the tile's vectors.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Mainloop::MainloopPipeline pipeline,
                           typename Mainloop::PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, typename Mainloop::TensorStorage& shared_tensors) {
    Mainloop::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx,
                   block_rank_in_cluster, shared_tensors);
    const EpilogueVectors& v = params.epilogue;
    const int lane = thread_idx % cutlass::NumThreadsPerWarp;
    const int64_t m0 = int64_t{cute::get<0>(blk_coord)} * kTileM, n0 = int64_t{cute::get<1>(blk_coord)} * kTileN;
    // Lines of the tile's rows [m0, m0 + kTileM) or columns [n0, n0 + kTileN) of
    // a vector of `bytes`-byte values, `extent` long; lane `first` takes line 0.
    auto take = [&](const void* base, int bytes, int64_t start, int tile, int64_t extent, int first) {
      const int lines = (tile * bytes + kLine - 1) / kLine;
      const int i = lane - first;
      if (base == nullptr || i < 0 || i >= lines) return;
      const int64_t at = start + int64_t{i} * (kLine / bytes);
      if (at < extent) prefetch_l1(static_cast<const uint8_t*>(base) + at * bytes);
    };
    constexpr int kRowLines = (kTileM * 4 + kLine - 1) / kLine;
    constexpr int kColLines = (kTileN * 4 + kLine - 1) / kLine;
    if (v.row_vector) take(v.row_scale, 4, m0, kTileM, v.m, 0);
    else if (lane == 0 && v.row_scale) prefetch_l1(v.row_scale);
    if (v.col_vector) take(v.col_scale, 4, n0, kTileN, v.n, kRowLines);
    else if (lane == kRowLines && v.col_scale) prefetch_l1(v.col_scale);
    if (v.bias_bytes > 0) {
      if (v.bias_along_m) take(v.bias, v.bias_bytes, m0, kTileM, v.m, kRowLines + kColLines);
      else take(v.bias, v.bias_bytes, n0, kTileN, v.n, kRowLines + kColLines);
    }
  }
};

}  // namespace fp8ext::cuda::gemm::detail

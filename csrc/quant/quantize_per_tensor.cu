// Per-tensor recipes on the GPU: static (given scale), current (two passes, or
// one launch: quantize_per_tensor_small.cu for small tensors,
// quantize_per_tensor_kept.cu for large contiguous ones) and delayed (one pass;
// the last block to finish rolls the history), plus the plain FP8 cast.
// Work is split into 16-element chunks; blocks walk rows along y, a few rows a
// step (all their loads in flight before any is used), and chunks along x, both
// grid-stride over a grid of a few blocks per SM, so per-block set-up (the
// scale, its reciprocal) is paid rarely and no 64-bit division is needed. A
// tensor too small to fill the SMs gets a block per row (row_step_grid_y).
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "quantize_per_tensor_kept.cuh"
#include "quantize_per_tensor_small.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

inline dim3 grid_blocks(int64_t rows, int64_t chunks_per_row, int rows_per_step,
                        int64_t blocks_per_sm = kRowStepBlocksPerSm) {
  const int64_t x = std::max<int64_t>(1, std::min<int64_t>(ceil_div(chunks_per_row, kThreads), 1024));
  return dim3(static_cast<unsigned>(x), row_step_grid_y(rows, x, rows_per_step, blocks_per_sm));
}

// Calls body(r, c, step) for chunk column c of rows r + i * step (i < N, the
// rows that exist); blocks stride over rows and chunks.
template <int N, typename Body>
__device__ __forceinline__ void for_each_chunk_step(int64_t rows, int64_t chunks_per_row, Body&& body) {
  const int64_t step = gridDim.y;
  for (int64_t r = blockIdx.y; r < rows; r += N * step)
    for (int64_t c = blockIdx.x * int64_t{kThreads} + threadIdx.x; c < chunks_per_row; c += int64_t{gridDim.x} * kThreads)
      body(r, c, step);
}

// Row i of a step, counted from the top or (kReverse) from the bottom.
template <bool kReverse>
__device__ __forceinline__ int64_t step_row(int64_t rows, int64_t r, int i, int64_t step) {
  return kReverse ? rows - 1 - (r + i * step) : r + i * step;
}

// Loads chunk column c of the step's rows (all loads issued before any use).
template <bool kReverse, typename T, int N>
__device__ __forceinline__ void load_step(const Input<T>& in, int64_t r, int64_t c, int64_t step,
                                          typename Input<T>::Raw (&raw)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (r + i * step < in.rows) in.load_raw(step_row<kReverse>(in.rows, r, i, step), c * kChunk, raw[i]);
}

// Asks L2 (before the PDL wait: see prefetch_l2) or, after it, L1 for a line.
template <bool kToL1>
__device__ __forceinline__ void prefetch_line(const void* p) {
  if constexpr (kToL1)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
  else
    prefetch_l2(p);
}

// Before the PDL wait: asks L2 for the lines of the block's first step, one
// thread per 128-byte line. A prefetch is safe whatever the kernel before
// writes (see prefetch_l2); it lets the first bytes arrive while that kernel
// (for current scaling, the amax pass over the same tensor) finishes.
template <bool kReverse, int N, typename T, bool kToL1 = false>
__device__ __forceinline__ void prefetch_first_step(const Input<T>& in, int64_t chunks_per_row) {
  const int64_t c = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (threadIdx.x % kChunksPerLine<T> != 0 || c >= chunks_per_row || c * kChunk >= in.cols) return;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (blockIdx.y + int64_t{i} * gridDim.y < in.rows)
      prefetch_line<kToL1>(in.data + step_row<kReverse>(in.rows, blockIdx.y, i, gridDim.y) * in.row_stride + c * kChunk);
}

// Delayed scaling's bookkeeping, run by one whole block: pushes `newest` to the
// front of the history and recomputes *scale. The shift walks from the top down
// in block-sized windows so no entry is overwritten before it has been read.
__device__ void roll_history(float newest, float* history, int64_t len, float* scale, const ScaleRule& rule,
                             bool use_history_max, float* smem) {
  if (len <= 0) return;  // no history: both left alone, as the CPU op leaves them (uniform across the block)
  float hmax = 0.0f;
  for (int64_t hi = len - 1; hi >= 1; hi -= blockDim.x) {
    const int64_t i = hi - threadIdx.x;
    float prev = 0.0f;
    if (i >= 1) {
      prev = history[i - 1];
      hmax = fmaxf(hmax, prev);
    }
    __syncthreads();
    if (i >= 1) history[i] = prev;
    __syncthreads();
  }
  hmax = block_max(fmaxf(hmax, newest), smem);
  if (threadIdx.x == 0) {
    history[0] = newest;
    *scale = scale_from_amax(use_history_max ? hmax : newest, rule);
  }
}

struct DelayedUpdate {  // present only for delayed scaling
  float* history;
  int64_t len;
  float* scale;
  bool use_history_max;
};

// Quantizes every chunk with a scale read from device memory (or derived from
// an amax there), and block 0 records the scale it used and zeroes *zero_next
// (if given: the amax slot of the next eager call on the stream, see
// ZeroedAmaxSlots). With kReduceAmax it also reduces the amax of what it reads
// into workspace[0]; the last block to finish (counted in workspace[1]) then
// applies the delayed-scaling update.
template <typename T, Fp8Format F, bool kScaleFromAmax, bool kReduceAmax>
__global__ void __launch_bounds__(kThreads, 4) quantize_chunks_kernel(Input<T> in, Output out, int64_t chunks_per_row,
                                                                   const float* scale_or_amax, ScaleRule rule,
                                                                   float* scale_record, float* workspace,
                                                                   DelayedUpdate delayed, float* zero_next) {
  __shared__ float smem[32];
  __shared__ bool last_block;
  constexpr int N = kQuantizeRowsPerStep;
  // Current scaling's second pass walks the rows bottom-up, so it starts on
  // the rows the amax pass read last, some still in L2: top-down took 173.6 us
  // against 168.4 at 16384 x 8192 bf16 (H200, one process, 2026-12-02).
  constexpr bool kReverse = kScaleFromAmax;
  prefetch_first_step<kReverse, N>(in, chunks_per_row);
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): only the prefetch above comes before this
  // A grid of a block per row (row_step_grid_y's small-tensor case, or a
  // single row) asks L1 for the row's first chunks before reading the scale
  // (or amax): the two round trips overlap, and the loads below then hit.
  // Such a call is little more than those round trips. For larger grids the
  // prefetch cost 0.6-1.7 us at 16384 x 8192 (bench/NOTES.md, session 30).
  if (gridDim.y >= out.rows) prefetch_first_step<kReverse, 1, T, true>(in, chunks_per_row);
  const float s = kScaleFromAmax ? scale_from_amax(*scale_or_amax, rule) : *scale_or_amax;
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    if (scale_record) *scale_record = s;
    // After the PDL wait: the calls before on the stream, which wrote and read
    // this slot, have completed.
    if (zero_next) *zero_next = 0.0f;
  }
  const Scale scale(s);
  float amax = 0.0f;  // with infinities (NaNs skipped): a finite max is redone below only if needed
  for_each_chunk_step<N>(out.rows, chunks_per_row, [&](int64_t r, int64_t c, int64_t step) {
    typename Input<T>::Raw raw[N];
    load_step<kReverse>(in, r, c, step, raw);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (r + i * step >= out.rows) break;
      float v[kChunk];
      in.unpack(raw[i], v);
      if (kReduceAmax) amax = fmaxf(amax, chunk_abs_max(v));
      out.store(step_row<kReverse>(out.rows, r, i, step), c * kChunk, quantize_chunk<F>(v, scale));
    }
  });
  if (kReduceAmax && amax == INFINITY) {  // rare: this thread saw an Inf; re-read for the finite max
    amax = 0.0f;
    for_each_chunk_step<1>(out.rows, chunks_per_row, [&](int64_t r, int64_t c, int64_t) {
      float v[kChunk];
      in.load(r, c * kChunk, v);
      amax = fmaxf(amax, chunk_finite_max(v));
    });
  }
  if (!kReduceAmax) return;
  amax = block_max(amax, smem);
  if (threadIdx.x == 0) {
    atomic_max_nonneg(&workspace[0], amax);
    __threadfence();  // the amax is visible before this block counts as finished
    auto* done = reinterpret_cast<unsigned int*>(&workspace[1]);
    last_block = atomicAdd(done, 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const float total = *reinterpret_cast<volatile float*>(&workspace[0]);
  roll_history(total, delayed.history, delayed.len, delayed.scale, rule, delayed.use_history_max, smem);
}

// Loads the same bytes as load_step (the block's kThreads chunks of each of the
// step's rows), but thread t takes the block's 16-byte words t, t + kThreads,
// ...: each warp instruction reads 512 contiguous bytes instead of every other
// 16 bytes of 1 KB. Only a max is taken, so which elements a thread holds does
// not matter. For a block whose chunks lie wholly inside vector-loadable rows.
// Two passes at 16384 x 8192 bf16 on the H200: 168.4 against 168.6 us in a
// torch process, 164.7 against 165.1 standalone (bench/NOTES.md, session 30).
template <typename T, int N>
__device__ __forceinline__ void load_step_words(const Input<T>& in, int64_t r, int64_t c, int64_t step,
                                                typename Input<T>::Raw (&raw)[N]) {
  constexpr int kWords = Input<T>::kWords;
  const int64_t first_word = (c - threadIdx.x) * kWords + threadIdx.x;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (r + i * step >= in.rows) continue;
    const auto* row = reinterpret_cast<const uint4*>(in.data + (r + i * step) * in.row_stride);
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[i].words[w] = __ldcs(row + first_word + w * kThreads);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) amax_kernel(Input<T> in, int64_t chunks_per_row, float* amax_out) {
  __shared__ float smem[32];
  constexpr int N = kAmaxRowsPerStep<T>;
  prefetch_first_step<false, N>(in, chunks_per_row);
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): only the prefetch above comes before this
  float amax = 0.0f;
  for_each_chunk_step<N>(in.rows, chunks_per_row, [&](int64_t r, int64_t c, int64_t step) {
    typename Input<T>::Raw raw[N];
    // Streaming (evict-first) like every other pass: cached loads, meant to leave
    // the tail in L2 for the quantize pass, made the two passes 169.5 us
    // instead of 160 at 16384 x 8192 bf16 (H200, 2026-11-30), and keeping rows
    // evict-last for it was slower still (bench/NOTES.md, sessions 8, 16 and 30).
    const int64_t block_end = (c - threadIdx.x + kThreads) * kChunk;  // past the block's last element
    if (in.vec && block_end <= in.cols)
      load_step_words(in, r, c, step, raw);
    else
      load_step<false>(in, r, c, step, raw);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (r + i * step >= in.rows) break;
      float v[kChunk];
      in.unpack(raw[i], v);
      amax = fmaxf(amax, chunk_amax(v));
    }
  });
  amax = block_max(amax, smem);
  if (threadIdx.x == 0) atomic_max_nonneg(amax_out, amax);
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) cast_kernel(Input<T> in, Output out, int64_t chunks_per_row, bool saturate) {
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  auto cast_row = [&](int64_t r, int64_t c0) {
    float v[kChunk];
    in.load(r, c0, v);
    Codes q;
    if (saturate) {
#pragma unroll
      for (int j = 0; j < kChunk; j += 4) q.words[j / 4] = encode4_saturate<F, true>(v + j);
    } else {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) q.bytes[j] = encode_fp8(v[j], F);
    }
    out.store(r, c0, q);
  };
  for_each_chunk_step<1>(out.rows, chunks_per_row, [&](int64_t r, int64_t c, int64_t) { cast_row(r, c * kChunk); });
}

int64_t write_chunks_per_row(const Fp8Matrix& q) { return ceil_div(q.padded_cols, kChunk); }

// Zeroes the amax workspace. A kernel rather than cudaMemsetAsync so that the
// whole chain (kernel before, zeroing, amax pass, quantize pass) is linked by
// PDL: it lets the next kernel launch before it waits (the next one still
// waits for it to complete, and so for everything before), so the amax pass's
// blocks become resident and prefetch while the kernel before drains. Every
// thread waits before it exits: the next kernel's wait covers the kernel
// before this one only through this one's completion.
__global__ void zero_workspace_kernel(float* workspace, int n) {
  allow_next_kernel_launch();
  wait_for_prior_kernels();
  if (static_cast<int>(threadIdx.x) < n) workspace[threadIdx.x] = 0.0f;
}

cudaError_t zero_workspace(float* workspace, int n, cudaStream_t stream) {
  static_assert(kAmaxWorkspaceFloats <= 32, "one warp zeroes the workspace");
  return launch(zero_workspace_kernel, dim3(1), dim3(32), stream, workspace, n);
}

}  // namespace

#define FP8EXT_TYPES(in, fmt) typename decltype(in)::Element, decltype(fmt)::value

cudaError_t cast_to_fp8(const ConstMatrix& x, const Fp8Matrix& q, bool saturate, cudaStream_t stream) {
  const int64_t chunks = write_chunks_per_row(q);
  if (chunks * q.rows == 0) return cudaSuccess;
  const Output out = make_output(q);
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    err = launch(cast_kernel<FP8EXT_TYPES(in, fmt)>, grid_blocks(q.rows, chunks, kQuantizeRowsPerStep), dim3(kThreads),
                 stream, in, out, chunks, saturate);
  });
  return err;
}

cudaError_t quantize_with_scale(const ConstMatrix& x, const float* scale, const Fp8Matrix& q,
                                cudaStream_t stream) {
  const int64_t chunks = write_chunks_per_row(q);
  if (chunks * q.rows == 0) return cudaSuccess;
  const Output out = make_output(q);
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    err = launch(quantize_chunks_kernel<FP8EXT_TYPES(in, fmt), false, false>,
                 grid_blocks(q.rows, chunks, kQuantizeRowsPerStep), dim3(kThreads), stream, in, out, chunks, scale,
                 ScaleRule{}, nullptr, nullptr, DelayedUpdate{}, nullptr);
  });
  return err;
}

cudaError_t quantize_per_tensor(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                float* scale_out, float* amax_workspace, cudaStream_t stream,
                                ZeroedAmaxSlots* slots) {
  if (slots) slots->used = false;
  if (x.rows * x.cols > 0 && detail::per_tensor_fits_one_pass(x, q))
    return detail::quantize_per_tensor_one_pass(x, rule, q, scale_out, stream);
  const bool kept = detail::per_tensor_fits_kept_pass(x, q);
  if (slots && !kept && (!slots->amax || !slots->zero_next || slots->amax == slots->zero_next))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  float* zero_next = nullptr;
  if (slots && !kept) {  // the two passes on a slot the caller keeps zeroed: no zeroing kernel
    amax_workspace = slots->amax;
    zero_next = slots->zero_next;
  } else {
    err = zero_workspace(amax_workspace, kept ? kAmaxWorkspaceFloats : 1, stream);
  }
  if (err != cudaSuccess) return err;
  if (kept) return detail::quantize_per_tensor_kept(x, rule, q, scale_out, amax_workspace, stream);
  const int64_t chunks = write_chunks_per_row(q);
  const int64_t read_chunks = ceil_div(x.cols, kChunk);
  dispatch(x, q.format, [&](auto in, auto fmt) {
    using T = typename decltype(in)::Element;
    if (read_chunks * x.rows > 0)
      err = launch(amax_kernel<T>, grid_blocks(x.rows, read_chunks, kAmaxRowsPerStep<T>, kCurrentScalingBlocksPerSm),
                   dim3(kThreads), stream, in, read_chunks, amax_workspace);
    // Runs even for an empty tensor: block 0 writes the scale (1 for amax 0).
    if (err == cudaSuccess)
      err = launch(quantize_chunks_kernel<FP8EXT_TYPES(in, fmt), true, false>,
                   grid_blocks(q.rows, chunks, kQuantizeRowsPerStep, kCurrentScalingBlocksPerSm), dim3(kThreads),
                   stream, in, make_output(q), chunks, amax_workspace, rule, scale_out, nullptr, DelayedUpdate{},
                   zero_next);
    // Launched: the amax slot is now written and zero_next zeroed, both in stream order.
    if (err == cudaSuccess && zero_next) slots->used = true;
  });
  return err;
}

cudaError_t quantize_delayed(const ConstMatrix& x, const ScaleRule& rule, bool use_history_max,
                             float* amax_history, int64_t history_len, float* scale,
                             const Fp8Matrix& q, float* scale_used, float* amax_workspace,
                             cudaStream_t stream) {
  cudaError_t err = zero_workspace(amax_workspace, kAmaxWorkspaceFloats, stream);
  if (err != cudaSuccess) return err;
  const int64_t chunks = write_chunks_per_row(q);
  const DelayedUpdate update{amax_history, history_len, scale, use_history_max};
  dispatch(x, q.format, [&](auto in, auto fmt) {
    // An empty tensor still launches one block, which records amax 0.
    err = launch(quantize_chunks_kernel<FP8EXT_TYPES(in, fmt), false, true>,
                 grid_blocks(q.rows, chunks, kQuantizeRowsPerStep), dim3(kThreads), stream, in, make_output(q), chunks,
                 scale, rule, scale_used, amax_workspace, update, nullptr);
  });
  return err;
}

#undef FP8EXT_TYPES

}  // namespace fp8ext::cuda

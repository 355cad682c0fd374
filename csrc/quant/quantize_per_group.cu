// 1x128 group scaling (DeepSeek-V3 activations): 8 threads per group, one
// 16-element chunk each, so a group is read once and its amax is a 3-step
// shuffle. Scales are written M-major (scale(r, g) at g * padded_rows + r), the
// layout the block-wise GEMM reads; padding rows get 0.
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kLanesPerGroup = static_cast<int>(kGroupSize) / kChunk;  // 8
constexpr int kGroupsPerBlock = kThreads / kLanesPerGroup;             // 32

// Finishes group g of row r from its loaded chunks: amax across the group's
// lanes, the scale, the FP8 codes.
template <typename T, Fp8Format F>
__device__ __forceinline__ void quantize_group(const typename Input<T>::Raw& raw, const Output& out,
                                               const ScaleRule& rule, int64_t g, int64_t r, int lane,
                                               bool active, int64_t rows, int64_t padded_rows, float* scales) {
  float v[kChunk];
  Input<T>::unpack(raw, v);
  float amax = active ? chunk_amax(v) : 0.0f;
#pragma unroll
  for (int o = kLanesPerGroup / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (!active) return;
  const float s = scale_from_amax_fast<F>(amax, rule);
  if (lane == 0) {
    scales[g * padded_rows + r] = s;
    if (r == rows - 1)
      for (int64_t pr = rows; pr < padded_rows; ++pr) scales[g * padded_rows + pr] = 0.0f;
  }
  const int64_t c0 = g * kGroupSize + lane * kChunk;
  if (c0 < out.padded_cols) {
    out.store(r, c0, quantize_chunk<F>(v, Scale(s)));
  }
}

// Groups of a row along x, rows along y: a few rows a step (all loaded before
// any is finished), grid-stride over a few blocks per SM.
template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) quantize_per_group_kernel(Input<T> in, Output out, ScaleRule rule,
                                                                      int64_t groups, int64_t padded_rows,
                                                                      float* scales) {
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  constexpr int N = kQuantizeRowsPerStep;
  const int64_t g = blockIdx.x * int64_t{kGroupsPerBlock} + threadIdx.x / kLanesPerGroup;
  const int lane = threadIdx.x % kLanesPerGroup;
  const bool active = g < groups;
  const int64_t c0 = g * kGroupSize + lane * kChunk;
  const int64_t step = gridDim.y;
  for (int64_t r = blockIdx.y; r < in.rows; r += N * step) {
    typename Input<T>::Raw raw[N] = {};
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (active && r + i * step < in.rows) in.load_raw(r + i * step, c0, raw[i]);
#pragma unroll
    for (int i = 0; i < N; ++i)  // the row test is uniform across the block: shuffles stay converged
      if (r + i * step < in.rows)
        quantize_group<T, F>(raw[i], out, rule, g, r + i * step, lane, active, in.rows, padded_rows, scales);
  }
}

}  // namespace

cudaError_t quantize_per_group(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                               float* group_scales, cudaStream_t stream) {
  const int64_t groups = ceil_div(x.cols, kGroupSize);
  const int64_t padded_rows = round_up(x.rows, kGroupScaleRowAlign);
  const int64_t total = x.rows * groups;
  if (total > 0) {
    const Output out = make_output(q);
    cudaError_t err = cudaSuccess;
    dispatch(x, q.format, [&](auto in, auto fmt) {
      const int64_t x_blocks = ceil_div(groups, kGroupsPerBlock);
      const dim3 grid(static_cast<unsigned>(x_blocks),
                      row_step_grid_y(x.rows, x_blocks, kQuantizeRowsPerStep, kRowStepBlocksPerSm));
      err = launch(quantize_per_group_kernel<typename decltype(in)::Element, decltype(fmt)::value>, grid,
                   dim3(kThreads), stream, in, out, rule, groups, padded_rows, group_scales);
    });
    if (err != cudaSuccess) return err;
  }
  // K padding beyond the last group (pad_k_to > 128) is not covered by any group.
  const int64_t covered = std::min(groups * kGroupSize, q.padded_cols);
  if (q.padded_cols > covered && q.rows > 0)
    return cudaMemset2DAsync(q.data + covered, q.padded_cols, 0, q.padded_cols - covered, q.rows, stream);
  return cudaSuccess;
}

}  // namespace fp8ext::cuda

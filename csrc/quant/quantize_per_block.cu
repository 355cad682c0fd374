// 128x128 block scaling (weights, once at load time): one 512-thread block per
// tile. Thread t owns chunk column t % 8 of rows t / 8 + 64 i (i < 2): 32 raw
// input values kept in registers between the tile's amax and its quantization,
// and each 8-thread row segment reads 256 contiguous bytes.
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 512;
constexpr int kChunkCols = static_cast<int>(kGroupSize) / kChunk;  // 8
constexpr int kRowStep = kThreads / kChunkCols;                    // 64
constexpr int kRowsPerThread = static_cast<int>(kGroupSize) / kRowStep;  // 2

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) quantize_per_block_kernel(Input<T> in, Output out, ScaleRule rule,
                                                                      int64_t block_cols, float* scales) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t br = blockIdx.y, bc = blockIdx.x;
  const int64_t c0 = bc * kGroupSize + (threadIdx.x % kChunkCols) * kChunk;
  const int64_t r0 = br * kGroupSize + threadIdx.x / kChunkCols;
  typename Input<T>::Raw raw[kRowsPerThread] = {};  // half the registers of floats for 16-bit types
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {  // all loads first, so they are in flight together
    const int64_t r = r0 + int64_t{i} * kRowStep;
    if (r < in.rows) in.load_raw(r, c0, raw[i]);
  }
  const float amax = raw_chunks_amax<T>(raw);  // rows past the end hold zeros
  const float s = scale_from_amax(block_max(amax, smem), rule);
  if (threadIdx.x == 0) scales[br * block_cols + bc] = s;
  const Scale scale(s);
  if (c0 >= out.padded_cols) return;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = r0 + int64_t{i} * kRowStep;
    if (r < in.rows) {
      float v[kChunk];
      in.unpack(raw[i], v);
      out.store(r, c0, quantize_chunk<F>(v, scale));
    }
  }
}

}  // namespace

cudaError_t quantize_per_block(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                               float* block_scales, cudaStream_t stream) {
  const int64_t block_rows = ceil_div(x.rows, kGroupSize);
  const int64_t block_cols = ceil_div(x.cols, kGroupSize);
  if (block_rows > 65535) return cudaErrorInvalidValue;  // grid.y limit: 8M rows
  if (block_rows > 0 && block_cols > 0) {
    const Output out = make_output(q);
    const dim3 grid(static_cast<unsigned>(block_cols), static_cast<unsigned>(block_rows));
    cudaError_t err = cudaSuccess;
    dispatch(x, q.format, [&](auto in, auto fmt) {
      err = launch(quantize_per_block_kernel<typename decltype(in)::Element, decltype(fmt)::value>, grid,
                   dim3(kThreads), stream, in, out, rule, block_cols, block_scales);
    });
    if (err != cudaSuccess) return err;
  }
  const int64_t covered = std::min(block_cols * kGroupSize, q.padded_cols);
  if (q.padded_cols > covered && q.rows > 0)
    return cudaMemset2DAsync(q.data + covered, q.padded_cols, 0, q.padded_cols - covered, q.rows, stream);
  return cudaSuccess;
}

}  // namespace fp8ext::cuda

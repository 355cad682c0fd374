// Per-row (per-token / per-channel) scaling: one block per row. Each thread
// keeps up to kCached chunks in registers between the amax and the quantize
// step, so rows up to kMaxThreads * 16 * 2 = 16384 elements are read from
// memory once; longer rows read their tail twice (the second read mostly hits
// L2). 512 threads, not 256, so that Llama-3.1-8B's down projection (K =
// 14336) is read once: with 256 the re-read tail was a second dependent round
// trip. H200, graph-timed, bf16 in (bench/NOTES.md, session 18; two processes):
// 16 x 14336 3.64 -> 2.73 us (16 x 4096: 1.93), 4096 x 14336 57.9 -> 54.6,
// 1024 x 14336 14.6 -> 15.2.
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kCached = 2;
constexpr int kMaxThreads = 512;  // the bound keeps 128 registers: fp32 input needs 73

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kMaxThreads) quantize_per_row_kernel(Input<T> in, Output out, ScaleRule rule,
                                                                       float* row_scales) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t r = blockIdx.x;
  const int64_t read_chunks = ceil_div(in.cols, kChunk);
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  typename Input<T>::Raw cache[kCached];  // raw input: half the registers of floats for 16-bit types
  load_row_chunks(in, r, read_chunks, cache);
  float amax = raw_chunks_amax<T>(cache);
  for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < read_chunks; c += blockDim.x) {
    float v[kChunk];
    in.load(r, c * kChunk, v);
    amax = fmaxf(amax, chunk_amax(v));
  }
  const float s = scale_from_amax(block_max(amax, smem), rule);
  if (threadIdx.x == 0) row_scales[r] = s;
  const Scale scale(s);
#pragma unroll
  for (int k = 0; k < kCached; ++k) {
    const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
    if (c < write_chunks) {
      float v[kChunk];
      in.unpack(cache[k], v);  // chunks past cols hold zeros
      out.store(r, c * kChunk, quantize_chunk<F>(v, scale));
    }
  }
  for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < write_chunks; c += blockDim.x) {
    float v[kChunk];
    in.load(r, c * kChunk, v);
    out.store(r, c * kChunk, quantize_chunk<F>(v, scale));
  }
}

}  // namespace

cudaError_t quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                             float* row_scales, cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  // Enough threads for the row, in whole warps, at most kMaxThreads.
  const int64_t chunks = std::max<int64_t>(1, ceil_div(q.padded_cols, kChunk));
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, round_up(ceil_div(chunks, kCached), 32)));
  const Output out = make_output(q);
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    err = launch(quantize_per_row_kernel<typename decltype(in)::Element, decltype(fmt)::value>,
                 dim3(static_cast<unsigned>(x.rows)), dim3(threads), stream, in, out, rule, row_scales);
  });
  return err;
}

}  // namespace fp8ext::cuda

// RMSNorm fused with per-token quantization, one block per row: what a
// decoder layer feeds its FP8 projections, in one launch where the unfused
// path takes the norm, the weight multiply and the quantize kernel.
//   y = w * T(x * rsqrt(mean(x^2) + eps))   (Hugging Face Llama's rounding:
//                                             normalized in fp32, rounded to
//                                             x's type, then times the weight)
//   q = per-row quantization of y, as quantize_per_row.
// The row stays in registers (up to kCached chunks per thread) across the
// three steps: sum of squares, amax of y, quantization; longer rows re-read
// their tail, mostly from L2.
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "row_quantize.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kCached = 2;

// y of one chunk at column c0 from its input values; columns past `cols` are 0
// (the K padding), also when the row's norm is NaN.
template <typename T>
__device__ __forceinline__ void normalize_chunk(const float (&x)[kChunk], const Input<T>& weight, int64_t c0,
                                                float inv_rms, float (&y)[kChunk]) {
  float w[kChunk];
  weight.load(0, c0, w);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float normed = to_float(from_float<T>(x[i] * inv_rms));
    y[i] = c0 + i < weight.cols ? to_float(from_float<T>(w[i] * normed)) : 0.0f;
  }
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(256) rms_norm_quantize_kernel(Input<T> in, Input<T> weight, float eps, Output out,
                                                                ScaleRule rule, float* row_scales) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t r = blockIdx.x;
  const int64_t read_chunks = ceil_div(in.cols, kChunk);
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  typename Input<T>::Raw cache[kCached];
  load_row_chunks(in, r, read_chunks, cache);
  auto squares = [](const float (&v)[kChunk]) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) s = fmaf(v[i], v[i], s);
    return s;
  };
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kCached; ++k) {
    float v[kChunk];
    Input<T>::unpack(cache[k], v);
    ss += squares(v);
  }
  for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < read_chunks; c += blockDim.x) {
    float v[kChunk];
    in.load(r, c * kChunk, v);
    ss += squares(v);
  }
  const float inv_rms = 1.0f / sqrtf(block_sum(ss, smem) / static_cast<float>(in.cols) + eps);

  // Calls fn(c0, y) for every written chunk of the row, cached ones first.
  auto for_each_y = [&](auto&& fn) {
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      if (c < write_chunks) {
        float v[kChunk], y[kChunk];
        Input<T>::unpack(cache[k], v);
        normalize_chunk(v, weight, c * kChunk, inv_rms, y);
        fn(c * kChunk, y);
      }
    }
    for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < write_chunks; c += blockDim.x) {
      float v[kChunk], y[kChunk];
      in.load(r, c * kChunk, v);
      normalize_chunk(v, weight, c * kChunk, inv_rms, y);
      fn(c * kChunk, y);
    }
  };
  quantize_row<F>(for_each_y, out, r, rule, row_scales, smem);
}

}  // namespace

cudaError_t rms_norm_quantize_per_row(const ConstMatrix& x, const void* weight, float eps, const ScaleRule& rule,
                                      const Fp8Matrix& q, float* row_scales, cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  const int64_t chunks = std::max<int64_t>(1, ceil_div(q.padded_cols, kChunk));
  const int threads = static_cast<int>(std::min<int64_t>(256, round_up(ceil_div(chunks, kCached), 32)));
  const Output out = make_output(q);
  const ConstMatrix w{weight, x.dtype, 1, x.cols, x.cols};
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    using T = typename decltype(in)::Element;
    err = launch(rms_norm_quantize_kernel<T, decltype(fmt)::value>, dim3(static_cast<unsigned>(x.rows)),
                 dim3(threads), stream, in, make_input<T>(w), eps, out, rule, row_scales);
  });
  return err;
}

}  // namespace fp8ext::cuda

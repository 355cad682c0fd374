// RMSNorm fused with per-token quantization, one block per row: what a
// decoder layer feeds its FP8 projections, in one launch where the unfused
// path takes the norm, the weight multiply and the quantize kernel.
//   y = w * T(x * rsqrt(mean(x^2) + eps))   (Hugging Face Llama's rounding:
//                                             normalized in fp32, rounded to
//                                             x's type, then times the weight)
//   q = per-row quantization of y, as quantize_per_row.
// The row stays in registers (up to kCached chunks per thread) across the
// three steps: sum of squares, amax of y, quantization; longer rows re-read
// their tail, mostly from L2. The residual variant first adds the sublayer's
// output to the residual stream (h = T(x + residual), written out: the next
// residual) and normalizes h, so a decoder's residual add is no launch of its own.
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

// The residual add of the kAdd variant: x + residual rounded to T (PyTorch's
// `x + residual`), written to sum_out [rows, cols] (contiguous).
template <typename T>
struct ResidualAdd {
  Input<T> residual;
  T* sum_out;

  // Loads chunk c0 of row r of x (`in`) and adds the residual's.
  __device__ __forceinline__ void load_sum(const Input<T>& in, int64_t r, int64_t c0, float (&v)[kChunk]) const {
    float res[kChunk];
    in.load(r, c0, v);
    residual.load(r, c0, res);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = to_float(from_float<T>(v[i] + res[i]));
  }

  // Writes chunk c0 of row r of the sum (v: values already in T).
  __device__ __forceinline__ void store(int64_t r, int64_t c0, const float (&v)[kChunk]) const {
    T* p = sum_out + r * residual.cols + c0;
    if (c0 + kChunk <= residual.cols && residual.vec) {
      typename Input<T>::Raw raw;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) raw.elems[i] = from_float<T>(v[i]);
#pragma unroll
      for (int i = 0; i < Input<T>::kWords; ++i) reinterpret_cast<uint4*>(p)[i] = raw.words[i];
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        if (c0 + i < residual.cols) p[i] = from_float<T>(v[i]);
    }
  }
};

template <typename T, Fp8Format F, bool kAdd>
__global__ void __launch_bounds__(256) rms_norm_quantize_kernel(Input<T> in, Input<T> weight, float eps, Output out,
                                                                ScaleRule rule, float* row_scales,
                                                                ResidualAdd<T> add) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t r = blockIdx.x;
  const int64_t read_chunks = ceil_div(in.cols, kChunk);
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  typename Input<T>::Raw cache[kCached];
  load_row_chunks(in, r, read_chunks, cache);
  if constexpr (kAdd) {  // the cached chunks become h = x + residual, written out once
    typename Input<T>::Raw res[kCached];
    load_row_chunks(add.residual, r, read_chunks, res);
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      float a[kChunk], b[kChunk];
      Input<T>::unpack(cache[k], a);
      Input<T>::unpack(res[k], b);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        cache[k].elems[i] = from_float<T>(a[i] + b[i]);
        a[i] = to_float(cache[k].elems[i]);
      }
      if (c < read_chunks) add.store(r, c * kChunk, a);
    }
  }
  // Loads chunk c0 of the row being normalized (x, or x + residual) past the cached ones.
  auto load_tail = [&](int64_t c0, float (&v)[kChunk]) {
    if constexpr (kAdd) {
      add.load_sum(in, r, c0, v);
    } else {
      in.load(r, c0, v);
    }
  };
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
    load_tail(c * kChunk, v);
    if constexpr (kAdd) add.store(r, c * kChunk, v);
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
      load_tail(c * kChunk, v);
      normalize_chunk(v, weight, c * kChunk, inv_rms, y);
      fn(c * kChunk, y);
    }
  };
  quantize_row<F>(for_each_y, out, r, rule, row_scales, smem);
}

}  // namespace

namespace {

cudaError_t launch_rms_norm_quantize(const ConstMatrix& x, const void* residual, void* sum_out, const void* weight,
                                     float eps, const ScaleRule& rule, const Fp8Matrix& q, float* row_scales,
                                     cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  const int64_t chunks = std::max<int64_t>(1, ceil_div(q.padded_cols, kChunk));
  const int threads = static_cast<int>(std::min<int64_t>(256, round_up(ceil_div(chunks, kCached), 32)));
  const Output out = make_output(q);
  const ConstMatrix w{weight, x.dtype, 1, x.cols, x.cols};
  const ConstMatrix res{residual, x.dtype, x.rows, x.cols, x.cols};
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    using T = typename decltype(in)::Element;
    constexpr Fp8Format kF = decltype(fmt)::value;
    const dim3 grid(static_cast<unsigned>(x.rows)), block(threads);
    if (residual) {
      const ResidualAdd<T> add{make_input<T>(res), static_cast<T*>(sum_out)};
      err = launch(rms_norm_quantize_kernel<T, kF, true>, grid, block, stream, in, make_input<T>(w), eps, out, rule,
                   row_scales, add);
    } else {
      err = launch(rms_norm_quantize_kernel<T, kF, false>, grid, block, stream, in, make_input<T>(w), eps, out, rule,
                   row_scales, ResidualAdd<T>{});
    }
  });
  return err;
}

}  // namespace

cudaError_t rms_norm_quantize_per_row(const ConstMatrix& x, const void* weight, float eps, const ScaleRule& rule,
                                      const Fp8Matrix& q, float* row_scales, cudaStream_t stream) {
  return launch_rms_norm_quantize(x, nullptr, nullptr, weight, eps, rule, q, row_scales, stream);
}

cudaError_t add_rms_norm_quantize_per_row(const ConstMatrix& x, const void* residual, void* sum_out,
                                          const void* weight, float eps, const ScaleRule& rule, const Fp8Matrix& q,
                                          float* row_scales, cudaStream_t stream) {
  if (!residual || !sum_out) return cudaErrorInvalidValue;
  return launch_rms_norm_quantize(x, residual, sum_out, weight, eps, rule, q, row_scales, stream);
}

}  // namespace fp8ext::cuda

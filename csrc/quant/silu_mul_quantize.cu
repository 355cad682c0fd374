// SwiGLU's activation fused with per-token quantization, one block per row:
// the input of a Llama MLP's down projection, from its gate_up output
// x = [gate | up] ([M, 2I]), in one launch where the unfused path takes three
// (silu, multiply, quantize):
//   y = T(T(silu(gate)) * up)   (silu in fp32 and rounded to x's type T, then
//                                the multiply rounded to T, as PyTorch does)
//   q = per-row quantization of y, as quantize_per_row.
// Each thread loads its own chunk of gate and up and keeps its y (in T: y is
// rounded to T anyway), so a row of up to kThreads chunks (I = 16384) costs
// one round trip to memory, and each step's code exists once: at decode sizes
// (M = 1, one block) latency and the instruction cache are the cost (see
// quantize_chunk). Longer rows recompute the tail's y for the quantize step.
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "row_quantize.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 1024, kCached = 1;

template <typename T>
__device__ __forceinline__ void silu_mul_chunk(const float (&g)[kChunk], const float (&u)[kChunk], int64_t c0,
                                               int64_t cols, float (&y)[kChunk]) {
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float silu = to_float(from_float<T>(g[i] / (1.0f + expf(-g[i]))));
    y[i] = c0 + i < cols ? to_float(from_float<T>(silu * u[i])) : 0.0f;
  }
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) silu_mul_quantize_kernel(Input<T> gate, Input<T> up, Output out,
                                                                     ScaleRule rule, float* row_scales) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t r = blockIdx.x;
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  using Raw = typename Input<T>::Raw;
  Raw y_cached[kCached];
  {
    Raw g_raw[kCached], u_raw[kCached];  // zeros past the row's end
    load_row_chunks<true>(gate, r, write_chunks, g_raw);
    load_row_chunks<true>(up, r, write_chunks, u_raw);
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      float g[kChunk], u[kChunk], y[kChunk];
      Input<T>::unpack(g_raw[k], g);
      Input<T>::unpack(u_raw[k], u);
      silu_mul_chunk<T>(g, u, (threadIdx.x + int64_t{k} * blockDim.x) * kChunk, gate.cols, y);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) y_cached[k].elems[i] = from_float<T>(y[i]);  // exact: y is in T
    }
  }
  // Calls fn(c0, y) for every written chunk of the row, cached ones first.
  auto for_each_y = [&](auto&& fn) {
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      if (c < write_chunks) {
        float y[kChunk];
        Input<T>::unpack(y_cached[k], y);
        fn(c * kChunk, y);
      }
    }
    for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < write_chunks; c += blockDim.x) {
      float g[kChunk], u[kChunk], y[kChunk];
      gate.template load<true>(r, c * kChunk, g);
      up.template load<true>(r, c * kChunk, u);
      silu_mul_chunk<T>(g, u, c * kChunk, gate.cols, y);
      fn(c * kChunk, y);
    }
  };
  quantize_row<F>(for_each_y, out, r, rule, row_scales, smem);
}

}  // namespace

cudaError_t silu_mul_quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                      float* row_scales, cudaStream_t stream) {
  if (x.cols % 2 != 0) return cudaErrorInvalidValue;
  if (x.rows == 0) return cudaSuccess;
  const int64_t half = x.cols / 2;
  const int64_t chunks = std::max<int64_t>(1, ceil_div(q.padded_cols, kChunk));
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, round_up(ceil_div(chunks, kCached), 32)));
  const Output out = make_output(q);
  const size_t elem = x.dtype == DType::kFloat32 ? 4 : 2;
  const ConstMatrix gate{x.data, x.dtype, x.rows, half, x.row_stride};
  const ConstMatrix up{static_cast<const char*>(x.data) + half * elem, x.dtype, x.rows, half, x.row_stride};
  cudaError_t err = cudaSuccess;
  dispatch(gate, q.format, [&](auto in_gate, auto fmt) {
    using T = typename decltype(in_gate)::Element;
    err = launch(silu_mul_quantize_kernel<T, decltype(fmt)::value>, dim3(static_cast<unsigned>(x.rows)),
                 dim3(threads), stream, in_gate, make_input<T>(up), out, rule, row_scales);
  });
  return err;
}

}  // namespace fp8ext::cuda

// SwiGLU's activation fused with per-token quantization, one block per row:
// the input of a Llama MLP's down projection, from its gate_up output
// x = [gate | up] ([M, 2I]), in one launch where the unfused path takes three
// (silu, multiply, quantize):
//   y = T(T(silu(gate)) * up)   (silu in fp32 and rounded to x's type T, then
//                                the multiply rounded to T, as PyTorch does)
//   q = per-row quantization of y, as quantize_per_row.
// y is recomputed for the quantize step from the input rather than held in
// registers (a row is a few KB; the second read is mostly an L2 hit).
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "row_quantize.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(256) silu_mul_quantize_kernel(Input<T> gate, Input<T> up, Output out,
                                                                ScaleRule rule, float* row_scales) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t r = blockIdx.x;
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  auto for_each_y = [&](auto&& fn) {
    for (int64_t c = threadIdx.x; c < write_chunks; c += blockDim.x) {
      float g[kChunk], u[kChunk], y[kChunk];
      gate.load(r, c * kChunk, g);  // zeros past the row's end
      up.load(r, c * kChunk, u);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const float silu = to_float(from_float<T>(g[i] / (1.0f + expf(-g[i]))));
        y[i] = c * kChunk + i < gate.cols ? to_float(from_float<T>(silu * u[i])) : 0.0f;
      }
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
  const int threads = static_cast<int>(std::min<int64_t>(256, round_up(chunks, 32)));
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

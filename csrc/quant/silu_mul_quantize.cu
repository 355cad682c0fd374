// SwiGLU's activation fused with per-token quantization, one block per row:
// the input of a Llama MLP's down projection, from its gate_up output
// x = [gate | up] ([M, 2I]), in one launch where the unfused path takes three
// (silu, multiply, quantize):
//   y = T(T(silu(gate)) * up)   (silu in fp32 and rounded to x's type T, then
//                                the multiply rounded to T, as PyTorch does;
//                                silu itself to within 2^-17, see silu())
//   q = per-row quantization of y, as quantize_per_row.
// Each thread loads its own chunk of gate and up and keeps its y (in T: y is
// rounded to T anyway), so a row of up to kThreads chunks (I = 16384) costs
// one round trip to memory, and each step's code exists once: at decode sizes
// (M = 1, one block) latency and the instruction cache are the cost (see
// quantize_chunk). Longer rows recompute the tail's y for the quantize step.
// With many rows each block also asks L2 for the row that the block taking its
// place will read (see prefetch_next_wave).
#include <algorithm>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "row_quantize.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 1024, kCached = 1;

// Rows go to SMs in block order as blocks finish (what the hardware does, not
// a documented guarantee), so the block that takes block r's place reads about
// row r + wave (wave: the blocks resident at once). Block r asks L2 for that
// row's gate and up (adjacent halves of one row of x), a 128-byte line per
// thread per step, and does not wait: the loads then overlap this block's
// compute, reduction and stores, which a block holding a whole SM (I ~ 14K:
// 896 threads of 64 registers) otherwise leaves without loads in flight.
// wave = 0: no prefetch. The host asks CUDA for the wave (resident_wave): one
// block an SM at the kernel's ~62-64 registers and more than 512 threads.
template <typename T>
__device__ __forceinline__ void prefetch_next_wave(const Input<T>& gate, const Input<T>& up, int64_t r,
                                                   int64_t wave) {
  if (wave == 0 || r + wave >= gate.rows) return;
  prefetch_span_l2(gate.data + (r + wave) * gate.row_stride, up.data + (r + wave) * up.row_stride + up.cols);
}

// silu(g) = g / (1 + e^-g) on the special-function unit: e^-g as 2^(-g log2(e))
// and an approximate reciprocal, 6 instructions where expf and the IEEE
// division took ~25 and made this kernel issue-bound (bench/NOTES.md, session
// 37). Relative error below 2^-17 where silu is a normal float: a few fp32 ulp
// at |g| ~ 1, growing with |g| as g log2(e) is rounded (~90 ulp near g = -88),
// so a silu rounded to bf16 or fp16 rarely moves. The IEEE expression's edges
// hold: the reciprocal is taken of (1 + e) / 4 so that it stays normal up to
// e = 2^128 (r / 4, subnormal for -88.7 < g < -87.3, is kept: the build does
// not flush, so silu stays a tiny normal value there); e^-g = inf gives -0
// for finite g and NaN for g = -inf; +inf gives +inf. A subnormal e (g > 87)
// is flushed: 1 + e rounds to 1 anyway.
__device__ __forceinline__ float silu(float g) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.44269504088896341f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fmaf(e, 0.25f, 0.25f)));  // exact: (1 + e) / 4
  return g * (r * 0.25f);
}

// A chunk of y = T(T(silu(g)) * u), kept in T (y is rounded to T anyway);
// zeros past the row's end.
template <typename T>
__device__ __forceinline__ typename Input<T>::Raw silu_mul_chunk(const typename Input<T>::Raw& g,
                                                                 const typename Input<T>::Raw& u, int64_t c0,
                                                                 int64_t cols) {
  return rounded_product_chunk<T>(g, u, c0, cols, [](float v) { return silu(v); });
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) silu_mul_quantize_kernel(Input<T> gate, Input<T> up, Output out,
                                                                     ScaleRule rule, float* row_scales,
                                                                     int64_t wave) {
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t r = blockIdx.x;
  prefetch_next_wave(gate, up, r, wave);
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  using Raw = typename Input<T>::Raw;
  Raw y_cached[kCached];
  {
    Raw g_raw[kCached], u_raw[kCached];  // zeros past the row's end
    if constexpr (sizeof(T) == 2) {  // both in flight before either is waited for
      issue_row_chunks(gate, r, write_chunks, g_raw);
      issue_row_chunks(up, r, write_chunks, u_raw);
      finish_row_chunks<true>(gate, r, write_chunks, g_raw);
      finish_row_chunks<true>(up, r, write_chunks, u_raw);
    } else {  // fp32: one operand at a time, as before (four-word chunks, at the 64-register cap)
      load_row_chunks<true>(gate, r, write_chunks, g_raw);
      load_row_chunks<true>(up, r, write_chunks, u_raw);
    }
#pragma unroll
    for (int k = 0; k < kCached; ++k)
      y_cached[k] = silu_mul_chunk<T>(g_raw[k], u_raw[k], (threadIdx.x + int64_t{k} * blockDim.x) * kChunk, gate.cols);
  }
  // Calls fn(c0, y) for every written chunk of the row, cached ones first.
  auto for_each_y = [&](auto&& fn) {
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      if (c < write_chunks) fn(c * kChunk, y_cached[k]);
    }
    for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < write_chunks; c += blockDim.x) {
      Raw g, u;
      gate.template load_raw<true>(r, c * kChunk, g);
      up.template load_raw<true>(r, c * kChunk, u);
      fn(c * kChunk, silu_mul_chunk<T>(g, u, c * kChunk, gate.cols));
    }
  };
  quantize_row<F, T>(for_each_y, out, r, rule, row_scales, smem);
}

}  // namespace

cudaError_t silu_mul_quantize_per_row(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                      float* row_scales, cudaStream_t stream) {
  if (x.cols % 2 != 0) return cudaErrorInvalidValue;
  if (x.rows == 0) return cudaSuccess;
  const int64_t half = x.cols / 2;
  const int64_t chunks = std::max<int64_t>(1, ceil_div(q.padded_cols, kChunk));
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, round_up(ceil_div(chunks, kCached), 32)));
  // The prefetch pays where one block holds an SM with one chunk a thread
  // (8K < padded I <= 16K, 16-bit input) and there are four waves of rows or
  // more: on an H100, 2048 x 14336 bf16 took 66.9 us against 72.8 without it,
  // 4096 rows 123.5 against 139.4; it lost 1-8% with fewer rows, with two chunks
  // a thread (I = 28672) and at I = 4096, and 16% with fp32 (bench/NOTES.md,
  // session 37).
  const bool prefetch = x.dtype != DType::kFloat32 && threads > kThreads / 2 && chunks <= threads &&
                        x.rows >= 4 * current_device_info().sm_count;
  const Output out = make_output(q);
  const int64_t elem = element_bytes(x.dtype);
  const ConstMatrix gate{x.data, x.dtype, x.rows, half, x.row_stride};
  const ConstMatrix up{static_cast<const char*>(x.data) + half * elem, x.dtype, x.rows, half, x.row_stride};
  cudaError_t err = cudaSuccess;
  dispatch(gate, q.format, [&](auto in_gate, auto fmt) {
    using T = typename decltype(in_gate)::Element;
    const auto kernel = silu_mul_quantize_kernel<T, decltype(fmt)::value>;
    const int64_t wave = prefetch ? resident_wave(kernel, threads) : 0;
    err = launch(kernel, dim3(static_cast<unsigned>(x.rows)), dim3(threads), stream, in_gate, make_input<T>(up), out,
                 rule, row_scales, x.rows >= 4 * wave ? wave : int64_t{0});
  });
  return err;
}

}  // namespace fp8ext::cuda

// SwiGLU's activation fused with per-token quantization, one block per row:
// the input of a Llama MLP's down projection, from its gate_up output
// x = [gate | up] ([M, 2I]), in one launch where the unfused path takes three
// (silu, multiply, quantize):
//   y = T(T(silu(gate)) * up)   (silu in fp32 and rounded to x's type T, then
//                                the multiply rounded to T, as PyTorch does;
//                                silu itself to within a few fp32 ulp)
//   q = per-row quantization of y, as quantize_per_row.
// Each thread loads its own chunk of gate and up and keeps its y (in T: y is
// rounded to T anyway), so a row of up to kThreads chunks (I = 16384) costs
// one round trip to memory, and each step's code exists once: at decode sizes
// (M = 1, one block) latency and the instruction cache are the cost (see
// quantize_chunk). Longer rows recompute the tail's y for the quantize step.
#include <algorithm>

#include "fp8ext/cp_async.cuh"
#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "row_quantize.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 1024, kCached = 1;

// silu(g) = g / (1 + e^-g) on the special-function unit: e^-g as 2^(-g log2(e))
// and an approximate reciprocal, 6 instructions where expf and the IEEE
// division took ~25 and made this kernel issue-bound (bench/NOTES.md, session
// 37). Within a few fp32 ulp of the IEEE expression, with its edge values:
// the reciprocal is taken of (1 + e) / 4 so that it stays normal up to
// e = 2^128 (subnormal silu for -88.7 < g < -87.3 kept; its flush-to-zero
// form costs nothing), e^-g = inf gives -0 for finite g and NaN for g = -inf,
// +inf gives +inf. A subnormal e (g > 87) is flushed: 1 + e rounds to 1 anyway.
__device__ __forceinline__ float silu(float g) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.44269504088896341f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fmaf(e, 0.25f, 0.25f)));  // exact: (1 + e) / 4
  return g * (r * 0.25f);
}

// Two floats rounded to T (to nearest even) in one instruction, and back.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using Packed = __nv_bfloat162;
  static __device__ __forceinline__ Packed round(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(Packed p) { return __bfloat1622float2(p); }
};
template <>
struct Pair<__half> {
  using Packed = __half2;
  static __device__ __forceinline__ Packed round(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(Packed p) { return __half22float2(p); }
};

// A chunk of y = T(T(silu(g)) * u), kept in T (y is rounded to T anyway);
// zeros past the row's end.
template <typename T>
__device__ __forceinline__ typename Input<T>::Raw silu_mul_chunk(const typename Input<T>::Raw& g,
                                                                 const typename Input<T>::Raw& u, int64_t c0,
                                                                 int64_t cols) {
  typename Input<T>::Raw y;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) y.elems[i] = silu(g.elems[i]) * u.elems[i];
  } else {
    using P = Pair<T>;
    const auto* g2 = reinterpret_cast<const typename P::Packed*>(g.elems);
    const auto* u2 = reinterpret_cast<const typename P::Packed*>(u.elems);
    auto* y2 = reinterpret_cast<typename P::Packed*>(y.elems);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
      const float2 gf = P::unpack(g2[i]), uf = P::unpack(u2[i]);
      const float2 sf = P::unpack(P::round(silu(gf.x), silu(gf.y)));
      y2[i] = P::round(sf.x * uf.x, sf.y * uf.y);
    }
  }
  if (c0 + kChunk > cols) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      if (c0 + i >= cols) y.elems[i] = T(0.0f);
  }
  return y;
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
    for (int k = 0; k < kCached; ++k)
      y_cached[k] = silu_mul_chunk<T>(g_raw[k], u_raw[k], (threadIdx.x + int64_t{k} * blockDim.x) * kChunk, gate.cols);
  }
  // Calls fn(c0, y) for every written chunk of the row, cached ones first.
  auto for_each_y = [&](auto&& fn) {
    float y[kChunk];
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      if (c < write_chunks) {
        Input<T>::unpack(y_cached[k], y);
        fn(c * kChunk, y);
      }
    }
    for (int64_t c = threadIdx.x + int64_t{kCached} * blockDim.x; c < write_chunks; c += blockDim.x) {
      Raw g, u;
      gate.template load_raw<true>(r, c * kChunk, g);
      up.template load_raw<true>(r, c * kChunk, u);
      Input<T>::unpack(silu_mul_chunk<T>(g, u, c * kChunk, gate.cols), y);
      fn(c * kChunk, y);
    }
  };
  quantize_row<F>(for_each_y, out, r, rule, row_scales, smem);
}

// Many rows: the kernel above holds an SM with one block (at I ~ 14K) that
// loads its row, waits, computes, reduces and stores, so the SM's loads stop
// between rows (1.5 TB/s at 2048 x 14336, bench/NOTES.md session 37). Here a
// block stays resident and walks rows r, r + grid, ...: each thread copies its
// own chunk of the next kStages rows into shared memory with cp.async while it
// works on the current one. A thread reads back only what it copied, so the
// stages need no barrier. For rows of whole 16-byte words with one chunk per
// thread (I <= 16384 for 16-bit inputs) whose stages fit in shared memory.
constexpr int kStages = 3;

template <typename T>
constexpr size_t pipeline_smem_bytes(int threads) {
  return size_t{kStages} * 2 * threads * kChunk * sizeof(T);
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) silu_mul_quantize_pipelined_kernel(Input<T> gate, Input<T> up,
                                                                               Output out, ScaleRule rule,
                                                                               float* row_scales) {
  constexpr int kWords = Input<T>::kWords;
  extern __shared__ uint4 stages[];  // [stage][gate, up][word][thread]: conflict-free 16-byte accesses
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  const int64_t c0 = int64_t{threadIdx.x} * kChunk;
  const bool writes = c0 < out.padded_cols;
  auto word = [&](int stage, int half, int w) { return stages + ((stage * 2 + half) * kWords + w) * blockDim.x + threadIdx.x; };
  // One commit group per row, also when there is nothing to copy, so that a
  // wait for "at most kStages - 1 in flight" means this row's copies landed.
  auto copy_row = [&](int64_t r, int stage) {
    if (writes && r < gate.rows) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        const int64_t col = c0 + w * (16 / int64_t{sizeof(T)});
        cp_async_16(word(stage, 0, w), gate.data + r * gate.row_stride + col, col < gate.cols);  // zeros past the end
        cp_async_16(word(stage, 1, w), up.data + r * up.row_stride + col, col < up.cols);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) copy_row(blockIdx.x + int64_t{s} * gridDim.x, s);
  int stage = 0;
  for (int64_t r = blockIdx.x; r < gate.rows; r += gridDim.x) {
    cp_async_wait<kStages - 1>();
    typename Input<T>::Raw g, u;
#pragma unroll
    for (int w = 0; w < kWords; ++w) g.words[w] = *word(stage, 0, w), u.words[w] = *word(stage, 1, w);
    copy_row(r + int64_t{kStages} * gridDim.x, stage);  // into the slot just read
    const auto y_raw = silu_mul_chunk<T>(g, u, c0, gate.cols);
    auto for_each_y = [&](auto&& fn) {
      if (!writes) return;
      float y[kChunk];
      Input<T>::unpack(y_raw, y);
      fn(c0, y);
    };
    quantize_row<F>(for_each_y, out, r, rule, row_scales, smem);
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  cp_async_wait<0>();  // no copy outlives the block
}

// Launches the pipelined kernel on a grid of the blocks that fit at once, or
// returns false (nothing launched) where it does not apply.
template <typename T, Fp8Format F>
bool launch_pipelined(const Input<T>& gate, const Input<T>& up, const Output& out, const ScaleRule& rule,
                      float* row_scales, int64_t chunks, cudaStream_t stream, cudaError_t& err) {
  constexpr int kMaxSmem = 226 * 1024;  // an sm_90 block's opt-in limit (227 KB) less the static smem
  const int threads = static_cast<int>(round_up(chunks, 32));
  const size_t smem = pipeline_smem_bytes<T>(threads);
  const DeviceInfo& device = current_device_info();
  if (!device.hopper() || !gate.vec || gate.cols % (16 / sizeof(T)) != 0 || chunks > kThreads || smem > kMaxSmem)
    return false;
  // Blocks an SM holds: 64 registers a thread (the launch bound) leaves it
  // 1024 threads; 228 KB of shared memory, 1 KB of it reserved per block.
  const int per_sm = std::min(kThreads / threads, static_cast<int>((228 * 1024) / (smem + 1024)));
  const int64_t resident = int64_t{device.sm_count} * std::max(per_sm, 1);
  if (gate.rows < 2 * resident) return false;  // fewer rows than two waves: nothing to overlap
  auto* kernel = silu_mul_quantize_pipelined_kernel<T, F>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);  // cheap; allowed under capture
  if (err != cudaSuccess) return true;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(resident));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  config.attrs = attr;
  config.numAttrs = pdl_attribute(attr[0]);
  err = cudaLaunchKernelEx(&config, kernel, gate, up, out, rule, row_scales);
  return true;
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
    constexpr Fp8Format kF = decltype(fmt)::value;
    if (launch_pipelined<T, kF>(in_gate, make_input<T>(up), out, rule, row_scales, chunks, stream, err)) return;
    err = launch(silu_mul_quantize_kernel<T, decltype(fmt)::value>, dim3(static_cast<unsigned>(x.rows)),
                 dim3(threads), stream, in_gate, make_input<T>(up), out, rule, row_scales);
  });
  return err;
}

}  // namespace fp8ext::cuda

// Building blocks of the quantization kernels: 8-element chunks loaded with
// 16-byte vector loads where alignment allows, the FP8 encoding of a chunk, and
// block-wide max reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda::detail {

constexpr int kChunk = 8;  // elements per thread-chunk: 16 B of bf16/fp16, 8 B of FP8

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// The input matrix, typed. `vec` says rows start 16-byte aligned, so a chunk
// starting at a multiple of 8 columns can be read with vector loads.
template <typename T>
struct Input {
  using Element = T;
  const T* data;
  int64_t rows, cols, row_stride;
  bool vec;

  __device__ __forceinline__ void load(int64_t r, int64_t c0, float (&v)[kChunk]) const {
    const T* p = data + r * row_stride + c0;
    if (vec && c0 + kChunk <= cols) {
      constexpr int kPer16B = 16 / sizeof(T);
#pragma unroll
      for (int i = 0; i < kChunk; i += kPer16B) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p + i));
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < kPer16B; ++j) v[i + j] = to_float(e[j]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = c0 + i < cols ? to_float(p[i]) : 0.0f;
    }
  }
};

// The FP8 output [rows, padded_cols]; columns past `cols` are written as zeros.
struct Output {
  uint8_t* data;
  int64_t rows, cols, padded_cols;
  bool vec;  // rows start 8-byte aligned

  __device__ __forceinline__ void store(int64_t r, int64_t c0, const uint8_t (&b)[kChunk]) const {
    uint8_t* p = data + r * padded_cols + c0;
    if (vec && c0 + kChunk <= padded_cols) {
      uint2 packed;
      uint8_t* pb = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) pb[i] = c0 + i < cols ? b[i] : 0;
      *reinterpret_cast<uint2*>(p) = packed;
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        if (c0 + i < padded_cols) p[i] = c0 + i < cols ? b[i] : 0;
    }
  }
};

// Saturating encode of two values. On sm_89+ the hardware conversion (RNE,
// satfinite: +-Inf and overflow -> +-max) does the work; it returns a positive
// canonical NaN, so NaN codes are patched to keep their sign like the CPU code.
template <Fp8Format F>
__device__ __forceinline__ void encode2_saturate(float a, float b, uint8_t& qa, uint8_t& qb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr __nv_fp8_interpretation_t kind = F == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const __nv_fp8x2_storage_t r = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
  qa = static_cast<uint8_t>(r & 0xFF);
  qb = static_cast<uint8_t>(r >> 8);
  if (a != a) qa = static_cast<uint8_t>((__float_as_uint(a) >> 24) & 0x80u) | 0x7Fu;
  if (b != b) qb = static_cast<uint8_t>((__float_as_uint(b) >> 24) & 0x80u) | 0x7Fu;
#else
  qa = encode_fp8_saturate(a, F);
  qb = encode_fp8_saturate(b, F);
#endif
}

// q = saturating_cast(v / scale) for a chunk; IEEE division as the CPU reference.
template <Fp8Format F>
__device__ __forceinline__ void quantize_chunk(const float (&v)[kChunk], float scale, uint8_t (&q)[kChunk]) {
#pragma unroll
  for (int i = 0; i < kChunk; i += 2)
    encode2_saturate<F>(__fdiv_rn(v[i], scale), __fdiv_rn(v[i + 1], scale), q[i], q[i + 1]);
}

__device__ __forceinline__ float chunk_amax(const float (&v)[kChunk]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) m = fmaxf(m, finite_abs(v[i]));
  return m;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Max over the block; every thread gets the result. `smem` holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();  // smem may still be read from a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? smem[lane] : 0.0f;
  return warp_max(v);
}

// Non-negative floats order like their bit patterns, so an unsigned atomicMax works.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

template <typename T>
Input<T> make_input(const ConstMatrix& x) {
  const bool vec = aligned(x.data, 16) && (x.rows <= 1 || (x.row_stride * sizeof(T)) % 16 == 0);
  return Input<T>{static_cast<const T*>(x.data), x.rows, x.cols, x.row_stride, vec};
}

inline Output make_output(const Fp8Matrix& q) {
  const bool vec = aligned(q.data, 8) && (q.rows <= 1 || q.padded_cols % 8 == 0);
  return Output{q.data, q.rows, q.cols, q.padded_cols, vec};
}

// Calls fn(Input<T>, std::integral_constant<Fp8Format, F>) for the runtime types.
template <typename Fn>
void dispatch(const ConstMatrix& x, Fp8Format f, Fn&& fn) {
  auto with_format = [&](auto in) {
    if (f == Fp8Format::kE4M3)
      fn(in, std::integral_constant<Fp8Format, Fp8Format::kE4M3>{});
    else
      fn(in, std::integral_constant<Fp8Format, Fp8Format::kE5M2>{});
  };
  switch (x.dtype) {
    case DType::kFloat32: with_format(make_input<float>(x)); break;
    case DType::kFloat16: with_format(make_input<__half>(x)); break;
    case DType::kBFloat16: with_format(make_input<__nv_bfloat16>(x)); break;
  }
}

inline int num_sms() {
  static int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 132;
  }();
  return sms;
}

}  // namespace fp8ext::cuda::detail

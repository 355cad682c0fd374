// Sums a split-K GEMM's fp32 partial products (split_k_reduce.h). Memory-bound
// and small (decode-sized M): each thread takes four columns of one row, issues
// the loads of every slice before it adds, and the grid has a block per 1024
// outputs, so all loads of the call are in flight at once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp8ext/cuda_launch.h"
#include "split_k_reduce.h"

namespace fp8ext::cuda::gemm {
namespace {

constexpr int kThreads = 256;

template <typename T>
struct Out4;  // four outputs, stored at once
template <>
struct Out4<float> {
  static __device__ __forceinline__ void store(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
  static __device__ __forceinline__ void add_bias(const float* b, float (&v)[4]) {
    const float4 x = *reinterpret_cast<const float4*>(b);
    v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w;
  }
};
template <typename H, typename H2, H2 (*kPack)(float2), float2 (*kUnpack)(H2)>
struct Out4Half {
  static __device__ __forceinline__ void store(H* p, const float (&v)[4]) {
    const H2 lo = kPack(make_float2(v[0], v[1])), hi = kPack(make_float2(v[2], v[3]));
    uint2 w;
    w.x = *reinterpret_cast<const uint32_t*>(&lo);
    w.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = w;
  }
  // The bias is added in fp32 before the one rounding, as the GEMM's epilogue does.
  static __device__ __forceinline__ void add_bias(const H* b, float (&v)[4]) {
    const uint2 w = *reinterpret_cast<const uint2*>(b);
    const float2 lo = kUnpack(*reinterpret_cast<const H2*>(&w.x)), hi = kUnpack(*reinterpret_cast<const H2*>(&w.y));
    v[0] += lo.x, v[1] += lo.y, v[2] += hi.x, v[3] += hi.y;
  }
};
__device__ __forceinline__ __nv_bfloat162 pack_bf16(float2 v) { return __float22bfloat162_rn(v); }
__device__ __forceinline__ float2 unpack_bf16(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ __half2 pack_f16(float2 v) { return __float22half2_rn(v); }
__device__ __forceinline__ float2 unpack_f16(__half2 v) { return __half22float2(v); }
template <>
struct Out4<__nv_bfloat16> : Out4Half<__nv_bfloat16, __nv_bfloat162, pack_bf16, unpack_bf16> {};
template <>
struct Out4<__half> : Out4Half<__half, __half2, pack_f16, unpack_f16> {};

template <typename T>
__global__ void __launch_bounds__(kThreads) reduce_split_k_kernel(const float* __restrict__ partials, int splits,
                                                                 int64_t m, int64_t n, const T* __restrict__ bias,
                                                                 T* __restrict__ d, int64_t ldd) {
  begin_dependent_kernel();  // PDL: the partials are the GEMM's output
  const int64_t quads = n / 4, slice = m * n;
  for (int64_t q = blockIdx.x * int64_t{kThreads} + threadIdx.x; q < m * quads; q += int64_t{gridDim.x} * kThreads) {
    const int64_t row = q / quads, col = (q % quads) * 4;
    const float* p = partials + row * n + col;
    float4 part[kMaxSplitK];
#pragma unroll
    for (int s = 0; s < kMaxSplitK; ++s)
      if (s < splits) part[s] = __ldcs(reinterpret_cast<const float4*>(p + s * slice));
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kMaxSplitK; ++s) {
      if (s >= splits) break;
      v[0] += part[s].x, v[1] += part[s].y, v[2] += part[s].z, v[3] += part[s].w;
    }
    if (bias) Out4<T>::add_bias(bias + col, v);
    Out4<T>::store(d + row * ldd + col, v);
  }
}

template <typename T>
cudaError_t launch_reduce(const float* partials, int splits, int64_t m, int64_t n, const void* bias, void* d,
                          int64_t ldd, cudaStream_t stream) {
  const int64_t blocks = ceil_div(m * (n / 4), kThreads);
  const int64_t cap = int64_t{current_device_info().sm_count} * 8;
  return launch(reduce_split_k_kernel<T>, dim3(static_cast<unsigned>(blocks < cap ? blocks : cap)), dim3(kThreads),
                stream, partials, splits, m, n, static_cast<const T*>(bias), static_cast<T*>(d), ldd);
}

}  // namespace

cudaError_t reduce_split_k(const float* partials, int splits, int64_t m, int64_t n, const void* bias, void* d,
                           DType d_dtype, int64_t ldd, cudaStream_t stream) {
  if (splits < 1 || splits > kMaxSplitK || m <= 0 || n <= 0 || n % 4 != 0 || ldd % 4 != 0 || ldd < n)
    return cudaErrorInvalidValue;
  switch (d_dtype) {
    case DType::kFloat32: return launch_reduce<float>(partials, splits, m, n, bias, d, ldd, stream);
    case DType::kFloat16: return launch_reduce<__half>(partials, splits, m, n, bias, d, ldd, stream);
    case DType::kBFloat16: return launch_reduce<__nv_bfloat16>(partials, splits, m, n, bias, d, ldd, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda::gemm

// The fused KV-cache write: one launch quantizes the new K and V and scatters
// them into their pages. One thread per 16-element chunk of a token's head
// (two 16-byte loads of bf16, one 16-byte FP8 store), grid-stride over all
// chunks of K and V.
#include "../quant/quant_common.cuh"
#include "fp8ext/paged_kv_cuda.h"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

struct WriteArgs {
  const int64_t* slots;
  int64_t num_tokens, heads, chunks_per_head;  // chunks of 16 along head_dim
  int64_t slots_total;                         // num_pages * page_size
  uint8_t* pools[2];                           // K, V
  const float* scales[2];
  bool per_head[2];
};

// 16-bit caches (C = __half or __nv_bfloat16): x / scale rounded once (IEEE
// division, as the reference), two 16-byte stores.
template <typename C>
__device__ __forceinline__ void store16(void* dst, const float (&v)[kChunk], float s) {
  union { C h[kChunk]; uint4 w[2]; } u;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) u.h[i] = from_float<C>(__fdiv_rn(v[i], s));
  reinterpret_cast<uint4*>(dst)[0] = u.w[0];
  reinterpret_cast<uint4*>(dst)[1] = u.w[1];
}

// C: cache element (uint8_t for FP8 with format F, else __half / __nv_bfloat16).
template <typename T, typename C, Fp8Format F>
__global__ void __launch_bounds__(kThreads) kv_cache_write_kernel(Input<T> k, Input<T> v, WriteArgs a) {
  begin_dependent_kernel();
  const int64_t per_tensor = a.num_tokens * a.heads * a.chunks_per_head;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < 2 * per_tensor;
       i += int64_t{gridDim.x} * kThreads) {
    const int which = i >= per_tensor;  // 0: K, 1: V
    const int64_t j = i - which * per_tensor;
    const int64_t row = j / a.chunks_per_head;  // token * heads + head
    const int64_t c0 = (j % a.chunks_per_head) * kChunk;
    const int64_t token = row / a.heads, head = row % a.heads;
    const int64_t slot = a.slots[token];
    if (slot < 0 || slot >= a.slots_total) continue;  // padding (the op checks the range where it can)
    float x[kChunk];
    if (which) {
      v.load(row, c0, x);
    } else {
      k.load(row, c0, x);
    }
    // Scalar selects, not a.pools[which]: indexing a parameter array at run time spills it to the stack.
    const float* scales = which ? a.scales[1] : a.scales[0];
    const float s = scales[(which ? a.per_head[1] : a.per_head[0]) ? head : 0];
    uint8_t* pool = which ? a.pools[1] : a.pools[0];
    const int64_t offset = (slot * a.heads + head) * (a.chunks_per_head * kChunk) + c0;  // elements
    if constexpr (sizeof(C) == 1) {
      reinterpret_cast<uint4*>(pool + offset)[0] = quantize_chunk<F>(x, Scale(s)).vec;
    } else {
      store16<C>(reinterpret_cast<C*>(pool) + offset, x, s);
    }
  }
}

template <typename T>
cudaError_t launch_for_input(Input<T> k, Input<T> v, const WriteArgs& a, CacheDType dtype, cudaStream_t stream) {
  const int64_t chunks = 2 * a.num_tokens * a.heads * a.chunks_per_head;
  const unsigned blocks = static_cast<unsigned>(
      std::min<int64_t>(ceil_div(chunks, kThreads), int64_t{num_sms()} * 8));
  switch (dtype) {
    case CacheDType::kE4M3:
      return launch(kv_cache_write_kernel<T, uint8_t, Fp8Format::kE4M3>, dim3(blocks), dim3(kThreads), stream, k, v, a);
    case CacheDType::kE5M2:
      return launch(kv_cache_write_kernel<T, uint8_t, Fp8Format::kE5M2>, dim3(blocks), dim3(kThreads), stream, k, v, a);
    case CacheDType::kFloat16:
      return launch(kv_cache_write_kernel<T, __half, Fp8Format::kE4M3>, dim3(blocks), dim3(kThreads), stream, k, v, a);
    case CacheDType::kBFloat16:
      return launch(kv_cache_write_kernel<T, __nv_bfloat16, Fp8Format::kE4M3>, dim3(blocks), dim3(kThreads), stream, k,
                    v, a);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t kv_cache_write(const void* k, const void* v, DType dtype, int64_t num_tokens, const int64_t* slots,
                           const PagedPool& k_pool, const PagedPool& v_pool, KvScale k_scale, KvScale v_scale,
                           cudaStream_t stream) {
  const int64_t heads = k_pool.num_kv_heads, dim = k_pool.head_dim;
  if (dim % kChunk != 0 || k_pool.dtype != v_pool.dtype) return cudaErrorInvalidValue;
  if (num_tokens == 0 || heads == 0 || dim == 0) return cudaSuccess;
  WriteArgs a{slots, num_tokens, heads, dim / kChunk, k_pool.num_pages * k_pool.page_size,
              {static_cast<uint8_t*>(k_pool.data), static_cast<uint8_t*>(v_pool.data)},
              {k_scale.data, v_scale.data}, {k_scale.per_head, v_scale.per_head}};
  const ConstMatrix km{k, dtype, num_tokens * heads, dim, dim}, vm{v, dtype, num_tokens * heads, dim, dim};
  switch (dtype) {
    case DType::kFloat32: return launch_for_input(make_input<float>(km), make_input<float>(vm), a, k_pool.dtype, stream);
    case DType::kFloat16: return launch_for_input(make_input<__half>(km), make_input<__half>(vm), a, k_pool.dtype, stream);
    case DType::kBFloat16:
      return launch_for_input(make_input<__nv_bfloat16>(km), make_input<__nv_bfloat16>(vm), a, k_pool.dtype, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

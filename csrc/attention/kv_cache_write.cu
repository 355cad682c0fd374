// The fused KV-cache write: one launch quantizes the new K and V and scatters
// them into their pages. One thread per 16-element chunk of a token's head
// (two 16-byte loads of bf16, one 16-byte FP8 store), grid-stride over all
// chunks of K and V. The rotary variant reads q, k and v from the fused QKV
// projection's output, applies RoPE to q and k on the way, writes the rotated
// q for the attention and K/V into the cache: one launch where the unfused
// decode step takes about ten (splits, rotations, copies, the write).
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

// One chunk of a token's head into its slot of a pool. C: cache element
// (uint8_t for FP8 with format F, else __half / __nv_bfloat16).
template <typename C, Fp8Format F>
__device__ __forceinline__ void write_chunk(const WriteArgs& a, int which, int64_t slot, int64_t head, int64_t c0,
                                            const float (&x)[kChunk]) {
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
    const int64_t col = head * a.chunks_per_head * kChunk + c0;  // k and v: one row of all heads per token
    if (which) {
      v.load(token, col, x);
    } else {
      k.load(token, col, x);
    }
    write_chunk<C, F>(a, which, slot, head, c0, x);
  }
}

// RoPE in the rotate-half layout with Hugging Face's tables (cos and sin of
// the angles, each half the same), rounded as PyTorch rounds
// `x * cos + rotate_half(x) * sin` in T, rotate_half(x) = [-x2, x1] (each
// product, then the sum; no FMA contraction, so float32 inputs match too). In
// the first half the partner enters negated: negating its rounded product is
// exact, so the result is bit-identical (python/fp8ext/ops/fused.py).
template <typename T>
__device__ __forceinline__ void rotate_chunk(float (&x)[kChunk], const float (&partner)[kChunk],
                                             const float (&cos)[kChunk], const float (&sin)[kChunk],
                                             bool first_half) {
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float a = to_float(from_float<T>(__fmul_rn(x[i], cos[i])));
    const float b = to_float(from_float<T>(__fmul_rn(partner[i], sin[i])));
    x[i] = to_float(from_float<T>(__fadd_rn(a, first_half ? -b : b)));
  }
}

template <typename T>
struct RotaryArgs {
  Input<T> cos, sin;  // [num_tokens, head_dim]
  T* q_out;           // [num_tokens, q_heads, head_dim], contiguous
  int64_t q_heads;
};

// qkv [num_tokens, (q_heads + 2 * heads) * head_dim]: q heads, then K's, then V's.
template <typename T, typename C, Fp8Format F>
__global__ void __launch_bounds__(kThreads) kv_cache_write_rotary_kernel(Input<T> qkv, RotaryArgs<T> r, WriteArgs a) {
  begin_dependent_kernel();
  const int64_t dim = a.chunks_per_head * kChunk, heads_total = r.q_heads + 2 * a.heads;
  const int64_t total = a.num_tokens * heads_total * a.chunks_per_head;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    const int64_t token = i / (heads_total * a.chunks_per_head);
    const int64_t head = i / a.chunks_per_head % heads_total;
    const int64_t c0 = i % a.chunks_per_head * kChunk;
    const bool is_q = head < r.q_heads, is_v = head >= r.q_heads + a.heads;
    const int64_t slot = is_q ? 0 : a.slots[token];
    if (!is_q && (slot < 0 || slot >= a.slots_total)) continue;  // padding (the op checks the range where it can)
    float x[kChunk];
    qkv.load(token, head * dim + c0, x);
    if (!is_v) {
      float partner[kChunk], cos[kChunk], sin[kChunk];
      qkv.load(token, head * dim + (c0 + dim / 2) % dim, partner);
      r.cos.load(token, c0, cos);
      r.sin.load(token, c0, sin);
      rotate_chunk<T>(x, partner, cos, sin, c0 < dim / 2);  // a chunk lies in one half (dim % 32 == 0)
    }
    if (is_q) {
      union { T h[kChunk]; uint4 w[kChunk * sizeof(T) / 16]; } u;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) u.h[j] = from_float<T>(x[j]);
      uint4* dst = reinterpret_cast<uint4*>(r.q_out + (token * r.q_heads + head) * dim + c0);
#pragma unroll
      for (int j = 0; j < int(kChunk * sizeof(T) / 16); ++j) dst[j] = u.w[j];
    } else {
      write_chunk<C, F>(a, is_v, slot, head - r.q_heads - (is_v ? a.heads : 0), c0, x);
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

template <typename T>
cudaError_t launch_rotary(Input<T> qkv, const RotaryArgs<T>& r, const WriteArgs& a, CacheDType dtype,
                          cudaStream_t stream) {
  const int64_t chunks = a.num_tokens * (r.q_heads + 2 * a.heads) * a.chunks_per_head;
  const unsigned blocks = static_cast<unsigned>(
      std::min<int64_t>(ceil_div(chunks, kThreads), int64_t{num_sms()} * 8));
  const dim3 grid(blocks), block(kThreads);
  switch (dtype) {
    case CacheDType::kE4M3:
      return launch(kv_cache_write_rotary_kernel<T, uint8_t, Fp8Format::kE4M3>, grid, block, stream, qkv, r, a);
    case CacheDType::kE5M2:
      return launch(kv_cache_write_rotary_kernel<T, uint8_t, Fp8Format::kE5M2>, grid, block, stream, qkv, r, a);
    case CacheDType::kFloat16:
      return launch(kv_cache_write_rotary_kernel<T, __half, Fp8Format::kE4M3>, grid, block, stream, qkv, r, a);
    case CacheDType::kBFloat16:
      return launch(kv_cache_write_rotary_kernel<T, __nv_bfloat16, Fp8Format::kE4M3>, grid, block, stream, qkv, r, a);
  }
  return cudaErrorInvalidValue;
}

WriteArgs write_args(int64_t num_tokens, const int64_t* slots, const PagedPool& k_pool, const PagedPool& v_pool,
                     KvScale k_scale, KvScale v_scale) {
  return WriteArgs{slots, num_tokens, k_pool.num_kv_heads, k_pool.head_dim / kChunk,
                   k_pool.num_pages * k_pool.page_size,
                   {static_cast<uint8_t*>(k_pool.data), static_cast<uint8_t*>(v_pool.data)},
                   {k_scale.data, v_scale.data}, {k_scale.per_head, v_scale.per_head}};
}

}  // namespace

cudaError_t kv_cache_write_rotary(const RotaryQkv& in, const int64_t* slots, const PagedPool& k_pool,
                                  const PagedPool& v_pool, KvScale k_scale, KvScale v_scale, cudaStream_t stream) {
  const int64_t heads = k_pool.num_kv_heads, dim = k_pool.head_dim;
  if (dim % (2 * kChunk) != 0 || !same_pool_geometry(k_pool, v_pool) || in.q_heads < 0 ||
      in.qkv_row_stride < (in.q_heads + 2 * heads) * dim)
    return cudaErrorInvalidValue;
  if (in.num_tokens == 0 || in.q_heads + heads == 0 || dim == 0) return cudaSuccess;
  const WriteArgs a = write_args(in.num_tokens, slots, k_pool, v_pool, k_scale, v_scale);
  const int64_t cols = (in.q_heads + 2 * heads) * dim;
  const ConstMatrix qkv{in.qkv, in.dtype, in.num_tokens, cols, in.qkv_row_stride};
  const ConstMatrix cos{in.cos, in.dtype, in.num_tokens, dim, dim}, sin{in.sin, in.dtype, in.num_tokens, dim, dim};
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const RotaryArgs<T> r{make_input<T>(cos), make_input<T>(sin), static_cast<T*>(in.q_out), in.q_heads};
    return launch_rotary(make_input<T>(qkv), r, a, k_pool.dtype, stream);
  };
  switch (in.dtype) {
    case DType::kFloat32: return run(float{});
    case DType::kFloat16: return run(__half{});
    case DType::kBFloat16: return run(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

cudaError_t kv_cache_write(const void* k, const void* v, DType dtype, int64_t num_tokens, int64_t k_token_stride,
                           int64_t v_token_stride, const int64_t* slots, const PagedPool& k_pool,
                           const PagedPool& v_pool, KvScale k_scale, KvScale v_scale, cudaStream_t stream) {
  const int64_t heads = k_pool.num_kv_heads, dim = k_pool.head_dim, width = heads * dim;
  if (dim % kChunk != 0 || !same_pool_geometry(k_pool, v_pool) ||
      (num_tokens > 1 && (k_token_stride < width || v_token_stride < width)))
    return cudaErrorInvalidValue;
  if (num_tokens == 0 || heads == 0 || dim == 0) return cudaSuccess;
  const WriteArgs a = write_args(num_tokens, slots, k_pool, v_pool, k_scale, v_scale);
  const ConstMatrix km{k, dtype, num_tokens, width, num_tokens > 1 ? k_token_stride : width};
  const ConstMatrix vm{v, dtype, num_tokens, width, num_tokens > 1 ? v_token_stride : width};
  switch (dtype) {
    case DType::kFloat32: return launch_for_input(make_input<float>(km), make_input<float>(vm), a, k_pool.dtype, stream);
    case DType::kFloat16: return launch_for_input(make_input<__half>(km), make_input<__half>(vm), a, k_pool.dtype, stream);
    case DType::kBFloat16:
      return launch_for_input(make_input<__nv_bfloat16>(km), make_input<__nv_bfloat16>(vm), a, k_pool.dtype, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

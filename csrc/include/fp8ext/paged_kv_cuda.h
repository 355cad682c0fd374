// CUDA kernels of the paged KV cache (torch-free). Numerics are those of the
// PyTorch reference, python/fp8ext/ops/kv_cache_reference.py. Every pointer is
// device memory and nothing synchronises with the host: graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fp8ext/types.h"

namespace fp8ext::cuda {

enum class CacheDType : int { kE4M3 = 0, kE5M2 = 1, kFloat16 = 2, kBFloat16 = 3 };

// One layer's K or V pool [num_pages, page_size, num_kv_heads, head_dim], contiguous.
struct PagedPool {
  void* data;
  CacheDType dtype;
  int64_t num_pages, page_size, num_kv_heads, head_dim;
};

// Whether a V pool can be addressed as its K pool is: the kernels take every
// size from K and apply it to V's data.
inline bool same_pool_geometry(const PagedPool& k, const PagedPool& v) {
  return k.dtype == v.dtype && k.num_pages == v.num_pages && k.page_size == v.page_size &&
         k.num_kv_heads == v.num_kv_heads && k.head_dim == v.head_dim;
}

// One float, or one per KV head.
struct KvScale {
  const float* data;
  bool per_head;
};

// Head sizes the decode kernel is built for.
constexpr bool decode_head_dim_supported(int64_t d) { return d == 64 || d == 128 || d == 256; }

// k, v [num_tokens, H_kv, D] (dtype bf16/fp16/fp32; D a multiple of 16), each
// token's heads contiguous and tokens k_token_stride / v_token_stride elements
// apart (>= H_kv * D: views of a fused QKV output are read in place): token t
// goes to slot slots[t] (page * page_size + offset) of both pools as
// cast(x / scale), saturating for FP8; slots < 0 are skipped.
cudaError_t kv_cache_write(const void* k, const void* v, DType dtype, int64_t num_tokens, int64_t k_token_stride,
                           int64_t v_token_stride, const int64_t* slots, const PagedPool& k_pool,
                           const PagedPool& v_pool, KvScale k_scale, KvScale v_scale, cudaStream_t stream);

// The fused QKV projection's output with rotary tables, for kv_cache_write_rotary.
struct RotaryQkv {
  const void* qkv;  // [num_tokens, (q_heads + 2 * H_kv) * D]: q heads, K heads, V heads; rows qkv_row_stride apart
  DType dtype;      // of qkv, the tables and q_out
  int64_t num_tokens, qkv_row_stride, q_heads;
  const void* cos;  // [num_tokens, D] contiguous
  const void* sin;  // [num_tokens, D] contiguous (Hugging Face's tables: both halves the same angles)
  void* q_out;      // [num_tokens, q_heads, D] contiguous
};

// kv_cache_write of K and V taken from qkv, with rotate-half RoPE applied to q
// and K first: x -> x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1],
// each product and the sum rounded to the dtype (PyTorch's rounding of that
// expression, as Hugging Face's apply_rotary_pos_emb computes it). The rotated q
// goes to q_out. D must be a multiple of 32.
cudaError_t kv_cache_write_rotary(const RotaryQkv& in, const int64_t* slots, const PagedPool& k_pool,
                                  const PagedPool& v_pool, KvScale k_scale, KvScale v_scale, cudaStream_t stream);

struct DecodeProblem {
  const void* q;  // [batch, num_q_heads, head_dim] contiguous
  DType q_dtype;
  int64_t batch, num_q_heads;
  PagedPool k, v;
  KvScale k_scale, v_scale;
  const int32_t* block_table;  // [batch, max_pages]
  int64_t max_pages;
  const int32_t* seq_lens;  // [batch]
  float softmax_scale;
  int num_splits;  // splits of each sequence's KV range; > 1 merges partial results by log-sum-exp
  int window;      // > 0: attend to the last `window` tokens only
  float softcap;   // > 0: logits become softcap * tanh(logits / softcap)
  void* out;       // [batch, num_q_heads, head_dim], q_dtype
};

// A sequence whose length exceeds its table or whose pages lie outside the
// pool gets NaN outputs (the kernel never reads outside the pools); with a
// window, only the pages of the tokens it attends to are checked. FP8 and fp16
// caches round q * softmax_scale to fp16 for the MMA, so |q * softmax_scale|
// >= 65520 (fp16's rounding to inf) gives NaN for that head (the reference
// computes in fp32). A -inf score against an inf in V gives NaN (0 * inf), as
// in the reference, whatever the number of splits. With
// num_splits > 1 the workspace (paged_decode_workspace_bytes) must be 16-byte
// aligned.
size_t paged_decode_workspace_bytes(const DecodeProblem& p);
cudaError_t paged_decode_attention(const DecodeProblem& p, void* workspace, cudaStream_t stream);

}  // namespace fp8ext::cuda

// The CUDA paged KV-cache ops: argument checks and the calls into the kernels
// (csrc/attention). Shapes, dtypes and devices are checked here; page ids and
// lengths live on the device and are not read back (no host sync): the
// kernels never touch memory outside the pools for bad values, skipping such
// slots in the write and giving NaN for such sequences in the attention.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>

#include "../tensor_checks.h"
#include "cuda_status.h"
#include "fp8ext/paged_kv_cuda.h"

namespace fp8ext::torch_ops {
namespace {

using cuda::CacheDType;
using cuda::KvScale;
using cuda::PagedPool;

CacheDType cache_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat8_e4m3fn: return CacheDType::kE4M3;
    case at::kFloat8_e5m2: return CacheDType::kE5M2;
    case at::kHalf: return CacheDType::kFloat16;
    case at::kBFloat16: return CacheDType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, "k_cache must be float8_e4m3fn, float8_e5m2, bfloat16 or float16, got ",
                       t.scalar_type());
  }
}

std::pair<PagedPool, PagedPool> pools(const at::Tensor& k_cache, const at::Tensor& v_cache) {
  check_sm80_or_newer(k_cache, "k_cache", "paged KV-cache");
  TORCH_CHECK_VALUE(k_cache.dim() == 4, "k_cache must be [num_pages, page_size, num_kv_heads, head_dim], got ",
                    k_cache.dim(), "-D");
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                        v_cache.device() == k_cache.device(),
                    "v_cache must match k_cache (", k_cache.sizes(), ", ", k_cache.scalar_type(), ", ",
                    k_cache.device(), "), got ", v_cache.sizes(), ", ", v_cache.scalar_type(), ", ", v_cache.device());
  const CacheDType dt = cache_dtype(k_cache);
  TORCH_CHECK_VALUE(k_cache.is_contiguous() && v_cache.is_contiguous(), "k_cache and v_cache must be contiguous");
  TORCH_CHECK_VALUE(k_cache.numel() == 0 || k_cache.data_ptr() != v_cache.data_ptr(),
                    "k_cache and v_cache must be separate pools (the same tensor was given for both)");
  check_no_overlap(k_cache, "k_cache", v_cache, "v_cache");  // views of one buffer that overlap
  TORCH_CHECK_VALUE(k_cache.size(1) >= 1 && k_cache.size(2) >= 1, "page_size and num_kv_heads must be >= 1, got ",
                    k_cache.sizes());
  TORCH_CHECK_VALUE(k_cache.size(3) >= 16 && k_cache.size(3) % 16 == 0, "head_dim must be a positive multiple of 16, got ",
                    k_cache.size(3));
  for (const at::Tensor* t : {&k_cache, &v_cache})
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "k_cache and v_cache must start 16-byte aligned");
  auto pool = [&](const at::Tensor& t) {
    return PagedPool{t.data_ptr(), dt, t.size(0), t.size(1), t.size(2), t.size(3)};
  };
  return {pool(k_cache), pool(v_cache)};
}

// The scale as a contiguous fp32 tensor on the cache's device; one value or one per KV head.
std::pair<at::Tensor, KvScale> scale_of(const at::Tensor& s, const char* name, int64_t heads, const at::Tensor& like) {
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, name, " must be float32, got ", s.scalar_type());
  TORCH_CHECK_VALUE(s.dim() <= 1 && (s.numel() == 1 || s.numel() == heads), name,
                    " must hold one value or one per KV head ([", heads, "]), got ", s.sizes());
  TORCH_CHECK_VALUE(s.device() == like.device(), name, " must be on ", like.device(), ", got ", s.device());
  at::Tensor c = s.contiguous();
  return {c, KvScale{c.data_ptr<float>(), s.numel() > 1}};
}

void check_device(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " must be on the cache's device ", like.device(), ", got ",
                    t.device());
}

cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

void check_launch(cudaError_t err, const char* op) { check_cuda_status(err, op); }

// int32 for the kernel; int64 values that do not fit become -1 (a bad page or
// length: NaN for that sequence) on the device, not a wrapped-around valid one.
at::Tensor as_int32(const at::Tensor& t) {
  if (t.scalar_type() == at::kInt) return t.contiguous();
  const at::Tensor fits = (t >= 0) & (t <= INT32_MAX);
  return at::where(fits, t, at::full({}, -1, t.options())).to(at::kInt).contiguous();
}

bool is_index(const at::Tensor& t) { return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong; }

void check_slots(const at::Tensor& slot_mapping, int64_t tokens, const at::Tensor& k_cache) {
  TORCH_CHECK_VALUE(is_index(slot_mapping) && slot_mapping.dim() == 1 && slot_mapping.size(0) == tokens,
                    "slot_mapping must be int32/int64 [", tokens, "] (one slot per token), got ",
                    slot_mapping.scalar_type(), " ", slot_mapping.sizes());
  check_device(slot_mapping, "slot_mapping", k_cache);
}

void kv_cache_write_cuda(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                         const at::Tensor& slot_mapping, const at::Tensor& k_scale, const at::Tensor& v_scale) {
  const auto [k_pool, v_pool] = pools(k_cache, v_cache);
  const int64_t heads = k_pool.num_kv_heads, dim = k_pool.head_dim;
  TORCH_CHECK_VALUE(k.dim() == 3 && k.size(1) == heads && k.size(2) == dim, "k must be [num_tokens, ", heads, ", ",
                    dim, "] (the cache's heads and head_dim), got ", k.sizes());
  TORCH_CHECK_VALUE(v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type(), "v must match k (", k.sizes(),
                    ", ", k.scalar_type(), "), got ", v.sizes(), ", ", v.scalar_type());
  const DType dt = to_dtype(k, "k");
  check_slots(slot_mapping, k.size(0), k_cache);
  check_device(k, "k", k_cache);
  check_device(v, "v", k_cache);
  // The kernel reads k and v while it stores into the pools, unordered: a token taken from the cache
  // itself (moving slots) would race with its own stores.
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_no_overlap(*t, name, k_cache, "k_cache");
    check_no_overlap(*t, name, v_cache, "v_cache");
  }
  const auto [ks, k_view] = scale_of(k_scale, "k_scale", heads, k_cache);
  const auto [vs, v_view] = scale_of(v_scale, "v_scale", heads, k_cache);
  c10::cuda::CUDAGuard guard(k_cache.device());
  // Views whose tokens hold their heads contiguously (K and V split from a fused
  // QKV output) are read in place; anything else is copied.
  auto readable = [&](const at::Tensor& t) {
    return t.stride(2) == 1 && (heads <= 1 || t.stride(1) == dim) && (t.size(0) <= 1 || t.stride(0) >= heads * dim);
  };
  const at::Tensor kc = readable(k) ? k : k.contiguous(), vc = readable(v) ? v : v.contiguous();
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  check_launch(cuda::kv_cache_write(kc.data_ptr(), vc.data_ptr(), dt, k.size(0), kc.stride(0), vc.stride(0),
                                    slots.data_ptr<int64_t>(), k_pool, v_pool, k_view, v_view, stream_of(k_cache)),
               "kv_cache_write");
}

at::Tensor kv_cache_write_rotary_cuda(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                      at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping,
                                      const at::Tensor& k_scale, const at::Tensor& v_scale, int64_t num_q_heads) {
  const auto [k_pool, v_pool] = pools(k_cache, v_cache);
  const int64_t heads = k_pool.num_kv_heads, dim = k_pool.head_dim;
  TORCH_CHECK_VALUE(dim % 32 == 0, "head_dim must be a multiple of 32 for the rotary write, got ", dim);
  // (The bound keeps the width below from overflowing; decode attention takes at most 65535 heads too.)
  TORCH_CHECK_VALUE(num_q_heads >= 1 && num_q_heads <= 65535, "num_q_heads must be in [1, 65535], got ", num_q_heads);
  const int64_t cols = (num_q_heads + 2 * heads) * dim;
  TORCH_CHECK_VALUE(qkv.dim() == 2 && qkv.size(1) == cols, "qkv must be [num_tokens, ", cols,
                    "] ((num_q_heads + 2 * num_kv_heads) * head_dim), got ", qkv.sizes());
  const DType dt = to_dtype(qkv, "qkv");
  const int64_t tokens = qkv.size(0);
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(0) == tokens && t->size(1) == dim, name, " must be [", tokens, ", ",
                      dim, "] (num_tokens, head_dim), got ", t->sizes());
    TORCH_CHECK_TYPE(t->scalar_type() == qkv.scalar_type(), name, " must have qkv's dtype ", qkv.scalar_type(),
                     ", got ", t->scalar_type());
    check_device(*t, name, k_cache);
  }
  check_slots(slot_mapping, tokens, k_cache);
  check_device(qkv, "qkv", k_cache);
  check_no_overlap(qkv, "qkv", k_cache, "k_cache");  // as kv_cache_write's k and v
  check_no_overlap(qkv, "qkv", v_cache, "v_cache");
  const auto [ks, k_view] = scale_of(k_scale, "k_scale", heads, k_cache);
  const auto [vs, v_view] = scale_of(v_scale, "v_scale", heads, k_cache);
  c10::cuda::CUDAGuard guard(k_cache.device());
  const at::Tensor cc = cos.contiguous(), sc = sin.contiguous(), slots = slot_mapping.to(at::kLong).contiguous();
  // Rows the kernel can read as they are: contiguous within, apart from each other (a view of a wider
  // output is fine); anything else (transposed, overlapping rows) is copied.
  const bool direct = qkv.stride(1) == 1 && (tokens <= 1 || qkv.stride(0) >= cols);
  const at::Tensor qkv_rows = direct ? qkv : qkv.contiguous();
  at::Tensor q = at::empty({tokens, num_q_heads, dim}, qkv.options());
  const cuda::RotaryQkv in{qkv_rows.data_ptr(), dt, tokens, tokens > 1 ? qkv_rows.stride(0) : cols, num_q_heads,
                           cc.data_ptr(), sc.data_ptr(), q.data_ptr()};
  check_launch(cuda::kv_cache_write_rotary(in, slots.data_ptr<int64_t>(), k_pool, v_pool, k_view, v_view,
                                           stream_of(k_cache)),
               "kv_cache_write_rotary");
  return q;
}

at::Tensor paged_decode_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                       const at::Tensor& block_table, const at::Tensor& seq_lens,
                                       const at::Tensor& k_scale, const at::Tensor& v_scale, double softmax_scale,
                                       int64_t num_splits, int64_t window, double softcap) {
  const auto [k_pool, v_pool] = pools(k_cache, v_cache);
  const int64_t heads = k_pool.num_kv_heads, dim = k_pool.head_dim;
  TORCH_CHECK_VALUE(q.dim() == 3 && q.size(2) == dim, "q must be [batch, num_q_heads, ", dim,
                    "] (one token per sequence), got ", q.sizes());
  const DType qt = to_dtype(q, "q");
  TORCH_CHECK_VALUE(q.size(1) % heads == 0, "num_q_heads (", q.size(1), ") must be a multiple of num_kv_heads (",
                    heads, ")");
  TORCH_CHECK_VALUE(cuda::decode_head_dim_supported(dim), "head_dim must be 64, 128 or 256 on CUDA, got ", dim);
  const int64_t batch = q.size(0);
  TORCH_CHECK_VALUE(is_index(block_table) && block_table.dim() == 2 && block_table.size(0) == batch,
                    "block_table must be int32/int64 [batch = ", batch, ", max_pages], got ",
                    block_table.scalar_type(), " ", block_table.sizes());
  TORCH_CHECK_VALUE(is_index(seq_lens) && seq_lens.dim() == 1 && seq_lens.size(0) == batch,
                    "seq_lens must be int32/int64 [batch = ", batch, "], got ", seq_lens.scalar_type(), " ",
                    seq_lens.sizes());
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= 65535, "num_splits must be in [1, 65535], got ", num_splits);
  TORCH_CHECK_VALUE(window >= 0 && window <= INT32_MAX, "window must be in [0, 2^31) (0: no sliding window), got ",
                    window);
  // Both are used in float32: a double past its max would become inf there.
  TORCH_CHECK_VALUE(std::isfinite(static_cast<float>(softcap)) && softcap >= 0,
                    "softcap must be finite and >= 0 (0: none; finite in float32), got ", softcap);
  TORCH_CHECK_VALUE(std::isfinite(static_cast<float>(softmax_scale)), "softmax_scale must be finite (in float32), got ",
                    softmax_scale);
  TORCH_CHECK_VALUE(batch <= 65535, "batch must be at most 65535, got ", batch);
  // Query heads bound the grid's y (KV heads x head blocks) and the row bytes (int32 in the kernel).
  TORCH_CHECK_VALUE(q.size(1) <= 65535, "q must have at most 65535 heads on CUDA, got ", q.size(1));
  TORCH_CHECK_VALUE(k_pool.page_size <= INT32_MAX, "k_cache's page_size must be below 2^31 on CUDA, got ",
                    k_pool.page_size);
  TORCH_CHECK_VALUE(k_pool.num_pages * k_pool.page_size <= INT32_MAX,
                    "k_cache must hold fewer than 2^31 tokens (num_pages x page_size) on CUDA, got ",
                    k_pool.num_pages * k_pool.page_size);
  check_device(q, "q", k_cache);
  check_device(block_table, "block_table", k_cache);
  check_device(seq_lens, "seq_lens", k_cache);
  const auto [ks, k_view] = scale_of(k_scale, "k_scale", heads, k_cache);
  const auto [vs, v_view] = scale_of(v_scale, "v_scale", heads, k_cache);
  c10::cuda::CUDAGuard guard(k_cache.device());
  const at::Tensor qc = q.contiguous(), table = as_int32(block_table), lens = as_int32(seq_lens);
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  cuda::DecodeProblem p{qc.data_ptr(), qt, batch, q.size(1), k_pool, v_pool, k_view, v_view,
                        table.data_ptr<int32_t>(), table.size(1), lens.data_ptr<int32_t>(),
                        static_cast<float>(softmax_scale), static_cast<int>(num_splits), static_cast<int>(window),
                        static_cast<float>(softcap), out.data_ptr()};
  const size_t bytes = cuda::paged_decode_workspace_bytes(p);
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  check_launch(cuda::paged_decode_attention(p, bytes ? workspace.data_ptr() : nullptr, stream_of(k_cache)),
               "paged_decode_attention");
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8ext, CUDA, m) {
  m.impl("kv_cache_write", &kv_cache_write_cuda);
  m.impl("kv_cache_write_rotary", &kv_cache_write_rotary_cuda);
  m.impl("paged_decode_attention", &paged_decode_attention_cuda);
}

}  // namespace fp8ext::torch_ops

// Paged decode attention: one query token per sequence over its pages.
//
// A block takes (split, KV head x group of up to 8 query heads, sequence) and
// walks its share of the sequence's tokens in chunks of 128:
//   scores   one token per thread: its K row is read once, converted in
//            registers and dotted with the group's queries (held in shared
//            memory, pre-multiplied by softmax_scale * k_scale);
//   softmax  online, in float32: a warp per query head updates the running max
//            and sum and turns the chunk's scores into weights;
//   P V      threads own head_dim elements, V is read once per chunk and the
//            result multiplied by v_scale at the end.
// With num_splits > 1 each split writes its partial output and log-sum-exp and
// a second kernel merges them, so a single long sequence still fills the GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <type_traits>

#include "../quant/quant_common.cuh"
#include "fp8ext/cuda_launch.h"
#include "fp8ext/paged_kv_cuda.h"

namespace fp8ext::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kChunkTokens = kThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeads = 8;  // query heads per block (larger GQA groups take several blocks)

struct DecodeArgs {
  const void* q;
  const uint8_t* k;
  const uint8_t* v;
  int64_t num_pages, page_size, kv_heads, q_heads;
  int group, head_blocks;  // query heads per KV head, blocks per KV head
  const float* k_scale;
  const float* v_scale;
  bool k_per_head, v_per_head;
  const int32_t* block_table;
  int64_t max_pages;
  const int32_t* seq_lens;
  float softmax_scale, softcap;
  int num_splits, window;
  void* out;
  float* part_out;  // [batch, q_heads, splits, D] when num_splits > 1
  float* part_lse;  // [batch, q_heads, splits]
};

using detail::from_float;
using detail::to_float;

// Cache elements: bytes per element and the conversion of 16 of them (one
// chunk, 16-byte aligned) or of one to float.
template <CacheDType C>
struct Cache {
  static constexpr int kBytes = (C == CacheDType::kE4M3 || C == CacheDType::kE5M2) ? 1 : 2;

  __device__ __forceinline__ static float one(const uint8_t* p) {
    if constexpr (kBytes == 1) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(*p, C == CacheDType::kE5M2 ? __NV_E5M2 : __NV_E4M3);
      return __half2float(__half(h));
    } else if constexpr (C == CacheDType::kFloat16) {
      return __half2float(*reinterpret_cast<const __half*>(p));
    } else {
      return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
    }
  }

  __device__ __forceinline__ static void sixteen(const uint8_t* p, float (&f)[16]) {
    if constexpr (kBytes == 1) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(p));
      const uint16_t* pairs = reinterpret_cast<const uint16_t*>(&w);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[i], C == CacheDType::kE5M2 ? __NV_E5M2 : __NV_E4M3);
        const float2 x = __half22float2(__half2(h));
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
      }
    } else {
      uint4 w[2];
      w[0] = __ldg(reinterpret_cast<const uint4*>(p));
      w[1] = __ldg(reinterpret_cast<const uint4*>(p) + 1);
      const auto* e = reinterpret_cast<const uint16_t*>(w);
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = one(reinterpret_cast<const uint8_t*>(e + i));
    }
  }
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

template <typename Q, CacheDType C, int D>
__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeArgs a) {
  begin_dependent_kernel();
  constexpr int kDims = D > kThreads ? D / kThreads : 1;         // head_dim elements per thread in P V
  constexpr int kTokenLanes = D < kThreads ? kThreads / D : 1;  // threads sharing one element in P V
  __shared__ float q_s[kMaxHeads][D];
  __shared__ float p_s[kMaxHeads][kChunkTokens];
  __shared__ int64_t row_s[kChunkTokens];  // cache row (page * page_size + offset) of each chunk token; -1: none
  __shared__ float m_s[kMaxHeads], l_s[kMaxHeads], alpha_s[kMaxHeads];
  __shared__ int bad_s;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int split = blockIdx.x;
  const int kv = blockIdx.y / a.head_blocks;
  const int h0 = kv * a.group + (blockIdx.y % a.head_blocks) * kMaxHeads;  // first query head of the block
  const int nh = min(kMaxHeads, kv * a.group + a.group - h0);
  const int64_t b = blockIdx.z;

  const int64_t len = a.seq_lens[b];
  const bool bad_len = len < 0 || len > a.max_pages * a.page_size;
  const int64_t lo = bad_len ? 0 : (a.window > 0 ? max(int64_t{0}, len - a.window) : 0);
  const int64_t hi = bad_len ? 0 : len;
  const int64_t per_split = (hi - lo + a.num_splits - 1) / a.num_splits;
  const int64_t t_begin = lo + split * per_split, t_end = min(hi, t_begin + per_split);
  const float ks = a.k_scale[a.k_per_head ? kv : 0], vs = a.v_scale[a.v_per_head ? kv : 0];

  const Q* q = static_cast<const Q*>(a.q) + (b * a.q_heads + h0) * D;
  for (int i = tid; i < nh * D; i += kThreads) q_s[i / D][i % D] = to_float(q[i]) * (a.softmax_scale * ks);
  if (tid < kMaxHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  if (tid == 0) bad_s = bad_len;
  __syncthreads();

  float acc[kMaxHeads][kDims] = {};
  const int d_own = tid % (D < kThreads ? D : kThreads);
  const int token_lane = D < kThreads ? tid / D : 0;
  const int64_t row_bytes = a.kv_heads * D * Cache<C>::kBytes;  // one cache row: all KV heads of a token

  for (int64_t chunk = t_begin; chunk < t_end; chunk += kChunkTokens) {
    // Scores: token chunk + tid.
    float s[kMaxHeads];
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h) s[h] = -INFINITY;
    const int64_t t = chunk + tid;
    int64_t row = -1;
    if (t < t_end) {
      const int64_t page = a.block_table[b * a.max_pages + t / a.page_size];
      if (page < 0 || page >= a.num_pages) {
        bad_s = 1;
      } else {
        row = page * a.page_size + t % a.page_size;
        const uint8_t* k_row = a.k + row * row_bytes + int64_t{kv} * D * Cache<C>::kBytes;
#pragma unroll
        for (int h = 0; h < kMaxHeads; ++h) s[h] = 0.0f;
#pragma unroll 2
        for (int d = 0; d < D; d += 16) {
          float kf[16];
          Cache<C>::sixteen(k_row + d * Cache<C>::kBytes, kf);
#pragma unroll
          for (int h = 0; h < kMaxHeads; ++h) {
            if (h < nh) {
#pragma unroll
              for (int i = 0; i < 16; ++i) s[h] = fmaf(q_s[h][d + i], kf[i], s[h]);
            }
          }
        }
        if (a.softcap > 0.0f) {
#pragma unroll
          for (int h = 0; h < kMaxHeads; ++h) s[h] = a.softcap * tanhf(s[h] / a.softcap);
        }
      }
    }
    row_s[tid] = row;
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h)
      if (h < nh) p_s[h][tid] = row >= 0 ? s[h] : -INFINITY;
    __syncthreads();

    // Online softmax: warp w updates heads w, w + 4; scores become weights. A
    // NaN score makes the head NaN (as softmax does): fmaxf would skip it.
    for (int h = warp; h < nh; h += kWarps) {
      float mx = -INFINITY;
      bool nan = false;
      for (int i = lane; i < kChunkTokens; i += 32) {
        mx = fmaxf(mx, p_s[h][i]);
        nan |= isnan(p_s[h][i]);
      }
      mx = warp_max(mx);
      const float m_old = m_s[h];
      const float m_new = __any_sync(0xFFFFFFFFu, nan) ? NAN : fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int i = lane; i < kChunkTokens; i += 32) {
        const float p = m_new == -INFINITY ? 0.0f : __expf(p_s[h][i] - m_new);
        p_s[h][i] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();

    // P V over the chunk's tokens.
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h)
#pragma unroll
      for (int j = 0; j < kDims; ++j) acc[h][j] *= h < nh ? alpha_s[h] : 1.0f;
    const int n = static_cast<int>(t_end - chunk < kChunkTokens ? t_end - chunk : kChunkTokens);
    for (int i = token_lane; i < n; i += kTokenLanes) {
      const int64_t r = row_s[i];
      if (r < 0) continue;
      const uint8_t* v_row = a.v + r * row_bytes + int64_t{kv} * D * Cache<C>::kBytes;
#pragma unroll
      for (int j = 0; j < kDims; ++j) {
        const float vf = Cache<C>::one(v_row + (d_own + j * kThreads) * Cache<C>::kBytes);
#pragma unroll
        for (int h = 0; h < kMaxHeads; ++h)
          if (h < nh) acc[h][j] = fmaf(p_s[h][i], vf, acc[h][j]);
      }
    }
    __syncthreads();  // p_s and row_s are rewritten by the next chunk
  }

  // Threads sharing an element (head_dim < 128) add up their token lanes.
  if constexpr (kTokenLanes > 1) {
    static_assert(kTokenLanes * kMaxHeads * D <= kMaxHeads * kChunkTokens, "the reduction reuses p_s");
    float* red = &p_s[0][0];
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h)
      if (h < nh) red[(token_lane * kMaxHeads + h) * D + d_own] = acc[h][0];
    __syncthreads();
    if (token_lane != 0) return;
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h)
      if (h < nh)
        for (int l = 1; l < kTokenLanes; ++l) acc[h][0] += red[(l * kMaxHeads + h) * D + d_own];
  }

  const bool bad = bad_s != 0;
#pragma unroll
  for (int h = 0; h < kMaxHeads; ++h) {
    if (h >= nh) continue;
    const float l = l_s[h];
    const int64_t head = b * a.q_heads + h0 + h;
#pragma unroll
    for (int j = 0; j < kDims; ++j) {
      const int d = d_own + j * kThreads;
      const float o = bad ? NAN : (l != 0.0f ? acc[h][j] / l * vs : 0.0f);  // l is NaN after a NaN score
      if (a.num_splits == 1) {
        static_cast<Q*>(a.out)[head * D + d] = from_float<Q>(o);
      } else {
        a.part_out[(head * a.num_splits + split) * D + d] = o;
      }
    }
    if (a.num_splits > 1 && tid == 0)
      a.part_lse[head * a.num_splits + split] = bad ? NAN : (l != 0.0f ? m_s[h] + logf(l) : -INFINITY);
  }
}

// out = sum_s w_s o_s / sum_s w_s with w_s = exp(lse_s - max lse): one block per (sequence, query head).
template <typename Q, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel(DecodeArgs a) {
  begin_dependent_kernel();
  const int64_t head = blockIdx.x;
  const float* lse = a.part_lse + head * a.num_splits;
  float mx = -INFINITY;
  bool nan = false;
  for (int s = 0; s < a.num_splits; ++s) {
    nan |= isnan(lse[s]);
    mx = fmaxf(mx, lse[s]);
  }
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float num = 0.0f, den = 0.0f;
    if (mx > -INFINITY) {
      for (int s = 0; s < a.num_splits; ++s) {
        const float w = __expf(lse[s] - mx);  // 0 for empty splits (lse = -inf)
        num = fmaf(w, a.part_out[(head * a.num_splits + s) * D + d], num);
        den += w;
      }
    }
    const float o = nan ? NAN : (den > 0.0f ? num / den : 0.0f);
    static_cast<Q*>(a.out)[head * D + d] = from_float<Q>(o);
  }
}

template <typename Q, CacheDType C>
cudaError_t launch_typed(const DecodeArgs& a, int64_t batch, int64_t head_dim, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_splits), static_cast<unsigned>(a.kv_heads * a.head_blocks),
                  static_cast<unsigned>(batch));
  const dim3 merge_grid(static_cast<unsigned>(batch * a.q_heads));
  auto run = [&](auto dim) -> cudaError_t {
    constexpr int D = decltype(dim)::value;
    cudaError_t err = launch(decode_kernel<Q, C, D>, grid, dim3(kThreads), stream, a);
    if (err == cudaSuccess && a.num_splits > 1)
      err = launch(merge_kernel<Q, D>, merge_grid, dim3(kThreads), stream, a);
    return err;
  };
  switch (head_dim) {
    case 64: return run(std::integral_constant<int, 64>{});
    case 128: return run(std::integral_constant<int, 128>{});
    case 256: return run(std::integral_constant<int, 256>{});
  }
  return cudaErrorInvalidValue;
}

template <typename Q>
cudaError_t launch_for_query(const DecodeArgs& a, CacheDType c, int64_t batch, int64_t head_dim, cudaStream_t stream) {
  switch (c) {
    case CacheDType::kE4M3: return launch_typed<Q, CacheDType::kE4M3>(a, batch, head_dim, stream);
    case CacheDType::kE5M2: return launch_typed<Q, CacheDType::kE5M2>(a, batch, head_dim, stream);
    case CacheDType::kFloat16: return launch_typed<Q, CacheDType::kFloat16>(a, batch, head_dim, stream);
    case CacheDType::kBFloat16: return launch_typed<Q, CacheDType::kBFloat16>(a, batch, head_dim, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t paged_decode_workspace_bytes(const DecodeProblem& p) {
  if (p.num_splits <= 1) return 0;
  const size_t heads = static_cast<size_t>(p.batch * p.num_q_heads) * static_cast<size_t>(p.num_splits);
  return heads * (static_cast<size_t>(p.k.head_dim) + 1) * sizeof(float);
}

cudaError_t paged_decode_attention(const DecodeProblem& p, void* workspace, cudaStream_t stream) {
  const int64_t kv_heads = p.k.num_kv_heads, dim = p.k.head_dim;
  if (kv_heads < 1 || !decode_head_dim_supported(dim) || p.num_q_heads % kv_heads != 0 || p.num_splits < 1 ||
      p.k.dtype != p.v.dtype || p.batch > 65535 || p.num_splits > 65535)
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.num_q_heads == 0) return cudaSuccess;
  const int group = static_cast<int>(p.num_q_heads / kv_heads);
  const int head_blocks = (group + kMaxHeads - 1) / kMaxHeads;
  if (kv_heads * head_blocks > 65535) return cudaErrorInvalidValue;
  float* part_out = static_cast<float*>(workspace);
  float* part_lse = part_out ? part_out + p.batch * p.num_q_heads * p.num_splits * dim : nullptr;
  if (p.num_splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  const DecodeArgs a{p.q, static_cast<const uint8_t*>(p.k.data), static_cast<const uint8_t*>(p.v.data),
                     p.k.num_pages, p.k.page_size, kv_heads, p.num_q_heads, group, head_blocks,
                     p.k_scale.data, p.v_scale.data, p.k_scale.per_head, p.v_scale.per_head,
                     p.block_table, p.max_pages, p.seq_lens, p.softmax_scale, p.softcap, p.num_splits, p.window,
                     p.out, part_out, part_lse};
  switch (p.q_dtype) {
    case DType::kFloat32: return launch_for_query<float>(a, p.k.dtype, p.batch, dim, stream);
    case DType::kFloat16: return launch_for_query<__half>(a, p.k.dtype, p.batch, dim, stream);
    case DType::kBFloat16: return launch_for_query<__nv_bfloat16>(a, p.k.dtype, p.batch, dim, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

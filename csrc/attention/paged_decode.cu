// Paged decode attention: one query token per sequence over its pages, on
// the tensor cores (mma.sync m16n8k16, fp16 operands, bf16 for a bf16 cache,
// fp32 accumulation; FP8 codes are exact in fp16).
//
// A block takes (split, KV head x group of up to 8 query heads, sequence); its
// four warps take turns over the split's tokens in steps of 16 or 32 and each
// keeps its own online softmax, merged through shared memory at the end:
//   S = Q K^T   Q (the group's heads x softmax_scale, fp16) is the A operand,
//               a K row is loaded straight from its page into the B fragment;
//               k_scale and log2(e) are applied to the fp32 scores;
//   O^T = V^T P^T  V rows are the A operand (byte-permuted into fragments), and
//               the score fragments, exponentiated and rounded, are exactly the
//               B fragments, so P never leaves the registers; v_scale at the end.
// Within one m16n8k16 step the order of the summed dimension is free, so each
// thread's head-dim slice is a contiguous 16-byte load (the same permutation is
// applied to Q). With num_splits > 1 each split writes its partial output and
// log2-sum-exp and a second kernel merges them, so one long sequence still
// fills the GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "../quant/quant_common.cuh"
#include "cp_async.cuh"
#include "decode_step.cuh"
#include "decode_timeline.cuh"
#include "fp8ext/cuda_launch.h"
#include "fp8ext/paged_kv_cuda.h"

namespace fp8ext::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeads = 8;  // query heads per block: the n of the P V mma (larger groups take several blocks)

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
  float* part_lse;  // [batch, q_heads, splits], log2 domain
};

using detail::from_float;
using detail::to_float;
using namespace decode;

// Loads `Words` 32-bit words from a 4*Words-byte aligned address (16-byte loads where they fit).
template <int Words>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[Words]) {
  if constexpr (Words % 4 == 0) {
#pragma unroll
    for (int i = 0; i < Words / 4; ++i) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
    }
  } else {
    static_assert(Words == 2, "8-byte slices only below 16");
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = x.x, w[1] = x.y;
  }
}

// The pipelined variant (FP8 caches, head_dim 128; the default, see
// decode_pipeline_enabled): each warp streams its
// steps' K and V rows into kStages shared-memory stages with cp.async, kStages - 1
// steps ahead of the one it computes, so its loads stay in flight through the
// softmax and the mma instead of occupying registers. A stage holds 32 tokens
// x 128 bytes of K and of V in 16-byte pieces, piece p of token t at
// p ^ ((t & 1) << 2 ^ (t & 6)): both the K and the V fragment reads are then
// conflict-free (each 8-lane phase touches 8 distinct bank groups).
constexpr int kStages = 2;
constexpr bool pipelined_decode(CacheDType c, int d) {
  return (c == CacheDType::kE4M3 || c == CacheDType::kE5M2) && d == 128;
}
constexpr int kPiecesPerRow = 8;                                       // 16-byte pieces of a 128-byte FP8 head row
constexpr int kStagePieces = 32 * kPiecesPerRow;                       // per operand (K or V) and stage
constexpr size_t kPipelineSmemBytes = size_t{kWarps} * kStages * 2 * kStagePieces * 16;  // 64 KB
__device__ __forceinline__ int swizzled_piece(int t, int p) {
  return t * kPiecesPerRow + (p ^ (((t & 1) << 2) ^ (t & 6)));
}

// Blocks per SM the register budget is cut for: three where a step's tiles are
// small (H200, 2026-11-29, E4M3, 32/8 heads: 3.4 TB/s at 8 x 32768 tokens and
// 3.0 at 1 x 131072, against 3.1 and 2.8 with two blocks of 190 registers;
// prefetching the next step into registers instead, at 255, gave 2.2 and 2.0).
// plan_splits (python/fp8ext/kv_cache.py) assumes it.
constexpr int decode_min_blocks(CacheDType c, int d) {
  return d * ((c == CacheDType::kE4M3 || c == CacheDType::kE5M2) ? 1 : 2) <= 128 ? 3 : 1;
}

// Element d of head h's row of a warp's O lies at column d ^ o_swizzle(h, d)
// of o_s. A thread stores elements g D/8 + 2i (+1) of heads 2c and 2c + 1 (the
// mma's layout), so with rows of D floats the 32 lanes of one store met in 4,
// 2 or 1 banks at D = 64, 128, 256. The mask XORs bits 0-4 of d with c
// and with bits 5-7 of d, which gives the lanes 32 banks; it depends on d's
// 32-column group only (constant over a thread's stores: one mask a thread),
// and the merge reads 32 consecutive d of one head, which it only permutes.
// On the H200 the swizzle gained 0.4-0.5% at 64 x 4096 and 256 x 1024, and
// one mask a thread instead of one an element 0.1-1.6% more on 11 of the 12
// decode rows (bench/NOTES.md, sessions 28 and 29).
__device__ __forceinline__ int o_swizzle(int h, int d) {
  return (((d >> 7) & 1) << 4) | (((d >> 5) & 3) << 2) | ((h >> 1) & 3);
}

// Before the PDL wait (the kernel before may still be running): asks L2 for the
// sequence's length and for the block-table entries this split reads when the
// sequence fills its table (its share of the pages, which the token split
// matches to a page), so that the two dependent loads that start the block's
// stream hit L2 (a prefetch cannot see stale data: every write lands in L2).
// Each thread takes one 128-byte line of the range. On the H200: 0.2-0.8%
// faster at 1 x 4096, 1 x 32768 and 8 x 32768, no change on the other decode
// rows (bench/NOTES.md, session 29).
__device__ __forceinline__ void prefetch_decode_metadata(const DecodeArgs& a) {
  if (threadIdx.x == 0) prefetch_l2(a.seq_lens + blockIdx.z);
  const int pages = static_cast<int>(a.max_pages);
  const int per_split = (pages + a.num_splits - 1) / a.num_splits;
  const int entry = static_cast<int>(blockIdx.x) * per_split + 32 * static_cast<int>(threadIdx.x);
  if (entry < min(pages, static_cast<int>(blockIdx.x + 1) * per_split))
    prefetch_l2(a.block_table + blockIdx.z * a.max_pages + entry);
}

// Fragment layouts: decode_step.cuh.
template <typename Q, CacheDType C, int D, bool kPipelined>
__global__ void __launch_bounds__(kThreads, decode_min_blocks(C, D)) decode_kernel(DecodeArgs a) {
  FP8EXT_TIMELINE(const uint64_t t_entry = decode_timeline::now();)
  // Not in the register kernels: two more registers cost the 16-bit caches at
  // head_dim 128 their third block per SM (168 -> 170).
  if constexpr (kPipelined) prefetch_decode_metadata(a);
  begin_dependent_kernel();
  FP8EXT_TIMELINE(const uint64_t t_released = decode_timeline::now(); uint64_t t_first = 0, t_loop = 0;)
  using Sh = StepShape<C, D>;
  using M = typename Sh::M;
  constexpr int kE = Sh::kE, kStep = Sh::kStep, kNTiles = Sh::kNTiles, kKSteps = Sh::kKSteps;
  constexpr int kGroups = Sh::kGroups, kKWords = Sh::kKWords, kVWords = Sh::kVWords, kMTiles = Sh::kMTiles;

  static_assert(!kPipelined || (kE == 1 && D == 128 && kStep == 32), "the pipeline is laid out for FP8, D = 128");
  // Aligned so that the kernel's static shared arrays cannot move the stages
  // off a 128-byte boundary. Today's base is 256 either way (same SASS); the
  // epilogue-weights variant's 192 bytes more moved it to 448 and that kernel
  // was 4-11% slower with the same loop code (bench/NOTES.md, session 29).
  extern __shared__ __align__(128) uint4 stages[];  // pipelined: [warp][stage][K, V][piece]; then the warps' O
  __shared__ float o_static[kPipelined ? 1 : kWarps][kMaxHeads][D];
  static_assert(!kPipelined || sizeof(float) * kWarps * kMaxHeads * D <= kPipelineSmemBytes, "o_s must fit the stages");
  auto* o_s = kPipelined ? reinterpret_cast<float(*)[kMaxHeads][D]>(stages) : o_static;
  __shared__ float m_s[kWarps][kMaxHeads], l_s[kWarps][kMaxHeads];
  __shared__ float f_s[kWarps][kMaxHeads];              // each warp's weight 2^(m_w - max) per head
  __shared__ float den_s[kMaxHeads], max_s[kMaxHeads];  // per head: sum of the weighted l_w, max of m_w

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
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

  // Q as A fragments, one pair of registers per k-step (rows 8-15 are zero).
  uint32_t qa[kGroups * 4][2];
  {
    const Q* q = static_cast<const Q*>(a.q) + (b * a.q_heads + h0 + g) * D;
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float x[4] = {};
        if (g < nh) {
#pragma unroll
          for (int e = 0; e < 4; ++e) x[e] = to_float(q[64 * grp + 16 * c + 4 * j + e]) * a.softmax_scale;
        }
        qa[grp * 4 + j][0] = M::pack(x[0], x[1]);
        qa[grp * 4 + j][1] = M::pack(x[2], x[3]);
      }
  }

  float acc[kMTiles][4] = {};
  float m_run = -INFINITY, l_run = 0.0f;  // head g's running max (log2 domain) and this thread's share of the sum
  bool bad = false;
  const int row_bytes = static_cast<int>(a.kv_heads) * D * kE;  // one cache row: all KV heads of a token
  const int32_t* table = a.block_table + b * a.max_pages;
  const uint32_t page_size = static_cast<uint32_t>(a.page_size);
  const uint8_t* k_base = a.k + int64_t{kv} * D * kE;
  const uint8_t* v_base = a.v + int64_t{kv} * D * kE;

  // One step's K and V fragments, loaded straight from the pages into registers.
  struct Tiles {
    uint32_t k[kNTiles][kGroups][kKWords];
    uint32_t v[kKSteps][4][kVWords];  // tokens 2c, 2c+1, 2c+8, 2c+9 of each k-step
  };
  // Lane i's token is base + i. Its page id is loaded a step before the row is
  // needed and checked only then (resolve_row), so the table's latency overlaps
  // a step's compute instead of adding to the K/V loads' (lengths are int32, so
  // token and row numbers fit in 32 bits: the host checks).
  auto load_page = [&](int64_t base) {
    return lane < kStep && base + lane < t_end ? table[static_cast<uint32_t>(base + lane) / page_size] : 0;
  };
  // The cache row of lane i's token: -1 past the end, or for a bad page id (which sets `bad`).
  auto resolve_row = [&](int page, int64_t base) {
    if (!(lane < kStep && base + lane < t_end)) return -1;
    if (page < 0 || page >= a.num_pages) {
      bad = true;
      return -1;
    }
    return page * static_cast<int>(page_size) + static_cast<int>(static_cast<uint32_t>(base + lane) % page_size);
  };
  auto fetch_k = [&](int row, Tiles& f) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int r = __shfl_sync(0xFFFFFFFFu, row, 8 * n + g);
#pragma unroll
      for (int grp = 0; grp < kGroups; ++grp) {
        if (r >= 0) {
          load_words(k_base + static_cast<int64_t>(r) * row_bytes + (64 * grp + 16 * c) * kE, f.k[n][grp]);
        } else {
#pragma unroll
          for (int w = 0; w < kKWords; ++w) f.k[n][grp][w] = 0;
        }
      }
    }
  };
  auto fetch_v = [&](int row, Tiles& f) {
#pragma unroll
    for (int s = 0; s < kKSteps; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = __shfl_sync(0xFFFFFFFFu, row, 16 * s + 2 * c + (i & 1) + (i & 2) * 4);
        if (r >= 0) {  // tokens past the end must be zero, not stale: P = 0 times NaN is NaN
          load_words(v_base + static_cast<int64_t>(r) * row_bytes + g * (D / 8) * kE, f.v[s][i]);
        } else {
#pragma unroll
          for (int w = 0; w < kVWords; ++w) f.v[s][i][w] = 0;
        }
      }
  };

  // The next step's K and V are loaded after this step's P V product. Loading
  // K right after the scores (its registers are free then) spilled at 168
  // registers and was 10-15% slower (H200, 2026-11-29, decode bench).
  const int64_t stride = int64_t{kWarps} * kStep;
  if constexpr (!kPipelined) {
    Tiles cur;
    const int64_t first = t_begin + int64_t{warp} * kStep;
    int row = resolve_row(load_page(first), first);
    fetch_k(row, cur);
    fetch_v(row, cur);
    for (int64_t base = first; base < t_end; base += stride) {
      const int page = load_page(base + stride);  // in flight through this step's compute
      attend_step<C, D>(cur.k, cur.v, qa, acc, m_run, l_run, base, t_end, ks, a.softcap, c);
      row = resolve_row(page, base + stride);
      fetch_k(row, cur);
      fetch_v(row, cur);
    }
  } else {
    uint4* mine = stages + warp * (kStages * 2 * kStagePieces);
    // Copies step `row`'s K and V rows (lane t's row: token t of the step) into
    // stage st: lane l takes piece l % 8 of tokens l / 8 + 4m, four 128-byte
    // rows per instruction; rows of -1 are zero-filled.
    auto issue = [&](int row, int st) {
      uint4* dk = mine + st * 2 * kStagePieces;
      uint4* dv = dk + kStagePieces;
      const int p = lane % kPiecesPerRow;
#pragma unroll
      for (int m = 0; m < kStagePieces / 32; ++m) {
        const int t = lane / kPiecesPerRow + 4 * m;
        const int r = __shfl_sync(0xFFFFFFFFu, row, t);
        const int64_t off = (r >= 0 ? static_cast<int64_t>(r) * row_bytes : 0) + p * 16;
        cp_async_16(dk + swizzled_piece(t, p), k_base + off, r >= 0);
        cp_async_16(dv + swizzled_piece(t, p), v_base + off, r >= 0);
      }
      cp_async_commit();
    };
    const int64_t first = t_begin + int64_t{warp} * kStep;
    int64_t ahead = first;  // the next step to copy
    int next_row = resolve_row(load_page(ahead), ahead);
    int write = 0, read = 0;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      issue(next_row, write);
      write = (write + 1) % kStages;
      ahead += stride;
      next_row = resolve_row(load_page(ahead), ahead);
    }
    for (int64_t base = first; base < t_end; base += stride) {
      issue(next_row, write);  // kStages - 1 steps ahead (zero-filled past the end)
      write = (write + 1) % kStages;
      ahead += stride;
      const int page = load_page(ahead);  // in flight through this step's compute
      cp_async_wait<kStages - 1>();  // this step's group has landed
      __syncwarp();
      FP8EXT_TIMELINE(if (t_first == 0) t_first = decode_timeline::now();)
      const uint4* sk = mine + read * 2 * kStagePieces;
      const uint4* sv = sk + kStagePieces;
      typename Sh::KFrags kw;
      typename Sh::VFrags vw;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int grp = 0; grp < kGroups; ++grp) {
          const uint4 x = sk[swizzled_piece(8 * n + g, 4 * grp + c)];
          kw[n][grp][0] = x.x, kw[n][grp][1] = x.y, kw[n][grp][2] = x.z, kw[n][grp][3] = x.w;
        }
#pragma unroll
      for (int s2 = 0; s2 < kKSteps; ++s2)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 x = sv[swizzled_piece(16 * s2 + 2 * c + (i & 1) + (i & 2) * 4, g)];
          vw[s2][i][0] = x.x, vw[s2][i][1] = x.y, vw[s2][i][2] = x.z, vw[s2][i][3] = x.w;
        }
      attend_step<C, D>(kw, vw, qa, acc, m_run, l_run, base, t_end, ks, a.softcap, c);
      __syncwarp();  // every lane has read this stage before a later step refills it
      read = (read + 1) % kStages;
      next_row = resolve_row(page, ahead);
    }
    cp_async_wait<0>();  // the zero-fill copies past the end, before o_s reuses the stages
    __syncthreads();     // o_s spans the other warps' stages
  }

  FP8EXT_TIMELINE(t_loop = decode_timeline::now();)
  // Merge the warps: each leaves (max, sum) per head and its unnormalized O.
  l_run += __shfl_xor_sync(0xFFFFFFFFu, l_run, 1);
  l_run += __shfl_xor_sync(0xFFFFFFFFu, l_run, 2);
  if (c == 0) {
    m_s[warp][g] = m_run;
    l_s[warp][g] = l_run;
  }
  const int swizzle = o_swizzle(2 * c, g * (D / 8));  // the same for head 2c + 1 and every i
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
    const int d = (g * (D / 8) + 2 * i) ^ swizzle;  // and d + 1 ^ swizzle is d ^ 1
    o_s[warp][2 * c][d] = acc[i][0];
    o_s[warp][2 * c + 1][d] = acc[i][1];
    o_s[warp][2 * c][d ^ 1] = acc[i][2];
    o_s[warp][2 * c + 1][d ^ 1] = acc[i][3];
  }
  // A bad page id anywhere in the block, or a bad length, makes its output NaN.
  const bool bad_block = __syncthreads_or(bad || bad_len);
  FP8EXT_TIMELINE(const uint64_t t_merged = decode_timeline::now();)

  if (tid < nh) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][tid]);
    float den = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = m_s[w][tid] == -INFINITY ? 0.0f : exp2f(m_s[w][tid] - mx);
      f_s[w][tid] = f;
      den = fmaf(f, l_s[w][tid], den);
    }
    den_s[tid] = den;
    max_s[tid] = mx;
  }
  __syncthreads();

  for (int idx = tid; idx < nh * D; idx += kThreads) {
    const int h = idx / D, d = idx % D;
    const float mx = max_s[h], den = den_s[h];
    float num = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) num = fmaf(f_s[w][h], o_s[w][h][d ^ o_swizzle(h, d)], num);
    // den is NaN after a NaN score. den == 0 (no token, or every score -inf):
    // num is 0, or NaN where a -inf score met an inf in V (0 * inf, as the
    // reference's p @ v gives); keeping it lets the merge see that NaN.
    const float o = bad_block ? NAN : (den != 0.0f ? num / den * vs : num);
    const int64_t head = b * a.q_heads + h0 + h;
    if (a.num_splits == 1) {
      static_cast<Q*>(a.out)[head * D + d] = from_float<Q>(o);
    } else {
      a.part_out[(head * a.num_splits + split) * D + d] = o;
      if (d == 0) a.part_lse[head * a.num_splits + split] = bad_block ? NAN : (den != 0.0f ? mx + log2f(den) : -INFINITY);
    }
  }
  FP8EXT_TIMELINE(if (tid == 0) decode_timeline::record_decode(t_entry, t_released, t_first, t_loop, t_merged);)
}

// out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse): one block per
// (sequence, query head). Thread t sums float4 column t % (D / 4) of the
// partial outputs over every kLanes-th split from t / (D / 4); its first
// kPrefetch splits (up to 64 in all at D = 128) are loaded together with their
// log-sum-exps before the max is known, so the block waits on memory once
// instead of once per few splits (a loop over 49 splits with eight loads in
// flight left batch-1 rows ~8 us slower than batch 8, H200 2026-11-29). The
// lanes' sums meet in shared memory.
template <typename Q, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel(DecodeArgs a) {
  constexpr int kCols = D / 4;
  constexpr int kLanes = kThreads / kCols;
  constexpr int kPrefetch = 16;
  static_assert(kThreads % kCols == 0 && kLanes >= 1, "a block row covers whole partial rows");
  __shared__ float4 sum_s[kLanes][kCols];
  __shared__ float den_s[kLanes];
  __shared__ float red[32];
  FP8EXT_TIMELINE(const uint64_t t_entry = decode_timeline::now();)
  begin_dependent_kernel();
  FP8EXT_TIMELINE(const uint64_t t_released = decode_timeline::now();)
  const int64_t head = blockIdx.x;
  const int tid = threadIdx.x, n = a.num_splits, col = tid % kCols, lane = tid / kCols;
  const float* lse = a.part_lse + head * n;
  const float4* part = reinterpret_cast<const float4*>(a.part_out + head * n * D) + col;
  float l_pre[kPrefetch];
  float4 p_pre[kPrefetch];
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) {
    const int s = lane + i * kLanes;
    l_pre[i] = s < n ? lse[s] : -INFINITY;
    p_pre[i] = s < n ? part[int64_t{s} * kCols] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float mx = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) nan |= isnan(l_pre[i]), mx = fmaxf(mx, l_pre[i]);  // fmaxf skips NaNs
  for (int s = lane + kPrefetch * kLanes; s < n; s += kLanes) nan |= isnan(lse[s]), mx = fmaxf(mx, lse[s]);
  mx = detail::block_max(mx, red);
  nan = __syncthreads_or(nan);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float den = 0.0f;
  auto add = [&](float l, const float4& p) {
    const float w = l == -INFINITY ? 0.0f : exp2f(l - mx);  // 0 for an empty split, also when every split is
    den += w;
    acc.x = fmaf(w, p.x, acc.x), acc.y = fmaf(w, p.y, acc.y), acc.z = fmaf(w, p.z, acc.z), acc.w = fmaf(w, p.w, acc.w);
  };
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) add(l_pre[i], p_pre[i]);
  for (int s = lane + kPrefetch * kLanes; s < n; s += kLanes) add(lse[s], part[int64_t{s} * kCols]);
  sum_s[lane][col] = acc;
  if (col == 0) den_s[lane] = den;
  __syncthreads();
  for (int d = tid; d < D; d += kThreads) {
    float num = 0.0f, total = 0.0f;
#pragma unroll
    for (int l = 0; l < kLanes; ++l) {
      num += reinterpret_cast<const float*>(&sum_s[l][0])[d];
      total += den_s[l];
    }
    // total == 0: every split empty or all -inf; num is then 0, or NaN from a split's 0 * inf.
    const float o = nan ? NAN : (total > 0.0f ? num / total : num);
    static_cast<Q*>(a.out)[head * D + d] = from_float<Q>(o);
  }
  FP8EXT_TIMELINE(if (tid == 0) decode_timeline::record_merge(t_entry, t_released);)
}

// FP8 caches at head_dim 128 take the pipelined kernel (H200, 2026-11-30:
// 2.64-3.99 TB/s over the decode suite against 2.11-3.59 for the register
// kernel, bench/results/decode_2026-11-30_h200_run8_pipeline_default_merge.json);
// FP8EXT_DECODE_PIPELINE=0 selects the register kernel instead. Read
// at each launch, so one process can compare both (bench/bench_decode.py,
// tests/test_kv_cache_cuda.py, csrc/tests/test_paged_kv_cuda.cpp).
inline bool decode_pipeline_enabled() {
  const char* v = std::getenv("FP8EXT_DECODE_PIPELINE");
  return !(v && std::strcmp(v, "0") == 0);
}

// Launches the pipelined decode kernel for (Q, C) with its 64 KB of dynamic
// shared memory (opted into once per kernel, device and host thread, with the
// carveout that leaves room for three blocks per SM), with PDL when it is on.
template <typename Q, CacheDType C>
cudaError_t launch_pipelined(dim3 grid, cudaStream_t stream, const DecodeArgs& a) {
  constexpr auto kernel = decode_kernel<Q, C, 128, true>;
  const cudaError_t err = set_attributes_once<std::integral_constant<decltype(kernel), kernel>>([] {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kPipelineSmemBytes));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return e;
  });
  if (err != cudaSuccess) return err;
  return launch_with_smem(kernel, grid, dim3(kThreads), kPipelineSmemBytes, stream, a);
}

template <typename Q, CacheDType C>
cudaError_t launch_typed(const DecodeArgs& a, int64_t batch, int64_t head_dim, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_splits), static_cast<unsigned>(a.kv_heads * a.head_blocks),
                  static_cast<unsigned>(batch));
  const dim3 merge_grid(static_cast<unsigned>(batch * a.q_heads));
  auto run = [&](auto dim) -> cudaError_t {
    constexpr int D = decltype(dim)::value;
    cudaError_t err = cudaSuccess;
    if constexpr (pipelined_decode(C, D)) {
      if (decode_pipeline_enabled())
        err = launch_pipelined<Q, C>(grid, stream, a);
      else
        err = launch(decode_kernel<Q, C, D, false>, grid, dim3(kThreads), stream, a);
    } else {
      err = launch(decode_kernel<Q, C, D, false>, grid, dim3(kThreads), stream, a);
    }
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
      !same_pool_geometry(p.k, p.v) || p.batch > 65535 || p.num_splits > 65535)
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.num_q_heads == 0) return cudaSuccess;
  const int group = static_cast<int>(p.num_q_heads / kv_heads);
  const int head_blocks = (group + kMaxHeads - 1) / kMaxHeads;
  if (kv_heads * head_blocks > 65535) return cudaErrorInvalidValue;
  if (p.k.page_size < 1 || p.k.page_size > INT32_MAX || p.k.num_pages * p.k.page_size > INT32_MAX ||
      kv_heads * dim * 2 > INT32_MAX)
    return cudaErrorInvalidValue;  // page sizes, cache rows and row bytes are int32 in the kernel (an empty
                                   // pool must not let a page size past int32 through)
  float* part_out = static_cast<float*>(workspace);
  float* part_lse = part_out ? part_out + p.batch * p.num_q_heads * p.num_splits * dim : nullptr;
  // The merge reads the partial outputs as float4.
  if (p.num_splits > 1 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0))
    return cudaErrorInvalidValue;
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

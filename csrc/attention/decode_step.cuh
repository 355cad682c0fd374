// One warp step of paged decode attention on the tensor cores (mma.sync
// m16n8k16, fp16 operands, bf16 for a bf16 cache, fp32 accumulation), shared by
// the register and the pipelined decode kernels (paged_decode.cu): given the
// step's K and V fragments, the scores, the online softmax and O^T += V^T P^T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "fp8ext/paged_kv_cuda.h"

namespace fp8ext::cuda::decode {

constexpr float kLog2e = 1.4426950408889634f;

// The mma's operand type for a cache: fp16 holds every E4M3 and E5M2 code exactly.
template <CacheDType C>
struct MmaOf {
  static constexpr bool kBf16 = C == CacheDType::kBFloat16;
  static constexpr int kBytes = (C == CacheDType::kE4M3 || C == CacheDType::kE5M2) ? 1 : 2;  // per cache element

  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    uint32_t r;
    if constexpr (kBf16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      r = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(lo, hi);
      r = *reinterpret_cast<const uint32_t*>(&h);
    }
    return r;
  }

  // Two cache elements (the low 16 bits of x for FP8, all of x otherwise) as an operand register.
  __device__ __forceinline__ static uint32_t pair(uint32_t x) {
    if constexpr (kBytes == 1) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xFFFFu),
                                                       C == CacheDType::kE5M2 ? __NV_E5M2 : __NV_E4M3);
      return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    } else {
      return x;
    }
  }
};

template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Fragment layout (PTX m16n8k16; g = lane / 4, c = lane % 4):
//   A 16x16: {a0,a1} (g, 2c..2c+1), {a2,a3} (g+8, 2c..), {a4,a5} (g, 2c+8..), {a6,a7} (g+8, 2c+8..)
//   B 16x8:  {b0,b1} (k 2c..2c+1, n g), {b2,b3} (k 2c+8.., n g)
//   C 16x8:  c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..)
// S = Q K^T: m = query head (rows 8-15 unused), n = token g of an 8-token tile,
// k = head dim. Thread c holds elements [16c, 16c + 16) of each 64-dim group
// of its token; k-step j of the group takes elements 4j..4j+3 as (2c, 2c+1,
// 2c+8, 2c+9).
// O^T = V^T P^T: m = head dim, n = query head, k = token. Thread (g, c) holds
// elements [g D/8, (g+1) D/8) of tokens 2c, 2c+1, 2c+8, 2c+9; m-tile i takes
// elements 2i (row g) and 2i + 1 (row g + 8) of that slice.
// Per-warp step sizes of the decode kernels for a cache type and head dim.
template <CacheDType C, int D>
struct StepShape {
  using M = MmaOf<C>;
  static constexpr int kE = M::kBytes;
  static constexpr int kStep = D * kE <= 128 ? 32 : 16;  // tokens per warp step (registers bound it)
  static constexpr int kNTiles = kStep / 8;               // S tiles per step
  static constexpr int kKSteps = kStep / 16;              // P V k-steps per step
  static constexpr int kGroups = D / 64;                  // 64-dim groups of the S k-loop
  static constexpr int kKWords = 16 * kE / 4;             // words of one thread's K slice per group
  static constexpr int kVWords = D / 8 * kE / 4;          // words of one thread's V slice per token
  static constexpr int kMTiles = D / 16;                  // O^T tiles
  static_assert(D % 64 == 0 && kStep <= 32, "head_dim 64, 128 or 256");
  using KFrags = uint32_t[kNTiles][kGroups][kKWords];
  using VFrags = uint32_t[kKSteps][4][kVWords];  // tokens 2c, 2c+1, 2c+8, 2c+9 of each k-step
};

// One warp step: the scores of its tokens [base, base + kStep) from the K
// fragments, the online softmax, and O^T += V^T P^T from the V fragments
// (fragment layouts below, at decode_kernel).
template <CacheDType C, int D>
__device__ __forceinline__ void attend_step(const typename StepShape<C, D>::KFrags& kw,
                                            const typename StepShape<C, D>::VFrags& vw,
                                            const uint32_t (&qa)[StepShape<C, D>::kGroups * 4][2],
                                            float (&acc)[StepShape<C, D>::kMTiles][4], float& m_run, float& l_run,
                                            int64_t base, int64_t t_end, float ks, float softcap, int c) {
  using Sh = StepShape<C, D>;
  using M = typename Sh::M;
  constexpr int kE = Sh::kE, kNTiles = Sh::kNTiles, kKSteps = Sh::kKSteps, kGroups = Sh::kGroups;
  constexpr int kMTiles = Sh::kMTiles;
    // Scores of head g for tokens 8n + 2c + {0, 1}.
    float sc[kNTiles][4];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int grp = 0; grp < kGroups; ++grp)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b0, b1;
          if constexpr (kE == 1) {
            b0 = M::pair(kw[n][grp][j]);
            b1 = M::pair(kw[n][grp][j] >> 16);
          } else {
            b0 = kw[n][grp][2 * j];
            b1 = kw[n][grp][2 * j + 1];
          }
          mma16816<M::kBf16>(sc[n], qa[grp * 4 + j][0], 0u, qa[grp * 4 + j][1], 0u, b0, b1);
        }
    }

    // Online softmax over the step; the four threads of a head share its max.
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = sc[n][e] * ks;
        if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
        x = base + 8 * n + 2 * c + e < t_end ? x * kLog2e : -INFINITY;
        sc[n][e] = x;
        mx = fmaxf(mx, x);  // a NaN score is skipped here and poisons its p below
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    const float alpha = m_run == -INFINITY ? 0.0f : exp2f(m_run - m_new);  // +inf - +inf: NaN, as softmax gives
    m_run = m_new;
    l_run *= alpha;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = sc[n][e] == -INFINITY ? 0.0f : exp2f(sc[n][e] - m_new);
        sc[n][e] = p;
        l_run += p;
      }

    // O^T += V^T P^T: this thread's accumulators belong to heads 2c and 2c + 1.
    if (__any_sync(0xFFFFFFFFu, alpha != 1.0f)) {  // most steps keep the max
      const float alpha0 = __shfl_sync(0xFFFFFFFFu, alpha, 8 * c), alpha1 = __shfl_sync(0xFFFFFFFFu, alpha, 8 * c + 4);
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        acc[i][0] *= alpha0, acc[i][2] *= alpha0;
        acc[i][1] *= alpha1, acc[i][3] *= alpha1;
      }
    }
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      const uint32_t b0 = M::pack(sc[2 * s][0], sc[2 * s][1]);
      const uint32_t b1 = M::pack(sc[2 * s + 1][0], sc[2 * s + 1][1]);
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        // Elements 2i and 2i+1 of the slice of tokens (2c, 2c+1) and (2c+8, 2c+9).
        uint32_t lo, hi;  // (t0 elem, t1 elem) pairs for rows g and g + 8
        uint32_t a0, a1, a2, a3;
        if constexpr (kE == 1) {
          const int w = i / 2, sel = (i % 2) ? 0x7362 : 0x5140;
          lo = __byte_perm(vw[s][0][w], vw[s][1][w], sel);
          hi = __byte_perm(vw[s][2][w], vw[s][3][w], sel);
          a0 = M::pair(lo), a1 = M::pair(lo >> 16), a2 = M::pair(hi), a3 = M::pair(hi >> 16);
        } else {
          a0 = __byte_perm(vw[s][0][i], vw[s][1][i], 0x5410), a1 = __byte_perm(vw[s][0][i], vw[s][1][i], 0x7632);
          a2 = __byte_perm(vw[s][2][i], vw[s][3][i], 0x5410), a3 = __byte_perm(vw[s][2][i], vw[s][3][i], 0x7632);
        }
        mma16816<M::kBf16>(acc[i], a0, a1, a2, a3, b0, b1);
      }
    }
}

}  // namespace fp8ext::cuda::decode

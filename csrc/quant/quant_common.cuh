// Building blocks of the quantization kernels: 16-element chunks (two or four
// 16-byte loads, one 16-byte FP8 store per thread where alignment allows: more
// bytes in flight per thread), the FP8 encoding of a chunk, and max reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "fp8ext/cuda_launch.h"
#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda::detail {

constexpr int kChunk = 16;  // elements per thread-chunk: 32 B of bf16/fp16, 16 B of FP8

// Chunks of T in one 128-byte line: a kernel that asks L2 for its first lines
// (prefetch_l2) does it from one thread in this many.
template <typename T>
constexpr int kChunksPerLine = 128 / (kChunk * static_cast<int>(sizeof(T)));

// Blocks of `kernel` (`threads` a block) resident on the GPU at once: a wave
// of the one-block-per-row grids. 0 where CUDA cannot tell (its error cleared).
template <typename Kernel>
inline int64_t resident_wave(Kernel kernel, int threads) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return int64_t{per_sm} * current_device_info().sm_count;
}

// Asks L2 for the 128-byte lines holding [begin, end), a line a thread per step
// of the block, without waiting. The one-block-per-row kernels call it for the
// row that the block taking their place will read (silu_mul_quantize.cu,
// rms_norm_quantize.cu), so those loads overlap the block's compute,
// reductions and stores.
__device__ __forceinline__ void prefetch_span_l2(const void* begin, const void* end) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) & ~uintptr_t{127};
  for (uintptr_t line = first + threadIdx.x * uintptr_t{128}; line < reinterpret_cast<uintptr_t>(end);
       line += blockDim.x * uintptr_t{128})
    prefetch_l2(reinterpret_cast<const void*>(line));
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
// cvt.f32.f16 gives every NaN the positive canonical NaN; the half's sign bit is
// put back (a no-op for numbers), as x86's conversion keeps it and the CPU
// quantizers then encode a negative NaN as 0xFF (torch.neg of a NaN makes one).
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __uint_as_float(__float_as_uint(__half2float(v)) | ((uint32_t{__half_as_ushort(v)} & 0x8000u) << 16));
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// float -> T, rounded to nearest even.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Two floats rounded to a 16-bit T (to nearest even, as from_float) in one
// instruction, and back: for kernels that round every element to T.
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

// A streaming (evict-first) 16-byte load if `on`, else zeros, with no branch:
// a predicated ld.global.cs (volatile, as __ldcs, so it stays after the PDL wait).
__device__ __forceinline__ uint4 load_streaming_if(bool on, const uint4* p) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred on;\n setp.ne.b32 on, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @on ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(on)));
  return v;
}

// The input matrix, typed. `vec` says rows start 16-byte aligned, so a chunk
// starting at a multiple of 16 columns can be read with vector loads. A chunk
// can be kept raw (in its input type: half the registers of floats for 16-bit
// inputs) and unpacked when needed.
template <typename T>
struct Input {
  using Element = T;
  static constexpr int kWords = kChunk * static_cast<int>(sizeof(T)) / 16;  // 16-byte words per chunk
  union Raw {
    uint4 words[kWords];
    T elems[kChunk];
  };

  const T* data;
  int64_t rows, cols, row_stride;
  bool vec;

  // Columns past `cols` read as zeros. Streaming loads (evict-first): each
  // byte is read once per pass. kCompact takes the element-wise path (unaligned
  // rows, a row's last chunk) out of line: see quantize_chunk.
  template <bool kCompact = false>
  __device__ __forceinline__ void load_raw(int64_t r, int64_t c0, Raw& raw) const {
    const T* p = data + r * row_stride + c0;
    if (vec && c0 + kChunk <= cols) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) raw.words[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
    } else if (kCompact) {
      raw = load_elementwise(p, cols - c0);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) raw.elems[i] = c0 + i < cols ? p[i] : T(0.0f);
    }
  }

  // load_raw in two halves, for kernels that load several chunks or operands
  // at once: issue_raw starts chunk c0's vector load where load_raw would take
  // it, predicated (zeros elsewhere, and where !active), and finish_raw loads
  // the other chunks element-wise. Issue every chunk before finishing any:
  // where a branch around a load merges, nvcc unpacks Raw's 16-bit elements,
  // which waits for the load (RMSNorm's x, weight and residual loads had gone
  // one after another: three memory round trips where one was needed).
  __device__ __forceinline__ bool vector_chunk(int64_t c0) const { return vec && c0 + kChunk <= cols; }

  __device__ __forceinline__ void issue_raw(int64_t r, int64_t c0, Raw& raw, bool active = true) const {
    const auto* p = reinterpret_cast<const uint4*>(data + r * row_stride + c0);
    const bool on = active && vector_chunk(c0);
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw.words[i] = load_streaming_if(on, p + i);
  }

  template <bool kCompact = false>
  __device__ __forceinline__ void finish_raw(int64_t r, int64_t c0, Raw& raw, bool active = true) const {
    if (!active || vector_chunk(c0)) return;
    const T* p = data + r * row_stride + c0;
    if (kCompact) {
      raw = load_elementwise(p, cols - c0);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) raw.elems[i] = c0 + i < cols ? p[i] : T(0.0f);
    }
  }

  __device__ __noinline__ static Raw load_elementwise(const T* p, int64_t valid) {
    Raw raw;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) raw.elems[i] = i < valid ? p[i] : T(0.0f);
    return raw;
  }

  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kChunk]) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = to_float(raw.elems[i]);
  }

  template <bool kCompact = false>
  __device__ __forceinline__ void load(int64_t r, int64_t c0, float (&v)[kChunk]) const {
    Raw raw;
    load_raw<kCompact>(r, c0, raw);
    unpack(raw, v);
  }
};

// y = T(T(f(a)) * b) for the chunk at column c0, the shape of both fused
// activations (RMSNorm: f(x) = x * inv_rms, b the weight; SwiGLU: f = silu, b
// = up), kept in T: f in fp32, each product rounded to T as PyTorch does, a
// 16-bit T two values an instruction (Pair). Columns past `cols` are 0 (the K
// padding), also where f gives NaN.
template <typename T, typename F>
__device__ __forceinline__ typename Input<T>::Raw rounded_product_chunk(const typename Input<T>::Raw& a,
                                                                        const typename Input<T>::Raw& b,
                                                                        int64_t c0, int64_t cols, F f) {
  typename Input<T>::Raw y;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) y.elems[i] = f(a.elems[i]) * b.elems[i];
  } else {
    using P = Pair<T>;
    const auto* a2 = reinterpret_cast<const typename P::Packed*>(a.elems);
    const auto* b2 = reinterpret_cast<const typename P::Packed*>(b.elems);
    auto* y2 = reinterpret_cast<typename P::Packed*>(y.elems);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
      const float2 af = P::unpack(a2[i]), bf = P::unpack(b2[i]);
      const float2 ff = P::unpack(P::round(f(af.x), f(af.y)));
      y2[i] = P::round(ff.x * bf.x, ff.y * bf.y);
    }
  }
  if (c0 + kChunk > cols) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      if (c0 + i >= cols) y.elems[i] = T(0.0f);
  }
  return y;
}

// Sixteen FP8 codes, one chunk: stored with one 16-byte store.
union Codes {
  uint4 vec;
  uint32_t words[4];
  uint8_t bytes[kChunk];
};

// The FP8 output [rows, padded_cols]; columns past `cols` are written as zeros.
struct Output {
  uint8_t* data;
  int64_t rows, cols, padded_cols;
  bool vec;  // rows start 16-byte aligned

  template <bool kCompact = false>
  __device__ __forceinline__ void store(int64_t r, int64_t c0, Codes q) const {
    uint8_t* p = data + r * padded_cols + c0;
    if (kCompact && (c0 + kChunk > cols || !vec || c0 + kChunk > padded_cols)) {
      store_elementwise(p, q, cols - c0, padded_cols - c0);  // rare: out of line (see quantize_chunk)
      return;
    }
    if (c0 + kChunk > cols) {  // the last chunk of a row that ends mid-chunk
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        if (c0 + i >= cols) q.bytes[i] = 0;
    }
    if (vec && c0 + kChunk <= padded_cols) {
      __stcs(reinterpret_cast<uint4*>(p), q.vec);  // streaming: not re-read by this kernel
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        if (c0 + i < padded_cols) p[i] = q.bytes[i];
    }
  }

  // Element-wise: bytes past `valid` are written as zeros, none past `room`.
  __device__ __noinline__ static void store_elementwise(uint8_t* p, Codes q, int64_t valid, int64_t room) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      if (i < room) p[i] = i < valid ? q.bytes[i] : uint8_t{0};
  }
};

// Saturating encode of two values into a 16-bit pair (a in the low byte). On
// sm_89+ the hardware conversion (RNE, satfinite: +-Inf and overflow -> +-max)
// does the work. It returns a positive canonical NaN, so with kNaNs the NaN
// codes are patched to keep their sign like the CPU code; without, the caller
// guarantees there are no NaNs.
template <Fp8Format F, bool kNaNs>
__device__ __forceinline__ uint32_t encode2_saturate(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr __nv_fp8_interpretation_t kind = F == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  uint32_t r = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
  if (kNaNs) {
    if (a != a) r = (r & 0xFF00u) | ((__float_as_uint(a) >> 24) & 0x80u) | 0x7Fu;
    if (b != b) r = (r & 0x00FFu) | ((((__float_as_uint(b) >> 24) & 0x80u) | 0x7Fu) << 8);
  }
  return r;
#else
  return encode_fp8_saturate(a, F) | (uint32_t{encode_fp8_saturate(b, F)} << 8);
#endif
}

// Four values into one word of codes.
template <Fp8Format F, bool kNaNs>
__device__ __forceinline__ uint32_t encode4_saturate(const float* v) {
  return __byte_perm(encode2_saturate<F, kNaNs>(v[0], v[1]), encode2_saturate<F, kNaNs>(v[2], v[3]), 0x5410);
}

// A scale with its reciprocal, so a chunk divides with a multiply and two FMAs.
struct Scale {
  float s, r;
  bool fast;  // fast_quotient applies to this scale
  __device__ __forceinline__ explicit Scale(float scale)
      : s(scale), r(1.0f / scale), fast(fast_division_ok(scale)) {}  // IEEE: r = RN(1 / s)
};

// scale_from_amax, bit for bit, with its division done by fast_quotient: the
// 1x128 group kernel derives a scale per 128 elements, where the IEEE division's
// ~20 instructions showed (bench/NOTES.md). Below 2^-80 (fast_quotient's
// residual could underflow), above 2^100 (the clamps may apply) and for zeros,
// NaNs and infinities, the exact function answers.
template <Fp8Format F>
__device__ __forceinline__ float scale_from_amax_fast(float amax, const ScaleRule& rule) {
  const float scaled_amax = amax * exp2_int(rule.margin);
  if (!(scaled_amax >= 0x1p-80f && scaled_amax <= 0x1p100f)) return scale_from_amax(amax, rule);
  constexpr float kMax = fp8_max(F);
  const float s = fast_quotient(scaled_amax, kMax, 1.0f / kMax);  // within [2^-89, 2^92]: no clamp applies
  return rule.power_of_two ? round_up_to_power_of_two(s) : s;
}

// The rare path of quantize_chunk for 8 values, out of line: IEEE divisions and
// the NaN-keeping encode are ~250 instructions that every inlined copy would
// carry otherwise (the instruction cache's cost in small kernels, below).
template <Fp8Format F>
__device__ __noinline__ void quantize_part_exact(const float* v, float s, uint32_t* words) {
  float d[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) d[i] = ieee_quotient(v[i], s);
  words[0] = encode4_saturate<F, true>(d);
  words[1] = encode4_saturate<F, true>(d + 4);
}

// q = saturating_cast(v / scale) for a chunk, bit-exact with the CPU reference's
// IEEE division. The fast path (see fast_quotient) costs ~4 instructions per
// element; a part of 8 holding a NaN, an infinity or a zero quotient (rare, so
// the branch is nearly free) is redone with IEEE divisions. A zero of v stays
// on the fast path: a residual add's cancellations put one in ~1 part of 60,
// which sent most warps of a row down the rare path (bench/NOTES.md, session
// 44), and padding rows or ReLU-like activations are mostly zeros: on an H100,
// 16384 x 8192 bf16 with half zeros took 2.2-2.6x as long as random data to
// quantize before (session 45). kCompact calls the rare path out of line: for
// the one-block-per-row kernels of a decode step, which run cold (their code evicted by the GEMMs between calls), code size
// is time: 110 KB of SASS made the residual RMSNorm kernel take 10.8 us in
// the engine against 4.9 us warm (H200, 2026-12-01; ncu: instruction-fetch stalls).
template <Fp8Format F, bool kCompact = false>
__device__ __forceinline__ Codes quantize_chunk(const float (&v)[kChunk], Scale scale) {
  constexpr int kPart = 8;  // checked in parts: fewer live registers than the whole chunk
  Codes q;
#pragma unroll
  for (int p = 0; p < kChunk; p += kPart) {
    float d[kPart];
    bool exact = !scale.fast;
    if (scale.fast) {
#pragma unroll
      for (int i = 0; i < kPart; ++i) {
        d[i] = fast_quotient(v[p + i], scale.s, scale.r);
        exact |= !(fabsf(d[i]) > 0.0f);  // zero or NaN
      }
      if (exact) {      // a zero of v is its own quotient, its sign kept (fast_quotient gives
        exact = false;  // +0 for -0); a zero from a nonzero v (underflow) or a NaN is not
#pragma unroll
        for (int i = 0; i < kPart; ++i) {
          const bool zero = v[p + i] == 0.0f;
          if (zero) d[i] = v[p + i];
          exact |= !zero && !(fabsf(d[i]) > 0.0f);
        }
      }
    }
    if (exact && kCompact) {
      static_assert(kPart == 8, "quantize_part_exact takes 8 values");
      float part[kPart];
#pragma unroll
      for (int i = 0; i < kPart; ++i) part[i] = v[p + i];
      quantize_part_exact<F>(part, scale.s, &q.words[p / 4]);
    } else if (exact) {
#pragma unroll
      for (int i = 0; i < kPart; ++i) d[i] = ieee_quotient(v[p + i], scale.s);
#pragma unroll
      for (int i = 0; i < kPart; i += 4) q.words[(p + i) / 4] = encode4_saturate<F, true>(d + i);
    } else {
#pragma unroll
      for (int i = 0; i < kPart; i += 4) q.words[(p + i) / 4] = encode4_saturate<F, false>(d + i);
    }
  }
  return q;
}

// Max of |v| with NaNs skipped (fmaxf) but infinities kept: one instruction per
// element. Where it comes out infinite (rare), the caller redoes the max with
// chunk_finite_max, since amax is taken over finite values only.
__device__ __forceinline__ float chunk_abs_max(const float (&v)[kChunk]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

__device__ __forceinline__ float chunk_finite_max(const float (&v)[kChunk]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) m = fmaxf(m, finite_abs(v[i]));
  return m;
}

__device__ __forceinline__ float chunk_amax(const float (&v)[kChunk]) {
  const float m = chunk_abs_max(v);
  return m != INFINITY ? m : chunk_finite_max(v);
}

// Calls fn(k, c) for this thread's first N chunk columns of a row, c =
// threadIdx.x + k * blockDim.x (the chunks a one-row block keeps in registers).
template <int N, class Fn>
__device__ __forceinline__ void for_own_chunks(Fn&& fn) {
#pragma unroll
  for (int k = 0; k < N; ++k) fn(k, threadIdx.x + int64_t{k} * blockDim.x);
}

// This thread's own chunks of row r raw into registers, in Input's two halves:
// issue_row_chunks for every operand a kernel needs, then finish_row_chunks
// for each (see issue_raw). Chunks past the row hold zeros (the K padding).
template <int N, typename T>
__device__ __forceinline__ void issue_row_chunks(const Input<T>& in, int64_t r, int64_t chunks,
                                                 typename Input<T>::Raw (&raw)[N]) {
  for_own_chunks<N>([&](int k, int64_t c) { in.issue_raw(r, c * kChunk, raw[k], c < chunks); });
}

template <bool kCompact = false, int N, typename T>
__device__ __forceinline__ void finish_row_chunks(const Input<T>& in, int64_t r, int64_t chunks,
                                                  typename Input<T>::Raw (&raw)[N]) {
  for_own_chunks<N>([&](int k, int64_t c) { in.template finish_raw<kCompact>(r, c * kChunk, raw[k], c < chunks); });
}

// The same chunks in one step, where one operand is loaded at a time (per-row
// quantization, the ring kernel's weight, fp32 SwiGLU): there the branches merge in whole
// words (SASS), so its loads already went out together, and the per-token
// kernel's issue-3 figures were measured with this code.
template <bool kCompact = false, int N, typename T>
__device__ __forceinline__ void load_row_chunks(const Input<T>& in, int64_t r, int64_t chunks,
                                                typename Input<T>::Raw (&raw)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) {  // (written out: for_own_chunks changed this kernel's SASS)
    const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
    if (c < chunks) {
      in.template load_raw<kCompact>(r, c * kChunk, raw[k]);
    } else {
#pragma unroll
      for (int i = 0; i < Input<T>::kWords; ++i) raw[k].words[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Finite amax of chunks held raw in registers. All loads must have been issued
// before this is called: the branch here would otherwise serialise them.
template <typename T, int N>
__device__ __forceinline__ float raw_chunks_amax(const typename Input<T>::Raw (&raw)[N]) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float v[kChunk];
    Input<T>::unpack(raw[k], v);
    m = fmaxf(m, chunk_abs_max(v));
  }
  if (m != INFINITY) return m;
  m = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float v[kChunk];
    Input<T>::unpack(raw[k], v);
    m = fmaxf(m, chunk_finite_max(v));
  }
  return m;
}

// op(v) over the block; every thread gets the result. `identity` fills the
// lanes past the last warp; `smem` holds 32 floats.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* smem, float identity, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto warp_reduce = [&](float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
    return x;
  };
  v = warp_reduce(v);
  __syncthreads();  // smem may still be read from a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  return warp_reduce(lane < warps ? smem[lane] : identity);
}

// Max over the block, of values of any sign (NaNs skipped; -inf, not 0, fills
// the missing lanes: the decode merge reduces negative log-sum-exps).
__device__ __forceinline__ float block_max(float v, float* smem) {
  return block_reduce(v, smem, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
}

__device__ __forceinline__ float block_sum(float v, float* smem) {
  return block_reduce(v, smem, 0.0f, [](float a, float b) { return a + b; });
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
  const bool vec = aligned(q.data, 16) && (q.rows <= 1 || q.padded_cols % 16 == 0);
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

inline int num_sms() { return current_device_info().sm_count; }

// Rows a block takes per step in the row-striding kernels. Measured on the H200
// (bench/NOTES.md): the quantizing kernels are fastest at two (four cost ~6%:
// registers), the read-only amax pass at four 16-bit rows (64 bytes in flight).
constexpr int kQuantizeRowsPerStep = 2;
template <typename T>
constexpr int kAmaxRowsPerStep = sizeof(T) == 4 ? 2 : 4;

// Blocks per SM that the row-striding kernels' grids aim at, in all (not at
// once). Below rows_per_step * num_sms * blocks_per_sm / x_blocks rows (12672
// at 48 for rows of up to 4096 16-bit columns in the 2-row passes) every row
// group gets its own block. Measured in one process, 16384 x 8192 bf16 on the
// H200, with the codes checked equal:
// - single-pass kernels (static, delayed, 1x128; cast follows, untimed): 48.
//   Against 32 (2026-12-02, quantize_blocks_per_sm_session14_2026-12-02_h200_04748b2.json):
//   static 104.6 vs 105.9 us, delayed 110.0 vs 111.2, 1x128 114.3 vs 115.0;
//   64 gave static 104.3 but delayed 111.9. 32 had beaten 16 by 1.8 us static.
// - per-tensor current scaling's amax and quantize passes: 32. Its quantize
//   pass at 48 took 169.1 us against 168.4 at 32 (64: 168.3, within noise);
//   the amax pass at 16 was within noise too (168.9 with the quantize pass at 48).
constexpr int64_t kRowStepBlocksPerSm = 48;
constexpr int64_t kCurrentScalingBlocksPerSm = 32;

// Grid height for those kernels: about blocks_per_sm blocks per SM in all,
// with the row groups spread evenly over them. A grid that would leave SMs
// idle (decode-sized activations) gets a block per row instead: such a call
// is a chain of latencies, and one row a thread halves it.
inline unsigned row_step_grid_y(int64_t rows, int64_t x_blocks, int rows_per_step, int64_t blocks_per_sm) {
  if (rows * x_blocks <= num_sms()) return static_cast<unsigned>(std::max<int64_t>(1, rows));
  const int64_t groups = std::max<int64_t>(1, ceil_div(rows, rows_per_step));
  const int64_t target =
      std::max<int64_t>(1, int64_t{num_sms()} * blocks_per_sm / std::max<int64_t>(1, x_blocks));
  const int64_t steps = ceil_div(groups, target);
  return static_cast<unsigned>(std::min<int64_t>(ceil_div(groups, steps), 65535));
}

}  // namespace fp8ext::cuda::detail

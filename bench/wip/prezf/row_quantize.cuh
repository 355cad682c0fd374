// The per-row quantization step that the fused kernels share: they differ in
// how a row's values y are made (for_each_y), not in how y is quantized.
#pragma once

#include "quant_common.cuh"

namespace fp8ext::cuda::detail {

// Max of |y| over a chunk kept in T, with chunk_amax's rules (NaNs skipped,
// infinities only where nothing finite is larger). 16-bit T takes the max in
// pairs, without unpacking: the max of values in T is one of them, so exact.
template <typename T>
__device__ __forceinline__ float raw_amax(const typename Input<T>::Raw& y) {
  if constexpr (sizeof(T) == 4) {
    return chunk_amax(y.elems);
  } else {
    using P = Pair<T>;
    // |y| by clearing the sign bits (exact for subnormals and NaN, where an
    // arithmetic abs might flush or quiet them)
    auto abs2 = [&](int i) {
      const uint32_t bits = reinterpret_cast<const uint32_t*>(y.elems)[i] & 0x7fff7fffu;
      return *reinterpret_cast<const typename P::Packed*>(&bits);
    };
    typename P::Packed m = abs2(0);
#pragma unroll
    for (int i = 1; i < kChunk / 2; ++i) m = __hmax2(m, abs2(i));
    const float2 mf = P::unpack(m);
    const float a = fmaxf(fmaxf(mf.x, mf.y), 0.0f);  // 0 where both halves are NaN
    if (a != INFINITY) return a;
    float v[kChunk];
    Input<T>::unpack(y, v);
    return chunk_finite_max(v);
  }
}

// for_each_y(fn) calls fn(c0, y) for each of this thread's chunks of row r
// (y: kChunk values in T from column c0, zeros past the row's end), every
// written chunk of the row covered once by the block. Writes the row's scale
// (amax of y, as quantize_per_row derives it) and its codes. Called by the
// whole block. Rare paths are out of line (kCompact: see quantize_chunk): these
// kernels run once per layer in a decode step, with a cold instruction cache.
template <Fp8Format F, typename T, typename ForEachY>
__device__ __forceinline__ void quantize_row(ForEachY&& for_each_y, const Output& out, int64_t r,
                                             const ScaleRule& rule, float* row_scales, float* smem) {
  using Raw = typename Input<T>::Raw;
  float amax = 0.0f;
  for_each_y([&](int64_t, const Raw& y) { amax = fmaxf(amax, raw_amax<T>(y)); });
  const float s = scale_from_amax(block_max(amax, smem), rule);
  if (threadIdx.x == 0) row_scales[r] = s;
  const Scale scale(s);
  for_each_y([&](int64_t c0, const Raw& y) {
    float v[kChunk];
    Input<T>::unpack(y, v);
    out.store<true>(r, c0, quantize_chunk<F, true>(v, scale));
  });
}

}  // namespace fp8ext::cuda::detail

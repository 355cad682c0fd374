// The per-row quantization step that the fused kernels share: they differ in
// how a row's values y are made (for_each_y), not in how y is quantized.
#pragma once

#include "quant_common.cuh"

namespace fp8ext::cuda::detail {

// for_each_y(fn) calls fn(c0, y) for each of this thread's chunks of row r
// (y: kChunk floats from column c0, zeros past the row's end), every written
// chunk of the row covered once by the block. Writes the row's scale (amax of
// y, as quantize_per_row derives it) and its codes. Called by the whole block.
// Rare paths are out of line (kCompact: see quantize_chunk): these kernels run
// once per layer in a decode step, with a cold instruction cache.
template <Fp8Format F, typename ForEachY>
__device__ __forceinline__ void quantize_row(ForEachY&& for_each_y, const Output& out, int64_t r,
                                             const ScaleRule& rule, float* row_scales, float* smem) {
  float amax = 0.0f;
  for_each_y([&](int64_t, const float (&y)[kChunk]) { amax = fmaxf(amax, chunk_amax(y)); });
  const float s = scale_from_amax(block_max(amax, smem), rule);
  if (threadIdx.x == 0) row_scales[r] = s;
  const Scale scale(s);
  for_each_y([&](int64_t c0, const float (&y)[kChunk]) { out.store<true>(r, c0, quantize_chunk<F, true>(y, scale)); });
}

}  // namespace fp8ext::cuda::detail

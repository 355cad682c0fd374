// scaled_mm for decode-sized M without the tensor cores (GemmConfig::kGemv):
// at M = 1 to 4 a decode step's GEMM is a stream of the weight, and the
// swap-AB CUTLASS kernels read it at 1.9-2.9 TB/s on the H200, partly because
// N / 64 tiles leave SMs idle (4096 x 4096: 64 CTAs on 132 SMs).
//
// Here each warp owns kRows rows of B (output columns) and walks all of K:
// lane l takes the 16-byte chunks l, l + 32, ... of each of its rows, with
// kLoadsInFlight streaming loads issued before any is used (the first version,
// 4 rows per warp and 8 loads per lane, left too few bytes in flight: N = 4096
// gave only 1024 warps, about 8 per SM). The FP8 codes are converted to fp32
// in registers and accumulated against A's rows (up to kMaxM, read through L1:
// every warp of an SM reads the same A), in fp32, then the warp reduces and
// applies the scales and bias. Products of two FP8 codes are exact in fp32, so
// this accumulates more precisely than the tensor cores' FP8 MMA. M > kMaxM
// runs in groups of kMaxM rows of A, each reading all of B again: correct at
// any M, meant for M <= kMaxM.
//
// Before waiting for the kernel before in the stream (PDL), each warp asks L2
// for the lines of its first round of loads of the weight (`prefetch_l2`,
// fp8ext/cuda_launch.h), so the fetch overlaps that kernel's end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>

#include "../quant/quant_common.cuh"  // to_float / from_float
#include "fp8ext/cuda_launch.h"
#include "scaled_gemv.h"

namespace fp8ext::cuda {
namespace {

constexpr int kWarps = 8;           // warps per block
constexpr int kLoadsInFlight = 8;   // 16-byte loads of B per lane issued before any is used
constexpr int kChunk = detail::kChunk;  // 16 FP8 codes: one 16-byte load

struct GemvArgs {
  const uint8_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  int64_t m, n, k;  // m: rows of A in this launch (a points at the first)
  const float* scale_a;
  bool scale_a_per_row;
  const float* scale_b;
  bool scale_b_per_row;
  const void* bias;
  void* d;
  int64_t ldd;
};

// 16 E4M3 codes to fp32 (exact), through the f16x2 conversion of sm_89+.
__device__ __forceinline__ void e4m3_to_float(const uint4& w, float (&v)[kChunk]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>((words[i] >> (16 * h)) & 0xFFFFu);
      const __half2 two = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
      const float2 f = __half22float2(two);
      v[4 * i + 2 * h] = f.x;
      v[4 * i + 2 * h + 1] = f.y;
    }
  }
}

// Rows of B per warp: 2 was fastest at M = 1 on every Llama-3.1-8B decode
// layer (run 7740452, us for 1 / 2 / 4 rows: 6144x4096 10.4 / 9.5 / 12.2,
// 4096x4096 7.8 / 6.5 / 11.1, 28672x4096 35.2 / 32.0 / 32.4, 4096x14336
// 21.0 / 17.3 / 36.2). FP8EXT_GEMV_ROWS=1|2|4 overrides it (read at each call,
// for scripts/device/time_gemv.py).
int gemv_rows() {
  if (const char* v = std::getenv("FP8EXT_GEMV_ROWS")) {
    const int r = std::atoi(v);
    if (r == 1 || r == 2 || r == 4) return r;
  }
  return 2;
}

// kM rows of A against kRows rows of B per warp.
template <int kM, int kRows, typename D>
__global__ void __launch_bounds__(kWarps * 32) scaled_gemv_kernel(GemvArgs g) {
  constexpr int kU = kLoadsInFlight / kRows;  // chunks per row per round, 32 apart
  const int lane = threadIdx.x % 32;
  const int64_t n0 = (int64_t{blockIdx.x} * kWarps + threadIdx.x / 32) * kRows;
  const int64_t chunks = g.k / kChunk;
  // Rows past N repeat the last one (their sums are not written).
  auto row = [&](int r) { return g.b + (n0 + r < g.n ? n0 + r : g.n - 1) * g.ldb; };
  if (n0 < g.n && lane % 8 == 0) {  // one lane per 128-byte line of the first round
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (lane + 32 * u < chunks) prefetch_l2(row(r) + (lane + 32 * u) * kChunk);
  }
  begin_dependent_kernel();
  if (n0 >= g.n) return;
  float acc[kRows][kM] = {};
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kU) {
    uint4 w[kU][kRows];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        w[u][r] = c0 + 32 * u < chunks ? __ldcs(reinterpret_cast<const uint4*>(row(r)) + c0 + 32 * u)
                                       : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      float x[kM][kChunk];
#pragma unroll
      for (int m = 0; m < kM; ++m) e4m3_to_float(__ldg(reinterpret_cast<const uint4*>(g.a + m * g.lda) + c), x[m]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[kChunk];
        e4m3_to_float(w[u][r], wf);
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
          for (int i = 0; i < kChunk; ++i) acc[r][m] = fmaf(wf[i], x[m][i], acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int off = 16; off > 0; off /= 2) acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], off);
  // Lane r * kM + m writes D[m, n0 + r].
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int64_t n = n0 + r;
      if (lane != r * kM + m || n >= g.n) continue;
      const float s = g.scale_a[g.scale_a_per_row ? m : 0] * g.scale_b[g.scale_b_per_row ? n : 0];
      float v = s * acc[r][m];
      if (g.bias) v += detail::to_float(static_cast<const D*>(g.bias)[n]);
      static_cast<D*>(g.d)[m * g.ldd + n] = detail::from_float<D>(v);
    }
}

template <int kM, typename D>
cudaError_t launch_m(const GemvArgs& g, int rows, cudaStream_t stream) {
  const dim3 block(kWarps * 32);
  auto grid = [&](int r) { return dim3(static_cast<unsigned>((g.n + kWarps * r - 1) / (kWarps * r))); };
  switch (rows) {
    case 1: return launch(scaled_gemv_kernel<kM, 1, D>, grid(1), block, stream, g);
    case 2: return launch(scaled_gemv_kernel<kM, 2, D>, grid(2), block, stream, g);
    case 4: return launch(scaled_gemv_kernel<kM, 4, D>, grid(4), block, stream, g);
  }
  return cudaErrorInvalidValue;
}

template <typename D>
cudaError_t launch_groups(GemvArgs g, cudaStream_t stream) {
  const int rows_per_warp = gemv_rows();
  const int64_t rows = g.m;
  for (int64_t m0 = 0; m0 < rows; m0 += kGemvMaxM) {
    GemvArgs part = g;
    part.m = std::min<int64_t>(kGemvMaxM, rows - m0);
    part.a = g.a + m0 * g.lda;
    part.scale_a = g.scale_a + (g.scale_a_per_row ? m0 : 0);
    part.d = static_cast<D*>(g.d) + m0 * g.ldd;
    cudaError_t err = cudaErrorInvalidValue;
    switch (part.m) {
      case 1: err = launch_m<1, D>(part, rows_per_warp, stream); break;
      case 2: err = launch_m<2, D>(part, rows_per_warp, stream); break;
      case 3: err = launch_m<3, D>(part, rows_per_warp, stream); break;
      case 4: err = launch_m<4, D>(part, rows_per_warp, stream); break;
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t scaled_gemv(const ScaledMmProblem& p, cudaStream_t stream) {
  if (p.a_format != Fp8Format::kE4M3 || p.b_format != Fp8Format::kE4M3 || p.k % kChunk != 0) return cudaErrorInvalidValue;
  const GemvArgs g{static_cast<const uint8_t*>(p.a), p.lda, static_cast<const uint8_t*>(p.b), p.ldb, p.m, p.n, p.k,
                   p.scale_a, p.scale_a_per_row, p.scale_b, p.scale_b_per_row, p.bias, p.d, p.ldd};
  switch (p.d_dtype) {
    case DType::kBFloat16: return launch_groups<__nv_bfloat16>(g, stream);
    case DType::kFloat16: return launch_groups<__half>(g, stream);
    case DType::kFloat32: return launch_groups<float>(g, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fp8ext::cuda

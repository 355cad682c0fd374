// What a 2-byte-read / 1-byte-write stream can reach on this GPU, next to a
// plain copy, and whether the per-thread load pattern matters. Standalone (no
// fp8ext), from the repository root:
//   nvcc -O3 -arch=sm_90a -o /tmp/sc scripts/device/quant_state/stream_ceiling.cu && /tmp/sc
//   chunk16:  a thread reads 16 contiguous bf16 (two 16-byte loads, each warp
//             instruction touching every other 16 bytes) and writes 16 codes
//             (one 16-byte store): the pattern of fp8ext's quantize kernels;
//   coalesced: a thread reads two 16-byte words 512 bytes apart (each warp
//             instruction reads 512 contiguous bytes) and writes two 8-byte codes.
// Each is timed with 1, 2 and 4 iterations unrolled per thread (loads first).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdio>
#include <cstdint>

#include "diag_timing.cuh"


__device__ __forceinline__ uint32_t enc4(const __nv_bfloat16* v, float inv) {
  float f[4];
  for (int i = 0; i < 4; ++i) f[i] = __bfloat162float(v[i]) * inv;
  __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(f[0], f[1]), __NV_SATFINITE, __NV_E4M3);
  __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(f[2], f[3]), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// units: 16-element units of the input; kPattern 0 = chunk16, 1 = coalesced.
template <int kPattern, int U>
__global__ void __launch_bounds__(256) quant(const uint4* __restrict__ in, uint8_t* __restrict__ out, int64_t units, float inv) {
  const int64_t warp_units = 32;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; base < units; base += stride * U) {
    uint4 w[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t t = base + u * stride;
      if (t >= units) continue;
      if (kPattern == 0) {
        w[u][0] = __ldcs(in + 2 * t);
        w[u][1] = __ldcs(in + 2 * t + 1);
      } else {  // the warp's 32 units read as two 512-byte runs
        const int64_t wbase = (t / warp_units) * warp_units * 2, lane = t % warp_units;
        w[u][0] = __ldcs(in + wbase + lane);
        w[u][1] = __ldcs(in + wbase + warp_units + lane);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t t = base + u * stride;
      if (t >= units) continue;
      const __nv_bfloat16* a = reinterpret_cast<const __nv_bfloat16*>(&w[u][0]);
      const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&w[u][1]);
      if (kPattern == 0) {
        uint4 q = make_uint4(enc4(a, inv), enc4(a + 4, inv), enc4(b, inv), enc4(b + 4, inv));
        __stcs(reinterpret_cast<uint4*>(out) + t, q);
      } else {
        const int64_t wbase = (t / warp_units) * warp_units * 2, lane = t % warp_units;
        uint2* o = reinterpret_cast<uint2*>(out);
        __stcs(o + wbase + lane, make_uint2(enc4(a, inv), enc4(a + 4, inv)));
        __stcs(o + wbase + warp_units + lane, make_uint2(enc4(b, inv), enc4(b + 4, inv)));
      }
    }
  }
}

__global__ void copy16(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    __stcs(out + i, __ldcs(in + i));
}

int main() {
  const int64_t m = 16384, k = 8192, n = m * k, units = n / 16;
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint4 *in, *cp; uint8_t* out;
  CHECK(cudaMalloc(&in, n * 2)); CHECK(cudaMalloc(&out, n)); CHECK(cudaMalloc(&cp, n * 2));
  CHECK(cudaMemset(in, 0x3c, n * 2));
  float t = time_us([&] { copy16<<<sms * 8, 256>>>(in, cp, n * 2 / 16); });
  printf("copy bf16 tensor (read 2 + write 2 B/elem): %.1f us, %.3f TB/s\n", t, 4.0 * n / t / 1e6);
  for (int blocks_per_sm : {4, 8, 16}) {
    auto run = [&](auto kernel, const char* name) {
      float us = time_us([&] { kernel<<<sms * blocks_per_sm, 256>>>(in, out, units, 0.5f); });
      printf("%-14s blocks/SM %2d: %.1f us, %.3f TB/s (3 B/elem)\n", name, blocks_per_sm, us, 3.0 * n / us / 1e6);
    };
    run(quant<0, 1>, "chunk16 U1"); run(quant<0, 2>, "chunk16 U2"); run(quant<0, 4>, "chunk16 U4");
    run(quant<1, 1>, "coalesced U1"); run(quant<1, 2>, "coalesced U2"); run(quant<1, 4>, "coalesced U4");
  }
  CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  return 0;
}

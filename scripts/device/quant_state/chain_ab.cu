// Per-tensor current scaling as the library runs it (fp8ext::cuda::quantize_per_tensor,
// whatever its design), timed standalone on issue 3's 16384 x 8192 bf16 case, with
// the static and delayed kernels as controls. Unlike amax_ceiling.cu it calls only
// the public entry points, so scripts/device/build_variants.sh can build it for any
// version of the per-tensor kernels (TOOL chain) and the binaries can be compared
// in one process run after run (shuffled, as ab_rows.sh does). Each variant is timed
// two ways: 20 calls back to back (the mean) and one call at a time behind a spin
// kernel, as bench/benchlib.time_ms times the bench (the median of 20). The scale
// the chain derives is checked against amax / 448 from a host-side max of the
// data, so a version that loses a block's max fails here before any timing.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc scripts/device/quant_state/chain_ab.cu \
//        csrc/quant/quantize_per_tensor.cu csrc/quant/quantize_per_tensor_kept.cu \
//        csrc/quant/quantize_per_tensor_small.cu -o /tmp/chain_ab
//   /tmp/chain_ab [ROUNDS]   prints "VARIANT, back to back: X us a call ..." and "VARIANT, one call: ..."
// (output: the bits of the derived scale; ab_summary.py reads these lines).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "diag_timing.cuh"
#include "fp8ext/quantize_cuda.h"

namespace {

float median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fp8ext;
  const int rounds = argc > 1 ? std::max(1, atoi(argv[1])) : 3;
  const int64_t rows = 16384, cols = 8192, n = rows * cols;
  // Random bf16 in [-10, 10] with one planted -37.5 (the amax), made on the host
  // so the expected scale is known exactly.
  std::vector<__nv_bfloat16> h(n);
  uint32_t s = 12345u;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    h[i] = __float2bfloat16(static_cast<float>(static_cast<int>(s >> 9) % 20001 - 10000) * 1e-3f);
  }
  h[n / 2 + 12345] = __float2bfloat16(-37.5f);
  float amax = 0.0f;
  for (const auto& v : h) amax = std::max(amax, std::fabs(__bfloat162float(v)));

  void* x;
  uint8_t* q;
  float *scale, *work, *delayed_work, *history, *delayed_scale;
  // Scratch far larger than any version asks for (kAmaxWorkspaceFloats, or one
  // float per amax block), so every version runs with the same buffers.
  constexpr int64_t kWorkFloats = 1 << 16;
  CHECK(cudaMalloc(&x, n * 2));
  CHECK(cudaMalloc(&q, n));
  CHECK(cudaMalloc(&scale, 4 * sizeof(float)));
  CHECK(cudaMalloc(&work, kWorkFloats * sizeof(float)));
  CHECK(cudaMalloc(&delayed_work, kWorkFloats * sizeof(float)));
  CHECK(cudaMalloc(&history, 16 * sizeof(float)));
  CHECK(cudaMalloc(&delayed_scale, 2 * sizeof(float)));
  CHECK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
  // 0x7f7f7f7f (3.4e38) everywhere: a version that read any of it as an amax, or
  // as zeroed, derives a wrong scale (NaN garbage would vanish in a max).
  CHECK(cudaMemset(work, 0x7f, kWorkFloats * sizeof(float)));
  CHECK(cudaMemset(delayed_work, 0x7f, kWorkFloats * sizeof(float)));
  CHECK(cudaMemset(history, 0, 16 * sizeof(float)));
  const float one = 1.0f;
  CHECK(cudaMemcpy(scale + 2, &one, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(delayed_scale, &one, 4, cudaMemcpyHostToDevice));

  const ConstMatrix xm{x, DType::kBFloat16, rows, cols, cols};
  const Fp8Matrix qm{q, Fp8Format::kE4M3, rows, cols, cols};
  const ScaleRule rule{};
  const float want_scale = scale_from_amax(amax, rule);
  cudaStream_t st = nullptr;
  cudaError_t last = cudaSuccess;
  auto keep = [&](cudaError_t e) { if (e != cudaSuccess) last = e; };
  struct Variant {
    const char* name;
    std::function<void()> run;
    std::vector<float> us[2];
  };
  std::vector<Variant> vs = {
      {"current", [&] { keep(cuda::quantize_per_tensor(xm, rule, qm, scale, work, st)); }, {}},
      {"static", [&] { keep(cuda::quantize_with_scale(xm, scale + 2, qm, st)); }, {}},
      {"delayed", [&] {
         keep(cuda::quantize_delayed(xm, rule, true, history, 16, delayed_scale, qm, delayed_scale + 1, delayed_work,
                                     st));
       }, {}},
  };
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < vs.size(); ++k) {
      Variant& v = vs[(r % 2) ? vs.size() - 1 - k : k];
      v.us[0].push_back(time_us(v.run));
      v.us[1].push_back(time_us_one_call(v.run));
    }
  CHECK(last);
  CHECK(cudaDeviceSynchronize());
  float got_scale;
  CHECK(cudaMemcpy(&got_scale, scale, 4, cudaMemcpyDeviceToHost));
  uint32_t bits;
  std::memcpy(&bits, &got_scale, 4);
  for (auto& v : vs) {
    const float b2b = median(v.us[0]), one_call = median(v.us[1]);
    // One row each way, so that ab_summary.py compares them apart; "output" (the
    // derived scale's bits) on the current-scaling rows only: the controls' are given.
    char output[32] = "";
    if (&v == &vs[0]) snprintf(output, sizeof(output), ", output %08x", bits);
    printf("%s, back to back: %.2f us a call, %.3f TB/s%s\n", v.name, b2b, n * 3.0 / b2b / 1e6, output);
    printf("%s, one call: %.2f us a call, %.3f TB/s%s\n", v.name, one_call, n * 3.0 / one_call / 1e6, output);
  }
  if (got_scale != want_scale) {
    printf("WRONG SCALE: %.9g, expected %.9g\n", got_scale, want_scale);
    return 1;
  }
  return 0;
}

// Times the fused RMSNorm + per-token quantize kernel (rms_norm_quantize_per_row,
// or add_rms_norm_quantize_per_row with `add`) in one CUDA graph of
// back-to-back calls, as silu_timeline.cu does for the SwiGLU kernel: two
// builds of the kernel compared in one process with no extension build. Prints
// us a call, TB/s and a hash of the FP8 output, the row scales and (add) the
// written sum: equal hashes mean the builds computed the same bits.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc scripts/device/rms_timeline.cu -o /tmp/rms_timeline
//   /tmp/rms_timeline ROWS HIDDEN [add]
// -DRMS_SOURCE='"path"' builds another version (relative to this file; keep the
// copy in csrc/quant/, where its own includes resolve).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef RMS_SOURCE
#define RMS_SOURCE "../../csrc/quant/rms_norm_quantize.cu"
#endif
#include RMS_SOURCE

#include "graph_timing.cuh"

constexpr int kCalls = 20, kReplays = 20;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROWS HIDDEN [add]\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), hidden = std::atoll(argv[2]);
  const bool add = argc > 3 && std::strcmp(argv[3], "add") == 0;
  if (rows < 1 || hidden < 1) {
    std::fprintf(stderr, "ROWS and HIDDEN must be positive\n");
    return 2;
  }
  using namespace fp8ext;
  const size_t n = static_cast<size_t>(rows * hidden);
  const int64_t padded = round_up(hidden, int64_t{16});
  uint16_t *x, *residual = nullptr, *sum = nullptr, *weight;
  uint8_t* q;
  float* scales;
  CHECK(cudaMalloc(&x, n * 2));
  CHECK(cudaMalloc(&weight, hidden * 2));
  CHECK(cudaMalloc(&q, rows * padded));
  CHECK(cudaMalloc(&scales, rows * 4));
  fill_inputs<<<1024, 256>>>(x, n, false, 1);
  fill_inputs<<<64, 256>>>(weight, hidden, false, 2);
  if (add) {
    CHECK(cudaMalloc(&residual, n * 2));
    CHECK(cudaMalloc(&sum, n * 2));
    fill_inputs<<<1024, 256>>>(residual, n, false, 3);
    // RMS_RESIDUAL_COPY_X=1: the residual holds x's values (h = 2x: no zeros, as the fill makes
    // none in x; the fill's own residual cancels x exactly in ~1 element of 500).
    const char* copy_x = std::getenv("RMS_RESIDUAL_COPY_X");
    if (copy_x && std::strcmp(copy_x, "1") == 0) CHECK(cudaMemcpy(residual, x, n * 2, cudaMemcpyDeviceToDevice));
  }
  CHECK(cudaGetLastError());

  const ConstMatrix in{x, DType::kBFloat16, rows, hidden, hidden};
  const Fp8Matrix out{q, Fp8Format::kE4M3, rows, hidden, padded};
  const ScaleRule rule{};
  auto enqueue = [&](cudaStream_t s) {
    return add ? cuda::add_rms_norm_quantize_per_row(in, residual, sum, weight, 1e-5f, rule, out, scales, s)
               : cuda::rms_norm_quantize_per_row(in, weight, 1e-5f, rule, out, scales, s);
  };
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(enqueue(stream));
  CHECK(cudaStreamSynchronize(stream));
  const double us = graph_us_per_call(stream, kCalls, kReplays, enqueue);

  // The FP8 output, the row scales and (add) the sum, hashed.
  std::vector<uint8_t> host(rows * padded + rows * 4 + (add ? n * 2 : 0));
  CHECK(cudaMemcpy(host.data(), q, rows * padded, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(host.data() + rows * padded, scales, rows * 4, cudaMemcpyDeviceToHost));
  if (add) CHECK(cudaMemcpy(host.data() + rows * padded + rows * 4, sum, n * 2, cudaMemcpyDeviceToHost));
  const uint64_t hash = fnv1a(host);
  // Read x (and the residual), write q (and the sum); the weight stays in L2.
  const double bytes = double(n) * (add ? 6 : 2) + double(rows) * padded;
  std::printf("rows %lld hidden %lld %s: %.3f us a call, %.3f TB/s, output %016llx\n", (long long)rows,
              (long long)hidden, add ? "add" : "plain", us, bytes / us / 1e6, (unsigned long long)hash);
  return 0;
}

// Times the fused SwiGLU + per-token quantize kernel (silu_mul_quantize_per_row)
// in one CUDA graph of back-to-back calls, so that two builds of the kernel can
// be compared in one process with no extension build (bench/wip's 512-thread
// patch against main). Prints us a call and a hash of the FP8 output and the
// row scales: equal hashes mean the builds computed the same bits.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc scripts/device/silu_timeline.cu -o /tmp/silu_timeline
//   /tmp/silu_timeline ROWS INTERMEDIATE [bf16|fp32]
// -DSILU_SOURCE='"path"' builds another version (relative to this file; keep the
// copy in csrc/quant/, where its own includes resolve).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef SILU_SOURCE
#define SILU_SOURCE "../../csrc/quant/silu_mul_quantize.cu"
#endif
#include SILU_SOURCE

#include "graph_timing.cuh"

constexpr int kCalls = 20, kReplays = 20;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROWS INTERMEDIATE [bf16|fp32]\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), inter = std::atoll(argv[2]);
  const bool fp32 = argc > 3 && std::strcmp(argv[3], "fp32") == 0;
  if (rows < 1 || inter < 1) {
    std::fprintf(stderr, "ROWS and INTERMEDIATE must be positive\n");
    return 2;
  }
  using namespace fp8ext;
  const size_t elem = fp32 ? 4 : 2, n_in = static_cast<size_t>(rows * 2 * inter);
  const int64_t padded = round_up(inter, int64_t{16});
  void* x;
  uint8_t* q;
  float* scales;
  CHECK(cudaMalloc(&x, n_in * elem));
  CHECK(cudaMalloc(&q, rows * padded));
  CHECK(cudaMalloc(&scales, rows * 4));
  fill_inputs<<<1024, 256>>>(x, n_in, fp32);
  CHECK(cudaGetLastError());

  const ConstMatrix in{x, fp32 ? DType::kFloat32 : DType::kBFloat16, rows, 2 * inter, 2 * inter};
  const Fp8Matrix out{q, Fp8Format::kE4M3, rows, inter, padded};
  const ScaleRule rule{};
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cuda::silu_mul_quantize_per_row(in, rule, out, scales, stream));
  CHECK(cudaStreamSynchronize(stream));
  const double us = graph_us_per_call(stream, kCalls, kReplays, [&](cudaStream_t s) {
    return cuda::silu_mul_quantize_per_row(in, rule, out, scales, s);
  });

  // The FP8 output and the row scales, hashed.
  std::vector<uint8_t> host(rows * padded + rows * 4);
  CHECK(cudaMemcpy(host.data(), q, rows * padded, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(host.data() + rows * padded, scales, rows * 4, cudaMemcpyDeviceToHost));
  const uint64_t hash = fnv1a(host);
  const double bytes = double(n_in) * elem + double(rows) * padded;  // read x, write q
  std::printf("rows %lld inter %lld %s: %.3f us a call, %.3f TB/s, output %016llx\n", (long long)rows,
              (long long)inter, fp32 ? "fp32" : "bf16", us, bytes / us / 1e6, (unsigned long long)hash);
  return 0;
}

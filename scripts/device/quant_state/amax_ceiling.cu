// How fast can current scaling's amax pass read? (issue 3: the two passes are
// ~0.1-0.6 us over the 2.4 TB/s target in a torch process; session 8's ncu put
// the amax pass at 64.6 us for 256 MiB, 4.15 TB/s, where bf16 SDPA reads
// 4.4-4.5 TB/s.) Standalone (no torch): times the library's amax pass at a few
// grid sizes against a flat read-only stream on the same 16384 x 8192 bf16
// buffer, then the whole per-tensor chain (zeroing, amax, quantize) as the
// library runs it, with other amax and quantize grids, with PDL off and
// without the zeroing, and the static and delayed kernels as controls. Every
// amax and scale is checked against the library's. Each variant is timed two
// ways, interleaved over rounds: 20 calls back to back (the mean), and one call
// at a time as the benchmark does (the median; see time_us_one_call).
// Session 30 (bench/NOTES.md): the amax pass reads at 4.22 TB/s (63.5 us) at
// 32 blocks per SM and 4.45-4.56 at 12-24, but the chain is 2-5 us slower with
// those grids; TMA bulk-copy rings (62.7-64.1 us) and `ld.global.L2::256B`
// (65.4) did not beat plain 16-byte loads. Session 31: no pair of amax and
// quantize grids (8-32 and 8-64 blocks per SM) beat the library's 32 / 32 in
// the chain, with PDL on or off; after the 16-blocks/SM amax pass any second
// pass is 4.5-6.5 us slower (the "pieces" variants), so the pair costs about
// the same whatever the amax grid.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc scripts/device/quant_state/amax_ceiling.cu \
//        csrc/quant/quantize_per_tensor_kept.cu csrc/quant/quantize_per_tensor_small.cu -o /tmp/amax_ceiling
//   /tmp/amax_ceiling [ROUNDS]
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

// -DQPT_SOURCE='"path"' times another version of the library's per-tensor
// kernels (relative to this file; keep the copy in csrc/quant/).
#ifndef QPT_SOURCE
#define QPT_SOURCE "../../../csrc/quant/quantize_per_tensor.cu"
#endif
#include QPT_SOURCE
#include "diag_timing.cuh"

namespace {

using fp8ext::cuda::detail::atomic_max_nonneg;
using fp8ext::cuda::detail::block_max;

// Max of |x| over eight bf16 in a word, as the bits of a non-negative bf16
// (NaN-free data: the integer order of |x|'s bits is the order of |x|).
__device__ __forceinline__ uint32_t abs_bits_max(uint4 w, uint32_t m) {
  m = __vmaxu2(m, w.x & 0x7fff7fffu);
  m = __vmaxu2(m, w.y & 0x7fff7fffu);
  m = __vmaxu2(m, w.z & 0x7fff7fffu);
  return __vmaxu2(m, w.w & 0x7fff7fffu);
}

__device__ __forceinline__ float bits_to_amax(uint32_t m) {
  const uint32_t hi = max(m >> 16, m & 0xffffu);
  return __uint_as_float(hi << 16);
}

// Flat grid-stride over 16-byte words, U words a thread in flight; a warp's
// load instruction reads 512 contiguous bytes.
template <int U>
__global__ void __launch_bounds__(256) flat_amax(const uint4* in, int64_t words, float* out) {
  __shared__ float smem[32];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  uint32_t m = 0;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; base < words; base += stride * U) {
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) w[u] = base + u * stride < words ? __ldcs(in + base + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < U; ++u) m = abs_bits_max(w[u], m);
  }
  const float a = block_max(bits_to_amax(m), smem);
  if (threadIdx.x == 0) atomic_max_nonneg(out, a);
}

__global__ void fill_bf16(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = __float2bfloat16((static_cast<int>(h % 20001) - 10000) * 1e-3f);
  }
}

struct Variant {
  std::string name;
  std::function<void()> run;
  float* amax;  // where it leaves its amax (nullptr: a chain or the control)
  std::vector<float> us[2];
};

}  // namespace

int main(int argc, char** argv) {
  using namespace fp8ext;
  namespace fc = fp8ext::cuda;
  const int rounds = argc > 1 ? atoi(argv[1]) : 5;
  const int64_t rows = 16384, cols = 8192, n = rows * cols;
  __nv_bfloat16* x;
  uint8_t* q;
  float *work, *scale, *amax_slots;
  CHECK(cudaMalloc(&x, n * 2));
  CHECK(cudaMalloc(&q, n));
  CHECK(cudaMalloc(&work, 64 * sizeof(float)));
  CHECK(cudaMalloc(&scale, 32 * sizeof(float)));
  CHECK(cudaMalloc(&amax_slots, 32 * sizeof(float)));
  CHECK(cudaMemset(amax_slots, 0, 32 * sizeof(float)));
  fill_bf16<<<1024, 256>>>(x, n, 12345u);
  CHECK(cudaGetLastError());
  // The true amax planted once, mid-tensor.
  const __nv_bfloat16 big = __float2bfloat16(-37.5f);
  CHECK(cudaMemcpy(x + n / 2 + 12345, &big, 2, cudaMemcpyHostToDevice));
  const float one = 1.0f;
  CHECK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
  float *history, *delayed_scale;
  CHECK(cudaMalloc(&history, 16 * sizeof(float)));
  CHECK(cudaMemset(history, 0, 16 * sizeof(float)));
  CHECK(cudaMalloc(&delayed_scale, 2 * sizeof(float)));
  CHECK(cudaMemcpy(delayed_scale, &one, 4, cudaMemcpyHostToDevice));

  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const ConstMatrix xm{x, DType::kBFloat16, rows, cols, cols};
  const Fp8Matrix qm{q, Fp8Format::kE4M3, rows, cols, cols};
  const auto in = fc::detail::make_input<__nv_bfloat16>(xm);
  const int64_t chunks = ceil_div(cols, fc::detail::kChunk);
  const int64_t words = n * 2 / 16;
  cudaStream_t st = nullptr;

  std::vector<Variant> vs;
  int slot = 0;
  auto amax_variant = [&](std::string name, std::function<void(float*)> body) {
    float* a = amax_slots + slot++;
    vs.push_back({name, [=] { body(a); }, a, {}});  // the max of the same data: no re-zeroing
  };
  auto library_amax = [=](int64_t per_sm) {
    return [=](float* a) {
      fc::launch(fc::amax_kernel<__nv_bfloat16>,
                 fc::grid_blocks(rows, chunks, fc::detail::kAmaxRowsPerStep<__nv_bfloat16>, per_sm), dim3(256), st,
                 in, chunks, a);
    };
  };
  for (int per_sm : {32, 24, 16, 12})
    amax_variant("amax pass, " + std::to_string(per_sm) + " blocks/SM", library_amax(per_sm));
  amax_variant("flat U8 32/SM (ceiling reference)", [=](float* a) {
    flat_amax<8><<<sms * 32, 256>>>(reinterpret_cast<const uint4*>(x), words, a);
  });
  // The library's second pass: quantize with the scale derived from *amax.
  auto quantize_from = [=](const float* amax, int per_sm, float* s_out) {
    fc::launch(fc::quantize_chunks_kernel<__nv_bfloat16, Fp8Format::kE4M3, true, false>,
               fc::grid_blocks(rows, chunks, fc::detail::kQuantizeRowsPerStep, per_sm), dim3(256), st, in,
               fc::make_output(qm), chunks, amax, ScaleRule{}, s_out, nullptr, fc::DelayedUpdate{});
  };
  int chain_slot = 2;
  auto chain = [=, &chain_slot](int amax_per_sm, int quant_per_sm) {
    float* s_out = scale + chain_slot++;
    return [=] {
      fc::zero_workspace(work, 1, st);
      library_amax(amax_per_sm)(work);
      quantize_from(work, quant_per_sm, s_out);
    };
  };
  vs.push_back({"chain: library per-tensor current", [=] {
                  fc::quantize_per_tensor(xm, ScaleRule{}, qm, scale + 1, work, st);
                }, nullptr, {}});
  // Amax and quantize grids together (blocks per SM of each): the smaller
  // amax grids are faster alone; is there a quantize grid that keeps that?
  // Session 31 ran eleven pairs (8-32 and 8-64 blocks per SM); none beat 32 / 32.
  const std::pair<int, int> grids[] = {{16, 32}, {32, 64}};
  for (auto [a_sm, q_sm] : grids)
    vs.push_back({"chain: amax " + std::to_string(a_sm) + " / quantize " + std::to_string(q_sm) + " blocks/SM",
                  chain(a_sm, q_sm), nullptr, {}});
  // The chain in pieces, amax grid 32 or 16 blocks per SM: is the second pass
  // slower after the small amax grid, and is it the reversed (bottom-up) row
  // order? The pieces without a zeroing kernel leave their amax in a slot
  // zeroed once at the start: the same data gives the same max. At 32 blocks
  // per SM, "amax + quantize from it" is the library's chain without its
  // zeroing kernel, i.e. what the zeroing costs.
  for (int per_sm : {32, 16}) {
    const std::string tag = " (amax " + std::to_string(per_sm) + " blocks/SM)";
    const auto amax = library_amax(per_sm);
    vs.push_back({"pieces: zeroing + amax" + tag, [=] {
                    fc::zero_workspace(work + 24, 1, st);
                    amax(work + 24);
                  }, nullptr, {}});
    vs.push_back({"pieces: amax + static quantize (top-down)" + tag, [=] {
                    amax(work + 32);
                    fc::quantize_with_scale(xm, scale, qm, st);
                  }, nullptr, {}});
    float* s_out = scale + chain_slot++;
    vs.push_back({"pieces: amax + quantize from it (bottom-up)" + tag, [=] {
                    amax(work + 40);
                    quantize_from(work + 40, 32, s_out);
                  }, nullptr, {}});
  }
  // The library's chain with PDL off (FP8EXT_PDL=0 is read at each launch).
  // Session 31 also ran the 16 and 12 blocks/SM amax grids this way: without
  // the overlap between the passes they still lost (172.0 and 172.9 us
  // against 170.5), so PDL does not explain their loss.
  const auto library_chain = chain(32, 32);
  vs.push_back({"chain, PDL off: amax pass at 32 blocks/SM", [=] {
                  setenv("FP8EXT_PDL", "0", 1);
                  library_chain();
                  unsetenv("FP8EXT_PDL");
                }, nullptr, {}});
  vs.push_back({"control: static", [=] { fc::quantize_with_scale(xm, scale, qm, st); }, nullptr, {}});
  vs.push_back({"control: delayed", [=] {
                  fc::quantize_delayed(xm, ScaleRule{}, true, history, 16, delayed_scale, qm, delayed_scale + 1,
                                       work + 16, st);
                }, nullptr, {}});

  CHECK(cudaMemset(work, 0, 64 * sizeof(float)));  // the never-zeroed amax slots start at 0
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < vs.size(); ++k) {
      Variant& v = vs[(r % 2) ? vs.size() - 1 - k : k];
      v.us[0].push_back(time_us(v.run));
      v.us[1].push_back(time_us_one_call(v.run));
    }
  CHECK(cudaDeviceSynchronize());
  std::vector<float> amax(slot);
  CHECK(cudaMemcpy(amax.data(), amax_slots, slot * 4, cudaMemcpyDeviceToHost));
  float scales[32];
  CHECK(cudaMemcpy(scales, scale, sizeof(scales), cudaMemcpyDeviceToHost));
  printf("bytes read per amax pass: %.1f MB; library scale %.6g\n", n * 2 / 1e6, scales[1]);
  bool ok = true;
  for (int i = 2; i < chain_slot; ++i) ok = ok && scales[i] == scales[1];
  printf("%-52s %10s %10s %8s %8s  %s\n", "variant", "us b2b", "us 1 call", "TB/s", "1 call", "amax");
  for (auto& v : vs) {
    auto med = [](std::vector<float> t) { std::sort(t.begin(), t.end()); return t[t.size() / 2]; };
    const float a = med(v.us[0]), b = med(v.us[1]);
    const double bytes = v.amax ? n * 2.0 : n * 3.0;  // chains and the control: 3 bytes an element, as the bench counts
    printf("%-52s %10.2f %10.2f %8.3f %8.3f", v.name.c_str(), a, b, bytes / a / 1e6, bytes / b / 1e6);
    if (v.amax) {
      const float got = amax[v.amax - amax_slots];
      printf("  %.4g%s", got, got == amax[0] ? "" : "  MISMATCH");
      ok = ok && got == amax[0];
    }
    printf("\n");
  }
  printf("%s\n", ok ? "amax and scales agree" : "DISAGREEMENT");
  return ok ? 0 : 1;
}

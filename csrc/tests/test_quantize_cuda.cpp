// The CUDA quantization kernels against the CPU reference, bit for bit, on
// random data with non-finite values, odd shapes, every recipe and both formats.
// Skips (exit 77) where there is no GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp8ext/cuda_launch.h"
#include "fp8ext/fp8_format.h"
#include "fp8ext/quantize.h"
#include "fp8ext/quantize_cuda.h"
#include "cuda_test_util.h"
#include "harness.h"

using namespace fp8ext;
using test::DeviceBuffer;
using test::require_gpu;

namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-8, 8);
  std::vector<float> v(rows * cols);
  for (auto& e : v) e = nd(rng) * std::ldexp(1.0f, ex(rng));
  if (v.size() > 8) {
    v[1] = NAN;
    v[3] = INFINITY;
    v[5] = -INFINITY;
    v[7] = std::copysign(NAN, -1.0f);  // keeps its sign: code 0xFF, as on the CPU (fp8ext::ieee_quotient)
  }
  return v;
}

struct Shape {
  int64_t rows, cols, pad;
};
// 2600 x 4100 unpadded (and 300 x 8192) take per-tensor current scaling's
// kept-share kernel when it is on (quantize_per_tensor_kept.cu; the test runs
// per-tensor both ways): ~5 tiles per block, the ring's 3 and a backward
// re-read, a partial last tile.
const Shape kShapes[] = {{1, 1, 1},      {1, 4100, 16},    {7, 1, 1},       {3, 127, 16},
                         {5, 129, 1},    {130, 257, 512},  {300, 8192, 16}, {2600, 4100, 1}};

enum class Recipe { kPerTensor, kPerTensorKept, kPerRow, kPerGroup, kPerBlock };

int64_t scale_count(Recipe r, int64_t rows, int64_t cols) {
  switch (r) {
    case Recipe::kPerTensor:
    case Recipe::kPerTensorKept: return 1;
    case Recipe::kPerRow: return rows;
    case Recipe::kPerGroup: return ceil_div(cols, kGroupSize) * round_up(rows, kGroupScaleRowAlign);
    case Recipe::kPerBlock: return ceil_div(rows, kGroupSize) * ceil_div(cols, kGroupSize);
  }
  return 0;
}

void compare(Recipe recipe, Fp8Format f, const Shape& sh, uint32_t seed) {
  const std::vector<float> x = random_matrix(sh.rows, sh.cols, seed);
  const int64_t padded = round_up(sh.cols, sh.pad);
  const ScaleRule rule{f, 1, false};
  const ConstMatrix hx{x.data(), DType::kFloat32, sh.rows, sh.cols, sh.cols};
  std::vector<uint8_t> q_cpu(sh.rows * padded);
  std::vector<float> s_cpu(scale_count(recipe, sh.rows, sh.cols));
  const Fp8Matrix hq{q_cpu.data(), f, sh.rows, sh.cols, padded};

  DeviceBuffer<float> dx(x.size()), ds(s_cpu.size()), work(cuda::kAmaxWorkspaceFloats);
  DeviceBuffer<uint8_t> dq(q_cpu.size());
  dx.upload(x);
  CUDA_OK(cudaMemset(dq.ptr, 0xAB, dq.n));  // poison: every byte must be written
  CUDA_OK(cudaMemset(ds.ptr, 0xAB, ds.n * sizeof(float)));
  const ConstMatrix gx{dx.ptr, DType::kFloat32, sh.rows, sh.cols, sh.cols};
  const Fp8Matrix gq{dq.ptr, f, sh.rows, sh.cols, padded};
  switch (recipe) {
    case Recipe::kPerTensor:
      cpu::quantize_per_tensor(hx, rule, hq, s_cpu.data());
      CUDA_OK(cuda::quantize_per_tensor(gx, rule, gq, ds.ptr, work.ptr, nullptr));
      break;
    case Recipe::kPerTensorKept:  // FP8EXT_QUANT_KEEP=1: the one-launch kernel wherever it applies
      cpu::quantize_per_tensor(hx, rule, hq, s_cpu.data());
      setenv("FP8EXT_QUANT_KEEP", "1", 1);
      CUDA_OK(cuda::quantize_per_tensor(gx, rule, gq, ds.ptr, work.ptr, nullptr));
      unsetenv("FP8EXT_QUANT_KEEP");
      break;
    case Recipe::kPerRow:
      cpu::quantize_per_row(hx, rule, hq, s_cpu.data());
      CUDA_OK(cuda::quantize_per_row(gx, rule, gq, ds.ptr, nullptr));
      break;
    case Recipe::kPerGroup:
      cpu::quantize_per_group(hx, rule, hq, s_cpu.data());
      CUDA_OK(cuda::quantize_per_group(gx, rule, gq, ds.ptr, nullptr));
      break;
    case Recipe::kPerBlock:
      cpu::quantize_per_block(hx, rule, hq, s_cpu.data());
      CUDA_OK(cuda::quantize_per_block(gx, rule, gq, ds.ptr, nullptr));
      break;
  }
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> q_gpu = dq.download();
  const std::vector<float> s_gpu = ds.download();
  const std::string ctx = "recipe " + std::to_string(int(recipe)) + " shape " + std::to_string(sh.rows) + "x" +
                          std::to_string(sh.cols) + " pad " + std::to_string(sh.pad);
  for (size_t i = 0; i < s_cpu.size(); ++i) EXPECT_EQ_CTX(s_gpu[i], s_cpu[i], ctx + " scale " + std::to_string(i));
  for (size_t i = 0; i < q_cpu.size(); ++i) EXPECT_EQ_CTX(int(q_gpu[i]), int(q_cpu[i]), ctx + " q " + std::to_string(i));
}

}  // namespace

FP8EXT_TEST(cuda_recipes_match_cpu) {
  require_gpu();
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  for (Recipe r : {Recipe::kPerTensor, Recipe::kPerTensorKept, Recipe::kPerRow, Recipe::kPerGroup, Recipe::kPerBlock})
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (const Shape& sh : kShapes) compare(r, f, sh, seed + static_cast<uint32_t>(sh.cols));
}

FP8EXT_TEST(cuda_saturating_cast_matches_cpu_on_all_bf16_values) {
  require_gpu();
  std::vector<uint16_t> x(65536);
  for (int i = 0; i < 65536; ++i) x[i] = static_cast<uint16_t>(i);
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (bool sat : {true, false}) {
      DeviceBuffer<uint16_t> dx(x.size());
      DeviceBuffer<uint8_t> dq(x.size());
      dx.upload(x);
      const ConstMatrix gx{dx.ptr, DType::kBFloat16, 256, 256, 256};
      CUDA_OK(cuda::cast_to_fp8(gx, Fp8Matrix{dq.ptr, f, 256, 256, 256}, sat, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint8_t> want(x.size());
      cpu::cast_to_fp8(ConstMatrix{x.data(), DType::kBFloat16, 256, 256, 256}, Fp8Matrix{want.data(), f, 256, 256, 256},
                       sat);
      const std::vector<uint8_t> got = dq.download();
      for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ_CTX(int(got[i]), int(want[i]), "bf16 bits " + std::to_string(i));
    }
}

FP8EXT_TEST(cuda_delayed_history_matches_cpu) {
  require_gpu();
  const int64_t len = 1500;  // longer than one block of the history update
  std::vector<float> hist(len), scale(1, 1.0f);
  for (int64_t i = 0; i < len; ++i) hist[i] = static_cast<float>((i * 37) % 101);
  DeviceBuffer<float> dh(len), ds(1), used(1), work(cuda::kAmaxWorkspaceFloats);
  dh.upload(hist);
  ds.upload(scale);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> x = random_matrix(33, 1000, 7 + step);
    DeviceBuffer<float> dx(x.size());
    DeviceBuffer<uint8_t> dq(x.size());
    dx.upload(x);
    std::vector<uint8_t> q(x.size());
    float used_cpu = 0;
    const ScaleRule rule{Fp8Format::kE4M3, 0, false};
    cpu::quantize_delayed(ConstMatrix{x.data(), DType::kFloat32, 33, 1000, 1000}, rule, true, hist.data(), len,
                          scale.data(), Fp8Matrix{q.data(), Fp8Format::kE4M3, 33, 1000, 1000}, &used_cpu);
    CUDA_OK(cuda::quantize_delayed(ConstMatrix{dx.ptr, DType::kFloat32, 33, 1000, 1000}, rule, true, dh.ptr, len,
                                   ds.ptr, Fp8Matrix{dq.ptr, Fp8Format::kE4M3, 33, 1000, 1000}, used.ptr, work.ptr,
                                   nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(used.download()[0], used_cpu);
    EXPECT_TRUE(dh.download() == hist);
    EXPECT_EQ(ds.download()[0], scale[0]);
    EXPECT_TRUE(dq.download() == q);
  }
}

// A history of length 0: the CPU op quantizes with *scale and leaves the history
// and *scale alone; the kernel wrote history[0] (past a zero-length buffer) and
// *scale (helper-56). The float after the history is a canary.
FP8EXT_TEST(cuda_delayed_with_no_history_leaves_history_and_scale_alone) {
  require_gpu();
  const std::vector<float> x = random_matrix(5, 300, 3);
  DeviceBuffer<float> dx(x.size()), dh(1), ds(1), used(1), work(cuda::kAmaxWorkspaceFloats);
  DeviceBuffer<uint8_t> dq(x.size());
  dx.upload(x);
  dh.upload(std::vector<float>{-7.0f});
  ds.upload(std::vector<float>{0.25f});
  const ScaleRule rule{Fp8Format::kE4M3, 0, false};
  std::vector<uint8_t> q(x.size());
  float used_cpu = 0, scale_cpu = 0.25f, hist_cpu = -7.0f;
  cpu::quantize_delayed(ConstMatrix{x.data(), DType::kFloat32, 5, 300, 300}, rule, true, &hist_cpu, 0, &scale_cpu,
                        Fp8Matrix{q.data(), Fp8Format::kE4M3, 5, 300, 300}, &used_cpu);
  CUDA_OK(cuda::quantize_delayed(ConstMatrix{dx.ptr, DType::kFloat32, 5, 300, 300}, rule, true, dh.ptr, 0, ds.ptr,
                                 Fp8Matrix{dq.ptr, Fp8Format::kE4M3, 5, 300, 300}, used.ptr, work.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dh.download()[0], -7.0f);
  EXPECT_EQ(ds.download()[0], 0.25f);
  EXPECT_EQ(scale_cpu, 0.25f);
  EXPECT_EQ(used.download()[0], used_cpu);
  EXPECT_TRUE(dq.download() == q);
}

// ZeroedAmaxSlots (quantize_cuda.h): the two passes take the amax in the slot
// handed to them and zero the other, which starts as garbage here; the calls
// alternate slots without a sync, the amax falling 16x a step, so a slot left
// unzeroed would keep an earlier, larger amax. A one-pass call (16 x 100) and
// the kept-share kernel leave the slots alone and say so.
FP8EXT_TEST(cuda_per_tensor_zeroed_amax_slots) {
  require_gpu();
  const int64_t rows = 600, cols = 300;  // 180000 elements: past the one-pass kernel's 131072
  const ScaleRule rule{Fp8Format::kE4M3, 0, false};
  DeviceBuffer<float> slots(2), work(cuda::kAmaxWorkspaceFloats);
  const std::vector<float> start = {0.0f, 3.0e38f};
  slots.upload(start);
  const int steps = 4;
  std::vector<DeviceBuffer<float>*> dx, ds;
  std::vector<DeviceBuffer<uint8_t>*> dq;
  std::vector<std::vector<float>> xs;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> x = random_matrix(rows, cols, 11 + step);
    for (float& v : x) v = std::isfinite(v) ? std::ldexp(v, -4 * step) : 0.0f;  // finite: the amax is the max
    xs.push_back(x);
    dx.push_back(new DeviceBuffer<float>(x.size()));
    dx.back()->upload(x);
    ds.push_back(new DeviceBuffer<float>(1));
    dq.push_back(new DeviceBuffer<uint8_t>(x.size()));
  }
  for (int step = 0; step < steps; ++step) {  // no sync between the calls
    cuda::ZeroedAmaxSlots s{slots.ptr + step % 2, slots.ptr + 1 - step % 2};
    CUDA_OK(cuda::quantize_per_tensor(ConstMatrix{dx[step]->ptr, DType::kFloat32, rows, cols, cols}, rule,
                                      Fp8Matrix{dq[step]->ptr, Fp8Format::kE4M3, rows, cols, cols}, ds[step]->ptr,
                                      work.ptr, nullptr, &s));
    EXPECT_TRUE(s.used);
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (int step = 0; step < steps; ++step) {
    std::vector<uint8_t> q(xs[step].size());
    float scale = 0;
    cpu::quantize_per_tensor(ConstMatrix{xs[step].data(), DType::kFloat32, rows, cols, cols}, rule,
                             Fp8Matrix{q.data(), Fp8Format::kE4M3, rows, cols, cols}, &scale);
    EXPECT_EQ_CTX(ds[step]->download()[0], scale, "step " + std::to_string(step));
    EXPECT_TRUE(dq[step]->download() == q);
    delete dx[step];
    delete ds[step];
    delete dq[step];
  }
  // The last call used slot 1 and zeroed slot 0.
  EXPECT_EQ(slots.download()[0], 0.0f);
  // Other paths (sm_90 kernels on an sm_90 GPU only: elsewhere these shapes take the two passes): the
  // slots untouched, `used` false.
  if (!cuda::current_device_info().hopper()) return;
  const std::vector<float> marked = {0.0f, 7.0f};
  slots.upload(marked);
  DeviceBuffer<float> small(16 * 100), big(rows * cols), s1(1);
  DeviceBuffer<uint8_t> q1(rows * cols);
  small.upload(std::vector<float>(small.n, 1.0f));
  big.upload(std::vector<float>(big.n, 1.0f));
  cuda::ZeroedAmaxSlots s{slots.ptr, slots.ptr + 1};
  CUDA_OK(cuda::quantize_per_tensor(ConstMatrix{small.ptr, DType::kFloat32, 16, 100, 100}, rule,
                                    Fp8Matrix{q1.ptr, Fp8Format::kE4M3, 16, 100, 100}, s1.ptr, work.ptr, nullptr, &s));
  EXPECT_TRUE(!s.used);
  setenv("FP8EXT_QUANT_KEEP", "1", 1);
  CUDA_OK(cuda::quantize_per_tensor(ConstMatrix{big.ptr, DType::kFloat32, rows, cols, cols}, rule,
                                    Fp8Matrix{q1.ptr, Fp8Format::kE4M3, rows, cols, cols}, s1.ptr, work.ptr, nullptr,
                                    &s));
  unsetenv("FP8EXT_QUANT_KEEP");
  EXPECT_TRUE(!s.used);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(slots.download() == marked);
  float one_scale = 0;
  std::vector<uint8_t> q_cpu(big.n);
  const std::vector<float> ones(big.n, 1.0f);
  cpu::quantize_per_tensor(ConstMatrix{ones.data(), DType::kFloat32, rows, cols, cols}, rule,
                           Fp8Matrix{q_cpu.data(), Fp8Format::kE4M3, rows, cols, cols}, &one_scale);
  EXPECT_EQ(s1.download()[0], one_scale);
  // Slots that cannot be both zero and zeroed are refused.
  cuda::ZeroedAmaxSlots same{slots.ptr, slots.ptr};
  EXPECT_EQ(int(cuda::quantize_per_tensor(ConstMatrix{big.ptr, DType::kFloat32, rows, cols, cols}, rule,
                                          Fp8Matrix{q1.ptr, Fp8Format::kE4M3, rows, cols, cols}, s1.ptr, work.ptr,
                                          nullptr, &same)),
            int(cudaErrorInvalidValue));
}

// The group kernel derives its scales with fast_quotient: one 128-wide group per
// row, each row at its own magnitude (2^-150 to 2^127, so denormal, tiny, huge
// and overflowing groups all occur), under several margins and power-of-two rules.
FP8EXT_TEST(cuda_group_scales_match_cpu_across_magnitudes) {
  require_gpu();
  const int64_t cols = 128;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd;
  std::vector<float> x;
  for (int e = -150; e <= 127; ++e)
    for (int64_t c = 0; c < cols; ++c) x.push_back(std::ldexp(nd(rng), e));
  const int64_t rows = static_cast<int64_t>(x.size()) / cols;
  const ScaleRule rules[] = {{Fp8Format::kE4M3, 0, false}, {Fp8Format::kE5M2, 1, false}, {Fp8Format::kE4M3, -3, true},
                             {Fp8Format::kE5M2, 4, true}};
  DeviceBuffer<float> dx(x.size());
  dx.upload(x);
  for (const ScaleRule& rule : rules) {
    std::vector<uint8_t> q_cpu(x.size());
    std::vector<float> s_cpu(round_up(rows, kGroupScaleRowAlign));
    cpu::quantize_per_group(ConstMatrix{x.data(), DType::kFloat32, rows, cols, cols}, rule,
                            Fp8Matrix{q_cpu.data(), rule.format, rows, cols, cols}, s_cpu.data());
    DeviceBuffer<float> ds(s_cpu.size());
    DeviceBuffer<uint8_t> dq(x.size());
    CUDA_OK(cuda::quantize_per_group(ConstMatrix{dx.ptr, DType::kFloat32, rows, cols, cols}, rule,
                                     Fp8Matrix{dq.ptr, rule.format, rows, cols, cols}, ds.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> s_gpu = ds.download();
    const std::vector<uint8_t> q_gpu = dq.download();
    const std::string ctx = "margin " + std::to_string(rule.margin) + " pow2 " + std::to_string(rule.power_of_two);
    for (size_t i = 0; i < s_cpu.size(); ++i) EXPECT_EQ_CTX(s_gpu[i], s_cpu[i], ctx + " scale of row " + std::to_string(i));
    EXPECT_TRUE(q_gpu == q_cpu);
  }
}

// The fused kernels against a host reference (q_ref, s_ref from the CPU
// per-row quantizer): the same scales to 1e-5, NaNs where the reference has
// them, zero K padding, each value within one FP8 step. Returns how many codes moved.
int64_t expect_within_one_step(const std::vector<uint8_t>& q, const std::vector<float>& s,
                               const std::vector<uint8_t>& q_ref, const std::vector<float>& s_ref, int64_t rows,
                               int64_t cols, int64_t padded, const std::string& ctx) {
  int64_t moved = 0;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ_CTX(bool(std::fabs(s[r] - s_ref[r]) <= 1e-5f * s_ref[r]), true, ctx + " scale");
    for (int64_t c = 0; c < padded; ++c) {
      const int64_t i = r * padded + c;
      const float got = decode_fp8(q[i], Fp8Format::kE4M3) * s[r];
      const float want = decode_fp8(q_ref[i], Fp8Format::kE4M3) * s_ref[r];
      if (std::isnan(want)) {
        EXPECT_EQ_CTX(bool(std::isnan(got)), true, ctx + " NaN at " + std::to_string(i));
        continue;
      }
      if (c >= cols) EXPECT_EQ_CTX(int(q[i]), 0, ctx + " padding");
      moved += q[i] != q_ref[i];
      EXPECT_EQ_CTX(bool(std::fabs(got - want) <= 0.125f * std::fabs(want) + s[r] * 0x1p-9f), true,
                    ctx + " value at " + std::to_string(i));
    }
  }
  return moved;
}

// RMSNorm fused with per-row quantization, fp32 input: against a host
// reference (1/rms in double, then the CPU per-row quantizer). The kernel sums
// the squares in its own order, so 1/rms may differ in the last bits and a code
// by one FP8 step; NaN rows (the first: random_matrix plants NaN and Inf there),
// the K padding and the scales' magnitudes must agree. The residual variant
// normalizes h = x + residual and writes h, which must be exact. Both kernels:
// FP8EXT_RMS_RING=1 takes the ring kernel where rows are whole chunks of at
// most 16 KB (576 and 4096 columns here; 1200 x 4096 gives a block four rows
// or more, so its ring wraps), 0 the one-row kernel.
FP8EXT_TEST(cuda_rms_norm_quantize_matches_host_reference) {
  require_gpu();
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  for (const char* ring : {"0", "1"})
  for (const bool add : {false, true}) {
    setenv("FP8EXT_RMS_RING", ring, 1);
    for (const Shape& sh : {Shape{1, 1, 1}, Shape{3, 127, 16}, Shape{5, 129, 16}, Shape{33, 4096, 16},
                            Shape{2, 12288, 16}, Shape{1000, 576, 128}, Shape{1200, 4096, 16}}) {
      const std::vector<float> x = random_matrix(sh.rows, sh.cols, seed + static_cast<uint32_t>(sh.cols));
      std::vector<float> residual(x.size()), h = x;
      std::mt19937 rng(seed);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      for (size_t i = 0; i < h.size() && add; ++i) h[i] = x[i] + (residual[i] = nd(rng));
      std::vector<float> w(sh.cols);
      std::uniform_real_distribution<float> ud(0.25f, 2.25f);
      for (auto& e : w) e = ud(rng);
      const float eps = 1e-5f;
      std::vector<float> y(x.size());
      for (int64_t r = 0; r < sh.rows; ++r) {
        double ss = 0;
        for (int64_t c = 0; c < sh.cols; ++c) ss += double(h[r * sh.cols + c]) * h[r * sh.cols + c];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(sh.cols) + eps));
        for (int64_t c = 0; c < sh.cols; ++c) y[r * sh.cols + c] = w[c] * (h[r * sh.cols + c] * inv);
      }
      const int64_t padded = round_up(sh.cols, sh.pad);
      const ScaleRule rule{Fp8Format::kE4M3, 0, false};
      std::vector<uint8_t> q_ref(sh.rows * padded);
      std::vector<float> s_ref(sh.rows);
      cpu::quantize_per_row({y.data(), DType::kFloat32, sh.rows, sh.cols, sh.cols}, rule,
                            {q_ref.data(), Fp8Format::kE4M3, sh.rows, sh.cols, padded}, s_ref.data());

      DeviceBuffer<float> dx(x.size()), dres(x.size()), dsum(x.size()), dw(w.size()), ds(sh.rows);
      DeviceBuffer<uint8_t> dq(q_ref.size());
      dx.upload(x);
      dres.upload(residual);
      dw.upload(w);
      CUDA_OK(cudaMemset(dq.ptr, 0xAB, dq.n));  // poison: every byte must be written
      const ConstMatrix in{dx.ptr, DType::kFloat32, sh.rows, sh.cols, sh.cols};
      const Fp8Matrix out{dq.ptr, Fp8Format::kE4M3, sh.rows, sh.cols, padded};
      if (add) {
        CUDA_OK(cuda::add_rms_norm_quantize_per_row(in, dres.ptr, dsum.ptr, dw.ptr, eps, rule, out, ds.ptr, nullptr));
      } else {
        CUDA_OK(cuda::rms_norm_quantize_per_row(in, dw.ptr, eps, rule, out, ds.ptr, nullptr));
      }
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint8_t> q = dq.download();
      const std::vector<float> s = ds.download();
      const std::string ctx = std::string("ring ") + ring + (add ? ", add, " : ", ") + "shape " +
                              std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      const int64_t moved = expect_within_one_step(q, s, q_ref, s_ref, sh.rows, sh.cols, padded, ctx);
      EXPECT_EQ_CTX(bool(moved <= sh.rows * padded / 50), true, ctx + " codes moved: " + std::to_string(moved));
      if (!add) continue;
      const std::vector<float> sum = dsum.download();
      for (size_t i = 0; i < h.size(); ++i)
        EXPECT_EQ_CTX(bool(sum[i] == h[i] || (std::isnan(sum[i]) && std::isnan(h[i]))), true, ctx + " sum");
    }
  }
  unsetenv("FP8EXT_RMS_RING");
}

// SwiGLU fused with per-row quantization, fp32 input [gate | up]: against
// silu(g) * u on the host (silu in double) and the CPU per-row quantizer. The
// kernel's silu (SFU exp2 and reciprocal) is within 2^-17 of it, relative:
// codes within one FP8 step.
FP8EXT_TEST(cuda_silu_mul_quantize_matches_host_reference) {
  require_gpu();
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  for (const Shape& sh : {Shape{1, 2, 1}, Shape{3, 254, 16}, Shape{33, 8200, 16}, Shape{1, 40000, 16}}) {
    const int64_t half = sh.cols / 2;
    const std::vector<float> x = random_matrix(sh.rows, sh.cols, seed + static_cast<uint32_t>(sh.cols));
    std::vector<float> y(sh.rows * half);
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t c = 0; c < half; ++c) {
        const double g = x[r * sh.cols + c];
        y[r * half + c] = static_cast<float>(g / (1.0 + std::exp(-g))) * x[r * sh.cols + half + c];
      }
    const int64_t padded = round_up(half, sh.pad);
    const ScaleRule rule{Fp8Format::kE4M3, 0, false};
    std::vector<uint8_t> q_ref(sh.rows * padded);
    std::vector<float> s_ref(sh.rows);
    cpu::quantize_per_row({y.data(), DType::kFloat32, sh.rows, half, half}, rule,
                          {q_ref.data(), Fp8Format::kE4M3, sh.rows, half, padded}, s_ref.data());

    DeviceBuffer<float> dx(x.size()), ds(sh.rows);
    DeviceBuffer<uint8_t> dq(q_ref.size());
    dx.upload(x);
    CUDA_OK(cudaMemset(dq.ptr, 0xAB, dq.n));
    CUDA_OK(cuda::silu_mul_quantize_per_row({dx.ptr, DType::kFloat32, sh.rows, sh.cols, sh.cols}, rule,
                                            {dq.ptr, Fp8Format::kE4M3, sh.rows, half, padded}, ds.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> q = dq.download();
    const std::vector<float> s = ds.download();
    const std::string ctx = "shape " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
    const int64_t moved = expect_within_one_step(q, s, q_ref, s_ref, sh.rows, half, padded, ctx);
    EXPECT_EQ_CTX(bool(moved <= sh.rows * padded / 50), true, ctx + " codes moved: " + std::to_string(moved));
  }
  const float dummy = 0.0f;  // an odd row length is refused before any launch
  EXPECT_EQ(cuda::silu_mul_quantize_per_row({&dummy, DType::kFloat32, 1, 3, 3}, ScaleRule{},
                                            {nullptr, Fp8Format::kE4M3, 1, 1, 1}, nullptr, nullptr),
            cudaErrorInvalidValue);
}

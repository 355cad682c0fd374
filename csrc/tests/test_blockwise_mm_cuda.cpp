// The CUTLASS block-wise GEMM kernels against a float64 reference that applies
// each 1x128 group scale of A and 128x128 block scale of B to its own elements,
// for every configuration and output dtype they are instantiated for (bf16,
// fp32; fp16 is covered by pytest); plus refusals and the M buckets.
// Skips (exit 77) where there is no GPU.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "fp8ext/fp8_format.h"
#include "fp8ext/scaled_mm_blockwise.h"
#include "gemm_test_util.h"
#include "harness.h"

using namespace fp8ext;
using cuda::BlockwiseConfig;
using test::DeviceBuffer;

namespace {

struct Problem {
  int64_t m, n, k, groups, ld_sa;
  std::vector<uint8_t> a, b;  // E4M3 codes [m, k], [n, k]
  std::vector<float> sa;      // group scales, M-major: (row, group) at group * ld_sa + row
  std::vector<float> sb;      // block scales, row-major [ceil(n/128), groups]
  std::vector<float> bias;    // [n]
};

Problem make_problem(int64_t m, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.01f, 0.1f), bias(-2.0f, 2.0f);
  Problem p{m, n, k, ceil_div(k, kGroupSize), round_up(m, kGroupScaleRowAlign), test::random_codes(m * k, Fp8Format::kE4M3, rng),
            test::random_codes(n * k, Fp8Format::kE4M3, rng), {}, {}, {}};
  p.sa.assign(p.groups * p.ld_sa, 0.0f);
  for (int64_t g = 0; g < p.groups; ++g)
    for (int64_t i = 0; i < m; ++i) p.sa[g * p.ld_sa + i] = scale(rng);
  p.sb.resize(ceil_div(n, kGroupSize) * p.groups);
  for (auto& s : p.sb) s = scale(rng);
  p.bias.resize(n);
  for (auto& b : p.bias) b = bias(rng);
  return p;
}

// ||D - ref|| / ||ref|| (Frobenius) of one run, ref in float64.
double run_and_compare(const Problem& o, DType d, bool with_bias, BlockwiseConfig config) {
  const size_t out_bytes = d == DType::kFloat32 ? 4 : 2;
  DeviceBuffer<uint8_t> da(o.a.size()), db(o.b.size()), dd(o.m * o.n * out_bytes), dbias(o.n * out_bytes);
  DeviceBuffer<float> dsa(o.sa.size()), dsb(o.sb.size());
  da.upload(o.a);
  db.upload(o.b);
  dsa.upload(o.sa);
  dsb.upload(o.sb);
  dbias.upload(test::encode_out(d, o.bias));
  cuda::BlockwiseMmProblem p{da.ptr, o.k, db.ptr, o.k, o.m, o.n, o.k, dsa.ptr, o.ld_sa, dsb.ptr, o.groups,
                             with_bias ? dbias.ptr : nullptr, dd.ptr, d, o.n};
  EXPECT_TRUE(cuda::blockwise_mm_unsupported_reason(p) == nullptr);
  const size_t ws_bytes = cuda::blockwise_mm_workspace_bytes(p, config);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  CUDA_OK(cuda::blockwise_mm(p, config, ws.ptr, ws_bytes, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> got = test::decode_out(d, dd.download(), o.m * o.n);

  return test::gemm_error(got, o.m, o.n, [&](int64_t i, int64_t j) {
    double ref = with_bias ? test::round_to(d, o.bias[j]) : 0.0;
    for (int64_t kk = 0; kk < o.k; ++kk) {
      const int64_t g = kk / kGroupSize;
      const double x = static_cast<double>(decode_fp8(o.a[i * o.k + kk], Fp8Format::kE4M3)) * o.sa[g * o.ld_sa + i];
      const double w = static_cast<double>(decode_fp8(o.b[j * o.k + kk], Fp8Format::kE4M3)) *
                       o.sb[(j / kGroupSize) * o.groups + g];
      ref += x * w;
    }
    return ref;
  });
}

// M across the buckets; N a multiple of 8 but not of 128 (a partial last block);
// K a multiple of 16 but not always of 128 (a partial last group).
const test::GemmCase kCases[] = {{1, 136, 128}, {15, 264, 272}, {17, 136, 384}, {64, 200, 144}, {65, 264, 256},
                                 {129, 136, 400}, {300, 520, 256}};

void check_all(DType d, std::initializer_list<BlockwiseConfig> configs) {
  test::require_gpu();
  uint32_t seed = std::random_device{}();
  for (const test::GemmCase& c : kCases)
    for (BlockwiseConfig config : configs)
      for (bool bias : {false, true}) {
        if (test::quick() && (!test::in_quick_subset(c) || !bias)) continue;
        const double e = run_and_compare(make_problem(c.m, c.n, c.k, ++seed), d, bias, config);
        EXPECT_EQ_CTX(e < test::gemm_tolerance(d), true,
                      "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
                          " config=" + cuda::blockwise_config_name(config) + " err=" + std::to_string(e));
      }
}

}  // namespace

FP8EXT_TEST(bf16_every_config) {
  check_all(DType::kBFloat16, {BlockwiseConfig::kAuto, BlockwiseConfig::kLarge, BlockwiseConfig::kMedium,
                               BlockwiseConfig::kSwapSmall, BlockwiseConfig::kSwapMedium});
}

FP8EXT_TEST(fp32_every_config) {
  check_all(DType::kFloat32, {BlockwiseConfig::kAuto, BlockwiseConfig::kLarge, BlockwiseConfig::kSwapMedium});
}

FP8EXT_TEST(refuses_what_the_kernels_cannot_run) {
  // Checked before any launch, so this runs without a GPU too.
  alignas(16) static uint8_t buf[4096];
  alignas(16) static float scales[64] = {};
  const cuda::BlockwiseMmProblem ok{buf, 32, buf, 32, 4, 8, 32, scales, 4, scales, 1, nullptr, buf,
                                    DType::kBFloat16, 8};
  EXPECT_TRUE(cuda::blockwise_mm_unsupported_reason(ok) == nullptr);
  auto refused = [&](cuda::BlockwiseMmProblem p) {
    EXPECT_TRUE(cuda::blockwise_mm_unsupported_reason(p) != nullptr);
    EXPECT_EQ(int(cuda::blockwise_mm(p, BlockwiseConfig::kAuto, nullptr, 0, nullptr)), int(cudaErrorInvalidValue));
  };
  cuda::BlockwiseMmProblem p = ok;
  p.k = 24;  // K not a multiple of 16
  refused(p);
  p = ok;
  p.b = buf + 1;  // misaligned B
  refused(p);
  p = ok;
  p.ld_scale_a = 3;  // group scales' column stride < M
  refused(p);
  p = ok;
  p.m = 2;
  p.ld_scale_a = 2;  // not a multiple of 4 (the TMA reads whole 16 bytes)
  refused(p);
  p = ok;
  p.ld_scale_b = 0;  // block scales' row stride < ceil(K / 128)
  refused(p);
  p = ok;
  p.n = 12;  // N not a multiple of 8 bf16 elements
  p.ldd = 16;
  refused(p);
  p = ok;
  p.scale_b = nullptr;
  refused(p);
}

FP8EXT_TEST(auto_config_buckets) {
  // Host-side logic: runs without a GPU (as if on 132 SMs). The split-K
  // expectations assume >= 128 SMs (H100 SXM, H200), where 32 tiles of N = 4096
  // give 4 slices.
  const int sms = test::sm_count_or_h200();
  alignas(16) static uint8_t buf[16];
  alignas(16) static float one[4] = {1, 1, 1, 1};
  cuda::BlockwiseMmProblem p{buf, 4096, buf, 4096, 1, 4096, 4096, one, 4, one, 32, nullptr, buf,
                             DType::kBFloat16, 4096};
  auto config_for = [&](int64_t m) {
    p.m = m;
    return cuda::blockwise_mm_auto_config(p);
  };
  unsetenv("FP8EXT_GEMM_SPLITS");
  EXPECT_EQ(int(config_for(1)), int(BlockwiseConfig::kSwapSmall));
  EXPECT_EQ(int(config_for(16)), int(BlockwiseConfig::kSwapSmall));
  if (sms >= 128) {
    EXPECT_EQ(int(config_for(17)), int(BlockwiseConfig::kSplitK));  // 32 weight tiles: 4 slices of 1024
    EXPECT_EQ(int(config_for(64)), int(BlockwiseConfig::kSplitK));
    EXPECT_TRUE(cuda::blockwise_mm_workspace_bytes(p, BlockwiseConfig::kAuto) >= size_t{4} * 64 * 4096 * 4);
  } else {
    std::printf("auto_config_buckets: %d SMs, the split rule's cases (>= 128 SMs) are not checked\n", sms);
  }
  p.k = 512;  // 4 groups: too short to slice
  EXPECT_EQ(int(config_for(64)), int(BlockwiseConfig::kSwapMedium));
  p.k = 4096 + 16;  // a partial last group: slices would not start at a group
  EXPECT_EQ(int(config_for(64)), int(BlockwiseConfig::kSwapMedium));
  p.k = 4096;
  p.n = 28672;  // 224 weight tiles already fill the SMs
  EXPECT_EQ(int(config_for(64)), int(BlockwiseConfig::kSwapMedium));
  p.n = 6144;  // 48 tiles: two slices would be slower than none
  EXPECT_EQ(int(config_for(64)), int(BlockwiseConfig::kSwapMedium));
  p.n = 4096;
  setenv("FP8EXT_GEMM_SPLITS", "1", 1);  // never
  EXPECT_EQ(int(config_for(64)), int(BlockwiseConfig::kSwapMedium));
  setenv("FP8EXT_GEMM_SPLITS", "3", 1);  // forced at M <= 128; 4096 is no multiple of 384: two slices
  EXPECT_EQ(int(config_for(16)), int(BlockwiseConfig::kSplitK));
  EXPECT_EQ(int(config_for(128)), int(BlockwiseConfig::kSplitK));
  EXPECT_TRUE(cuda::blockwise_mm_workspace_bytes(p, BlockwiseConfig::kAuto) >= size_t{2} * 128 * 4096 * 4);
  EXPECT_EQ(int(config_for(129)), int(BlockwiseConfig::kLarge));
  unsetenv("FP8EXT_GEMM_SPLITS");
  EXPECT_EQ(int(config_for(65)), int(BlockwiseConfig::kMedium));
  EXPECT_EQ(int(config_for(129)), int(BlockwiseConfig::kLarge));
  p.d_dtype = DType::kFloat32;  // kLarge and kSwapMedium only
  EXPECT_EQ(int(config_for(1)), int(BlockwiseConfig::kSwapMedium));
  EXPECT_EQ(int(config_for(100)), int(BlockwiseConfig::kLarge));
  EXPECT_TRUE(!cuda::blockwise_mm_has_config(p, BlockwiseConfig::kMedium));
  EXPECT_TRUE(cuda::blockwise_mm_has_config(p, BlockwiseConfig::kAuto));
  EXPECT_TRUE(cuda::blockwise_mm_has_config(p, BlockwiseConfig::kSplitK));  // fp32 partials, any output
}

FP8EXT_TEST(split_k_every_split_count) {
  // kSplitK with the split count forced (FP8EXT_GEMM_SPLITS): slices of whole
  // 128-column groups (K = 384 runs whole where 2 are asked and takes 3 where 4
  // or 8 are; 272, with a partial last group, runs whole), every M the fp32
  // swap-AB kernel takes. Where K divides into 2 or more whole-group slices
  // (K a multiple of 256), the workspace holds their partials: the split path
  // is the one sized, and taken. auto_config_buckets checks kAuto's choice.
  test::require_gpu();
  uint32_t seed = std::random_device{}();
  const test::GemmCase kSplitCases[] = {{1, 136, 1024}, {16, 264, 384}, {17, 136, 1024}, {64, 200, 512},
                                        {33, 520, 272}, {100, 264, 2048}, {300, 136, 256}};
  std::string failures;
  for (const char* splits : {"2", "3", "4", "8"}) {
    setenv("FP8EXT_GEMM_SPLITS", splits, 1);
    for (const test::GemmCase& c : kSplitCases)
      for (DType d : {DType::kBFloat16, DType::kFloat32}) {
        if (test::quick() && d != DType::kBFloat16) continue;
        if (c.k % 256 == 0) {
          alignas(16) static uint8_t buf[16];
          alignas(16) static float one[4] = {1, 1, 1, 1};
          const cuda::BlockwiseMmProblem shape{buf, c.k, buf, c.k, c.m, c.n, c.k, one, round_up(c.m, kGroupScaleRowAlign),
                                               one, ceil_div(c.k, kGroupSize), nullptr, buf, d, c.n};
          if (cuda::blockwise_mm_workspace_bytes(shape, BlockwiseConfig::kSplitK) < size_t{2} * c.m * c.n * 4)
            failures += " [splits=" + std::string(splits) + " M=" + std::to_string(c.m) + " K=" +
                        std::to_string(c.k) + ": the split path was not sized]";
        }
        const double e = run_and_compare(make_problem(c.m, c.n, c.k, ++seed), d, true, BlockwiseConfig::kSplitK);
        if (!(e < test::gemm_tolerance(d)))
          failures += " [splits=" + std::string(splits) + " M=" + std::to_string(c.m) + " N=" +
                      std::to_string(c.n) + " K=" + std::to_string(c.k) + " dtype=" + std::to_string(int(d)) +
                      " err=" + std::to_string(e) + "]";
      }
  }
  unsetenv("FP8EXT_GEMM_SPLITS");
  EXPECT_EQ_CTX(failures.empty(), true, failures);
}

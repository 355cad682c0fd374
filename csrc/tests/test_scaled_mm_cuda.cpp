// The CUTLASS scaled_mm kernels against a float64 reference of the dequantized
// operands, for every configuration, scale kind, bias and output dtype the
// kernels are instantiated for; plus refusals of what they cannot run.
// Skips (exit 77) where there is no GPU.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "gemm_test_util.h"
#include "fp8ext/fp8_format.h"
#include "fp8ext/scaled_mm.h"
#include "harness.h"

using namespace fp8ext;
using cuda::GemmConfig;
using test::DeviceBuffer;
using test::decode_out;
using test::GemmCase;
using test::encode_out;
using test::random_codes;
using test::in_quick_subset;
using test::quick;
using test::round_to;

namespace {

struct Operands {
  int64_t m, n, k;
  std::vector<uint8_t> a, b;      // FP8 codes, row-major [m, k] and [n, k]
  std::vector<float> sa, sb;      // [m] or [1], [n] or [1]
  std::vector<float> bias;        // [n] (as floats; uploaded in D's dtype)
};

Operands make_operands(int64_t m, int64_t n, int64_t k, Fp8Format fa, Fp8Format fb, bool a_rows, bool b_rows,
                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.01f, 0.1f), bias(-2.0f, 2.0f);
  Operands o{m, n, k, random_codes(m * k, fa, rng), random_codes(n * k, fb, rng), {}, {}, {}};
  o.sa.resize(a_rows ? m : 1);
  o.sb.resize(b_rows ? n : 1);
  o.bias.resize(n);
  for (auto& s : o.sa) s = scale(rng);
  for (auto& s : o.sb) s = scale(rng);
  for (auto& b : o.bias) b = bias(rng);
  return o;
}

constexpr uint8_t kUnwritten = 0xA5;  // fills D's row gaps (ldd > N): a kernel must leave them alone

// Runs one problem and returns ||D - ref|| / ||ref|| (Frobenius), ref in float64;
// D has row stride ldd (0: N), and a byte written between rows makes it infinite.
double run_and_compare(const Operands& o, Fp8Format fa, Fp8Format fb, DType d, bool with_bias, GemmConfig config,
                       int64_t ldd = 0) {
  if (ldd == 0) ldd = o.n;
  const size_t out_bytes = d == DType::kFloat32 ? 4 : 2;
  DeviceBuffer<uint8_t> da(o.a.size()), db(o.b.size()), dd(o.m * ldd * out_bytes), dbias(o.n * out_bytes);
  dd.upload(std::vector<uint8_t>(dd.n, kUnwritten));
  DeviceBuffer<float> dsa(o.sa.size()), dsb(o.sb.size());
  da.upload(o.a);
  db.upload(o.b);
  dsa.upload(o.sa);
  dsb.upload(o.sb);
  const std::vector<uint8_t> bias_raw = encode_out(d, o.bias);
  dbias.upload(bias_raw);
  cuda::ScaledMmProblem p{da.ptr, fa, o.k, db.ptr, fb, o.k, o.m, o.n, o.k,
                          dsa.ptr, o.sa.size() > 1 || (o.m == 1 && o.sa.size() == 1), dsb.ptr,
                          o.sb.size() > 1 || (o.n == 1 && o.sb.size() == 1), with_bias ? dbias.ptr : nullptr,
                          dd.ptr, d, ldd};
  const char* why = cuda::scaled_mm_unsupported_reason(p);
  EXPECT_TRUE(why == nullptr);
  const size_t ws_bytes = cuda::scaled_mm_workspace_bytes(p, config);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  CUDA_OK(cuda::scaled_mm(p, config, ws.ptr, ws_bytes, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> raw = dd.download();
  std::vector<uint8_t> packed;  // the rows without their gaps
  for (int64_t i = 0; i < o.m; ++i) {
    const auto row = raw.begin() + i * ldd * out_bytes;
    packed.insert(packed.end(), row, row + o.n * out_bytes);
    for (auto g = row + o.n * out_bytes; g != row + ldd * out_bytes; ++g)
      if (*g != kUnwritten) return INFINITY;
  }
  const std::vector<double> got = decode_out(d, packed, o.m * o.n);

  return test::gemm_error(got, o.m, o.n, [&](int64_t i, int64_t j) {
    double acc = 0.0;
    for (int64_t kk = 0; kk < o.k; ++kk)
      acc += static_cast<double>(decode_fp8(o.a[i * o.k + kk], fa)) * decode_fp8(o.b[j * o.k + kk], fb);
    const double sa = o.sa.size() > 1 ? o.sa[i] : o.sa[0];
    const double sb = o.sb.size() > 1 ? o.sb[j] : o.sb[0];
    return acc * sa * sb + (with_bias ? round_to(d, o.bias[j]) : 0.0);
  });
}

// M across the dispatch buckets; N a multiple of 8 but not of 16/64/128; K multiples of 16.
const GemmCase kCases[] = {{1, 136, 128}, {15, 264, 256}, {17, 136, 384}, {64, 200, 128}, {65, 264, 256},
                           {129, 136, 512}, {300, 520, 256}};
const GemmConfig kConfigs[] = {GemmConfig::kAuto,      GemmConfig::kLarge,         GemmConfig::kMedium,
                               GemmConfig::kSwapSmall, GemmConfig::kSwapMedium,    GemmConfig::kWideFastAccum,
                               GemmConfig::kLargeN192, GemmConfig::kLargeClusterN, GemmConfig::kGemv,
                               GemmConfig::kPingpongFastAccum};

}  // namespace

FP8EXT_TEST(e4m3_bf16_every_config_and_scale_kind) {
  test::require_gpu();
  uint32_t seed = std::random_device{}();
  for (const GemmCase& c : kCases)
    for (GemmConfig config : kConfigs)
      for (int scales = quick() ? 3 : 0; scales < 4; ++scales) {
        if (quick() && !in_quick_subset(c)) continue;
        const bool a_rows = scales & 1, b_rows = scales & 2;
        const Operands o = make_operands(c.m, c.n, c.k, Fp8Format::kE4M3, Fp8Format::kE4M3, a_rows, b_rows, ++seed);
        const double e = run_and_compare(o, Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBFloat16, scales == 3, config);
        const std::string ctx = "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " config=" +
                                cuda::gemm_config_name(config) + " scales=" + std::to_string(scales) +
                                " err=" + std::to_string(e);
        EXPECT_EQ_CTX(e < test::gemm_tolerance(DType::kBFloat16), true, ctx);
      }
}

FP8EXT_TEST(fp32_output_and_e5m2_operands) {
  test::require_gpu();
  uint32_t seed = std::random_device{}();
  struct Types {
    Fp8Format a, b;
    GemmConfig config;
  };
  const Types kTypes[] = {{Fp8Format::kE4M3, Fp8Format::kE4M3, GemmConfig::kLarge},
                          {Fp8Format::kE4M3, Fp8Format::kE4M3, GemmConfig::kSwapMedium},
                          {Fp8Format::kE4M3, Fp8Format::kE5M2, GemmConfig::kLarge},
                          {Fp8Format::kE5M2, Fp8Format::kE5M2, GemmConfig::kLarge}};
  for (const Types& t : kTypes)
    for (const GemmCase& c : kCases) {
      if (quick() && !in_quick_subset(c)) continue;
      const Operands o = make_operands(c.m, c.n, c.k, t.a, t.b, true, true, ++seed);
      const double e = run_and_compare(o, t.a, t.b, DType::kFloat32, true, t.config);
      EXPECT_EQ_CTX(e < test::gemm_tolerance(DType::kFloat32), true,
                    "M=" + std::to_string(c.m) + " config=" + cuda::gemm_config_name(t.config) +
                        " err=" + std::to_string(e));
    }
}

FP8EXT_TEST(split_k_every_split_count_and_dtype) {
  // kSplitK with the split count forced (FP8EXT_GEMM_SPLITS): swap-AB tiles up
  // to M = 64, 128x128 cluster tiles above (M = 300: three tile rows); K slices
  // of 1024 / 3 x 512 / ... down to K = 16 (one slice: the whole-K kernel runs);
  // N past a whole tile; one scale or one per row of A. M <= 16 runs whole K
  // (checked too); K = 1536 takes 3 slices. bf16 and fp32 outputs (this
  // harness has no fp16 encoding; pytest covers fp16). Every failing case is
  // listed; auto_split_k_setting checks that the split path is the one taken.
  test::require_gpu();
  uint32_t seed = std::random_device{}();
  const GemmCase kSplitCases[] = {{1, 264, 1024}, {2, 264, 1024}, {16, 136, 1536}, {5, 8, 16},  // whole K
                                  {17, 520, 2048}, {17, 520, 1536}, {64, 200, 512}, {65, 264, 1024},
                                  {128, 520, 2048}, {300, 136, 512}};
  const DType kDtypes[] = {DType::kBFloat16, DType::kFloat32};
  std::string failures;
  for (const char* splits : {"2", "3", "4", "8"}) {
    setenv("FP8EXT_GEMM_SPLITS", splits, 1);
    for (const GemmCase& c : kSplitCases)
      for (DType d : kDtypes)
        for (bool a_rows : {true, false}) {
          if (quick() && (d != DType::kBFloat16 || !a_rows)) continue;
          const Operands o = make_operands(c.m, c.n, c.k, Fp8Format::kE4M3, Fp8Format::kE4M3, a_rows, true, ++seed);
          const double e = run_and_compare(o, Fp8Format::kE4M3, Fp8Format::kE4M3, d, true, GemmConfig::kSplitK);
          if (!(e < test::gemm_tolerance(d)))
            failures += " [splits=" + std::string(splits) + " M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) +
                        " K=" + std::to_string(c.k) + " dtype=" + std::to_string(int(d)) +
                        " a_rows=" + std::to_string(a_rows) + " err=" + std::to_string(e) + "]";
        }
  }
  unsetenv("FP8EXT_GEMM_SPLITS");
  EXPECT_EQ_CTX(failures.empty(), true, failures);
}

FP8EXT_TEST(output_row_stride_wider_than_n) {
  // D as a column slice of a wider matrix (ldd > N): every config, split-K
  // included, writes its rows at the stride and nothing between them.
  test::require_gpu();
  std::string failures;
  std::vector<GemmConfig> configs(std::begin(kConfigs), std::end(kConfigs));
  configs.push_back(GemmConfig::kSplitK);
  for (GemmConfig config : configs)
    for (DType d : {DType::kBFloat16, DType::kFloat32}) {
      cuda::ScaledMmProblem kind{};  // what has_config reads: the formats and D's dtype
      kind.a_format = kind.b_format = Fp8Format::kE4M3;
      kind.d_dtype = d;
      if (!cuda::scaled_mm_has_config(kind, config)) continue;  // not instantiated for this dtype
      const Operands o = make_operands(300, 264, 512, Fp8Format::kE4M3, Fp8Format::kE4M3, true, true, 77);
      const std::string ctx = " [config=" + std::string(cuda::gemm_config_name(config)) +
                              " dtype=" + std::to_string(int(d));
      try {
        const double e = run_and_compare(o, Fp8Format::kE4M3, Fp8Format::kE4M3, d, true, config, 264 + 40);
        if (!(e < test::gemm_tolerance(d))) failures += ctx + " err=" + std::to_string(e) + "]";
      } catch (const test::Failure& f) {  // a failed launch: name the config and go on
        failures += ctx + " " + f.what() + "]";
      }
    }
  EXPECT_EQ_CTX(failures.empty(), true, failures);
}

FP8EXT_TEST(gemm_error_sees_one_wrong_value_and_passes_rounding) {
  // The metric every GEMM check here uses (no GPU needed): bf16 rounding of a
  // 300 x 520 output and of an M = 1 output holding a value near 0 passes; one
  // value off by a typical value passes the whole 300 x 520 output's error but
  // not its row's.
  std::mt19937 rng(5);
  std::normal_distribution<double> nd;
  for (int64_t m : {int64_t{1}, int64_t{300}}) {
    const int64_t n = 520;
    std::vector<double> ref(m * n), got(m * n);
    for (auto& r : ref) r = nd(rng);
    ref[7] = 1e-6;  // rounds to a value 2^-9 of itself off, a typical value's ~1e-9
    for (int64_t i = 0; i < m * n; ++i) got[i] = test::round_to(DType::kBFloat16, static_cast<float>(ref[i]));
    auto at = [&](int64_t i, int64_t j) { return ref[i * n + j]; };
    EXPECT_EQ_CTX(test::gemm_error(got, m, n, at) < test::gemm_tolerance(DType::kBFloat16), true,
                  "bf16 rounding, M=" + std::to_string(m));
    got[m * n / 2] = ref[m * n / 2] + 1.0;
    double whole = 0.0, norm = 0.0;
    for (int64_t i = 0; i < m * n; ++i) whole += (got[i] - ref[i]) * (got[i] - ref[i]), norm += ref[i] * ref[i];
    if (m == 300) EXPECT_EQ_CTX(std::sqrt(whole / norm) < test::gemm_tolerance(DType::kBFloat16), true, "whole");
    EXPECT_EQ_CTX(test::gemm_error(got, m, n, at) > test::gemm_tolerance(DType::kBFloat16), true,
                  "one value off, M=" + std::to_string(m));
  }
}

FP8EXT_TEST(refuses_what_the_kernels_cannot_run) {
  // Checked before any launch, so this runs without a GPU too.
  alignas(16) static uint8_t buf[4096];
  static float one = 1.0f;
  cuda::ScaledMmProblem ok{buf, Fp8Format::kE4M3, 32, buf, Fp8Format::kE4M3, 32, 4, 8, 32,
                           &one, false, &one, false, nullptr, buf, DType::kBFloat16, 8};
  EXPECT_TRUE(cuda::scaled_mm_unsupported_reason(ok) == nullptr);
  auto refused = [&](cuda::ScaledMmProblem p) {
    EXPECT_TRUE(cuda::scaled_mm_unsupported_reason(p) != nullptr);
    EXPECT_EQ(int(cuda::scaled_mm(p, GemmConfig::kAuto, nullptr, 0, nullptr)), int(cudaErrorInvalidValue));
  };
  cuda::ScaledMmProblem p = ok;
  p.k = 24;  // K not a multiple of 16
  refused(p);
  p = ok;
  p.a = buf + 1;  // misaligned A
  refused(p);
  p = ok;
  p.ldd = 4;  // ldd < N
  refused(p);
  p = ok;
  p.n = 12;  // N not a multiple of 8 bf16 elements (16 bytes)
  p.ldd = 16;
  refused(p);
  p = ok;
  p.scale_a = nullptr;
  refused(p);
  p = ok;
  p.a_format = Fp8Format::kE5M2;  // E5M2 x E4M3 is not instantiated
  refused(p);
  p = ok;
  p.b_format = Fp8Format::kE5M2;  // mixed formats need fp32 output
  refused(p);
}

FP8EXT_TEST(an_error_pending_before_a_cutlass_launch_is_returned_as_it_is) {
  // An error another library left in the runtime (here a cudaSetDevice to a device that does not
  // exist) made CUTLASS's run() fail after enqueuing the kernel: it came back as kGemmLaunchRefused,
  // "CUDA refused the launch", and split-K skipped its reduce. Now it is returned before the launch.
  test::require_gpu();
  const Operands o = make_operands(64, 136, 128, Fp8Format::kE4M3, Fp8Format::kE4M3, true, true, 7);
  DeviceBuffer<uint8_t> da(o.a.size()), db(o.b.size()), dd(o.m * o.n * 2);
  DeviceBuffer<float> dsa(o.sa.size()), dsb(o.sb.size());
  da.upload(o.a);
  db.upload(o.b);
  dsa.upload(o.sa);
  dsb.upload(o.sb);
  const cuda::ScaledMmProblem p{da.ptr, Fp8Format::kE4M3, o.k, db.ptr, Fp8Format::kE4M3, o.k, o.m, o.n, o.k,
                                dsa.ptr, true, dsb.ptr, true, nullptr, dd.ptr, DType::kBFloat16, o.n};
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  for (GemmConfig config : {GemmConfig::kLarge, GemmConfig::kSwapSmall}) {
    const size_t ws_bytes = cuda::scaled_mm_workspace_bytes(p, config);
    DeviceBuffer<uint8_t> ws(ws_bytes);
    EXPECT_EQ(int(cudaSetDevice(count + 5)), int(cudaErrorInvalidDevice));  // leaves its error pending
    EXPECT_EQ(int(cuda::scaled_mm(p, config, ws.ptr, ws_bytes, nullptr)), int(cudaErrorInvalidDevice));
    EXPECT_EQ(int(cudaGetLastError()), int(cudaErrorInvalidDevice));  // still there for its owner
    CUDA_OK(cuda::scaled_mm(p, config, ws.ptr, ws_bytes, nullptr));     // nothing pending: it runs
    CUDA_OK(cudaDeviceSynchronize());
  }
}

FP8EXT_TEST(auto_config_buckets) {
  // Host-side logic: runs without a GPU.
  alignas(16) static uint8_t buf[16];
  static float one = 1.0f;
  cuda::ScaledMmProblem p{buf, Fp8Format::kE4M3, 4096, buf, Fp8Format::kE4M3, 4096, 1, 4096, 4096,
                          &one, false, &one, false, nullptr, buf, DType::kBFloat16, 4096};
  auto config_for = [&](int64_t m) {
    p.m = m;
    return cuda::scaled_mm_auto_config(p);
  };
  unsetenv("FP8EXT_GEMV");  // the default, whatever the caller's environment
  unsetenv("FP8EXT_GEMM_SPLITS");
  unsetenv("FP8EXT_GEMM_FAST_PINGPONG");
  EXPECT_EQ(int(config_for(1)), int(GemmConfig::kGemv));  // the CUDA-core GEMV at M = 1
  EXPECT_EQ(int(config_for(2)), int(GemmConfig::kSwapSmall));
  setenv("FP8EXT_GEMV", "0", 1);  // ... turned off
  EXPECT_EQ(int(config_for(1)), int(GemmConfig::kSwapSmall));
  unsetenv("FP8EXT_GEMV");
  EXPECT_EQ(int(config_for(16)), int(GemmConfig::kSwapSmall));
  EXPECT_EQ(int(config_for(17)), int(GemmConfig::kSwapMedium));
  EXPECT_EQ(int(config_for(64)), int(GemmConfig::kSwapMedium));
  // 65..128: swap-AB 64x64 while its tiles fit in one wave (N = 4096: 128 tiles), else 64x128.
  EXPECT_EQ(int(config_for(65)), int(GemmConfig::kSwapMedium));
  EXPECT_EQ(int(config_for(128)), int(GemmConfig::kSwapMedium));
  p.n = 8192;
  EXPECT_EQ(int(config_for(65)), int(GemmConfig::kLargeClusterN));  // one row of 128-row tiles, N >= 8192
  EXPECT_EQ(int(config_for(128)), int(GemmConfig::kLargeClusterN));
  EXPECT_EQ(int(config_for(129)), int(GemmConfig::kLarge));
  EXPECT_EQ(int(config_for(4096)), int(GemmConfig::kLargeN192));  // M >= 4096, N >= 6144
  p.allow_fast_accum = true;  // bf16 only: ping-pong 128x128 tiles at K < 8192 ...
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kPingpongFastAccum));
  EXPECT_EQ(int(config_for(16)), int(GemmConfig::kSwapSmall));
  setenv("FP8EXT_GEMM_FAST_PINGPONG", "0", 1);  // (never)
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kWideFastAccum));
  unsetenv("FP8EXT_GEMM_FAST_PINGPONG");
  p.k = p.lda = p.ldb = 8192;  // ... else 128x256 cooperative tiles when they fill the waves
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kWideFastAccum));  // 256 tiles on 132 SMs
  setenv("FP8EXT_GEMM_FAST_PINGPONG", "1", 1);  // (always)
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kPingpongFastAccum));
  unsetenv("FP8EXT_GEMM_FAST_PINGPONG");
  p.n = 6144;  // 192 wide tiles: the second wave 55% idle, so ping-pong 128x128 tiles
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kPingpongFastAccum));
  setenv("FP8EXT_GEMM_FAST_PINGPONG", "0", 1);  // (the cooperative 128x128 kernel without it)
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kLarge));
  unsetenv("FP8EXT_GEMM_FAST_PINGPONG");
  p.k = p.lda = p.ldb = 4096;
  p.m = 16384, p.n = 28672;  // K = 4096, but the raster sweeps A (64 MB) past L2
  EXPECT_EQ(int(config_for(16384)), int(GemmConfig::kWideFastAccum));
  p.n = 8192;
  p.d_dtype = DType::kFloat16;
  EXPECT_EQ(int(config_for(1024)), int(GemmConfig::kLarge));
  EXPECT_EQ(int(config_for(4096)), int(GemmConfig::kLarge));
  EXPECT_EQ(int(config_for(128)), int(GemmConfig::kSwapMedium));  // kLargeClusterN and kMedium are bf16 only
  EXPECT_TRUE(!cuda::scaled_mm_has_config(p, GemmConfig::kMedium));
  p.allow_fast_accum = false;
  p.d_dtype = DType::kFloat32;  // fp32 output: kLarge, kSwapMedium and the GEMV only
  EXPECT_EQ(int(config_for(1)), int(GemmConfig::kGemv));
  EXPECT_EQ(int(config_for(2)), int(GemmConfig::kSwapMedium));
  EXPECT_EQ(int(config_for(100)), int(GemmConfig::kLarge));
  p.b_format = Fp8Format::kE5M2;  // E5M2 operands: kLarge only
  EXPECT_EQ(int(config_for(1)), int(GemmConfig::kLarge));
  EXPECT_TRUE(!cuda::scaled_mm_has_config(p, GemmConfig::kSwapSmall));
  EXPECT_TRUE(cuda::scaled_mm_has_config(p, GemmConfig::kAuto));
  EXPECT_TRUE(!cuda::scaled_mm_has_config(p, GemmConfig::kLargeN192));  // candidates: E4M3 -> bf16 only
}

FP8EXT_TEST(auto_split_k_setting) {
  // Host-side logic: kAuto slices K for 16 < M <= 128 on long K with few tiles of
  // N (the rule), or where FP8EXT_GEMM_SPLITS forces a count (1: never). The
  // cases assume >= 128 SMs (H100 SXM, H200; 132 without a GPU).
  if (test::sm_count_or_h200() < 128) test::skip("the split rule's cases assume >= 128 SMs");
  alignas(16) static uint8_t buf[16];
  static float one = 1.0f;
  cuda::ScaledMmProblem p{buf, Fp8Format::kE4M3, 14336, buf, Fp8Format::kE4M3, 14336, 64, 4096, 14336,
                          &one, false, &one, false, nullptr, buf, DType::kBFloat16, 4096};
  unsetenv("FP8EXT_GEMV");
  unsetenv("FP8EXT_GEMM_SPLITS");
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSplitK));  // 64 tiles of 64 rows: 2 slices
  EXPECT_TRUE(cuda::scaled_mm_workspace_bytes(p, GemmConfig::kAuto) >= size_t{2} * 64 * 4096 * 4);
  p.m = 128;  // 32 pairs of 128x128 tiles: 4 slices
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSplitK));
  EXPECT_TRUE(cuda::scaled_mm_workspace_bytes(p, GemmConfig::kAuto) >= size_t{4} * 128 * 4096 * 4);
  p.m = 129;  // past the sizes kAuto splits
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kLarge));
  p.m = 16;  // the 64x16 whole-K kernel is faster there
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSwapSmall));
  p.m = 1;  // the GEMV
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kGemv));
  p.m = 64;
  p.n = 8192;  // 128 tiles already fill the SMs
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSwapMedium));
  p.n = 4096;
  p.k = p.lda = p.ldb = 4096;  // short K: the second kernel's latency outweighs the gain
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSwapMedium));
  setenv("FP8EXT_GEMM_SPLITS", "3", 1);  // forced; 4096 is no multiple of 48: two slices
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSplitK));
  p.m = 16;  // never at M <= 16, even forced
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSwapSmall));
  p.k = p.lda = p.ldb = 14336;
  p.m = 64;
  setenv("FP8EXT_GEMM_SPLITS", "1", 1);  // never
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSwapMedium));
  // The workspace holds a partial product per slice: the split path is the one sized.
  p.m = 17, p.n = 520, p.ldd = 520, p.k = p.lda = p.ldb = 1536;
  setenv("FP8EXT_GEMM_SPLITS", "3", 1);
  EXPECT_TRUE(cuda::scaled_mm_workspace_bytes(p, GemmConfig::kSplitK) >= size_t{3} * 17 * 520 * 4);
  setenv("FP8EXT_GEMM_SPLITS", "100", 1);  // at most 8 slices
  EXPECT_TRUE(cuda::scaled_mm_workspace_bytes(p, GemmConfig::kSplitK) >= size_t{8} * 17 * 520 * 4);
  EXPECT_TRUE(cuda::scaled_mm_workspace_bytes(p, GemmConfig::kSplitK) < size_t{9} * 17 * 520 * 4);
  setenv("FP8EXT_GEMM_SPLITS", "three", 1);  // not a count: the rule (short K: whole)
  EXPECT_EQ(int(cuda::scaled_mm_auto_config(p)), int(GemmConfig::kSwapMedium));
  EXPECT_TRUE(cuda::scaled_mm_workspace_bytes(p, GemmConfig::kSplitK) < size_t{17} * 520 * 4);
  unsetenv("FP8EXT_GEMM_SPLITS");
}

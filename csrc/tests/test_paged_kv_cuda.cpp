// The paged KV-cache kernels without Python: the fused write against the FP8
// encoder of fp8_format.h, the decode attention (scattered pages, GQA, split
// KV) against a float64 attention over the decoded cache. Skips (exit 77)
// where there is no GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "fp8ext/fp8_format.h"
#include "fp8ext/paged_kv_cuda.h"
#include "harness.h"

using namespace fp8ext;
using test::DeviceBuffer;
using test::require_gpu;

namespace {

constexpr int64_t kPages = 40, kPageSize = 16, kKvHeads = 2, kDim = 128;

cuda::PagedPool pool(void* data) { return {data, cuda::CacheDType::kE4M3, kPages, kPageSize, kKvHeads, kDim}; }

FP8EXT_TEST(write_quantizes_into_the_slots) {
  require_gpu();
  const int64_t n = 37;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 200.0f);
  std::vector<float> k(n * kKvHeads * kDim), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  k[5] = NAN;
  std::vector<int64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 100);
  std::shuffle(slots.begin(), slots.end(), rng);
  const int64_t skipped_slot = slots[3];
  slots[3] = -1;
  const std::vector<float> scales = {0.5f, 0.25f};
  DeviceBuffer<float> dk(k.size()), dv(v.size()), ds(2);
  DeviceBuffer<int64_t> dslots(n);
  DeviceBuffer<uint8_t> kp(kPages * kPageSize * kKvHeads * kDim), vp(kp.n);
  dk.upload(k);
  dv.upload(v);
  ds.upload(scales);
  dslots.upload(slots);
  CUDA_OK(cudaMemset(kp.ptr, 0, kp.n));
  CUDA_OK(cudaMemset(vp.ptr, 0, vp.n));
  CUDA_OK(cuda::kv_cache_write(dk.ptr, dv.ptr, DType::kFloat32, n, kKvHeads * kDim, kKvHeads * kDim, dslots.ptr,
                               pool(kp.ptr), pool(vp.ptr), {ds.ptr, true}, {ds.ptr, false}, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> gk = kp.download(), gv = vp.download();
  for (int64_t t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;  // skipped: its slot stays zero (checked below)
    for (int64_t h = 0; h < kKvHeads; ++h) {
      for (int64_t d = 0; d < kDim; ++d) {
        const int64_t src = (t * kKvHeads + h) * kDim + d, dst = (slots[t] * kKvHeads + h) * kDim + d;
        EXPECT_EQ_CTX(int(gk[dst]), int(encode_fp8_saturate(k[src] / scales[h], Fp8Format::kE4M3)), "k code");
        EXPECT_EQ_CTX(int(gv[dst]), int(encode_fp8_saturate(v[src] / scales[0], Fp8Format::kE4M3)), "v code");
      }
    }
  }
  for (int64_t e = 0; e < kKvHeads * kDim; ++e) EXPECT_EQ(int(gk[skipped_slot * kKvHeads * kDim + e]), 0);
}

// RoPE fused into the write: float32 qkv with padded rows, q rotated into
// q_out, K rotated then written, V written, against the same float math here
// (each product and the sum rounded to float: the kernel contracts nothing).
FP8EXT_TEST(rotary_write_rotates_q_and_k_then_writes) {
  require_gpu();
  const int64_t n = 21, q_heads = 4, heads_total = q_heads + 2 * kKvHeads, cols = heads_total * kDim,
                stride = cols + 8;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  std::vector<float> qkv(n * stride), cos(n * kDim), sin(n * kDim);
  for (auto& x : qkv) x = nd(rng);
  for (auto& x : cos) x = ud(rng);
  for (auto& x : sin) x = ud(rng);
  std::vector<int64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 50);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots[4] = -1;
  const std::vector<float> scales = {0.5f, 0.25f};
  DeviceBuffer<float> dqkv(qkv.size()), dcos(cos.size()), dsin(sin.size()), dq(n * q_heads * kDim), ds(2);
  DeviceBuffer<int64_t> dslots(n);
  DeviceBuffer<uint8_t> kp(kPages * kPageSize * kKvHeads * kDim), vp(kp.n);
  dqkv.upload(qkv);
  dcos.upload(cos);
  dsin.upload(sin);
  ds.upload(scales);
  dslots.upload(slots);
  CUDA_OK(cudaMemset(kp.ptr, 0, kp.n));
  CUDA_OK(cudaMemset(vp.ptr, 0, vp.n));
  const cuda::RotaryQkv in{dqkv.ptr, DType::kFloat32, n, stride, q_heads, dcos.ptr, dsin.ptr, dq.ptr};
  CUDA_OK(cuda::kv_cache_write_rotary(in, dslots.ptr, pool(kp.ptr), pool(vp.ptr), {ds.ptr, true}, {ds.ptr, false},
                                      nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> gq = dq.download();
  const std::vector<uint8_t> gk = kp.download(), gv = vp.download();
  auto rotated = [&](int64_t t, int64_t head, int64_t d) {
    const float* row = &qkv[t * stride + head * kDim];
    const float a = row[d] * cos[t * kDim + d];
    const float b = row[(d + kDim / 2) % kDim] * sin[t * kDim + d];
    return d < kDim / 2 ? a - b : a + b;  // rotate_half(x) = [-x2, x1]
  };
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t d = 0; d < kDim; ++d) {
      for (int64_t h = 0; h < q_heads; ++h)
        EXPECT_EQ_CTX(gq[(t * q_heads + h) * kDim + d], rotated(t, h, d), "q");
      if (slots[t] < 0) continue;
      for (int64_t h = 0; h < kKvHeads; ++h) {
        const int64_t dst = (slots[t] * kKvHeads + h) * kDim + d;
        const float v = qkv[t * stride + (q_heads + kKvHeads + h) * kDim + d];
        EXPECT_EQ_CTX(int(gk[dst]), int(encode_fp8_saturate(rotated(t, q_heads + h, d) / scales[h],
                                                            Fp8Format::kE4M3)), "k code");
        EXPECT_EQ_CTX(int(gv[dst]), int(encode_fp8_saturate(v / scales[0], Fp8Format::kE4M3)), "v code");
      }
    }
  }
  // A head_dim that is not a multiple of 32 is refused.
  cuda::PagedPool odd = pool(kp.ptr);
  odd.head_dim = 48;
  EXPECT_EQ(int(cuda::kv_cache_write_rotary(in, dslots.ptr, odd, odd, {ds.ptr, true}, {ds.ptr, false}, nullptr)),
            int(cudaErrorInvalidValue));
}

// Decodes E4M3 pools filled with random codes and checks every sequence
// against float64 attention; page_ids[b] lists sequence b's pages.
void check_decode(int num_splits, int q_heads) {
  std::mt19937 rng(7 + num_splits);
  std::vector<uint8_t> kc(kPages * kPageSize * kKvHeads * kDim), vc(kc.size());
  std::uniform_int_distribution<int> code(0, 0x7E);  // finite E4M3 magnitudes, random sign below
  for (auto& c : kc) c = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
  for (auto& c : vc) c = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
  const std::vector<int32_t> lens = {1, 15, 16, 17, 300};
  const int64_t batch = static_cast<int64_t>(lens.size()), max_pages = 19;
  std::vector<int32_t> order(kPages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(batch * max_pages, 0);
  int used = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < (lens[b] + kPageSize - 1) / kPageSize; ++p) table[b * max_pages + p] = order[used++];
  std::normal_distribution<float> nd;
  std::vector<float> q(batch * q_heads * kDim);
  for (auto& x : q) x = nd(rng);
  const std::vector<float> k_scale = {0.01f, 0.02f}, v_scale = {0.03f};
  const float softmax_scale = 1.0f / std::sqrt(float(kDim));

  DeviceBuffer<uint8_t> dk(kc.size()), dv(vc.size());
  DeviceBuffer<int32_t> dtable(table.size()), dlens(lens.size());
  DeviceBuffer<float> dq(q.size()), dks(2), dvs(1), dout(q.size());
  dk.upload(kc);
  dv.upload(vc);
  dtable.upload(table);
  dlens.upload(lens);
  dq.upload(q);
  dks.upload(k_scale);
  dvs.upload(v_scale);
  cuda::DecodeProblem p{dq.ptr, DType::kFloat32, batch, q_heads, pool(dk.ptr), pool(dv.ptr), {dks.ptr, true},
                        {dvs.ptr, false}, dtable.ptr, max_pages, dlens.ptr, softmax_scale, num_splits, 0, 0.0f,
                        dout.ptr};
  DeviceBuffer<uint8_t> ws(cuda::paged_decode_workspace_bytes(p));
  CUDA_OK(cuda::paged_decode_attention(p, ws.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> out = dout.download();

  const int64_t group = q_heads / kKvHeads;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kv = h / group;
      std::vector<double> s(lens[b]);
      double mx = -INFINITY;
      for (int64_t t = 0; t < lens[b]; ++t) {
        const int64_t row = int64_t{table[b * max_pages + t / kPageSize]} * kPageSize + t % kPageSize;
        double dot = 0;
        for (int64_t d = 0; d < kDim; ++d)
          dot += double(q[(b * q_heads + h) * kDim + d]) *
                 decode_fp8(kc[(row * kKvHeads + kv) * kDim + d], Fp8Format::kE4M3) * k_scale[kv];
        s[t] = dot * softmax_scale;
        mx = std::max(mx, s[t]);
      }
      double sum = 0, err = 0, norm = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < kDim; ++d) {
        double o = 0;
        for (int64_t t = 0; t < lens[b]; ++t) {
          const int64_t row = int64_t{table[b * max_pages + t / kPageSize]} * kPageSize + t % kPageSize;
          o += s[t] / sum * decode_fp8(vc[(row * kKvHeads + kv) * kDim + d], Fp8Format::kE4M3) * v_scale[0];
        }
        const double got = out[(b * q_heads + h) * kDim + d];
        err += (got - o) * (got - o);
        norm += o * o;
      }
      EXPECT_TRUE(std::sqrt(err / norm) < 2e-3);  // one head's relative error: q and P are rounded to fp16 for the mma
    }
  }
}

FP8EXT_TEST(decode_matches_float64_gqa_and_mha) {
  require_gpu();
  check_decode(1, 8);
  check_decode(1, 2);
}

FP8EXT_TEST(decode_split_kv_matches_float64) {
  require_gpu();
  check_decode(3, 8);
  check_decode(7, 4);
  check_decode(150, 8);  // past the merge's prefetch (64 splits at head_dim 128): its tail loop
}

// Sets an environment variable for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// FP8 at head_dim 128 takes the cp.async pipeline by default (the tests above);
// this runs its register-path alternative (FP8EXT_DECODE_PIPELINE=0).
FP8EXT_TEST(decode_register_path_matches_float64) {
  require_gpu();
  const ScopedEnv registers("FP8EXT_DECODE_PIPELINE", "0");
  check_decode(1, 8);
  check_decode(3, 4);
}

// The merge reads the workspace as float4: a misaligned one is refused before
// anything is launched (no GPU needed; the pointers are never dereferenced).
FP8EXT_TEST(decode_refuses_a_misaligned_workspace) {
  void* fake = reinterpret_cast<void*>(uintptr_t{0x10000});
  cuda::DecodeProblem p{fake, DType::kFloat32, 1, 8, pool(fake), pool(fake), {static_cast<float*>(fake), true},
                        {static_cast<float*>(fake), false}, static_cast<int32_t*>(fake), 1,
                        static_cast<int32_t*>(fake), 1.0f, 2, 0, 0.0f, fake};
  EXPECT_EQ(cuda::paged_decode_attention(p, reinterpret_cast<void*>(uintptr_t{0x10004}), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::paged_decode_attention(p, nullptr, nullptr), cudaErrorInvalidValue);
}

// Every size comes from the K pool and is applied to V's data too: a V pool of
// another geometry (fewer pages, another page size or head count) is refused
// before anything is launched, by the decode and both writes (no GPU needed;
// the pointers are never dereferenced). So are tokens closer together than one
// token's heads.
FP8EXT_TEST(decode_and_writes_refuse_a_v_pool_unlike_k) {
  void* fake = reinterpret_cast<void*>(uintptr_t{0x10000});
  auto* f = static_cast<float*>(fake);
  for (int change = 0; change < 4; ++change) {
    cuda::PagedPool v = pool(fake);
    if (change == 0) v.num_pages -= 1;
    if (change == 1) v.page_size *= 2;
    if (change == 2) v.num_kv_heads += 1;
    if (change == 3) v.head_dim = 64;
    const cuda::DecodeProblem p{fake, DType::kFloat32, 1, 8, pool(fake), v, {f, true}, {f, false},
                                static_cast<int32_t*>(fake), 1, static_cast<int32_t*>(fake), 1.0f, 1, 0, 0.0f, fake};
    EXPECT_EQ_CTX(int(cuda::paged_decode_attention(p, nullptr, nullptr)), int(cudaErrorInvalidValue), "decode");
    const auto* slots = static_cast<const int64_t*>(fake);
    EXPECT_EQ_CTX(int(cuda::kv_cache_write(fake, fake, DType::kFloat32, 1, kKvHeads * kDim, kKvHeads * kDim, slots,
                                           pool(fake), v, {f, true}, {f, false}, nullptr)),
                  int(cudaErrorInvalidValue), "write");
    const cuda::RotaryQkv in{fake, DType::kFloat32, 1, (8 + 2 * kKvHeads) * kDim, 8, fake, fake, fake};
    EXPECT_EQ_CTX(int(cuda::kv_cache_write_rotary(in, slots, pool(fake), v, {f, true}, {f, false}, nullptr)),
                  int(cudaErrorInvalidValue), "rotary write");
  }
  const auto* slots = static_cast<const int64_t*>(fake);
  for (const int64_t stride : {kKvHeads * kDim - 16, int64_t{0}})
    EXPECT_EQ_CTX(int(cuda::kv_cache_write(fake, fake, DType::kFloat32, 2, kKvHeads * kDim, stride, slots, pool(fake),
                                           pool(fake), {f, true}, {f, false}, nullptr)),
                  int(cudaErrorInvalidValue), "overlapping tokens");
}

}  // namespace

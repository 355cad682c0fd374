// Where a paged decode call's time goes, block by block (issue 6: the ~9 us
// of fixed cost in the 1 x 32768 row). Builds the decode kernels with their
// %globaltimer stamps (csrc/attention/decode_timeline.cuh), runs bench_decode's
// problem (E4M3 cache, 32 query / 8 KV heads, head_dim 128, pages scattered
// at random) as a CUDA graph of back-to-back calls with PDL, and prints, for
// the last launches, when the blocks of the decode and of the merge kernel
// started, were released by the PDL wait, had their first K/V stage, finished
// their loop and exited (us after the launch's first block started).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -DFP8EXT_WITH_SM90=1 -DFP8EXT_DECODE_TIMELINE -Icsrc/include -Icsrc \
//        scripts/device/decode_timeline.cu -o /tmp/decode_timeline
// (without -DFP8EXT_DECODE_TIMELINE it only times the unstamped kernels)
//   /tmp/decode_timeline BATCH CONTEXT SPLITS [PAGE_SIZE] [OUT.json]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// -DDECODE_SOURCE='"path"' times another version of the kernels (relative to
// this file; keep the copy in csrc/attention/, where its own includes resolve).
#ifndef DECODE_SOURCE
#define DECODE_SOURCE "../../csrc/attention/paged_decode.cu"
#endif
#include DECODE_SOURCE

#include "graph_timing.cuh"

#ifdef FP8EXT_DECODE_TIMELINE
namespace tl = fp8ext::cuda::decode_timeline;
#endif

constexpr int kQHeads = 32, kKvHeads = 8, kDim = 128, kCalls = 20, kReplays = 10;

// Pseudo-random values: E4M3 codes in +-[0.5, 2) (exponent field 6 or 7) or,
// with bf16, values in +-[1, 2). Scores then stay O(1), so the softmax weights
// and every warp's and split's share of the output matter, and builds of two
// versions can be checked bit for bit through the output's hash.
__global__ void fill(uint8_t* p, size_t n, uint32_t seed, bool bf16) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    if (bf16 && i % 2 == 1) p[i] = static_cast<uint8_t>(0x3F | (h & 0x80));  // the high byte of a bf16
    else p[i] = static_cast<uint8_t>(bf16 ? (h | 0x80) : 0x30 | (h & 0x8F));
  }
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s BATCH CONTEXT SPLITS [PAGE_SIZE] [OUT.json]\n", argv[0]);
    return 2;
  }
  const int64_t batch = std::atoll(argv[1]), context = std::atoll(argv[2]);
  const int splits = std::atoi(argv[3]);
  const int64_t page = argc > 4 ? std::atoll(argv[4]) : 16;
  [[maybe_unused]] const char* out_path = argc > 5 ? argv[5] : nullptr;
  if (batch < 1 || context < 1 || splits < 1 || page < 1 || context % page != 0) {
    std::fprintf(stderr, "BATCH, CONTEXT, SPLITS and PAGE_SIZE must be positive, CONTEXT a multiple of PAGE_SIZE\n");
    return 2;
  }
  const int64_t pages_per_seq = context / page, num_pages = batch * pages_per_seq;
  const size_t pool_bytes = static_cast<size_t>(num_pages * page * kKvHeads * kDim);
  const size_t q_bytes = static_cast<size_t>(batch * kQHeads * kDim * 2);  // q and out, bf16

  void *k, *v, *q, *out, *workspace = nullptr;
  int32_t *table, *lens;
  float* scale;
  CHECK(cudaMalloc(&k, pool_bytes));
  CHECK(cudaMalloc(&v, pool_bytes));
  CHECK(cudaMalloc(&q, q_bytes));
  fill<<<1024, 256>>>(static_cast<uint8_t*>(k), pool_bytes, 1, false);
  fill<<<1024, 256>>>(static_cast<uint8_t*>(v), pool_bytes, 2, false);
  fill<<<1024, 256>>>(static_cast<uint8_t*>(q), q_bytes, 3, true);
  CHECK(cudaGetLastError());
  CHECK(cudaMalloc(&out, q_bytes));
  std::vector<int32_t> host_table(num_pages);
  std::iota(host_table.begin(), host_table.end(), 0);
  std::shuffle(host_table.begin(), host_table.end(), std::mt19937(0));
  CHECK(cudaMalloc(&table, num_pages * 4));
  CHECK(cudaMemcpy(table, host_table.data(), num_pages * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> host_lens(batch, static_cast<int32_t>(context));
  CHECK(cudaMalloc(&lens, batch * 4));
  CHECK(cudaMemcpy(lens, host_lens.data(), batch * 4, cudaMemcpyHostToDevice));
  const float one = 1.0f;
  CHECK(cudaMalloc(&scale, 4));
  CHECK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));

  using namespace fp8ext::cuda;
  const PagedPool kp{k, CacheDType::kE4M3, num_pages, page, kKvHeads, kDim};
  const PagedPool vp{v, CacheDType::kE4M3, num_pages, page, kKvHeads, kDim};
  const DecodeProblem p{q, fp8ext::DType::kBFloat16, batch, kQHeads, kp, vp, {scale, false}, {scale, false},
                        table, pages_per_seq, lens, 1.0f / std::sqrt(float(kDim)), splits, 0, 0.0f, out};
  const size_t ws = paged_decode_workspace_bytes(p);
  if (ws) CHECK(cudaMalloc(&workspace, ws));

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(paged_decode_attention(p, workspace, stream));  // opts into the shared memory outside the capture
  // Blocks per SM the pipelined kernel gets (plan_splits assumes three): a
  // change to the kernel can lose one without a register or spill to show it.
  int blocks_per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks_per_sm, fp8ext::cuda::decode_kernel<__nv_bfloat16, fp8ext::cuda::CacheDType::kE4M3, kDim, true>, 128,
      fp8ext::cuda::kPipelineSmemBytes));
  CHECK(cudaStreamSynchronize(stream));
  const double us_per_call = graph_us_per_call(stream, kCalls, kReplays, [&](cudaStream_t s) {
    return paged_decode_attention(p, workspace, s);
  });
  std::vector<uint8_t> host_out(q_bytes);
  CHECK(cudaMemcpy(host_out.data(), out, host_out.size(), cudaMemcpyDeviceToHost));
  const uint64_t hash = fnv1a(host_out);
  if (const char* dump = std::getenv("DECODE_DUMP")) {  // the raw bf16 output, to compare versions that round differently
    if (FILE* f = std::fopen(dump, "wb")) {
      std::fwrite(host_out.data(), 1, host_out.size(), f);
      std::fclose(f);
    }
  }

  const uint64_t kv_bytes = 2 * pool_bytes;
#ifndef FP8EXT_DECODE_TIMELINE  // the same kernels without the stamps: what they cost
  std::printf("batch %lld context %lld splits %d page %lld: %.2f us a call without stamps, %.3f TB/s, output %016llx, "
              "%d blocks per SM\n",
              (long long)batch, (long long)context, splits, (long long)page, us_per_call, kv_bytes / us_per_call / 1e6,
              (unsigned long long)hash, blocks_per_sm);
  return 0;
#else
  static uint64_t dec[tl::kRing][tl::kMaxBlocks][tl::kDecodeStamps];
  static uint64_t mrg[tl::kRing][tl::kMaxBlocks][tl::kMergeStamps];
  unsigned merges = 0;
  CHECK(cudaMemcpyFromSymbol(dec, tl::decode_stamps, sizeof(dec)));
  CHECK(cudaMemcpyFromSymbol(mrg, tl::merge_stamps, sizeof(mrg)));
  CHECK(cudaMemcpyFromSymbol(&merges, tl::merges_done, sizeof(merges)));
  const int decode_blocks = static_cast<int>(splits * kKvHeads * batch);  // one head block per KV head (group 4)
  const int merge_blocks = static_cast<int>(batch * kQHeads);
  std::printf("batch %lld context %lld splits %d page %lld: %.2f us a call (graph of %d, %d replays), %.3f TB/s; "
              "%d decode blocks (%d per SM at most), %d merge blocks, %u merges counted\n",
              (long long)batch, (long long)context, splits, (long long)page, us_per_call, kCalls, kReplays,
              kv_bytes / us_per_call / 1e6, decode_blocks, blocks_per_sm, merge_blocks, merges);
  if (splits < 2 || decode_blocks > tl::kMaxBlocks || merge_blocks > tl::kMaxBlocks || merges < tl::kRing) {
    std::printf("no timeline: it needs splits > 1 (a merge kernel) and at most %d blocks\n", tl::kMaxBlocks);
    return 0;
  }
  std::string json = "{\"batch\": " + std::to_string(batch) + ", \"context\": " + std::to_string(context) +
                     ", \"splits\": " + std::to_string(splits) + ", \"page_size\": " + std::to_string(page) +
                     ", \"us_per_call\": " + std::to_string(us_per_call) + ", \"launches\": [";
  // The last kRing - 1 launches (the newest one's successor is not in the ring).
  for (unsigned l = merges - tl::kRing + 1; l < merges; ++l) {
    const auto& d = dec[l % tl::kRing];
    const auto& m = mrg[l % tl::kRing];
    uint64_t t0 = UINT64_MAX;
    for (int b = 0; b < decode_blocks; ++b) t0 = std::min(t0, d[b][tl::kEntry]);
    // A stamp of 0 was never taken (the first stage: the register kernel has none).
    auto column = [&](auto& table, int blocks, int stamp) {
      std::vector<double> c;
      for (int b = 0; b < blocks; ++b)
        if (table[b][stamp] != 0) c.push_back((double(table[b][stamp]) - double(t0)) / 1e3);
      return c;
    };
    const char* names[] = {"decode entry", "decode released", "decode first stage", "decode loop done", "decode warps merged", "decode exit",
                           "merge entry", "merge released", "merge exit", "next decode released"};
    std::vector<std::vector<double>> cols = {column(d, decode_blocks, tl::kEntry), column(d, decode_blocks, tl::kReleased),
                                             column(d, decode_blocks, tl::kFirstData),
                                             column(d, decode_blocks, tl::kLoopDone), column(d, decode_blocks, tl::kWarpsMerged),
                                             column(d, decode_blocks, tl::kExit),
                                             column(m, merge_blocks, tl::kMergeEntry),
                                             column(m, merge_blocks, tl::kMergeReleased),
                                             column(m, merge_blocks, tl::kMergeExit)};
    if (l + 1 < merges) cols.push_back(column(dec[(l + 1) % tl::kRing], decode_blocks, tl::kReleased));
    std::printf("launch %u (us after its first decode block started):\n%-22s %8s %8s %8s %8s %8s\n", l, "", "min",
                "p10", "median", "p90", "max");
    json += std::string(l == merges - tl::kRing + 1 ? "" : ", ") + "{";
    for (size_t i = 0; i < cols.size(); ++i) {
      const double qs[] = {0, 0.1, 0.5, 0.9, 1};
      std::printf("%-22s", names[i]);
      json += std::string(i ? ", " : "") + "\"" + names[i] + "\": [";
      if (cols[i].empty()) std::printf(" (not stamped by this kernel)");
      for (int j = 0; j < 5 && !cols[i].empty(); ++j) {
        const double x = quantile(cols[i], qs[j]);
        std::printf(" %8.2f", x);
        json += (j ? ", " : "") + std::to_string(x);
      }
      json += "]";
      std::printf("\n");
    }
    json += "}";
    // How the loop's end spreads: the blocks sharing an SM against the rest.
    std::vector<int> per_sm(256, 0);
    for (int b = 0; b < decode_blocks; ++b) ++per_sm[d[b][tl::kDecodeSm] % 256];
    const int busiest = *std::max_element(per_sm.begin(), per_sm.end());
    std::printf("decode blocks on the busiest SM: %d\n", busiest);
  }
  json += "]}\n";
  if (out_path) {
    FILE* f = std::fopen(out_path, "w");
    if (f) std::fputs(json.c_str(), f), std::fclose(f);
  }
  return 0;
#endif
}

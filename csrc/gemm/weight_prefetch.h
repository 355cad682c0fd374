// Tuning hooks for the decode-sized (swap-AB) CUTLASS GEMMs: start the weight
// stream before the kernel's PDL wait (host side; the device side is
// sm90_weight_prefetch.cuh). Off by default.
//
// At M <= 64 a GEMM is a stream of its weight, and a few microseconds of each
// call are not streaming: the wait for the kernel before (PDL), the first
// bytes, the tail. The weight does not depend on the kernel before, so before
// that wait each CTA can ask L2 for the weight rows it will read first (within
// a budget over the whole grid) and let the next kernel launch at once.
// Measured on the H200 (bench/NOTES.md, session 16): between two GEMMs, where
// DRAM is busy anyway, neither helped (16 MiB made 16x4096x4096 7.60 -> 8.39
// us; 1-8 MiB moved rows by +-0.5 us). Not yet measured: behind a short kernel
// that leaves DRAM idle (the activation quantization before each FP8Linear
// GEMM, the norms of a decode step), which is what the hooks are kept for.
// Both are hints: correctness never depends on them (see prefetch_l2 and
// allow_next_kernel_launch in fp8ext/cuda_launch.h; test_pdl_cuda.py checks
// that every setting gives the same bits).
#pragma once

#include <cstdint>
#include <cstdlib>

namespace fp8ext::cuda::gemm {

struct WeightPrefetchPolicy {
  int64_t budget_bytes;  // weight bytes the whole grid prefetches before its PDL wait
  bool early_launch;     // let the next kernel launch before this one waits
};

// Read at each launch, for A/B timing in one process: FP8EXT_GEMM_PREFETCH_MB
// (MiB of weight over the grid; 0, the default, = none) and
// FP8EXT_EARLY_LAUNCH=1.
inline WeightPrefetchPolicy weight_prefetch_policy() {
  const char* mb = std::getenv("FP8EXT_GEMM_PREFETCH_MB");
  const char* early = std::getenv("FP8EXT_EARLY_LAUNCH");
  const int64_t budget_mib = mb && *mb ? std::atoll(mb) : 0;
  return {budget_mib > 0 ? budget_mib << 20 : 0, early && early[0] == '1' && early[1] == '\0'};
}

}  // namespace fp8ext::cuda::gemm
